"""A replay's batch decode (``decode_batch``) reads exactly what the line-at-a-time decode reads.

``decode_batch`` is all or nothing: it takes a list of lines only when every one is intact,
and then hands on what :func:`decode_intact` (and so :func:`decode_line`) would read from each.
A batch that it refuses is walked line by line, so a record that orjson reads otherwise than
``json`` does (NaN, lone surrogates, an integer beyond 64 bits, bytes that are not UTF-8) reads
through a replay exactly as a line on its own reads, whichever batch it lands in. The CRC of
every line is still checked (the CRC function is ISA-L's where installed: same values).
"""

from __future__ import annotations

import json
import math
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crosstalk.store import journal_format
from crosstalk.store.journal import Journal
from crosstalk.store.journal_errors import JournalError
from crosstalk.store.journal_format import decode_batch, decode_intact, decode_line, encode_line
from crosstalk.store.journal_read import read_journal
from tests.support.values import same

_MORE = b'{"b":"'


def signed(body: bytes, *, more: bool = False) -> bytes:
    """A line (no newline) with a correct CRC around any body: one the writer never makes."""
    if more:
        return b'{"b":"%08x","r":%s}' % (zlib.crc32(body, zlib.crc32(_MORE)), body)
    return b'{"c":"%08x","r":%s}' % (zlib.crc32(body), body)


keys = st.text(max_size=5)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12))
records = st.dictionaries(keys, st.one_of(scalars, st.lists(scalars, max_size=3)), max_size=4)
#: Bodies with a valid CRC that orjson refuses or reads as a non-object.
odd = st.sampled_from([b'{"a":NaN}', b'{"a":-Infinity}', b'{"a":"\\ud800"}',
                       b'{"s":"\xed\xa0\x80"}', b'{"a":"\xff"}', b"[1]", b'"x"', b"{}", b"",
                       b'{"a":1} ', b'{"n":18446744073709551616}', b"null"])
one_line = st.one_of(
    st.tuples(records, st.booleans()).map(lambda r: encode_line(r[0], more=r[1])[:-1]),
    st.tuples(odd, st.booleans()).map(lambda b: signed(b[0], more=b[1])),
    st.binary(max_size=30),
)


def flip(line: bytes, where: int, byte: int) -> bytes:
    if not line:
        return line
    i = where % len(line)
    return line[:i] + bytes([line[i] ^ (byte or 1)]) + line[i + 1:]


damaged_line = st.one_of(
    one_line, st.tuples(one_line, st.integers(0, 999), st.integers(0, 255)).map(
        lambda t: flip(*t)))


@settings(max_examples=500, deadline=None)
@given(st.lists(st.one_of(one_line, damaged_line), max_size=10),
       st.lists(records, max_size=2))
def test_a_batch_reads_what_the_lines_read_one_by_one(
        lines: list[bytes], before: list[dict[str, Any]]) -> None:
    out = list(before)
    taken = decode_batch(lines, out)
    walked = list(before)
    intact = decode_intact(iter(lines), walked)
    # Taken exactly when every line is intact by the one-line test, with the same records.
    assert taken == (intact == len(lines))
    assert repr(out) == repr(walked if taken else before)
    if taken:
        assert repr(out[len(before):]) == repr([decode_line(raw) for raw in lines])


def test_the_crc_reads_use_gives_zlibs_values() -> None:
    # ISA-L's crc32 where it is installed (ADR 0041); a journal line's CRC is zlib's.
    for data in (b"", b"x", b'{"a":1}' * 100, bytes(range(256)) * 9):
        for seed in (0, zlib.crc32(_MORE), 0xFFFFFFFF):
            assert journal_format._crc32(data, seed) == zlib.crc32(data, seed)


#: Lines another writer (or an older version) may have left: what json reads each as, or the
#: damage a replay reports for it. Framed by hand: encode_line refuses the first four.
ODD = [
    (b'{"deadline":NaN,"seq":2}', {"deadline": math.nan, "seq": 2}),
    (b'{"t":-Infinity,"seq":3}', {"t": -math.inf, "seq": 3}),
    (b'{"text":"half an emoji \\ud83d","seq":4}', {"text": "half an emoji \ud83d", "seq": 4}),
    (b'{"text":"cesu \xed\xa0\xbd","seq":5}', {"text": "cesu \ud83d", "seq": 5}),
    # The one documented difference (ADR 0021): beyond 64 bits an integer reads as a float.
    (b'{"n":18446744073709551616,"seq":6}', {"n": 2.0 ** 64, "seq": 6}),
    (b'{"n":18446744073709551615,"m":-9223372036854775808,"seq":7}',
     {"n": 2**64 - 1, "m": -2**63, "seq": 7}),
    (b'{"nul":"a\\u0000b","seq":8}', {"nul": "a\x00b", "seq": 8}),
    (b'{"bad":"\xff","seq":9}', "json"),  # not UTF-8: json refuses it too
    (b'[{"seq":10}]', "json"),  # not an object
]


@pytest.mark.parametrize("more", [False, True])
@pytest.mark.parametrize(("body", "want"), ODD, ids=[str(i) for i in range(len(ODD))])
def test_a_record_orjson_reads_otherwise_replays_as_it_reads_alone(
        tmp_path: Path, body: bytes, want: dict[str, Any] | str, more: bool) -> None:
    # Amid intact lines of a batch, so the batch decode meets it and walks the lines.
    before = [encode_line({"seq": 1, "i": i}, more=True) for i in range(300)]
    after = [encode_line({"seq": 11, "i": i}, more=i < 299) for i in range(300)]
    odd = signed(body, more=more) + b"\n"
    path = tmp_path / "j.jsonl"
    path.write_bytes(b"".join(before) + odd + b"".join(after))
    alone = decode_line(odd[:-1])
    if isinstance(want, str):
        assert alone == want
    else:
        assert isinstance(alone, dict)
        assert same(alone, want)
        if body != b'{"n":18446744073709551616,"seq":6}':
            assert same(json.loads(body.decode("utf-8", "surrogatepass")), want)
    with Journal(path) as j:
        replay = j.replay()
        streamed: list[dict[str, Any]] = []
        j.replay(each=streamed.append)
    for got in (replay.records, streamed, read_journal(path).records):
        assert len(got) == 600 + (not isinstance(want, str))
        if isinstance(want, str):
            assert got[300]["seq"] == 11
        else:
            assert same(got[300], want)
    offset = len(b"".join(before))
    assert replay.damage == ([] if not isinstance(want, str) else
                             [type(replay.damage[0])(offset, len(odd) - 1, want)])


@pytest.mark.parametrize("record", [{"deadline": math.nan}, {"t": math.inf},
                                    {"text": "half an emoji \ud83d"}])
def test_the_writer_refuses_what_orjson_would_read_otherwise(
        tmp_path: Path, record: dict[str, Any]) -> None:
    # NaN, infinities and lone surrogates never reach the file: an append raises, clearly.
    with Journal(tmp_path / "j.jsonl") as j:
        with pytest.raises(JournalError, match="not JSON-serialisable"):
            j.append(record)
        assert j.replay().records == []
