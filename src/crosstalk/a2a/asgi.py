"""The A2A server's HTTP side: the ASGI app, its bearer guard and body cap, and the Agent Card
(seed §5 request path, up to the SDK's JSON-RPC dispatcher; the listener that serves it is
:mod:`crosstalk.a2a.listener`)::

    bearer guard (sender = registry.agent_for_token; else 401, -32000, the request's id)
      →  body cap (256 KiB, before decoding; JSON depth, integer size, lone surrogates:
      crosstalk.a2a.jsontext; ListTasks' raw status: crosstalk.a2a.liststatus)
      →  SDK JSON-RPC dispatcher  →  :class:`crosstalk.a2a.handler.CrossTalkRequestHandler`

The SDK does the wire: JSON-RPC parsing and error mapping (``create_jsonrpc_routes``), the
``A2A-Version`` check (absent reads as 0.3: -32009), the Agent Card route (a weak ETag over the
card, 304 on ``If-None-Match``; the ``Cache-Control`` is ours), the protobuf types. Nothing
here knows about tasks or the receiver chain.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence

from a2a.auth.user import User
from a2a.server.context import ServerCallContext
from a2a.server.jsonrpc_models import JSONParseError, JSONRPCError
from a2a.server.request_handlers import RequestHandler, build_error_response
from a2a.server.routes import (
    DefaultServerCallContextBuilder,
    create_agent_card_routes,
    create_jsonrpc_routes,
)
from a2a.types import a2a_pb2 as pb
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH, PROTOCOL_VERSION_1_0
from a2a.utils.errors import A2AError, InvalidRequestError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.types import Message as AsgiMessage

from crosstalk import __version__
from crosstalk.a2a import jsontext, wire
from crosstalk.a2a.addressed import AddressedTo
from crosstalk.a2a.errors import unauthenticated_error
from crosstalk.a2a.liststatus import ABSENT, wire_status
from crosstalk.a2a.taskstore import SENDER_KEY
from crosstalk.capture.asgi import CaptureMiddleware
from crosstalk.capture.tap import Tap
from crosstalk.core.message import Sender
from crosstalk.core.states import MessageState

M = MessageState
log = logging.getLogger(__name__)

RPC_PATH = "/"
#: The ASGI scope key the bearer guard puts the verified sender under.
SCOPE_SENDER = "crosstalk.sender"
#: The ASGI scope key the body cap puts the fields it repaired under (lone surrogates).
SCOPE_REPAIRED = "crosstalk.repaired"
#: The call-context key of the request's ASGI ``receive`` (a default wait watches it for a
#: disconnect).
RECEIVE_KEY = "crosstalk.receive"
#: The call-context key of the message fields the body cap repaired (``Message.repaired``).
REPAIRED_KEY = "crosstalk.repaired"
#: The ASGI scope key, and the call-context key, of a ListTasks request's raw ``status``.
LIST_STATUS_KEY = "crosstalk.list_status"
#: The logger of the SDK's JSON-RPC dispatcher (:class:`_OneLinePerBadRequest`).
SDK_DISPATCHER_LOGGER = "a2a.server.routes.jsonrpc_dispatcher"
#: An oversize body is read and discarded up to this many times the cap before answering, so
#: the client is not cut off mid-write (it would see a reset, i.e. "unknown", not "rejected").
_DRAIN_FACTOR = 64
#: ``Cache-Control`` of the Agent Card (spec 1.0 §8.6.1). Small: the card carries the agent's
#: name, which follows renames, and a restarted agent's port may be taken by another agent;
#: a client re-fetching after 5 s pays one 304 against the ETag.
CARD_CACHE_CONTROL = "max-age=5"

#: The verified sender for an ``Authorization`` header's values, or ``None``.
Authenticate = Callable[[Sequence[str]], Sender | None]


# -- ASGI middleware -----------------------------------------------------------------------


async def _send_json(send: Send, status: int, body: bytes,
                     extra: Sequence[tuple[bytes, bytes]] = ()) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        *extra]})
    await send({"type": "http.response.body", "body": body})


def _jsonrpc_error_bytes(error: A2AError | JSONRPCError,
                         request_id: str | int | None = None) -> bytes:
    return json.dumps(build_error_response(request_id, error)).encode()


class BearerGuard:
    """Every request but the public Agent Card needs ``Authorization: Bearer <token>``.

    The token is the **sending** agent's own CrossTalk credential; it maps to exactly one live
    registered agent (``Registry.agent_for_token``), whose id, name and role become the
    verified :class:`Sender`. Anything else is answered ``401`` + ``WWW-Authenticate`` with
    :func:`~crosstalk.a2a.errors.unauthenticated_error` (``-32000``, so a client can tell it
    from a malformed request) carrying the request's ``id`` if the body (up to the cap) was
    JSON; an ``id`` holding the presented token is not echoed. The body is read, never passed
    on.
    """

    def __init__(self, app: ASGIApp, *, authenticate: Authenticate, drain_limit: int) -> None:
        self.app = app
        self.authenticate = authenticate
        self.drain_limit = drain_limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope.get("path") == AGENT_CARD_WELL_KNOWN_PATH and scope.get("method") in (
                "GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        authorization = _header_values(scope, b"authorization")
        sender = self.authenticate(authorization)
        if sender is None:
            body = await _read_bounded(receive, self.drain_limit)  # let the client finish
            rid = _request_id(body, authorization)
            await _send_json(send, 401, _jsonrpc_error_bytes(unauthenticated_error(), rid),
                             [(b"www-authenticate", b'Bearer realm="crosstalk"')])
            return
        scope[SCOPE_SENDER] = sender
        await self.app(scope, receive, send)


class BodyLimit:
    """Cap the request body before anything decodes it (seed R10, WA1).

    Works for a declared ``Content-Length`` and for chunked bodies alike; an oversize request
    is answered with a JSON-RPC invalid-request error (HTTP 200), never a bare 413, so the
    client maps it to ``rejected``. The body is drained first so the client is never cut off
    mid-write. A body that is not UTF-8 gets the JSON-RPC parse error here (the SDK would
    report it as an internal error, which a client must read as "unknown"); so does JSON the
    SDK cannot parse (too deep, too long an integer), and a lone surrogate is repaired here
    (:mod:`crosstalk.a2a.jsontext`). Each refusal logs one line.
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
                text = body.decode("utf-8")
            except UnicodeDecodeError:
                # JSON text is UTF-8 (RFC 8259): this is a parse error, not a server fault.
                log.warning("A2A request refused: the body is not UTF-8")
                await _send_json(send, 200, _jsonrpc_error_bytes(JSONParseError(
                    message="request body is not UTF-8")))
                return
            verdict = jsontext.inspect(text)
            if verdict.error is not None:
                log.warning("A2A request refused: %s", verdict.error.message)
                await _send_json(send, 200, _jsonrpc_error_bytes(verdict.error))
                return
            if verdict.repaired:
                body = verdict.text.encode("utf-8")
                scope[SCOPE_REPAIRED] = verdict.repaired
            status = wire_status(verdict.text)
            if status is not ABSENT:
                scope[LIST_STATUS_KEY] = status
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


