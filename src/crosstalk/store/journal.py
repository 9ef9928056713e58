"""The per-agent journal: append-only JSONL, every append fsynced before it returns.

Why each rule exists:

- **Write, fsync, then acknowledge.** ``append`` returns only after ``fsync``; a failed write or
  fsync raises :class:`JournalWriteError` and truncates the file back to its pre-append size, so
  a torn line can never glue itself onto the next record (seed "short-write wedge" ruling). If
  even the truncate fails the journal is *wedged*: the next append retries the truncate first
  and refuses if it still fails. Nothing ever silently succeeds.
- **Checksummed lines.** Each line is ``{"c":"<crc32 of R>","r":R}`` where R is the record's
  JSON. The CRC covers R's exact bytes, so a flipped byte anywhere is detected without
  re-serialising, and every line is still plain JSON for ``jq``.
- **Replay never raises on damage.** A partial trailing line is discarded (it was never
  acknowledged: writers hold the lock until their fsync returns); a corrupt line mid-file is
  skipped and reported as :class:`Damage`; the journal keeps serving.
- **Two writers never interleave.** Appends take an ``flock`` on a sidecar lock file (which is
  never renamed or unlinked, so every process locks the same inode) and write with
  ``O_APPEND``; a writer that finds the file grew under it catches up before assigning ``seq``.
- **Record cap = reader limit.** The writer refuses a line longer than the reader accepts, so an
  acknowledged record is always readable (seed R10).
- **Retention keeps dependency sets** (seed R3, :mod:`crosstalk.core.retention`), rewriting the
  file by temp + fsync + rename + directory fsync, and quarantining damaged lines beside it.

I/O goes through :class:`FileOps` so tests can fail the Nth write, fsync or truncate the way
SQLite's ``ioerr`` tests do.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from crosstalk.config import MAX_JOURNAL_LINE, PRIVATE_FILE_MODE, RETENTION_SECONDS, fsync_dir
from crosstalk.core import retention

_PREFIX = b'{"c":"'
_MIDDLE = b'","r":'
_HEAD_LEN = len(_PREFIX) + 8 + len(_MIDDLE)  # 20 bytes before the record JSON
_READ_CHUNK = 4 * 1024 * 1024


class JournalError(Exception):
    """Base class for journal failures."""


class JournalWriteError(JournalError):
    """The record is **not** durable; the caller must fail the operation it was recording."""


class RecordTooLarge(JournalError):
    """The encoded record would exceed the reader's line limit; nothing was written."""


class FileOps(Protocol):
    """The system calls an append depends on; a seam for fault injection."""

    def write(self, fd: int, data: bytes) -> int: ...
    def fsync(self, fd: int) -> None: ...
    def ftruncate(self, fd: int, size: int) -> None: ...


class OsFileOps:
    def write(self, fd: int, data: bytes) -> int:
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)


@dataclass(frozen=True)
class Damage:
    """A region of the journal that did not decode; it was skipped, not trusted."""

    offset: int
    length: int
    reason: str  # "checksum" | "framing" | "json" | "oversize" | "torn_tail"


@dataclass
class Replay:
    records: list[dict[str, Any]] = field(default_factory=list)
    damage: list[Damage] = field(default_factory=list)
    #: Byte offset just past the last complete line.
    end: int = 0


@dataclass(frozen=True)
class RetentionResult:
    kept: int
    dropped: int
    quarantined: int


