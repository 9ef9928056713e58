"""The send nudge (seed §4): a hint at 30, 60, 120, 240, ... sends per peer, never a guard."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from crosstalk.core.nudge import (
    NUDGE_FIRST,
    Nudge,
    NudgeCounter,
    combine_hint,
    is_threshold,
)

DOUBLINGS = [30, 60, 120, 240, 480]


def send_n(counter: NudgeCounter, peer: str, n: int, *,
           peer_name: str | None = None) -> list[Nudge]:
    fired = []
    for _ in range(n):
        nudge = counter.record(peer, "accepted", kind="inform", peer_name=peer_name)
        if nudge is not None:
            fired.append(nudge)
    return fired


def test_first_threshold_is_thirty() -> None:
    assert NUDGE_FIRST == 30


def test_fires_exactly_at_doubling_counts() -> None:
    counter = NudgeCounter()
    fired_at = []
    for i in range(1, 481):
        nudge = counter.record("peer-a", "accepted", kind="inform")
        if nudge is not None:
            assert nudge.peer == "peer-a"
            assert nudge.count == i
            fired_at.append(i)
    assert fired_at == DOUBLINGS
    assert counter.count("peer-a") == 480


@pytest.mark.parametrize("count", DOUBLINGS)
def test_threshold_edges(count: int) -> None:
    assert is_threshold(count)
    assert not is_threshold(count - 1)
    assert not is_threshold(count + 1)


def test_multiples_that_are_not_doublings_do_not_fire() -> None:
    assert not any(is_threshold(n) for n in (0, 1, 29, 90, 150, 180, 210, 270, 360, 450))


def test_hint_asks_about_progress_and_allows_stopping() -> None:
    counter = NudgeCounter()
    [nudge] = send_n(counter, "0123456789abcdef", 30, peer_name="reviewer")
    assert "reviewer" in nudge.hint
    assert "30" in nudge.hint
    assert "progress" in nudge.hint
    assert "stop" in nudge.hint
    assert "user" in nudge.hint
    assert "delivered" in nudge.hint


def test_hint_names_peer_key_without_a_name() -> None:
    counter = NudgeCounter()
    [nudge] = send_n(counter, "codex:thread-1", 30)
    assert "codex:thread-1" in nudge.hint


def test_peers_are_counted_independently() -> None:
    counter = NudgeCounter()
    assert send_n(counter, "a", 29) == []
    assert send_n(counter, "b", 29) == []
    # Together 58 sends, but neither peer reached 30.
    assert counter.count("a") == 29
    assert counter.count("b") == 29
    [nudge] = send_n(counter, "b", 1)
    assert nudge.peer == "b"
    assert counter.count("a") == 29
    [nudge] = send_n(counter, "a", 1)
    assert nudge.peer == "a"


@pytest.mark.parametrize(
    ("state", "flags"),
    [
        ("rejected", {}),
        ("unreachable", {}),
        ("unknown", {"no_such_agent": True}),
        ("accepted", {"retried_reply": True}),
    ],
)
def test_not_counted(state: str, flags: dict[str, bool]) -> None:
    counter = NudgeCounter()
    kind = "reply" if flags.get("retried_reply") else "inform"
    for _ in range(100):
        assert counter.record("p", state, kind=kind,
                              no_such_agent=flags.get("no_such_agent", False),
                              retried_reply=flags.get("retried_reply", False)) is None
    assert counter.count("p") == 0


@pytest.mark.parametrize("state", ["accepted", "queued", "unknown", "pending", "forwarded"])
@pytest.mark.parametrize("kind", ["inform", "command", "ask", "reply"])
def test_counted_outcomes_and_kinds(state: str, kind: str) -> None:
    counter = NudgeCounter()
    assert counter.record("p", state, kind=kind) is None
    assert counter.count("p") == 1


def test_uncounted_sends_do_not_shift_thresholds() -> None:
    counter = NudgeCounter()
    send_n(counter, "p", 29)
    assert counter.record("p", "unreachable", kind="ask") is None
    assert counter.record("p", "rejected", kind="command") is None
    nudge = counter.record("p", "queued", kind="ask")
    assert nudge is not None
    assert nudge.count == 30


def test_unknown_kind_and_empty_peer_refused() -> None:
    counter = NudgeCounter()
    with pytest.raises(ValueError, match="send kind"):
        counter.record("p", "accepted", kind="control")
    with pytest.raises(ValueError, match="peer"):
        counter.record("", "accepted", kind="inform")
    assert counter.count("p") == 0


def test_combine_hint_appends() -> None:
    nudge = Nudge("p", 30, "Check progress.")
    assert combine_hint(None, nudge) == "Check progress."
    assert combine_hint("", nudge) == "Check progress."
    combined = combine_hint("Target is idle.", nudge)
    assert combined.startswith("Target is idle.")
    assert combined.endswith("Check progress.")
    assert combined.index("Target is idle.") < combined.index("Check progress.")


def test_nudge_journal_record() -> None:
    assert Nudge("p", 60, "h").record().to_dict() == {"subject": "nudge", "peer": "p",
                                                      "count": 60}


def test_custom_first_doubles_from_it() -> None:
    counter = NudgeCounter(first=2)
    fired = [n.count for n in send_n(counter, "p", 20)]
    assert fired == [2, 4, 8, 16]
    with pytest.raises(ValueError, match="first"):
        NudgeCounter(first=0)


rarely = st.sampled_from([False, False, False, True])
# (peer, outcome, kind, no_such_agent, retried_reply, how many times in a row)
send_event = st.tuples(
    st.sampled_from(["a", "b", "c"]),
    st.sampled_from(["accepted", "queued", "unknown", "rejected", "unreachable"]),
    st.sampled_from(["inform", "command", "ask", "reply"]),
    rarely,
    rarely,
    st.integers(min_value=1, max_value=70),
)


@given(st.lists(send_event, max_size=40))
def test_nudges_fire_exactly_at_doubling_counts_for_any_sequence(
        events: list[tuple[str, str, str, bool, bool, int]]) -> None:
    counter = NudgeCounter()
    model: dict[str, int] = {}
    fired = 0
    steps = [(p, s, k, n, r) for p, s, k, n, r, times in events for _ in range(times)]
    for peer, state, kind, no_such_agent, retried in steps:
        nudge = counter.record(peer, state, kind=kind, no_such_agent=no_such_agent,
                               retried_reply=retried)
        counted = state not in ("rejected", "unreachable") and not no_such_agent and not retried
        if counted:
            model[peer] = model.get(peer, 0) + 1
        expect = counted and model[peer] in {30 * 2**k for k in range(20)}
        if expect:
            fired += 1
            assert nudge is not None
            assert (nudge.peer, nudge.count) == (peer, model[peer])
        else:
            assert nudge is None
    for peer in ("a", "b", "c"):
        assert counter.count(peer) == model.get(peer, 0)
    # Exactly one firing per doubling count each peer passed.
    assert fired == sum(sum(1 for k in range(20) if 30 * 2**k <= c) for c in model.values())


@given(st.integers(min_value=-10, max_value=200_000))
def test_is_threshold_matches_doubling_set(n: int) -> None:
    assert is_threshold(n) == (n in {30 * 2**k for k in range(15)})
