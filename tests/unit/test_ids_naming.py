"""Agent ids, message ids and the naming rule (seed §3 "Agent identity" and "Name", CQ8/CQ9)."""

from __future__ import annotations

import hashlib
import time
import uuid
from pathlib import PurePosixPath

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from crosstalk.core.ids import (
    agent_id_for,
    is_agent_id,
    new_instance_id,
    new_message_id,
)
from crosstalk.core.naming import (
    FALLBACK_MIN_HEX,
    MAX_NAME_LEN,
    fallback_name,
    is_valid_name,
    name_candidates,
    normalize_name,
)

AGENT_ID = "0123456789abcdef"
HEX = "0123456789abcdef"

# -- agent ids ---------------------------------------------------------------------------------


def test_agent_id_known_vector() -> None:
    session = "4b22009a-7f3e-4c59-9d0b-6a4f0c1e2d3b"
    expected = hashlib.sha256(f"claude:{session}".encode()).hexdigest()[:16]
    assert agent_id_for("claude", session) == expected
    # A fixed literal, so a change of hash, separator or truncation cannot slip through even if
    # the line above were changed in step with the implementation.
    assert agent_id_for("codex", "t") == hashlib.sha256(b"codex:t").hexdigest()[:16]
    assert agent_id_for("codex", "t") == "98b699b301f1e8a9"


def test_agent_id_depends_on_harness_and_whole_session_ref() -> None:
    a = agent_id_for("codex", "01a1a3c2-0000-7000-8000-000000000001")
    b = agent_id_for("codex", "01a1a3c2-0000-7000-8000-000000000002")
    c = agent_id_for("claude", "01a1a3c2-0000-7000-8000-000000000001")
    assert len({a, b, c}) == 3
    assert all(is_agent_id(x) for x in (a, b, c))
    assert agent_id_for("codex", "01a1a3c2-0000-7000-8000-000000000001") == a  # stable


@pytest.mark.parametrize(
    ("harness", "session_ref"),
    [("", "s"), ("co:dex", "s"), (":", "s"), ("codex", "")],
)
def test_agent_id_rejects_bad_input(harness: str, session_ref: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the message is not the contract
        agent_id_for(harness, session_ref)


def test_agent_id_colon_in_session_ref_is_fine_and_unambiguous() -> None:
    # The harness may not contain ':', so "<harness>:<session_ref>" splits one way only.
    assert agent_id_for("a", "b:c") == hashlib.sha256(b"a:b:c").hexdigest()[:16]


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("0123456789abcdef", True),
        ("0123456789ABCDEF", False),
        ("0123456789abcde", False),
        ("0123456789abcdef0", False),
        ("0123456789abcdeg", False),
        ("0123456789abcdef\n", False),
        ("", False),
    ],
)
def test_is_agent_id(value: str, ok: bool) -> None:
    assert is_agent_id(value) is ok


# -- message and instance ids ------------------------------------------------------------------


