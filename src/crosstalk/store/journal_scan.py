"""A replay's read of the journal: every whole write's records, the damage, the highest ``seq``.

This is ``whole_writes(scan_lines(...))`` fused into one loop over each read chunk (ADR 0032):
a 100k-record replay spent most of its time stepping two generators, building a ``Line`` and
testing each record in Python, not in crc32 and orjson. Here the chunk's intact lines are
decoded by :func:`~crosstalk.store.journal_format.decode_intact` without a frame a line, the
records are handed on a chunk at a time, and offsets are summed only where a line needs one.
Anything else (the line a chunk boundary split, damage, an oversize line, bytes orjson
refuses) goes through :func:`~crosstalk.store.journal_format.decode_line` one line at a time,
so what is read, held back and reported is exactly what the generators read: the oracle test
(``tests/unit/test_journal_decode_oracle.py``) compares the two over random damage and cuts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import repeat
from typing import Any

from crosstalk.store.journal_format import (
    MORE_BYTE,
    READ_CHUNK,
    decode_batch,
    decode_intact,
    decode_line,
    read_chunks,
)


@dataclass(frozen=True)
class Damage:
    """A region of the journal that did not decode; it was skipped, not trusted."""

    offset: int
    length: int
    reason: str  # "checksum" | "framing" | "json" | "oversize" | "torn_tail"


#: Takes one replayed record (``Journal.replay(each=...)``).
RecordSink = Callable[[dict[str, Any]], None]


#: Lines a streamed replay decodes before it hands their records on.
_STREAM_STEP = 256


class _Writes:
    """The records decoded but not handed on yet, and how many at their end are ``{"b":``
    lines no line has followed: a write that may not have ended (``held``, from ``held_at``)."""

    def __init__(self, start: int) -> None:
        self.records: list[dict[str, Any]] = []
        self.held = 0
        self.held_at = start

    def one(self, offset: int, raw: bytes | None, length: int, damage: list[Damage] | None) -> None:
        """A line off the fast path: decoded in full, its damage named."""
        decoded = "oversize" if raw is None else decode_line(raw)
        if isinstance(decoded, str):
            if damage is not None:
                damage.append(Damage(offset, length, decoded))
            self.held = 0  # any later line, even a damaged one, ends the write
            return
        self.records.append(decoded)
        self.more(offset, raw is not None and raw[2] == MORE_BYTE)

    def run(self, lines: list[bytes], i: int, j: int, offset: int) -> int:
        """Account for ``lines[i:j]``, intact lines from ``offset``; return the offset past them.

        Their trailing ``{"b":`` lines, found walking back (a batch's last line is ``{"c":``,
        so a walk is short), extend what is held or start it."""
        k = j
        while k > i and lines[k - 1][2] == MORE_BYTE:
            k -= 1
        if k > i:
            self.held = 0
        end = offset + sum(map(len, lines[i:j])) + j - i
        if k < j:
            self.more(end - sum(map(len, lines[k:j])) - (j - k), True)
            self.held += j - k - 1
        return end

    def walk(self, lines: list[bytes], i: int, stop: int, offset: int, *, max_line: int,
             damage: list[Damage] | None) -> int:
        """Account for ``lines[i:stop]``, some not intact; return the offset past them.

        One iterator serves the whole run, so a run of many damaged lines costs a call each,
        not a copy of the rest of the run each."""
        rest = iter(lines[i:stop])
        while i < stop:
            j = i + decode_intact(rest, self.records)
            if j > i:
                offset, i = self.run(lines, i, j, offset), j
            if i < stop:  # decode_intact stopped at lines[i] (and took it): not intact
                raw = lines[i]
                self.one(offset, raw if len(raw) <= max_line else None, len(raw), damage)
                offset += len(raw) + 1
                i += 1
        return offset

    def hand_on(self, keep: list[dict[str, Any]] | None, each: RecordSink | None,
                seq: int) -> int:
        """Hand on every record but the held ones; the highest seq among all handed on."""
        records, held = self.records, self.held
        whole = records[:len(records) - held] if held else records
        self.records = records[len(records) - held:] if held else []
        if keep is not None:
            keep.extend(whole)
        elif each is not None:
            for record in whole:
                each(record)
        return _highest_seq(whole, seq)

    def more(self, offset: int, more: bool) -> None:
        if not more:
            self.held = 0
        else:
            if not self.held:
                self.held_at = offset
            self.held += 1


def scan_writes(fd: int, start: int, size: int, max_line: int, *, seq: int,
                keep: list[dict[str, Any]] | None = None, each: RecordSink | None = None,
                damage: list[Damage] | None = None,
                chunk_size: int = READ_CHUNK) -> tuple[int, int]:
    """Read the whole writes in ``[start, size)``; return where the last ends and the highest seq.

    Every record is appended to ``keep`` or handed to ``each`` (neither: only counted), in
    order, once a later line proves its write ended; ``seq`` rises to the highest integer
    ``seq`` among them. The returned end is past the last line handed on or reported as
    damage: a fragment, and ``{"b":`` lines with no line after them, lie beyond it.
    """
    writes = _Writes(start)
    end = start
    # A streamed replay keeps none of its records, so it hands them on every few hundred
    # lines: a whole chunk's dicts at once would be several times the chunk's bytes.
    step = _STREAM_STEP if each is not None else chunk_size
    for first, lines, at in read_chunks(fd, start, size, max_line, chunk_size):
        off = at
        writes.one(first.offset, first.raw, first.end - first.offset, damage)
        if lines and (max_line >= chunk_size or max(map(len, lines)) <= max_line):
            for i in range(0, len(lines), step):
                stop = min(i + step, len(lines))
                batch = lines[i:stop] if i or stop < len(lines) else lines
                if decode_batch(batch, writes.records):
                    off = writes.run(lines, i, stop, off)
                else:  # a line in it is not intact: walk them, each damaged line named
                    off = writes.walk(lines, i, stop, off, max_line=max_line,
                                      damage=damage)
                if each is not None:
                    seq = writes.hand_on(keep, each, seq)
        else:
            for raw in lines:
                writes.one(off, raw if len(raw) <= max_line else None, len(raw), damage)
                off += len(raw) + 1
        end = off
        seq = writes.hand_on(keep, each, seq)
    return (writes.held_at if writes.held else end), seq


def _highest_seq(records: list[dict[str, Any]], seq: int) -> int:
    """``seq`` raised to the highest integer ``seq`` among ``records`` (others are ignored)."""
    values: Iterator[Any] = map(dict.get, records, repeat("seq"))
    try:
        top = max(values, default=seq)
    except TypeError:  # a record without seq, or a string one: none the product writes
        top = None
    if type(top) is int:
        # Every seq is a number and the highest is an int, so it is the highest int too.
        return top if top > seq else seq
    for record in records:
        value = record.get("seq")
        if isinstance(value, int) and value > seq:
            seq = value
    return seq
