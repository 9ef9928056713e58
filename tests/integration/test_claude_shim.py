"""Claude sessions end to end without the real binary: fake Claude processes (record, key,
inbox socket) whose children are real ``crosstalk mcp`` shims, spoken to by the official MCP
client, exchanging messages over real A2A and real unix sockets.

What each session's "model" received is what its fake inbox recorded (``FakeClaude.frames``);
the model's tool calls are the MCP client's. Seed tests 13, 21 (shim-restart parts), 26
(Claude half), 30, 32 and 33, and issue 4's "a session that never called a tool is a full
agent".
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from crosstalk.core.ids import agent_id_for
from crosstalk.store.registry import Registry
from tests.support.claude import claude_env, running
from tests.support.claude_world import Node, world
from tests.support.waiting import eventually

pytestmark = pytest.mark.anyio
__all__ = ["world"]  # a fixture


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return claude_env(tmp_path)


def rows(listed: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["agent_id"]: r for r in listed["agents"]}


# -- eager registration ----------------------------------------------------------------------


async def test_a_session_that_never_called_a_tool_is_a_full_agent(
        world: Callable[..., Node]) -> None:
    """Issue 4: registered at shim start; listed crosstalk:true; receives and answers an ask."""
    alice, bob = world("alice"), world("bob")
    await alice.connect()
    await bob.connect()  # bob's model makes no call before the ask arrives
    listed = rows(await alice.call("list_agents"))
    assert listed[bob.agent_id] | {"cwd": None} == {
        "name": "bob", "agent_id": bob.agent_id, "harness": "claude", "cwd": None,
        "status": "idle", "crosstalk": True, "reachable": True, "role": "primary",
        "owner": None}
    bob.fc.set_status("busy")
    assert rows(await alice.call("list_agents"))[bob.agent_id]["status"] == "busy"

    sent = await alice.call("ask", to="bob", text="what is 6*7?")
    assert sent["state"] == "accepted", sent
    got = bob.inbound()
    assert len(got) == 1
    frame = got[0]["frame"]
    assert frame["session_id"] == bob.fc.session_id  # a superseded session would drop it
    assert got[0]["auth_ok"] is True  # the shim authenticated with bob's peerToken
    content = frame["message"]["content"]
    assert content.startswith('<cross-session-message from="uds:')
    assert 'from-name="alice"' in content
    assert bob.message_ids() == [(sent["message_id"], "ask")]

    answer = await bob.call("reply", message_id=sent["message_id"], text="42")
    assert answer["state"] == "accepted", answer
    await eventually(lambda: any("42" in c for c in alice.contents()), what="answer at alice")
    (reply_content,) = alice.contents()
    assert f"in-reply-to={sent['message_id']}" in reply_content
    assert 'from-name="bob"' in reply_content


# -- seed 33, seed 26 (Claude half): sessions without CrossTalk --------------------------------


@pytest.mark.seed(33)
@pytest.mark.seed(26)
async def test_sessions_without_crosstalk_get_informs_only_with_true_hints(
        world: Callable[..., Node]) -> None:
    alice = world("alice")
    carol = world("carol")  # no shim: a plain Claude session
    dave = world("dave")
    await alice.connect()
    listed = rows(await alice.call("list_agents"))
    carol_id = agent_id_for("claude", carol.fc.session_id)
    assert listed[carol_id]["crosstalk"] is False
    assert listed[carol_id]["reachable"] is True
    assert "role" not in listed[carol_id]

    sent = await alice.call("send_message", to="carol", text="fyi: build is green")
    assert sent["state"] == "accepted", sent
    (frame,) = carol.inbound()
    assert "fyi: build is green" in frame["frame"]["message"]["content"]
    assert frame["frame"]["session_id"] == carol.fc.session_id
    assert "without CrossTalk" in sent["hint"]

    asked = await alice.call("ask", to="carol", text="can you answer?")
    assert (asked["state"], asked["reason"]) == ("rejected", "native_inform_only")
    assert "inform" in asked["hint"]
    assert "not reachable" not in asked["hint"]
    command = await alice.call("send_message", to="carol", text="do it", kind="command")
    assert command["reason"] == "native_inform_only"
    assert len(carol.inbound()) == 1  # neither reached her

    # Unreachable: the session's inbox is gone. The hint must not promise an inform arrives.
    dave.fc.socket.unlink()
    dave_id = agent_id_for("claude", dave.fc.session_id)
    assert rows(await alice.call("list_agents"))[dave_id]["reachable"] is False
    asked = await alice.call("ask", to="dave", text="there?")
    assert asked["reason"] == "native_inform_only"
    assert "not reachable" in asked["hint"]
    told = await alice.call("send_message", to="dave", text="there?")
    assert (told["state"], told["reason"]) == ("unreachable", "inbox_missing")
    assert "not reachable" in told["hint"]

    # The session without CrossTalk cannot send: its native frame to alice's address is
    # closed with no state (an unmapped peer pid), and nothing reaches alice.
    desc = Registry(Path(alice.env["CROSSTALK_HOME"])).live_descriptor(alice.agent_id)
    assert desc is not None
    assert desc.uds_path is not None
    out = carol.fc.send(desc.uds_path, "hello from carol")
    assert out["ok"] is True
    assert out["bytes_back"] == 0
    mailbox = await alice.call("receive_message")
    assert all("hello from carol" not in (e.get("text") or "") for e in mailbox["entries"])
    assert alice.inbound() == []


@pytest.mark.seed(33)
async def test_an_ambiguous_name_answers_with_agent_id_hints(
        world: Callable[..., Node]) -> None:
    alice = world("alice")
    one, two = world("twin"), world("twin")
    await alice.connect()
    sent = await alice.call("send_message", to="twin", text="which one?")
    assert (sent["state"], sent["reason"]) == ("rejected", "ambiguous_name")
    ids = {agent_id_for("claude", one.fc.session_id), agent_id_for("claude", two.fc.session_id)}
    assert set(sent["candidates"]) == ids
    assert all(i in sent["hint"] for i in ids)
    assert one.inbound() == []
    assert two.inbound() == []
    chosen = await alice.call("send_message", to=agent_id_for("claude", two.fc.session_id),
                              text="you, twin two")
    assert chosen["state"] == "accepted"
    assert len(two.inbound()) == 1
    assert one.inbound() == []
    # The unified forms reach the same session.
    by_pid = await alice.call("send_message", to=f"claude:{two.fc.pid}", text="by pid")
    assert by_pid["state"] == "accepted"
    by_socket = await alice.call("send_message", to=f"uds:{two.fc.socket}", text="by socket")
    assert by_socket["state"] == "accepted"
    assert len(two.inbound()) == 3
    gone = await alice.call("send_message", to="nobody", text="?")
    assert (gone["state"], gone["reason"]) == ("rejected", "no_such_agent")


# -- seed 13: relay routing ------------------------------------------------------------------


@pytest.mark.seed(13)
@pytest.mark.seed(5)
async def test_relay_routing_native_reply_bounced_and_reply_reaches_only_its_asker(
        world: Callable[..., Node]) -> None:
    a, b, c = world("a"), world("b"), world("c")
    for node in (a, b, c):
        await node.connect()
    from_a = await a.call("ask", to="b", text="question from a")
    from_c = await c.call("ask", to="b", text="question from c")
    assert from_a["state"] == from_c["state"] == "accepted"
    assert {m for m, _ in b.message_ids()} == {from_a["message_id"], from_c["message_id"]}

    # B answers natively, to the address its envelope named: bounced, nothing forwarded.
    frm = json.loads(json.dumps(b.inbound()[0]["frame"]))["message"]["content"]
    address = re.search(r'from="uds:([^"]+)"', frm)
    assert address is not None
    out = b.fc.send(address.group(1), "native answer: 42")
    assert out["ok"] is True
    assert out["bytes_back"] == 0
    await eventually(lambda: any("was not delivered" in x for x in b.contents()), what="bounce")
    bounce = next(x for x in b.contents() if "was not delivered" in x)
    assert from_a["message_id"] in bounce
    assert from_c["message_id"] in bounce
    mailbox = await b.call("receive_message", state="bounced")
    assert [e["state"] for e in mailbox["entries"]] == ["bounced"]
    assert a.inbound() == []
    assert c.inbound() == []

    # The reply tool, naming A's message, reaches A and only A.
    done = await b.call("reply", message_id=from_a["message_id"], text="answer for a")
    assert done["state"] == "accepted"
    await eventually(lambda: len(a.inbound()) == 1, what="reply at a")
    assert "answer for a" in a.contents()[0]
    assert c.inbound() == []
    done = await b.call("reply", message_id=from_c["message_id"], text="answer for c")
    assert done["state"] == "accepted"
    await eventually(lambda: len(c.inbound()) == 1, what="reply at c")
    assert "answer for a" not in c.contents()[0]
    assert "answer for c" in c.contents()[0]
    assert len(a.inbound()) == 1


# -- seed 32: /clear and /resume ---------------------------------------------------------------


@pytest.mark.seed(32)
async def test_clear_keeps_the_name_and_retires_the_old_session(
        world: Callable[..., Node]) -> None:
    alice, bob = world("alice"), world("bob")
    await alice.connect()
    await bob.connect()
    old_id, old_agent = bob.fc.session_id, bob.agent_id
    asked = await alice.call("ask", to="bob", text="before the clear")
    assert asked["state"] == "accepted"

    bob.fc.clear()
    new_agent = bob.agent_id
    assert new_agent != old_agent
    home = Path(bob.env["CROSSTALK_HOME"])
    await eventually(lambda: Registry(home).live_descriptor(new_agent) is not None,
                what="the new session registered")
    listed = rows(await alice.call("list_agents"))
    bobs = [r for r in listed.values() if r["name"] == "bob"]
    assert [r["agent_id"] for r in bobs] == [new_agent]  # once, and not the old session
    assert old_agent not in listed
    # The new session kept the name with no notice.
    mailbox = await bob.call("receive_message")
    assert "notice" not in mailbox
    assert mailbox["entries"] == []
    gone = await alice.call("send_message", to=old_agent, text="old one?")
    assert gone["reason"] == "no_such_agent"
    sent = await alice.call("send_message", to="bob", text="after the clear")
    assert sent["state"] == "accepted"
    last = bob.inbound()[-1]["frame"]
    assert last["session_id"] == bob.fc.session_id
    assert "after the clear" in str(last)

    # /resume of the old session: same agent_id, same journal; its ask is still answerable.
    bob.fc.clear(old_id)
    await eventually(lambda: Registry(home).live_descriptor(old_agent) is not None,
                what="the old session resumed")
    assert Registry(home).live_descriptor(new_agent) is None
    mailbox = await bob.call("receive_message")
    assert [e["message_id"] for e in mailbox["entries"]] == [asked["message_id"]]
    answered = await bob.call("reply", message_id=asked["message_id"], text="resumed answer")
    assert answered["state"] == "accepted"
    await eventually(lambda: any("resumed answer" in c for c in alice.contents()),
                what="the resumed answer at alice")


@pytest.mark.seed(32)
async def test_a_live_holder_forces_the_suffix_and_a_dead_one_yields(
        world: Callable[..., Node]) -> None:
    first, second = world("solo"), world("solo")
    await first.connect()
    await second.connect()
    home = Path(first.env["CROSSTALK_HOME"])
    d2 = Registry(home).live_descriptor(second.agent_id)
    assert d2 is not None
    assert d2.name.startswith("claude-")
    assert d2.name != "solo"
    notice = (await second.call("receive_message")).get("notice", "")
    assert "held by a live session" in notice

    # The holder dies (session and shim killed): the name is free; the second takes it on
    # its next poll, and a fresh session gets no "live" notice either.
    first.fc.kill_shims("KILL")
    first.fc.stop()
    await eventually(lambda: (Registry(home).live_descriptor(second.agent_id) or d2).name == "solo",
                what="the fallback moved to the free name")
    third = world("solo")
    await third.connect()
    d3 = Registry(home).live_descriptor(third.agent_id)
    assert d3 is not None
    assert d3.name != "solo"
    assert "held by a live session" in (await third.call("receive_message")).get("notice", "")


# -- seed 30: rename -------------------------------------------------------------------------


@pytest.mark.seed(30)
async def test_rename_moves_the_alias_only(world: Callable[..., Node]) -> None:
    alice, bob = world("alice"), world("bob")
    await alice.connect()
    await bob.connect()
    asked = await alice.call("ask", to="bob", text="before the rename")
    claimed = await alice.call("claim", name="bob")
    assert claimed["ok"] is True
    address = re.search(r'from="uds:([^"]+)"', bob.contents()[0])
    assert address is not None

    bob.fc.rename("robert")
    home = Path(bob.env["CROSSTALK_HOME"])
    await eventually(lambda: (Registry(home).live_descriptor(bob.agent_id) or
                         Registry(home).live_descriptor(alice.agent_id)).name == "robert",
                what="the alias moved")
    listed = rows(await alice.call("list_agents"))
    assert listed[bob.agent_id]["name"] == "robert"
    assert (listed[bob.agent_id]["role"], listed[bob.agent_id]["owner"]) == (
        "subagent", alice.agent_id)  # the claim still binds
    gone = await alice.call("send_message", to="bob", text="old alias?")
    assert (gone["state"], gone["reason"]) == ("rejected", "no_such_agent")

    # A native reply to the pre-rename address still reaches the shim and is bounced.
    out = bob.fc.send(address.group(1), "native after rename")
    assert out["ok"] is True
    await eventually(lambda: any("was not delivered" in c for c in bob.contents()), what="bounce")
    # The reply tool for the pre-rename message still routes.
    done = await bob.call("reply", message_id=asked["message_id"], text="from robert")
    assert done["state"] == "accepted"
    await eventually(lambda: any("from robert" in c for c in alice.contents()), what="reply")
    assert 'from-name="robert"' in next(c for c in alice.contents() if "from robert" in c)

    # Disconnect and reconnect: the same agent_id resumes the same journal.
    before = (await bob.call("receive_message"))["entries"]
    await bob.disconnect()
    await eventually(lambda: Registry(home).live_descriptor(bob.agent_id) is None,
                what="the shim unpublished")
    await bob.connect()
    after = (await bob.call("receive_message"))["entries"]
    assert [e["message_id"] for e in after] == [e["message_id"] for e in before]
    assert Registry(home).live_descriptor(bob.agent_id).name == "robert"  # type: ignore[union-attr]


# -- seed 21: restart reply routing, the shim-restart parts ----------------------------------


@pytest.mark.seed(21)
async def test_shim_killed_between_injection_and_reply(world: Callable[..., Node]) -> None:
    a, b = world("a"), world("b")
    await a.connect()
    await b.connect()
    asked = await a.call("ask", to="b", text="pre-crash question")
    assert asked["state"] == "accepted"
    address = re.search(r'from="uds:([^"]+)"', b.contents()[0])
    assert address is not None

    # Kill shim B; Claude B keeps running. A native reply cannot connect.
    b.fc.kill_shims("KILL")
    await eventually(lambda: not b.fc.shims(), what="shim B gone")
    with contextlib.suppress(Exception):
        await b.disconnect()
    out = b.fc.send(address.group(1), "native while the shim is down")
    assert out["ok"] is False

    # The harness reconnects the MCP server: the agent re-registers (same agent_id).
    await b.connect()
    out = b.fc.send(address.group(1), "native after the reconnect")
    assert out["ok"] is True
    await eventually(lambda: any("was not delivered" in c for c in b.contents()), what="bounce")
    assert asked["message_id"] in next(c for c in b.contents() if "was not delivered" in c)
    assert a.inbound() == []
    done = await b.call("reply", message_id=asked["message_id"], text="post-crash answer")
    assert done["state"] == "accepted"
    await eventually(lambda: len(a.inbound()) == 1, what="the answer at A")
    await anyio.sleep(0.5)
    assert len(a.inbound()) == 1  # exactly once


@pytest.mark.seed(21)
async def test_shim_and_session_restarted_nothing_reaches_the_new_conversation(
        world: Callable[..., Node]) -> None:
    a, b = world("a"), world("b")
    await a.connect()
    await b.connect()
    asked = await a.call("ask", to="b", text="for the old conversation")
    assert asked["state"] == "accepted"
    b.fc.kill_shims("KILL")
    with contextlib.suppress(Exception):
        await b.disconnect()
    b.fc.stop()

    b2 = world("b")  # Claude B relaunched: same name, a new conversation
    await b2.connect()
    home = Path(b2.env["CROSSTALK_HOME"])
    d = Registry(home).live_descriptor(b2.agent_id)
    assert d is not None
    assert d.name == "b"
    await anyio.sleep(1.0)
    assert b2.inbound() == []  # no pending work of the old conversation was injected
    assert (await b2.call("receive_message"))["entries"] == []
    missing = await b2.call("reply", message_id=asked["message_id"], text="not mine")
    assert missing["error"] == "no_such_message"
    assert a.inbound() == []


# -- the leftover shim -----------------------------------------------------------------------


async def test_a_shim_whose_claude_died_exits_and_is_not_listed(
        world: Callable[..., Node]) -> None:
    a, b = world("a"), world("b")
    await a.connect()
    await b.connect()
    (shim_pid,) = b.fc.shims()
    os.kill(b.fc.pid, signal.SIGKILL)  # Claude B crashes; its stdio pipes stay open
    assert b.fc.proc is not None
    b.fc.proc.wait(timeout=10)  # reaped, as its shell would (a zombie still looks alive)
    started = time.monotonic()
    await eventually(lambda: not running(shim_pid), what="the orphaned shim exited", timeout=10)
    assert time.monotonic() - started < 2.5
    listed = rows(await a.call("list_agents"))
    assert b.agent_id not in listed
    assert all(r["name"] != "b" for r in listed.values())


# -- addresses in `crosstalk send` (issue 7) ---------------------------------------------------


async def _cli_send(env: dict[str, str], to: str, text: str) -> tuple[int, str, str]:
    import asyncio
    import sys

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "crosstalk", "send", to, text, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_crosstalk_send_takes_every_address_form(world: Callable[..., Node]) -> None:
    bob = world("bob")
    await bob.connect()
    carol = world("carol")  # no CrossTalk
    one, two = world("twin"), world("twin")  # two sessions without CrossTalk, one name
    desc = Registry(Path(bob.env["CROSSTALK_HOME"])).live_descriptor(bob.agent_id)
    assert desc is not None
    for to in (f"claude:{bob.fc.pid}", f"claude:{bob.fc.session_id}", "claude:bob",
               bob.agent_id, f"uds:{desc.uds_path}"):
        code, out, err = await _cli_send(bob.env, to, f"via {to}")
        assert code == 0, (to, err)
        assert " accepted " in out
    assert [c.rsplit("\n", 2)[-2] for c in bob.contents()] == [
        f"via claude:{bob.fc.pid}", f"via claude:{bob.fc.session_id}", "via claude:bob",
        f"via {bob.agent_id}", f"via uds:{desc.uds_path}"]
    code, _, err = await _cli_send(bob.env, "carol", "hello?")
    assert code == 3
    assert "without CrossTalk" in err
    assert carol.inbound() == []
    # "twin" names two live sessions: an error naming both, never a guess. (CrossTalk
    # aliases are unique under their locks; harness names need not be.)
    code, _, err = await _cli_send(bob.env, "claude:twin", "which?")
    assert code == 3
    assert one.agent_id in err
    assert two.agent_id in err
    code, _, err = await _cli_send(bob.env, "claude:424242", "nobody")
    assert code == 3
    assert "no live agent" in err
