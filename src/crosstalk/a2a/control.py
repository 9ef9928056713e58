"""The answer to a control request (claim/release, seed §7): a task created already terminal.

COMPLETED when the claim or release took effect, REJECTED when policy refused it, FAILED when
the target could not record it — with ``crosstalk.control_result`` in its metadata. That task
is not stored (GetTask does not find it): the durable record is the claim in the target's
journal.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from a2a.types import a2a_pb2 as pb

from crosstalk.a2a import wire
from crosstalk.a2a.taskderive import inbound_copy, stamp
from crosstalk.a2a.tasks import NAMESPACE
from crosstalk.a2a.taskstore import wire_state
from crosstalk.core.message import Sender
from crosstalk.core.policy import ControlResult
from crosstalk.core.states import MessageState, TaskState

M = MessageState
T = TaskState

#: Applies a verified sender's claim/release (``"claim"`` | ``"release"``) at this agent.
ClaimHandler = Callable[[Sender, str], Awaitable[ControlResult]]


def control_answer(msg_in: pb.Message, op: str, result: ControlResult, *, name: str,
                   now: float) -> pb.Task:
    """The terminal task that answers the control request ``msg_in`` (``op`` was applied)."""
    task_id = str(uuid.uuid4())
    context_id = msg_in.context_id or str(uuid.uuid4())
    state = (T.COMPLETED if result.ok else T.FAILED if result.failed else T.REJECTED)
    verb = "claimed" if op == "claim" else "released"
    summary = (f"{verb}: {name} is now {result.role}" if result.ok
               else f"not {verb}: {result.reason or 'no reason given'}")
    status = pb.Message(message_id=str(uuid.uuid5(NAMESPACE, f"{task_id}:control")),
                        context_id=context_id, task_id=task_id, role=pb.ROLE_AGENT,
                        parts=[pb.Part(text=summary)])
    task = pb.Task(id=task_id, context_id=context_id,
                   status=pb.TaskStatus(state=wire_state(state), message=status),
                   history=[inbound_copy(msg_in, task_id, context_id), status])
    meta: dict[str, Any] = {
        wire.MESSAGE_ID: msg_in.message_id,
        wire.STATE: M.ACCEPTED.value if result.ok else M.REJECTED.value,
        wire.CONTROL_RESULT: result.to_dict()}
    if result.reason:
        meta[wire.REASON] = result.reason
    task.metadata.update(meta)
    stamp(task, now)
    return task
