"""The journal's line format (ADR 0001): how one record becomes one checksummed line and back.

Each line is ``{"c":"<crc32 of R>","r":R}`` where R is the record's JSON; every line of an
``append_batch`` write but its last starts ``{"b":"`` instead. Pure bytes in, bytes out: the
file, its lock and its fsyncs are :mod:`crosstalk.store.journal`'s.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from binascii import hexlify
from collections.abc import Iterator, Mapping
from operator import itemgetter
from typing import Any, NamedTuple

import orjson

from crosstalk.store.jsonload import loads

try:
    # ISA-L's CRC-32 (PCLMUL folding): the same values as zlib.crc32, ~4x as fast over a
    # journal line; a replay spent a tenth of its time in zlib's (ADR 0041). Only the reads use
    # it: the writer's CRC is one a line, beside a json.dumps and an fsync.
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # a platform isal has no wheel for: the stdlib's, same values
    _crc32 = zlib.crc32

_PREFIX = b'{"c":"'
# The head of every line of an append_batch write except its last: "this write continues".
# A SIGKILL inside a multi-page write() can leave the batch's first lines complete on disk;
# readers hold such lines back until the write's last line is there, so an unacknowledged
# batch is all or nothing after a crash too. Its CRC covers _MORE + R, so a flipped byte in
# the marker is caught like any other; a single append's line never carries it. jq .r works.
_MORE = b'{"b":"'
_MORE_CRC = zlib.crc32(_MORE)
_MIDDLE = b'","r":'
_HEAD_START = len(_PREFIX)
_CRC_END = _HEAD_START + 8
_HEAD_LEN = _CRC_END + len(_MIDDLE)  # 20 bytes before the record JSON
#: Bytes read at once: what a replay holds besides its records (the split lines of one chunk).
READ_CHUNK = 1024 * 1024


def encode_line(record: Mapping[str, Any], *, more: bool = False) -> bytes:
    body = json.dumps(record, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    head, crc = (_MORE, zlib.crc32(body, _MORE_CRC)) if more else (_PREFIX, zlib.crc32(body))
    return b"%s%08x%s%s}\n" % (head, crc, _MIDDLE, body)


def decode_line(line: bytes) -> dict[str, Any] | str:
    """Decode one line (without its newline): the record, or the reason it is damaged."""
    # Fast path for an intact line (nearly every line of a replay): one crc32, one formatted
    # compare that checks the CRC field's spelling and value at once, one loads. Anything
    # else goes to the full checks below, which name the reason.
    if len(line) >= _HEAD_LEN + 3 and line.endswith(b"}") and line.startswith(_MIDDLE, _CRC_END):
        body = line[_HEAD_LEN:-1]
        if line.startswith(_PREFIX):
            crc = _crc32(body)
        elif line.startswith(_MORE):
            crc = _crc32(body, _MORE_CRC)
        else:
            return "framing"
        if line.startswith(b"%08x" % crc, _HEAD_START):
            try:
                record = orjson.loads(body)
            except orjson.JSONDecodeError:
                record = None
            if isinstance(record, dict):
                return record
    return _decode_checked(line)


def _decode_checked(line: bytes) -> dict[str, Any] | str:
    if len(line) < _HEAD_LEN + 3 or not line.endswith(b"}"):
        return "framing"
    head = line[:_HEAD_START]
    more = head == _MORE
    if not (more or head == _PREFIX) or line[_CRC_END:_HEAD_LEN] != _MIDDLE:
        return "framing"
    crc_field = line[_HEAD_START:_CRC_END]
    # Exactly what encode_line writes (8 lowercase hex digits): int(x, 16) alone also takes
    # " 1a2b3c4", "+1a2b3c4" and "1A2B3C4D", where a flipped byte would go undetected.
    if crc_field.strip(b"0123456789abcdef"):
        return "framing"
    body = line[_HEAD_LEN:-1]
    if _crc32(body, _MORE_CRC if more else 0) != int(crc_field, 16):
        return "checksum"
    try:
        record = loads(body)
    except ValueError:  # UnicodeDecodeError is one
        return "json"
    if not isinstance(record, dict):
        return "json"
    return record


# An intact line's first _HEAD_LEN bytes, given its CRC: one compare checks the marker, the
# CRC field's spelling and value and the separator at once.
_HEAD_MORE = _MORE + b"%08x" + _MIDDLE
_HEAD_ONE = _PREFIX + b"%08x" + _MIDDLE
#: Byte 2 of a line that marks a write as continuing (``{"b":``): a one-index test for it.
MORE_BYTE = _MORE[2]
_CLOSE = ord("}")


def decode_intact(lines: Iterator[bytes], out: list[dict[str, Any]]) -> int:
    """Decode lines onto ``out`` while each is intact; how many were.

    The first line that is not intact is taken from ``lines`` too (the caller knows it by its
    index), so one iterator serves a whole chunk: a chunk of many damaged lines costs a call
    each, not a copy of the rest of the chunk each.

    A replay's inner loop: one crc32, one compare, one ``orjson.loads`` a line, no frame. It
    takes only lines :func:`decode_line` reads as a record from the same bytes (the head, the
    CRC and the closing brace as written, a body orjson reads as an object), and stops at any
    other: the caller decodes that one with :func:`decode_line`, which names the damage or
    reads what orjson refuses (NaN, lone surrogates). Lines are not checked against a limit.
    """
    append = out.append
    before = len(out)
    crc32 = _crc32
    load = orjson.loads
    try:
        for raw in lines:
            body = raw[_HEAD_LEN:-1]
            if raw[2] == MORE_BYTE:
                if raw[:_HEAD_LEN] != _HEAD_MORE % crc32(body, _MORE_CRC):
                    break
            elif raw[:_HEAD_LEN] != _HEAD_ONE % crc32(body):
                break
            if raw[-1] != _CLOSE:
                break
            record = load(body)
            if type(record) is not dict:
                break
            append(record)
    except (orjson.JSONDecodeError, IndexError):  # IndexError: a line shorter than 3 bytes
        pass
    return len(out) - before


# decode_batch's per-line steps, each a C call that map() runs without a bytecode a line: the
# head, the body and the closing byte (a 1-byte slice: b"" for an empty line, never an error).
_head_of = itemgetter(slice(0, _HEAD_LEN))
_body_of = itemgetter(slice(_HEAD_LEN, -1))
_last_of = itemgetter(slice(-1, None))
#: The CRC's seed, by a line's byte 2 (b: the CRC covers the marker too).
_SEED = [0] * 256
_SEED[MORE_BYTE] = _MORE_CRC
#: The columns of the heads joined (20 bytes a line) that hold the same byte on every line.
_FIXED = [(i, bytes([byte])) for i, byte in enumerate(_PREFIX + bytes(8) + _MIDDLE)
          if i != 2 and not _HEAD_START <= i < _CRC_END]
_DICT = [dict]


def decode_batch(lines: list[bytes], out: list[dict[str, Any]]) -> bool:
    """Decode every line onto ``out`` if all are intact; else add nothing and say so.

    The same test a line as :func:`decode_intact` (the head as written for the body's CRC, the
    closing brace, a body orjson reads as an object), done a step at a time over the whole
    list: ``map`` for what each line needs on its own (slices, crc32, ``orjson.loads``), and
    for the heads one string of them all, checked a column at a time with strided slices
    (the marker byte, the fixed bytes, each hex digit of the CRC field against the CRCs
    hexed at once). A 100k-line replay spent a quarter of its time in the one-line loop's
    bytecode and a tenth in formatting a head a line. All or nothing, because a failed
    step does not say which line failed: the caller then walks the lines with
    :func:`decode_intact`, which does.
    """
    n = len(lines)
    heads = b"".join(map(_head_of, lines))
    # A line shorter than a head would shift every column after it: no line is.
    if len(heads) != _HEAD_LEN * n or b"".join(map(_last_of, lines)) != b"}" * n:
        return False
    marks = heads[2::_HEAD_LEN]
    if marks.translate(None, b"bc"):  # every marker is b or c (it picked the seed below)
        return False
    for column, byte in _FIXED:
        if heads[column::_HEAD_LEN] != byte * n:
            return False
    bodies = list(map(_body_of, lines))
    # Big-endian, so each CRC hexes to its field's 8 digits, lowercase, as encode_line wrote.
    crcs = map(_crc32, bodies, map(_SEED.__getitem__, marks))
    hexed = hexlify(struct.pack(f">{n}I", *crcs))
    for digit in range(8):
        if heads[_HEAD_START + digit::_HEAD_LEN] != hexed[digit::8]:
            return False
    try:
        records = list(map(orjson.loads, bodies))
    except orjson.JSONDecodeError:
        return False
    if list(map(type, records)) != _DICT * n:
        return False
    out.extend(records)
    return True


class Line(NamedTuple):
    """One line of the file (a tuple: a replay makes one per record)."""

    offset: int  # first byte of the line
    end: int  # offset of its newline
    raw: bytes | None  # the line without its newline; None when it exceeds the limit


def read_chunks(fd: int, start: int, end: int, max_line: int,
                chunk_size: int = READ_CHUNK) -> Iterator[tuple[Line, list[bytes], int]]:
    """Read ``[start, end)`` in big chunks and split each in one call.

    For every chunk that holds a newline: the line it completes (begun in an earlier chunk
    perhaps; ``raw=None`` when it exceeds ``max_line``, and never held beyond the limit), the
    complete lines after it (not checked against ``max_line``: the caller does), and the
    offset of the first of those. A trailing fragment without a newline is not yielded.
    """
    pos = start
    carry = b""  # the start of a line a previous chunk began (at most max_line bytes)
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
                line = Line(line_start, off, None)
            else:
                line = Line(line_start, off, carry + first if carry else first)
            del parts[0]
            carry, oversize, line_start = b"", False, pos + len(chunk) - len(tail)
            yield line, parts, off + 1
        if not oversize:
            carry += tail
            if len(carry) > max_line:
                oversize, carry = True, b""
        pos += len(chunk)


def scan_lines(fd: int, start: int, end: int, max_line: int,
               chunk_size: int = READ_CHUNK) -> Iterator[Line]:
    """Yield every complete line in ``[start, end)``.

    A trailing fragment without a newline is not yielded: the caller sees it as the gap
    between the last line's end and ``end``. Oversize lines are yielded with ``raw=None`` and
    are never held in memory beyond the limit.
    """
    new = tuple.__new__
    for first, parts, at in read_chunks(fd, start, end, max_line, chunk_size):
        yield first
        off = at
        for raw in parts:
            n = len(raw)
            # tuple.__new__: Line(...) is a Python-level __new__, a frame per line.
            yield new(Line, (off, off + n, raw if n <= max_line else None))
            off += n + 1


def decode_scanned(line: Line) -> dict[str, Any] | str:
    return "oversize" if line.raw is None else decode_line(line.raw)


def whole_writes(lines: Iterator[Line]) -> Iterator[tuple[Line, dict[str, Any] | str]]:
    """Decode lines, holding back intact ``_MORE`` lines until a line ends their write.

    Only a write cut short at the end of the file (its writer died) leaves them unended; they
    are then never yielded and the caller sees them as part of the torn tail. Any later line,
    even a damaged one, proves the write completed, so mid-file they are passed on as usual.
    """
    pending: list[tuple[Line, dict[str, Any] | str]] = []
    for line in lines:
        decoded = decode_scanned(line)
        if isinstance(decoded, dict) and line.raw is not None and line.raw.startswith(_MORE):
            pending.append((line, decoded))
            continue
        if pending:
            yield from pending
            pending.clear()
        yield line, decoded


def standalone(raw: bytes) -> bytes:
    """``raw`` (an intact line) as a line of a single append.

    Retention copies kept lines into a new file where each stands alone: a kept ``{"b":``
    line whose batch end was dropped must not read as an unfinished write there.
    """
    if not raw.startswith(_MORE):
        return raw
    body = raw[_HEAD_LEN:-1]
    return b"%s%08x%s%s}" % (_PREFIX, zlib.crc32(body), _MIDDLE, body)