def encode_line(record: Mapping[str, Any]) -> bytes:
    body = json.dumps(record, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    return b"%s%08x%s%s}\n" % (_PREFIX, zlib.crc32(body), _MIDDLE, body)


def decode_line(line: bytes) -> dict[str, Any] | str:
    """Decode one line (without its newline): the record, or the reason it is damaged."""
    if len(line) < _HEAD_LEN + 3 or not line.startswith(_PREFIX) or not line.endswith(b"}"):
        return "framing"
    if line[len(_PREFIX) + 8 : _HEAD_LEN] != _MIDDLE:
        return "framing"
    try:
        crc = int(line[len(_PREFIX) : len(_PREFIX) + 8], 16)
    except ValueError:
        return "framing"
    body = line[_HEAD_LEN:-1]
    if zlib.crc32(body) != crc:
        return "checksum"
    try:
        record = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return "json"
    if not isinstance(record, dict):
        return "json"
    return record


@dataclass(frozen=True)
class _Line:
    offset: int  # first byte of the line
    end: int  # offset of its newline
    raw: bytes | None  # the line without its newline; None when it exceeds the limit


def _scan(fd: int, start: int, end: int, max_line: int) -> Iterator[_Line]:
    """Yield every complete line in ``[start, end)``.

    A trailing fragment without a newline is not yielded: the caller sees it as the gap
    between the last line's end and ``end``. Oversize lines are yielded with ``raw=None`` and
    are never held in memory beyond the limit.
    """
    pos = start
    buf = b""
    line_start = start
    oversize = False
    while pos < end:
        chunk = os.pread(fd, min(_READ_CHUNK, end - pos), pos)
        if not chunk:
            break
        cpos = 0
        while True:
            nl = chunk.find(b"\n", cpos)
            if nl < 0:
                if not oversize:
                    buf += chunk[cpos:]
                    if len(buf) > max_line:
                        oversize, buf = True, b""
                break
            if oversize or len(buf) + (nl - cpos) > max_line:
                yield _Line(line_start, pos + nl, None)
            else:
                yield _Line(line_start, pos + nl, buf + chunk[cpos:nl])
            buf, oversize = b"", False
            cpos = nl + 1
            line_start = pos + cpos
        pos += len(chunk)


def _decode(line: _Line) -> dict[str, Any] | str:
    return "oversize" if line.raw is None else decode_line(line.raw)


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
        self._lock_fd = os.open(
            self.path.with_name(self.path.name + ".lock"),
            os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
            PRIVATE_FILE_MODE,
        )
        self._fd = -1
        self._ino = -1
        self._offset = 0  # end of the last complete line we have accounted for
        self._last_seq = 0
        self._truncate_to: int | None = None  # set when a rollback truncate failed
        with self._locked():
            self._open_locked()

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

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with self._mutex:
            if self._lock_fd < 0:
                raise JournalError(f"journal {self.path} is closed")
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
            fd = os.open(self.path, flags)
        else:
            fsync_dir(self.path.parent)  # the new name must survive a crash too
        self._fd = fd
        self._ino = os.fstat(fd).st_ino
        self._offset = 0
        self._last_seq = 0

    # -- reading ---------------------------------------------------------------------------

    def _catch_up_locked(self, collect: Replay | None) -> None:
        """Account for everything in the file since ``_offset``; drop a torn tail.

        Called under the lock before every append, so a second writer's records (or a file
        replaced by another process's retention) are seen before we assign the next ``seq``.
        """
        try:
            on_disk = os.stat(self.path).st_ino
        except FileNotFoundError:
            on_disk = -1
        if on_disk != self._ino:
            self._open_locked()
        size = os.fstat(self._fd).st_size
        if size < self._offset:
            self._offset, self._last_seq = 0, 0
        start = 0 if collect is not None else self._offset
        if collect is None and size == self._offset:
            return
        end = start
        for line in _scan(self._fd, start, size, self._max_line):
            end = line.end + 1
            decoded = _decode(line)
            if isinstance(decoded, str):
                if collect is not None:
                    collect.damage.append(Damage(line.offset, line.end - line.offset, decoded))
                continue
            seq = decoded.get("seq")
            if isinstance(seq, int) and seq > self._last_seq:
                self._last_seq = seq
            if collect is not None:
                collect.records.append(decoded)
        if end < size:
            # A fragment with no newline: a writer died mid-line. It was never acknowledged.
            if collect is not None:
                collect.damage.append(Damage(end, size - end, "torn_tail"))
            self._ops.ftruncate(self._fd, end)
            self._ops.fsync(self._fd)
        self._offset = end
        if collect is not None:
            collect.end = end

    def replay(self) -> Replay:
        """Every intact record in order, plus what was skipped. Never raises on damage."""
        with self._locked():
            self._settle_wedge_locked()
            result = Replay()
            self._last_seq = 0
            self._catch_up_locked(result)
            return result

    # -- writing ---------------------------------------------------------------------------

    def _settle_wedge_locked(self) -> None:
        if self._truncate_to is None:
            return
        try:
            self._ops.ftruncate(self._fd, self._truncate_to)
            self._ops.fsync(self._fd)
        except OSError as exc:
            raise JournalWriteError(
                f"journal {self.path} is wedged: cannot truncate a failed append ({exc})"
            ) from exc
        self._offset = self._truncate_to
        self._truncate_to = None

    def append(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """Write one record durably and return it as stored (with ``seq`` and ``ts``)."""
        return self.append_batch([record])[0]

    def append_batch(self, records: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Write several records with one write and one fsync: all of them or none."""
        if not records:
            return []
        with self._locked():
            self._settle_wedge_locked()
            self._catch_up_locked(None)
            now = self._clock()
            stored: list[dict[str, Any]] = []
            lines: list[bytes] = []
            seq = self._last_seq
            for rec in records:
                seq += 1
                full = {**rec, "seq": seq, "ts": now}
                try:
                    line = encode_line(full)
                except (TypeError, ValueError) as exc:
                    raise JournalError(f"record is not JSON-serialisable: {exc}") from exc
                if len(line) - 1 > self._max_line:
                    raise RecordTooLarge(
                        f"record of {len(line) - 1} bytes exceeds the {self._max_line}-byte limit"
                    )
                stored.append(full)
                lines.append(line)
            data = b"".join(lines)
            pre = self._offset
            try:
                self._write_all(data)
                self._ops.fsync(self._fd)
            except OSError as exc:
                self._rollback_locked(pre)
                raise JournalWriteError(f"append to {self.path} failed: {exc}") from exc
            self._offset = pre + len(data)
            self._last_seq = seq
            return stored

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = self._ops.write(self._fd, view.tobytes())
            if n <= 0:
                raise OSError(errno.EIO, "write returned no progress")
            view = view[n:]

    def _rollback_locked(self, pre: int) -> None:
        try:
            self._ops.ftruncate(self._fd, pre)
            self._ops.fsync(self._fd)
        except OSError:
            self._truncate_to = pre

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
            for line in _scan(self._fd, 0, size, self._max_line):
                decoded = _decode(line)
                if isinstance(decoded, str):
                    damaged.append(line.raw if line.raw is not None
                                   else b"<oversize line at %d>" % line.offset)
                    continue
                assert line.raw is not None
                lines.append(line.raw)
                records.append(decoded)
            keep = retention.plan(records, now, max_age)
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


def read_journal(path: Path | str, *, max_line: int = MAX_JOURNAL_LINE) -> Replay:
    """Read a journal without locking or repairing it (for ``crosstalk tail`` and diagnostics).

    A trailing fragment is reported as ``torn_tail`` but left alone: its writer may still be
    finishing it.
    """
    result = Replay()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return result
    try:
        size = os.fstat(fd).st_size
        end = 0
        for line in _scan(fd, 0, size, max_line):
            end = line.end + 1
            decoded = _decode(line)
            if isinstance(decoded, str):
                result.damage.append(Damage(line.offset, line.end - line.offset, decoded))
            else:
                result.records.append(decoded)
        if end < size:
            result.damage.append(Damage(end, size - end, "torn_tail"))
        result.end = end
    finally:
        os.close(fd)
    return result
