"""ADR 0004's message → task mapping in core equals the A2A server's, for every combination.

``crosstalk.a2a.tasks`` derives a task from its messages' receiver entries (``derive``,
``target_state``); ``crosstalk.core.states`` holds the same mapping on plain values so the
A2A layer can ask the one table. Until it does, this proves the two agree everywhere.
"""

from __future__ import annotations

import itertools

import pytest

from crosstalk.a2a import wire
from crosstalk.a2a.tasks import derive, target_state
from crosstalk.core.message import Kind, Sender
from crosstalk.core.states import (
    AskState,
    MessageState,
    TaskState,
)
from crosstalk.core.tasks import (
    Completion,
    TaskMessage,
    derive_task,
    task_state_for,
)
from crosstalk.receiver import Entry

ASKS: list[AskState | None] = [None, *AskState]
KINDS = [k.value for k in Kind]
SENDER = Sender("a1a1a1a1a1a1a1a1", name="alice")


def entry(mid: str, state: MessageState, kind: str, ask: AskState | None, *,
          reason: str | None = None, reply_text: str | None = None) -> Entry:
    return Entry(mid, SENDER, kind, state, "a2a", reason=reason, ask=ask,
                 reply_text=reply_text)


def plain(e: Entry) -> TaskMessage:
    return TaskMessage(e.message_id, e.state, e.kind, e.reason, e.ask, e.reply_text)


def test_completion_names_are_the_wire_s() -> None:
    assert Completion.DELIVERED.value == wire.COMPLETION_DELIVERED
    assert Completion.ANSWERED.value == wire.COMPLETION_ANSWERED


@pytest.mark.parametrize("state", list(MessageState))
def test_task_state_for_equals_target_state(state: MessageState) -> None:
    for kind, ask, open_ask in itertools.product(KINDS, ASKS, (False, True)):
        e = entry("m", state, kind, ask)
        assert task_state_for(state, kind, ask, open_ask=open_ask) is target_state(
            e, open_ask=open_ask), (state, kind, ask, open_ask)


def _same(entries: list[Entry], current: TaskState) -> None:
    latest = entries[-1]
    old = derive(entries, latest, current)
    new = derive_task([plain(e) for e in entries], plain(latest), current)
    assert new.target is old.target
    assert new.answered is old.answered
    assert new.about == plain(old.about)
    assert new.status_text == old.status_text
    assert (new.completion.value if new.completion else None) == old.metadata.get(
        wire.COMPLETION)
    assert new.reason == old.metadata.get(wire.REASON) or (
        not new.reason and wire.REASON not in old.metadata)


MESSAGES = [(s, k, a) for s in MessageState for k in KINDS for a in ASKS]


@pytest.mark.parametrize("current", list(TaskState))
def test_derive_task_equals_derive_for_one_message(current: TaskState) -> None:
    for (state, kind, ask), reason in itertools.product(MESSAGES, (None, "because")):
        _same([entry("m", state, kind, ask, reason=reason, reply_text="the answer")], current)


@pytest.mark.parametrize("first", MESSAGES, ids=lambda m: "-".join(str(x) for x in m))
def test_derive_task_equals_derive_for_two_messages(
        first: tuple[MessageState, str, AskState | None]) -> None:
    for (state, kind, ask), current in itertools.product(MESSAGES, TaskState):
        _same([entry("q", *first, reply_text="noon"),
               entry("c", state, kind, ask, reason="why")], current)
