"""The watch's feed against a real state dir fed by real agents (FakeHarness, real sockets)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from crosstalk.agent import Agent
from crosstalk.config import journal_path
from crosstalk.core.states import AskState
from crosstalk.store.registry import Registry
from crosstalk.watch.feed import Feed
from crosstalk.watch.model import Change
from tests.support.agents import fake_agent, register_agent, running

pytestmark = pytest.mark.anyio


@pytest.fixture
def env() -> dict[str, str]:
    return {"XDG_RUNTIME_DIR": tempfile.mkdtemp(prefix="ct-rt-", dir="/tmp")}


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
async def pair(home: Path, env: dict[str, str]) -> AsyncIterator[tuple[Agent, Agent]]:
    async with running(fake_agent(home, env, "sess-a", "alice"),
                       fake_agent(home, env, "sess-b", "bob")) as (a, b):
        yield a, b


class Watched:
    """A feed polled in a thread (as the UI polls it), every change kept in order."""

    def __init__(self, feed: Feed) -> None:
        self.feed = feed
        self.changes: list[Change] = []

    async def poll(self) -> list[Change]:
        got = await asyncio.to_thread(self.feed.poll)
        self.changes.extend(got)
        return got

    async def until(self, check: Callable[[Watched], object], what: str) -> None:
        """Poll until ``check(self)`` holds (``what`` names it when it never does)."""
        deadline = time.monotonic() + 20
        while not check(self):
            assert time.monotonic() < deadline, f"{what}: not seen in 20 s"
            await self.poll()
            await asyncio.sleep(0.05)

    def about(self, key: str) -> list[Change]:
        return [c for c in self.changes if c.key == key]


async def test_sessions_appear_and_leave(pair: tuple[Agent, Agent], home: Path,
                                         env: dict[str, str]) -> None:
    w = Watched(Feed(home, env))
    start = await w.poll()
    added = {c.data["session"]["name"] for c in start if c.kind == "session_added"}
    assert {"alice", "bob"} <= added
    carol = fake_agent(home, env, "sess-c", "carol")
    await carol.start()
    try:
        await w.until(lambda w: any(c.kind == "session_added" and c.key == carol.agent_id
                                    for c in w.changes), "carol appears")
        row = w.feed.board.sessions[carol.agent_id]
        assert (row.name, row.harness, row.crosstalk, row.reachable) == (
            "carol", "fake", True, True)
    finally:
        await carol.stop()
    await w.until(lambda w: any(c.kind == "session_left" and c.key == carol.agent_id
                                for c in w.changes), "carol leaves")
    assert carol.agent_id not in w.feed.board.sessions
    assert "- carol left" in w.about(carol.agent_id)[-1].line


async def test_a_message_s_states_show_in_order(pair: tuple[Agent, Agent], home: Path,
                                                env: dict[str, str]) -> None:
    a, b = pair
    w = Watched(Feed(home, env))
    await w.poll()
    sent = await a.send("bob", "is the build green?")
    assert sent.state == "accepted"
    mid = sent.message_id
    await w.until(lambda w: any(c.data.get("state") == "accepted" for c in w.about(mid)),
                  "accepted shows")
    states = [c.data["state"] for c in w.about(mid)]
    assert states[0] == "submitted"
    assert states.index("dispatching") < states.index("accepted")
    first = w.about(mid)[0]
    assert first.kind == "message"
    assert (first.data["from"], first.data["to"], first.data["verified"]) == (
        "alice", "bob", True)
    assert first.data["to_agent_id"] == b.agent_id
    assert "alice → bob inform accepted" in w.about(mid)[-1].line
    view = w.feed.board.messages[mid]
    assert [s.state for s in view.steps] == states
    assert view.records
    assert view.records[0]["id"] == mid


async def test_an_ask_opened_then_answered_and_one_that_expires(
        pair: tuple[Agent, Agent], home: Path, env: dict[str, str]) -> None:
    a, b = pair
    w = Watched(Feed(home, env))
    await w.poll()
    ask = await a.send("bob", "which test is flaky?", kind="ask", deadline_seconds=60,
                       return_immediately=True)
    await w.until(lambda w: any(c.data.get("ask") == "open" for c in w.about(ask.message_id)),
                  "the ask opens")
    deadline = w.feed.board.messages[ask.message_id].ask_deadline
    assert deadline is not None
    assert 50 < deadline - time.time() <= 60
    await b.reply(ask.message_id, "test_retry")
    await w.until(lambda w: any(c.data.get("ask") == "answered"
                                for c in w.about(ask.message_id)), "the ask is answered")
    view = w.feed.board.messages[ask.message_id]
    assert (view.reply_text, view.ask_deadline) == ("test_retry", None)
    # The reply is a message of its own, in alice's journal, threaded under the ask.
    await w.until(lambda w: w.feed.board.replies_to(ask.message_id), "the reply shows")
    reply = w.feed.board.replies_to(ask.message_id)[0]
    assert (reply.sender_label, reply.to_name) == ("bob", "alice")
    assert [m.message_id for m in w.feed.board.thread(reply.message_id)] == [
        ask.message_id, reply.message_id]

    short = await a.send("bob", "quick?", kind="ask", deadline_seconds=1,
                         return_immediately=True)
    await w.until(lambda w: any(c.data.get("ask") == AskState.EXPIRED.value
                                for c in w.about(short.message_id)), "the ask expires")


@pytest.mark.damaged_journal
async def test_a_torn_line_is_a_notice_and_the_feed_goes_on(
        pair: tuple[Agent, Agent], home: Path, env: dict[str, str]) -> None:
    a, b = pair
    w = Watched(Feed(home, env))
    await w.poll()
    with open(journal_path(home, b.agent_id), "ab") as fh:
        fh.write(b'{"c":"deadbeef","r":{"torn by hand"\n')
    await w.until(lambda w: any(c.kind == "notice" for c in w.changes), "a notice")
    notice = next(c for c in w.changes if c.kind == "notice")
    assert "damaged line" in notice.line
    assert str(journal_path(home, b.agent_id)) == notice.key
    after = await a.send("bob", "still here?")
    await w.until(lambda w: any(c.data.get("state") == "accepted"
                                for c in w.about(after.message_id)), "the next message")


async def test_an_unreadable_descriptor_shows_damaged(pair: tuple[Agent, Agent], home: Path,
                                                     env: dict[str, str]) -> None:
    reg = Registry(home)
    dave = register_agent(reg, "sess-d", "dave", harness="fake")
    try:
        w = Watched(Feed(home, env))
        await w.poll()
        assert w.feed.board.sessions[dave.agent_id].damaged is None
        reg.descriptor_path(dave.agent_id).write_bytes(b"{not json")
        await w.until(lambda w: w.feed.board.sessions.get(dave.agent_id) is not None
                      and w.feed.board.sessions[dave.agent_id].damaged, "dave damaged")
        changed = [c for c in w.about(dave.agent_id) if c.kind == "session_changed"]
        assert "damaged descriptor" in changed[-1].line
        assert not w.feed.board.sessions[dave.agent_id].reachable
    finally:
        dave.close()


def _read_json_lines(proc: subprocess.Popen[str],
                     until: Callable[[list[dict[str, Any]]], bool],
                     timeout: float = 20) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while not until(got):
        if time.monotonic() > deadline:
            raise AssertionError(f"not seen in time; got {got}")
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"watch ended early; got {got}")
        got.append(json.loads(line))
    return got


async def test_watch_json_as_a_process(pair: tuple[Agent, Agent], home: Path,
                                       env: dict[str, str]) -> None:
    a, _b = pair
    before = await a.send("bob", "before the watch")
    proc = subprocess.Popen(
        [sys.executable, "-m", "crosstalk", "watch", "--json"],
        env={**os.environ, **env, "CROSSTALK_HOME": str(home)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        start = await asyncio.to_thread(_read_json_lines, proc, lambda got: any(
            g.get("message_id") == before.message_id for g in got))
        names = {g["session"]["name"] for g in start if g["event"] == "session_added"}
        assert {"alice", "bob"} <= names
        shown = next(g for g in start if g.get("message_id") == before.message_id)
        assert (shown["event"], shown["state"], shown["text"]) == (
            "message", "accepted", "before the watch")
        later = await a.send("bob", "while watched")
        live = await asyncio.to_thread(_read_json_lines, proc, lambda got: any(
            g.get("message_id") == later.message_id and g.get("state") == "accepted"
            for g in got))
        assert next(g["state"] for g in live if g.get("message_id") == later.message_id) == (
            "submitted")
        key = a.uds.key_path.read_text().strip() if a.uds else ""
        assert key
        assert key not in json.dumps(start + live)
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
