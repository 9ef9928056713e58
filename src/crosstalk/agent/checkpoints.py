"""An agent's restart checkpoint: read at start, written when worth it, advanced in the
background and at a clean stop (ADR 0018).

- **At start** (:func:`start_pass`): a valid checkpoint (:mod:`crosstalk.store.checkpoint`)
  gives the start pass's readers their state at offset ``X``, and the journal replays only
  what follows ``X``. Anything doubtful (no checkpoint, a refused or unreadable one, a journal
  that no longer holds what was read before ``X``) is a full replay with fresh readers, one
  log line saying why: never a failed start, never a different result.
- **After a long start pass** (:meth:`Checkpoints.started`): the readers' state is copied
  before ``finish()`` settles anything, then encoded and written in a thread.
- **While the agent lives, and at a clean stop** (:meth:`Checkpoints.advance`): a thread loads
  the last checkpoint into fresh readers, feeds them the journal's durable lines after it
  (read without the lock: :attr:`Journal.position` says how far every byte is fsynced), and
  writes the new one. It runs once ``advance_after`` records were written since the last
  checkpoint, looked at every ``check_seconds``, and is a task of the agent's task group; a
  stop waits for a thread in flight (it checks a stop flag as it reads).

A SIGKILL at any point leaves the old checkpoint or the new one (rename), or a temp file the
next write replaces; either way the next start is correct (a longer tail, or a full replay).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from crosstalk.agent.start_pass import StartPass
from crosstalk.agent.taskgroup import TaskGroup
from crosstalk.config import MAX_JOURNAL_LINE
from crosstalk.receiver import Receiver
from crosstalk.store import checkpoint, collector
from crosstalk.store.checkpoint import CheckpointRefused, Mark
from crosstalk.store.journal import Journal
from crosstalk.store.journal_format import scan_lines, whole_writes
from crosstalk.store.journal_read import ReadMark, Replay, ResumeRefused

log = logging.getLogger(__name__)
T = TypeVar("T")
#: What a checkpoint that passed its CRC can still fail to load with (not what we wrote).
_UNLOADABLE = (KeyError, TypeError, ValueError, IndexError)


@dataclass(frozen=True)
class CheckpointPolicy:
    """When an agent writes its restart checkpoint."""

    enabled: bool = True
    #: A start pass (or a stop's advance) that read at least this many records writes one.
    write_after: int = 2000
    #: The background advance runs once this many records were written since the last one.
    advance_after: int = 5000
    check_seconds: float = 60.0
    #: A start's checkpoint is encoded this long after the start (or at stop, if sooner):
    #: the encode holds the GIL in stretches, and the start has better uses for it.
    start_write_delay: float = 1.0


@dataclass
class Started:
    """What an agent's start pass read."""

    #: ``None`` once the agent has taken what it keeps (:meth:`release`).
    readers: StartPass | None
    replay: Replay
    #: The checkpoint the pass continued from, if it did.
    resumed: Mark | None
    #: Why the pass read what it read (one line, logged).
    why: str
    #: Records the pass read from the journal (the tail after a checkpoint).
    records: int = 0

    def release(self) -> None:
        """Drop the readers once the agent has what it keeps of them (the receiver's entries,
        the mailbox fold, the tasks). The rest (the fold's states, the task replay, the
        pending bodies) would otherwise stay for the agent's whole run, and sit beside the
        second copy a checkpoint advance builds (the stop's advance peaked 139 MB on a 20k
        journal with them, ADR 0021)."""
        self.readers = None


