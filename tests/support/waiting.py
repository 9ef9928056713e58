"""Waiting for a condition in a test: poll until it holds, fail once a bound has passed.

The bound only stops a hang; it is never a timing assertion, so one generous bound serves every
test. Polling starts at a few milliseconds, because an in-process condition settles within a few
loop turns, and backs off to 50 ms, because a condition that waits on another process (a shim,
a fake session) would otherwise spend the CPU that process needs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

#: Seconds before a condition that never holds fails the test.
TIMEOUT = 20.0
FIRST_INTERVAL = 0.002
LAST_INTERVAL = 0.05


def _intervals() -> Iterator[float]:
    interval = FIRST_INTERVAL
    while True:
        yield interval
        interval = min(interval * 1.5, LAST_INTERVAL)


def _never(what: str, timeout: float) -> AssertionError:
    return AssertionError(f"never happened within {timeout} s: {what}")


async def eventually(check: Callable[[], object], *, what: str = "the condition",
                     timeout: float = TIMEOUT) -> None:
    """Return once ``check()`` is true; ``AssertionError`` naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    for interval in _intervals():
        if check():
            return
        if time.monotonic() > deadline:
            raise _never(what, timeout)
        await asyncio.sleep(interval)


def eventually_sync(check: Callable[[], object], *, what: str = "the condition",
                    timeout: float = TIMEOUT) -> None:
    """:func:`eventually` for code that may block: it sleeps instead of yielding to a loop."""
    deadline = time.monotonic() + timeout
    for interval in _intervals():
        if check():
            return
        if time.monotonic() > deadline:
            raise _never(what, timeout)
        time.sleep(interval)
