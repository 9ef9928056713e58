"""One agent's A2A server: the official a2a-sdk JSON-RPC binding (spec 1.0) on uvicorn.

The SDK does the wire: JSON-RPC parsing and error mapping (``create_jsonrpc_routes``), the
Agent Card route, the protobuf types. CrossTalk plugs in at the SDK's documented seam, a
:class:`~a2a.server.request_handlers.RequestHandler`, and drives **the receiver chain**
(:mod:`crosstalk.receiver`) from it; nothing here re-implements dedupe, policy or dispatch.
Why not the SDK's ``DefaultRequestHandler`` + ``AgentExecutor``: it creates the task before
any CrossTalk check could run, cancels through the executor with no notion of a dispatch
claim, and has no owner scoping of continuations; every seed rule below would be fought
against it (ADR 0004).

Request path (seed §5)::

    bearer guard (sender = registry.agent_for_token)  →  body cap (256 KiB, before decoding)
      →  SDK JSON-RPC dispatcher  →  A2AServer.send_message
           decode  →  dedupe lookup  →  admission (waits, pending tasks)  →  receiver.admit
           →  task record  →  dispatch lane (receiver.dispatch)  →  [default wait]  →  Task

Task semantics (ADR 0004):

- A task is about its latest admitted message (the first, then each accepted continuation);
  ``metadata["crosstalk.state"]`` is that message's receiver state.
- ``accepted``/``queued`` complete an inform or command (``crosstalk.completion:
  "delivered"``); an ask stays WORKING until ``receiver.close_ask`` answers it (COMPLETED,
  the reply as the status message, ``crosstalk.completion: "answered"``) or expires/closes
  it (FAILED). ``rejected`` → REJECTED (first message) / FAILED; ``unreachable`` → FAILED;
  ``canceled`` → CANCELED.
- ``unknown`` is never reported completed (seed 17c): the task stays WORKING with
  ``crosstalk.state: "unknown"``, and a default-wait SendMessage returns it in that state
  rather than block on evidence that may never come. A later ``resolve`` (or a reconciler
  calling ``receiver.resolve``) completes or fails it.
- Dispatch runs in one ordered lane per agent, so a message waits SUBMITTED (and cancelable)
  until the messages before it were injected; CancelTask wins exactly when it runs before
  the lane's dispatch claim (seed 22).

Control requests (claim/release, seed §7): a SendMessage whose metadata carries
``crosstalk.control`` is authenticated like any other (the bearer names the claimer), then
handed to ``control_handler`` instead of the receiver chain: it never reaches the session as
a message. Its answer is a task created already terminal — COMPLETED when the claim or
release took effect, REJECTED when policy refused it, FAILED when the target could not record
it — with ``crosstalk.control_result`` in its metadata. That task is not stored (GetTask does
not find it): the durable record is the claim in the target's journal.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import socket
import time
import uuid
from collections.abc import (
    AsyncGenerator,
    Awaitable,
    Callable,
    Generator,
    Iterable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from typing import Any

import uvicorn
from a2a.auth.user import User
from a2a.server.context import ServerCallContext
from a2a.server.events import Event
from a2a.server.jsonrpc_models import JSONParseError, JSONRPCError
from a2a.server.request_handlers import RequestHandler, build_error_response
from a2a.server.routes import (
    DefaultServerCallContextBuilder,
    create_agent_card_routes,
    create_jsonrpc_routes,
)
from a2a.types import a2a_pb2 as pb
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH, PROTOCOL_VERSION_1_0
from a2a.utils.errors import (
    A2AError,
    ContentTypeNotSupportedError,
    InternalError,
    InvalidParamsError,
    InvalidRequestError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from a2a.utils.proto_utils import validate_proto_required_fields
from a2a.utils.task import apply_history_length, validate_history_length
from google.protobuf.json_format import MessageToDict
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.types import Message as AsgiMessage

from crosstalk import __version__
from crosstalk.a2a import wire
from crosstalk.a2a.taskstore import (
    SENDER_KEY,
    JournalTaskStore,
    StoredTask,
    TaskStoreError,
    copy_task,
    is_terminal,
    sender_of,
    wire_state,
)
from crosstalk.config import RETENTION_SECONDS
from crosstalk.core.admission import Limits
from crosstalk.core.message import Ingress, Kind, Message, Sender
from crosstalk.core.policy import PRIMARY, SUBAGENT, ControlResult
from crosstalk.core.states import AskState, IllegalTransition, MessageState, TaskState
from crosstalk.receiver import Entry, Receiver, ReceiverUnavailable, Result, message_from_record
from crosstalk.store.journal import JournalError
from crosstalk.store.registry import Descriptor, Registry

log = logging.getLogger(__name__)

M = MessageState
T = TaskState

RPC_PATH = "/"
#: The ASGI scope key the bearer guard puts the verified sender under.
SCOPE_SENDER = "crosstalk.sender"
_RECEIVE_KEY = "crosstalk.receive"
_TOKEN_CACHE_SECONDS = 1.0
_MAX_TOKEN_LEN = 512
#: An oversize body is read and discarded up to this many times the cap before answering, so
#: the client is not cut off mid-write (it would see a reset, i.e. "unknown", not "rejected").
_DRAIN_FACTOR = 64
_NAMESPACE = uuid.UUID("5d1d8e4e-3a39-4d51-9a43-2f1c0c7e8a11")

#: Applies a verified sender's claim/release (``"claim"`` | ``"release"``) at this agent.
ControlHandler = Callable[[Sender, str], Awaitable[ControlResult]]


# -- errors --------------------------------------------------------------------------------


def rejected_error(reason: str, detail: str | None = None) -> InvalidRequestError:
    """A request CrossTalk refused with no task created (admission, policy on a continuation).

    JSON-RPC ``-32600`` like the body cap (seed WA1), with the reason in the error's
    ``google.rpc.ErrorInfo`` metadata, so any client maps it to ``rejected``.
    """
    return InvalidRequestError(
        message=f"rejected: {reason}" + (f" ({detail})" if detail else ""),
        data={wire.ERROR_REASON: reason, wire.ERROR_STATE: M.REJECTED.value})


def _invalid(reason: str, detail: str) -> InvalidParamsError:
    return InvalidParamsError(message=f"{detail}",
                              data={wire.ERROR_REASON: reason, wire.ERROR_STATE: M.REJECTED.value})


# -- ASGI middleware -----------------------------------------------------------------------


async def _send_json(send: Send, status: int, body: bytes,
                     extra: Sequence[tuple[bytes, bytes]] = ()) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        *extra]})
    await send({"type": "http.response.body", "body": body})


def _jsonrpc_error_bytes(error: A2AError | JSONRPCError) -> bytes:
    return json.dumps(build_error_response(None, error)).encode()


class BearerGuard:
    """Every request but the public Agent Card needs ``Authorization: Bearer <token>``.

    The token is the **sending** agent's own CrossTalk credential; it maps to exactly one live
    registered agent (``Registry.agent_for_token``), whose id, name and role become the
    verified :class:`Sender`. Anything else is answered ``401`` before the body is read.
    """

    def __init__(self, app: ASGIApp, *, server: A2AServer) -> None:
        self.app = app
        self.server = server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope.get("path") == AGENT_CARD_WELL_KNOWN_PATH and scope.get("method") in (
                "GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        sender = self.server.authenticate(_header_values(scope, b"authorization"))
        if sender is None:
            await _drain(receive, self.server.limits.max_body_bytes)  # let the client finish
            body = _jsonrpc_error_bytes(InvalidRequestError(
                message="unauthorized: a registered agent's bearer token is required",
                data={wire.ERROR_REASON: "unauthorized", wire.ERROR_STATE: M.REJECTED.value}))
            await _send_json(send, 401, body, [(b"www-authenticate", b'Bearer realm="crosstalk"')])
            return
        scope[SCOPE_SENDER] = sender
        await self.app(scope, receive, send)


class BodyLimit:
    """Cap the request body before anything decodes it (seed R10, WA1).

    Works for a declared ``Content-Length`` and for chunked bodies alike; an oversize request
    is answered with a JSON-RPC invalid-request error (HTTP 200), never a bare 413, so the
    client maps it to ``rejected``. The body is drained first so the client is never cut off
    mid-write. A body that is not UTF-8 gets the JSON-RPC parse error here (the SDK would
    report it as an internal error, which a client must read as "unknown").
    """

    def __init__(self, app: ASGIApp, *, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = await self._read(scope, receive)
        if body is None:  # the client went away
            return
        if isinstance(body, int):
            await _send_json(send, 200, _jsonrpc_error_bytes(InvalidRequestError(
                message=f"rejected: body_too_large (limit {self.limit} bytes)",
                data={wire.ERROR_REASON: "body_too_large", wire.ERROR_STATE: M.REJECTED.value,
                      "limit": str(self.limit)})))
            return
        if scope.get("method") == "POST":
            try:
                body.decode("utf-8")
            except UnicodeDecodeError:
                # JSON text is UTF-8 (RFC 8259): this is a parse error, not a server fault.
                await _send_json(send, 200, _jsonrpc_error_bytes(JSONParseError(
                    message="request body is not UTF-8")))
                return
        replayed = False

        async def replay() -> AsgiMessage:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _read(self, scope: Scope, receive: Receive) -> bytes | int | None:
        """The whole body; or its size so far if over the cap (drained); ``None`` if gone."""
        declared = _header_values(scope, b"content-length")
        try:
            over = any(int(v) > self.limit for v in declared)
        except ValueError:
            over = False  # the server (h11) refuses a malformed length itself
        chunks: list[bytes] = []
        size = 0
        more = True
        while more and not over:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            more = bool(message.get("more_body", False))
            over = size > self.limit
            if not over:
                chunks.append(chunk)
        if not over:
            return b"".join(chunks)
        if more and not await _drain(receive, self.limit * _DRAIN_FACTOR - size):
            return None
        return size


async def _drain(receive: Receive, budget: int) -> bool:
    """Read and discard the rest of a request body (up to ``budget`` bytes) before answering,
    so a client still writing is not cut off (it would see a reset, not our answer).
    Returns False if the client went away."""
    while budget >= 0:
        message = await receive()
        if message["type"] == "http.disconnect":
            return False
        budget -= len(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return True


def _header_values(scope: Scope, name: bytes) -> list[str]:
    return [v.decode("latin-1") for k, v in scope.get("headers", []) if k.lower() == name]


class _AgentUser(User):
    def __init__(self, sender: Sender) -> None:
        self._sender = sender

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def user_name(self) -> str:
        return self._sender.agent_id or ""


class _ContextBuilder(DefaultServerCallContextBuilder):
    """The SDK's context plus the verified sender; the bearer token is not copied along."""

    def build(self, request: Request) -> ServerCallContext:
        ctx = super().build(request)
        headers = ctx.state.get("headers")
        if isinstance(headers, dict):
            headers.pop("authorization", None)
        sender = request.scope.get(SCOPE_SENDER)
        if isinstance(sender, Sender):
            ctx.state[SENDER_KEY] = sender
            ctx.user = _AgentUser(sender)
        ctx.state[_RECEIVE_KEY] = request.receive
        return ctx


