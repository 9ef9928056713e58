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
- **A loaded task is parsed when it is first read.** A restart reads the task records as the
  journal streams by (:class:`TaskReplay`, one reader of the shared replay) and keeps, per
  task, the latest record's JSON; ``ParseDict`` (and the history rebuild) runs on the first
  access of :attr:`StoredTask.task`, so a 24 h journal's thousands of finished tasks cost
  nothing until someone asks for one. Whether a record reads is still decided at load, the
  cheap way for the shape ``put`` writes (:mod:`crosstalk.a2a.taskjson`), by a parse for
  anything else (issue 12, item 6).

The class is not an SDK ``TaskStore``: our request handler is the store's one user, and the
SDK's task package (its event queues, push senders, in-memory stores) would load with every
agent for it (ADR 0044). A ``task_deleted`` record, written by that interface before, still
reads.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from a2a.server.context import ServerCallContext
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

from crosstalk.a2a.liststatus import status_filter
from crosstalk.config import RETENTION_SECONDS
from crosstalk.core.message import DeliveryMode, Kind, Sender
from crosstalk.core.records import (
    MessageSubmitted,
    TaskRecord,
)
from crosstalk.core.states import Subject, TaskState, machine, task_next
from crosstalk.core.tasks import TASK_EVENT_FOR
from crosstalk.store.commit import Group
from crosstalk.store.journal import Journal

if TYPE_CHECKING:
    from crosstalk.a2a.taskreplay import TaskReplay

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


def copy_task(task: pb.Task) -> pb.Task:
    out = pb.Task()
    out.CopyFrom(task)
    return out


#: Rebuilds a loaded task's history once its JSON is parsed (the A2A task book's).
HistoryOf = Callable[[pb.Task], Sequence[pb.Message]]


class Body(NamedTuple):
    """What a task's history needs of one journaled message: the fields of its
    :class:`~crosstalk.core.message.Message` a history entry shows, without the sender,
    binding and claims its record also carries (a restart keeps one per message)."""

    message_id: str
    text: str
    kind: Kind
    delivery: DeliveryMode
    deadline_seconds: int
    in_reply_to: str | None
    hop_chain: tuple[str, ...]
    task_id: str | None
    context_id: str | None

    @classmethod
    def of(cls, rec: MessageSubmitted) -> Body | None:
        """The body ``rec`` holds; ``None`` exactly when ``rec.message()`` is (no text, or a
        kind or delivery that is not ours). Read off the record: building the whole message
        for each of a journal's thousands cost a tenth of a restart."""
        kind, delivery = _KINDS.get(rec.kind), _DELIVERIES.get(rec.delivery)
        if rec.text is None or kind is None or delivery is None:
            return None
        return cls(rec.id, rec.text, kind, delivery, rec.deadline_seconds, rec.in_reply_to,
                   rec.hop_chain, rec.task_id, rec.context_id)


_KINDS: Mapping[str, Kind] = {k.value: k for k in Kind}
_DELIVERIES: Mapping[str, DeliveryMode] = {d.value: d for d in DeliveryMode}


class StoredTask:
    """One task as the store holds it in memory (the full task, history included).

    A task loaded from the journal may still be its record's JSON (:meth:`unread`): it is
    parsed, and its history rebuilt, on the first read of :attr:`task`. Its state, owner and
    refs are known without that.
    """

    __slots__ = ("_raw", "_state", "_task", "history", "id", "owner", "refs", "updated_at")

    def __init__(self, task: pb.Task, owner: str, refs: list[str] | None = None,
                 updated_at: float = 0.0) -> None:
        self._fill(task.id, task, owner, refs, updated_at)

    @classmethod
    def unread(cls, task_id: str, raw: Mapping[str, Any], *, state: TaskState, owner: str,
               refs: list[str], updated_at: float) -> StoredTask:
        """A task kept as the JSON of its record (:func:`~crosstalk.a2a.taskjson.plain_state`
        vouched that it reads, in ``state``)."""
        stored = cls.__new__(cls)
        stored._fill(task_id, None, owner, refs, updated_at)
        stored._raw, stored._state = raw, state
        return stored

    def _fill(self, task_id: str, task: pb.Task | None, owner: str, refs: list[str] | None,
              updated_at: float) -> None:
        self.id = task_id
        self._task = task
        self._raw: Mapping[str, Any] | None = None
        self._state: TaskState | None = None
        self.owner = owner
        #: Message ids of the task, oldest first: the first message, then continuations.
        self.refs: list[str] = refs if refs is not None else []
        #: Journal ``ts`` of the latest record (retention of terminal tasks on restart).
        self.updated_at = updated_at
        #: Set on an unread task: its history, rebuilt when it is parsed.
        self.history: HistoryOf | None = None

    def copy(self) -> StoredTask:
        """A copy the store's later changes to this one do not reach (a parsed task's
        protobuf is copied too; a JSON one is never written to)."""
        out = StoredTask.__new__(StoredTask)
        task = None
        if self._task is not None:
            task = pb.Task()
            task.CopyFrom(self._task)
        out._fill(self.id, task, self.owner, list(self.refs), self.updated_at)
        out._raw, out._state, out.history = self._raw, self._state, self.history
        return out

    @property
    def task(self) -> pb.Task:
        if self._task is None:
            self._task = self._parse()
        return self._task

    @property
    def parsed(self) -> bool:
        """Whether :attr:`task` exists as a protobuf yet (a loaded task waits for its first
        read)."""
        return self._task is not None

    @property
    def state(self) -> TaskState:
        if self._task is None and self._state is not None:
            return self._state
        return task_state(self.task)

    def _parse(self) -> pb.Task:
        raw, self._raw = self._raw or {}, None
        history, self.history = self.history, None
        try:
            task = ParseDict(dict(raw), pb.Task(), ignore_unknown_fields=True)
        except (ParseError, ValueError, TypeError) as exc:  # plain_state vouched it reads
            log.error("task record for %s did not read after all (%s); serving its state "
                      "only", self.id, exc)
            task = pb.Task(id=self.id, status=pb.TaskStatus(
                state=wire_state(self._state or TaskState.FAILED)))
        if history is not None:
            task.history.extend(history(task))
        return task


