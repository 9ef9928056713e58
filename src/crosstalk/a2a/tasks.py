"""The task book: each A2A task derived from its messages' receiver entries (ADR 0004).

A task is about its latest admitted message (the first, then each accepted continuation);
``metadata["crosstalk.state"]`` is that message's receiver state. The receiver's listener
(:meth:`TaskBook.on_entry`) re-derives the task on every state change and journals it through
the :class:`~crosstalk.a2a.taskstore.JournalTaskStore` when anything changed.

- The mapping is :mod:`crosstalk.core.tasks` (ADR 0004's table); here it is applied.
- A delivered (``accepted``/``queued``) inform or command completes (``crosstalk.completion:
  "delivered"``); an ask stays WORKING until ``receiver.end_ask`` answers it (COMPLETED,
  the reply as the status message, ``crosstalk.completion: "answered"``) or expires/closes
  it (FAILED). ``rejected`` → REJECTED (first message) / FAILED; ``unreachable`` → FAILED;
  ``canceled`` → CANCELED.
- ``unknown`` is never reported completed (seed 17c): the task stays WORKING with
  ``crosstalk.state: "unknown"``. A later ``resolve`` (or a reconciler calling
  ``receiver.resolve``) completes or fails it.

On a restart :meth:`TaskBook.restore` rebuilds the tasks from the journal (seed S12, R2);
open asks' deadlines are armed on the agent's dispatch lane, which expires them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import InternalError

from crosstalk.a2a import wire
from crosstalk.a2a.taskderive import (
    history_message,
    restored_history,
    stamp,
    task_message,
    task_metadata,
)
from crosstalk.a2a.taskreplay import TaskReplay
from crosstalk.a2a.taskstore import (
    Body,
    JournalTaskStore,
    StoredTask,
    TaskStoreError,
    copy_task,
    is_terminal,
    wire_state,
)
from crosstalk.config import RETENTION_SECONDS
from crosstalk.core.message import Kind, Sender
from crosstalk.core.replay import replay_into
from crosstalk.core.states import DELIVERED, AskState, IllegalTransition, MessageState, TaskState
from crosstalk.core.tasks import derive_task
from crosstalk.receiver import Inbound, Receiver
from crosstalk.recovery import Restore
from crosstalk.store.commit import Group
from crosstalk.store.journal import JournalError

log = logging.getLogger(__name__)

M = MessageState
T = TaskState

#: Names the status messages the server writes (uuid5 of the task, state and message).
NAMESPACE = uuid.UUID("5d1d8e4e-3a39-4d51-9a43-2f1c0c7e8a11")


class Lane(Protocol):
    """What the A2A layer needs from its agent's dispatch lane (ordered dispatch, ask timers)."""

    @property
    def errors(self) -> Mapping[str, str]:
        """Why a message's dispatch could not start, by message id."""

    @property
    def error_listeners(self) -> list[Callable[[str], None]]:
        """Called with a message id when its dispatch could not start."""

    def submit(self, entry: Inbound, *, resume: bool = False) -> None: ...

    def withdraw(self, entry: Inbound) -> None: ...

    def arm(self, message_id: str, deadline_at: float) -> None: ...

    def disarm(self, message_id: str) -> None: ...

    def is_armed(self, message_id: str) -> bool: ...