# -- the request handler (the SDK seam) ----------------------------------------------------


class CrossTalkRequestHandler(RequestHandler):
    """Maps the A2A 1.0 methods onto :class:`A2AServer`; unimplemented ones get the spec's
    mandated errors (§3.3.4 capability validation)."""

    def __init__(self, server: A2AServer) -> None:
        self.server = server

    async def on_message_send(self, params: pb.SendMessageRequest,
                              context: ServerCallContext) -> pb.Task | pb.Message:
        return await self.server.send_message(params, context)

    async def on_get_task(self, params: pb.GetTaskRequest,
                          context: ServerCallContext) -> pb.Task | None:
        return self.server.get_task(params, context)

    async def on_list_tasks(self, params: pb.ListTasksRequest,
                            context: ServerCallContext) -> pb.ListTasksResponse:
        return self.server.list_tasks(params, context)

    async def on_cancel_task(self, params: pb.CancelTaskRequest,
                             context: ServerCallContext) -> pb.Task | None:
        return self.server.cancel_task(params, context)

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


class _EmbeddedServer(uvicorn.Server):
    """uvicorn inside someone else's loop: it must not take over the process's signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


@dataclass
class _Pending:
    """What the server remembers about a message it admitted (deadline, for the ask timer)."""

    deadline_seconds: int = 0


# -- the server ----------------------------------------------------------------------------


class A2AServer:
    """The A2A endpoint of one registered agent, driving that agent's :class:`Receiver`.

    Use inside a running asyncio loop: ``url = await server.start()`` … ``await
    server.stop()``; or mount :meth:`build_app` on any ASGI transport (tests use
    ``httpx.ASGITransport``). On a restart, call :meth:`restore` before serving.

    ``limits`` defaults to the receiver's; the counters (waits, pending tasks, open asks) are
    the receiver's :class:`~crosstalk.core.admission.Admission`, shared with every ingress.
    ``max_wait_seconds`` bounds one default-wait SendMessage (an ask with no deadline would
    otherwise hold a connection and a wait slot forever); past it the task is returned as
    it stands, still WORKING, for the caller to poll with GetTask.
    """

    def __init__(self, *, receiver: Receiver, registry: Registry, agent_id: str, name: str,
                 limits: Limits | None = None, description: str | None = None,
                 max_wait_seconds: float = 900.0, expire_asks: bool = True,
                 dispatch_grace_seconds: float = 2.0,
                 retention_seconds: float = RETENTION_SECONDS,
                 control_handler: ControlHandler | None = None) -> None:
        if agent_id != receiver.agent_id:
            raise ValueError("the server and its receiver must belong to one agent")
        self.receiver = receiver
        self.registry = registry
        self.agent_id = agent_id
        self.name = name
        self.limits = limits or receiver.limits
        self.description = description or (
            f"CrossTalk agent '{name}': messages sent here arrive inside that coding-agent "
            "session.")
        self.max_wait_seconds = max_wait_seconds
        self.expire_asks = expire_asks
        self.dispatch_grace_seconds = dispatch_grace_seconds
        self.retention_seconds = retention_seconds
        #: Claim/release handler (set by the Agent); ``None`` refuses control requests.
        self.control_handler = control_handler
        self.store = JournalTaskStore(receiver.journal, clock=receiver.clock)
        self.url = "http://127.0.0.1"
        self._pending: dict[str, _Pending] = {}
        self._ask_deadlines: dict[str, float] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._changed: dict[str, asyncio.Event] = {}
        self._dirty: set[str] = set()
        self._lane_errors: dict[str, str] = {}
        self._queue: asyncio.Queue[tuple[Entry, bool] | None] | None = None
        self._lane_task: asyncio.Task[None] | None = None
        self._enqueued: set[str] = set()
        self._deferred: list[tuple[Entry, bool]] = []
        self._armed = False
        self._stopping = False
        self._stop_event: asyncio.Event | None = None
        self._server: _EmbeddedServer | None = None
        self._serve_task: asyncio.Task[None] | None = None
        self._socket: socket.socket | None = None
        self._token_cache: dict[str, tuple[float, Descriptor]] = {}
        self._app: Starlette | None = None
        receiver.listeners.append(self._on_entry)

    # -- lifecycle ---------------------------------------------------------------------

    def build_app(self, base_url: str | None = None) -> Starlette:
        """The ASGI app: public Agent Card + bearer-guarded, body-capped JSON-RPC endpoint."""
        if base_url is not None and self._server is None:
            self.url = base_url.rstrip("/")
        if self._app is None:
            handler = CrossTalkRequestHandler(self)

            async def current_card(_card: pb.AgentCard) -> pb.AgentCard:
                return self.agent_card()

            routes = [
                *create_agent_card_routes(agent_card=self.agent_card(),
                                          card_modifier=current_card),
                *create_jsonrpc_routes(request_handler=handler, rpc_url=RPC_PATH,
                                       context_builder=_ContextBuilder()),
            ]
            self._app = Starlette(routes=routes, middleware=[
                Middleware(BearerGuard, server=self),
                Middleware(BodyLimit, limit=self.limits.max_body_bytes),
            ])
        return self._app

    async def start(self) -> str:
        """Serve on ``127.0.0.1:<free port>`` in the running loop; returns the base URL."""
        if self._server is not None:
            return self.url
        self._stopping = False
        self._stop_event = None
        if self._on_entry not in self.receiver.listeners:
            self.receiver.listeners.append(self._on_entry)  # started again after a stop
        # proto=IPPROTO_TCP matters: asyncio turns Nagle off only on sockets whose proto says
        # TCP, and with Nagle on, uvicorn's two-part responses on a keep-alive connection
        # wait ~40 ms for the peer's delayed ACK (measured: card fetch 44 ms -> under 1 ms).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.bind(("127.0.0.1", 0))
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._socket = sock
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        config = uvicorn.Config(self.build_app(), log_config=None, access_log=False,
                                lifespan="off", ws="none", http="h11", server_header=False,
                                timeout_graceful_shutdown=1)
        server = _EmbeddedServer(config)
        self._server = server
        self._serve_task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
        while not server.started:
            if self._serve_task.done():
                self._server = None
                sock.close()
                exc = self._serve_task.exception()
                raise RuntimeError(f"the A2A listener did not start: {exc!r}")
            await asyncio.sleep(0.005)
        self._start_deferred()
        return self.url

    async def stop(self) -> None:
        """Stop serving and dispatching; leaves no task of ours running.

        Default waits return the task as it stands; the dispatch in flight gets
        ``dispatch_grace_seconds`` to finish (then it is cancelled, which the receiver journals
        as ``unknown``); messages still waiting in the lane stay ``submitted`` in the journal
        and are resumed by :meth:`restore` on the next start (seed R2).
        """
        self._stopping = True
        if self._stop_event is not None:
            self._stop_event.set()
        for event in self._changed.values():
            event.set()
        if self._server is not None and self._serve_task is not None:
            self._server.should_exit = True
            with contextlib.suppress(Exception):
                await self._serve_task
        self._server = None
        self._serve_task = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        lane = self._lane_task
        if lane is not None and self._queue is not None:
            self._queue.put_nowait(None)
            done, _ = await asyncio.wait({lane}, timeout=self.dispatch_grace_seconds)
            if not done:
                lane.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await lane
        self._lane_task = None
        self._queue = None
        self._enqueued.clear()
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        with contextlib.suppress(ValueError):
            self.receiver.listeners.remove(self._on_entry)

    # -- the Agent Card ----------------------------------------------------------------

    def agent_card(self) -> pb.AgentCard:
        """Public card: no cwd, no CORS (seed R14); bearer required; JSON-RPC 1.0 only."""
        return pb.AgentCard(
            name=self.name,
            description=self.description,
            version=__version__,
            supported_interfaces=[pb.AgentInterface(
                url=self.url, protocol_binding="JSONRPC", protocol_version=PROTOCOL_VERSION_1_0)],
            capabilities=pb.AgentCapabilities(
                streaming=False, push_notifications=False, extended_agent_card=False,
                extensions=[pb.AgentExtension(
                    uri=wire.CONTROL_EXTENSION, required=False,
                    description=("claim/release control requests (metadata "
                                 f"{wire.CONTROL}); never delivered as messages"))]
                if self.control_handler is not None else []),
            security_schemes={"bearer": pb.SecurityScheme(
                http_auth_security_scheme=pb.HTTPAuthSecurityScheme(
                    scheme="bearer",
                    description="the sending agent's own CrossTalk credential"))},
            security_requirements=[pb.SecurityRequirement(schemes={"bearer": pb.StringList()})],
            default_input_modes=["text/plain"],
            default_output_modes=["text/plain"],
            skills=[pb.AgentSkill(
                id="message", name="message",
                description=("Deliver a message into this agent's running session: inform, "
                             "command (policy-checked) or ask (answered by the session's reply)."),
                tags=["crosstalk", "messaging"])],
        )

    # -- authentication ----------------------------------------------------------------

    def authenticate(self, authorization: Sequence[str]) -> Sender | None:
        """The verified sender for an ``Authorization`` header, or ``None``."""
        if len(authorization) != 1:
            return None
        scheme, _, token = authorization[0].strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token or len(token) > _MAX_TOKEN_LEN:
            return None
        key = hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()
        now = time.monotonic()
        cached = self._token_cache.get(key)
        if cached is not None and cached[0] > now:
            desc: Descriptor | None = cached[1]
        else:
            try:
                desc = self.registry.agent_for_token(token)
            except (OSError, ValueError):
                desc = None
            if desc is None:
                self._token_cache.pop(key, None)
            else:
                if len(self._token_cache) > 64:
                    self._token_cache.clear()
                self._token_cache[key] = (now + _TOKEN_CACHE_SECONDS, desc)
        if desc is None:
            return None
        role = desc.role
        if role == SUBAGENT and self.registry.live_owner(desc.owner) is None:
            role = PRIMARY  # its owner is gone: nobody holds the claim (Registry.live_owner)
        return Sender(agent_id=desc.agent_id, name=desc.name, role=role, ingress=Ingress.A2A)

    # -- SendMessage -------------------------------------------------------------------

    async def send_message(self, params: pb.SendMessageRequest,
                           context: ServerCallContext) -> pb.Task:
        sender = _require_sender(context)
        self._start_deferred()
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
        prior = self.receiver.entries.get(mid)
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
                hop_chain=fields.hop_chain, sent_at=self.receiver.clock())
            try:
                admitted = self.receiver.admit(msg)
            except ReceiverUnavailable as exc:
                self.receiver.admission.release_task(task_id)
                raise InternalError(message=f"journal unavailable: {exc}") from exc
            if isinstance(admitted, Result):
                self.receiver.admission.release_task(task_id)
                entry = self.receiver.entries.get(mid)
                if (admitted.duplicate or entry is None or entry.sender.key != sender.key
                        or entry.state is not M.REJECTED):
                    # transient (admission), or an id another sender holds: no task.
                    raise rejected_error(admitted.reason or admitted.state.value)
            else:
                entry = admitted
                self._pending[mid] = _Pending(msg.deadline_seconds)
            history = [_inbound_copy(msg_in, task_id, context_id)]
            self._create_task(task_id, context_id, sender, entry, history)
            if entry.state is M.SUBMITTED:
                self._enqueue(entry)
            return await self._respond(task_id, params, context, wait)
        finally:
            if waiting:
                self.receiver.admission.release_wait()

    async def _control(self, params: pb.SendMessageRequest, sender: Sender) -> pb.Task:
        """A claim/release: the handler decides, the answer is an unstored terminal task."""
        msg_in = params.message
        fields, _ = self._decode(msg_in)
        if fields.control is None:
            raise _invalid("bad_control", f"{wire.CONTROL} must be claim or release")
        if msg_in.task_id:
            raise _invalid("bad_control", "a control request cannot continue a task")
        handler = self.control_handler
        if handler is None:
            raise rejected_error("control_not_supported")
        try:
            result = await handler(sender, fields.control)
        except Exception as exc:
            log.exception("control %s from %s failed", fields.control, sender.agent_id)
            raise InternalError(message=f"control failed: {type(exc).__name__}") from exc
        task_id = str(uuid.uuid4())
        context_id = msg_in.context_id or str(uuid.uuid4())
        state = (T.COMPLETED if result.ok else T.FAILED if result.failed else T.REJECTED)
        verb = "claimed" if fields.control == "claim" else "released"
        summary = (f"{verb}: {self.name} is now {result.role}" if result.ok
                   else f"not {verb}: {result.reason or 'no reason given'}")
        status = pb.Message(message_id=str(uuid.uuid5(_NAMESPACE, f"{task_id}:control")),
                            context_id=context_id, task_id=task_id, role=pb.ROLE_AGENT,
                            parts=[pb.Part(text=summary)])
        task = pb.Task(id=task_id, context_id=context_id,
                       status=pb.TaskStatus(state=wire_state(state), message=status),
                       history=[_inbound_copy(msg_in, task_id, context_id), status])
        meta: dict[str, Any] = {
            wire.MESSAGE_ID: msg_in.message_id,
            wire.STATE: M.ACCEPTED.value if result.ok else M.REJECTED.value,
            wire.CONTROL_RESULT: result.to_dict()}
        if result.reason:
            meta[wire.REASON] = result.reason
        task.metadata.update(meta)
        _stamp(task, self.receiver.clock())
        return apply_history_length(task, params.configuration)

    def _decode(self, msg_in: pb.Message) -> tuple[wire.RequestFields, str]:
        if not wire.valid_id(msg_in.message_id):
            raise _invalid("bad_message_id", "messageId must be 1-128 printable characters")
        if msg_in.context_id and not wire.valid_id(msg_in.context_id):
            raise _invalid("bad_context_id", "contextId must be 1-128 printable characters")
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
            raise _invalid(exc.reason, str(exc)) from exc
        return fields, "\n".join(texts)

    def _reserve_wait(self) -> bool:
        reason = self.receiver.admission.reserve_wait()
        if reason is not None:
            raise rejected_error(reason)
        return True

    async def _retry(self, params: pb.SendMessageRequest, sender: Sender, prior: Entry,
                     wait: bool, context: ServerCallContext) -> pb.Task:
        """Same (sender, messageId) again: the prior task and state, never a second inject."""
        if prior.sender.key != sender.key or prior.ingress != Ingress.A2A.value:
            raise rejected_error("message_id_conflict")
        task_id = self.store.task_for_message(prior.message_id)
        if task_id is None:
            if prior.continuation:
                if prior.state is M.REJECTED:
                    raise rejected_error(prior.reason or "rejected")
                raise rejected_error("message_id_conflict")
            # Admitted before a crash or a failed task write: give it its task now.
            msg_in = params.message
            task_id = prior.task_id or str(uuid.uuid4())
            context_id = msg_in.context_id or str(uuid.uuid4())
            if not is_terminal(_target_state(prior)) and (
                    self.receiver.admission.reserve_task(task_id) is not None):
                raise rejected_error("too_many_pending_tasks")
            self._create_task(task_id, context_id, sender, prior,
                              [_inbound_copy(msg_in, task_id, context_id)])
        stored = self.store.lookup(task_id)
        if stored is None or stored.owner != sender.agent_id:
            raise rejected_error("message_id_conflict")
        if params.message.task_id and params.message.task_id != task_id:
            raise rejected_error("message_id_conflict")
        if prior.state is M.SUBMITTED and prior.message is not None:
            # Never reached the lane (its task write failed, or a continuation stranded by a
            # restart, R2): the sender's retry re-runs it from policy. A no-op otherwise.
            self._enqueue(prior, resume=True)
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
        stored = self.store.owned(msg_in.task_id, sender.agent_id)
        if stored is None:
            raise TaskNotFoundError(message=f"Task {msg_in.task_id} not found")
        fields, text = self._decode(msg_in)
        mid = msg_in.message_id
        prior = self.receiver.entries.get(mid)
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
                hop_chain=fields.hop_chain, sent_at=self.receiver.clock())
            try:
                admitted = self.receiver.admit(msg)  # policy runs again (seed 23)
            except ReceiverUnavailable as exc:
                raise InternalError(message=f"journal unavailable: {exc}") from exc
            if isinstance(admitted, Result):
                raise rejected_error(admitted.reason or admitted.state.value)
            self._pending[mid] = _Pending(msg.deadline_seconds)
            task = copy_task(stored.task)
            task.history.append(_inbound_copy(msg_in, task_id, stored.task.context_id))
            self._save(task, stored.owner, [*stored.refs, mid])
            self._apply(task_id)
            self._enqueue(admitted)
            return await self._respond(task_id, params, context, wait)
        finally:
            if waiting:
                self.receiver.admission.release_wait()

    async def _respond(self, task_id: str, params: pb.SendMessageRequest,
                       context: ServerCallContext, wait: bool) -> pb.Task:
        if wait:
            await self._await_settled(task_id, context.state.get(_RECEIVE_KEY))
        stored = self.store.lookup(task_id)
        if stored is None:  # pragma: no cover  (tasks are never forgotten while served)
            raise InternalError(message="task vanished")
        latest = stored.refs[-1] if stored.refs else None
        if wait and latest in self._lane_errors and stored.state is T.SUBMITTED:
            raise InternalError(message=f"dispatch could not start: {self._lane_errors[latest]}")
        return apply_history_length(copy_task(stored.task), params.configuration)

    # -- GetTask / ListTasks / CancelTask ----------------------------------------------

    def get_task(self, params: pb.GetTaskRequest, context: ServerCallContext) -> pb.Task:
        sender = _require_sender(context)
        validate_proto_required_fields(params)
        validate_history_length(params)
        stored = self.store.owned(params.id, sender.agent_id)
        if stored is None:
            raise TaskNotFoundError(message=f"Task {params.id} not found")
        return apply_history_length(copy_task(stored.task), params)

    def list_tasks(self, params: pb.ListTasksRequest,
                   context: ServerCallContext) -> pb.ListTasksResponse:
        sender = _require_sender(context)
        validate_history_length(params)
        page = self.store.list_for(sender.agent_id, params)
        for task in page.tasks:
            trimmed = apply_history_length(task, params)
            if trimmed is not task:
                task.CopyFrom(trimmed)
        return page

    def cancel_task(self, params: pb.CancelTaskRequest, context: ServerCallContext) -> pb.Task:
        """Cancel only what no dispatch has claimed yet (seed 17f, 22).

        Synchronous from check to journal: the dispatch lane cannot claim in between, so a
        cancel either wins (zero writes will happen) or reports TaskNotCancelable.
        """
        sender = _require_sender(context)
        validate_proto_required_fields(params)
        stored = self.store.owned(params.id, sender.agent_id)
        if stored is None:
            raise TaskNotFoundError(message=f"Task {params.id} not found")
        if is_terminal(stored.state):
            raise TaskNotCancelableError(message=f"Task {params.id} is already "
                                                 f"{stored.state.value}")
        entries = [self.receiver.entries.get(mid) for mid in stored.refs]
        if not entries or any(e is None or e.state is not M.SUBMITTED for e in entries):
            raise TaskNotCancelableError(
                message=f"Task {params.id} was already claimed for dispatch")
        try:
            for e in entries:
                assert e is not None
                self.receiver.cancel(e.message_id)
        except ReceiverUnavailable as exc:
            raise InternalError(message=f"journal unavailable: {exc}") from exc
        self._apply(stored.task.id)
        current = self.store.lookup(stored.task.id)
        assert current is not None
        return copy_task(current.task)

    # -- task state, derived from the receiver's entries -------------------------------

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

    def resolve(self, message_id: str, state: MessageState, reason: str | None = None) -> None:
        """Apply a delivery outcome learned after the fact (seed "Server.Resolve").

        accepted/queued complete an inform or command, rejected/unreachable fail it, unknown
        leaves it working. The receiver journals the change; its listener updates the task.
        """
        self.receiver.resolve(message_id, state, reason)

    def _create_task(self, task_id: str, context_id: str, sender: Sender, entry: Entry,
                     history: Sequence[pb.Message]) -> None:
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
        _stamp(task, self.receiver.clock())
        try:
            self.store.put(task, owner=sender.agent_id, refs=[entry.message_id])
        except JournalError as exc:
            self.receiver.admission.release_task(task_id)
            raise InternalError(message=f"journal unavailable: {exc}") from exc
        if initial is T.REJECTED:
            self.receiver.admission.release_task(task_id)
        self._apply(task_id)

    def _on_entry(self, entry: Entry) -> None:
        """Receiver listener: every state change of a message that belongs to a task."""
        task_id = self.store.task_for_message(entry.message_id)
        if task_id is None:
            return
        if entry.ask is AskState.OPEN and entry.message_id not in self._ask_deadlines:
            pending = self._pending.get(entry.message_id)
            if pending is not None and pending.deadline_seconds > 0:
                self._ask_deadlines[entry.message_id] = (
                    self.receiver.clock() + pending.deadline_seconds)
        if entry.state not in (M.SUBMITTED, M.DISPATCHING) and (
                entry.ask is not None or entry.kind != Kind.ASK.value
                or entry.state not in (M.ACCEPTED, M.QUEUED)):
            self._pending.pop(entry.message_id, None)
        self._apply(task_id)

    def _apply(self, task_id: str) -> None:
        """Re-derive one task from its messages; journal it if anything changed."""
        stored = self.store.lookup(task_id)
        if stored is None:
            return
        if is_terminal(stored.state):
            self._arm_deadlines(stored)
            return
        task = self._compose(stored)
        if task is None and task_id not in self._dirty:
            self._arm_deadlines(stored)
            return
        task = task or copy_task(stored.task)
        self._save(task, stored.owner, stored.refs)
        new = self.store.lookup(task_id)
        if new is not None:
            if is_terminal(new.state):
                self.receiver.admission.release_task(task_id)
            self._arm_deadlines(new)
        event = self._changed.pop(task_id, None)
        if event is not None:
            event.set()

    def _save(self, task: pb.Task, owner: str, refs: Sequence[str]) -> None:
        try:
            self.store.put(task, owner=owner, refs=refs)
            self._dirty.discard(task.id)
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
        d = _derive([e for e in entries if e is not None], latest, stored.state)
        task = copy_task(stored.task)
        task.status.state = wire_state(d.target)
        task.ClearField("metadata")
        task.metadata.update(d.metadata)
        task.status.ClearField("message")
        if d.status_text is not None:
            status = pb.Message(
                message_id=str(uuid.uuid5(_NAMESPACE, f"{task.id}:{d.target.value}:"
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
        _stamp(task, self.receiver.clock())
        return task

    def _settled(self, task_id: str) -> bool:
        """Whether a default-wait SendMessage may answer now."""
        stored = self.store.lookup(task_id)
        if stored is None or is_terminal(stored.state):
            return True
        latest = stored.refs[-1] if stored.refs else None
        if latest in self._lane_errors:
            return True
        entries = [self.receiver.entries.get(mid) for mid in stored.refs]
        if any(e is not None and e.ask is AskState.OPEN for e in entries):
            return False
        last = entries[-1] if entries else None
        return last is not None and last.state is M.UNKNOWN

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
            while not self._stopping and not self._settled(task_id):
                remaining = give_up - loop.time()
                if remaining <= 0:
                    return
                event = self._changed.setdefault(task_id, asyncio.Event())
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

    # -- ask deadlines -----------------------------------------------------------------

    def _arm_deadlines(self, stored: StoredTask) -> None:
        if not self.expire_asks:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # armed by start() / the first request
        for mid in stored.refs:
            entry = self.receiver.entries.get(mid)
            deadline = self._ask_deadlines.get(mid)
            if entry is None or entry.ask is not AskState.OPEN or deadline is None:
                timer = self._timers.pop(mid, None)
                if timer is not None:
                    timer.cancel()
                if entry is not None and entry.ask not in (None, AskState.OPEN):
                    self._ask_deadlines.pop(mid, None)
                continue
            if mid in self._timers or self._stopping:
                continue
            delay = max(0.0, deadline - self.receiver.clock())
            self._timers[mid] = loop.call_later(delay, self._expire, mid)

    def _expire(self, message_id: str) -> None:
        self._timers.pop(message_id, None)
        entry = self.receiver.entries.get(message_id)
        if entry is None or entry.ask is not AskState.OPEN:
            return
        try:
            self.receiver.close_ask(message_id, AskState.EXPIRED)
        except (KeyError, IllegalTransition, ReceiverUnavailable) as exc:
            log.error("could not expire ask %s: %s", message_id, exc)

    # -- the dispatch lane -------------------------------------------------------------

    def _enqueue(self, entry: Entry, *, resume: bool = False) -> None:
        if entry.message_id in self._enqueued or self._stopping:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self._deferred.append((entry, resume))
            return
        self._enqueued.add(entry.message_id)
        if self._queue is None:
            self._queue = asyncio.Queue()
        if self._lane_task is None or self._lane_task.done():
            self._lane_task = asyncio.get_running_loop().create_task(self._lane())
        self._queue.put_nowait((entry, resume))

    def _start_deferred(self) -> None:
        if not self._deferred and self._armed:
            return
        self._armed = True
        deferred, self._deferred = self._deferred, []
        for entry, resume in deferred:
            self._enqueue(entry, resume=resume)
        for stored in self.store.open_tasks():
            self._arm_deadlines(stored)

    async def _lane(self) -> None:
        queue = self._queue
        assert queue is not None
        while True:
            item = await queue.get()
            if item is None or self._stopping:
                return
            entry, resume = item
            try:
                if resume:
                    await self.receiver.resume(entry)
                else:
                    await self.receiver.dispatch(entry)
            except ReceiverUnavailable as exc:
                log.error("dispatch of %s could not start: %s", entry.message_id, exc)
                self._lane_error(entry.message_id, str(exc))
            except Exception as exc:  # a bug must not stop the lane for every later message
                log.exception("dispatch of %s failed", entry.message_id)
                self._lane_error(entry.message_id, repr(exc))
            finally:
                self._enqueued.discard(entry.message_id)

    def _lane_error(self, message_id: str, reason: str) -> None:
        self._lane_errors[message_id] = reason
        task_id = self.store.task_for_message(message_id)
        if task_id is not None:
            event = self._changed.pop(task_id, None)
            if event is not None:
                event.set()

    # -- restart -----------------------------------------------------------------------

    def restore(self, records: Iterable[Mapping[str, Any]] | None = None,
                resumable: Sequence[Entry] | None = None) -> list[Entry]:
        """Rebuild the tasks from the journal on start (seed S12, R2); returns what resumes.

        ``records`` default to ``receiver.journal.replay()``. ``resumable`` is what
        ``receiver.restore(records)`` returned; if it is ``None`` this method restores the
        receiver itself (so call it exactly once per receiver, here or by the owner).

        Terminal tasks older than the retention window are dropped, open ones kept; outcomes
        the receiver journaled after a task's last record are applied; A2A first messages
        still ``submitted`` are re-run from policy, dispatch included, in the lane; open asks
        get their deadline timers back.
        """
        recs = list(records) if records is not None else self.receiver.journal.replay().records
        self.store.load(recs, now=self.receiver.clock(),
                        retention_seconds=self.retention_seconds)
        if resumable is None:
            resumable = self.receiver.restore(recs)
        bodies = self._scan_records(recs)
        for stored in self.store.all():
            task = copy_task(stored.task)
            del task.history[:]
            task.history.extend(_rebuilt_history(stored, bodies, self.receiver))
            self.store.put(task, owner=stored.owner, refs=stored.refs, durable=False)
            if not is_terminal(stored.state):
                self.receiver.admission.pending_tasks.add(stored.task.id)
        for entry in resumable:
            if self.store.task_for_message(entry.message_id) is None:
                self._adopt(entry, bodies.get(entry.message_id))
        for stored in self.store.all():
            self._apply(stored.task.id)
        resumed = [e for e in resumable if self.store.task_for_message(e.message_id)]
        for entry in resumed:
            self._enqueue(entry, resume=True)
        # Asks whose deadline passed while we were down expire now (or at start).
        for stored in self.store.open_tasks():
            self._arm_deadlines(stored)
        return resumed

    def _scan_records(self, recs: Sequence[Mapping[str, Any]]) -> dict[str, Message]:
        """Message bodies (to rebuild histories) and open asks' deadlines, from the journal."""
        bodies: dict[str, Message] = {}
        for rec in recs:
            if rec.get("subject") == "message" and rec.get("state") == M.SUBMITTED.value:
                msg = message_from_record(rec)
                if msg is not None:
                    bodies[msg.message_id] = msg
            elif rec.get("subject") == "ask" and rec.get("state") == AskState.OPEN.value:
                deadline = rec.get("deadline_at")
                if isinstance(rec.get("id"), str) and isinstance(deadline, int | float):
                    self._ask_deadlines[str(rec["id"])] = float(deadline)
        return bodies

    def _adopt(self, entry: Entry, msg: Message | None) -> None:
        """A first message journaled before its task record (a crash in between): its task."""
        owner = entry.sender.agent_id
        if msg is None or owner is None:
            return
        task_id = msg.task_id or str(uuid.uuid4())
        context_id = msg.context_id or str(uuid.uuid4())
        task = pb.Task(id=task_id, context_id=context_id,
                       status=pb.TaskStatus(state=wire_state(T.SUBMITTED)),
                       history=[_history_message(msg, task_id, context_id)])
        _stamp(task, self.receiver.clock())
        self._save(task, owner, [entry.message_id])
        self.receiver.admission.pending_tasks.add(task_id)


