"""The A2A method handler: SendMessage, GetTask, ListTasks, CancelTask (the SDK's seam).

CrossTalk plugs in at the SDK's documented seam, a
:class:`~a2a.server.request_handlers.RequestHandler`, and drives **the receiver chain**
(:mod:`crosstalk.receiver`) from it; nothing here re-implements dedupe, policy or dispatch.
Why not the SDK's ``DefaultRequestHandler`` + ``AgentExecutor``: it creates the task before
any CrossTalk check could run, cancels through the executor with no notion of a dispatch
lock, and has no owner scoping of continuations; every seed rule below would be fought
against it (ADR 0004).

SendMessage (seed §5)::

    decode  →  dedupe lookup  →  admission (waits, pending tasks)  →  receiver.admit
      →  task record  →  the agent's dispatch lane (receiver.dispatch)  →  [default wait]  →  Task

- ``unknown`` is never reported completed (seed 17c): a default-wait SendMessage returns the
  task in that state rather than block on evidence that may never come.
- A message the receiver cannot journal (a full disk) is refused before anything is
  accepted: a definite, retryable refusal (:func:`~crosstalk.a2a.errors.journal_unavailable_error`),
  never ``InternalError``, which a sender must read as "maybe delivered".
- A message waits SUBMITTED (and cancelable) in the lane until the messages before it were
  injected; CancelTask wins exactly when it runs before the lane's dispatch lock (seed 22).

Control requests (claim/release, seed §7): a SendMessage whose metadata carries
``crosstalk.control`` is authenticated like any other (the bearer names the claimer), then
handed to ``claim_handler`` instead of the receiver chain: it never reaches the session as
a message; :mod:`crosstalk.a2a.control` builds its answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from a2a.server.context import ServerCallContext
from a2a.server.events import Event
from a2a.server.request_handlers import RequestHandler
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import (
    ContentTypeNotSupportedError,
    InternalError,
    InvalidParamsError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from a2a.utils.proto_utils import validate_proto_required_fields
from a2a.utils.task import apply_history_length, validate_history_length
from google.protobuf.json_format import MessageToDict
from starlette.types import Message as AsgiMessage

from crosstalk.a2a import wire
from crosstalk.a2a.asgi import LIST_STATUS_KEY, RECEIVE_KEY, repaired_fields
from crosstalk.a2a.control import ClaimHandler, control_answer
from crosstalk.a2a.errors import (
    invalid_params,
    journal_unavailable_error,
    rejected_error,
    require_sender,
)
from crosstalk.a2a.liststatus import status_filter
from crosstalk.a2a.taskderive import inbound_copy
from crosstalk.a2a.tasks import Lane, TaskBook
from crosstalk.a2a.taskstore import copy_task, is_terminal
from crosstalk.core.message import Ingress, Kind, Message, Sender
from crosstalk.core.states import MessageState, TaskState
from crosstalk.core.tasks import task_state_for
from crosstalk.receiver import Inbound, Receiver, ReceiverUnavailable, Result
from crosstalk.store.commit import Group
from crosstalk.store.journal_errors import RecordTooLarge

log = logging.getLogger(__name__)

M = MessageState
T = TaskState

async def _wait_disconnect(receive: Callable[[], Awaitable[AsgiMessage]]) -> None:
    while True:
        message = await receive()
        if message.get("type") == "http.disconnect":
            return


class CrossTalkRequestHandler(RequestHandler):
    """The A2A 1.0 methods, driving the receiver chain; unimplemented ones get the spec's
    mandated errors (§3.3.4 capability validation)."""

    def __init__(self, receiver: Receiver, book: TaskBook, lane: Lane, *, name: str,
                 max_wait_seconds: float = 900.0,
                 claim_handler: ClaimHandler | None = None) -> None:
        self.receiver = receiver
        self.book = book
        self.lane = lane
        #: The agent's name (control answers say it); the server follows renames.
        self.name = name
        self.max_wait_seconds = max_wait_seconds
        #: Claim/release handler (set by the Agent); ``None`` refuses control requests.
        self.claim_handler = claim_handler
        self._stopping = False
        self._stop_event: asyncio.Event | None = None

    def start(self) -> None:
        self._stopping = False
        self._stop_event = None

    def stop(self) -> None:
        """Default waits return the task as it stands."""
        self._stopping = True
        if self._stop_event is not None:
            self._stop_event.set()
        self.book.wake_all()

    async def on_message_send(self, params: pb.SendMessageRequest,
                              context: ServerCallContext) -> pb.Task | pb.Message:
        return await self.send_message(params, context)

    async def on_get_task(self, params: pb.GetTaskRequest,
                          context: ServerCallContext) -> pb.Task | None:
        return self.get_task(params, context)

    async def on_list_tasks(self, params: pb.ListTasksRequest,
                            context: ServerCallContext) -> pb.ListTasksResponse:
        return self.list_tasks(params, context)

    async def on_cancel_task(self, params: pb.CancelTaskRequest,
                             context: ServerCallContext) -> pb.Task | None:
        return self.cancel_task(params, context)

    async def on_message_send_stream(self, params: pb.SendMessageRequest,
                                     context: ServerCallContext) -> AsyncGenerator[Event]:
        raise UnsupportedOperationError(message="Streaming is not supported by the agent")
        yield  # pragma: no cover  (makes this an async generator, as the dispatcher expects)

    async def on_subscribe_to_task(self, params: pb.SubscribeToTaskRequest,
                                   context: ServerCallContext) -> AsyncGenerator[Event]:
        raise UnsupportedOperationError(message="Streaming is not supported by the agent")
        yield  # pragma: no cover

    async def on_create_task_push_notification_config(
            self, params: pb.TaskPushNotificationConfig,
            context: ServerCallContext) -> pb.TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError

    async def on_get_task_push_notification_config(
            self, params: pb.GetTaskPushNotificationConfigRequest,
            context: ServerCallContext) -> pb.TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError

    async def on_list_task_push_notification_configs(
            self, params: pb.ListTaskPushNotificationConfigsRequest,
            context: ServerCallContext) -> pb.ListTaskPushNotificationConfigsResponse:
        raise PushNotificationNotSupportedError

    async def on_delete_task_push_notification_config(
            self, params: pb.DeleteTaskPushNotificationConfigRequest,
            context: ServerCallContext) -> None:
        raise PushNotificationNotSupportedError

    async def on_get_extended_agent_card(self, params: pb.GetExtendedAgentCardRequest,
                                         context: ServerCallContext) -> pb.AgentCard:
        # capabilities.extended_agent_card is false: the spec mandates UnsupportedOperation.
        raise UnsupportedOperationError(
            message="The agent does not support authenticated extended cards")

    # -- SendMessage -------------------------------------------------------------------

    async def send_message(self, params: pb.SendMessageRequest,
                           context: ServerCallContext) -> pb.Task:
        sender = require_sender(context)
        validate_proto_required_fields(params)
        validate_history_length(params.configuration)
        wait = not params.configuration.return_immediately
        msg_in = params.message
        if msg_in.HasField("metadata") and wire.CONTROL in msg_in.metadata.fields:
            return await self._control(params, sender)
        if msg_in.task_id:
            return await self._continue(params, sender, wait, context)
        fields, text = self._decode(msg_in)
        mid = msg_in.message_id
        prior = await self.receiver.settled(mid)  # a copy in flight is answered once durable
        if prior is not None:
            return await self._retry(params, sender, prior, wait, context)
        waiting = self._reserve_wait() if wait else False
        try:
            task_id = str(uuid.uuid4())
            reason = self.receiver.admission.reserve_task(task_id)
            if reason is not None:
                raise rejected_error(reason)
            context_id = msg_in.context_id or str(uuid.uuid4())
            msg = Message(
                message_id=mid, sender=sender, text=text, kind=fields.kind,
                delivery=fields.delivery, in_reply_to=fields.in_reply_to,
                context_id=context_id, task_id=task_id,
                deadline_seconds=fields.deadline_seconds if fields.kind is Kind.ASK else 0,
                hop_chain=fields.hop_chain, sent_at=self.receiver.clock(),
                repaired=repaired_fields(context))
            try:
                # Staged, not awaited: its record, the task's first record and the dispatch
                # lock go into one write (ADR 0046); each is written only if the one before is.
                # Lazy: the task's record below starts the write, after the lane has run.
                admitted = self.receiver.stage_admit(msg, lazy=True)
            except ReceiverUnavailable as exc:
                self.receiver.admission.release_task(task_id)
                log.error("message %s refused, nothing accepted: %s", mid, exc)
                raise journal_unavailable_error() from exc
            if isinstance(admitted, Result):
                self.receiver.admission.release_task(task_id)
                entry = self.receiver.entries.get(mid)
                if (admitted.duplicate or entry is None or entry.sender.key != sender.key
                        or entry.state is not M.REJECTED):
                    # transient (admission), or an id another sender holds: no task.
                    raise rejected_error(admitted.reason or admitted.state.value)
            else:
                entry = admitted
                self.book.note_pending(mid, msg.deadline_seconds)
            history = [inbound_copy(msg_in, task_id, context_id)]
            if entry.state is M.SUBMITTED:  # woken first: its lock shares the task's write
                self.lane.submit(entry)
            admission = entry.admission if entry.pending is entry.admission else None
            self.book.create_task(task_id, context_id, sender, entry, history, after=admission)
            # A return_immediately answer is the task as it is now: taken before the write,
            # which moves it on (the lock makes it working).
            snapshot = None if wait else self._snapshot(task_id)
            if admission is not None and not await self._admitted(
                    entry, admission, task_id=task_id, context_id=context_id, sender=sender,
                    history=history):
                snapshot = None  # the task was made anew, rejected
            return await self._respond(task_id, params, context, wait, snapshot)
        finally:
            if waiting:
                self.receiver.admission.release_wait()

    def _snapshot(self, task_id: str) -> pb.Task | None:
        now = self.book.store.lookup(task_id)
        return copy_task(now.task) if now is not None else None

    async def _admitted(self, entry: Inbound, admission: Group, *, task_id: str,
                        context_id: str, sender: Sender, history: list[pb.Message]) -> bool:
        """Once the write that carries a first message's admission is done: if the admission
        failed, so did the task's first record and the lock that followed it, and the sender
        is answered as an awaited admission would have been answered: too large is a
        rejected task (R10), any other failure accepted nothing. Whether it was written."""
        await admission.settled()
        if admission.written:
            return True
        self.lane.withdraw(entry)  # a retry of this message id is a new entry
        with contextlib.suppress(InternalError):
            await self.book.written(task_id)  # failed with it: forgotten, its slot released
        mid = entry.message_id
        self.book.forget_pending(mid)
        failure = admission.result
        if isinstance(failure, RecordTooLarge):
            rejected = self.receiver.entries.get(mid)  # journaled rejected by the receiver
            if rejected is not None and rejected.state is M.REJECTED:
                self.book.create_task(task_id, context_id, sender, rejected, history)
                return False
        log.error("message %s refused, nothing accepted: %s", mid, failure)
        raise journal_unavailable_error() from (
            failure if isinstance(failure, BaseException) else None)

    async def _control(self, params: pb.SendMessageRequest, sender: Sender) -> pb.Task:
        """A claim/release: the handler decides, the answer is an unstored terminal task."""
        msg_in = params.message
        fields, _ = self._decode(msg_in)
        if fields.control is None:
            raise invalid_params("bad_control", f"{wire.CONTROL} must be claim or release")
        if msg_in.task_id:
            raise invalid_params("bad_control", "a control request cannot continue a task")
        handler = self.claim_handler
        if handler is None:
            raise rejected_error("control_not_supported")
        try:
            result = await handler(sender, fields.control)
        except Exception as exc:
            log.exception("control %s from %s failed", fields.control, sender.agent_id)
            raise InternalError(message=f"control failed: {type(exc).__name__}") from exc
        task = control_answer(msg_in, fields.control, result, name=self.name,
                              now=self.receiver.clock())
        return apply_history_length(task, params.configuration)

    def _decode(self, msg_in: pb.Message) -> tuple[wire.RequestFields, str]:
        if not wire.valid_id(msg_in.message_id):
            raise invalid_params("bad_message_id", "messageId must be 1-128 printable characters")
        if msg_in.context_id and not wire.valid_id(msg_in.context_id):
            raise invalid_params("bad_context_id", "contextId must be 1-128 printable characters")
        texts: list[str] = []
        for part in msg_in.parts:
            if part.WhichOneof("content") != "text":
                raise ContentTypeNotSupportedError(
                    message="CrossTalk carries text parts only",
                    data={wire.ERROR_REASON: "text_only", wire.ERROR_STATE: M.REJECTED.value})
            texts.append(part.text)
        meta = MessageToDict(msg_in.metadata) if msg_in.HasField("metadata") else {}
        try:
            fields = wire.decode_request_metadata(meta)
        except wire.MetadataError as exc:
            raise invalid_params(exc.reason, str(exc)) from exc
        return fields, "\n".join(texts)

    def _reserve_wait(self) -> bool:
        reason = self.receiver.admission.reserve_wait()
        if reason is not None:
            raise rejected_error(reason)
        return True

    async def _retry(self, params: pb.SendMessageRequest, sender: Sender, prior: Inbound,
                     wait: bool, context: ServerCallContext) -> pb.Task:
        """Same (sender, messageId) again: the prior task and state, never a second inject."""
        if prior.sender.key != sender.key or prior.ingress != Ingress.A2A.value:
            raise rejected_error("message_id_conflict")
        task_id = self.book.store.task_for_message(prior.message_id)
        if task_id is None:
            if prior.continuation:
                if prior.state is M.REJECTED:
                    raise rejected_error(prior.reason or "rejected")
                raise rejected_error("message_id_conflict")
            # Admitted before a crash or a failed task write: give it its task now.
            msg_in = params.message
            task_id = prior.task_id or str(uuid.uuid4())
            context_id = msg_in.context_id or str(uuid.uuid4())
            if not is_terminal(task_state_for(prior.state, prior.kind, prior.ask)) and (
                    self.receiver.admission.reserve_task(task_id) is not None):
                raise rejected_error("too_many_pending_tasks")
            self.book.create_task(task_id, context_id, sender, prior,
                              [inbound_copy(msg_in, task_id, context_id)])
        stored = self.book.store.lookup(task_id)
        if stored is None or stored.owner != sender.agent_id:
            raise rejected_error("message_id_conflict")
        if params.message.task_id and params.message.task_id != task_id:
            raise rejected_error("message_id_conflict")
        if prior.state is M.SUBMITTED and prior.message is not None:
            # Never reached the lane (its task write failed, or a continuation stranded by a
            # restart, R2): the sender's retry re-runs it from policy. A no-op otherwise.
            self.lane.submit(prior, resume=True)
        waiting = False
        if wait:
            waiting = self.receiver.admission.reserve_wait() is None
        try:
            # No free wait slot: answer with the state as it stands rather than refuse a
            # retry of accepted work (admission never evicts, and never denies the past).
            return await self._respond(task_id, params, context, waiting)
        finally:
            if waiting:
                self.receiver.admission.release_wait()

    async def _continue(self, params: pb.SendMessageRequest, sender: Sender, wait: bool,
                        context: ServerCallContext) -> pb.Task:
        msg_in = params.message
        stored = self.book.store.owned(msg_in.task_id, sender.agent_id)
        if stored is None:
            raise TaskNotFoundError(message=f"Task {msg_in.task_id} not found")
        fields, text = self._decode(msg_in)
        mid = msg_in.message_id
        prior = await self.receiver.settled(mid)
        if prior is not None:  # a retry answers with the past, even if the task ended since
            return await self._retry(params, sender, prior, wait, context)
        if is_terminal(stored.state):
            raise UnsupportedOperationError(
                message=f"Task {msg_in.task_id} is in a terminal state "
                        f"({pb.TaskState.Name(stored.task.status.state)})")
        if msg_in.context_id and msg_in.context_id != stored.task.context_id:
            raise InvalidParamsError(message="contextId does not match the task's context")
        waiting = self._reserve_wait() if wait else False
        try:
            task_id = stored.task.id
            msg = Message(
                message_id=mid, sender=sender, text=text, kind=fields.kind,
                delivery=fields.delivery, in_reply_to=fields.in_reply_to,
                context_id=stored.task.context_id, task_id=task_id, continuation=True,
                deadline_seconds=fields.deadline_seconds if fields.kind is Kind.ASK else 0,
                hop_chain=fields.hop_chain, sent_at=self.receiver.clock(),
                repaired=repaired_fields(context))
            try:
                admitted = await self.receiver.admit(msg)  # policy runs again (seed 23)
            except ReceiverUnavailable as exc:
                log.error("continuation %s refused, nothing accepted: %s", mid, exc)
                raise journal_unavailable_error() from exc
            if isinstance(admitted, Result):
                raise rejected_error(admitted.reason or admitted.state.value)
            self.book.note_pending(mid, msg.deadline_seconds)
            task = copy_task(stored.task)
            task.history.append(inbound_copy(msg_in, task_id, stored.task.context_id))
            self.book.save(task, stored.owner, [*stored.refs, mid])
            self.book.apply(task_id)
            self.lane.submit(admitted)
            return await self._respond(task_id, params, context, wait)
        finally:
            if waiting:
                self.receiver.admission.release_wait()

    async def _respond(self, task_id: str, params: pb.SendMessageRequest,
                       context: ServerCallContext, wait: bool,
                       snapshot: pb.Task | None = None) -> pb.Task:
        """The answer: with ``wait``, the task once settled; without, the task as it is now
        (or as ``snapshot`` took it), once that is durable."""
        if snapshot is None and not wait:
            snapshot = self._snapshot(task_id)
        await self.book.written(task_id)
        if wait:
            await self._await_settled(task_id, context.state.get(RECEIVE_KEY))
            await self.book.written(task_id)
        stored = self.book.store.lookup(task_id)
        if stored is None:  # pragma: no cover  (tasks are never forgotten while served)
            raise InternalError(message="task vanished")
        if snapshot is not None:
            return apply_history_length(snapshot, params.configuration)
        failed = self.lane.errors.get(stored.refs[-1]) if stored.refs else None
        if wait and failed is not None and stored.state is T.SUBMITTED:
            raise InternalError(message=f"dispatch could not start: {failed}")
        return apply_history_length(copy_task(stored.task), params.configuration)

    def get_task(self, params: pb.GetTaskRequest, context: ServerCallContext) -> pb.Task:
        sender = require_sender(context)
        validate_proto_required_fields(params)
        validate_history_length(params)
        stored = self.book.store.owned(params.id, sender.agent_id)
        if stored is None:
            raise TaskNotFoundError(message=f"Task {params.id} not found")
        return apply_history_length(copy_task(stored.task), params)

    def list_tasks(self, params: pb.ListTasksRequest,
                   context: ServerCallContext) -> pb.ListTasksResponse:
        sender = require_sender(context)
        validate_history_length(params)
        # The status as the wire had it: the SDK's parse turned an unknown name into 0.
        raw = context.state.get(LIST_STATUS_KEY, params.status)
        page = self.book.store.list_for(sender.agent_id, params, status=status_filter(raw))
        for task in page.tasks:
            trimmed = apply_history_length(task, params)
            if trimmed is not task:
                task.CopyFrom(trimmed)
        return page

    def cancel_task(self, params: pb.CancelTaskRequest, context: ServerCallContext) -> pb.Task:
        """Cancel only what no dispatch has locked yet (seed 17f, 22).

        Synchronous from check to journal: the dispatch lane cannot lock it in between, so a
        cancel either wins (zero writes will happen) or reports TaskNotCancelable.
        """
        sender = require_sender(context)
        validate_proto_required_fields(params)
        stored = self.book.store.owned(params.id, sender.agent_id)
        if stored is None:
            raise TaskNotFoundError(message=f"Task {params.id} not found")
        if is_terminal(stored.state):
            raise TaskNotCancelableError(message=f"Task {params.id} is already "
                                                 f"{stored.state.value}")
        entries = [self.receiver.entries.get(mid) for mid in stored.refs]
        if not entries or any(e is None or not e.cancelable for e in entries):
            raise TaskNotCancelableError(
                message=f"Task {params.id} was already claimed for dispatch")
        try:
            for e in entries:
                assert e is not None
                self.receiver.cancel(e.message_id)
        except ReceiverUnavailable as exc:
            raise InternalError(message=f"journal unavailable: {exc}") from exc
        self.book.apply(stored.task.id)
        current = self.book.store.lookup(stored.task.id)
        assert current is not None
        return copy_task(current.task)

    async def _await_settled(self, task_id: str, receive: Any) -> None:
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.max_wait_seconds
        if self._stop_event is None:
            self._stop_event = asyncio.Event()
        watcher: asyncio.Task[None] | None = None
        if callable(receive):
            watcher = loop.create_task(_wait_disconnect(receive))
        stop = loop.create_task(self._stop_event.wait())
        try:
            while not self._stopping and not self.book.settled(task_id):
                remaining = give_up - loop.time()
                if remaining <= 0:
                    return
                event = self.book.changed(task_id)
                changed = loop.create_task(event.wait())
                waits: set[asyncio.Task[Any]] = {changed, stop}
                if watcher is not None:
                    waits.add(watcher)
                done, _ = await asyncio.wait(waits, timeout=remaining,
                                             return_when=asyncio.FIRST_COMPLETED)
                changed.cancel()
                if watcher is not None and watcher in done:
                    return  # the caller hung up: free the wait slot
        finally:
            stop.cancel()
            if watcher is not None:
                watcher.cancel()
