"""ADR 0004's message → task mapping (``crosstalk.core.tasks``), for every combination.

``expected`` below is the ADR's table written out as its rows read (docs/decisions/0004);
``core.tasks`` is what the A2A task book applies (``crosstalk.a2a.tasks``). Every message
state, kind, ask and "an open ask elsewhere" is checked for one message, and every pair of
messages for two, from every current task state; the A2A metadata built from the derived
view is checked against the table too.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest

from crosstalk.a2a import wire
from crosstalk.a2a.taskderive import task_message, task_metadata
from crosstalk.core.message import Kind, Sender
from crosstalk.core.states import AskState, MessageState, TaskState
from crosstalk.core.tasks import Completion, TaskMessage, derive_task, task_state_for
from crosstalk.receiver import Inbound

M, A, T = MessageState, AskState, TaskState
ASKS: list[AskState | None] = [None, *AskState]
KINDS = [k.value for k in Kind]
SENDER = Sender("a1a1a1a1a1a1a1a1", name="alice")

#: ADR 0004's table, "receiver says (latest message)" → task state, for the rows that do
#: not depend on the kind. recovered/bounced never belong to an A2A task: FAILED.
ROWS: dict[MessageState, TaskState] = {
    M.SUBMITTED: T.SUBMITTED, M.DISPATCHING: T.WORKING, M.UNKNOWN: T.WORKING,
    M.REJECTED: T.REJECTED, M.UNREACHABLE: T.FAILED, M.CANCELED: T.CANCELED,
}
#: accepted / queued: an inform or command completes; an ask by the state of its obligation.
DELIVERED_ASK: dict[AskState | None, TaskState] = {
    None: T.WORKING, A.OPEN: T.WORKING, A.ANSWERED: T.COMPLETED, A.EXPIRED: T.FAILED,
    A.CLOSED: T.FAILED,
}


def expected_state(state: MessageState, kind: str, ask: AskState | None,
                   open_ask: bool) -> TaskState:
    if state in (M.ACCEPTED, M.QUEUED):
        row = DELIVERED_ASK[ask] if kind == Kind.ASK.value else T.COMPLETED
    else:
        row = ROWS.get(state, T.FAILED)
    # "An open ask anywhere in the task keeps it WORKING" (once it left submitted).
    if open_ask and row not in (T.SUBMITTED, T.CANCELED):
        return T.WORKING
    return row


@dataclass(frozen=True)
class Expected:
    target: TaskState
    about: TaskMessage
    completion: Completion | None
    reason: str | None
    status_text: str | None


def expected(messages: list[TaskMessage], current: TaskState) -> Expected:
    """The ADR's prose around the table: an answered ask completes the task (the reply is
    the status), ask_expired/ask_closed as the reason, a failure's status names the state,
    only a task that never started is rejected, a pending continuation never moves it back."""
    latest = messages[-1]
    answered = next((m for m in messages if m.ask is A.ANSWERED), None)
    if answered is not None:
        target, about, completion = T.COMPLETED, answered, Completion.ANSWERED
        reason, status = latest.reason, answered.reply_text or ""
    else:
        open_ask = any(m.ask is A.OPEN for m in messages)
        target, about = expected_state(latest.state, latest.kind, latest.ask, open_ask), latest
        completion = Completion.DELIVERED if target is T.COMPLETED else None
        reason = latest.reason
        if latest.kind == Kind.ASK.value and latest.ask in (A.EXPIRED, A.CLOSED):
            reason = f"ask_{latest.ask.value}"
        status = (f"{latest.state.value}: {reason or 'no reason given'}"
                  if target in (T.REJECTED, T.FAILED) else None)
    if target is T.REJECTED and current is not T.SUBMITTED:
        target = T.FAILED
    if target is T.SUBMITTED and current is not T.SUBMITTED:
        target = current
    return Expected(target, about, completion, reason, status)


def entry(mid: str, state: MessageState, kind: str, ask: AskState | None, *,
          reason: str | None = None, reply_text: str | None = None) -> Inbound:
    return Inbound(mid, SENDER, kind, state, "a2a", reason=reason, ask=ask,
                 reply_text=reply_text)


def test_completion_names_are_the_wire_s() -> None:
    assert Completion.DELIVERED.value == wire.COMPLETION_DELIVERED
    assert Completion.ANSWERED.value == wire.COMPLETION_ANSWERED


@pytest.mark.parametrize("state", list(MessageState))
def test_task_state_for_is_the_table(state: MessageState) -> None:
    for kind, ask, open_ask in itertools.product(KINDS, ASKS, (False, True)):
        assert task_state_for(state, kind, ask, open_ask=open_ask) is expected_state(
            state, kind, ask, open_ask), (state, kind, ask, open_ask)


def _check(entries: list[Inbound], current: TaskState) -> None:
    messages = [task_message(e) for e in entries]
    latest = messages[-1]
    want = expected(messages, current)
    view = derive_task(messages, latest, current)
    assert view.target is want.target
    assert view.answered is (want.completion is Completion.ANSWERED)
    assert view.about == want.about
    assert view.completion is want.completion
    assert view.status_text == want.status_text
    assert view.reason == want.reason or (not view.reason and not want.reason)
    meta = task_metadata(view, latest)
    assert meta.get(wire.COMPLETION) == (want.completion.value if want.completion else None)
    assert meta.get(wire.REASON) == (want.reason or None)
    assert meta[wire.MESSAGE_ID] == latest.message_id
    assert meta[wire.STATE] == latest.state.value
    assert meta[wire.TASK_KIND] == latest.kind
    assert meta.get(wire.ASK) == (want.about.ask.value if want.about.ask else None)


MESSAGES = [(s, k, a) for s in MessageState for k in KINDS for a in ASKS]


@pytest.mark.parametrize("current", list(TaskState))
def test_one_message_task_is_the_table(current: TaskState) -> None:
    for (state, kind, ask), reason in itertools.product(MESSAGES, (None, "because")):
        _check([entry("m", state, kind, ask, reason=reason, reply_text="the answer")], current)


@pytest.mark.parametrize("first", MESSAGES, ids=lambda m: "-".join(str(x) for x in m))
def test_two_message_task_is_the_table(
        first: tuple[MessageState, str, AskState | None]) -> None:
    for (state, kind, ask), current in itertools.product(MESSAGES, TaskState):
        _check([entry("q", *first, reply_text="noon"),
                entry("c", state, kind, ask, reason="why")], current)
