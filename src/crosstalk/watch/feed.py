"""The watch's feed: the :class:`~crosstalk.watch.model.Board` kept up to date from the
registry and the journals, each poll's differences as :class:`~crosstalk.watch.model.Change`.

No daemon and no new state: sessions are the rows ``crosstalk agents`` prints
(:func:`crosstalk.cli.agents.rows`: descriptors merged with each harness's discovery, with
``unreachable_because`` and ``damaged``), read at most once a second; messages are folded from
the journals (:mod:`~crosstalk.watch.journals` follows them, :mod:`~crosstalk.watch.fold`
folds them). Everything here blocks on file reads: the terminal UI calls :meth:`Feed.poll` in
a worker thread, holding :attr:`Feed.lock`, which it also holds while it reads the board.

Start-up (ADR 0901-watch-feed-start): each journal's tail is read, not the whole journal,
sized so that the board gets about the :data:`START_MESSAGES` newest messages
(:data:`BYTES_PER_MESSAGE` each, shared among the journals by size); the first poll reports
the start state as one change per session and one per message (its latest state, all its
steps in ``data``), later polls report each step.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from crosstalk.watch.fold import MessageFold, clock, message_change, quote, redact
from crosstalk.watch.journals import JournalFollower
from crosstalk.watch.model import (
    MAX_MESSAGES,
    Board,
    Change,
    ChangeKind,
    MessageView,
    Notice,
    SessionView,
)

#: Journal bytes per message on average: 1.75 KB in bench/restart.py's mix of A2A informs,
#: asks and uds sends (35 MB for 20k messages), rounded up.
BYTES_PER_MESSAGE: Final = 2048
#: How many of the newest messages the start state shows at most (the board then grows to
#: its ``history`` as messages come): 1,000 is about the last hour of a machine whose
#: journals hold 100k records a day (several screens of the Messages pane), and reading them
#: takes about 0.2 s of a first poll that must end well inside 1 s (bench/watch.py).
START_MESSAGES: Final = 1000
#: How often the session rows are read at most (each read runs every harness's discovery).
SESSIONS_EVERY: Final = 1.0

Rows = Callable[[], list[dict[str, Any]]]


class Feed:
    """The board and the poll that keeps it current (read-only: it writes and locks nothing).
    """

    def __init__(self, home: Path, env: Mapping[str, str] | None = None, *,
                 history: int = MAX_MESSAGES, sessions: Rows | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.home = home
        self.board = Board(max_messages=history)
        #: Held by :meth:`poll`; a reader of :attr:`board` in another thread holds it too.
        self.lock = threading.Lock()
        self._clock = clock
        self._rows = sessions if sessions is not None else _directory_rows(home, env)
        self._names: dict[str, str] = {}
        self._fold = MessageFold(self.board, self._names.get, self._heard)
        self._journals = JournalFollower(
            home / "journal", min(history, START_MESSAGES) * BYTES_PER_MESSAGE, clock=clock)
        self._sessions_read_at: float | None = None
        self._started = False

    def poll(self) -> list[Change]:
        """Everything that changed since the last poll (the first: the start state)."""
        with self.lock:
            return self.poll_sessions() + self.poll_journals()

    # -- sessions -------------------------------------------------------------------------

    def poll_sessions(self, *, force: bool = False) -> list[Change]:
        now = self._clock()
        last = self._sessions_read_at
        if not force and last is not None and now - last < SESSIONS_EVERY:
            return []
        self._sessions_read_at = now
        try:
            listed = self._rows()
        except Exception as exc:  # a harness's discovery failing must not end the watch
            return [self._notice(Notice(now, "sessions", f"cannot list sessions: {exc!r}"))]
        fresh = {v.key: v for v in (session_view(r) for r in listed)}
        changes: list[Change] = []
        for key, view in fresh.items():
            old = self.board.sessions.get(key)
            if old == view:
                continue
            changes.append(session_change("session_added" if old is None
                                          else "session_changed", view, now))
            if view.name and view.crosstalk:
                self._named(key, view.name)
        for key in [k for k in self.board.sessions if k not in fresh]:
            changes.append(session_change("session_left", self.board.sessions[key], now))
        self.board.sessions = fresh
        return changes

    def _named(self, agent_id: str, name: str) -> None:
        if self._names.get(agent_id) == name:
            return
        self._names[agent_id] = name
        for view in self.board.messages.values():
            if view.to_agent == agent_id and view.to_name is None:
                view.to_name = name

    def _heard(self, agent_id: str, name: str) -> None:
        """A verified sender's name: used for an agent no live session names (a live
        session's name is current; a message's may be from before a rename)."""
        if agent_id not in self.board.sessions:
            self._named(agent_id, name)

    # -- journals -------------------------------------------------------------------------

    def poll_journals(self) -> list[Change]:
        batches, notices = self._journals.poll()
        changes: list[Change] = []
        report = self._started
        for batch in batches:
            for raw in batch.records:
                changes.extend(self._fold.take(batch.agent_id, raw, live=batch.whole,
                                               report=report))
        if not self._started:
            self._started = True
            changes = [start_change(view) for view in
                       sorted(self.board.messages.values(), key=lambda m: m.first_ts)]
        changes.sort(key=lambda c: c.ts)
        return changes + [self._notice(n) for n in notices]

    def _notice(self, notice: Notice) -> Change:
        self.board.notices.append(notice)
        return Change("notice", notice.ts, notice.where,
                      f"{clock(notice.ts)} ! {notice.where}: {notice.what}",
                      {"event": "notice", "ts": notice.ts, "where": notice.where,
                       "what": notice.what})


def _directory_rows(home: Path, env: Mapping[str, str] | None) -> Rows:
    def rows() -> list[dict[str, Any]]:
        from crosstalk.cli.agents import rows as agent_rows

        return agent_rows(home, os.environ if env is None else env)

    return rows


def session_view(row: Mapping[str, Any]) -> SessionView:
    """One ``crosstalk agents`` row as the Sessions pane shows it."""
    damaged = row.get("damaged")
    reason = None
    if isinstance(damaged, Mapping):
        reason = str(damaged.get("reason") or "damaged")
    agent_id = row.get("agent_id")
    key = (str(agent_id) if agent_id else
           f"damaged:{damaged.get('path') if isinstance(damaged, Mapping) else '?'}")
    return SessionView(
        key=key, name=_opt(row, "name"), harness=_opt(row, "harness"),
        status=str(row.get("status") or "unknown"), crosstalk=bool(row.get("crosstalk")),
        reachable=bool(row.get("reachable")), cwd=_opt(row, "cwd"),
        waiting_for=_opt(row, "waiting_for"),
        unreachable_because=_opt(row, "unreachable_because"), role=_opt(row, "role"),
        owner=_opt(row, "owner"), damaged=reason)


def _opt(row: Mapping[str, Any], key: str) -> str | None:
    value = row.get(key)
    return None if value is None else str(value)


def session_data(view: SessionView) -> dict[str, Any]:
    return {"key": view.key, "name": view.name, "harness": view.harness,
            "status": view.status, "waiting_for": view.waiting_for,
            "crosstalk": view.crosstalk, "reachable": view.reachable,
            "unreachable_because": view.unreachable_because, "role": view.role,
            "owner": view.owner, "cwd": view.cwd, "damaged": view.damaged}


def session_change(kind: ChangeKind, view: SessionView, ts: float) -> Change:
    """``14:03:07 + bob (fake) idle crosstalk reachable``; ``~`` changed, ``-`` left."""
    label = view.name or view.key
    if kind == "session_left":
        line = f"{clock(ts)} - {label} left"
    else:
        status = (f"waiting for {view.waiting_for}" if view.waiting_for else view.status)
        reach = ("reachable" if view.reachable else
                 f"unreachable ({view.unreachable_because or 'unknown'})")
        sign = "+" if kind == "session_added" else "~"
        line = (f"{clock(ts)} {sign} {label} ({view.harness or '?'}) {status} "
                f"{'crosstalk' if view.crosstalk else 'native'} {reach}")
        if view.damaged:
            line += f" damaged descriptor: {view.damaged}"
    return Change(kind, ts, view.key, line,
                  redact({"event": kind, "ts": ts, "session": session_data(view)}))


def start_change(view: MessageView) -> Change:
    """A message as the start state shows it: one change, its latest state."""
    ts = view.steps[-1].ts if view.steps else 0.0
    reason = f" ({view.reason})" if view.reason else ""
    ask = f"; ask {view.ask_state}" if view.ask_state else ""
    receipt = f"; receipt {view.receipt}" if view.receipt else ""
    return message_change("message", view, ts,
                          f"{view.state}{reason}{ask}{receipt} {quote(view.text)}")
