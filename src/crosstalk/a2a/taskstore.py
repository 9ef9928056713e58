"""The journal-backed A2A task store (seed §5 "Journal", S12; review findings R1, R9).

Every task change is one journal record, written and fsynced **before** the save returns::

    TaskRecord(id=<task_id>, state=<TaskState>, owner=<agent_id of the creating sender>,
               refs=[<message ids of the task>],
               task=<the Task as JSON, MessageToDict, without ``history``>)

Why it is shaped like this:

- ``subject``/``id``/``state``/``refs`` are what retention reads (``crosstalk.core.retention``):
  an open task and its messages form one dependency set, so neither outlives the other.
- ``state`` is the task machine's answer (``crosstalk.core.states``) to the event that leads
  to the task's new state (``TASK_EVENT_FOR``); a task never leaves a terminal state. A save
  that changes only metadata is not a transition. :meth:`JournalTaskStore.load` folds the
  journal through the same table: an illegal task sequence on disk is reported, not adopted.
- ``history`` is left out of the record: every inbound message is already journaled by the
  receiver with its text, and copying up to 64 KiB per message into every task change could
  outgrow the journal's line cap (R10). :meth:`JournalTaskStore.load` returns tasks with an
  empty history; the server rebuilds it from the message records.
- Tasks are scoped to their **owner** (the verified sender that created them): a caller never
  sees, continues or cancels another principal's task (seed 17h, 23).

The class is also a plain SDK :class:`~a2a.server.tasks.TaskStore`, so anything written against
that interface works on it; the owner then comes from the call context's verified sender.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from a2a.server.context import ServerCallContext
from a2a.server.tasks import TaskStore
from a2a.types import a2a_pb2 as pb
from a2a.utils.constants import DEFAULT_LIST_TASKS_PAGE_SIZE
from a2a.utils.errors import InvalidParamsError
from a2a.utils.task import (
    ListTasksCursor,
    decode_list_tasks_cursor,
    encode_list_tasks_cursor,
    validate_page_size,
)
from google.protobuf.json_format import MessageToDict, ParseDict, ParseError

from crosstalk.config import RETENTION_SECONDS
from crosstalk.core.message import Sender
from crosstalk.core.records import TaskDeleted, TaskRecord
from crosstalk.core.replay import Folder
from crosstalk.core.states import Subject, TaskState, machine, task_next
from crosstalk.core.tasks import TASK_EVENT_FOR
from crosstalk.store.journal import Journal

log = logging.getLogger(__name__)

#: Where the verified sender sits in a ``ServerCallContext.state`` (set by the bearer guard).
SENDER_KEY = "crosstalk.sender"

_TO_WIRE: dict[TaskState, pb.TaskState] = {
    TaskState.SUBMITTED: pb.TASK_STATE_SUBMITTED,
    TaskState.WORKING: pb.TASK_STATE_WORKING,
    TaskState.INPUT_REQUIRED: pb.TASK_STATE_INPUT_REQUIRED,
    TaskState.COMPLETED: pb.TASK_STATE_COMPLETED,
    TaskState.FAILED: pb.TASK_STATE_FAILED,
    TaskState.CANCELED: pb.TASK_STATE_CANCELED,
    TaskState.REJECTED: pb.TASK_STATE_REJECTED,
}
_FROM_WIRE: dict[int, TaskState] = {int(v): k for k, v in _TO_WIRE.items()}


class TaskStoreError(Exception):
    """A save the store refuses (wrong owner, a state CrossTalk does not journal)."""


def wire_state(state: TaskState) -> pb.TaskState:
    return _TO_WIRE[state]


def task_state(task: pb.Task) -> TaskState:
    """The CrossTalk state of a wire task; AUTH_REQUIRED and UNSPECIFIED are not ours."""
    try:
        return _FROM_WIRE[int(task.status.state)]
    except KeyError:
        raise TaskStoreError(
            f"task {task.id!r} is in {pb.TaskState.Name(task.status.state)}, "
            "which CrossTalk never journals") from None


def is_terminal(state: TaskState) -> bool:
    return machine(Subject.TASK).is_terminal(state.value)


def sender_of(context: ServerCallContext | None) -> Sender | None:
    if context is None:
        return None
    sender = context.state.get(SENDER_KEY)
    return sender if isinstance(sender, Sender) and sender.verified else None


def _owner_of(context: ServerCallContext) -> str:
    sender = sender_of(context)
    if sender is None or sender.agent_id is None:
        raise TaskStoreError("no verified sender in the call context")
    return sender.agent_id


def copy_task(task: pb.Task) -> pb.Task:
    out = pb.Task()
    out.CopyFrom(task)
    return out


@dataclass
class StoredTask:
    """One task as the store holds it in memory (the full task, history included)."""

    task: pb.Task
    owner: str
    #: Message ids of the task, oldest first: the first message, then accepted continuations.
    refs: list[str] = field(default_factory=list)
    #: Journal ``ts`` of the latest record (retention of terminal tasks on restart).
    updated_at: float = 0.0

    @property
    def state(self) -> TaskState:
        return task_state(self.task)


class JournalTaskStore(TaskStore):
    """Tasks of one agent, durable in that agent's journal."""

    def __init__(self, journal: Journal, *, clock: Callable[[], float] = time.time) -> None:
        self.journal = journal
        self._clock = clock
        self._tasks: dict[str, StoredTask] = {}
        self._by_message: dict[str, str] = {}

    # -- CrossTalk API (synchronous: no await between a decision and its record) ----------

    def put(self, task: pb.Task, *, owner: str, refs: Sequence[str] | None = None,
            durable: bool = True) -> StoredTask:
        """Journal the task (unless ``durable`` is false), then make it current in memory.

        Raises :class:`~crosstalk.store.journal.JournalError` when the record is not durable
        (nothing changes then), :class:`TaskStoreError` for a foreign owner, and
        :class:`~crosstalk.core.states.IllegalTransition` for a move the table forbids.
        """
        prev = self._tasks.get(task.id)
        if not task.id:
            raise TaskStoreError("a task needs an id")
        if prev is not None and prev.owner != owner:
            raise TaskStoreError(f"task {task.id} belongs to another principal")
        new_state = task_state(task)
        if prev is None or prev.state is not new_state:
            # The event that leads to the new state, asked of the table from the current one.
            new_state = task_next(prev.state if prev is not None else None,
                                  TASK_EVENT_FOR[new_state])
        ids = list(dict.fromkeys(refs if refs is not None else (prev.refs if prev else [])))
        updated_at = self._clock()
        if durable:
            stored_json = copy_task(task)
            stored_json.ClearField("history")
            written = self.journal.append(TaskRecord(
                id=task.id, state=new_state, owner=owner, refs=tuple(ids),
                task=MessageToDict(stored_json)).to_dict())
            ts = written.get("ts")
            if isinstance(ts, int | float):
                updated_at = float(ts)
        stored = StoredTask(copy_task(task), owner, ids, updated_at)
        self._tasks[task.id] = stored
        for mid in ids:
            self._by_message[mid] = task.id
        return stored

    def lookup(self, task_id: str) -> StoredTask | None:
        return self._tasks.get(task_id)

    def owned(self, task_id: str, owner: str | None) -> StoredTask | None:
        """The task if ``owner`` created it; ``None`` otherwise (never "exists, not yours")."""
        stored = self._tasks.get(task_id)
        if stored is None or owner is None or stored.owner != owner:
            return None
        return stored

    def task_for_message(self, message_id: str) -> str | None:
        """The task a message id belongs to: its first message or any continuation (R6)."""
        return self._by_message.get(message_id)

    def all(self) -> list[StoredTask]:
        return list(self._tasks.values())

    def open_tasks(self) -> list[StoredTask]:
        return [s for s in self._tasks.values() if not is_terminal(s.state)]

    def forget(self, task_id: str) -> None:
        stored = self._tasks.pop(task_id, None)
        if stored is not None:
            for mid in stored.refs:
                if self._by_message.get(mid) == task_id:
                    del self._by_message[mid]

    def load(self, records: Iterable[Mapping[str, Any]], *, now: float | None = None,
             retention_seconds: float = RETENTION_SECONDS) -> list[StoredTask]:
        """Rebuild memory from journal records (no writes); the latest record per task wins.

        Terminal tasks whose last change is older than the retention window are dropped;
        open ones are always kept. Unreadable records are skipped. Returns what was kept.
        """
        now = self._clock() if now is None else now
        latest: dict[str, StoredTask] = {}
        folder = Folder()
        for raw in records:
            rec, violation = folder.step(raw)
            if isinstance(rec, TaskDeleted):
                latest.pop(rec.id, None)
                continue
            if not isinstance(rec, TaskRecord) or not rec.id:
                continue
            if violation is not None:
                log.warning("not adopting task record: %s", violation)
                continue
            if rec.owner is None or rec.task is None:
                continue
            try:
                task = ParseDict(dict(rec.task), pb.Task(), ignore_unknown_fields=True)
                task_state(task)
            except (ParseError, TaskStoreError, ValueError, TypeError) as exc:
                log.warning("skipping unreadable task record for %s: %s", rec.id, exc)
                continue
            if task.id != rec.id:
                continue
            latest[rec.id] = StoredTask(task, rec.owner, list(rec.refs),
                                        rec.ts if rec.ts is not None else now)
        self._tasks.clear()
        self._by_message.clear()
        kept: list[StoredTask] = []
        for tid, stored in latest.items():
            if is_terminal(stored.state) and stored.updated_at < now - retention_seconds:
                continue
            self._tasks[tid] = stored
            for mid in stored.refs:
                self._by_message[mid] = tid
            kept.append(stored)
        return kept

    # -- the SDK's TaskStore interface (owner = the call context's verified sender) --------

    async def save(self, task: pb.Task, context: ServerCallContext) -> None:
        self.put(task, owner=_owner_of(context))

    async def get(self, task_id: str, context: ServerCallContext) -> pb.Task | None:
        sender = sender_of(context)
        stored = self.owned(task_id, sender.agent_id if sender else None)
        return copy_task(stored.task) if stored else None

    async def list(self, params: pb.ListTasksRequest,
                   context: ServerCallContext) -> pb.ListTasksResponse:
        sender = sender_of(context)
        owner = sender.agent_id if sender else None
        return self.list_for(owner, params)

    async def delete(self, task_id: str, context: ServerCallContext) -> None:
        sender = sender_of(context)
        stored = self.owned(task_id, sender.agent_id if sender else None)
        if stored is None:
            return
        self.journal.append(TaskDeleted(id=task_id, refs=tuple(stored.refs)).to_dict())
        self.forget(task_id)

    # -- listing -------------------------------------------------------------------------

    def list_for(self, owner: str | None, params: pb.ListTasksRequest) -> pb.ListTasksResponse:
        """ListTasks semantics of the SDK's in-memory store, restricted to ``owner``'s tasks."""
        tasks = [copy_task(s.task) for s in self._tasks.values()
                 if owner is not None and s.owner == owner]
        if params.context_id:
            tasks = [t for t in tasks if t.context_id == params.context_id]
        if params.status:
            tasks = [t for t in tasks if t.status.state == params.status]
        if params.HasField("status_timestamp_after"):
            after_ns = params.status_timestamp_after.ToNanoseconds()
            tasks = [t for t in tasks if t.status.HasField("timestamp")
                     and t.status.timestamp.ToNanoseconds() >= after_ns]
        tasks.sort(key=_sort_key, reverse=True)
        start = 0
        if params.page_token:
            cursor = decode_list_tasks_cursor(params.page_token)
            if cursor is None:
                raise InvalidParamsError(message="invalid page token")
            after = cursor.sort_key()
            start = next((i for i, t in enumerate(tasks) if _sort_key(t) < after), len(tasks))
        if params.HasField("page_size"):
            validate_page_size(params.page_size)
        size = params.page_size or DEFAULT_LIST_TASKS_PAGE_SIZE
        page = tasks[start:start + size]
        token = ""
        if start + size < len(tasks) and page:
            has_ts, ts_ns, tid = _sort_key(page[-1])
            token = encode_list_tasks_cursor(
                ListTasksCursor(timestamp_ns=ts_ns if has_ts else None, task_id=tid))
        return pb.ListTasksResponse(tasks=page, next_page_token=token, page_size=size,
                                    total_size=len(tasks))


def _sort_key(task: pb.Task) -> tuple[bool, int, str]:
    has_ts = task.HasField("status") and task.status.HasField("timestamp")
    return has_ts, task.status.timestamp.ToNanoseconds() if has_ts else 0, task.id
