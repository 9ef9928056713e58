"""The A2A listener: one agent's ASGI app on uvicorn (h11) in the running loop, with bounds no
local process can wear down (seed §5 "the A2A server"; issue 12 item 2).

uvicorn bounds only a kept-alive connection's silence, and its only cap answers 503, which a
client must read as "maybe delivered". A connection here is in one of three phases, read off
h11's states after every event (:class:`BoundedH11Protocol`):

- **waiting** for a request, new or kept alive after a response: the request's complete head
  must arrive within :data:`IDLE_TIMEOUT` of the connection or of the previous response. This
  is the keep-alive timeout too; the A2A client keeps a pooled connection idle for less.
- **reading** the body: complete within :data:`BODY_TIMEOUT` of the head.
- **serving**: the app has the whole request. The app bounds its own work (a default-wait
  SendMessage waits for delivery, and admission caps those waits); a response the client does
  not read is dropped after :data:`WRITE_TIMEOUT`.

At most :data:`MAX_CONNECTIONS` connections are held (:class:`ConnectionSlots`). One more is
taken in with what it has already sent (the acceptor reads it as it accepts), then the
connection that has waited longest for a request gives way: first those that never finished
one, as a slowloris never does, then idle kept-alive ones. If every connection is serving, the
new one is closed at once, unread: its client sees a close before any response byte, which is
safe to retry. So an attacker's connections only displace each other, never a request in
progress, and a sender, whose request goes out as it connects, is not the one that waits.
Accepting goes through :class:`crosstalk.ingress.accept.Acceptor` (no EMFILE flood; when
descriptors run out it sheds a waiting connection the same way).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import math
import socket
from collections import OrderedDict
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import h11
import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from crosstalk.ingress.accept import Acceptor, Throttled

log = logging.getLogger(__name__)

#: Connections one agent's listener holds at once.
MAX_CONNECTIONS = 128
#: Seconds a connection may wait for its next request's complete head: from the connection,
#: or from the previous response (the keep-alive timeout). A request head is at most 16 KiB
#: (h11's limit) and a real client writes it as it connects or reuses the connection.
IDLE_TIMEOUT = 5.0
#: Seconds a request body (at most the body cap, 256 KiB) may take after its head.
BODY_TIMEOUT = 10.0
#: Seconds a response may wait for a client that stopped reading it.
WRITE_TIMEOUT = 10.0


@dataclass(frozen=True)
class Bounds:
    """The listener's time bounds, in seconds (the defaults are the module's constants)."""

    idle: float = IDLE_TIMEOUT
    body: float = BODY_TIMEOUT
    write: float = WRITE_TIMEOUT


class Phase(enum.Enum):
    WAITING = "waiting"
    READING = "reading"
    SERVING = "serving"


class ConnectionSlots:
    """The cap, and who gives way when it is reached (see the module doc)."""

    def __init__(self, limit: int, name: str) -> None:
        self.limit = limit
        self.name = name
        self._held: set[BoundedH11Protocol] = set()
        #: Waiting or reading, never served: the first to give way, longest-waiting first.
        self._fresh: OrderedDict[BoundedH11Protocol, None] = OrderedDict()
        #: Waiting or reading after a response (kept alive): next, the same way.
        self._idle: OrderedDict[BoundedH11Protocol, None] = OrderedDict()
        self._log = Throttled(log)

    @property
    def held(self) -> int:
        return len(self._held)

    @property
    def serving(self) -> int:
        """Held connections serving a whole request (they do not give way)."""
        return len(self._held) - len(self._fresh) - len(self._idle)

    def admit(self, conn: BoundedH11Protocol) -> bool:
        """Take ``conn`` in, unless the cap is reached and every connection is serving (then
        it is refused before a byte of it is read). Above the cap, :meth:`restore` decides
        who gives way once the newcomer's first bytes have been read."""
        if len(self._held) >= self.limit and not (self._fresh or self._idle):
            self._log.warning("%s: all %d connections are serving; refused a new one",
                              self.name, len(self._held))
            return False
        self._held.add(conn)
        return True

    def restore(self) -> None:
        """Back to the cap: the longest-waiting connections give way. Called once a newcomer's
        first bytes are read, so a newcomer that sent its request is never the one judged
        "waiting"; one still waiting for its head is the newest in line, the last to go."""
        while len(self._held) > self.limit and self.shed():
            pass

    def wait(self, conn: BoundedH11Protocol, *, served: bool) -> None:
        """``conn`` now waits for a request (or its body): it may give way, in turn."""
        self._unqueue(conn)
        if conn in self._held:
            (self._idle if served else self._fresh)[conn] = None

    def serve(self, conn: BoundedH11Protocol) -> None:
        """``conn`` is serving a whole request: it keeps its slot."""
        self._unqueue(conn)

    def release(self, conn: BoundedH11Protocol) -> None:
        self._unqueue(conn)
        self._held.discard(conn)

    def shed(self) -> bool:
        """Close the connection that has waited longest; whether there was one."""
        for queue in (self._fresh, self._idle):
            if queue:
                victim, _ = queue.popitem(last=False)
                self._held.discard(victim)
                victim.drop()
                return True
        return False

    def _unqueue(self, conn: BoundedH11Protocol) -> None:
        self._fresh.pop(conn, None)
        self._idle.pop(conn, None)


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, plus a slot (:class:`ConnectionSlots`) and the phase bounds."""

    def __init__(self, config: uvicorn.Config, server_state: ServerState,
                 app_state: dict[str, Any], _loop: asyncio.AbstractEventLoop | None = None,
                 *, slots: ConnectionSlots, bounds: Bounds, first: bytes = b"") -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.slots = slots
        self.bounds = bounds
        #: What the peer had sent when it was accepted (read by the acceptor).
        self.first = first
        self.phase: Phase | None = None
        self._served = False
        self._deadline: asyncio.TimerHandle | None = None
        self._write_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not self.slots.admit(self):
            transport.close()
            return
        self._track()
        # The transport starts reading only after this returns, so these bytes come first.
        first, self.first = self.first, b""
        if first:
            self.data_received(first)
        self.slots.restore()

    def connection_lost(self, exc: Exception | None) -> None:
        self.slots.release(self)
        self._cancel_deadlines()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        self._track()

    def on_response_complete(self) -> None:
        self._served = True
        super().on_response_complete()
        self._track()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_deadline is None:
            self._write_deadline = self.loop.call_later(self.bounds.write, self.drop)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._write_deadline is not None:
            self._write_deadline.cancel()
            self._write_deadline = None

    def drop(self) -> None:
        """Close now, giving up the slot; unsent response bytes are discarded with it."""
        self.slots.release(self)
        self._cancel_deadlines()
        if self.transport.is_closing():
            return
        if self.transport.get_write_buffer_size():
            self.transport.abort()
        else:
            self.transport.close()

    def _track(self) -> None:
        """Read the phase off h11's states; on a change, move the slot and the deadline."""
        if self.transport.is_closing():
            return
        theirs, ours = self.conn.their_state, self.conn.our_state
        if theirs is h11.SEND_BODY:
            phase = Phase.READING
        elif theirs is not h11.IDLE and ours in (h11.SEND_RESPONSE, h11.SEND_BODY):
            phase = Phase.SERVING
        else:
            phase = Phase.WAITING  # also any state between cycles: bounded like waiting
        if phase is self.phase:
            return
        self.phase = phase
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if phase is Phase.SERVING:
            self.slots.serve(self)
            return
        self.slots.wait(self, served=self._served)
        bound = self.bounds.idle if phase is Phase.WAITING else self.bounds.body
        self._deadline = self.loop.call_later(bound, self.drop)

    def _cancel_deadlines(self) -> None:
        for handle in (self._deadline, self._write_deadline):
            if handle is not None:
                handle.cancel()
        self._deadline = self._write_deadline = None


