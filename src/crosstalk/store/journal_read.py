"""Reading a journal without owning it: what a read returns, and the lock-free read that
``crosstalk tail``, ``doctor`` and the test suite's audit use. The owning reader, which repairs
torn tails and follows other writers, is :class:`crosstalk.store.journal.Journal`."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from crosstalk.config import MAX_JOURNAL_LINE
from crosstalk.core.replay import Violation, audit

# Damage and RecordSink live with the scan that makes and feeds them; this is their home name.
from crosstalk.store.journal_scan import Damage, RecordSink, scan_writes

__all__ = ["Damage", "ReadMark", "RecordSink", "Replay", "Resume", "ResumeRefused",
           "audit_journal", "read_from", "read_journal"]


@dataclass
class Replay:
    #: Every intact record in order; empty when they were streamed to ``each`` instead.
    records: list[dict[str, Any]] = field(default_factory=list)
    damage: list[Damage] = field(default_factory=list)
    #: Byte offset just past the last complete line.
    end: int = 0
    #: The inode of the file read (retention renames a new file over the old).
    ino: int = -1
    #: Where the read started: 0, or the offset of the :class:`Resume` it continued from.
    start: int = 0


class ResumeRefused(Exception):
    """A :class:`Resume` the journal does not continue: the caller replays from the start."""


class Resume(Protocol):
    """Where a replay may continue instead of starting over (a restart checkpoint's mark):
    the records before ``offset`` were read already, ``seq`` is the highest among them."""

    @property
    def offset(self) -> int: ...

    @property
    def seq(self) -> int: ...

    def check(self, fd: int, ino: int, size: int) -> None:
        """Raise :class:`ResumeRefused` (saying why) unless the file open at ``fd`` (inode
        ``ino``, readable up to ``size``) still holds what was read before ``offset``."""


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
        end, _ = scan_writes(fd, 0, size, max_line, seq=0, keep=result.records,
                             damage=result.damage)
        if end < size:
            result.damage.append(Damage(end, size - end, "torn_tail"))
        result.end = end
    finally:
        os.close(fd)
    return result


def audit_journal(path: Path | str) -> list[Violation]:
    """The illegal state sequences in the journal at ``path`` (none for a journal the product
    wrote): :func:`crosstalk.core.replay.audit` over what :func:`read_journal` reads. Damaged
    lines are :attr:`Replay.damage`, not violations."""
    return audit(read_journal(path).records)


@dataclass(frozen=True)
class ReadMark:
    """How far a reader that follows a journal has read: the file (its inode, since retention
    renames a new file over the old) and the end of the last whole write it was handed."""

    ino: int
    end: int


def read_from(fd: int, ino: int, mark: ReadMark | None, each: RecordSink,
              restart: Callable[[], None], *, max_line: int = MAX_JOURNAL_LINE,
              limit: int | None = None) -> ReadMark:
    """Hand ``each`` the intact records written after ``mark`` and return the new mark.

    A mark that no longer holds (no mark, another file, a file cut shorter) calls ``restart``
    first and reads from the start. A trailing fragment is not read past: whoever next appends
    cuts it off, and the record written in its place starts at the returned mark. ``limit``
    stops at a failed append that could not be cut off yet.
    """
    size = os.fstat(fd).st_size
    if limit is not None:
        size = min(size, limit)
    start = 0
    if mark is None or mark.ino != ino or size < mark.end:
        restart()
    else:
        start = mark.end
    end, _ = scan_writes(fd, start, size, max_line, seq=0, each=each)
    return ReadMark(ino, end)
