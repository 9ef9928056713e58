"""The uds ingress's line splitter (``claude_wire.LineBuffer``): however a connection's bytes
are cut into reads, the lines that come out are the ones Claude's limits allow, in order, and
a line past the limits closes the connection rather than being read in part."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from crosstalk.ingress.claude_wire import BadFrame, Close, LineBuffer


def drain(buf: LineBuffer) -> list[str]:
    out: list[str] = []
    while (line := buf.next()) is not None:
        out.append(line)
    return out


def expected(data: bytes) -> list[str]:
    """What a whole-buffer split gives: non-blank lines, a final fragment counted at EOF."""
    parts = data.split(b"\n")
    lines = [p + b"\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])
    return [s for p in lines if (s := p.decode()).strip()]


line_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",),
                                            blacklist_characters="\n"), max_size=40)


@given(st.lists(line_text, max_size=8), st.booleans(), st.data())
def test_any_cut_of_the_bytes_gives_the_same_lines(texts: list[str], ended: bool,
                                                   data: st.DataObject) -> None:
    raw = "\n".join(texts).encode() + (b"\n" if ended else b"")
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=6)))
    buf = LineBuffer(max_line=100)
    got: list[str] = []
    start = 0
    for cut in [*cuts, len(raw)]:
        buf.feed(raw[start:cut])
        start = cut
        got += drain(buf)
    buf.end()
    got += drain(buf)
    assert got == expected(raw)
    assert buf.next() is None


def test_a_line_over_the_limit_closes() -> None:
    buf = LineBuffer(max_line=10)
    buf.feed(("x" * 11 + "\n").encode())
    with pytest.raises(Close) as exc:
        buf.next()
    assert exc.value.reason == "line_too_long"


def test_a_line_at_the_limit_is_read() -> None:
    buf = LineBuffer(max_line=10)
    buf.feed(("é" * 10 + "\n").encode())  # 10 characters, 20 bytes
    assert buf.next() == "é" * 10 + "\n"


def test_an_unended_line_is_cut_off_as_it_passes_the_byte_bound() -> None:
    buf = LineBuffer(max_line=10)
    buf.feed(b"y" * buf.max_bytes)  # at the bound: still waiting for its end
    assert buf.next() is None
    with pytest.raises(Close):
        buf.feed(b"y")


def test_bytes_that_are_not_utf8_are_a_bad_frame_not_a_close() -> None:
    buf = LineBuffer(max_line=100)
    buf.feed(b"\xff\xfe{}\n{\"ok\":1}\n")
    with pytest.raises(BadFrame):
        buf.next()
    assert buf.next() == '{"ok":1}\n'  # the next line is still there for whoever reads on


def test_rest_is_what_came_after_the_last_line_read() -> None:
    buf = LineBuffer(max_line=100)
    buf.feed(b'{"a":1}\n{"b"')
    assert buf.next() == '{"a":1}\n'
    assert buf.rest() == b'{"b"'
    assert buf.next() is None  # not whole yet
    buf.end()
    assert buf.next() == '{"b"'  # a final fragment is a line at EOF
    assert buf.rest() == b""
