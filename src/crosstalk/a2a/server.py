"""One agent's A2A server: the official a2a-sdk JSON-RPC binding (spec 1.0) on uvicorn.

The server is three parts, cut the way a2a-python cuts its own (routes · request handler ·
tasks · store):

- :mod:`crosstalk.a2a.asgi` — the ASGI app: bearer guard, body cap, Agent Card; served by
  :mod:`crosstalk.a2a.listener` (uvicorn in the loop, with connection bounds and a cap);
- :mod:`crosstalk.a2a.handler` — the A2A methods, driving the receiver chain
  (:mod:`crosstalk.receiver`); control requests are answered by :mod:`crosstalk.a2a.control`;
- :mod:`crosstalk.a2a.tasks` — the task book: each task derived from its messages' entries
  (ADR 0004), stored by :mod:`crosstalk.a2a.taskstore`.

Dispatch is not the server's: admitted messages go to the agent's ordered dispatch lane
(:class:`~crosstalk.a2a.tasks.Lane`, given at construction), which also keeps the open asks'
deadline timers. :class:`A2AServer` wires the parts to one receiver and that lane.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from a2a.types import a2a_pb2 as pb
from starlette.types import Receive, Scope, Send

from crosstalk.a2a.control import ClaimHandler
from crosstalk.a2a.listener import Listener
from crosstalk.a2a.taskreplay import TaskReplay
from crosstalk.a2a.tasks import Lane, TaskBook
from crosstalk.a2a.taskstore import JournalTaskStore
from crosstalk.a2a.tokens import BearerTokens
from crosstalk.capture.tap import Tap
from crosstalk.config import RETENTION_SECONDS
from crosstalk.core.admission import Limits
from crosstalk.core.message import Sender
from crosstalk.core.states import MessageState
from crosstalk.receiver import Inbound, Receiver
from crosstalk.store.registry import Registry

if TYPE_CHECKING:  # the SDK's server stack loads with the first connection (ADR 0044)
    from starlette.applications import Starlette

    from crosstalk.a2a.handler import CrossTalkRequestHandler


class A2AServer:
    """The A2A endpoint of one registered agent, driving that agent's :class:`Receiver`.

    Use inside a running asyncio loop: ``url = await server.start()`` … ``await
    server.stop()``; or mount :meth:`build_app` on any ASGI transport (tests use
    ``httpx.ASGITransport``). On a restart, call :meth:`restore` before serving. The
    ``lane`` (the agent's) dispatches what the server admits; its owner runs and closes it.

    ``limits`` defaults to the receiver's; the counters (waits, pending tasks, open asks) are
    the receiver's :class:`~crosstalk.core.admission.Admission`, shared with every ingress.
    ``max_wait_seconds`` bounds one default-wait SendMessage (an ask with no deadline would
    otherwise hold a connection and a wait slot forever); past it the task is returned as
    it stands, still WORKING, for the caller to poll with GetTask.

    The request handler and the app are built on first use, the first connection's request
    as a rule: they bring the SDK's server stack (its request handlers, routes, event
    queues), some 6 MB resident that an agent nobody messages over A2A never needs.
    """

    def __init__(self, *, receiver: Receiver, registry: Registry, agent_id: str, name: str,
                 lane: Lane, limits: Limits | None = None, description: str | None = None,
                 max_wait_seconds: float = 900.0, expire_asks: bool = True,
                 retention_seconds: float = RETENTION_SECONDS,
                 claim_handler: ClaimHandler | None = None,
                 listener: Listener | None = None, tap: Tap | None = None) -> None:
        if agent_id != receiver.agent_id:
            raise ValueError("the server and its receiver must belong to one agent")
        self.receiver = receiver
        self.registry = registry
        self.agent_id = agent_id
        self.limits = limits or receiver.limits
        self.description = description or (
            f"CrossTalk agent '{name}': messages sent here arrive inside that coding-agent "
            "session.")
        self.lane = lane
        self.book = TaskBook(receiver, self.lane, expire_asks=expire_asks,
                             retention_seconds=retention_seconds)
        self.max_wait_seconds = max_wait_seconds
        self._name = name
        self._claim_handler = claim_handler
        self._handler: CrossTalkRequestHandler | None = None
        self.tokens = BearerTokens(registry)
        self.url = "http://127.0.0.1"
        #: What serves the app (``listener``, else one with the default bounds and cap).
        self.listener = listener or Listener()
        #: Sees each request and answer for ``crosstalk capture`` (:mod:`crosstalk.capture`).
        self.tap = tap
        self._app: Starlette | None = None
        receiver.listeners.append(self.book.on_entry)

    @property
    def name(self) -> str:
        return self._name

    @name.setter
    def name(self, value: str) -> None:
        self._name = value
        if self._handler is not None:
            self._handler.name = value

    @property
    def claim_handler(self) -> ClaimHandler | None:
        """Claim/release handler (set by the Agent); ``None`` refuses control requests."""
        return self._claim_handler

    @claim_handler.setter
    def claim_handler(self, value: ClaimHandler | None) -> None:
        self._claim_handler = value
        if self._handler is not None:
            self._handler.claim_handler = value

    @property
    def handler(self) -> CrossTalkRequestHandler:
        """The A2A methods (:mod:`crosstalk.a2a.handler`), built on first use."""
        if self._handler is None:
            from crosstalk.a2a.handler import CrossTalkRequestHandler

            self._handler = CrossTalkRequestHandler(
                self.receiver, self.book, self.lane, name=self._name,
                max_wait_seconds=self.max_wait_seconds, claim_handler=self._claim_handler)
            if self.book.stopping:
                self._handler.stop()
        return self._handler

    @property
    def store(self) -> JournalTaskStore:
        return self.book.store

    # -- lifecycle ---------------------------------------------------------------------

    def build_app(self, base_url: str | None = None) -> Starlette:
        """The ASGI app: public Agent Card + bearer-guarded, body-capped JSON-RPC endpoint."""
        if base_url is not None and not self.listener.serving:
            self.url = base_url.rstrip("/")
        if self._app is None:
            from crosstalk.a2a import asgi

            self._app = asgi.build_app(handler=self.handler, card=self.agent_card,
                                       authenticate=self.authenticate,
                                       max_body_bytes=self.limits.max_body_bytes,
                                       tap=self.tap, name=lambda: self.name)
        return self._app

    async def start(self) -> str:
        """Serve on ``127.0.0.1:<free port>`` in the running loop; returns the base URL."""
        if self.listener.serving:
            return self.url
        if self._handler is not None:
            self._handler.start()
        self.book.stopping = False
        if self.book.on_entry not in self.receiver.listeners:
            self.receiver.listeners.append(self.book.on_entry)  # started again after a stop
        self.url = await self.listener.start(self._app_on_first_use)
        return self.url

    async def _app_on_first_use(self, scope: Scope, receive: Receive, send: Send) -> None:
        """What the listener serves: :meth:`build_app`'s app, built with the first request."""
        await (self._app or self.build_app())(scope, receive, send)

    async def stop(self) -> None:
        """Stop serving; leaves no task of ours running.

        Default waits return the task as it stands; requests in flight get uvicorn's graceful
        second. The lane's owner closes the lane after this (the dispatch in flight gets its
        grace; messages still waiting stay ``submitted`` and are resumed by :meth:`restore`
        on the next start, seed R2).
        """
        if self._handler is not None:
            self._handler.stop()
        else:
            self.book.wake_all()
        self.book.stopping = True
        await self.listener.stop()
        if self.book.on_entry in self.receiver.listeners:
            self.receiver.listeners.remove(self.book.on_entry)

    # -- the Agent Card and authentication ---------------------------------------------

    def agent_card(self) -> pb.AgentCard:
        """Public card: no cwd, no CORS (seed R14); bearer required; JSON-RPC 1.0 only."""
        from crosstalk.a2a import asgi  # with the app (see the class doc)

        return asgi.agent_card(name=self.name, description=self.description, url=self.url,
                               control=self.claim_handler is not None)

    def authenticate(self, authorization: Sequence[str]) -> Sender | None:
        """The verified sender for an ``Authorization`` header, or ``None``."""
        return self.tokens.authenticate(authorization)

    # -- tasks -------------------------------------------------------------------------

    def restore(self, records: Iterable[Mapping[str, Any]] | TaskReplay | None = None,
                resumable: Sequence[Inbound] | None = None) -> list[Inbound]:
        """Rebuild the tasks from the journal on start (seed S12, R2); returns what resumes.

        See :meth:`crosstalk.a2a.tasks.TaskBook.restore`.
        """
        return self.book.restore(records, resumable)

    def task_for_message(self, message_id: str) -> str | None:
        """The task a message belongs to (its first message or any continuation, R6)."""
        return self.book.task_for_message(message_id)

    def ask_of(self, message_id: str) -> str | None:
        """The ask a message answers for (R6); see :meth:`TaskBook.ask_of`."""
        return self.book.ask_of(message_id)

    def resolve(self, message_id: str, state: MessageState, reason: str | None = None) -> None:
        """Apply a delivery outcome learned after the fact (seed "Server.Resolve").

        accepted/queued complete an inform or command, rejected/unreachable fail it, unknown
        leaves it working. The receiver journals the change; its listener updates the task.
        """
        self.receiver.resolve(message_id, state, reason)