# -- helpers ---------------------------------------------------------------------------------


def _require_sender(context: ServerCallContext) -> Sender:
    sender = sender_of(context)
    if sender is None:
        raise InvalidRequestError(message="unauthorized",
                                  data={wire.ERROR_REASON: "unauthorized"})
    return sender


@dataclass(frozen=True)
class _Derived:
    target: TaskState
    metadata: dict[str, Any]
    #: The message the status speaks about (the answered ask, else the latest message).
    about: Entry
    answered: bool
    status_text: str | None


def _derive(entries: Sequence[Entry], latest: Entry, current: TaskState) -> _Derived:
    """A task's state and ``crosstalk.*`` metadata from its messages' receiver entries."""
    answered = next((e for e in entries if e.ask is AskState.ANSWERED), None)
    open_ask = any(e.ask is AskState.OPEN for e in entries)
    completion: str | None = None
    status_text: str | None = None
    reason = latest.reason
    if answered is not None:
        target, completion = T.COMPLETED, wire.COMPLETION_ANSWERED
        status_text = answered.reply_text or ""
    else:
        target = _target_state(latest, open_ask=open_ask)
        if target is T.COMPLETED:
            completion = wire.COMPLETION_DELIVERED
        if latest.kind == Kind.ASK.value and latest.ask in (AskState.EXPIRED, AskState.CLOSED):
            reason = f"ask_{latest.ask.value}"
        if target in (T.REJECTED, T.FAILED):
            status_text = f"{latest.state.value}: {reason or 'no reason given'}"
    if target is T.REJECTED and current is not T.SUBMITTED:
        target = T.FAILED  # only a task that never started may be "rejected"
    if target is T.SUBMITTED and current is not T.SUBMITTED:
        target = current  # a pending continuation does not move a task back
    meta: dict[str, Any] = {wire.MESSAGE_ID: latest.message_id,
                            wire.STATE: latest.state.value, wire.TASK_KIND: latest.kind}
    if reason:
        meta[wire.REASON] = reason
    if completion:
        meta[wire.COMPLETION] = completion
    about = answered or latest
    if about.ask is not None:
        meta[wire.ASK] = about.ask.value
    return _Derived(target, meta, about, answered is not None, status_text)


