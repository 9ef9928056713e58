"""The replay's fast decoder reads exactly what the decoder before issue 16 read.

The oracle below is that decoder, copied as it was (the full checks, then ``jsonload.loads``,
then ``whole_writes`` holding back ``{"b":`` lines): a faster path that accepted one more line,
named a different reason, or released an unfinished batch would change what a restart trusts.
Random records, random batch marks, random byte damage and a random cut point, read through
the real file code (``scan_lines`` over a real file) by both. The replay's fused loop
(:func:`~crosstalk.store.journal_scan.scan_writes`) is held to the same oracle, with the
line scanner as it was before it too, at random chunk sizes so lines straddle chunk bounds.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest.mock import patch

from hypothesis import given, settings
from hypothesis import strategies as st

from crosstalk.store import journal_scan
from crosstalk.store.journal_format import (
    Line,
    decode_line,
    encode_line,
    scan_lines,
    whole_writes,
)
from crosstalk.store.journal_read import Damage, read_journal
from crosstalk.store.journal_scan import scan_writes
from crosstalk.store.jsonload import loads

_PREFIX = b'{"c":"'
_MORE = b'{"b":"'
_MIDDLE = b'","r":'
_HEAD_LEN = 20


def oracle_decode(line: bytes) -> dict[str, Any] | str:
    if len(line) < _HEAD_LEN + 3 or not line.endswith(b"}"):
        return "framing"
    head = line[:6]
    more = head == _MORE
    if not (more or head == _PREFIX) or line[14:_HEAD_LEN] != _MIDDLE:
        return "framing"
    crc_field = line[6:14]
    if crc_field.strip(b"0123456789abcdef"):
        return "framing"
    body = line[_HEAD_LEN:-1]
    if zlib.crc32(body, zlib.crc32(_MORE) if more else 0) != int(crc_field, 16):
        return "checksum"
    try:
        record = loads(body)
    except ValueError:
        return "json"
    if not isinstance(record, dict):
        return "json"
    return record


def oracle_scan_lines(fd: int, start: int, end: int, max_line: int,
                      chunk_size: int) -> Iterator[Line]:
    """``scan_lines`` as it was before the fused loop (a chunk size to choose added)."""
    pos = start
    carry = b""
    line_start = start
    oversize = False
    while pos < end:
        chunk = os.pread(fd, min(chunk_size, end - pos), pos)
        if not chunk:
            break
        parts = chunk.split(b"\n")
        tail = parts.pop()
        if parts:
            first = parts[0]
            off = pos + len(first)
            if oversize or len(carry) + len(first) > max_line:
                yield Line(line_start, off, None)
            else:
                yield Line(line_start, off, carry + first if carry else first)
            off += 1
            for raw in parts[1:]:
                n = len(raw)
                yield Line(off, off + n, raw if n <= max_line else None)
                off += n + 1
            carry, oversize, line_start = b"", False, off
        if not oversize:
            carry += tail
            if len(carry) > max_line:
                oversize, carry = True, b""
        pos += len(chunk)


def oracle_whole_writes(lines: Iterator[Line]) -> Iterator[tuple[Line, dict[str, Any] | str]]:
    pending: list[tuple[Line, dict[str, Any] | str]] = []
    for line in lines:
        decoded = "oversize" if line.raw is None else oracle_decode(line.raw)
        if isinstance(decoded, dict) and line.raw is not None and line.raw.startswith(_MORE):
            pending.append((line, decoded))
            continue
        yield from pending
        pending.clear()
        yield line, decoded


def signed(body: bytes, *, more: bool) -> bytes:
    """A line with a correct CRC around any body (JSON the encoder would never write)."""
    head, crc = (_MORE, zlib.crc32(body, zlib.crc32(_MORE))) if more else (_PREFIX,
                                                                           zlib.crc32(body))
    return b"%s%08x%s%s}\n" % (head, crc, _MIDDLE, body)


keys = st.text(max_size=6)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63 - 1),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20))
records = st.dictionaries(keys, st.one_of(scalars, st.lists(scalars, max_size=3)), max_size=5)
#: Bodies with a valid CRC that only the fallback or the type check decides.
odd_bodies = st.sampled_from([b'{"a":NaN}', b'{"a":"\\ud800"}', b"[1,2]", b'"x"', b"{}",
                              b'{"a":1} ', b'{"a":1}x', b"", b'{"a":"\xff"}', b"null",
                              b'{"a":Infinity}', b'{"s":"\xed\xa0\x80"}'])
lines = st.one_of(
    st.tuples(records, st.booleans()).map(lambda r: encode_line(r[0], more=r[1])),
    st.tuples(odd_bodies, st.booleans()).map(lambda b: signed(b[0], more=b[1])),
)
damage = st.lists(st.tuples(st.sampled_from(["flip", "drop", "insert"]), st.integers(0, 10**6),
                            st.integers(0, 255)), max_size=4)


def damaged(data: bytes, edits: list[tuple[str, int, int]]) -> bytes:
    buf = bytearray(data)
    for kind, where, byte in edits:
        if not buf:
            break
        i = where % len(buf)
        if kind == "flip":
            buf[i] ^= byte or 1
        elif kind == "drop":
            del buf[i]
        else:
            buf.insert(i, byte)
    return bytes(buf)


def read_both(path: Path, max_line: int) -> tuple[list[Any], list[Any]]:
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        new = [(ln.offset, ln.end, repr(d))
               for ln, d in whole_writes(scan_lines(fd, 0, size, max_line))]
        old = [(ln.offset, ln.end, repr(d))
               for ln, d in oracle_whole_writes(scan_lines(fd, 0, size, max_line))]
    finally:
        os.close(fd)
    return new, old


@settings(max_examples=300, deadline=None)
@given(st.lists(lines, max_size=12), damage, st.integers(0, 10**6),
       st.sampled_from([64, 200, 1 << 20]))
def test_fast_decoder_reads_what_the_old_one_read(
        tmp_path_factory: Any, body: list[bytes], edits: list[tuple[str, int, int]],
        cut: int, max_line: int) -> None:
    data = damaged(b"".join(body), edits)
    data = data[: cut % (len(data) + 1)]
    path = tmp_path_factory.mktemp("j") / "j.jsonl"
    path.write_bytes(data)
    new, old = read_both(path, max_line)
    assert new == old
    for raw in data.split(b"\n")[:-1]:
        assert repr(decode_line(raw)) == repr(oracle_decode(raw))


def test_every_damage_reason_still_named(tmp_path: Path) -> None:
    """The fast path hands damaged lines to the full checks, which name why."""
    good = encode_line({"a": 1})
    bad_crc = good[:6] + (b"0" if good[6:7] != b"0" else b"1") + good[7:]
    upper = good[:6] + good[6:14].upper() + good[14:]
    data = (good + bad_crc + b"garbage\n" + signed(b"[1]", more=False) + b"x" * 300 + b"\n"
            + (upper if upper != good else bad_crc) + encode_line({"b": 2}, more=True))
    path = tmp_path / "j.jsonl"
    path.write_bytes(data)
    replay = read_journal(path, max_line=200)
    assert [d.reason for d in replay.damage][:5] == ["checksum", "framing", "json", "oversize",
                                                     "framing" if upper != good else "checksum"]
    # The trailing {"b": line has no end: held back and reported as the torn tail.
    assert replay.damage[-1].reason == "torn_tail"
    assert replay.records == [{"a": 1}]
    assert json.loads(good[_HEAD_LEN:-2]) == {"a": 1}


def oracle_replay(fd: int, start: int, size: int, max_line: int, *, chunk_size: int,
                  seq: int) -> tuple[int, int, list[Any], list[Damage]]:
    """What ``Journal._catch_up_locked`` computed before the fused loop: end, seq, records,
    damage."""
    end = start
    records: list[Any] = []
    damage: list[Damage] = []
    for line, decoded in oracle_whole_writes(oracle_scan_lines(fd, start, size, max_line,
                                                                chunk_size)):
        end = line.end + 1
        if isinstance(decoded, str):
            damage.append(Damage(line.offset, line.end - line.offset, decoded))
            continue
        value = decoded.get("seq")
        if isinstance(value, int) and value > seq:
            seq = value
        records.append(decoded)
    return end, seq, records, damage


seqs = st.one_of(st.integers(-5, 10**6), st.integers(2**62, 2**63 - 1), st.booleans(),
                 st.none(), st.floats(allow_nan=False, allow_infinity=False),
                 st.text(max_size=3))
#: Records as the product writes them (each with a seq, mostly rising ints) and odd ones.
seq_records = st.tuples(records, st.one_of(st.none(), seqs)).map(
    lambda r: r[0] if r[1] is None else {**r[0], "seq": r[1]})
#: Runs of lines as append_batch writes them: every line but the last marked {"b":.
batches = st.lists(seq_records, min_size=1, max_size=6).map(
    lambda rs: b"".join(encode_line(r, more=i < len(rs) - 1) for i, r in enumerate(rs)))
pieces = st.one_of(batches, lines, st.sampled_from([b"\n", b"garbage\n", b"{}\n", b"x" * 300]))


@settings(max_examples=400, deadline=None)
@given(st.lists(pieces, max_size=14), damage,
       st.tuples(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(-1, 50)),
       st.tuples(st.sampled_from([64, 200, 1 << 20]), st.integers(1, 700), st.integers(1, 4)))
def test_fused_replay_reads_what_the_old_loop_read(
        tmp_path_factory: Any, body: list[bytes], edits: list[tuple[str, int, int]],
        where: tuple[int, int, int], limits: tuple[int, int, int]) -> None:
    cut, start_at, seq = where  # the cut point, which line to start at, the seq before
    max_line, chunk_size, step = limits  # step: lines a streamed replay decodes at once
    data = damaged(b"".join(body), edits)
    data = data[: cut % (len(data) + 1)]
    path = tmp_path_factory.mktemp("j") / "j.jsonl"
    path.write_bytes(data)
    # Start at a line's first byte, as a replay from a checkpoint's mark does.
    heads = [0] + [i + 1 for i, b in enumerate(data) if b == 0x0A]
    start = heads[start_at % len(heads)]
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        want_end, want_seq, want, want_damage = oracle_replay(
            fd, start, size, max_line, chunk_size=chunk_size, seq=seq)
        kept: list[Any] = []
        got_damage: list[Damage] = []
        got = scan_writes(fd, start, size, max_line, seq=seq, keep=kept, damage=got_damage,
                          chunk_size=chunk_size)
        assert got == (want_end, want_seq)
        assert repr(kept) == repr(want)
        assert got_damage == want_damage
        for stream_step in (step, journal_scan._STREAM_STEP):
            streamed: list[Any] = []
            with patch.object(journal_scan, "_STREAM_STEP", stream_step):
                assert scan_writes(fd, start, size, max_line, seq=seq, each=streamed.append,
                                   chunk_size=chunk_size) == got
            assert repr(streamed) == repr(want)
        # Counting only (an append's catch-up): the same end and seq, nothing kept.
        assert scan_writes(fd, start, size, max_line, seq=seq, chunk_size=chunk_size) == got
        # And the default chunk (the whole file in one read here).
        assert scan_writes(fd, start, size, max_line, seq=seq) == got
    finally:
        os.close(fd)


def test_streamed_records_wait_for_their_write_across_chunks(tmp_path: Path) -> None:
    """A batch whose lines span several chunks is handed on only once its last line is read;
    one cut short at the end is never handed on, and the end stops before it."""
    whole = b"".join(encode_line({"seq": i}, more=i < 9) for i in range(10))
    cut_short = b"".join(encode_line({"seq": i}, more=True) for i in range(10, 14))
    path = tmp_path / "j.jsonl"
    path.write_bytes(whole + cut_short)
    fd = os.open(path, os.O_RDONLY)
    try:
        seen: list[Any] = []
        end, seq = scan_writes(fd, 0, len(whole) + len(cut_short), 1 << 20, seq=0,
                               each=seen.append, chunk_size=50)
    finally:
        os.close(fd)
    assert [r["seq"] for r in seen] == list(range(10))
    assert (end, seq) == (len(whole), 9)
