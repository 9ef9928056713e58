"""``crosstalk watch``'s terminal UI, driven headless by textual's pilot, against a real state
dir fed by real agents (FakeHarness, real sockets and journals) through the real Feed."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from textual.widgets import Input, Static

from crosstalk.agent import Agent
from crosstalk.config import journal_path
from crosstalk.store.registry import Registry
from crosstalk.watch import app as app_module
from crosstalk.watch.app import MAX_ROWS, WatchApp
from crosstalk.watch.feed import Feed
from crosstalk.watch.model import Board, Change, MessageView, StateStep
from tests.support.agents import fake_agent, register_agent, running
from tests.support.waiting import eventually

pytestmark = pytest.mark.anyio

SIZE = (160, 50)


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


def watch(home: Path, env: dict[str, str], **kwargs: str) -> WatchApp:
    return WatchApp(Feed(home, env), poll_interval=0.05, **kwargs)


def cell(app: WatchApp, key: str, column: str) -> str:
    return str(app.messages.get_cell(key, column))


def session_names(app: WatchApp) -> set[str]:
    return {str(app.sessions.get_cell(k, "name")) for k in app.sessions.rows}


def detail(app: WatchApp) -> str:
    return str(app.query_one("#detail", Static).content)


def notices(app: WatchApp) -> str:
    return str(app.query_one("#notices", Static).content)


def screen(app: WatchApp) -> str:
    """Every word the app shows: both tables, the detail, the notices, the summary."""
    parts = [str(c) for table in (app.sessions, app.messages)
             for k in table.rows for c in table.get_row(k)]
    parts += [detail(app), notices(app), str(app.query_one("#summary", Static).content)]
    return "\n".join(parts)


async def until(check: Callable[[], object], what: str) -> None:
    await eventually(check, what=what)


def shown(app: WatchApp, key: str) -> Callable[[], bool]:
    return lambda: key in app.messages.rows


async def select(app: WatchApp, key: str) -> None:
    app.messages.move_cursor(row=app.messages.get_row_index(key))
    await until(lambda: key in detail(app).splitlines()[0], f"the detail of {key}")


async def test_sessions_appear_and_leave(pair: tuple[Agent, Agent], home: Path,
                                         env: dict[str, str]) -> None:
    app = watch(home, env)
    async with app.run_test(size=SIZE):
        await until(lambda: {"alice", "bob"} <= session_names(app), "alice and bob listed")
        alice = pair[0].agent_id
        assert [str(c) for c in app.sessions.get_row(alice)] == [
            "alice", "fake", "unknown", "yes", "yes", "primary"]
        carol = fake_agent(home, env, "sess-c", "carol")
        await carol.start()
        try:
            await until(lambda: "carol" in session_names(app), "carol appears")
        finally:
            await carol.stop()
        await until(lambda: "carol" not in session_names(app), "carol leaves")
        assert {"alice", "bob"} <= session_names(app)


async def test_a_message_s_states_in_order_and_its_detail(
        pair: tuple[Agent, Agent], home: Path, env: dict[str, str]) -> None:
    a, b = pair
    app = watch(home, env)
    async with app.run_test(size=SIZE):
        await until(lambda: app.polls > 0, "the first poll")
        sent = await a.send("bob", "is the build [bold]green[/bold]?")
        mid = sent.message_id
        await until(lambda: mid in app.messages.rows and cell(app, mid, "state") == "accepted",
                    "accepted on screen")
        assert cell(app, mid, "route") == "alice → bob"
        assert cell(app, mid, "kind") == "inform"
        assert cell(app, mid, "text") == "is the build [bold]green[/bold]?"  # not markup
        await select(app, mid)
        text = detail(app)
        block = text.split("\nstates\n", 1)[1].split("\n\n", 1)[0]
        states = [line.split()[1] for line in block.splitlines()]
        assert states == ["submitted", "dispatching", "accepted"]
        assert f"from      alice (verified, via a2a)  agent {a.agent_id}" in text
        assert f"to        bob  agent {b.agent_id}  [fake]" in text
        assert f'"id": "{mid}"' in text  # the raw journal records
        secrets = [a.token, b.token]
        secrets += [x.uds.key_path.read_text().strip() for x in (a, b) if x.uds]
        assert all(s and s not in screen(app) for s in secrets)


async def test_an_ask_counts_down_and_expires_on_screen(
        pair: tuple[Agent, Agent], home: Path, env: dict[str, str]) -> None:
    a, _ = pair
    app = watch(home, env)
    async with app.run_test(size=SIZE):
        await until(lambda: app.polls > 0, "the first poll")
        ask = await a.send("bob", "quick?", kind="ask", deadline_seconds=3,
                           return_immediately=True)
        mid = ask.message_id
        seen: list[str] = []

        def expired() -> bool:
            if mid in app.messages.rows and cell(app, mid, "ask") not in seen[-1:]:
                seen.append(cell(app, mid, "ask"))
            return seen[-1:] == ["expired"]

        await until(expired, "the ask expires on screen")
        counting = [s for s in seen if s.startswith("ask ") and s != "ask due"]
        assert len(counting) >= 2, seen  # it counted down, once a second
        seconds = [int(s.split()[1].rstrip("s")) for s in counting]
        assert seconds == sorted(seconds, reverse=True)
        assert seconds[0] <= 3
        assert mid not in app.open_asks


async def test_filters_narrow_both_panes_and_clear(
        pair: tuple[Agent, Agent], home: Path, env: dict[str, str]) -> None:
    a, b = pair
    app = watch(home, env)
    async with app.run_test(size=SIZE) as pilot:
        to_bob = (await a.send("bob", "deploy at five")).message_id
        to_alice = (await b.send("alice", "tests are red")).message_id
        await until(lambda: {to_bob, to_alice} <= set(app.messages.rows) and
                    cell(app, to_alice, "state") == "accepted", "both on screen")

        def rows() -> set[str]:
            return {str(k.value) for k in app.messages.rows}

        await pilot.press("slash")
        assert isinstance(app.focused, Input)
        await pilot.press(*"agent:bob state:accepted deploy")
        assert app.query_one(Input).value == "agent:bob state:accepted deploy"
        await until(lambda: rows() == {to_bob}, "only the deploy message")
        await pilot.press("enter")  # back to the table, the filter stays
        assert app.focused is app.messages
        for line, want in (("red", {to_alice}), ("harness:fake", {to_bob, to_alice}),
                           ("harness:claude", set()), ("kind:ask", set()),
                           ("state:held", set()), ("", {to_bob, to_alice})):
            app.query_one(Input).value = line
            await until(lambda want=want: rows() == want, f"filter {line!r}")
        app.query_one(Input).value = "agent:alice"
        await until(lambda: session_names(app) == {"alice"}, "sessions narrowed too")


async def test_the_thread_view_of_an_answered_ask(
        pair: tuple[Agent, Agent], home: Path, env: dict[str, str]) -> None:
    a, b = pair
    app = watch(home, env)
    async with app.run_test(size=SIZE) as pilot:
        other = (await a.send("bob", "unrelated")).message_id
        ask = await a.send("bob", "which test is flaky?", kind="ask", deadline_seconds=60,
                           return_immediately=True)
        await until(lambda: ask.message_id in app.messages.rows and
                    cell(app, ask.message_id, "ask").startswith("ask "), "the ask is open")
        await b.reply(ask.message_id, "test_retry")
        board = app.feed.board
        await until(lambda: board.replies_to(ask.message_id) and
                    cell(app, ask.message_id, "ask") == "answered", "answered, reply shown")
        reply = board.replies_to(ask.message_id)[0].message_id
        await until(shown(app, reply), "the reply's row")
        await until(lambda: other in app.messages.rows, "the other message")
        await select(app, reply)
        assert "thread (2)" in detail(app)
        assert f"in reply  {ask.message_id}" in detail(app)
        await pilot.press("t")
        await until(lambda: set(map(str, (k.value for k in app.messages.rows))) ==
                    {ask.message_id, reply}, "only the thread")
        assert cell(app, reply, "route") == "  ↳ bob → alice"
        await pilot.press("escape")
        await until(lambda: other in app.messages.rows, "every message again")


@pytest.mark.damaged_journal  # torn by hand: that is what the watch must show and survive
async def test_a_torn_line_a_damaged_descriptor_and_a_vanished_journal_are_shown(
        pair: tuple[Agent, Agent], home: Path, env: dict[str, str]) -> None:
    a, b = pair
    reg = Registry(home)
    dave = register_agent(reg, "sess-d", "dave", harness="fake")
    app = watch(home, env)
    try:
        async with app.run_test(size=SIZE):
            await until(lambda: "dave" in session_names(app), "dave listed")
            with open(journal_path(home, b.agent_id), "ab") as fh:
                fh.write(b'{"c":"deadbeef","r":{"torn by hand"\n')
            await until(lambda: "damaged line" in notices(app), "the torn line's notice")
            reg.descriptor_path(dave.agent_id).write_bytes(b"{not json")
            await until(lambda: dave.agent_id in app.sessions.rows and str(
                app.sessions.get_cell(dave.agent_id, "status")).startswith("DAMAGED"),
                "dave shown damaged")
            assert str(app.sessions.get_cell(dave.agent_id, "reachable")).startswith("no")
            after = (await a.send("bob", "still watching?")).message_id
            await until(lambda: after in app.messages.rows and
                        cell(app, after, "state") == "accepted", "the watch goes on")
            os.unlink(journal_path(home, a.agent_id))  # alice's journal vanishes mid-follow
            await until(lambda: str(journal_path(home, a.agent_id)) in notices(app),
                        "the vanished journal's notice")
            polls = app.polls
            await until(lambda: app.polls > polls + 2, "still polling")
            assert app.is_running
    finally:
        dave.close()


async def test_the_screen_is_up_before_the_first_poll_returns(
        home: Path, env: dict[str, str]) -> None:
    class Slow(Feed):
        def poll(self) -> list[Change]:
            time.sleep(0.5)
            return super().poll()

    app = WatchApp(Slow(home, env), poll_interval=0.05)
    async with app.run_test(size=SIZE):
        assert app.polls == 0
        assert "reading journals" in screen(app)
        await until(lambda: app.polls > 0, "the first poll")
        assert "reading journals" not in screen(app)


async def test_the_table_holds_the_newest_rows_and_a_filter_finds_older_ones() -> None:
    """A board of 1,500 messages: the table holds the newest MAX_ROWS, follows new ones, and a
    search reaches one past the bound (a board filled by hand: the bound is the UI's)."""
    board = Board()
    now = time.time()

    def message(i: int) -> MessageView:
        return MessageView(f"m{i:05d}", "B-bob", "bob", "alice", "A-alice", True, "a2a",
                           "inform", "immediate", f"note {i}",
                           steps=[StateStep(now + i, "accepted")])

    class Filled:
        """A feed whose poll (run in the app's worker thread, as the real one is) and the
        test's additions take turns, as the real feed's poll and its journals' writers do."""

        def __init__(self) -> None:
            self.board = board
            self.lock = threading.Lock()
            self.queued = [Change("message", now, m.message_id, "", {})
                           for m in map(message, range(1500)) if board.keep(m) is None]

        def poll(self) -> list[Change]:
            with self.lock:
                out, self.queued = self.queued, []
            return out

        def add(self, view: MessageView) -> None:
            with self.lock:
                board.keep(view)
                self.queued.append(Change("message", now, view.message_id, "", {}))

    feed = Filled()
    app = WatchApp(feed, poll_interval=0.05)
    async with app.run_test(size=SIZE):
        await until(lambda: app.polls > 0, "the first poll")
        assert app.messages.row_count == MAX_ROWS
        assert next(iter(app.shown)) == f"m{1500 - MAX_ROWS:05d}"
        await until(lambda: app.selected == "m01499", "the cursor on the newest")
        feed.add(message(1500))
        await until(lambda: app.selected == "m01500", "a new message followed")
        assert app.messages.row_count == MAX_ROWS
        assert "m00000" not in app.messages.rows
        app.query_one(Input).value = '"note 7"'
        await until(lambda: "m00007" in app.messages.rows, "an old one found")


async def test_a_highlight_posted_before_a_new_row_does_not_pull_the_selection_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The table posts its highlights as messages; one still queued when the next poll adds a
    row and moves the cursor names a row the cursor has left. The selection is the row under
    the cursor, whatever order the app reads them in (two polls applied back to back, as a
    loaded machine runs them; a full table, so the new row's trim leaves the cursor's index
    where it was and the table posts nothing for it)."""
    monkeypatch.setattr(app_module, "MAX_ROWS", 3)
    board = Board()
    now = time.time()
    views = [MessageView(f"m{i:02d}", "B-bob", "bob", "alice", "A-alice", True, "a2a",
                         "inform", "immediate", f"note {i}", steps=[StateStep(now + i, "accepted")])
             for i in range(4)]

    class Idle:
        def __init__(self) -> None:
            self.board = board

        def poll(self) -> list[Change]:
            return []

    app = WatchApp(Idle(), poll_interval=3600)
    async with app.run_test(size=SIZE) as pilot:
        await until(lambda: app.polls > 0, "the first (empty) poll")
        for view in views[:3]:
            board.keep(view)
        app.apply([Change("message", now, v.message_id, "", {}) for v in views[:3]])
        board.keep(views[3])
        app.apply([Change("message", now, "m03", "", {})])  # before the table's highlights
        await pilot.pause()
        assert app.messages.get_row_index("m03") == app.messages.cursor_row
        assert app.selected == "m03"
        assert "m00" not in app.messages.rows
        assert "m03" in detail(app).splitlines()[0]