def test_message_ids_are_uuid7_and_unique() -> None:
    ids = [new_message_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    for text in ids[:50]:
        parsed = uuid.UUID(text)
        assert parsed.version == 7
        assert parsed.variant == uuid.RFC_4122
        assert str(parsed) == text  # canonical lower-case form


def test_message_ids_are_time_ordered_across_a_sleep() -> None:
    before = new_message_id()
    time.sleep(0.005)
    after = new_message_id()
    assert before < after  # canonical uuid7 strings sort by creation time
    # The 48-bit millisecond timestamp moved forward.
    assert uuid.UUID(after).int >> 80 > uuid.UUID(before).int >> 80


def test_instance_ids_are_uuid7_and_fresh() -> None:
    a, b = new_instance_id(), new_instance_id()
    assert a != b
    assert uuid.UUID(a).version == 7


# -- fallback names ----------------------------------------------------------------------------


def test_fallback_format() -> None:
    assert fallback_name("codex", "/home/u/proj", AGENT_ID) == "codex-proj-01234567"
    assert fallback_name("codex", "/home/u/proj/", AGENT_ID) == "codex-proj-01234567"
    assert fallback_name("claude", "/", AGENT_ID) == "claude-root-01234567"
    assert fallback_name("claude", "", AGENT_ID) == "claude-root-01234567"
    assert fallback_name("codex", "/w/my proj (2)", AGENT_ID) == "codex-my-proj-2-01234567"


def test_fallback_extends_by_two_hex() -> None:
    names = [fallback_name("codex", "/w/proj", AGENT_ID, d) for d in range(8, 17, 2)]
    assert names == [
        "codex-proj-01234567",
        "codex-proj-0123456789",
        "codex-proj-0123456789ab",
        "codex-proj-0123456789abcd",
        "codex-proj-0123456789abcdef",
    ]


@pytest.mark.parametrize("digits", [0, 7, 17, -1])
def test_fallback_rejects_digit_counts_out_of_range(digits: int) -> None:
    with pytest.raises(ValueError, match="hex_digits"):
        fallback_name("codex", "/w", AGENT_ID, digits)


@pytest.mark.parametrize("bad", ["", "0123", "0123456789ABCDEF", "../../../../etc/x"])
def test_fallback_rejects_non_agent_ids(bad: str) -> None:
    with pytest.raises(ValueError, match="agent id"):
        fallback_name("codex", "/w", bad)


def test_fallback_with_a_long_cwd_fits_and_keeps_the_whole_suffix() -> None:
    name = fallback_name("codex", "/w/" + "d" * 200, AGENT_ID, 16)
    assert len(name) <= MAX_NAME_LEN
    assert is_valid_name(name)
    assert name.startswith("codex-d")
    assert name.endswith("-" + AGENT_ID)


def test_fallback_with_a_long_harness_stays_valid() -> None:
    # A harness label longer than ~45 characters must be trimmed too: trimming only the cwd part
    # yields a 90-character, invalid name.
    for digits in range(FALLBACK_MIN_HEX, 17, 2):
        name = fallback_name("h" * 80, "/w/proj", AGENT_ID, digits)
        assert is_valid_name(name), name
        assert name.endswith("-" + AGENT_ID[:digits])


# -- candidates --------------------------------------------------------------------------------


def test_candidates_session_name_first_then_fallbacks() -> None:
    got = list(name_candidates("claude", "/w/proj", AGENT_ID, "reviewer"))
    assert got == [
        "reviewer",
        "claude-proj-01234567",
        "claude-proj-0123456789",
        "claude-proj-0123456789ab",
        "claude-proj-0123456789abcd",
        "claude-proj-0123456789abcdef",
    ]


@pytest.mark.parametrize("session_name", [None, "", "   ", "///", ".."])
def test_candidates_without_a_usable_session_name(session_name: str | None) -> None:
    got = list(name_candidates("codex", "/w/proj", AGENT_ID, session_name))
    assert got[0] == "codex-proj-01234567"
    assert got[-1] == "codex-proj-0123456789abcdef"
    assert len(got) == 5
    assert len(set(got)) == len(got)


def test_candidates_dedupe_when_session_name_is_a_fallback() -> None:
    got = list(name_candidates("codex", "/w/proj", AGENT_ID, "codex-proj-01234567"))
    assert got == [
        "codex-proj-01234567",
        "codex-proj-0123456789",
        "codex-proj-0123456789ab",
        "codex-proj-0123456789abcd",
        "codex-proj-0123456789abcdef",
    ]


# -- normalization of hostile names ------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("reviewer", "reviewer"),
        ("  reviewer  ", "reviewer"),
        ("my work / fixes", "my-work-fixes"),
        ("../../etc/passwd", "etc-passwd"),
        ("..", None),
        (".", None),
        ("/", None),
        ("", None),
        ("   ", None),
        (None, None),
        ("-._-", None),
        (".hidden", "hidden"),
        ("a/../b", "a-..-b"),
        ("日本語", None),
        ("café", "caf"),
        ("naïve name", "na-ve-name"),
        ("tab\tand\nnewline", "tab-and-newline"),
        ("nul\x00byte", "nul-byte"),
        ("0123456789abcdef", None),  # would be mistaken for an agent id
        ("0123456789ABCDEF", "0123456789ABCDEF"),  # agent ids are lower-case only
        ("x" * 100, "x" * MAX_NAME_LEN),
        ("a" * 63 + "-b", "a" * 63),
    ],
)
def test_normalize_name(raw: str | None, expected: str | None) -> None:
    assert normalize_name(raw) == expected


