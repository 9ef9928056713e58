"""The one state table: every listed edge is legal, everything else is refused."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from crosstalk.core.states import (
    MACHINES,
    IllegalTransition,
    MessageState,
    check_transition,
    is_unresolved,
    machine,
)


def all_pairs() -> list[tuple[str, str, str]]:
    return [
        (kind, a, b)
        for kind, m in MACHINES.items()
        for a, b in itertools.product(sorted(m.states()), repeat=2)
    ]


@pytest.mark.parametrize(("kind", "prev", "new"), all_pairs())
def test_transition_legal_iff_in_table(kind: str, prev: str, new: str) -> None:
    legal = new in MACHINES[kind].edges[prev]
    if legal:
        check_transition(kind, prev, new)
    else:
        with pytest.raises(IllegalTransition):
            check_transition(kind, prev, new)


def test_initial_states() -> None:
    check_transition("message", None, MessageState.SUBMITTED)
    check_transition("message", None, MessageState.BOUNCED)
    with pytest.raises(IllegalTransition):
        check_transition("message", None, MessageState.ACCEPTED)
    with pytest.raises(IllegalTransition):
        check_transition("ask", None, "answered")


def test_dispatch_claim_is_never_resent() -> None:
    # Once dispatching, the only ways out are outcomes; going back to submitted would resend.
    out = MACHINES["message"].edges[MessageState.DISPATCHING]
    assert MessageState.SUBMITTED not in out
    assert MessageState.DISPATCHING not in out
    assert MessageState.DISPATCHING not in MACHINES["message"].edges[MessageState.UNKNOWN]


def test_unknown_names_rejected() -> None:
    with pytest.raises(IllegalTransition):
        check_transition("nope", None, "x")
    with pytest.raises(IllegalTransition):
        check_transition("message", "submitted", "teleported")
    with pytest.raises(IllegalTransition):
        check_transition("message", "teleported", "accepted")
    with pytest.raises(IllegalTransition):
        machine("nope")


def test_table_is_consistent() -> None:
    for kind, m in MACHINES.items():
        states = m.states()
        assert m.initial <= states, kind
        assert m.unresolved <= states, kind
        for targets in m.edges.values():
            assert targets <= states, kind
        # Terminal states are resolved: nothing could ever resolve them later.
        for s in states:
            if m.is_terminal(s):
                assert s not in m.unresolved or s == MessageState.RECOVERED, (kind, s)
    assert is_unresolved("ask", "open")
    assert not is_unresolved("ask", "answered")
    assert not is_unresolved("no-such-kind", "open")


@given(st.sampled_from(sorted(MACHINES)), st.data())
def test_random_walks_follow_table(kind: str, data: st.DataObject) -> None:
    m = MACHINES[kind]
    state = data.draw(st.sampled_from(sorted(m.initial)))
    check_transition(kind, None, state)
    for _ in range(10):
        if m.is_terminal(state):
            break
        nxt = data.draw(st.sampled_from(sorted(m.edges[state])))
        check_transition(kind, state, nxt)
        state = nxt