def _target_state(entry: Entry, *, open_ask: bool = False) -> TaskState:
    """The task state one message's receiver state implies (ADR 0004 table)."""
    s = entry.state
    if s is M.SUBMITTED:
        return T.SUBMITTED
    if s is M.CANCELED:
        return T.CANCELED
    if s is M.DISPATCHING or open_ask or s is M.UNKNOWN:
        return T.WORKING
    if s in (M.ACCEPTED, M.QUEUED):
        if entry.kind == Kind.ASK.value:
            if entry.ask in (AskState.EXPIRED, AskState.CLOSED):
                return T.FAILED
            return T.WORKING if entry.ask is not AskState.ANSWERED else T.COMPLETED
        return T.COMPLETED
    if s is M.REJECTED:
        return T.REJECTED
    return T.FAILED  # unreachable (recovered/bounced never belong to an A2A task)


def _stamp(task: pb.Task, now: float) -> None:
    task.status.timestamp.FromNanoseconds(int(now * 1_000_000_000))


def _inbound_copy(msg_in: pb.Message, task_id: str, context_id: str) -> pb.Message:
    msg = pb.Message()
    msg.CopyFrom(msg_in)
    msg.task_id = task_id
    msg.context_id = context_id
    if not msg.role:
        msg.role = pb.ROLE_USER
    return msg