def _assert_safe(name: str) -> None:
    assert is_valid_name(name), name
    assert len(name) <= MAX_NAME_LEN
    assert "/" not in name
    assert "\x00" not in name
    assert name not in {".", ".."}
    assert not name.startswith((".", "-"))
    assert not is_agent_id(name)
    # As a lock-file name it stays directly inside the names directory.
    lock = PurePosixPath("/state/names") / f"{name}.lock"
    assert lock.parent == PurePosixPath("/state/names")
    assert ".." not in lock.parts


@pytest.mark.parametrize(
    "raw", ["x", "a.b", "A-Z_0.9", "0123456789abcdeF", "1" * 64, "name.lock", "con"]
)
def test_valid_names_are_fixed_points(raw: str) -> None:
    assert is_valid_name(raw)
    assert normalize_name(raw) == raw


@pytest.mark.parametrize(
    "bad", ["", ".", "..", "-a", ".a", "_a", "a/b", "a b", "a\n", "é", "x" * 65, "a\x00"]
)
def test_invalid_names(bad: str) -> None:
    assert not is_valid_name(bad)


# -- properties --------------------------------------------------------------------------------

agent_ids = st.text(alphabet=HEX, min_size=16, max_size=16)
hostile_text = st.one_of(
    st.text(max_size=200),
    st.text(alphabet=st.sampled_from("/.-_ a\\\x00é日\n"), max_size=80),
    st.builds(lambda a, b: a + "/../" + b, st.text(max_size=20), st.text(max_size=20)),
    agent_ids,
)


@given(raw=st.one_of(st.none(), hostile_text))
@settings(deadline=None, max_examples=400)
@example(raw="../..")
@example(raw="0123456789abcdef")
@example(raw=" 0123456789abcdef ")
@example(raw="/0123456789abcdef/")
def test_normalize_name_never_yields_an_unsafe_name(raw: str | None) -> None:
    name = normalize_name(raw)
    if name is not None:
        _assert_safe(name)
        assert normalize_name(name) == name  # idempotent


@given(
    harness=st.one_of(st.sampled_from(["claude", "codex"]), st.text(max_size=90)),
    cwd=st.one_of(st.text(max_size=300), st.builds(lambda p: "/" + p, st.text(max_size=120))),
    agent_id=agent_ids,
    session_name=st.one_of(st.none(), hostile_text),
)
@settings(deadline=None, max_examples=400)
@example(harness="h" * 80, cwd="/w/proj", agent_id=AGENT_ID, session_name=None)
@example(harness="", cwd="", agent_id=AGENT_ID, session_name="")
@example(harness="codex", cwd="/", agent_id=AGENT_ID, session_name="codex-root-0123456789abcdef")
def test_name_candidates_are_valid_and_distinct(
    harness: str, cwd: str, agent_id: str, session_name: str | None
) -> None:
    got = list(name_candidates(harness, cwd, agent_id, session_name))
    assert got, "there is always at least one candidate"
    assert len(set(got)) == len(got)
    for name in got:
        assert len(name) <= MAX_NAME_LEN
        _assert_safe(name)
    fallbacks = [fallback_name(harness, cwd, agent_id, d) for d in range(8, 17, 2)]
    # Every fallback is offered, in order, and the last one carries the whole agent id (unique
    # to this session); only a session name that *is* one of them moves it to the front.
    assert set(fallbacks) <= set(got)
    assert fallbacks[-1].endswith("-" + agent_id)
    preferred = normalize_name(session_name)
    rest = got
    if preferred is not None:
        assert got[0] == preferred
        rest = got[1:]
    assert rest == [n for n in fallbacks if n != preferred]
    if preferred != fallbacks[-1]:
        assert got[-1] == fallbacks[-1]
    for digits, name in zip(range(8, 17, 2), fallbacks, strict=True):
        assert name.endswith("-" + agent_id[:digits])
