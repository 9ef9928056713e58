"""``crosstalk doctor`` against a temp machine: not installed, a stale descriptor, a torn
descriptor, loose permissions, a Claude session without an inbox, a Codex app-server, damaged
journals, things in the way in ``names/`` and ``journal/``, a name lock a live agent lost, a
loose uds key — every diagnosis, and ``--fix`` for CrossTalk's own problems."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from crosstalk.agent import Agent, AgentSpec
from crosstalk.config import journal_path
from crosstalk.core.ids import agent_id_for
from crosstalk.core.records import MessageChange, NudgeRecord
from crosstalk.core.states import MessageState
from crosstalk.harness.codex import control_socket
from crosstalk.harness.fake import FakeHarness
from crosstalk.store.journal import Journal
from crosstalk.store.journal_read import read_journal
from crosstalk.store.registry import Registry
from tests.support.agents import plant_dead_agent, register_agent
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
    torn = home / "agents" / f"{'1' * 16}.json"
    torn.write_text('{"agent_id": "1111')
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
    # No process holds the torn descriptor's agent lock: nobody can rewrite it, so it goes.
    assert f"removed unreadable descriptor {torn}" in out
    assert not torn.exists()
    assert oct(home.stat().st_mode & 0o777) == "0o700"
    assert not reg.descriptor_path(stale.agent_id).exists()
    code, out = await crosstalk(env, "install")
    assert code == 0, out
    async with fake_app_server(Path(control_socket(env))):
        code, out = await crosstalk(env, "doctor")
    assert problems(out) == []
    assert "ok      Claude Code: registered in" in out
    assert "ok      Codex: registered in" in out
    assert "ok      Codex: shared app-server running (fake/0.169.0)" in out
    assert code == 0


# -- journals, names, uds keys, damaged descriptors (issue 12, item 9) -------------------------


async def started_agent(env: dict[str, str], session: str, name: str) -> Agent:
    agent = Agent(Registry(Path(env["CROSSTALK_HOME"])),
                  AgentSpec(FakeHarness(name="fake"), session, "/w/proj", name), env=env)
    await agent.start()
    return agent


def finding(out: str, *needles: str) -> str:
    """The one doctor line (with its fix line) that names every needle."""
    blocks = out.replace("\n        fix: ", " || fix: ").splitlines()
    hits = [b for b in blocks if all(n in b for n in needles)]
    assert len(hits) == 1, (needles, out)
    return hits[0]


async def test_a_loose_uds_key_is_diagnosed_hinted_at_and_fixed(env: dict[str, str]) -> None:
    agent = await started_agent(env, "s-key", "keeper")
    try:
        assert agent.uds is not None
        key = agent.uds.key_path
        key.chmod(0o644)
        code, out = await crosstalk(env, "send", "keeper", "hello")
        assert code == 1
        assert "rejected auth_failed" in out
        hint = [line for line in out.splitlines() if str(key) in line]
        assert hint, out
        assert "0644" in hint[0]
        assert "crosstalk doctor --fix" in hint[0]

        code, out = await crosstalk(env, "doctor")
        line = finding(out, str(key))
        assert line.startswith("PROBLEM ")
        assert "0644" in line
        assert "auth_failed" in line
        assert "fix: crosstalk doctor --fix" in line

        code, out = await crosstalk(env, "doctor", "--fix")
        assert finding(out, str(key)).startswith("ok ")
        assert oct(key.stat().st_mode & 0o777) == "0o600"
        code, out = await crosstalk(env, "send", "keeper", "hello again")
        assert code == 0, out
        assert " accepted " in out
        code, out = await crosstalk(env, "doctor")
        assert not [p for p in problems(out) if str(key) in p]
    finally:
        await agent.stop()


@pytest.mark.damaged_journal  # damaged on purpose: that is what doctor must find
async def test_doctor_checks_journals(env: dict[str, str]) -> None:
    home = Path(env["CROSSTALK_HOME"])
    Registry(home)
    jdir = home / "journal"
    jdir.mkdir(mode=0o700)
    damaged = journal_path(home, agent_id_for("fake", "damaged"))
    with Journal(damaged) as j:
        for n in range(3):
            j.append(NudgeRecord(peer=f"peer-{n}", count=1).to_dict())
    lines = damaged.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1].replace(b"peer-1", b"peer-X")  # the CRC no longer matches
    damaged.write_bytes(b"".join(lines))
    loose = journal_path(home, agent_id_for("fake", "loose"))
    with Journal(loose) as j:
        j.append(NudgeRecord(peer="p", count=1).to_dict())
    loose.chmod(0o644)
    torn = journal_path(home, agent_id_for("fake", "torn"))
    with Journal(torn) as j:
        j.append(NudgeRecord(peer="p", count=1).to_dict())
    with torn.open("ab") as f:
        f.write(b'{"c":"0000')  # a crash mid-append: never acknowledged
    illegal = journal_path(home, agent_id_for("fake", "illegal"))
    with Journal(illegal) as j:
        j.append(MessageChange(id="m1", state=MessageState.ACCEPTED).to_dict())  # never submitted
    blocked = journal_path(home, agent_id_for("fake", "blocked"))
    blocked.mkdir()

    code, out = await crosstalk(env, "doctor")
    assert code == 1
    line = finding(out, str(damaged))
    assert line.startswith("PROBLEM ")
    assert "1 damaged line" in line
    assert "checksum" in line
    assert "fix: crosstalk doctor --fix" in line
    assert str(loose) in finding(out, "state readable by others")
    assert finding(out, str(torn)).startswith("ok ")
    line = finding(out, str(illegal))
    assert line.startswith("PROBLEM ")
    assert "m1" in line
    line = finding(out, str(blocked))
    assert line.startswith("PROBLEM ")
    assert f"rmdir {blocked}" in line

    code, out = await crosstalk(env, "doctor", "--fix")
    assert finding(out, str(damaged)).startswith("ok ")
    assert finding(out, str(blocked)).startswith("ok ")
    assert not blocked.exists()  # empty, so nothing was lost
    assert oct(loose.stat().st_mode & 0o777) == "0o600"
    assert read_journal(damaged).damage == []
    assert [r["peer"] for r in read_journal(damaged).records] == ["peer-0", "peer-2"]
    quarantine = damaged.with_name(damaged.name + ".quarantine")
    assert b"peer-X" in quarantine.read_bytes()
    assert oct(quarantine.stat().st_mode & 0o777) == "0o600"

    code, out = await crosstalk(env, "doctor")
    assert not [p for p in problems(out) if str(jdir) in p and str(illegal) not in p], out


async def test_doctor_checks_names(env: dict[str, str]) -> None:
    home = Path(env["CROSSTALK_HOME"])
    agent = await started_agent(env, "s-named", "named")
    try:
        reg = Registry(home)
        (home / "names" / "planted.lock").mkdir()
        loose = reg.name_lock_path("named")
        loose.chmod(0o644)
        (home / "names").chmod(0o755)
        code, out = await crosstalk(env, "doctor")
        assert code == 1
        line = finding(out, "planted.lock")
        assert line.startswith("PROBLEM ")
        assert "rmdir" in line
        readable = finding(out, "state readable by others")
        assert str(loose) in readable
        assert str(home / "names") in readable

        code, out = await crosstalk(env, "doctor", "--fix")
        assert not (home / "names" / "planted.lock").exists()
        assert oct(loose.stat().st_mode & 0o777) == "0o600"
        assert oct((home / "names").stat().st_mode & 0o777) == "0o700"

        # A live agent's name must stay locked: a lock file replaced under it no longer is.
        loose.unlink()
        code, out = await crosstalk(env, "doctor")
        line = finding(out, "'named'")
        assert line.startswith("PROBLEM ")
        assert "not locked" in line
    finally:
        await agent.stop()


async def test_doctor_fix_removes_a_damaged_descriptor_only_when_no_one_holds_its_lock(
        env: dict[str, str]) -> None:
    home = Path(env["CROSSTALK_HOME"])
    reg = Registry(home)
    held = register_agent(reg, "held", "held", harness="fake")
    try:
        held_path = reg.descriptor_path(held.agent_id)
        held_path.write_bytes(b'{"agent_id": "')  # torn under a live registration
        dead_path = reg.descriptor_path(agent_id_for("fake", "dead"))
        dead_path.write_bytes(b'{"agent_id": "')
        dead_path.chmod(0o600)
        _, out = await crosstalk(env, "doctor")
        assert "no process holds its agent lock" in finding(out, str(dead_path))
        assert "live" in finding(out, str(held_path))
        await crosstalk(env, "doctor", "--fix")
        assert not dead_path.exists()
        assert held_path.read_bytes() == b'{"agent_id": "'  # its owner's to rewrite
    finally:
        held.close()
