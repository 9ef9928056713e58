"""Retention by dependency set (seed R3), as a pure function."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from crosstalk.core.retention import plan, record_ids, unresolved_ids

DAY = 24 * 3600.0
NOW = 10 * DAY
OLD = NOW - 2 * DAY
YOUNG = NOW - 60


def rec(ts: float, **fields: Any) -> dict[str, Any]:
    return {"ts": ts, **fields}


def test_young_records_always_kept() -> None:
    records = [rec(YOUNG, subject="message", id="m", state="accepted")]
    assert plan(records, NOW, DAY) == [True]


def test_old_resolved_dropped() -> None:
    records = [
        rec(OLD, subject="message", id="m", state="submitted"),
        rec(OLD, subject="message", id="m", state="dispatching"),
        rec(OLD, subject="message", id="m", state="accepted"),
    ]
    assert plan(records, NOW, DAY) == [False, False, False]


def test_open_ask_keeps_whole_dependency_set() -> None:
    records = [
        rec(OLD, type="dedupe", id="m1", refs=["sender-a"]),
        rec(OLD, subject="message", id="m1", state="accepted", text="original body"),
        rec(OLD, type="task", id="t1", refs=["m1", "ctx-1"]),
        rec(OLD, type="route", id="r1", refs=["t1"]),  # reaches m1 only through t1
        rec(OLD, subject="ask", id="m1", state="open"),
        rec(OLD, subject="message", id="other", state="accepted"),  # unrelated
    ]
    assert plan(records, NOW, DAY) == [True, True, True, True, True, False]


def test_answered_ask_releases_its_set() -> None:
    records = [
        rec(OLD, subject="message", id="m1", state="accepted"),
        rec(OLD, subject="ask", id="m1", state="open"),
        rec(OLD, subject="ask", id="m1", state="answered"),
    ]
    assert plan(records, NOW, DAY) == [False, False, False]


def test_latest_state_wins_per_subject() -> None:
    # The message is resolved, but its ask (same id, other subject) is still open.
    records = [
        rec(OLD, subject="ask", id="m", state="open"),
        rec(OLD, subject="message", id="m", state="accepted"),
    ]
    assert unresolved_ids(records) == {"m"}


def test_unknown_is_kept_until_resolved() -> None:
    records = [rec(OLD, subject="message", id="m", state="unknown")]
    assert plan(records, NOW, DAY) == [True]


def test_records_without_timestamp_are_kept() -> None:
    assert plan([{"subject": "message", "id": "m", "state": "accepted"}], NOW, DAY) == [True]


def test_record_ids_ignores_junk() -> None:
    assert record_ids({"id": 3, "refs": ["a", 4, "", None, "b"]}) == ["a", "b"]
    assert record_ids({"refs": "not-a-list"}) == []


ids = st.sampled_from([f"id{i}" for i in range(6)])
states = st.sampled_from(["submitted", "dispatching", "accepted", "unknown", "open", "answered"])
records_st = st.lists(
    st.fixed_dictionaries(
        {"ts": st.sampled_from([OLD, YOUNG]), "id": ids},
        optional={
            "subject": st.sampled_from(["message", "ask"]),
            "state": states,
            "refs": st.lists(ids, max_size=3),
        },
    ),
    max_size=30,
)


@given(records_st)
def test_never_drops_anything_unresolved_work_touches(records: list[dict[str, Any]]) -> None:
    keep = plan(records, NOW, DAY)
    open_ids = unresolved_ids(records)
    for r, k in zip(records, keep, strict=True):
        if r["ts"] == YOUNG or set(record_ids(r)) & open_ids:
            assert k
    # Dropping is closed under linkage: a kept record never links to an id whose records all
    # went, unless it was kept for being young.
    kept_ids = {i for r, k in zip(records, keep, strict=True) if k and r["ts"] == OLD
                for i in record_ids(r)}
    for r, k in zip(records, keep, strict=True):
        if set(record_ids(r)) & kept_ids:
            assert k
