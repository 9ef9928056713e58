"""``crosstalk watch --plain`` and ``--json``: the feed as one line per change, for scripts
and logs (and whenever stdout is not a terminal).

The start state comes first (a change per session and per message), then each change as a
poll finds it, until interrupted: Ctrl-C, or the reader closing the pipe, ends it with 0.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import IO

from crosstalk.watch.feed import Feed
from crosstalk.watch.model import Board, Change

_MESSAGE_KINDS = frozenset({"message", "state", "ask", "receipt"})
_SESSION_KINDS = frozenset({"session_added", "session_changed", "session_left"})


@dataclass(frozen=True)
class Filters:
    """What ``--agent``, ``--harness`` and ``--state`` keep (``None``: everything).

    ``agent`` is a name or an agent_id, on either end of a message; ``harness`` keeps the
    sessions of that harness and the messages to or from one; ``state`` keeps messages whose
    state (or ask state, or receipt) it names. Notices are always kept: a problem is shown.
    """

    agent: str | None = None
    harness: str | None = None
    state: str | None = None

    def admits(self, change: Change, board: Board) -> bool:
        if change.kind in _SESSION_KINDS:
            return self._session(change)
        if change.kind in _MESSAGE_KINDS:
            return self._message(change, board)
        return True

    def _session(self, change: Change) -> bool:
        s = change.data.get("session") or {}
        if self.agent is not None and self.agent not in (s.get("name"), s.get("key")):
            return False
        return self.harness is None or s.get("harness") == self.harness

    def _message(self, change: Change, board: Board) -> bool:
        d = change.data
        ends = (d.get("from"), d.get("from_agent_id"), d.get("to"), d.get("to_agent_id"))
        if self.agent is not None and self.agent not in ends:
            return False
        if self.harness is not None:
            harnesses = {board.sessions[k].harness for k in (d.get("to_agent_id"),
                                                             d.get("from_agent_id"))
                         if isinstance(k, str) and k in board.sessions}
            if self.harness not in harnesses:
                return False
        if self.state is not None:
            receipt = d.get("receipt") or ""
            if self.state not in (d.get("state"), d.get("ask"), receipt.split(":")[0]):
                return False
        return True


def plain(change: Change) -> str:
    return change.line


def as_json(change: Change) -> str:
    return json.dumps(change.data, ensure_ascii=False, separators=(",", ":"))


#: ``as_json`` under a name ``run_lines``' flag of the same name does not hide.
_json_line = as_json


def run_lines(feed: Feed, out: IO[str], *, as_json: bool, interval: float = 0.25,
              stop: threading.Event | None = None, filters: Filters | None = None) -> int:
    """Print the start state, then every change, until ``stop`` is set or interrupted."""
    stop = stop or threading.Event()
    filters = filters or Filters()
    render = _json_line if as_json else plain
    try:
        while True:
            for change in feed.poll():
                if filters.admits(change, feed.board):
                    out.write(render(change) + "\n")
            out.flush()
            if stop.wait(interval):
                return 0
    except (KeyboardInterrupt, BrokenPipeError):
        return 0