class JournalTaskStore:
    """Tasks of one agent, durable in that agent's journal."""

    def __init__(self, journal: Journal, *, clock: Callable[[], float] = time.time) -> None:
        self.journal = journal
        #: Each task's staged record still being written (``put(staged=True)``).
        self.writes: dict[str, Group] = {}
        self._clock = clock
        self._tasks: dict[str, StoredTask] = {}
        self._by_message: dict[str, str] = {}

    # -- CrossTalk API (synchronous: no await between a decision and its record) ----------

    def put(self, task: pb.Task, *, owner: str, refs: Sequence[str] | None = None,
            durable: bool = True, staged: bool = False, after: Group | None = None,
            lazy: bool = False) -> StoredTask:
        """Journal the task (unless ``durable`` is false), then make it current in memory.

        ``staged``: the record goes into the journal's next shared write (group commit) and
        the task is current at once; :attr:`writes` holds the write until it is done, and
        whoever reports the task waits for it (:meth:`TaskBook.written`); ``after``: it is
        written only if that group is (the staged admission of its first message); ``lazy``:
        it rides with the journal's next write (:meth:`GroupCommit.stage`).

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
            record = TaskRecord(id=task.id, state=new_state, owner=owner, refs=tuple(ids),
                                task=MessageToDict(stored_json)).to_dict()
            if staged:
                self.writes[task.id] = self.journal.commit.stage([record], after=after,
                                                                 lazy=lazy)
            else:
                ts = self.journal.append(record).get("ts")
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

    def load(self, replayed: TaskReplay, *, now: float | None = None,
             retention_seconds: float = RETENTION_SECONDS) -> list[StoredTask]:
        """Rebuild memory from what a :class:`~crosstalk.a2a.taskreplay.TaskReplay` read of
        the journal (no writes); the latest record per task wins.

        Terminal tasks whose last change is older than the retention window are dropped; open
        ones are always kept. Unreadable records were skipped. Returns what was kept; tasks
        whose record vouched for its JSON stay unparsed.
        """
        now = self._clock() if now is None else now
        self._tasks.clear()
        self._by_message.clear()
        kept: list[StoredTask] = []
        for tid, stored in replayed.latest.items():
            if tid in replayed.undated:
                stored.updated_at = now
            if is_terminal(stored.state) and stored.updated_at < now - retention_seconds:
                continue
            self._tasks[tid] = stored
            for mid in stored.refs:
                self._by_message[mid] = tid
            kept.append(stored)
        return kept

    # -- listing -------------------------------------------------------------------------

    def list_for(self, owner: str | None, params: pb.ListTasksRequest, *,
                 status: int | None = None) -> pb.ListTasksResponse:
        """ListTasks semantics of the SDK's in-memory store, restricted to ``owner``'s tasks;
        ``status`` as the wire had it (:mod:`crosstalk.a2a.liststatus`), else from params."""
        status = status_filter(params.status) if status is None else status
        tasks = [copy_task(s.task) for s in self._tasks.values()
                 if owner is not None and s.owner == owner]
        if params.context_id:
            tasks = [t for t in tasks if t.context_id == params.context_id]
        if status:
            tasks = [t for t in tasks if t.status.state == status]
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
