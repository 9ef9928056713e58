"""Following every journal in ``<home>/journal/`` as it grows, without owning any of them.

Read only: no lock is taken (a shim's append never waits for the watch), nothing is repaired
or cut, and lines are decoded by the store's own codec (:mod:`crosstalk.store.journal_format`:
CRC per line, a batch held back until its last line is there).

Each journal is read from a point, never wholly at start (ADR 0901-watch-feed-start): the
first look reads its end (from the first whole line in it), its share of a byte budget by
size, then each poll reads only what was appended. A journal that retention replaced (a new
file renamed over the old one, with the kept records and their ``seq``) or that was cut
shorter is read again the same way, and records whose ``seq`` was already handed on are
skipped. A journal that appears later (a new agent) is read the same way; one that vanishes,
or cannot be opened, is a :class:`~crosstalk.watch.model.Notice`, and the others go on.

A record with a field whose name looks secret is redacted as it is read (journals hold no
token; this guards the watch should one ever be journaled).

Damage is shown, not hidden: a whole line that does not decode is a notice at once; a
trailing fragment is normal for a moment (its writer is mid-``write``), and a notice once it
has stayed for :data:`TORN_GRACE` seconds (its writer died; the next append cuts it off).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, NamedTuple

from crosstalk.config import MAX_JOURNAL_LINE
from crosstalk.store.journal_format import scan_lines, whole_writes
from crosstalk.store.journal_read import ReadMark
from crosstalk.watch.fold import may_hold_secret, redact
from crosstalk.watch.model import Notice

#: How long a trailing fragment may stay before it is told as a torn line.
TORN_GRACE: Final = 2.0
_SUFFIX = ".jsonl"
_SEEK_CHUNK = 64 * 1024
#: The least of each journal's end a first look reads, however small its share.
MIN_TAIL_BYTES: Final = 8 * 1024


class Batch(NamedTuple):
    """Records one read of one journal handed on, in journal order."""

    agent_id: str
    records: list[dict[str, Any]]
    #: The read began at the file's start or at the last mark (not at a tail cut): a record
    #: in it for a message not seen is a late change of an older message, worth showing.
    whole: bool


@dataclass
class _Followed:
    path: Path
    mark: ReadMark | None = None
    last_seq: int = 0
    torn_since: float | None = None
    torn_told: bool = False
    #: The last problem told for this file, so one problem is one notice.
    problem: str | None = None
    damage_told: set[int] = field(default_factory=set)


class JournalFollower:
    """Every journal of one state dir, each followed from a mark."""

    def __init__(self, directory: Path, budget: int, *, min_tail: int = MIN_TAIL_BYTES,
                 clock: Callable[[], float] = time.time) -> None:
        """``budget``: the bytes first looks read in all; each journal gets its share by
        size (a busy journal holds more of the newest messages), at least ``min_tail``."""
        self.directory = directory
        self._budget = budget
        self._min_tail = min_tail
        self._clock = clock
        self._followed: dict[str, _Followed] = {}

    @property
    def agents(self) -> list[str]:
        return list(self._followed)

    def poll(self) -> tuple[list[Batch], list[Notice]]:
        batches: list[Batch] = []
        notices: list[Notice] = []
        for agent_id in self._listed(notices):
            if agent_id not in self._followed:
                self._followed[agent_id] = _Followed(self.directory / (agent_id + _SUFFIX))
        total = max(1, sum(_size(f.path) for f in self._followed.values()))
        for agent_id, followed in list(self._followed.items()):
            tail = max(self._min_tail, self._budget * _size(followed.path) // total)
            batch = self._read(agent_id, followed, tail, notices)
            if batch is None:
                del self._followed[agent_id]
            elif batch.records:
                batches.append(batch)
        return batches, notices

    def _listed(self, notices: list[Notice]) -> list[str]:
        try:
            with os.scandir(self.directory) as it:
                return sorted(e.name[: -len(_SUFFIX)] for e in it
                              if e.name.endswith(_SUFFIX) and not e.name.startswith("."))
        except FileNotFoundError:
            return []
        except OSError as exc:
            notices.append(Notice(self._clock(), str(self.directory),
                                  f"cannot list journals: {exc.strerror or exc}"))
            return []

    def _read(self, agent_id: str, f: _Followed, tail: int,
              notices: list[Notice]) -> Batch | None:
        """What ``f`` has new, or ``None`` if it is gone (told as a notice)."""
        try:
            fd = os.open(f.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            notices.append(Notice(self._clock(), str(f.path),
                                  "journal vanished (no longer followed)"))
            return None
        except OSError as exc:
            self._tell(f, f"cannot read: {exc.strerror or exc}", notices)
            return Batch(agent_id, [], False)
        try:
            st = os.fstat(fd)
            size, ino = st.st_size, st.st_ino
            mark = f.mark
            if mark is not None and mark.ino == ino and mark.end == size:
                f.torn_since, f.problem = None, None
                return Batch(agent_id, [], True)
            if mark is None or mark.ino != ino or size < mark.end:
                start = _first_whole_line(fd, size - tail) if size > tail else 0
                whole = start == 0
                f.damage_told.clear()
            else:
                start, whole = mark.end, True
            records, end = self._scan(f, fd, start, size, notices)
            f.mark = ReadMark(ino, end)
            f.problem = None
            self._torn(f, end, size, notices)
            return Batch(agent_id, records, whole)
        except OSError as exc:
            self._tell(f, f"cannot read: {exc.strerror or exc}", notices)
            return Batch(agent_id, [], False)
        finally:
            os.close(fd)

    def _scan(self, f: _Followed, fd: int, start: int, size: int,
              notices: list[Notice]) -> tuple[list[dict[str, Any]], int]:
        records: list[dict[str, Any]] = []
        end = start
        for line, decoded in whole_writes(scan_lines(fd, start, size, MAX_JOURNAL_LINE)):
            end = line.end + 1
            if isinstance(decoded, str):
                if line.offset not in f.damage_told:
                    f.damage_told.add(line.offset)
                    notices.append(Notice(self._clock(), str(f.path),
                                          f"damaged line at byte {line.offset} "
                                          f"({decoded}): skipped"))
                continue
            record = (redact(decoded) if line.raw is not None and may_hold_secret(line.raw)
                      else decoded)
            seq = record.get("seq")
            if isinstance(seq, int):
                if seq <= f.last_seq:
                    continue
                f.last_seq = seq
            records.append(record)
        return records, end

    def _torn(self, f: _Followed, end: int, size: int, notices: list[Notice]) -> None:
        if end >= size:
            f.torn_since, f.torn_told = None, False
            return
        now = self._clock()
        if f.torn_since is None:
            f.torn_since = now
        elif not f.torn_told and now - f.torn_since >= TORN_GRACE:
            f.torn_told = True
            notices.append(Notice(now, str(f.path),
                                  f"torn line at byte {end} ({size - end} bytes, no newline): "
                                  "not read past until its writer cuts it off"))

    def _tell(self, f: _Followed, what: str, notices: list[Notice]) -> None:
        if f.problem != what:
            f.problem = what
            notices.append(Notice(self._clock(), str(f.path), what))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _first_whole_line(fd: int, cut: int) -> int:
    """The offset of the first line that starts at or after ``cut`` (a tail read's start)."""
    pos = max(0, cut - 1)
    while True:
        chunk = os.pread(fd, _SEEK_CHUNK, pos)
        if not chunk:
            return pos
        nl = chunk.find(b"\n")
        if nl >= 0:
            return pos + nl + 1
        pos += len(chunk)
