"""``crosstalk watch``: every session and every message on this machine, live, read-only.

On a terminal it is the full-screen view (:mod:`crosstalk.watch.app`); with ``--plain`` or
``--json``, or when stdout is not a terminal, the same feed as one line per change
(:mod:`crosstalk.watch.lines`). Either way it reads the registry and the journals and changes
nothing: no lock a shim needs, no repair, no token.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

from crosstalk.watch.feed import Feed
from crosstalk.watch.lines import Filters, run_lines
from crosstalk.watch.model import Change

EXIT_NO_UI = 2


def run_watch(home: Path, *, plain: bool = False, as_json: bool = False,
              agent: str | None = None, harness: str | None = None, state: str | None = None,
              env: Mapping[str, str] | None = None, out: IO[str] | None = None,
              interval: float = 0.25) -> int:
    out = out or sys.stdout
    feed = Feed(home, env)
    filters = Filters(agent=agent, harness=harness, state=state)
    if plain or as_json or not out.isatty():
        return run_lines(feed, out, as_json=as_json, interval=interval, filters=filters)
    first = Polled(feed, feed.poll())  # before textual is imported: nothing competes
    try:
        # By name: the app is its own module (textual is imported there only), and a build
        # without it still has the line feed.
        app = importlib.import_module("crosstalk.watch.app")
    except ImportError as exc:
        print(f"crosstalk watch: the terminal view is not available ({exc}); "
              "use --plain or --json", file=sys.stderr)
        return EXIT_NO_UI
    run_app: Callable[..., int] = app.run_app
    return run_app(first, agent=agent, harness=harness, state=state)


class Polled:
    """A feed whose first poll has already run: the app's first :meth:`poll` gets its
    changes, later ones go to the feed."""

    def __init__(self, feed: Feed, changes: list[Change]) -> None:
        self.feed, self.board = feed, feed.board
        self._first: list[Change] | None = changes

    def poll(self) -> list[Change]:
        first, self._first = self._first, None
        return first if first is not None else self.feed.poll()
