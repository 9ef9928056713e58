"""A task record's JSON is recognised without protobuf only when protobuf would read it.

``plain_state`` lets a restart leave finished tasks unparsed (issue 12, item 6). It may say
"parse to tell" (``None``) as often as it likes; what it must never do is vouch for a dict that
``ParseDict`` refuses, or name another state or id than the parse gives. And it must vouch for
what the store itself writes, or nothing would stay unparsed. ``Body.of`` likewise reads a
message's body off its record exactly when ``MessageSubmitted.message()`` can rebuild it.
"""

from __future__ import annotations

import copy
from typing import Any

from a2a.types import a2a_pb2 as pb
from google.protobuf.json_format import MessageToDict, ParseDict, ParseError
from hypothesis import given
from hypothesis import strategies as st

from crosstalk.a2a.taskderive import stamp
from crosstalk.a2a.taskjson import plain_state
from crosstalk.a2a.taskstore import Body, task_state, wire_state
from crosstalk.core.message import Ingress, Kind, Message, Sender
from crosstalk.core.records import MessageSubmitted, parse_record
from crosstalk.core.states import TaskState

TID = "878d63c7-0f6a-4bcd-a4e7-23566fe05d95"


def written(state: TaskState, *, answer: str | None = None) -> dict[str, Any]:
    """A task as ``JournalTaskStore.put`` journals it (MessageToDict, no history)."""
    task = pb.Task(id=TID, context_id="2fa592c7-1ef2-41f3-9b74-a678742a55ef",
                   status=pb.TaskStatus(state=wire_state(state)))
    task.metadata.update({"crosstalk.message_id": "01a233e5-5ee2", "crosstalk.kind": "ask",
                          "crosstalk.state": "accepted", "crosstalk.reason": "é ☃"})
    if answer is not None:
        msg = pb.Message(message_id="m", context_id=task.context_id, task_id=TID,
                         role=pb.ROLE_AGENT, parts=[pb.Part(text=answer)])
        msg.metadata.update({"crosstalk.in_reply_to": "01a233e5-5ee2"})
        task.status.message.CopyFrom(msg)
    stamp(task, 1796166999.803814912)
    return MessageToDict(task)


def test_what_the_store_writes_is_vouched_for_in_every_state() -> None:
    for state in TaskState:
        assert plain_state(written(state), TID) is state
    assert plain_state(written(TaskState.COMPLETED, answer="noon"), TID) is TaskState.COMPLETED
    no_timestamp = written(TaskState.WORKING)
    del no_timestamp["status"]["timestamp"]
    assert plain_state(no_timestamp, TID) is TaskState.WORKING


def test_a_dict_of_another_shape_is_left_to_the_parse() -> None:
    base = written(TaskState.COMPLETED)
    assert plain_state(base, "another-task") is None
    odd: list[dict[str, Any]] = [
        {**base, "history": []},
        {**base, "context_id": "x"},
        {**base, "status": {**base["status"], "state": 3}},
        {**base, "status": {**base["status"], "state": "TASK_STATE_AUTH_REQUIRED"}},
        {**base, "status": {**base["status"], "timestamp": "2026-02-30T00:00:00Z"}},
        {**base, "status": {**base["status"], "timestamp": "2026-12-01T23:16:39+01:00"}},
        {**base, "metadata": {"crosstalk.control_result": {"ok": True}}},
        {**base, "metadata": {"k": "\ud83d"}},
    ]
    for task in odd:
        assert plain_state(task, TID) is None, task


TEXT = st.one_of(st.text(max_size=8), st.sampled_from(["\ud83d", TID, "ROLE_AGENT"]))
SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-3, 9), TEXT)
VALUE = st.one_of(
    SCALAR, st.sampled_from([pb.TaskState.Name(v) for v in pb.TaskState.values()]),
    st.from_regex(r"\A[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}"
                  r"(\.[0-9]{1,10})?(Z|[+-]0[0-9]:00)\Z"),
    st.lists(st.dictionaries(st.sampled_from(["text", "url"]), SCALAR, max_size=2),
             max_size=2),
    st.dictionaries(TEXT, SCALAR, max_size=2))
BASES = [written(state, answer=answer) for state in TaskState for answer in (None, "noon")]
#: Where a mutation lands: the task, its status, the status message, a part, metadata.
PATHS = [(), ("status",), ("status", "message"), ("metadata",),
         ("status", "message", "metadata")]
KEYS = st.sampled_from(["id", "contextId", "status", "metadata", "history", "context_id",
                        "state", "timestamp", "message", "messageId", "role", "parts",
                        "taskId", "crosstalk.state", "other"])


@st.composite
def tasks(draw: st.DrawFn) -> dict[str, Any]:
    """The store's own task JSON, with a few keys changed, dropped or added."""
    task = copy.deepcopy(draw(st.sampled_from(BASES)))
    for _ in range(draw(st.integers(0, 3))):
        node: Any = task
        for key in draw(st.sampled_from(PATHS)):
            node = node.get(key) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            continue
        key = draw(KEYS)
        if draw(st.booleans()) and key in node:
            del node[key]
        else:
            node[key] = draw(VALUE)
    return task


TASK = tasks()


@given(TASK)
def test_what_is_vouched_for_parses_to_that_task_and_state(task: dict[str, Any]) -> None:
    state = plain_state(task, TID)
    if state is None:
        return
    try:
        parsed = ParseDict(task, pb.Task(), ignore_unknown_fields=True)
    except ParseError as exc:  # pragma: no cover - the property under test
        raise AssertionError(f"vouched for, but the parse refused it: {exc}") from exc
    assert parsed.id == TID
    assert task_state(parsed) is state


SENDER = Sender("a1" * 8, name="alice", ingress=Ingress.A2A)


@given(st.one_of(st.none(), TEXT), st.sampled_from(["inform", "ask", "command", "shout", ""]),
       st.sampled_from(["immediate", "next_turn", "later"]))
def test_a_body_is_read_exactly_when_the_message_can_be_rebuilt(
        text: str | None, kind: str, delivery: str) -> None:
    raw = MessageSubmitted.of(Message("m1", SENDER, "x", kind=Kind.ASK, task_id="t",
                                      context_id="c", in_reply_to="m0", hop_chain=("h",)),
                              None).to_dict()
    raw.update(text=text, kind=kind, delivery=delivery, seq=1, ts=1.0)
    rec = parse_record(raw)
    assert isinstance(rec, MessageSubmitted)
    msg, body = rec.message(), Body.of(rec)
    if msg is None:
        assert body is None
        return
    assert body is not None
    assert body == (msg.message_id, msg.text, msg.kind, msg.delivery, msg.deadline_seconds,
                    msg.in_reply_to, msg.hop_chain, msg.task_id, msg.context_id)
