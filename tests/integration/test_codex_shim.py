"""Codex threads through real shims: a fake app-server (real unix socket, WebSocket framing),
a real ``crosstalk mcp`` serving Codex calls by ``_meta.threadId``, and fake Claude sessions
with their own shims. Seeds 2, 3, 4, 9, 12 and 27 at the integration level (the live suite
runs them against the real Codex).
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from crosstalk.core.ids import agent_id_for
from crosstalk.harness.codex import control_socket
from crosstalk.store.registry import Registry
from tests.support.claude_world import Node
from tests.support.claude_world import world as world  # noqa: PLC0414 - a fixture
from tests.support.fakes.codex_app_server import FakeAppServer, fake_app_server, finish_turn

pytestmark = pytest.mark.anyio


@pytest.fixture
def env(machine_env: dict[str, str]) -> dict[str, str]:
    return machine_env


@pytest.fixture
async def codex(env: dict[str, str]) -> AsyncIterator[FakeAppServer]:
    async with fake_app_server(Path(control_socket(env))) as server:
        yield server


@pytest.fixture
def codex_params(env: dict[str, str]) -> StdioServerParameters:
    """``crosstalk mcp`` as Codex starts it (one pooled connection serves every thread).
    Tests open the client themselves: its task group must close in the task that opened it."""
    return StdioServerParameters(command=sys.executable, args=["-m", "crosstalk", "mcp"],
                                 env=env)


def data(result: Any) -> dict[str, Any]:
    return dict(json.loads(result.content[0].text))


async def call(client: Client, thread: str | None, tool: str, **args: Any) -> dict[str, Any]:
    meta = {"threadId": thread} if thread else None
    return data(await client.call_tool(tool, args, meta=meta))


@pytest.mark.seed(2)
@pytest.mark.seed(3)
@pytest.mark.seed(4)
@pytest.mark.seed(9)
async def test_claude_and_codex_exchange_through_their_shims(
        world: Callable[..., Node], codex: FakeAppServer, codex_params: StdioServerParameters,
        env: dict[str, str]) -> None:
    async with Client(codex_params) as codex_shim:
        await _exchange(world, codex, codex_shim, env)


async def _exchange(world: Callable[..., Node], codex: FakeAppServer, codex_shim: Client,
                    env: dict[str, str]) -> None:
    t = codex.add("reviewer", cwd="/proj")
    claude = world("claude-one")
    await claude.connect()
    try:
        await _exchange_with(claude, codex, codex_shim, env, t.id)
    finally:
        await claude.disconnect()  # before the codex client: clients close in LIFO order


async def _exchange_with(claude: Node, codex: FakeAppServer, codex_shim: Client,
                         env: dict[str, str], thread: str) -> None:
    t = codex.threads[thread]
    first = await call(codex_shim, t.id, "receive_message")
    assert first["entries"] == []
    home = Path(env["CROSSTALK_HOME"])
    desc = Registry(home).live_descriptor(agent_id_for("codex", t.id))
    assert desc is not None
    assert desc.name == "reviewer"  # the thread's own name (CQ8)
    assert desc.harness_endpoint == str(codex.path)
    assert desc.cwd == "/proj"

    # Claude -> Codex, immediate and verified: a turn starts (seed 3, idle).
    sent = await claude.call("send_message", to="reviewer", text="please review PR 7")
    assert sent["state"] == "accepted", sent
    (got,) = codex.inputs
    assert got.how == "turn/start"
    assert "please review PR 7" in got.text
    assert 'from="claude-one"' in got.text
    assert 'verified="true"' in got.text
    # ... and while that turn runs, the next one joins it (seed 2, mid-turn).
    again = await claude.call("send_message", to="reviewer", text="also PR 8")
    assert again["state"] == "accepted"
    assert codex.inputs[1].turn == codex.inputs[0].turn
    finish_turn(codex, t.id)
    # Deferred: appended without waking; idle stays idle (seed 3).
    later = await claude.call("send_message", to="reviewer", text="no rush",
                              delivery="next_turn")
    assert later["state"] == "queued"
    assert codex.inputs[-1].how == "inject_items"
    assert codex.threads[t.id].status == "idle"
    # Unverified (a plain script): appended, never turn/start (seed 9).
    # (a subprocess the loop waits for: the fake app-server runs on this loop too)
    script = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "crosstalk", "send", "--json", "reviewer", "from a script",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(script.communicate(), 60)
    assert script.returncode == 0, err
    assert json.loads(out)["state"] == "queued"
    assert codex.inputs[-1].how == "inject_items"
    assert 'verified="false"' in codex.inputs[-1].text
    assert codex.threads[t.id].status == "idle"

    # Codex -> Claude: arrives with a reconstructed envelope and a verified sender (seed 4).
    back = await call(codex_shim, t.id, "send_message", to="claude-one", text="LGTM")
    assert back["state"] == "accepted", back
    content = claude.contents()[-1]
    assert 'from-name="reviewer"' in content
    assert "sender=unverified" not in content
    assert "LGTM" in content


@pytest.mark.seed(12)
@pytest.mark.seed(27)
async def test_each_thread_receives_only_its_own(
        world: Callable[..., Node], codex: FakeAppServer, codex_params: StdioServerParameters,
        env: dict[str, str]) -> None:
    """Two threads in one cwd on the default server and a third on another server, one pooled
    shim: each receives only its own; a call with no threadId is unbound."""
    async with Client(codex_params) as codex_shim:
        await _only_its_own(world, codex, codex_shim, env)


async def _only_its_own(world: Callable[..., Node], codex: FakeAppServer, codex_shim: Client,
                        env: dict[str, str]) -> None:
    one, two = codex.add(None, cwd="/same"), codex.add(None, cwd="/same")
    other_home = Path(tempfile.mkdtemp(prefix="ct-cx3-", dir="/tmp"))
    async with fake_app_server(other_home / "srv" / "other.sock") as other:
        three = other.add("third", cwd="/elsewhere")
        # The third thread's shim runs under the other server (its own CODEX_HOME, whose
        # control socket leads there), and its descriptor records that endpoint.
        env3 = {**env, "CODEX_HOME": str(other_home)}
        Path(control_socket(env3)).parent.mkdir(parents=True)
        Path(control_socket(env3)).symlink_to(other.path)
        params = StdioServerParameters(command=sys.executable,
                                       args=["-m", "crosstalk", "mcp"], env=env3)
        async with Client(params) as shim3:
            await call(shim3, three.id, "receive_message")
            for t in (one, two):
                await call(codex_shim, t.id, "receive_message")
            unbound = await codex_shim.call_tool("send_message", {"to": "x", "text": "y"})
            assert data(unbound)["error"] == "unbound"
            names = {agent_id_for("codex", t.id): Registry(Path(env["CROSSTALK_HOME"]))
                     .live_descriptor(agent_id_for("codex", t.id)) for t in (one, two, three)}
            assert len({d.name for d in names.values() if d}) == 3  # distinct fallbacks
            claude = world("sender")
            await claude.connect()
            try:
                await _send_each(claude, codex, other, names, (one, two, three))
            finally:
                await claude.disconnect()


async def _send_each(claude: Node, codex: FakeAppServer, other: FakeAppServer,
                     names: dict[str, Any], threads: tuple[Any, Any, Any]) -> None:
    one, two, three = threads
    for t in (one, two, three):
        d = names[agent_id_for("codex", t.id)]
        assert d is not None
        out = await claude.call("send_message", to=d.name, text=f"for {t.id}")
        assert out["state"] == "accepted", out
    assert codex.texts(one.id) == [codex.texts(one.id)[0]]
    assert f"for {one.id}" in codex.texts(one.id)[0]
    assert f"for {two.id}" in codex.texts(two.id)[0]
    assert len(codex.texts(two.id)) == 1
    assert [f"for {three.id}" in x for x in other.texts(three.id)] == [True]
    assert all(i.thread != three.id for i in codex.inputs)