class _EmbeddedServer(uvicorn.Server):
    """uvicorn inside someone else's loop: it must not take over the process's signals, and it
    accepts through :class:`Acceptor` with :class:`BoundedH11Protocol` connections."""

    def __init__(self, config: uvicorn.Config, *, slots: ConnectionSlots,
                 bounds: Bounds) -> None:
        super().__init__(config)
        self.slots = slots
        self.bounds = bounds

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's startup for the one socket given, minus its ``loop.create_server``."""
        if sockets is None or len(sockets) != 1:
            raise ValueError("the A2A listener serves exactly the one socket it bound")
        await self.lifespan.startup()
        loop = asyncio.get_running_loop()

        def connection(first: bytes) -> asyncio.Protocol:
            return BoundedH11Protocol(self.config, self.server_state, self.lifespan.state,
                                      loop, slots=self.slots, bounds=self.bounds, first=first)

        acceptor = Acceptor(sockets[0], connection, name=self.slots.name,
                            backlog=self.config.backlog, shed=self.slots.shed)
        acceptor.start()
        # uvicorn's shutdown calls only close() and wait_closed() on these.
        self.servers = [acceptor]  # type: ignore[list-item]
        self.started = True


class Listener:
    """The app on ``127.0.0.1:<free port>``, served by uvicorn in the running loop."""

    def __init__(self, *, max_connections: int = MAX_CONNECTIONS,
                 bounds: Bounds | None = None) -> None:
        self.max_connections = max_connections
        self.bounds = bounds or Bounds()
        self.url: str | None = None
        self._server: _EmbeddedServer | None = None
        self._serve_task: asyncio.Task[None] | None = None
        self._socket: socket.socket | None = None
        self._slots: ConnectionSlots | None = None

    @property
    def serving(self) -> bool:
        return self._server is not None

    @property
    def connections(self) -> int:
        """Connections holding a slot right now."""
        return self._slots.held if self._slots is not None else 0

    @property
    def busy(self) -> int:
        """Connections serving a whole request right now (they keep their slots)."""
        return self._slots.serving if self._slots is not None else 0

    async def start(self, app: ASGIApp) -> str:
        """Bind, serve, and return the base URL once uvicorn has started."""
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
        config = uvicorn.Config(app, log_config=None, access_log=False,
                                lifespan="off", ws="none", http="h11", server_header=False,
                                # not guessed: a bound method would read as ASGI 2
                                interface="asgi3",
                                timeout_graceful_shutdown=1, limit_concurrency=None,
                                # ours closes an idle connection first (Bounds.idle)
                                timeout_keep_alive=math.ceil(self.bounds.idle) + 1)
        self._slots = ConnectionSlots(self.max_connections, f"A2A listener {self.url}")
        server = _EmbeddedServer(config, slots=self._slots, bounds=self.bounds)
        self._server = server
        self._serve_task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
        while not server.started:
            if self._serve_task.done():
                self._server = None
                sock.close()
                exc = self._serve_task.exception()
                raise RuntimeError(f"the A2A listener did not start: {exc!r}")
            await asyncio.sleep(0.005)
        return self.url

    async def stop(self) -> None:
        """Stop uvicorn (requests in flight get its graceful second) and close the socket."""
        if self._server is not None and self._serve_task is not None:
            self._server.should_exit = True
            with contextlib.suppress(Exception):
                await self._serve_task
        self._server = None
        self._serve_task = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None
