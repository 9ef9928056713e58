"""A task's parts derived from the receiver's messages (pure: the mapping itself is
:mod:`crosstalk.core.tasks`): its metadata, its history, the copies it keeps."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from a2a.types import a2a_pb2 as pb

from crosstalk.a2a import wire
from crosstalk.a2a.taskstore import Body
from crosstalk.core.message import Message
from crosstalk.core.tasks import TaskMessage, TaskView
from crosstalk.inbound import Inbound


def task_message(entry: Inbound) -> TaskMessage:
    """What the task mapping needs of a receiver entry."""
    return TaskMessage(entry.message_id, entry.state, entry.kind, entry.reason, entry.ask,
                       entry.reply_text)


def task_metadata(view: TaskView, latest: TaskMessage) -> dict[str, Any]:
    """The task's ``crosstalk.*`` metadata: about its latest message, and its ask."""
    meta: dict[str, Any] = {wire.MESSAGE_ID: latest.message_id,
                            wire.STATE: latest.state.value, wire.TASK_KIND: latest.kind}
    if view.reason:
        meta[wire.REASON] = view.reason
    if view.completion is not None:
        meta[wire.COMPLETION] = view.completion.value
    if view.about.ask is not None:
        meta[wire.ASK] = view.about.ask.value
    return meta


def stamp(task: pb.Task, now: float) -> None:
    task.status.timestamp.FromNanoseconds(int(now * 1_000_000_000))


def history_message(msg: Message | Body, task_id: str, context_id: str) -> pb.Message:
    out = pb.Message(message_id=msg.message_id, context_id=context_id, task_id=task_id,
                     role=pb.ROLE_USER, parts=[pb.Part(text=msg.text)])
    out.metadata.update(wire.encode_request_metadata(
        kind=msg.kind.value, delivery=msg.delivery.value,
        deadline_seconds=msg.deadline_seconds, in_reply_to=msg.in_reply_to,
        hop_chain=list(msg.hop_chain)))
    return out


def restored_history(task: pb.Task, firsts: Sequence[tuple[str, Body | None]],
                     answered: bool) -> list[pb.Message]:
    """A loaded task's history: each of its messages (``firsts``: id and journaled body, in
    order), then the answer, if an ask of it was answered."""
    out: list[pb.Message] = []
    for mid, body in firsts:
        if body is not None:
            out.append(history_message(body, task.id, task.context_id))
        else:
            out.append(pb.Message(message_id=mid, context_id=task.context_id,
                                  task_id=task.id, role=pb.ROLE_USER))
    status = task.status
    if answered and status.HasField("message") and status.message.role == pb.ROLE_AGENT:
        out.append(status.message)
    return out


def inbound_copy(msg_in: pb.Message, task_id: str, context_id: str) -> pb.Message:
    msg = pb.Message()
    msg.CopyFrom(msg_in)
    msg.task_id = task_id
    msg.context_id = context_id
    if not msg.role:
        msg.role = pb.ROLE_USER
    return msg