def _history_message(msg: Message, task_id: str, context_id: str) -> pb.Message:
    out = pb.Message(message_id=msg.message_id, context_id=context_id, task_id=task_id,
                     role=pb.ROLE_USER, parts=[pb.Part(text=msg.text)])
    out.metadata.update(wire.encode_request_metadata(
        kind=msg.kind.value, delivery=msg.delivery.value,
        deadline_seconds=msg.deadline_seconds, in_reply_to=msg.in_reply_to,
        hop_chain=list(msg.hop_chain)))
    return out


def _rebuilt_history(stored: StoredTask, bodies: Mapping[str, Message],
                     receiver: Receiver) -> list[pb.Message]:
    out: list[pb.Message] = []
    for mid in stored.refs:
        body = bodies.get(mid)
        if body is not None:
            out.append(_history_message(body, stored.task.id, stored.task.context_id))
        else:
            out.append(pb.Message(message_id=mid, context_id=stored.task.context_id,
                                  task_id=stored.task.id, role=pb.ROLE_USER))
    status = stored.task.status
    if status.HasField("message") and status.message.role == pb.ROLE_AGENT and any(
            (receiver.entries.get(m) is not None
             and receiver.entries[m].ask is AskState.ANSWERED) for m in stored.refs):
        out.append(status.message)
    return out


async def _wait_disconnect(receive: Callable[[], Awaitable[AsgiMessage]]) -> None:
    while True:
        message = await receive()
        if message.get("type") == "http.disconnect":
            return