class TaskBook:
    """The tasks of one agent, kept in step with its receiver's entries."""

    def __init__(self, receiver: Receiver, lane: Lane, *, expire_asks: bool = True,
                 retention_seconds: float = RETENTION_SECONDS) -> None:
        self.receiver = receiver
        self.lane = lane
        self.expire_asks = expire_asks
        self.retention_seconds = retention_seconds
        self.store = JournalTaskStore(receiver.journal, clock=receiver.clock)
        #: Set while the server stops: no new deadline is armed.
        self.stopping = False
        #: The deadline (seconds) of each admitted message, until its ask opens or it ends.
        self._pending: dict[str, int] = {}
        self._ask_deadlines: dict[str, float] = {}
        self._changed: dict[str, asyncio.Event] = {}
        self._dirty: set[str] = set()
        lane.error_listeners.append(self._lane_error)

    def note_pending(self, message_id: str, deadline_seconds: int) -> None:
        """Remember an admitted message's deadline until its ask opens (then it is armed)."""
        self._pending[message_id] = deadline_seconds

    def forget_pending(self, message_id: str) -> None:
        """A message noted pending whose admission failed after all."""
        self._pending.pop(message_id, None)

    def changed(self, task_id: str) -> asyncio.Event:
        """Set at the task's next change (a default wait waits on it)."""
        return self._changed.setdefault(task_id, asyncio.Event())

    def wake_all(self) -> None:
        for event in self._changed.values():
            event.set()

    def _lane_error(self, message_id: str) -> None:
        task_id = self.store.task_for_message(message_id)
        if task_id is not None:
            event = self._changed.pop(task_id, None)
            if event is not None:
                event.set()

    def task_for_message(self, message_id: str) -> str | None:
        """The task a message belongs to (its first message or any continuation, R6)."""
        return self.store.task_for_message(message_id)

    def ask_of(self, message_id: str) -> str | None:
        """The ask a message answers for (R6): the message itself if it is an ask, else the
        ask its task was opened by, when the message is one of that task's continuations."""
        entry = self.receiver.entries.get(message_id)
        if entry is not None and entry.ask is not None:
            return message_id
        task_id = self.store.task_for_message(message_id)
        stored = self.store.lookup(task_id) if task_id is not None else None
        for ref in stored.refs if stored is not None else ():
            first = self.receiver.entries.get(ref)
            if first is not None and first.ask is not None:
                return ref
        return None

    def create_task(self, task_id: str, context_id: str, sender: Sender, entry: Inbound,
                    history: Sequence[pb.Message], *, after: Group | None = None) -> None:
        assert sender.agent_id is not None
        initial = T.REJECTED if entry.state is M.REJECTED else T.SUBMITTED
        task = pb.Task(id=task_id, context_id=context_id,
                       status=pb.TaskStatus(state=wire_state(initial)), history=list(history))
        # The first record carries the metadata the message already implies, in an initial
        # state; any further move (e.g. a retry finding it delivered) is a journaled change.
        composed = self._compose(StoredTask(task, sender.agent_id, [entry.message_id]))
        if composed is not None:
            composed.status.state = wire_state(initial)
            if initial is T.SUBMITTED:
                composed.status.ClearField("message")
            task = composed
        stamp(task, self.receiver.clock())
        self.store.put(task, owner=sender.agent_id, refs=[entry.message_id], staged=True,
                       after=after)
        group = self.store.writes[task_id]
        # The dispatch lock follows the task's first record (and shares its write): if that
        # fails, nothing is locked, and the sender's retry gives the message its task.
        entry.pending = entry.prerequisite = group
        self._watch(task_id, group, entry)
        if initial is T.REJECTED:
            self.receiver.admission.release_task(task_id)
        self.apply(task_id)

    def on_entry(self, entry: Inbound) -> None:
        """Receiver listener: every state change of a message that belongs to a task."""
        task_id = self.store.task_for_message(entry.message_id)
        if task_id is None:
            return
        if entry.ask is AskState.OPEN and entry.message_id not in self._ask_deadlines:
            seconds = self._pending.get(entry.message_id, 0)
            if seconds > 0:
                self._ask_deadlines[entry.message_id] = self.receiver.clock() + seconds
        if entry.state not in (M.SUBMITTED, M.DISPATCHING) and (
                entry.ask is not None or entry.kind != Kind.ASK.value
                or entry.state not in DELIVERED):
            self._pending.pop(entry.message_id, None)
        self.apply(task_id)

    def apply(self, task_id: str) -> None:
        """Re-derive one task from its messages; journal it if anything changed."""
        stored = self.store.lookup(task_id)
        if stored is None:
            return
        if is_terminal(stored.state):
            self.arm_deadlines(stored)
            return
        task = self._compose(stored)
        if task is None and task_id not in self._dirty:
            self.arm_deadlines(stored)
            return
        task = task or copy_task(stored.task)
        self.save(task, stored.owner, stored.refs)
        new = self.store.lookup(task_id)
        if new is not None:
            if is_terminal(new.state):
                self.receiver.admission.release_task(task_id)
            self.arm_deadlines(new)
        event = self._changed.pop(task_id, None)
        if event is not None:
            event.set()

    async def written(self, task_id: str) -> None:
        """Wait for the task's staged record: a task is reported only once it is durable.
        Raises :class:`InternalError` if its first record failed (the task is gone)."""
        group = self.store.writes.get(task_id)
        if group is None:
            return
        await group.settled()
        if self.store.lookup(task_id) is None:
            raise InternalError(message=f"journal unavailable: {group.result}")

    def _watch(self, task_id: str, group: Group, entry: Inbound | None = None) -> None:
        def done() -> None:
            if self.store.writes.get(task_id) is group:
                del self.store.writes[task_id]
            if entry is not None and entry.pending is group:
                entry.pending = None
            if group.written:
                return
            if entry is not None:  # its first record: as if it was never created
                log.error("task %s: journal refused its first record (%s)", task_id,
                          group.result)
                self.store.forget(task_id)
                self.receiver.admission.release_task(task_id)
                return
            log.error("task %s: journal refused the task record (%s); kept in memory",
                      task_id, group.result)
            self._dirty.add(task_id)  # the next change writes it again

        group.then(done)

    def save(self, task: pb.Task, owner: str, refs: Sequence[str]) -> None:
        try:
            # While the lane injects, its outcome's write comes next and carries this record
            # (a task's "working" no longer costs a write of its own before the injection).
            self.store.put(task, owner=owner, refs=refs, staged=True,
                           lazy=self.receiver.injecting)
            self._dirty.discard(task.id)
            self._watch(task.id, self.store.writes[task.id])
        except JournalError as exc:
            # The receiver's message records are the source of truth and are durable; the
            # task is re-derived from them on restore. Serve the new state, retry the record.
            log.error("task %s: journal refused the task record (%s); kept in memory",
                      task.id, exc)
            self.store.put(task, owner=owner, refs=refs, durable=False)
            self._dirty.add(task.id)
        except (IllegalTransition, TaskStoreError):
            log.exception("task %s: refusing an illegal task change", task.id)

    def _compose(self, stored: StoredTask) -> pb.Task | None:
        """The task as its messages now say it is, or ``None`` if nothing changed."""
        entries = [self.receiver.entries.get(mid) for mid in stored.refs]
        latest = entries[-1] if entries else None
        if latest is None:
            return None
        last = task_message(latest)
        d = derive_task([task_message(e) for e in entries if e is not None], last,
                        stored.state)
        task = copy_task(stored.task)
        task.status.state = wire_state(d.target)
        task.ClearField("metadata")
        task.metadata.update(task_metadata(d, last))
        task.status.ClearField("message")
        if d.status_text is not None:
            status = pb.Message(
                message_id=str(uuid.uuid5(NAMESPACE, f"{task.id}:{d.target.value}:"
                                                      f"{d.about.message_id}")),
                context_id=task.context_id, task_id=task.id, role=pb.ROLE_AGENT,
                parts=[pb.Part(text=d.status_text)])
            if d.answered:
                status.metadata.update({wire.IN_REPLY_TO: d.about.message_id})
                if not any(h.message_id == status.message_id for h in task.history):
                    task.history.append(status)
            task.status.message.CopyFrom(status)
        before = copy_task(stored.task)
        before.status.ClearField("timestamp")
        task.status.ClearField("timestamp")
        if task == before:
            return None
        stamp(task, self.receiver.clock())
        return task

    def settled(self, task_id: str) -> bool:
        """Whether a default-wait SendMessage may answer now."""
        stored = self.store.lookup(task_id)
        if stored is None or is_terminal(stored.state):
            return True
        latest = stored.refs[-1] if stored.refs else None
        if latest in self.lane.errors:
            return True
        entries = [self.receiver.entries.get(mid) for mid in stored.refs]
        if any(e is not None and e.ask is AskState.OPEN for e in entries):
            return False
        last = entries[-1] if entries else None
        return last is not None and last.state is M.UNKNOWN

    def arm_deadlines(self, stored: StoredTask) -> None:
        """Arm the lane's timer for each open ask of the task, disarm the others."""
        if not self.expire_asks:
            return
        for mid in stored.refs:
            entry = self.receiver.entries.get(mid)
            deadline = self._ask_deadlines.get(mid)
            if entry is None or entry.ask is not AskState.OPEN or deadline is None:
                self.lane.disarm(mid)
                if entry is not None and entry.ask not in (None, AskState.OPEN):
                    self._ask_deadlines.pop(mid, None)
                continue
            if self.lane.is_armed(mid) or self.stopping:
                continue
            self.lane.arm(mid, deadline)

    def restore(self, records: Iterable[Mapping[str, Any]] | TaskReplay | None = None,
                resumable: Sequence[Inbound] | None = None) -> list[Inbound]:
        """Rebuild the tasks from the journal on start (seed S12, R2); returns what resumes.

        ``records`` default to one streaming ``receiver.journal.replay()``; a
        :class:`~crosstalk.a2a.taskreplay.TaskReplay` is what a replay shared with the other
        readers of a start already read. ``resumable`` is what the receiver's restore
        returned; if it is ``None`` this method restores the receiver itself in the same
        pass (so call it exactly once per receiver, here or by the owner).

        Terminal tasks older than the retention window are dropped, open ones kept; outcomes
        the receiver journaled after a task's last record are applied; A2A first messages
        still ``submitted`` are re-run from policy, dispatch included, in the lane; open asks
        get their deadline timers back. A finished task stays unparsed, its history rebuilt
        on its first read.
        """
        replayed, restorer = self._replay(records, resumable)
        self.store.load(replayed, now=self.receiver.clock(),
                        retention_seconds=self.retention_seconds)
        if restorer is not None:
            resumable = restorer.finish()
        assert resumable is not None
        self._ask_deadlines.update(replayed.ask_deadlines)
        bodies = replayed.bodies
        self._restore_histories(bodies)
        for entry in resumable:
            if self.store.task_for_message(entry.message_id) is None:
                self._adopt(entry, bodies.get(entry.message_id))
        for stored in self.store.all():
            self.apply(stored.id)
        resumed = [e for e in resumable if self.store.task_for_message(e.message_id)]
        for entry in resumed:
            self.lane.submit(entry, resume=True)
        # Asks whose deadline passed while we were down expire now (or at start).
        for stored in self.store.open_tasks():
            self.arm_deadlines(stored)
        return resumed

    def _replay(self, records: Iterable[Mapping[str, Any]] | TaskReplay | None,
                resumable: Sequence[Inbound] | None) -> tuple[TaskReplay, Restore | None]:
        """The task replay :meth:`restore` works from, and the receiver's restore if it is
        to run too (in the same pass over the records; its settling comes later)."""
        if isinstance(records, TaskReplay):
            if resumable is None:
                raise ValueError("a TaskReplay comes with the receiver's resumable messages")
            return records, None
        replayed = TaskReplay()
        restorer = self.receiver.restorer() if resumable is None else None
        each = replay_into([replayed] if restorer is None else [replayed, restorer])
        if records is None:
            self.receiver.journal.replay(each)
        else:
            for raw in records:
                each(raw)
        return replayed, restorer

    def _restore_histories(self, bodies: Mapping[str, Body]) -> None:
        """Each loaded task's history, from its messages' journaled bodies (the record
        leaves it out); a finished task's waits for its first read."""
        for stored in self.store.all():
            refs = list(dict.fromkeys(stored.refs))
            answered = any((e := self.receiver.entries.get(m)) is not None
                           and e.ask is AskState.ANSWERED for m in refs)
            firsts = tuple((m, bodies.get(m)) for m in refs)
            if not stored.parsed and is_terminal(stored.state):
                # Nothing changes a finished task, so reading it later reads the same.
                stored.refs, stored.updated_at = refs, self.receiver.clock()
                stored.history = functools.partial(restored_history, firsts=firsts,
                                                   answered=answered)
                continue
            task = copy_task(stored.task)
            del task.history[:]
            task.history.extend(restored_history(task, firsts, answered))
            self.store.put(task, owner=stored.owner, refs=stored.refs, durable=False)
            if not is_terminal(stored.state):
                self.receiver.admission.pending_tasks.add(stored.id)

    def _adopt(self, entry: Inbound, msg: Body | None) -> None:
        """A first message journaled before its task record (a crash in between): its task."""
        owner = entry.sender.agent_id
        if msg is None or owner is None:
            return
        task_id = msg.task_id or str(uuid.uuid4())
        context_id = msg.context_id or str(uuid.uuid4())
        task = pb.Task(id=task_id, context_id=context_id,
                       status=pb.TaskStatus(state=wire_state(T.SUBMITTED)),
                       history=[history_message(msg, task_id, context_id)])
        stamp(task, self.receiver.clock())
        self.save(task, owner, [entry.message_id])
        self.receiver.admission.pending_tasks.add(task_id)
