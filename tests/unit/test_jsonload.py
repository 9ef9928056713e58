"""``crosstalk.store.jsonload``: what a journal line or checkpoint part reads as is what the
standard library reads it as, for the JSON CrossTalk writes and for bytes that are not JSON;
and the collector pause a start runs under (``crosstalk.store.collector``) nests."""

from __future__ import annotations

import gc
import json
import re
import threading
import zlib
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from crosstalk.store import collector
from crosstalk.store.journal_format import decode_line
from crosstalk.store.jsonload import loads
from tests.support.values import same

LONE = ["\ud800", "\udbff", "\udc00", "\udfff", "\ud83d"]
text = st.lists(st.one_of(st.characters(), st.sampled_from(LONE), st.just("\x00")),
                max_size=8).map("".join)
#: What CrossTalk writes: integers within 64 bits (the one place orjson reads otherwise).
values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), text,
              st.floats(allow_nan=True, allow_infinity=True)),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(text, inner, max_size=4)), max_leaves=12)


def reference(data: bytes) -> Any:
    return json.loads(data)


@settings(max_examples=400, deadline=None)
@given(values, st.booleans())
def test_what_crosstalk_writes_reads_as_json_reads_it(value: Any, ascii_only: bool) -> None:
    # ensure_ascii=False is the journal's encoding, True the checkpoint's.
    data = json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    assert same(loads(data), reference(data))


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.binary(max_size=40),
                 st.binary(max_size=40).map(lambda b: b'{"' + b),
                 values.map(lambda v: json.dumps({"k": v}).encode()[:-1])))
def test_bytes_that_are_not_json_fail_as_json_fails(data: bytes) -> None:
    assume(re.search(rb"[0-9]{19}", data) is None)  # the documented difference
    try:
        want = reference(data)
    except ValueError:
        with pytest.raises(ValueError):  # noqa: PT011 (json's own messages vary)
            loads(data)
    else:
        assert same(loads(data), want)


@pytest.mark.parametrize("record", [
    {"text": "half an emoji \ud83d"}, {"deadline": float("nan")}, {"t": float("-inf")},
    {"nul": "a\x00b", "emoji": "\U0001f600"}, {"n": 2**63 - 1, "m": -2**63},
])
def test_a_journal_line_the_fast_reader_refuses_reads_as_before(record: dict[str, Any]) -> None:
    # Framed by hand: encode_line itself refuses NaN and lone surrogates, but a line an
    # earlier version (or another writer) left must read as json reads it.
    body = json.dumps(record, ensure_ascii=False).encode("utf-8", "surrogatepass")
    line = b'{"c":"%08x","r":%s}' % (zlib.crc32(body), body)
    got = decode_line(line)
    assert isinstance(got, dict)
    assert same(got, record)


def test_an_integer_beyond_64_bits_reads_as_a_float() -> None:
    # Documented (ADR 0021): nothing CrossTalk journals holds one.
    assert loads(b'{"n":18446744073709551616}') == {"n": 2.0 ** 64}


# -- the collector pause --------------------------------------------------------------------


@pytest.fixture
def collecting() -> Any:
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_pauses_nest_and_the_collector_resumes_after_the_outermost(collecting: None) -> None:
    with collector.paused():
        assert not gc.isenabled()
        with collector.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner end does not resume it
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off(collecting: None) -> None:
    gc.disable()
    with collector.paused():
        pass
    assert not gc.isenabled()


def test_an_exception_still_resumes_it(collecting: None) -> None:
    with pytest.raises(RuntimeError), collector.paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_overlapping_pauses_from_threads_resume_once_both_end(collecting: None) -> None:
    entered, release = threading.Event(), threading.Event()

    def other() -> None:
        with collector.paused():
            entered.set()
            release.wait(10)

    t = threading.Thread(target=other)
    with collector.paused():
        t.start()
        assert entered.wait(10)
    assert not gc.isenabled()  # the other thread's pause still holds
    release.set()
    t.join(10)
    assert gc.isenabled()