def start_pass(journal: Journal, receiver: Receiver, policy: CheckpointPolicy) -> Started:
    """Read the journal for an agent's start: the tail after a valid checkpoint, else all."""
    path = checkpoint.path_for(journal.path)
    why = "checkpoints are off"
    if policy.enabled:
        try:
            opened = checkpoint.read(path, receiver.agent_id)
            if opened is None:
                why = "no checkpoint"
            else:
                with opened:
                    _precheck(journal.path, opened.mark)  # before the load it would waste
                    readers = StartPass.load(opened.sections, receiver, receiver.agent_id)
                # Checked again under the journal's lock, with the tail read in that hold.
                replay = journal.replay(readers.each(), since=opened.mark)
                started = Started(readers, replay, opened.mark,
                                  f"checkpoint at byte {opened.mark.offset}", readers.records)
                _log_start(receiver.agent_id, started)
                return started
        except (CheckpointRefused, ResumeRefused) as exc:
            why = f"checkpoint {path} not used: {exc}"
        except _UNLOADABLE as exc:
            why = f"checkpoint {path} not used: it does not load ({type(exc).__name__})"
        receiver.entries.clear()  # what a refused checkpoint's readers had put there
        receiver.replay_violations.clear()
    readers = StartPass(receiver, receiver.agent_id)
    replay = journal.replay(readers.each())
    started = Started(readers, replay, None, why, readers.records)
    _log_start(receiver.agent_id, started)
    return started


