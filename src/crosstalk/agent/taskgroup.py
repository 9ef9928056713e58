"""One task group for a unit's background work (hypercorn's habit).

An agent's dispatch lane, its ask clock and its start-up recovery all run as tasks of one
:class:`asyncio.TaskGroup`, so stopping the agent is that group closing: when
:meth:`TaskGroup.close` returns, nothing the agent started is still running.

The agent starts and stops from whatever task its owner happens to be in (a shim's main, a
test), while an :class:`asyncio.TaskGroup` must be entered and left by one task. So the group
lives in a *host* task that enters it on :meth:`TaskGroup.open` and leaves it on
:meth:`TaskGroup.close`; closing cancels whatever is still running and waits for it.

A task's failure is logged and ends only that task: one bad dispatch or reconcile must not
cancel the lane for every later message, which is what a bare task group would do.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


async def guarded(work: Coroutine[Any, Any, None], what: str) -> None:
    """Run ``work``; a failure is logged (cancellation passes through)."""
    try:
        await work
    except Exception:
        log.exception("%s failed", what)


class TaskGroup:
    """A task group that outlives the task which opened it."""

    def __init__(self, name: str = "crosstalk") -> None:
        self.name = name
        self._group: asyncio.TaskGroup | None = None
        self._host: asyncio.Task[None] | None = None
        self._closed = False

    async def open(self) -> None:
        """Enter the group (in its host task); a no-op once open."""
        if self._host is not None or self._closed:
            return
        loop = asyncio.get_running_loop()
        entered: asyncio.Future[None] = loop.create_future()
        self._host = loop.create_task(self._hold(entered), name=f"{self.name}: task group")
        await entered

    async def _hold(self, entered: asyncio.Future[None]) -> None:
        async with asyncio.TaskGroup() as group:
            self._group = group
            entered.set_result(None)
            await asyncio.Event().wait()  # until close() cancels this host task

    def spawn(self, work: Coroutine[Any, Any, None], *, what: str) -> asyncio.Task[None]:
        """Run ``work`` in the group; its failure is logged as ``what`` (see :func:`guarded`)."""
        if self._group is None or self._closed:
            work.close()
            raise RuntimeError(f"{self.name}: the task group is not open")
        task = self._group.create_task(guarded(work, what), name=f"{self.name}: {what}")
        # Cancelled before its first step, the wrapper never starts ``work``: close it then,
        # so it is not reported as never awaited (a no-op once it ran).
        task.add_done_callback(lambda _: work.close())
        return task

    async def close(self) -> None:
        """Cancel what is still running and wait until every task has ended."""
        self._closed = True
        host, self._host = self._host, None
        if host is None:
            return
        host.cancel()  # the group cancels its tasks, waits for them, then the host ends
        await asyncio.wait({host})
        self._group = None
