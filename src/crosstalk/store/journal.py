"""The per-agent journal: append-only JSONL, every append fsynced before it returns.

Why each rule exists:

- **Write, fsync, then acknowledge.** ``append`` returns only after ``fsync``; a failed write or
  fsync raises :class:`JournalWriteError` and truncates the file back to its pre-append size, so
  a torn line can never glue itself onto the next record (seed "short-write wedge" ruling). If
  even the truncate fails the journal is *wedged*: the next append retries the truncate first
  and refuses if it still fails. Nothing ever silently succeeds.
- **Checksummed lines.** Each line is ``{"c":"<crc32 of R>","r":R}`` where R is the record's
  JSON. The CRC covers R's exact bytes, so a flipped byte anywhere is detected without
  re-serialising, and every line is still plain JSON for ``jq``. An ``append_batch`` write
  marks every line but its last ``{"b":...`` (CRC over the marker and R), so readers can tell
  a batch a crash cut short from whole records and drop it with the torn tail.
- **Replay never raises on damage.** A partial trailing line (never acknowledged: writers
  hold the lock until their fsync returns) is dropped; a corrupt line mid-file is skipped and
  reported as :class:`Damage`. ``replay(each=...)`` streams in memory bounded by the read
  chunk; ``read_since`` hands on only what follows a mark (the mailbox's view).
- **Concurrent appends share a write** (:attr:`Journal.commit`, :mod:`crosstalk.store.commit`):
  one write and one fsync for every caller staged meanwhile, each answered after its fsync.
- **Two writers never interleave.** Appends take an ``flock`` on a sidecar lock file (which is
  never renamed or unlinked, so every process locks the same inode) and write with
  ``O_APPEND``; a writer that finds the file grew under it catches up before assigning ``seq``.
- **Record cap = reader limit.** The writer refuses a line longer than the reader accepts, so an
  acknowledged record is always readable (seed R10).
- **Retention keeps dependency sets** (seed R3, :mod:`crosstalk.core.retention`), rewriting the
  file by temp + fsync + rename + directory fsync, and quarantining damaged lines beside it.

The line codec is :mod:`crosstalk.store.journal_format`. I/O goes through :class:`FileOps` so
tests can fail the Nth write, fsync or truncate the way SQLite's ``ioerr`` tests do.
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crosstalk.config import MAX_JOURNAL_LINE, PRIVATE_FILE_MODE, RETENTION_SECONDS, fsync_dir
from crosstalk.core import retention
from crosstalk.store import collector
from crosstalk.store.commit import Group, GroupCommit, encode_group, fail_unwritten
from crosstalk.store.files import FileOps, OsFileOps, open_regular
from crosstalk.store.journal_errors import JournalError, JournalWriteError, RecordTooLarge
from crosstalk.store.journal_format import (
    decode_scanned,
    encode_line,
    scan_lines,
    standalone,
)
from crosstalk.store.journal_read import Damage, ReadMark, RecordSink, Replay, Resume, read_from
from crosstalk.store.journal_scan import scan_writes

__all__ = ["Journal", "JournalError", "JournalWriteError", "RecordTooLarge", "RetentionResult"]


@dataclass(frozen=True)
class RetentionResult:
    kept: int
    dropped: int
    quarantined: int


class Journal:
    """One agent's journal file. Thread-safe; safe against other processes appending too."""

    def __init__(
        self,
        path: Path | str,
        *,
        ops: FileOps | None = None,
        clock: Callable[[], float] = time.time,
        max_line: int = MAX_JOURNAL_LINE,
    ) -> None:
        self.path = Path(path)
        self._ops: FileOps = ops or OsFileOps()
        self._clock = clock
        self._max_line = max_line
        self._mutex = threading.RLock()
        # A directory or FIFO at either path is StatePathError (naming it and its fix), not a
        # bare IsADirectoryError from the middle of an agent's start.
        self._lock_fd = open_regular(self.path.with_name(self.path.name + ".lock"),
                                     os.O_RDWR | os.O_CREAT, role="a journal's lock file")
        self._fd = -1
        self._ino = -1
        self._offset = 0  # end of the last complete line we have accounted for
        self._last_seq = 0
        self._truncate_to: int | None = None  # set when a rollback truncate failed
        self._wedged_data = b""  # the bytes that failed append tried to write
        self._streaming = False  # a replay is handing records to its ``each``
        #: Concurrent appends share one write and one fsync (:mod:`crosstalk.store.commit`).
        self.commit = GroupCommit(self)
        try:
            with self._locked():
                self._open_locked()
        except BaseException:
            self.close()
            raise

    # -- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        with self._mutex:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
                self._lock_fd = -1

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def last_seq(self) -> int:
        return self._last_seq

    @property
    def position(self) -> ReadMark:
        """The file, and where its last line accounted for (so fsynced) ends."""
        with self._mutex:
            return ReadMark(self._ino, self._offset)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with self._mutex:
            if self._lock_fd < 0:
                raise JournalError(f"journal {self.path} is closed")
            if self._streaming:
                # Only a replay's own ``each`` gets here (the mutex is re-entrant; another
                # thread waits above): taking the flock again would release it mid-replay.
                raise JournalError(f"journal {self.path}: in use by a streaming replay")
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _open_locked(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        flags = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC
        try:
            fd = os.open(self.path, flags | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
        except FileExistsError:
            fd = open_regular(self.path, flags, role="a journal")
        else:
            fsync_dir(self.path.parent)  # the new name must survive a crash too
        self._fd = fd
        self._ino = os.fstat(fd).st_ino
        self._offset = 0
        self._last_seq = 0

    # -- reading ---------------------------------------------------------------------------

    def _catch_up_locked(self, collect: Replay | None, limit: int | None = None,
                         each: RecordSink | None = None) -> None:
        """Account for everything in the file since ``_offset``; drop a torn tail.

        Called under the lock before every append, so a second writer's records (or a file
        replaced by another process's retention) are seen before we assign the next ``seq``.
        ``limit`` stops the scan early (at a failed append that could not be cut off yet).
        A replay (``collect``) reads from the start and keeps each record, or hands it to
        ``each``; an append only needs the highest ``seq`` and keeps nothing.
        """
        self._reopen_if_replaced_locked()
        size = os.fstat(self._fd).st_size
        if limit is not None:
            size = min(size, limit)
        if size < self._offset:
            self._offset, self._last_seq = 0, 0
        reading = collect is not None
        if not reading and size == self._offset:
            return
        sink = collect if collect is not None else Replay()
        start = sink.start if reading else self._offset
        end, self._last_seq = scan_writes(
            self._fd, start, size, self._max_line, seq=self._last_seq, damage=sink.damage,
            keep=sink.records if reading and each is None else None, each=each)
        if end < size:
            # A fragment with no newline: a writer died mid-line. It was never acknowledged.
            sink.damage.append(Damage(end, size - end, "torn_tail"))
            if limit is None:
                self._cut_torn_tail_locked(end, size, reading=reading)
        self._offset = sink.end = end
        sink.ino = self._ino

    def _reopen_if_replaced_locked(self) -> None:
        """Another process's retention may have renamed a new file over ours."""
        try:
            on_disk = os.stat(self.path).st_ino
        except FileNotFoundError:
            on_disk = -1
        if on_disk != self._ino:
            self._open_locked()

    def _cut_torn_tail_locked(self, end: int, size: int, *, reading: bool) -> None:
        fragment = os.pread(self._fd, size - end, end)
        try:
            self._ops.ftruncate(self._fd, end)
            self._ops.fsync(self._fd)
        except OSError:
            # Cut it off later, exactly like a failed append of our own; until then appends
            # refuse (they would glue onto the fragment) but reads still work.
            self._truncate_to, self._wedged_data = end, fragment
            if not reading:
                raise

    def replay(self, each: RecordSink | None = None, since: Resume | None = None) -> Replay:
        """Every intact record in order, plus what was skipped.

        Never raises on damage, nor on a repair it cannot make: if a failed append (or a torn
        tail) cannot be cut off yet, replay reads only up to it and appends keep refusing
        until the cut succeeds.

        With ``each``, every record is handed to it as it is read and none is kept
        (``records`` stays empty): memory stays bounded by the read chunk whatever the
        journal's size. ``each`` runs under the journal's lock, so it must not write to this
        journal (any call from it that takes the lock raises :class:`JournalError`); an
        exception it raises ends the replay and propagates. With ``since``, only what follows
        it is read, or :class:`~crosstalk.store.journal_read.ResumeRefused` says why not.
        """
        with self._locked():
            limit = None
            try:
                self._settle_wedge_locked()
            except JournalWriteError:
                limit = self._truncate_to
            result = Replay()
            if since is not None:  # checked before anything changes: a refusal changes nothing
                self._reopen_if_replaced_locked()
                size = os.fstat(self._fd).st_size
                since.check(self._fd, self._ino, size if limit is None else min(size, limit))
                self._offset = result.start = since.offset
            self._last_seq = since.seq if since is not None else 0
            self._streaming = each is not None
            try:
                # Collected or streamed, a replay keeps what it decodes and makes no cycles.
                with collector.paused():
                    self._catch_up_locked(result, limit, each)
            except BaseException:
                # Cut off mid-file: what was counted is partial, so the next append rescans
                # from the start rather than assign a seq from a partial count.
                self._offset, self._last_seq = 0, 0
                raise
            finally:
                self._streaming = False
            return result

    def read_since(self, mark: ReadMark | None, each: RecordSink,
                   restart: Callable[[], None]) -> ReadMark:
        """Follow the journal: :func:`~crosstalk.store.journal_read.read_from` under the lock,
        so a record is seen only once its writer's fsync has returned."""
        with self._locked():
            self._reopen_if_replaced_locked()
            return read_from(self._fd, self._ino, mark, each, restart, max_line=self._max_line,
                             limit=self._truncate_to)

    # -- writing ---------------------------------------------------------------------------

    def _settle_wedge_locked(self) -> None:
        if self._truncate_to is None:
            return
        try:
            # Cut back only while everything past the cut is still our own failed bytes.
            # Another process may have appended since (first dropping our fragment as a torn
            # tail, or after our complete but unsynced lines); truncating would then destroy
            # records it acknowledged, so we leave the file as it is.
            tail = os.pread(self._fd, len(self._wedged_data) + 1, self._truncate_to)
            if self._wedged_data.startswith(tail):
                self._ops.ftruncate(self._fd, self._truncate_to)
                self._ops.fsync(self._fd)
        except OSError as exc:
            raise JournalWriteError(
                f"journal {self.path} is wedged: cannot truncate a failed append ({exc})"
            ) from exc
        self._offset = self._truncate_to
        self._truncate_to = None
        self._wedged_data = b""

    def append(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """Write one record durably and return it as stored (with ``seq`` and ``ts``)."""
        return self.append_batch([record])[0]

    def append_batch(self, records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Write several records with one write and one fsync: all of them or none (after
        what :attr:`commit` has staged, in the same write: the file keeps the asked order)."""
        if not records:
            return []
        return self.commit.write_now(records)

    def write_groups(self, take: Callable[[], list[Group]]) -> list[Group]:
        """One write and one fsync for the groups ``take`` hands over under the lock (group
        commit, :mod:`crosstalk.store.commit`; the rules are there); each group's ``result``
        says what became of it."""
        with self._locked():
            groups = take()
            try:
                self._write_groups_locked(groups)
            except JournalWriteError as exc:  # the wedge or the catch-up: nothing written
                fail_unwritten(groups, exc)
            return groups

    def _write_groups_locked(self, groups: list[Group]) -> None:
        self._settle_wedge_locked()
        try:
            self._catch_up_locked(None)
        except OSError as exc:
            # e.g. the torn-tail truncate failed: nothing was written, and callers gate
            # acknowledgement on JournalWriteError, so a bare OSError must not escape.
            raise JournalWriteError(f"append to {self.path} failed: {exc}") from exc
        now = self._clock()
        written: list[Group] = []
        lines: list[bytes] = []
        seq = self._last_seq
        for group in groups:
            after = group.after
            if after is not None and after.written is False:
                group.result = JournalWriteError("not written: what it follows was not")
                continue
            try:
                stored, encoded = encode_group(group.records, seq, now, self._max_line)
            except JournalError as exc:
                group.result = exc
                continue
            seq += len(stored)
            group.result = stored
            written.append(group)
            lines.extend(encoded)
        if not lines:
            return
        last = written[-1].result
        assert isinstance(last, list)
        lines[-1] = encode_line(last[-1])  # the write's last line closes the batch
        data = b"".join(lines)
        pre = self._offset
        try:
            self._write_all(data)
            self._ops.fsync(self._fd)
        except OSError as exc:
            self._rollback_locked(pre, data)
            failed = JournalWriteError(f"append to {self.path} failed: {exc}")
            failed.__cause__ = exc
            for group in written:
                group.result = failed
            return
        self._offset = pre + len(data)
        self._last_seq = seq

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = self._ops.write(self._fd, view.tobytes())
            if n <= 0:
                raise OSError(errno.EIO, "write returned no progress")
            view = view[n:]

    def _rollback_locked(self, pre: int, data: bytes) -> None:
        try:
            self._ops.ftruncate(self._fd, pre)
            self._ops.fsync(self._fd)
        except OSError:
            self._truncate_to, self._wedged_data = pre, data

    # -- retention -------------------------------------------------------------------------

    def apply_retention(
        self, *, now: float | None = None, max_age: float = RETENTION_SECONDS
    ) -> RetentionResult:
        """Drop old records no unresolved work depends on; quarantine damaged lines."""
        now = self._clock() if now is None else now
        with self._locked():
            self._settle_wedge_locked()
            self._catch_up_locked(None)
            lines: list[bytes] = []
            records: list[dict[str, Any]] = []
            damaged: list[bytes] = []
            size = self._offset
            for line in scan_lines(self._fd, 0, size, self._max_line):
                decoded = decode_scanned(line)
                if isinstance(decoded, str):
                    damaged.append(line.raw if line.raw is not None
                                   else b"<oversize line at %d>" % line.offset)
                    continue
                assert line.raw is not None
                raw = line.raw
                lines.append(standalone(raw))
                records.append(decoded)
            keep = retention.plan(records, now, max_age)
            if keep:
                # The newest record carries the file's highest seq. Dropping it would let a
                # replay, a reopen or another process (which only learn seq from the file)
                # reuse seqs already issued: ADR 0001 keeps seq monotonic across retention.
                keep[-1] = True
            kept = [raw for raw, k in zip(lines, keep, strict=True) if k]
            dropped = len(lines) - len(kept)
            if not dropped and not damaged:
                return RetentionResult(kept=len(kept), dropped=0, quarantined=0)
            if damaged:
                self._quarantine(damaged)
            tmp = self.path.with_name(self.path.name + ".compact")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
                         PRIVATE_FILE_MODE)
            try:
                payload = b"".join(raw + b"\n" for raw in kept)
                view = memoryview(payload)
                while view:
                    view = view[os.write(fd, view.tobytes()):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            fsync_dir(self.path.parent)
            last_seq = self._last_seq
            self._open_locked()
            self._catch_up_locked(None)
            # seq stays monotonic even if the newest records were dropped
            self._last_seq = max(self._last_seq, last_seq)
            return RetentionResult(kept=len(kept), dropped=dropped, quarantined=len(damaged))

    def _quarantine(self, damaged: list[bytes]) -> None:
        qpath = self.path.with_name(self.path.name + ".quarantine")
        fd = os.open(qpath, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
                     PRIVATE_FILE_MODE)
        try:
            os.write(fd, b"".join(d + b"\n" for d in damaged))
            os.fsync(fd)
        finally:
            os.close(fd)
