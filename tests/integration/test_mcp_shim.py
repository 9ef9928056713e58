"""Real ``crosstalk mcp`` processes driven by the official MCP client over stdio.

The fake harness stands in for the sessions: a call names its session in ``_meta`` (as Codex
names its thread), and what reaches a session's "model" is appended to
``$CROSSTALK_FAKE_INBOX/<session>.jsonl``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from crosstalk.a2a import client as a2a_client
from crosstalk.core.ids import agent_id_for
from crosstalk.store.registry import Registry
from tests.support.shims import data, inbox, meta, shim, world
from tests.support.waiting import eventually

pytestmark = pytest.mark.anyio
__all__ = ["world"]  # a fixture

TOOLS = {"list_agents", "send_message", "ask", "reply", "receive_message", "claim", "release"}


async def test_tools_are_the_contract(world: dict[str, str]) -> None:
    async with shim(world) as c:
        listed = await c.list_tools()
        assert {t.name for t in listed.tools} == TOOLS
        by_name = {t.name: t for t in listed.tools}
        assert set(by_name["send_message"].input_schema["properties"]) == {
            "to", "text", "kind", "delivery"}
        assert set(by_name["ask"].input_schema["properties"]) == {
            "to", "text", "deadline_seconds"}
        assert set(by_name["reply"].input_schema["required"]) == {"message_id", "text"}


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_unbound_calls_get_list_agents_only(world: dict[str, str], mode: str) -> None:
    async with shim(world, mode) as c:
        listed = data(await c.call_tool("list_agents", {}))
        assert listed == {"agents": []}
        res = await c.call_tool("send_message", {"to": "x", "text": "hi"})
        assert res.is_error
        assert data(res)["error"] == "unbound"


async def test_send_between_two_shims(world: dict[str, str]) -> None:
    async with shim(world) as a, shim(world) as b:
        # b's session registers on its first call (lazy, like a Codex thread)
        empty = data(await b.call_tool("receive_message", {}, meta=meta("b1", "bob")))
        assert empty["entries"] == []
        sent = data(await a.call_tool("send_message", {"to": "bob", "text": "hello bob"},
                                      meta=meta("a1", "alice")))
        assert sent["state"] == "accepted", sent
        got = inbox(world, "b1")
        assert [m["text"] for m in got] == ["hello bob"]
        assert got[0]["from"] == "alice"
        names = {r["name"] for r in data(await b.call_tool("list_agents", {}))["agents"]}
        assert names == {"alice", "bob"}
        mailbox = data(await b.call_tool("receive_message", {}, meta=meta("b1")))
        [entry] = mailbox["entries"]
        assert entry["message_id"] == sent["message_id"]
        assert entry["from"] == "alice"
        assert entry["state"] == "accepted"


async def test_ask_and_reply_round_trip(world: dict[str, str]) -> None:
    async with shim(world) as a, shim(world) as b:
        await b.call_tool("receive_message", {}, meta=meta("b1", "bob"))
        asked = data(await a.call_tool("ask", {"to": "bob", "text": "which test is flaky?"},
                                       meta=meta("a1", "alice")))
        assert asked["state"] == "accepted", asked
        [q] = inbox(world, "b1")
        assert q["kind"] == "ask"
        answer = data(await b.call_tool("reply", {"message_id": asked["message_id"],
                                                  "text": "test_retry"}, meta=meta("b1")))
        assert answer["state"] == "accepted", answer
        assert answer["in_reply_to"] == asked["message_id"]
        [r] = inbox(world, "a1")
        assert r["text"] == "test_retry"
        assert r["in_reply_to"] == asked["message_id"]
        assert r["from"] == "bob"
        # R4: one reply per inbound message
        again = data(await b.call_tool("reply", {"message_id": asked["message_id"],
                                                 "text": "test_retry"}, meta=meta("b1")))
        assert again == answer
        other = await b.call_tool("reply", {"message_id": asked["message_id"],
                                            "text": "something else"}, meta=meta("b1"))
        assert other.is_error
        assert data(other)["error"] == "already_replied"
        assert len(inbox(world, "a1")) == 1
        missing = await b.call_tool("reply", {"message_id": "no-such", "text": "x"},
                                    meta=meta("b1"))
        assert data(missing)["error"] == "no_such_message"


@pytest.mark.seed(27)
async def test_pooled_shim_routes_each_call_by_its_session(world: dict[str, str]) -> None:
    async with shim(world) as pooled, shim(world) as other:
        await pooled.call_tool("receive_message", {}, meta=meta("t1", "thread-one"))
        await pooled.call_tool("receive_message", {}, meta=meta("t2", "thread-two"))
        s1 = data(await other.call_tool("send_message", {"to": "thread-one", "text": "for t1"},
                                        meta=meta("o", "outsider")))
        s2 = data(await other.call_tool("send_message", {"to": "thread-two", "text": "for t2"},
                                        meta=meta("o")))
        assert s1["state"] == s2["state"] == "accepted"
        assert [m["text"] for m in inbox(world, "t1")] == ["for t1"]
        assert [m["text"] for m in inbox(world, "t2")] == ["for t2"]
        m1 = data(await pooled.call_tool("receive_message", {}, meta=meta("t1")))
        m2 = data(await pooled.call_tool("receive_message", {}, meta=meta("t2")))
        assert [e["text"] for e in m1["entries"]] == ["for t1"]
        assert [e["text"] for e in m2["entries"]] == ["for t2"]
        unbound = await pooled.call_tool("receive_message", {})
        assert data(unbound)["error"] == "unbound"


async def test_bad_arguments_get_clear_errors(world: dict[str, str]) -> None:
    async with shim(world) as c:
        m = meta("z1", "zed")
        cases: list[tuple[str, dict[str, Any], str]] = [
            ("send_message", {"to": "x"}, "invalid_arguments"),
            ("send_message", {"to": "x", "text": "hi", "kind": "ask"}, "invalid_arguments"),
            ("send_message", {"to": 3, "text": "hi"}, "invalid_arguments"),
            ("ask", {"to": "x", "text": "hi", "deadline_seconds": -1}, "invalid_arguments"),
            ("ask", {"to": "x", "text": "hi", "deadline_seconds": True}, "invalid_arguments"),
            ("receive_message", {"after": "garbage"}, "invalid_cursor"),
            ("receive_message", {"limit": 0}, "invalid_arguments"),
        ]
        # an unknown tool is a protocol error, not a result: test_protocol_mcp.py
        for tool, args, reason in cases:
            res = await c.call_tool(tool, args, meta=m)
            assert res.is_error, (tool, args)
            assert data(res)["error"] == reason, (tool, args, data(res))
        nobody = data(await c.call_tool("send_message", {"to": "nobody", "text": "hi"},
                                        meta=m))
        assert nobody["state"] == "rejected"  # sent nowhere: definite (issue 12, item 8)
        assert nobody["reason"] == "no_such_agent"


async def test_exit_on_stdin_eof_removes_descriptors(world: dict[str, str]) -> None:
    reg = Registry(Path(world["CROSSTALK_HOME"]))
    async with shim(world) as c:
        await c.call_tool("receive_message", {}, meta=meta("e1", "eve"))
        assert [d.name for d in reg.live()] == ["eve"]
    await eventually(lambda: reg.live() == [] and not list(reg.agents_dir.glob("*.json")))


def _gone(pid: int) -> bool:
    """Exited (a zombie waiting for init to reap it counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True
    return state in (b"Z", b"X")


def test_leftover_shim_exits_when_its_parent_dies(world: dict[str, str]) -> None:
    # The shim's stdin is a pipe the *test* holds open, so stdin never reaches EOF: only the
    # parent-death watch can end it once its parent (a stand-in harness) is killed.
    script = ("import subprocess, sys, time\n"
              "p = subprocess.Popen([sys.executable, '-m', 'crosstalk', 'mcp'],"
              " stdout=subprocess.DEVNULL)\n"
              "print(p.pid, flush=True)\n"
              "time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], env=world,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        time.sleep(1.0)  # let it start serving
        assert not _gone(child)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        killed_at = time.monotonic()
        while not _gone(child):
            if time.monotonic() - killed_at > 10:
                os.kill(child, signal.SIGKILL)
                raise AssertionError("the shim outlived its parent by 10 s")
            time.sleep(0.05)
    finally:
        if parent.poll() is None:
            parent.kill()
        if parent.stdin is not None:
            parent.stdin.close()


async def test_sigterm_unpublishes_every_agent_of_a_busy_shim(world: dict[str, str]) -> None:
    """Harnesses SIGTERM a server that does not exit within ~2 s of closing its input."""
    reg = Registry(Path(world["CROSSTALK_HOME"]))
    try:
        async with shim(world) as c:
            for i in range(20):
                await c.call_tool("receive_message", {}, meta=meta(f"s{i}", f"agent-{i}"))
            live = reg.live()
            assert len(live) == 20
            pids = {d.pid for d in live}
            assert len(pids) == 1
            os.kill(pids.pop(), signal.SIGTERM)
            await eventually(lambda: not list(reg.agents_dir.glob("*.json")), timeout=10)
    except Exception as exc:  # the client notices its server went away; that is expected
        if list(reg.agents_dir.glob("*.json")):
            raise AssertionError("descriptors left behind after SIGTERM") from exc
    assert reg.live() == []


@pytest.mark.seed(27)
async def test_codex_threads_are_bound_by_thread_id_per_call(world: dict[str, str],
                                                             tmp_path: Path) -> None:
    t1 = "01a1a3c0-0000-7000-8000-000000000001"
    t2 = "01a1a3c0-0000-7000-8000-000000000002"
    cwd = tmp_path / "proj"
    cwd.mkdir()
    params = StdioServerParameters(command=sys.executable, args=["-m", "crosstalk", "mcp"],
                                   env=world, cwd=str(cwd))
    async with Client(params, mode="legacy") as codex, shim(world) as other:
        await codex.call_tool("receive_message", {}, meta={"threadId": t1})
        await codex.call_tool("receive_message", {},
                              meta={"x-codex-turn-metadata": {"thread_id": t2}})
        rows = {r["agent_id"]: r for r in data(await codex.call_tool("list_agents", {}))[
            "agents"]}
        a1, a2 = agent_id_for("codex", t1), agent_id_for("codex", t2)
        assert set(rows) == {a1, a2}
        assert rows[a1]["name"] == f"codex-proj-{a1[:8]}"
        assert rows[a2]["name"] == f"codex-proj-{a2[:8]}"
        assert rows[a1]["cwd"] == str(cwd)
        # No app-server has the thread loaded: sending works, inbound is a definite refusal.
        await other.call_tool("receive_message", {}, meta=meta("f1", "fred"))
        out = data(await codex.call_tool("send_message", {"to": "fred", "text": "from t1"},
                                         meta={"threadId": t1}))
        assert out["state"] == "accepted", out
        got = inbox(world, "f1")
        assert [(m["text"], m["from_agent_id"]) for m in got] == [("from t1", a1)]
        back = data(await other.call_tool("send_message", {"to": rows[a1]["name"],
                                                           "text": "to t1"}, meta=meta("f1")))
        assert back["state"] == "unreachable"
        assert back["reason"] == "codex_thread_not_loaded"
        # Each call is routed by its own evidence; none -> unbound.
        mine = data(await codex.call_tool("receive_message", {"state": "unreachable"},
                                          meta={"threadId": t1}))
        assert [e["text"] for e in mine["entries"]] == ["to t1"]
        theirs = data(await codex.call_tool("receive_message", {"state": "unreachable"},
                                            meta={"threadId": t2}))
        assert theirs["entries"] == []
        bad = await codex.call_tool("send_message", {"to": "fred", "text": "x"},
                                    meta={"threadId": "../../etc"})
        assert data(bad)["error"] == "unbound"


async def test_a_late_reply_to_an_expired_ask_is_ask_closed(world: dict[str, str]) -> None:
    """R7: an ask's deadline closes its route; a reply after it is refused, not delivered."""
    async with shim(world) as a, shim(world) as b:
        await b.call_tool("receive_message", {}, meta=meta("b1", "bob"))
        asked = data(await a.call_tool("ask", {"to": "bob", "text": "quick?",
                                               "deadline_seconds": 1},
                                       meta=meta("a1", "alice")))
        assert asked["state"] == "accepted", asked
        mid = asked["message_id"]

        async def expired() -> bool:
            box = data(await b.call_tool("receive_message", {}, meta=meta("b1")))
            return any(e["message_id"] == mid and e.get("ask") == "expired"
                       for e in box["entries"])

        deadline = time.monotonic() + 20
        while not await expired():
            assert time.monotonic() < deadline, "the ask never expired"
            await asyncio.sleep(0.2)
        late = await b.call_tool("reply", {"message_id": mid, "text": "yes"}, meta=meta("b1"))
        assert late.is_error
        assert data(late)["error"] == "ask_closed"
        assert inbox(world, "a1") == []


@pytest.mark.seed(21)
async def test_two_shims_two_agents_each_nothing_lost_nothing_doubled(
        world: dict[str, str]) -> None:
    """Issue 4: two shims serving two agents each, real A2A between them: send, ask -> reply,
    deadline expiry, cancel, and one shim restarted mid-ask."""
    reg = Registry(Path(world["CROSSTALK_HOME"]))
    async with shim(world) as s1:
        async with shim(world) as s2:
            for session, name in (("b1", "bob"), ("b2", "bea")):
                await s2.call_tool("receive_message", {}, meta=meta(session, name))

            async def call(client: Any, tool: str, session: str, name: str | None = None,
                           **args: Any) -> dict[str, Any]:
                return data(await client.call_tool(tool, args, meta=meta(session, name)))

            sent = await call(s1, "send_message", "a1", "ann", to="bob", text="build green")
            asked = await call(s1, "ask", "a2", "abe", to="bea", text="merge now?")
            doomed = await call(s1, "ask", "a1", to="bea", text="quick one?",
                                deadline_seconds=1)
            pending = await call(s1, "ask", "a2", to="bob", text="across the restart?")
            assert {sent["state"], asked["state"], doomed["state"], pending["state"]} == {
                "accepted"}
            replied = await call(s2, "reply", "b2", message_id=asked["message_id"],
                                 text="yes, merge")
            assert replied["state"] == "accepted"

            # Cancel over A2A: a delivered ask is no longer cancelable, and stays answerable.
            [abe] = reg.find("abe")
            [bob] = reg.find("bob")
            token = Path(abe.credential_ref).read_text().strip()
            assert bob.a2a_url is not None
            task = await a2a_client.send(bob.a2a_url, token, "cancel me?", kind="ask",
                                         until_delivered=True)
            assert task.task_id
            cancel = await a2a_client.cancel_task(bob.a2a_url, token, task.task_id)
            assert (cancel.state, cancel.reason) == ("rejected", "task_not_cancelable")

            async def expired() -> bool:
                box = await call(s2, "receive_message", "b2")
                return any(e["message_id"] == doomed["message_id"] and e.get("ask") ==
                           "expired" for e in box["entries"])

            deadline = time.monotonic() + 20
            while not await expired():
                assert time.monotonic() < deadline, "the ask never expired"
                await asyncio.sleep(0.2)
            late = await s2.call_tool("reply", {"message_id": doomed["message_id"],
                                                "text": "too late"}, meta=meta("b2"))
            assert data(late)["error"] == "ask_closed"
        # Shim 2 is gone mid-ask (bob has not answered `pending` or `cancel me?`): restart it.
        assert reg.find("bob") == []
        async with shim(world) as s2:
            box = data(await s2.call_tool("receive_message", {}, meta=meta("b1", "bob")))
            ids = [e["message_id"] for e in box["entries"]]
            assert ids == [sent["message_id"], pending["message_id"], task.message_id]
            back = data(await s2.call_tool("reply", {"message_id": pending["message_id"],
                                                     "text": "yes, it survived"},
                                           meta=meta("b1")))
            assert back["state"] == "accepted"
            answered = data(await s2.call_tool("reply", {"message_id": task.message_id,
                                                         "text": "not canceled"},
                                               meta=meta("b1")))
            assert answered["state"] == "accepted"

    def texts(session: str) -> list[str]:
        return [m["text"] for m in inbox(world, session)]

    assert texts("b1") == ["build green", "across the restart?", "cancel me?"]
    assert texts("b2") == ["merge now?", "quick one?"]
    assert texts("a1") == []
    assert texts("a2") == ["yes, merge", "yes, it survived", "not canceled"]
    assert [m["in_reply_to"] for m in inbox(world, "a2")] == [
        asked["message_id"], pending["message_id"], task.message_id]
