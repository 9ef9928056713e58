"""The journal's line format (ADR 0001): how one record becomes one checksummed line and back.

Each line is ``{"c":"<crc32 of R>","r":R}`` where R is the record's JSON; every line of an
``append_batch`` write but its last starts ``{"b":"`` instead. Pure bytes in, bytes out: the
file, its lock and its fsyncs are :mod:`crosstalk.store.journal`'s.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

_PREFIX = b'{"c":"'
# The head of every line of an append_batch write except its last: "this write continues".
# A SIGKILL inside a multi-page write() can leave the batch's first lines complete on disk;
# readers hold such lines back until the write's last line is there, so an unacknowledged
# batch is all or nothing after a crash too. Its CRC covers _MORE + R, so a flipped byte in
# the marker is caught like any other; a single append's line never carries it. jq .r works.
_MORE = b'{"b":"'
_MORE_CRC = zlib.crc32(_MORE)
_MIDDLE = b'","r":'
_HEAD_LEN = len(_PREFIX) + 8 + len(_MIDDLE)  # 20 bytes before the record JSON
_READ_CHUNK = 4 * 1024 * 1024


def encode_line(record: Mapping[str, Any], *, more: bool = False) -> bytes:
    body = json.dumps(record, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    head, crc = (_MORE, zlib.crc32(body, _MORE_CRC)) if more else (_PREFIX, zlib.crc32(body))
    return b"%s%08x%s%s}\n" % (head, crc, _MIDDLE, body)


def decode_line(line: bytes) -> dict[str, Any] | str:
    """Decode one line (without its newline): the record, or the reason it is damaged."""
    if len(line) < _HEAD_LEN + 3 or not line.endswith(b"}"):
        return "framing"
    if not (line.startswith(_PREFIX) or line.startswith(_MORE)):
        return "framing"
    if line[len(_PREFIX) + 8 : _HEAD_LEN] != _MIDDLE:
        return "framing"
    crc_field = line[len(_PREFIX) : len(_PREFIX) + 8]
    # Exactly what encode_line writes (8 lowercase hex digits): int(x, 16) alone also takes
    # " 1a2b3c4", "+1a2b3c4" and "1A2B3C4D", where a flipped byte would go undetected.
    if crc_field.strip(b"0123456789abcdef"):
        return "framing"
    crc = int(crc_field, 16)
    body = line[_HEAD_LEN:-1]
    if zlib.crc32(body, _MORE_CRC if line.startswith(_MORE) else 0) != crc:
        return "checksum"
    try:
        record = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return "json"
    if not isinstance(record, dict):
        return "json"
    return record


@dataclass(frozen=True)
class Line:
    offset: int  # first byte of the line
    end: int  # offset of its newline
    raw: bytes | None  # the line without its newline; None when it exceeds the limit


def scan_lines(fd: int, start: int, end: int, max_line: int) -> Iterator[Line]:
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
                yield Line(line_start, pos + nl, None)
            else:
                yield Line(line_start, pos + nl, buf + chunk[cpos:nl])
            buf, oversize = b"", False
            cpos = nl + 1
            line_start = pos + cpos
        pos += len(chunk)


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
