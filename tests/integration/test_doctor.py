"""``crosstalk doctor`` against a temp machine: not installed, a stale descriptor, a torn
descriptor, loose permissions, a Claude session without an inbox, a Codex app-server —
every diagnosis, and ``--fix`` for CrossTalk's own problems."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from crosstalk.harness.codex import control_socket
from crosstalk.store.registry import Registry
from tests.support.agents import plant_dead_agent
from tests.support.claude import FakeClaude
from tests.support.fakes.codex_app_server import fake_app_server

pytestmark = pytest.mark.anyio


@pytest.fixture
def env(machine_env: dict[str, str]) -> dict[str, str]:
    return machine_env


@pytest.fixture
def sessions(fake_sessions: list[FakeClaude]) -> list[FakeClaude]:
    return fake_sessions


async def crosstalk(env: dict[str, str], *args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "crosstalk", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


def problems(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("PROBLEM")]


async def test_doctor_diagnoses_and_fixes(tmp_path: Path, env: dict[str, str],
                                          sessions: list[FakeClaude]) -> None:
    home = Path(env["CROSSTALK_HOME"])
    reg = Registry(home)
    stale = plant_dead_agent(reg)
    (home / "agents" / f"{'1' * 16}.json").write_text('{"agent_id": "1111')  # torn
    home.chmod(0o755)
    mute = FakeClaude(tmp_path, "mute", env=env).start()
    sessions.append(mute)
    mute.socket.unlink()

    code, out = await crosstalk(env, "doctor")
    assert code == 1
    found = problems(out)
    assert any("Claude Code: no 'crosstalk' MCP server" in p for p in found)
    assert any("Codex: no [mcp_servers.crosstalk]" in p for p in found)
    assert any("skill: not installed" in p for p in found)
    assert any("Codex: no shared app-server" in p for p in found)
    assert any("state readable by others" in p for p in found)
    assert any("stale descriptors" in p and "ghost" in p for p in found)
    assert any("unreadable descriptor" in p for p in found)
    assert "fix: crosstalk install" in out
    assert "fix: crosstalk doctor --fix" in out
    assert "ok      Claude session mute: version 2.1.328, status idle" in out

    code, out = await crosstalk(env, "doctor", "--fix")
    assert "removed 1 stale descriptors" in out
    assert "permissions tightened" in out
    assert oct(home.stat().st_mode & 0o777) == "0o700"
    assert not reg.descriptor_path(stale.agent_id).exists()
    code, out = await crosstalk(env, "install")
    assert code == 0, out
    async with fake_app_server(Path(control_socket(env))):
        code, out = await crosstalk(env, "doctor")
    left = problems(out)
    assert all("unreadable descriptor" in p for p in left), left  # only the torn file is left
    assert "ok      Claude Code: registered in" in out
    assert "ok      Codex: registered in" in out
    assert "ok      Codex: shared app-server running (fake/0.169.0)" in out
    assert code == 1
