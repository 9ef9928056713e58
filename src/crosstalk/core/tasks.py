"""ADR 0004's coupling of the message and task machines: a task's state from its messages.

The A2A task store saves the state a task's messages imply; it never picks one. This is that
mapping on plain values (:class:`TaskMessage`, what the receiver knows of each message), so
it can be tested without the A2A layer and read beside the table in
:mod:`crosstalk.core.states`:

- an answered ask anywhere in the task completes it (R6: any of its message ids may be the one
  answered); an open ask anywhere keeps it working;
- otherwise its latest message decides (:func:`task_state_for`, the ADR's table); an
  ``unknown`` dispatch is WORKING, never completed (seed 17c);
- only a task that never started may be rejected, and a pending continuation does not move a
  task back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from crosstalk.core.message import Kind
from crosstalk.core.states import (
    ASK_UNANSWERED,
    DELIVERED,
    AskState,
    MessageState,
    TaskEvent,
    TaskState,
)

M, A, T, TE = MessageState, AskState, TaskState, TaskEvent


class Completion(StrEnum):
    """Why a task completed (``crosstalk.completion`` on the wire)."""

    DELIVERED = "delivered"
    ANSWERED = "answered"


@dataclass(frozen=True)
class TaskMessage:
    """What the task mapping needs of one of a task's messages (the receiver's view)."""

    message_id: str
    state: MessageState
    kind: str
    reason: str | None = None
    ask: AskState | None = None
    reply_text: str | None = None


@dataclass(frozen=True)
class TaskView:
    """A task's state and what its status says, derived from its messages (ADR 0004)."""

    target: TaskState
    #: The message the status speaks about: the answered ask, else the latest message.
    about: TaskMessage
    completion: Completion | None
    reason: str | None
    status_text: str | None

    @property
    def answered(self) -> bool:
        return self.completion is Completion.ANSWERED


def task_state_for(state: MessageState, kind: str, ask: AskState | None, *,
                   open_ask: bool = False) -> TaskState:
    """The task state one message's receiver state implies (the ADR 0004 table)."""
    if state is M.SUBMITTED:
        return T.SUBMITTED
    if state is M.CANCELED:
        return T.CANCELED
    if state is M.DISPATCHING or open_ask or state is M.UNKNOWN:
        return T.WORKING
    if state in DELIVERED:
        if kind == Kind.ASK:
            if ask in ASK_UNANSWERED:
                return T.FAILED
            return T.WORKING if ask is not A.ANSWERED else T.COMPLETED
        return T.COMPLETED
    if state is M.REJECTED:
        return T.REJECTED
    return T.FAILED  # unreachable (recovered/bounced never belong to an A2A task)


def derive_task(messages: Sequence[TaskMessage], latest: TaskMessage,
                current: TaskState) -> TaskView:
    """A task's state from its messages: an answered ask completes it, an open ask anywhere
    keeps it working, else its latest message decides; only a task that never started may be
    rejected, and a pending continuation does not move a task back (ADR 0004)."""
    answered = next((m for m in messages if m.ask is A.ANSWERED), None)
    open_ask = any(m.ask is A.OPEN for m in messages)
    completion: Completion | None = None
    status_text: str | None = None
    reason = latest.reason
    if answered is not None:
        target, completion = T.COMPLETED, Completion.ANSWERED
        status_text = answered.reply_text or ""
    else:
        target = task_state_for(latest.state, latest.kind, latest.ask, open_ask=open_ask)
        if target is T.COMPLETED:
            completion = Completion.DELIVERED
        if latest.kind == Kind.ASK and latest.ask in ASK_UNANSWERED:
            assert latest.ask is not None
            reason = f"ask_{latest.ask.value}"
        if target in (T.REJECTED, T.FAILED):
            status_text = f"{latest.state.value}: {reason or 'no reason given'}"
    if target is T.REJECTED and current is not T.SUBMITTED:
        target = T.FAILED
    if target is T.SUBMITTED and current is not T.SUBMITTED:
        target = current
    return TaskView(target, answered or latest, completion, reason, status_text)


#: The event that moves a task to a state (the task store sees target states, ADR 0004).
TASK_EVENT_FOR: Mapping[TaskState, TaskEvent] = {
    T.SUBMITTED: TE.CREATED, T.WORKING: TE.STARTED, T.INPUT_REQUIRED: TE.NEEDS_INPUT,
    T.COMPLETED: TE.COMPLETED, T.FAILED: TE.FAILED, T.CANCELED: TE.CANCELED,
    T.REJECTED: TE.REJECTED,
}
