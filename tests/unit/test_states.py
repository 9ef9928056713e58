"""The one state table: every listed edge is legal, everything else is refused."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from crosstalk.core.message import Kind
from crosstalk.core.states import (
    ASK_EVENT_FOR,
    DELIVERED,
    INJECTION_OUTCOMES,
    MACHINES,
    SEND_RESULTS,
    UNDELIVERED,
    AskEvent,
    AskState,
    ClaimEvent,
    ClaimStatus,
    IllegalTransition,
    MessageEvent,
    MessageState,
    ReplyEvent,
    ReplyState,
    TaskEvent,
    TaskState,
    ask_next,
    check_transition,
    claim_next,
    is_unresolved,
    machine,
    message_next,
    opens_obligation,
    process_event,
    receipt_settlement,
    releases_ask_slot,
    reply_event_for_send,
    reply_next,
    send_result_state,
    task_next,
)
from crosstalk.core.tasks import (
    TASK_EVENT_FOR,
    Completion,
    TaskMessage,
    derive_task,
    task_state_for,
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


# -- events: callers say what happened, the table says where it leads -------------------------

M = MessageState
ME = MessageEvent


def test_message_life_by_events() -> None:
    s = message_next(None, ME.ADMITTED)
    assert s is M.SUBMITTED
    s = message_next(s, ME.LOCKED_FOR_DISPATCH)
    assert s is M.DISPATCHING
    assert message_next(s, ME.INJECTED, M.QUEUED) is M.QUEUED
    assert message_next(s, ME.DISPATCH_INTERRUPTED) is M.UNKNOWN
    assert message_next(M.UNKNOWN, ME.SETTLED, M.ACCEPTED) is M.ACCEPTED
    assert message_next(None, ME.BOUNCED) is M.BOUNCED
    assert message_next(None, ME.REJECTED) is M.REJECTED
    assert message_next(M.SUBMITTED, ME.REJECTED) is M.REJECTED
    assert message_next(M.SUBMITTED, ME.RECOVERED) is M.RECOVERED
    assert message_next(M.SUBMITTED, ME.UNDELIVERABLE) is M.UNREACHABLE
    assert message_next(M.SUBMITTED, ME.CANCELED) is M.CANCELED


@pytest.mark.parametrize(("state", "event", "outcome"), [
    (M.ACCEPTED, ME.SETTLED, M.QUEUED),  # a delivered message is never re-settled
    (M.DISPATCHING, ME.LOCKED_FOR_DISPATCH, None),  # never locked twice
    (M.DISPATCHING, ME.INJECTED, M.REJECTED),  # not an injection outcome
    (M.DISPATCHING, ME.INJECTED, None),  # an outcome event without its outcome
    (M.UNKNOWN, ME.SETTLED, M.UNKNOWN),  # only positive evidence settles an unknown
    (M.UNKNOWN, ME.INJECTED, M.ACCEPTED),  # an ambiguous dispatch is never re-injected
    (M.SUBMITTED, ME.INJECTED, M.ACCEPTED),  # no injection without the claim
    (M.CANCELED, ME.LOCKED_FOR_DISPATCH, None),
    (None, ME.LOCKED_FOR_DISPATCH, None),
    (M.SUBMITTED, ME.ADMITTED, None),
    (M.SUBMITTED, ME.CANCELED, M.REJECTED),  # a fixed target is not negotiable
])
def test_illegal_message_events_raise_one_error(state: MessageState | None,
                                                event: MessageEvent,
                                                outcome: MessageState | None) -> None:
    with pytest.raises(IllegalTransition, match=r"not allowed|leads to"):
        message_next(state, event, outcome)


def test_every_machine_s_edges_are_its_events() -> None:
    """``edges`` (what replay and the task store check) is exactly what some event reaches."""
    for kind, m in MACHINES.items():
        for state, row in m.events.items():
            for event, target in row.items():
                for new in (target if isinstance(target, frozenset) else {target}):
                    outcome = new if isinstance(target, frozenset) else None
                    assert process_event(kind, state, event, outcome) == new
                    check_transition(kind, state, new)
        for event, target in m.starts.items():
            for new in (target if isinstance(target, frozenset) else {target}):
                outcome = new if isinstance(target, frozenset) else None
                assert process_event(kind, None, event, outcome) == new


def test_the_old_edge_list_is_unchanged() -> None:
    """The event table allows exactly the moves the edge whitelist before it did."""
    old = {
        "message": {
            "submitted": {"dispatching", "rejected", "recovered", "unreachable", "canceled"},
            "dispatching": {"accepted", "queued", "unknown", "unreachable"},
            "unknown": {"accepted", "queued", "unreachable"},
            **{s: set() for s in ("accepted", "queued", "rejected", "unreachable",
                                  "recovered", "bounced", "canceled")},
        },
        "ask": {"open": {"answered", "expired", "closed"}, "answered": set(),
                "expired": set(), "closed": set()},
        "task": {
            "submitted": {"working", "completed", "failed", "canceled", "rejected"},
            "working": {"completed", "failed", "canceled", "input_required"},
            "input_required": {"working", "completed", "failed", "canceled"},
            "completed": set(), "failed": set(), "canceled": set(), "rejected": set(),
        },
        "reply": {"pending": {"forwarded", "unreachable"}, "forwarded": set(),
                  "unreachable": set()},
        "claim": {"claimed": {"released", "claimed"}, "released": {"claimed"}},
    }
    initial = {"message": {"submitted", "rejected", "bounced"}, "ask": {"open"},
               "task": {"submitted", "rejected"}, "reply": {"pending"}, "claim": {"claimed"}}
    for kind, edges in old.items():
        assert {k: set(v) for k, v in MACHINES[kind].edges.items()} == edges, kind
        assert set(MACHINES[kind].initial) == initial[kind], kind
    assert {k for k, m in MACHINES.items() if m.unresolved} == set(old)


def test_ask_reply_claim_task_events() -> None:
    assert ask_next(None, AskEvent.OPENED) is AskState.OPEN
    for end, event in ASK_EVENT_FOR.items():
        assert ask_next(AskState.OPEN, event) is end
        with pytest.raises(IllegalTransition):
            ask_next(end, AskEvent.ANSWERED)
    assert reply_next(None, ReplyEvent.STAGED) is ReplyState.PENDING
    assert reply_next(ReplyState.PENDING, ReplyEvent.FORWARDED) is ReplyState.FORWARDED
    assert reply_next(ReplyState.PENDING, ReplyEvent.FAILED) is ReplyState.UNREACHABLE
    with pytest.raises(IllegalTransition):
        reply_next(ReplyState.FORWARDED, ReplyEvent.FAILED)
    assert claim_next(None, ClaimEvent.CLAIMED) is ClaimStatus.CLAIMED
    assert claim_next(ClaimStatus.CLAIMED, ClaimEvent.CLAIMED) is ClaimStatus.CLAIMED
    assert claim_next(ClaimStatus.CLAIMED, ClaimEvent.RELEASED) is ClaimStatus.RELEASED
    with pytest.raises(IllegalTransition):
        claim_next(None, ClaimEvent.RELEASED)
    with pytest.raises(IllegalTransition):
        claim_next(ClaimStatus.RELEASED, ClaimEvent.RELEASED)
    for target, event in TASK_EVENT_FOR.items():
        for prev in [None, *MACHINES["task"].states()]:
            legal = target in (MACHINES["task"].initial if prev is None
                               else MACHINES["task"].edges[prev])
            if legal:
                assert task_next(TaskState(prev) if prev else None, event) is target
    with pytest.raises(IllegalTransition):
        task_next(TaskState.COMPLETED, TaskEvent.STARTED)


def test_reachable_through_the_table() -> None:
    m = MACHINES["message"]
    assert m.reachable(M.SUBMITTED, M.ACCEPTED)
    assert m.reachable(None, M.UNKNOWN)
    assert not m.reachable(M.ACCEPTED, M.SUBMITTED)
    assert not m.reachable(M.DISPATCHING, M.SUBMITTED)
    assert not m.reachable(M.SUBMITTED, M.BOUNCED)


# -- state sets, each spelt once ------------------------------------------------------------


def test_state_sets() -> None:
    assert {M.ACCEPTED, M.QUEUED} == DELIVERED
    assert {M.REJECTED, M.UNREACHABLE} == UNDELIVERED
    assert {M.ACCEPTED, M.QUEUED, M.UNREACHABLE, M.UNKNOWN} == INJECTION_OUTCOMES
    assert {"accepted", "queued", "rejected", "unreachable", "unknown"} == SEND_RESULTS
    assert "accepted" in DELIVERED  # the sets answer for plain strings too


# -- couplings ------------------------------------------------------------------------------


def test_a_delivered_ask_opens_its_obligation_once() -> None:
    for state in MessageState:
        assert opens_obligation(Kind.ASK, None, state) is (state in DELIVERED)
        assert not opens_obligation(Kind.INFORM, None, state)
        assert not opens_obligation(Kind.ASK, AskState.OPEN, state)


def test_ask_slot_release_matches_the_receiver_rule() -> None:
    for state in MessageState:
        expected = state not in (M.ACCEPTED, M.QUEUED, M.UNKNOWN)
        assert releases_ask_slot(Kind.ASK, state) is expected
        assert not releases_ask_slot(Kind.COMMAND, state)


@pytest.mark.parametrize("state", list(MessageState))
@pytest.mark.parametrize("status", ["delivered", "denied", "expired", "held", "dropped", "x"])
def test_receipt_settlement_is_agent_apply_receipt_s_rule(state: MessageState,
                                                          status: str) -> None:
    # the rule as agent.Agent.apply_receipt spells it
    table = {"delivered": (M.ACCEPTED, None), "denied": (M.UNREACHABLE, "receipt_denied"),
             "expired": (M.UNREACHABLE, "receipt_expired")}
    expected = table.get(status) if state is M.UNKNOWN else None
    assert receipt_settlement(state, status) == expected
    if expected is not None:
        assert message_next(state, ME.SETTLED, expected[0]) is expected[0]


REASONS = [None, "no_such_agent", "ambiguous_name", "transport", "no_a2a_listener",
           "journal_unavailable"]


@pytest.mark.parametrize("state", [*SEND_RESULTS, "error", "weird"])
@pytest.mark.parametrize("reason", REASONS)
def test_send_result_to_reply_is_agent_forward_reply_s_rule(state: str,
                                                            reason: str | None) -> None:
    # the rule as agent.Agent._forward_reply spells it
    gone = reason in ("no_such_agent", "ambiguous_name")
    later = reason == "journal_unavailable"  # the receiver could not store it: may pass later
    old = (ReplyState.FORWARDED if state in ("accepted", "queued")
           else ReplyState.PENDING if later
           else ReplyState.UNREACHABLE if state in ("unreachable", "rejected") or gone
           else ReplyState.PENDING)
    event = reply_event_for_send(state, reason)
    new = ReplyState.PENDING if event is None else reply_next(ReplyState.PENDING, event)
    assert new is old
    assert send_result_state(state) == (state if state in SEND_RESULTS else "unknown")


# -- ADR 0004: the task a message implies --------------------------------------------------

ASKS: list[AskState | None] = [None, *AskState]
KINDS = [k.value for k in Kind]


def _adr_0004(state: MessageState, kind: str, ask: AskState | None,
              open_ask: bool) -> TaskState:
    """ADR 0004's table, row by row."""
    if state is M.SUBMITTED:
        return TaskState.SUBMITTED
    if state is M.CANCELED:
        return TaskState.CANCELED
    if state in (M.DISPATCHING, M.UNKNOWN) or open_ask:
        return TaskState.WORKING
    if state in (M.ACCEPTED, M.QUEUED) and kind == "ask":
        if ask is AskState.ANSWERED:
            return TaskState.COMPLETED
        return TaskState.FAILED if ask in (AskState.EXPIRED, AskState.CLOSED) else (
            TaskState.WORKING)
    if state in (M.ACCEPTED, M.QUEUED):
        return TaskState.COMPLETED
    if state is M.REJECTED:
        return TaskState.REJECTED
    return TaskState.FAILED


