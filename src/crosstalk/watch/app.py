"""``crosstalk watch``'s terminal UI (textual): sessions, messages as they move, one in detail.

The app draws what the feed (:mod:`crosstalk.watch.feed`) keeps on its :class:`Board`; it
reads nothing itself, writes nothing, takes no lock. Its rules:

- ``feed.poll()`` reads files and blocks, so it runs in a thread (``asyncio.to_thread``), one
  poll at a time, never on the UI loop. While a poll runs the feed may change the board, so
  everything that walks the board (a filter, the detail, a thread) waits until the poll
  returns: such a redraw is only marked pending, and done right after the poll.
- The screen is drawn before the first poll ends (the tables fill in as it returns), so the
  app's own start-up is only textual's; the first poll is the feed's budget.
- Rows are updated in place from the changes a poll reports, not redrawn: 5,000 messages stay
  cheap. Open asks count down once a second from the app's own list of them.
- Every cell is a ``rich.text.Text``: a message's text is shown, never parsed as markup.

Keys: ``/`` filter (``agent:NAME harness:H state:S kind:K`` and words,
:mod:`crosstalk.watch.filters`), ``t`` the selected message's thread, ``escape`` back,
``q`` quit. Enter on a session filters the messages to it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import ClassVar, Protocol

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.css.query import NoMatches
from textual.widgets import DataTable, Footer, Input, Static

from crosstalk.watch import filters, render
from crosstalk.watch.model import Board, Change, MessageView, Notice

#: How many notices the notices line shows (the newest; the board keeps more).
NOTICES_SHOWN = 3
#: How many message rows the table holds: the newest that match (the board keeps more, a
#: filter finds them). Textual measures every cell of a row it adds: 5,000 rows cost the
#: start ~1.4 s on this 2-core machine, 500 (ten screens of scrollback) ~0.15 s.
MAX_ROWS = 500


class Feed(Protocol):
    """What the app needs of :class:`crosstalk.watch.feed.Feed`."""

    @property
    def board(self) -> Board: ...

    def poll(self) -> list[Change]: ...


class WatchApp(App[int]):
    TITLE = "crosstalk watch"
    CSS = """
    #summary { height: 1; padding: 0 1; background: $boost; }
    #sessions { height: auto; max-height: 35%; min-height: 4; }
    #main { height: 1fr; }
    #messages { width: 2fr; }
    #detail-box { width: 1fr; border-left: solid $accent; padding: 0 1; }
    #notices { height: auto; max-height: 3; padding: 0 1; color: $warning; }
    #filter { height: 3; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "quit"),
        Binding("slash", "focus_filter", "filter"),
        Binding("t", "thread", "thread"),
        Binding("escape", "leave", "back"),
    ]

    def __init__(self, feed: Feed, *, poll_interval: float = 0.25, filter_line: str = "",
                 agent: Iterable[str] | str | None = None,
                 harness: Iterable[str] | str | None = None,
                 state: Iterable[str] | str | None = None) -> None:
        super().__init__()
        self.feed = feed
        self.poll_interval = poll_interval
        options = filters.from_options(agent=agent, harness=harness, state=state)
        self.filter_line = " ".join(p for p in (options, filter_line) if p)
        self.filter = filters.parse(self.filter_line)
        #: The message the detail pane shows, and the thread the table is narrowed to.
        self.selected: str | None = None
        self.thread_ids: set[str] | None = None
        #: Shown messages whose ask is open: the one-second countdown walks only these.
        self.open_asks: dict[str, MessageView] = {}
        #: The messages' rows, oldest first (the table's own order is costly to ask for).
        self.shown: dict[str, None] = {}
        self.polls = 0
        self._polling = False
        self._pending_refilter = False
        self._pending_detail = False
        #: A thread view asked for while a poll ran: drawn when it returns.
        self._thread_of: str | None = None

    # -- layout --------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Static(id="summary")
        yield DataTable(id="sessions", cursor_type="row", zebra_stripes=True)
        with Horizontal(id="main"):
            yield DataTable(id="messages", cursor_type="row", zebra_stripes=True)
            with VerticalScroll(id="detail-box"):
                yield Static(Text("select a message"), id="detail")
        yield Static(id="notices")
        yield Input(value=self.filter_line, id="filter",
                    placeholder="filter: agent:NAME harness:H state:S kind:K and words (/)")
        yield Footer()

    def on_mount(self) -> None:
        for key, label in render.SESSION_COLUMNS:
            self.sessions.add_column(label, key=key)
        for key, label in render.MESSAGE_COLUMNS:
            self.messages.add_column(label, key=key)
        self.messages.focus()
        self._summary()
        self.set_interval(1.0, self._tick)
        self.run_worker(self._follow(), name="feed", exclusive=True)

    @property
    def sessions(self) -> DataTable[Text]:
        return self.query_one("#sessions", DataTable)

    @property
    def messages(self) -> DataTable[Text]:
        return self.query_one("#messages", DataTable)

    # -- the feed ------------------------------------------------------------------------

    async def _follow(self) -> None:
        board = self.feed.board
        while True:
            self._polling = True
            try:
                changes = await asyncio.to_thread(self.feed.poll)
            except Exception as exc:  # the watch shows it and keeps running
                changes = []
                board.notices.append(Notice(time.time(), "watch", f"poll failed: {exc!r}"))
                self._show_notices()
            finally:
                self._polling = False
            self.polls += 1
            try:
                self.apply(changes)
            except NoMatches:  # the app closed while the poll ran: its widgets are gone
                return
            await asyncio.sleep(self.poll_interval)

    def apply(self, changes: list[Change]) -> None:
        """Bring the tables up to date with what one poll changed (call between polls)."""
        sessions = {c.key for c in changes if c.kind.startswith("session_")}
        messages = dict.fromkeys(c.key for c in changes
                                 if c.kind in ("message", "state", "ask", "receipt"))
        for key in sessions:
            self._show_session(key)
        fresh = sum(key not in self.messages.rows for key in messages)
        if (self._pending_refilter or (sessions and self.filter.harnesses)
                or fresh > MAX_ROWS // 2):
            self._refilter()  # one rebuild beats moving many rows (the first poll's case)
        else:
            following = self._following()
            added = [key for key in messages if self._show_message(key)]
            self._trim()
            if added and following:
                self._select_newest()
        if any(c.kind == "notice" for c in changes):
            self._show_notices()
        if self._pending_detail or (self.selected in messages) or sessions:
            self._show_detail()
        self._summary()

    def _show_session(self, key: str) -> None:
        table, view = self.sessions, self.feed.board.sessions.get(key)
        shown = key in table.rows
        if view is None or not self.filter.matches_session(view):
            if shown:
                table.remove_row(key)
            return
        cells = [Text(c) for c in render.session_cells(view)]
        if not shown:
            table.add_row(*cells, key=key)
            return
        for (column, _), cell in zip(render.SESSION_COLUMNS, cells, strict=True):
            table.update_cell(key, column, cell)

    def _visible(self, view: MessageView) -> bool:
        if self.thread_ids is not None:
            if view.message_id in self.thread_ids or view.in_reply_to in self.thread_ids:
                self.thread_ids.add(view.message_id)
                return True
            return False
        return self.filter.matches_message(view, self._harness_of)

    def _show_message(self, key: str) -> bool:
        """Add, refresh or drop one message's row; true if a row was added."""
        table, view = self.messages, self.feed.board.messages.get(key)
        shown = key in table.rows
        if view is None or not self._visible(view):
            if shown:
                table.remove_row(key)
                del self.shown[key]
            self.open_asks.pop(key, None)
            return False
        depth = render.depth_in(self.feed.board, view) if self.thread_ids is not None else 0
        cells = [Text(c) for c in render.message_cells(view, time.time(), depth)]
        if view.ask_state == "open":
            self.open_asks[key] = view
        else:
            self.open_asks.pop(key, None)
        if not shown:
            table.add_row(*cells, key=key)
            self.shown[key] = None
            return True
        for (column, _), cell in zip(render.MESSAGE_COLUMNS, cells, strict=True):
            table.update_cell(key, column, cell)
        return False

    def _trim(self) -> None:
        """Drop the oldest rows past :data:`MAX_ROWS`, and rows of messages the board has
        forgotten (it forgets the oldest first, so both are at the top)."""
        board, table = self.feed.board, self.messages
        while self.shown:
            oldest = next(iter(self.shown))
            if len(self.shown) <= MAX_ROWS and oldest in board.messages:
                return
            table.remove_row(oldest)
            del self.shown[oldest]
            self.open_asks.pop(oldest, None)

    def _refilter(self) -> None:
        """Redraw both tables under the current filter or thread (call between polls)."""
        if self._polling:
            self._pending_refilter = True
            return
        self._pending_refilter = False
        if self._thread_of is not None:
            thread = self.feed.board.thread(self._thread_of)
            self.thread_ids = {m.message_id for m in thread} or None
            self._thread_of = None
        self.sessions.clear()
        for key in list(self.feed.board.sessions):
            self._show_session(key)
        table, board = self.messages, self.feed.board
        table.clear()
        self.shown.clear()
        self.open_asks.clear()
        newest: list[str] = []
        for key in reversed(board.messages):
            if len(newest) >= MAX_ROWS:
                break
            if self._visible(board.messages[key]):
                newest.append(key)
        for key in reversed(newest):
            self._show_message(key)
        if self.selected is not None and self.selected in table.rows:
            table.move_cursor(row=table.get_row_index(self.selected))
        elif table.row_count:
            self._select_newest()
        self._summary()

    def _select_newest(self) -> None:
        """The cursor to the newest row. The detail is told too: trimming the top row may
        leave the cursor's index as it was, and then the table reports no new highlight."""
        if self.shown:
            self.selected = next(reversed(self.shown))
            self.messages.move_cursor(row=self.messages.row_count - 1)
            self._show_detail()

    def _following(self) -> bool:
        """The table follows new messages while its cursor is on the last row (or none)."""
        table = self.messages
        return table.row_count <= 1 or table.cursor_row >= table.row_count - 1

    def _harness_of(self, agent_id: str | None) -> str | None:
        view = self.feed.board.sessions.get(agent_id) if agent_id else None
        return view.harness if view is not None else None

    # -- what a person reads -------------------------------------------------------------

    def _tick(self) -> None:
        """Once a second: the open asks' countdowns (only cells, no board walk)."""
        now = time.time()
        for key, view in list(self.open_asks.items()):
            if key in self.messages.rows:
                self.messages.update_cell(key, "ask", Text(render.ask_cell(view, now)))
        if self.selected in self.open_asks:
            self._show_detail()

    def _show_detail(self) -> None:
        if self._polling:
            self._pending_detail = True
            return
        self._pending_detail = False
        try:
            pane = self.query_one("#detail", Static)
        except NoMatches:
            return  # the app is closing: a late highlight has nothing to draw on
        view = self.feed.board.messages.get(self.selected) if self.selected else None
        if view is None:
            pane.update(Text("select a message" if self.selected is None
                             else f"{self.selected}: no longer on the board"))
            return
        pane.update(Text(render.detail(view, self.feed.board, time.time(), self._harness_of)))

    def _show_notices(self) -> None:
        notices = list(self.feed.board.notices)[-NOTICES_SHOWN:]
        self.query_one("#notices", Static).update(
            Text("\n".join(render.notice_line(n) for n in notices)))

    def _summary(self) -> None:
        board = self.feed.board
        parts = [f"{len(board.sessions)} sessions",
                 f"{self.messages.row_count}/{len(board.messages)} messages shown"
                 + (" (the newest)" if self.messages.row_count == MAX_ROWS else ""),
                 f"{len(self.open_asks)} open asks"]
        if board.notices:
            parts.append(f"{len(board.notices)} notices")
        if self.thread_ids is not None:
            parts.append("thread view (escape: back)")
        elif not self.filter.empty:
            parts.append(f"filter: {self.filter_line}")
        if self.polls == 0:
            parts.append("reading journals…")
        self.query_one("#summary", Static).update(Text(" · ".join(parts)))

    # -- events --------------------------------------------------------------------------

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        """The selection is the row under the cursor now, not the one the event names: a
        highlight still queued when the next poll moved the cursor names a row it has left."""
        table = event.data_table
        if table.id != "messages" or not table.row_count:
            return
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        if key is not None:
            self.selected = str(key)
            self._show_detail()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id != "sessions" or event.row_key.value is None:
            return
        view = self.feed.board.sessions.get(str(event.row_key.value))
        if view is not None:
            self.query_one("#filter", Input).value = filters.from_options(
                agent=view.name or view.key)

    def on_input_changed(self, event: Input.Changed) -> None:
        self.filter_line = event.value
        self.filter = filters.parse(event.value)
        self.thread_ids = None
        self._refilter()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.messages.focus()

    def action_focus_filter(self) -> None:
        self.query_one("#filter", Input).focus()

    def action_thread(self) -> None:
        """Narrow the messages to the selected one's thread (replies as they come join it)."""
        if self.selected is not None:
            self._thread_of = self.selected
            self._refilter()

    def action_leave(self) -> None:
        if self.thread_ids is not None or self._thread_of is not None:
            self.thread_ids = self._thread_of = None
            self._refilter()
        self.messages.focus()


def run_app(feed: Feed, *, poll_interval: float = 0.25, filter_line: str = "",
            agent: Iterable[str] | str | None = None,
            harness: Iterable[str] | str | None = None,
            state: Iterable[str] | str | None = None) -> int:
    """Run the UI until ``q`` or Ctrl-C; 0 (a watch has nothing to fail at)."""
    app = WatchApp(feed, poll_interval=poll_interval, filter_line=filter_line, agent=agent,
                   harness=harness, state=state)
    app.run()
    return app.return_code or 0
