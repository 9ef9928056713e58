"""No cyclic garbage collection while a start rebuilds an agent's state.

A start (a journal replay, a checkpoint load, the settling and task rebuild after them)
keeps nearly everything it allocates: an entry per message, a task per task, the mailbox.
Every generational pass then rescans a growing heap of survivors, which was a tenth to a
fifth of a 20k-message replay and a third of a checkpointed restart. Nothing a start
allocates forms a reference cycle (decoded JSON, typed records, entries), so reference
counting frees all of it meanwhile; the collector resumes when the last pause ends.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class _Pauses:
    """How many pauses are open, and whether the collector runs again when they end."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0
        self.resume = False


_PAUSES = _Pauses()


@contextmanager
def paused() -> Iterator[None]:
    """Pause the collector for the block. Pauses nest (agents of one shim start side by
    side, a checkpoint advance runs in a thread): it resumes when the outermost ends, and
    only if it was running before."""
    p = _PAUSES
    with p.lock:
        if p.depth == 0:
            p.resume = gc.isenabled()
            gc.disable()
        p.depth += 1
    try:
        yield
    finally:
        with p.lock:
            p.depth -= 1
            if p.depth == 0 and p.resume:
                gc.enable()