async def _read_bounded(receive: Receive, limit: int) -> bytes | None:
    """The request body if it ends within ``limit`` bytes; else ``None`` once ``limit`` bytes
    were read (and discarded, as :func:`_drain` would), or the client went away."""
    chunks: list[bytes] = []
    size = 0
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        more = bool(message.get("more_body", False))
        if size > limit:
            return None
    return b"".join(chunks)


def _request_id(body: bytes | None, authorization: Sequence[str]) -> str | int | None:
    """A refused request's JSON-RPC ``id``, as the SDK would echo it (a string or an integer,
    never a boolean); ``None`` if the body does not read, or the id holds a presented
    credential (an error never carries a token)."""
    if not body:
        return None
    try:
        request = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past Python's limit
        return None
    rid = request.get("id") if isinstance(request, dict) else None
    if isinstance(rid, bool) or not isinstance(rid, str | int):
        return None
    if isinstance(rid, str):
        secrets = [value.strip().partition(" ")[2].strip() for value in authorization]
        if any(secret and secret in rid for secret in secrets):
            return None
    return rid


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
        ctx.state[RECEIVE_KEY] = request.receive
        repaired = request.scope.get(SCOPE_REPAIRED)
        if isinstance(repaired, tuple):
            ctx.state[REPAIRED_KEY] = repaired
        if LIST_STATUS_KEY in request.scope:
            ctx.state[LIST_STATUS_KEY] = request.scope[LIST_STATUS_KEY]
        return ctx