def _precheck(journal_path: Path, mark: Mark) -> None:
    try:
        fd = os.open(journal_path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise ResumeRefused(f"the journal does not open ({exc.strerror})") from exc
    try:
        st = os.fstat(fd)
        mark.check(fd, st.st_ino, st.st_size)
    finally:
        os.close(fd)


def _log_start(agent_id: str, started: Started) -> None:
    log.info("agent %s: start read %d journal records from byte %d (%s)", agent_id,
             started.records, started.replay.start, started.why)


async def _in_thread(work: Callable[[threading.Event], T]) -> T:
    """``work(stop)`` in a thread; cancelled, it sets ``stop`` and waits for the thread, so
    nothing runs on once the agent's task group has closed."""
    stop = threading.Event()
    future = asyncio.get_running_loop().run_in_executor(None, work, stop)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        stop.set()
        await asyncio.wait({future})
        raise


class Checkpoints:
    """One agent's checkpoint writer (owned by the agent; its tasks are the agent's)."""

    def __init__(self, journal: Journal, agent_id: str, policy: CheckpointPolicy,
                 group: TaskGroup) -> None:
        self.journal = journal
        self.agent_id = agent_id
        self.policy = policy
        self.group = group
        self.path = checkpoint.path_for(journal.path)
        #: The highest ``seq`` the checkpoint on disk covers (0: none known).
        self.covered = 0
        #: Checkpoints this agent wrote (tests and the bench look).
        self.written = 0
        self._writing = threading.Lock()
        #: A start's checkpoint not yet written: where it ends, and a copy of its readers.
        self._pending: tuple[Mark, StartPass] | None = None

    def started(self, started: Started) -> None:
        """After the start pass, before ``finish()``: keep the state if the pass was long."""
        if started.resumed is not None:
            self.covered = started.resumed.seq
        readers = started.readers
        if (readers is None or not self.policy.enabled
                or started.records < self.policy.write_after):
            return
        mark = self._mark(started.replay)
        if mark is None:
            return
        # Copied now, encoded in a thread later: the agent serves meanwhile (ADR 0018).
        self._pending = (mark, readers.frozen())
        self.group.spawn(self._write_later(), what="checkpoint write")

    def _mark(self, replay: Replay) -> Mark | None:
        try:
            fd = os.open(self.journal.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            if os.fstat(fd).st_ino != replay.ino:
                return None
            return Mark.at(fd, replay.ino, replay.end, self.journal.last_seq)
        finally:
            os.close(fd)

    async def _write_later(self) -> None:
        await asyncio.sleep(self.policy.start_write_delay)
        await self._write_pending()

    async def _write_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            mark, readers = pending
            # Once begun it is waited for, even by a cancel: the thread ignores ``stop``.
            await _in_thread(lambda stop: self._write(mark, readers.sections()))

    def _write(self, mark: Mark, sections: list[tuple[str, bytes]]) -> None:
        with self._writing:
            try:
                checkpoint.write(self.path, self.agent_id, mark, sections)
            except OSError as exc:
                log.warning("agent %s: checkpoint %s not written: %s", self.agent_id,
                            self.path, exc)
                return
            self.covered = max(self.covered, mark.seq)
            self.written += 1

    async def keep(self) -> None:
        """The background advance (a task of the agent's group)."""
        while True:
            await asyncio.sleep(self.policy.check_seconds)
            if self.journal.last_seq - self.covered >= self.policy.advance_after:
                await self.advance()

    async def at_stop(self) -> None:
        """A clean stop: advance the checkpoint over what this run wrote, if that is long."""
        if not self.policy.enabled:
            return
        await self._write_pending()  # a start's, if the agent stops within its delay
        # Only past ``write_after``: an advance holds a second copy of the readers' state
        # beside the live one, and a shorter tail costs the next start a few hundredths.
        if self.journal.last_seq - self.covered >= self.policy.write_after:
            await self.advance()

    async def advance(self) -> None:
        """Load the last checkpoint, feed it the durable records since, write the new one
        (in a thread: a 24 h journal's state takes a few tenths of a second)."""
        upto = self.journal.position
        await _in_thread(lambda stop: self._advance(upto, stop))

    def _advance(self, upto: ReadMark, stop: threading.Event) -> None:
        try:
            fd = os.open(self.journal.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return
        try:
            if os.fstat(fd).st_ino != upto.ino:
                return  # replaced since: the next look starts over
            made = advanced(fd, upto, self.path, self.agent_id, stop)
        finally:
            os.close(fd)
        if made is not None:
            self._write(*made)


def advanced(fd: int, upto: ReadMark, path: Path, agent_id: str, stop: threading.Event,
             ) -> tuple[Mark, list[tuple[str, bytes]]] | None:
    """The checkpoint at ``path`` moved on to ``upto`` in the journal open at ``fd`` (from
    nothing if it does not hold), or ``None`` if there is nothing new or ``stop`` was set.
    Runs with the collector paused (ADR 0021): a gen-2 pass over the readers it rebuilds
    would hold the GIL the agent's event loop needs."""
    with collector.paused():
        return _advanced(fd, upto, path, agent_id, stop)


def _advanced(fd: int, upto: ReadMark, path: Path, agent_id: str, stop: threading.Event,
              ) -> tuple[Mark, list[tuple[str, bytes]]] | None:
    readers, start, seq = _resumed(fd, upto, path, agent_id)
    if readers is None:
        readers, start, seq = StartPass(None, agent_id), 0, 0
    each = readers.each()
    end = start
    for n, (line, decoded) in enumerate(whole_writes(scan_lines(fd, start, upto.end,
                                                                MAX_JOURNAL_LINE))):
        if n % 512 == 0 and stop.is_set():
            return None
        end = line.end + 1
        if isinstance(decoded, str):
            continue
        got: Any = decoded.get("seq")
        if isinstance(got, int) and got > seq:  # as the journal counts it
            seq = got
        each(decoded)
    if end == start:
        return None
    mark = Mark.at(fd, upto.ino, end, seq)
    return (mark, readers.sections()) if mark is not None else None


def _resumed(fd: int, upto: ReadMark, path: Path,
             agent_id: str) -> tuple[StartPass | None, int, int]:
    try:
        opened = checkpoint.read(path, agent_id)
        if opened is None:
            return None, 0, 0
        with opened:
            opened.mark.check(fd, upto.ino, upto.end)
            readers = StartPass.load(opened.sections, None, agent_id)
    except (CheckpointRefused, ResumeRefused, *_UNLOADABLE) as exc:
        log.info("agent %s: checkpoint %s not advanced, rebuilt: %s", agent_id, path, exc)
        return None, 0, 0
    return readers, opened.mark.offset, opened.mark.seq
