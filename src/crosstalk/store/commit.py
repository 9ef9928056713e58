"""Group commit: appends staged on an event loop share one write and one fsync.

Why: an agent's journal is written from its event loop. A synchronous fsync per record blocks
the loop, so sixteen senders wait in line for sixteen fsyncs, and the disk's fsync rate caps
the messages an agent takes. A staged append is written by a worker thread instead: while it
writes and fsyncs, the loop goes on reading frames and staging their records, and the next
write takes every record staged meanwhile — one ``write``, one ``fsync`` (ADR 0036).

What stays true:

- **Each caller is answered after its own records are durable**: a group's future resolves
  only after the fsync that covered it returned.
- **A failed write fails every group in it** (the file is rolled back, as for any failed
  append); a group that cannot be encoded (too large, not JSON) fails alone and takes no seq.
- **A group can depend on another** (``after``): it is written only if that one was. The
  dispatch lock is staged in the same tick as the admission it follows, so one write carries
  both; if the admission fails, the lock is never written.
- **File order is staging order.** A synchronous append (:meth:`GroupCommit.write_now`) takes
  whatever is staged ahead of it into its own write, so records never overtake each other.

A group staged ``lazy`` does not start a write of its own: it rides with the next one, or is
written :data:`LAZY_SECONDS` after it was staged if nothing else comes. The receiver stages an
admission lazy while its lane is injecting: the lane's next write (the outcome and the next
dispatch lock) comes within a lane cycle and carries it, where an admission write of its own
would stand in that lock's way, and the lock is what the lane waits on (ADR 0038).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from crosstalk.store.journal_errors import JournalError, JournalWriteError, RecordTooLarge
from crosstalk.store.journal_format import encode_line

Stored = list[dict[str, Any]]

#: Up to this many callers' groups, with nothing staged during the last threaded write, are
#: written on the loop itself (one caller's admission and dispatch lock are two groups).
_INLINE_GROUPS = 2
#: Journals flushing at once (one flush in flight per journal; a shim serves a few agents).
_WORKERS = 8
#: The longest a lazy group waits for another write to ride with.
LAZY_SECONDS = 0.002


class _Pool:
    """The writer threads, made on first use (a shim that never writes starts none)."""

    lock = threading.Lock()
    executor: ThreadPoolExecutor | None = None

    @classmethod
    def get(cls) -> ThreadPoolExecutor:
        with cls.lock:
            if cls.executor is None:
                cls.executor = ThreadPoolExecutor(_WORKERS,
                                                  thread_name_prefix="crosstalk-journal")
            return cls.executor

    @classmethod
    def forget(cls) -> None:  # a forked child must not submit to its parent's threads
        cls.lock = threading.Lock()
        cls.executor = None


os.register_at_fork(after_in_child=_Pool.forget)


class Group:
    """One caller's records in a group commit, and what became of them."""

    __slots__ = ("after", "future", "records", "result")

    def __init__(self, records: Sequence[Mapping[str, Any]], after: Group | None,
                 future: asyncio.Future[Stored] | None) -> None:
        self.records = records
        self.after = after
        self.future = future
        #: Set by the writer, under the journal's lock: the records as stored, or why not.
        self.result: Stored | JournalError | None = None

    @property
    def written(self) -> bool | None:
        """Whether the records are durable; ``None`` while not yet written."""
        return None if self.result is None else not isinstance(self.result, JournalError)

    async def settled(self) -> None:
        """Until the write that carries these records is done, durable or not (never raises:
        :attr:`written` and :attr:`result` say which). A cancelled waiter leaves the write
        alone (shielded)."""
        if self.future is not None:
            with contextlib.suppress(JournalError):
                await asyncio.shield(self.future)

    def then(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` on the loop once the write is done, after those added before."""
        assert self.future is not None, "a synchronous append's group is answered at once"
        self.future.add_done_callback(lambda _: callback())


def fail_unwritten(groups: Sequence[Group], exc: JournalError) -> None:
    """Every group the write did not get to fails with ``exc``."""
    for group in groups:
        if group.result is None:
            group.result = exc


def encode_group(records: Sequence[Mapping[str, Any]], seq: int, now: float, max_line: int
                 ) -> tuple[Stored, list[bytes]]:
    """One caller's records as stored (numbered from ``seq`` + 1) and as lines, each with the
    batch marker (the write's last line is re-encoded without it)."""
    stored: Stored = []
    lines: list[bytes] = []
    for rec in records:
        seq += 1
        full = {**rec, "seq": seq, "ts": now}
        try:
            line = encode_line(full, more=True)
        except (TypeError, ValueError) as exc:
            raise JournalError(f"record is not JSON-serialisable: {exc}") from exc
        if len(line) - 1 > max_line:
            raise RecordTooLarge(
                f"record of {len(line) - 1} bytes exceeds the {max_line}-byte limit")
        stored.append(full)
        lines.append(line)
    return stored, lines


class Writer(Protocol):
    def write_groups(self, take: Callable[[], list[Group]]) -> list[Group]: ...


class GroupCommit:
    """The staged appends of one journal. Stage from an event loop; thread-safe otherwise."""

    def __init__(self, journal: Writer) -> None:
        self._journal = journal
        self._lock = threading.Lock()
        self._queue: list[Group] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._busy = False  # a flush scheduled or running, or armed (on the loop only)
        self._timer: asyncio.TimerHandle | None = None  # armed: only lazy groups are queued
        self._eager = False  # a group that wants its write now is queued (under _lock)
        self._idle: asyncio.Event | None = None
        self._threaded = False  # the flush in flight runs in a worker thread
        self._contended = False  # something was staged while a threaded flush ran

    def stage(self, records: Sequence[Mapping[str, Any]], *,
              after: Group | None = None, lazy: bool = False) -> Group:
        """Queue ``records`` for the next shared write; await ``group.future`` for them as
        stored. Nothing is written before the loop's next turn, so what the current turn
        stages shares one write. ``lazy``: start no write for them (the module docstring)."""
        loop = asyncio.get_running_loop()
        group = Group(records, after, loop.create_future())
        with self._lock:
            self._queue.append(group)
            self._eager = self._eager or not lazy
        self._loop = loop
        if self._threaded:
            self._contended = True  # arrivals while a write is in flight: keep overlapping
        if not self._busy:
            self._busy = True
            if self._idle is not None:
                self._idle.clear()
            if lazy:
                self._arm(loop)
            else:
                loop.call_soon(self._kick)
        elif not lazy and self._timer is not None:  # only armed: this one is written now
            self._timer.cancel()
            self._timer = None
            loop.call_soon(self._kick)
        return group

    def write_now(self, records: Sequence[Mapping[str, Any]]) -> Stored:
        """A synchronous append: one write with everything staged ahead of it."""
        mine = Group(records, None, None)
        groups = self._journal.write_groups(lambda: [*self._take(), mine])
        self._deliver_soon([g for g in groups if g is not mine])
        result = mine.result
        if isinstance(result, JournalError):
            raise result
        assert result is not None
        return result

    async def idle(self) -> None:
        """Wait until everything staged so far is written (or failed)."""
        if not self._busy:
            return
        if self._idle is None:
            self._idle = asyncio.Event()
        await self._idle.wait()

    def _take(self) -> list[Group]:
        with self._lock:
            taken, self._queue, self._eager = self._queue, [], False
        return taken

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = loop.call_later(LAZY_SECONDS, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._kick()

    def _kick(self) -> None:
        with self._lock:
            few = len(self._queue) <= _INLINE_GROUPS
        if few and not self._contended:
            # Nothing else is arriving: a thread hop would only add to these callers'
            # latency, and the loop has nothing to do during the fsync anyway.
            self._flush(inline=True)
            return
        self._threaded, self._contended = True, False
        try:
            _Pool.get().submit(self._flush)
        except RuntimeError as exc:  # the interpreter is shutting down
            self._threaded = False
            fail_unwritten(self._take(), JournalWriteError(f"journal writer unavailable: {exc}"))
            self._after_flush()

    def _flush(self, *, inline: bool = False) -> None:
        """One write of everything staged, then the answers on the loop (in a worker
        thread, or ``inline`` on the loop itself)."""
        taken: list[Group] = []

        def take() -> list[Group]:
            taken.extend(self._take())
            return taken

        try:
            self._journal.write_groups(take)
        except JournalError as exc:  # e.g. closed, or wedged: nothing of theirs was written
            fail_unwritten(take(), exc)
        except BaseException as exc:
            fail_unwritten(take(), JournalWriteError(f"journal write failed: {exc!r}"))
            raise
        finally:
            if inline:
                self._deliver(taken, self._after_flush)
            else:
                self._deliver_soon(taken, then=self._after_flush)

    def _deliver_soon(self, groups: list[Group],
                      then: Callable[[], None] | None = None) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(self._deliver, groups, then)

    @staticmethod
    def _deliver(groups: list[Group], then: Callable[[], None] | None) -> None:
        for group in groups:
            future, result = group.future, group.result
            if future is None or future.done():
                continue
            if isinstance(result, JournalError):
                future.set_exception(result)
                # Seen: the group's ``result`` carries the failure to whoever reads it, and a
                # caller that only hooked ``then`` must not have it logged as never retrieved.
                future.exception()
            elif result is None:
                group.result = JournalWriteError("the journal writer did not finish")
                future.set_exception(group.result)
                future.exception()
            else:
                future.set_result(result)
        if then is not None:
            then()

    def _after_flush(self) -> None:
        self._threaded = False
        with self._lock:
            more, eager = bool(self._queue), self._eager
        if more and self._loop is not None:
            if eager:
                self._loop.call_soon(self._kick)
            else:
                self._arm(self._loop)  # lazy ones only: they wait for company, not long
            return
        self._busy = False
        if self._idle is not None:
            self._idle.set()
