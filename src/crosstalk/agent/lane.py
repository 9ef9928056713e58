"""One agent's dispatch lane (every ingress) and its ask clock, in the agent's task group.

**Ordered dispatch.** Every message an ingress admits — A2A first messages and
continuations, uds frames of both shapes, restart resumptions — is dispatched here, one at a
time, in the order it was submitted. A message waits SUBMITTED (and cancelable) until the
messages before it were injected; CancelTask wins exactly when it runs before the lane's
dispatch lock (seed 22), because the lock is :meth:`Receiver.dispatch`'s first write. A
failed dispatch is logged and recorded in :attr:`DispatchLane.errors`; the lane goes on.

**Locks ahead.** The locks of up to :data:`LOCK_AHEAD` uds messages waiting next are written
with the lane's current write, so their turns do not wait on a write (ADR 0045). A uds message
has no CancelTask and no resume, so only a crash tells the difference: such a message is then
``unknown`` rather than ``recovered``. An A2A message is never locked ahead of its turn.

**Ask clock.** An open ask whose deadline passes is expired (``receiver.end_ask(EXPIRED)``,
which fails its task). One clock task sleeps until the earliest armed deadline.

**Stop.** :meth:`DispatchLane.close`: the dispatch in flight gets its grace to finish, then is
cancelled (the receiver journals it ``unknown``), and so is a message locked ahead whose turn
did not come within the grace; messages still waiting stay ``submitted``
in the journal for the next start to restore (seed R2); the clock stops. (A dispatch a caller
waits for and runs in its own task, :meth:`DispatchLane.dispatch`, ends with that caller: the
uds ingress gives its connections their grace.)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from crosstalk.agent.taskgroup import TaskGroup
from crosstalk.core.states import AskEvent, AskState, IllegalTransition
from crosstalk.inbound import answered
from crosstalk.receiver import Inbound, NeverAdmitted, Receiver, ReceiverUnavailable, Result

log = logging.getLogger(__name__)

#: How many uds messages waiting their turn may have their dispatch locks written ahead
#: (ADR 0045: 1 -> 4 took 16 senders' throughput from ~1,250 to ~1,650/s; 16 gave no more).
LOCK_AHEAD = 4
#: How long the dispatch in flight may finish after the lane is closed, by default.
DISPATCH_GRACE = 2.0


@dataclass
class _Item:
    entry: Inbound
    resume: bool
    #: Taken back before its turn (:meth:`DispatchLane.withdraw`): skipped.
    withdrawn: bool = False
    #: Callers awaiting this dispatch's result (:meth:`DispatchLane.dispatch`).
    waiters: list[asyncio.Future[Result]] = field(default_factory=list)

    def settle(self, result: Result | None = None, error: BaseException | None = None) -> None:
        """Hand the outcome to every waiter; ``None`` for both cancels them."""
        for waiter in self.waiters:
            if waiter.done():
                continue
            if error is not None:
                waiter.set_exception(error)
            elif result is not None:
                waiter.set_result(result)
            else:
                waiter.cancel()


class DispatchLane:
    """Dispatches one message at a time, in the order messages were submitted."""

    def __init__(self, receiver: Receiver, group: TaskGroup, *,
                 grace_seconds: float = DISPATCH_GRACE) -> None:
        self.receiver = receiver
        self.group = group
        self.grace_seconds = grace_seconds
        #: Why a message's dispatch could not start (or failed), by message id.
        self.errors: dict[str, str] = {}
        #: Called with a message id when its dispatch could not start.
        self.error_listeners: list[Callable[[str], None]] = []
        #: Waiting their turn, in order (``None``: close() asks the lane to stop); a deque
        #: with a wake-up event rather than an asyncio.Queue, so the next one can be seen.
        self._queue: deque[_Item | None] = deque()
        self._arrived = asyncio.Event()
        self._items: dict[str, _Item] = {}
        self._drained = asyncio.Event()
        self._drained.set()
        #: Held by the one dispatch in flight, in the lane task or a caller's (dispatch()).
        self._turn = asyncio.Lock()
        self._runner: asyncio.Task[None] | None = None
        self._clock: asyncio.Task[None] | None = None
        self._due: dict[str, float] = {}  # message id -> loop time its ask expires
        self._unscheduled: dict[str, float] = {}  # armed before a loop ran: deadline_at
        self._tick = asyncio.Event()
        self._closed = False

    async def start(self) -> None:
        """Open the group and run the lane and the clock in it (a no-op once running)."""
        if self._closed:
            return
        await self.group.open()
        if self._runner is None:
            self._runner = self.group.spawn(self._run(), what="dispatch lane")
        if self._clock is None:
            for mid, deadline_at in list(self._unscheduled.items()):
                del self._unscheduled[mid]
                self.arm(mid, deadline_at)
            self._clock = self.group.spawn(self._run_clock(), what="ask clock")

    # -- dispatch ----------------------------------------------------------------------

    def submit(self, entry: Inbound, *, resume: bool = False) -> None:
        """Queue ``entry`` for dispatch (``resume``: re-run it from policy, seed R2); a
        message already in the lane is not queued twice."""
        self._enqueue(entry, resume)

    async def dispatch(self, entry: Inbound) -> Result:
        """Dispatch ``entry`` in lane order and return its result.

        With nothing queued or in flight its turn is now: it is dispatched in the caller's
        task, holding the lane's turn (no hand-off to the lane task and back, measured ~10 %
        of a uds sender's throughput); stopping then cancels it with the caller's connection.
        """
        mid = entry.message_id
        if not self._closed and not self._items and not self._turn.locked():
            mine = self._items[mid] = _Item(entry, False)
            self._drained.clear()
            try:
                async with self._turn:
                    done = await self.receiver.dispatch_staged(entry)
                return await done  # the turn is free: the next lock shares this outcome's write
            finally:
                self._forget(mine)
        item = self._enqueue(entry, False)
        if item is None:  # the lane is closed: the message stays submitted
            raise asyncio.CancelledError
        waiter: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        item.waiters.append(waiter)
        return await waiter

    def withdraw(self, entry: Inbound) -> None:
        """Take back ``entry`` if it still waits for its turn: its admission failed after it
        was submitted (the A2A first message's fused write, ADR 0046), so a retry of the same
        message id is a new entry and must not find this one in its place."""
        item = self._items.get(entry.message_id)
        if item is not None and item.entry is entry:
            item.withdrawn = True
            self._forget(item)

    async def settle(self) -> None:
        """Wait until every message submitted so far has been dispatched."""
        await self._drained.wait()

    def _enqueue(self, entry: Inbound, resume: bool) -> _Item | None:
        if self._closed:
            return None
        item = self._items.get(entry.message_id)
        if item is None:
            item = self._items[entry.message_id] = _Item(entry, resume)
            self._drained.clear()
            self._put(item)
        return item

    async def _run(self) -> None:
        while True:
            item = await self._next()
            if item is None:
                return
            done = await self._dispatch(item)
            if done is not None:
                # Its outcome's write is in flight: the next message's lock joins it, and the
                # waiters are answered when it is durable.
                done.add_done_callback(functools.partial(self._finished, item))

    async def _next(self) -> _Item | None:
        """The next message to dispatch; ``None`` once the lane stops."""
        while True:
            while not self._queue:
                self._arrived.clear()
                await self._arrived.wait()
            item = self._queue.popleft()
            if item is None or (self._closed and item.entry.locked_ahead is None):
                return None  # a message locked ahead is in flight: it gets the grace too
            if not item.withdrawn:
                return item

    async def _dispatch(self, item: _Item) -> asyncio.Future[Result] | None:
        """Dispatch ``item`` up to its outcome's staged write (``None``: it ended here)."""
        mid = item.entry.message_id
        done: asyncio.Future[Result] | None = None
        try:
            async with self._turn:
                self._lock_next(item)
                if item.resume:
                    done = answered(await self.receiver.resume(item.entry))
                else:
                    done = await self.receiver.dispatch_staged(item.entry)
        except NeverAdmitted as exc:  # its admission's failure was answered there
            item.settle(error=exc)
        except ReceiverUnavailable as exc:
            log.error("dispatch of %s could not start: %s", mid, exc)
            self._lane_error(mid, str(exc))
            item.settle(error=exc)
        except Exception as exc:  # a bug must not stop the lane for every later message
            log.exception("dispatch of %s failed", mid)
            self._lane_error(mid, repr(exc))
            item.settle(error=exc)
        except BaseException:
            item.settle()  # cancelled by close(): the receiver journaled it unknown
            raise
        finally:
            if done is None:  # it ended here; otherwise when its outcome is durable
                self._forget(item)
        return done

    def _put(self, item: _Item | None) -> None:
        self._queue.append(item)
        self._arrived.set()

    def _lock_next(self, item: _Item) -> None:
        """Stage the dispatch locks of ``item`` and of up to :data:`LOCK_AHEAD` uds messages
        waiting behind it, in order, into the write the lane stages now (the last outcome's):
        a lock is then durable by the time its message's turn comes, and the lane does not
        wait a write between two injections (ADR 0045). The receiver says which qualify; the
        first that does not ends the run, so no lock is ever written past an unlocked one."""
        if self._closed:
            return
        for waiting in itertools.chain((item,), itertools.islice(self._queue, LOCK_AHEAD)):
            if waiting is None or waiting.resume:
                return
            if (waiting.entry.locked_ahead is None
                    and not self.receiver.lock_ahead(waiting.entry)):
                return

    def _finished(self, item: _Item, done: asyncio.Future[Result]) -> None:
        item.settle(done.result())
        self._forget(item)

    def _forget(self, item: _Item) -> None:
        if self._items.get(item.entry.message_id) is item:  # not a newer item of that id
            del self._items[item.entry.message_id]
        if not self._items:
            self._drained.set()

    def _lane_error(self, message_id: str, reason: str) -> None:
        self.errors[message_id] = reason
        for listener in list(self.error_listeners):
            listener(message_id)

    # -- the ask clock -----------------------------------------------------------------

    def arm(self, message_id: str, deadline_at: float) -> None:
        """Expire the open ask ``message_id`` at ``deadline_at`` (the receiver's clock)."""
        if self._closed or self.is_armed(message_id):
            return
        try:
            now = asyncio.get_running_loop().time()
        except RuntimeError:
            self._unscheduled[message_id] = deadline_at  # scheduled by start()
            return
        self._due[message_id] = now + max(0.0, deadline_at - self.receiver.clock())
        self._tick.set()

    def disarm(self, message_id: str) -> None:
        self._unscheduled.pop(message_id, None)
        self._due.pop(message_id, None)

    def is_armed(self, message_id: str) -> bool:
        return message_id in self._due or message_id in self._unscheduled

    @property
    def armed(self) -> dict[str, float]:
        """The asks with a deadline timer, by message id (for inspection)."""
        return {**self._unscheduled, **self._due}

    async def _run_clock(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._tick.clear()
            now = loop.time()
            due = [mid for mid, at in self._due.items() if at <= now]
            for mid in due:
                if self._due.pop(mid, None) is not None:
                    self._expire(mid)
            if due:
                await asyncio.sleep(0)  # a turn between batches, as separate timers had
                continue
            nearest = min(self._due.values(), default=None)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(None if nearest is None else nearest - now):
                    await self._tick.wait()

    def _expire(self, message_id: str) -> None:
        entry = self.receiver.entries.get(message_id)
        if entry is None or entry.ask is not AskState.OPEN:
            return
        try:
            self.receiver.end_ask(message_id, AskEvent.EXPIRED)
        except (KeyError, IllegalTransition, ReceiverUnavailable) as exc:
            log.error("could not expire ask %s: %s", message_id, exc)

    # -- stop --------------------------------------------------------------------------

    async def close(self, grace_seconds: float | None = None) -> None:
        """Stop dispatching: the dispatch in flight gets ``grace_seconds`` (default
        :attr:`grace_seconds`) to finish, then it is cancelled (the receiver journals it
        ``unknown``); messages still waiting stay ``submitted``; the clock stops."""
        self._closed = True
        grace = self.grace_seconds if grace_seconds is None else grace_seconds
        runner, self._runner = self._runner, None
        if runner is not None and not runner.done():
            self._put(None)
            done, _ = await asyncio.wait({runner}, timeout=grace)
            if not done:
                runner.cancel()
                await asyncio.wait({runner})
        clock, self._clock = self._clock, None
        if clock is not None:
            clock.cancel()
            await asyncio.wait({clock})
        for item in list(self._items.values()):
            # A message locked ahead whose turn did not come is unknown, as a restart finds
            # it; the others stay submitted.
            await self.receiver.release_locked_ahead(item.entry)
            item.settle()  # waiting callers are released; their messages stay submitted
        self._items.clear()
        self._drained.set()
        self._due.clear()
        self._unscheduled.clear()