def repaired_fields(context: ServerCallContext) -> tuple[str, ...]:
    """The message fields whose lone surrogates the body cap replaced (``Message.repaired``)."""
    repaired = context.state.get(REPAIRED_KEY, ())
    return tuple(repaired) if isinstance(repaired, tuple) else ()


class _OneLinePerBadRequest(logging.Filter):
    """The SDK logs a malformed request twice: a traceback (``logger.exception``), then one
    line with the JSON-RPC code and message it answers. The traceback says nothing the line
    does not, and any local process can make the server write one per request; drop it. An
    unhandled exception (a real fault) keeps its traceback."""

    DROPPED = frozenset({"Failed to validate base JSON-RPC request",
                         "Failed to parse request params"})

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and record.msg in self.DROPPED)


_ONE_LINE = _OneLinePerBadRequest()


def _one_line_per_bad_request() -> None:
    sdk = logging.getLogger(SDK_DISPATCHER_LOGGER)
    if _ONE_LINE not in sdk.filters:
        sdk.addFilter(_ONE_LINE)


# -- the app and the card -------------------------------------------------------------------


def agent_card(*, name: str, description: str, url: str, control: bool) -> pb.AgentCard:
    """Public card: no cwd, no CORS (seed R14); bearer required; A2A 1.0 over JSON-RPC 2.0
    (the JSONRPC binding) only."""
    return pb.AgentCard(
        name=name,
        description=description,
        version=__version__,
        supported_interfaces=[pb.AgentInterface(
            url=url, protocol_binding="JSONRPC", protocol_version=PROTOCOL_VERSION_1_0)],
        capabilities=pb.AgentCapabilities(
            streaming=False, push_notifications=False, extended_agent_card=False,
            extensions=[pb.AgentExtension(
                uri=wire.CONTROL_EXTENSION, required=False,
                description=("claim/release control requests (metadata "
                             f"{wire.CONTROL}); never delivered as messages"))]
            if control else []),
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


def build_app(*, handler: RequestHandler, card: Callable[[], pb.AgentCard],
              authenticate: Authenticate, max_body_bytes: int, tap: Tap | None = None,
              name: Callable[[], str] | None = None) -> Starlette:
    """The ASGI app: public Agent Card + bearer-guarded, body-capped JSON-RPC endpoint;
    ``tap`` sees every request as it came and every answer as it went (outermost); ``name``,
    the card's name without building the card (per request)."""

    async def current_card(_card: pb.AgentCard) -> pb.AgentCard:
        return card()

    _one_line_per_bad_request()
    routes = [
        *create_agent_card_routes(agent_card=card(), card_modifier=current_card,
                                  cache_control=CARD_CACHE_CONTROL),
        *create_jsonrpc_routes(request_handler=handler, rpc_url=RPC_PATH,
                               context_builder=_ContextBuilder()),
    ]
    return Starlette(routes=routes, middleware=[
        *([Middleware(CaptureMiddleware, tap=tap)] if tap is not None else []),
        Middleware(AddressedTo, name=name or (lambda: card().name)),
        Middleware(BearerGuard, authenticate=authenticate, drain_limit=max_body_bytes),
        Middleware(BodyLimit, limit=max_body_bytes),
    ])
