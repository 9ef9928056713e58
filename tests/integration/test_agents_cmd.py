"""``crosstalk agents`` against a temp machine: a live CrossTalk agent, Claude sessions with
and without an inbox, a Codex thread on a (fake) app-server, and stale and torn records that
must not show up."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from crosstalk.agent import Agent, AgentSpec
from crosstalk.core.ids import agent_id_for
from crosstalk.harness.codex import control_socket
from crosstalk.harness.fake import FakeHarness
from crosstalk.store.registry import Registry
from tests.support.agents import plant_dead_agent, register_agent
from tests.support.claude import FakeClaude
from tests.support.fakes.codex_app_server import fake_app_server
from tests.support.shims import data, inbox, meta, shim, world
from tests.support.waiting import eventually

pytestmark = pytest.mark.anyio
__all__ = ["world"]  # a fixture


@pytest.fixture
def env(machine_env: dict[str, str]) -> dict[str, str]:
    return machine_env


@pytest.fixture
def sessions(fake_sessions: list[FakeClaude]) -> list[FakeClaude]:
    return fake_sessions


async def agents(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "crosstalk", "agents", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_agents_lists_every_session_and_why_one_is_unreachable(
        tmp_path: Path, env: dict[str, str], sessions: list[FakeClaude]) -> None:
    home = Path(env["CROSSTALK_HOME"])
    reg = Registry(home)
    served = Agent(reg, AgentSpec(FakeHarness(name="fake"), "s-1", "/w/proj", "builder"),
                   env=env)
    await served.start()
    plain = FakeClaude(tmp_path, "plain", env=env).start()
    mute = FakeClaude(tmp_path, "mute", env=env).start()
    sessions.extend([plain, mute])
    mute.socket.unlink()  # a session running without its inbox
    config = Path(env["CLAUDE_CONFIG_DIR"]) / "sessions"
    (config / "999999.json").write_text(json.dumps({  # a crashed session: dead pid
        "pid": 999999, "sessionId": "dead", "procStart": "1", "status": "busy"}))
    (config / f"{plain.pid + 1}.json").write_text('{"pid": 1, "sessionId": ')  # torn
    plant_dead_agent(reg)
    try:
        async with fake_app_server(Path(control_socket(env))) as codex:
            thread = codex.add("codex-reviewer", cwd="/w/cx", status="active")
            code, out, err = await agents(env, "--json")
            assert code == 0, err
            listed = {r["name"]: r for r in json.loads(out)}
            assert set(listed) == {"builder", "plain", "mute", "codex-reviewer"}
            assert listed["builder"] == {
                "name": "builder", "agent_id": served.agent_id, "harness": "fake",
                "cwd": "/w/proj", "status": "unknown", "crosstalk": True, "reachable": True,
                "role": "primary", "owner": None}
            assert listed["plain"] == {
                "name": "plain", "agent_id": agent_id_for("claude", plain.session_id),
                "harness": "claude", "cwd": str(plain.cwd), "status": "idle",
                "crosstalk": False, "reachable": True}
            assert listed["mute"]["reachable"] is False
            assert "inbox socket is missing" in listed["mute"]["unreachable_because"]
            assert listed["codex-reviewer"] == {
                "name": "codex-reviewer", "agent_id": agent_id_for("codex", thread.id),
                "harness": "codex", "cwd": "/w/cx", "status": "busy", "crosstalk": False,
                "reachable": True}

            code, out, _ = await agents(env)
            assert code == 0
            lines = out.splitlines()
            assert lines[0].split() == ["NAME", "HARNESS", "STATUS", "CROSSTALK", "REACHABLE",
                                        "AGENT_ID", "CWD"]
            row: dict[str, Any] = {line.split()[0]: line.split() for line in lines[1:5]}
            assert row["builder"][1:5] == ["fake", "unknown", "yes", "yes"]
            assert row["mute"][1:5] == ["claude", "idle", "no", "no"]
            assert any(line.startswith("  mute: unreachable: ") for line in lines)
    finally:
        await served.stop()


async def test_agents_on_an_empty_machine(env: dict[str, str]) -> None:
    code, out, _ = await agents(env)
    assert code == 0
    assert out.startswith("no sessions found")
    code, out, _ = await agents(env, "--json")
    assert json.loads(out) == []


# -- damaged descriptors (issue 12, item 9) -----------------------------------------------------


async def test_agents_shows_an_unreadable_descriptor_as_damaged_with_its_fix(
        env: dict[str, str]) -> None:
    home = Path(env["CROSSTALK_HOME"])
    reg = Registry(home)
    healthy = register_agent(reg, "healthy", "healthy", harness="fake", cwd="/w/h",
                             a2a_url="http://127.0.0.1:9")
    held = register_agent(reg, "held", "held", harness="fake")
    try:
        held_path = reg.descriptor_path(held.agent_id)
        held_path.write_bytes(b'{"agent_id": "')  # torn while its owner runs
        dead_id = agent_id_for("fake", "dead")
        dead_path = reg.descriptor_path(dead_id)
        dead_path.write_bytes(b"[1, 2")
        code, out, err = await agents(env, "--json")
        assert code == 0, err
        listed = {r["agent_id"]: r for r in json.loads(out)}
        assert set(listed) == {healthy.agent_id, held.agent_id, dead_id}
        assert listed[healthy.agent_id] == {  # rows that are not damaged are as they were
            "name": "healthy", "agent_id": healthy.agent_id, "harness": "fake",
            "cwd": "/w/h", "status": "unknown", "crosstalk": True, "reachable": True,
            "role": "primary", "owner": None}
        live = listed[held.agent_id]
        assert (live["name"], live["crosstalk"], live["reachable"]) == (None, True, False)
        assert live["damaged"]["path"] == str(held_path)
        assert live["damaged"]["live"] is True
        assert "rewrites it" in live["damaged"]["fix"]
        assert "descriptor" in live["unreachable_because"]
        dead = listed[dead_id]
        assert dead["damaged"]["live"] is False
        assert dead["damaged"]["fix"] == "crosstalk doctor --fix"

        code, out, _ = await agents(env)
        assert code == 0
        assert any(line.startswith(f"  {held.agent_id}: damaged descriptor {held_path}")
                   for line in out.splitlines()), out
    finally:
        held.close()
        healthy.close()


async def test_a_live_shim_rewrites_its_damaged_or_missing_descriptor(
        world: dict[str, str]) -> None:
    reg = Registry(Path(world["CROSSTALK_HOME"]))
    async with shim(world) as b, shim(world) as a:
        await b.call_tool("receive_message", {}, meta=meta("b1", "bob"))
        bob = agent_id_for("fake", "b1")
        path = reg.descriptor_path(bob)
        published = path.read_bytes()
        path.write_bytes(published[: len(published) // 2])  # torn
        assert reg.find("bob") == []  # unreachable while torn
        await eventually(lambda: path.read_bytes() == published, what="descriptor rewritten")
        path.unlink()
        await eventually(lambda: path.exists() and path.read_bytes() == published,
                         what="descriptor republished")
        sent = data(await a.call_tool("send_message", {"to": "bob", "text": "found you"},
                                      meta=meta("a1", "alice")))
        assert sent["state"] == "accepted", sent
        assert [m["text"] for m in inbox(world, "b1")] == ["found you"]