@pytest.mark.parametrize("state", list(MessageState))
def test_task_state_for_is_the_adr_table(state: MessageState) -> None:
    for kind in KINDS:
        for ask in ASKS:
            for open_ask in (False, True):
                assert task_state_for(state, kind, ask, open_ask=open_ask) is _adr_0004(
                    state, kind, ask, open_ask), (state, kind, ask, open_ask)


def test_derive_task_completion_and_status() -> None:
    asked = TaskMessage("q", M.ACCEPTED, "ask", ask=AskState.ANSWERED, reply_text="noon")
    later = TaskMessage("c", M.ACCEPTED, "inform")
    view = derive_task([asked, later], later, TaskState.WORKING)
    assert (view.target, view.completion, view.about, view.status_text) == (
        TaskState.COMPLETED, Completion.ANSWERED, asked, "noon")
    assert view.answered
    expired = TaskMessage("q", M.ACCEPTED, "ask", ask=AskState.EXPIRED)
    view = derive_task([expired], expired, TaskState.WORKING)
    assert (view.target, view.reason, view.status_text) == (
        TaskState.FAILED, "ask_expired", "accepted: ask_expired")
    rejected = TaskMessage("c", M.REJECTED, "inform", reason="policy")
    assert derive_task([rejected], rejected, TaskState.WORKING).target is TaskState.FAILED
    assert derive_task([rejected], rejected, TaskState.SUBMITTED).target is TaskState.REJECTED
    pending = TaskMessage("c", M.SUBMITTED, "inform")
    assert derive_task([pending], pending, TaskState.WORKING).target is TaskState.WORKING
