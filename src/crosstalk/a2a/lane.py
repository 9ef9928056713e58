"""One agent's dispatch lane and ask deadline timers.

Dispatch runs in one ordered lane per agent, so a message waits SUBMITTED (and cancelable)
until the messages before it were injected; CancelTask wins exactly when it runs before the
lane's dispatch claim (seed 22).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from crosstalk.core.states import AskState, IllegalTransition
from crosstalk.receiver import Entry, Receiver, ReceiverUnavailable

log = logging.getLogger(__name__)


class DispatchLane:
    """Dispatches one message at a time, in the order they were submitted."""

    def __init__(self, receiver: Receiver, *, grace_seconds: float = 2.0) -> None:
        self.receiver = receiver
        self.grace_seconds = grace_seconds
        self.errors: dict[str, str] = {}
        self.error_listeners: list[Callable[[str], None]] = []
        self._queue: asyncio.Queue[tuple[Entry, bool] | None] | None = None
        self._lane_task: asyncio.Task[None] | None = None
        self._enqueued: set[str] = set()
        self._deferred: list[tuple[Entry, bool]] = []
        self._unarmed: dict[str, float] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._started = False
        self._closed = False

    # -- dispatch ----------------------------------------------------------------------

    def submit(self, entry: Entry, *, resume: bool = False) -> None:
        if entry.message_id in self._enqueued or self._closed:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self._deferred.append((entry, resume))
            return
        self._enqueued.add(entry.message_id)
        if self._queue is None:
            self._queue = asyncio.Queue()
        if self._lane_task is None or self._lane_task.done():
            self._lane_task = asyncio.get_running_loop().create_task(self._lane())
        self._queue.put_nowait((entry, resume))

    def start(self) -> None:
        """Run what was submitted or armed before a loop ran."""
        if self._closed or (not self._deferred and self._started):
            return
        self._started = True
        deferred, self._deferred = self._deferred, []
        for entry, resume in deferred:
            self.submit(entry, resume=resume)
        unarmed, self._unarmed = self._unarmed, {}
        for mid, deadline in unarmed.items():
            self.arm(mid, deadline)

    def reopen(self) -> None:
        """Accept work again after :meth:`close` (a server started again)."""
        self._closed = False

    async def _lane(self) -> None:
        queue = self._queue
        assert queue is not None
        while True:
            item = await queue.get()
            if item is None or self._closed:
                return
            entry, resume = item
            try:
                if resume:
                    await self.receiver.resume(entry)
                else:
                    await self.receiver.dispatch(entry)
            except ReceiverUnavailable as exc:
                log.error("dispatch of %s could not start: %s", entry.message_id, exc)
                self._lane_error(entry.message_id, str(exc))
            except Exception as exc:  # a bug must not stop the lane for every later message
                log.exception("dispatch of %s failed", entry.message_id)
                self._lane_error(entry.message_id, repr(exc))
            finally:
                self._enqueued.discard(entry.message_id)

    def _lane_error(self, message_id: str, reason: str) -> None:
        self.errors[message_id] = reason
        for listener in list(self.error_listeners):
            listener(message_id)

    # -- ask deadlines -----------------------------------------------------------------

    def arm(self, message_id: str, deadline_at: float) -> None:
        """Expire the open ask ``message_id`` at ``deadline_at`` (the receiver's clock)."""
        if self._closed or message_id in self._timers:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._unarmed[message_id] = deadline_at  # armed by start()
            return
        delay = max(0.0, deadline_at - self.receiver.clock())
        self._timers[message_id] = loop.call_later(delay, self._expire, message_id)

    def disarm(self, message_id: str) -> None:
        self._unarmed.pop(message_id, None)
        timer = self._timers.pop(message_id, None)
        if timer is not None:
            timer.cancel()

    def is_armed(self, message_id: str) -> bool:
        return message_id in self._timers or message_id in self._unarmed

    @property
    def armed(self) -> dict[str, float]:
        """The asks with a timer, by message id (for inspection)."""
        return {**self._unarmed, **{m: t.when() for m, t in self._timers.items()}}

    def _expire(self, message_id: str) -> None:
        self._timers.pop(message_id, None)
        entry = self.receiver.entries.get(message_id)
        if entry is None or entry.ask is not AskState.OPEN:
            return
        try:
            self.receiver.close_ask(message_id, AskState.EXPIRED)
        except (KeyError, IllegalTransition, ReceiverUnavailable) as exc:
            log.error("could not expire ask %s: %s", message_id, exc)

    # -- stop --------------------------------------------------------------------------

    async def close(self, grace_seconds: float | None = None) -> None:
        """The dispatch in flight gets ``grace_seconds`` to finish (then it is cancelled, which
        the receiver journals as ``unknown``); messages still waiting stay ``submitted``."""
        self._closed = True
        grace = self.grace_seconds if grace_seconds is None else grace_seconds
        lane = self._lane_task
        if lane is not None and self._queue is not None:
            self._queue.put_nowait(None)
            done, _ = await asyncio.wait({lane}, timeout=grace)
            if not done:
                lane.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await lane
        self._lane_task = None
        self._queue = None
        self._enqueued.clear()
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        self._unarmed.clear()
        self._started = False
