"""What a uds ingress connection costs, and why (issue 12; ADR 0013).

- **The cap counts readers only.** :data:`MAX_CONNECTIONS` bounds the connections that have
  not yet delivered their frame. Once it is in hand a connection leaves the cap: a receipt or
  a native frame is handled at once, and a shape (a) sender whose frame is admitted waits for
  its outcome outside it. So how long a delivery takes never decides who may connect, and a
  receipt (a control frame) never waits behind a message. (Places reserved for receipts could
  not work: a connection's kind is known only from its first line.)
- **Waiting is bounded where it is decided.** Shape (a)'s ack is the state its injection
  ended in, so its sender must wait; the ingress bounds that with the receiver's wait limit
  (``Limits.max_waits``, shared with A2A's blocking sends), not here.
- **Silence gives way.** When the cap is full, a newcomer takes the place of the *oldest*
  connection still reading, which is closed unheard: nothing it sent was acted on, so closing
  it loses and answers nothing. Senders write their frame as soon as they connect, so the
  oldest reader is the one most likely to be holding a place it does not use.

Single event loop: every method runs without awaiting, so the counts are exact between awaits.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

#: Connections still reading their frame; a newcomer beyond it evicts the oldest of them.
#: Senders and probes read for a moment only; a connection in the chain does not count.
MAX_CONNECTIONS = 64


@dataclass(eq=False)
class Conn:
    """One connection's place in the budget."""

    #: Ends the connection: how an eviction, or a stop, ends one that is still reading.
    close: Callable[[], object]
    #: Still waiting for the frame it will be judged by: counted against the cap, evictable,
    #: and closed outright when the ingress stops (nothing of it was accepted yet).
    reading: bool = True
    #: Closed to make room for a newer connection.
    evicted: bool = False
    #: The task taking its frame through the receiver chain, once it has one.
    task: asyncio.Task[Any] | None = None


class Connections:
    """Every connection being served, and the readers among them, oldest first."""

    def __init__(self, max_readers: int, where: str) -> None:
        if max_readers < 1:
            raise ValueError("max_connections must be at least 1")
        self.max_readers = max_readers
        self.where = where
        self._all: dict[Conn, None] = {}
        self._readers: dict[Conn, None] = {}  # insertion order = accept order
        self._crowded = False

    def __len__(self) -> int:
        return len(self._all)

    def __iter__(self) -> Iterator[Conn]:
        return iter(list(self._all))

    @property
    def readers(self) -> int:
        return len(self._readers)

    def add(self, close: Callable[[], object]) -> Conn:
        """A new connection, reading; beyond the cap the oldest reader gives its place."""
        conn = Conn(close)
        self._all[conn] = self._readers[conn] = None
        if len(self._readers) > self.max_readers:
            self._evict_oldest()
        return conn

    def done_reading(self, conn: Conn) -> None:
        """``conn`` has its frame (or is ending): it no longer counts against the cap."""
        conn.reading = False
        self._readers.pop(conn, None)
        if not self._readers:
            self._crowded = False

    def remove(self, conn: Conn) -> None:
        self.done_reading(conn)
        self._all.pop(conn, None)

    def _evict_oldest(self) -> None:
        # The newcomer was added last, so the oldest reader is another connection.
        conn = next(iter(self._readers))
        self.done_reading(conn)
        conn.evicted = True
        conn.close()
        if not self._crowded:
            # Once per crowded episode (until no connection is reading): a flood of
            # connections must not become a flood of log lines.
            self._crowded = True
            log.info("uds ingress %s: %d connections are reading at once; the oldest give "
                     "their places to newcomers", self.where, self.max_readers)
