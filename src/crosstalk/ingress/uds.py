"""The Claude-compatible unix-socket ingress (seed §5 "uds ingress"; design §4 items 3-5).

Wire format: :mod:`crosstalk.ingress.claude_wire`.

A connection carries one message, in one of two shapes:

(a) ``{"type":"auth","token":T}`` then one ``{"type":"user",...}`` line. ``T`` must equal the
    content of the key file beside the socket (``<path minus .sock>.key``, a regular 0600 file
    owned by us; anything else fails every auth). The sender is still identified by the peer's
    credentials: a registered agent if its pid maps to exactly one live descriptor, else
    *unverified* (``crosstalk send`` from a script). Exactly one ack line comes back —
    ``{"type":"ack","message_id":…,"state":…,"reason":…}`` — then the server closes.
(b) one ``{"type":"user",...}`` line and no auth line: Claude's own SendMessage. Accepted only
    when the peer pid (SO_PEERCRED), with the start time read at accept, maps to exactly one
    live descriptor by ``pid``/``started_at`` or ``harness_pid``/``harness_started_at``. Anything
    else — no match, or a pooled pid matching several descriptors — is closed with no state:
    nothing journaled, nothing injected. Shape (b) never gets a byte back, on success or on any
    rejection: Claude's sender takes EOF as success and reports a socket still open after 5 s
    as a failure, so the server closes as soon as the frame is journaled ``submitted``.

Dispatch is the agent's: both shapes hand admitted messages to the agent's one ordered
dispatch lane (:class:`Lane`), which the A2A ingress shares. Shape (a) waits for its
message's turn and outcome before it acks; shape (b) does not wait at all.

A connection takes one of two paths to the same frame handlers (ADR 0048). A shape (a) frame
that came whole with its connection is served from the accepted socket itself
(:meth:`UdsIngress._take_whole`); every other connection is a protocol that reads its frame
as its bytes arrive. Both are :mod:`crosstalk.ingress.connection`'s.

What a connection costs (:mod:`crosstalk.ingress.budget`): the cap counts connections still
reading their frame, and a newcomer beyond it closes the oldest of them; a first line must come
within :data:`~crosstalk.ingress.claude_wire.FIRST_LINE_TIMEOUT`. Shape (a)'s ack is still the
injection's outcome — never given at admission, where ``accepted`` would not yet be true (and a
uds message a crash leaves ``submitted`` is recovered, never injected: seed R2) — so its sender
waits, outside the cap but under the receiver's wait limit: beyond ``Limits.max_waits`` a new
frame is refused before admission (``rejected``, ``too_many_waits``, nothing journaled). A retry
of an admitted message is answered from the past and needs no wait. ADR 0013.

Identity comes only from the transport (peer pid + start time → descriptor); what a frame says
about itself (``msg_id``, ``from``, ``priority``, ``session_id``, envelope attributes) is kept as
display claims only (:func:`crosstalk.ingress.claude_wire.user_frame`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import secrets
import socket
import stat
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from crosstalk.capture import stream as capture
from crosstalk.capture.tap import IN, UDS, Tap
from crosstalk.config import PRIVATE_FILE_MODE, uds_key_path
from crosstalk.core.message import Ingress, Message, Sender
from crosstalk.ingress import connection
from crosstalk.ingress.accept import Acceptor
from crosstalk.ingress.budget import MAX_CONNECTIONS, Connections
from crosstalk.ingress.claude_wire import (
    FIRST_LINE_TIMEOUT,
    IDLE_TIMEOUT,
    MAX_LINE,
    BadFrame,
    Close,
    LineBuffer,
    ack_line,
    message_of,
    parse_line,
    user_frame,
)
from crosstalk.ingress.connection import Frames
from crosstalk.ingress.peers import Peer, StartTimes, identify, peer_of, verified
from crosstalk.ingress.socket_files import (
    IngressError,
    KeyFile,
    clear_stale_socket,
    private_dir,
    read_key,
)
from crosstalk.receiver import Inbound, Receiver, ReceiverUnavailable, Result
from crosstalk.store.files import unlink_durable, write_atomic
from crosstalk.store.registry import Descriptor, Registry

log = logging.getLogger(__name__)

#: How long stop() lets a connection already inside the receiver chain finish.
CLOSE_GRACE = 2.0
#: Longest socket path accepted, in bytes; Claude Code refuses longer ones (macOS' sun_path is
#: 104 bytes with the NUL, Linux' 108), so a longer path could not be addressed by Claude anyway.
MAX_SOCKET_PATH = 103
#: In-flight accepts surface as connection tasks within a few loop turns after the listener
#: closes; stop() waits this many quiet turns before it declares the server drained.
_SETTLE_TURNS = 8


#: Receives a control frame with the peer's pid and start time (``None`` if unknown).
ControlFrameHandler = Callable[[Mapping[str, Any], int | None, str | None], None]


class Lane(Protocol):
    """What the ingress needs from its agent's dispatch lane (one per agent, in order)."""

    def submit(self, entry: Inbound, *, resume: bool = False) -> None:
        """Dispatch ``entry`` in its turn; do not wait."""

    async def dispatch(self, entry: Inbound) -> Result:
        """Dispatch ``entry`` in its turn and return its outcome."""

    async def settle(self) -> None:
        """Return once everything submitted so far has been dispatched."""


# -- the server --------------------------------------------------------------------------------


class UdsIngress:
    """One agent's Claude-compatible socket, feeding its receiver chain."""

    def __init__(
        self,
        path: Path,
        receiver: Receiver,
        registry: Registry,
        *,
        lane: Lane,
        idle_timeout: float = IDLE_TIMEOUT,
        first_line_timeout: float = FIRST_LINE_TIMEOUT,
        max_line: int = MAX_LINE,
        close_grace: float = CLOSE_GRACE,
        max_connections: int = MAX_CONNECTIONS,
        control: ControlFrameHandler | None = None,
        tap: Tap | None = None,
    ) -> None:
        self.path = Path(os.path.abspath(path))
        self.key_path = uds_key_path(self.path)
        self.receiver = receiver
        self.registry = registry
        #: The agent's dispatch lane: every admitted frame is dispatched there, in order.
        self.lane = lane
        self.idle_timeout = idle_timeout
        self.first_line_timeout = first_line_timeout
        self.max_line = max_line
        self.close_grace = close_grace
        self.max_connections = max_connections
        #: Where control frames (Claude's receipts) go; they are never messages.
        self.control = control
        #: Where every frame line read and ack written goes for ``crosstalk capture``.
        self.tap = tap or Tap(self.path.stem)
        self._server: Acceptor | None = None
        self.conns = Connections(max_connections, str(self.path))
        self._closing = False
        self._token: str | None = None
        self._socket_id: tuple[int, int] | None = None
        self._key_warned = False
        self._key = KeyFile(self.key_path, on_unsafe=self._warn_key)
        #: Senders' start times, kept while they live (a /proc read per frame otherwise).
        self.start_times = StartTimes()
        #: Acks a whole frame's socket could not take at once, finishing on a transport.
        self.late: set[asyncio.Task[None]] = set()

    @property
    def serving(self) -> bool:
        return self._server is not None

    @property
    def closing(self) -> bool:
        """Stopping: a connection made now is closed unheard."""
        return self._closing

    @property
    def connections(self) -> int:
        """Connections being served right now."""
        return len(self.conns)

    @property
    def reading(self) -> int:
        """Connections still reading their frame (the ones :data:`MAX_CONNECTIONS` counts)."""
        return self.conns.readers

    async def __aenter__(self) -> UdsIngress:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.stop()

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Private directory, fresh key (0600, atomic), socket bound 0600, then serve."""
        if self._server is not None:
            raise IngressError(f"uds ingress on {self.path} is already serving")
        if len(os.fsencode(self.path)) > MAX_SOCKET_PATH:
            raise IngressError(f"socket path {self.path} is longer than {MAX_SOCKET_PATH} bytes")
        private_dir(self.path.parent)
        clear_stale_socket(self.path)
        # The key first: a sender that finds the socket must be able to authenticate.
        token = secrets.token_hex(16)  # Claude's peerToken shape: 32 hex
        write_atomic(self.key_path, token.encode() + b"\n", PRIVATE_FILE_MODE)
        self._token, self._closing, self._key_warned = token, False, False
        self.tap.secrets.add(token)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(os.fspath(self.path))
            os.chmod(self.path, PRIVATE_FILE_MODE)  # the 0700 directory guards the gap
            st = os.lstat(self.path)
            self._socket_id = (st.st_dev, st.st_ino)
            # the Acceptor: start_unix_server without its EMFILE log flood
            self._server = Acceptor(sock, partial(connection.Connection, self),
                                    name=f"uds ingress {self.path}", take=self._take_whole)
            self._server.start()
        except BaseException:
            sock.close()
            self._remove_files()
            raise
        log.debug("uds ingress serving on %s", self.path)

    def close_listener(self) -> None:
        """Stop accepting and remove our socket and key now; :meth:`stop` finishes the rest."""
        if self._server is not None and not self._closing:
            self._closing = True
            self._server.close()
            self._remove_files()

    async def stop(self) -> None:
        """Stop listening, finish or cancel every connection, remove our socket and key.

        Dispatches are the lane's: its owner closes it (before this, so a connection waiting
        for its outcome is released rather than cut off after a second grace)."""
        server, self._server = self._server, None
        if server is None:
            return
        self._closing = True
        server.close()
        self.tap.end_all()  # a capture is no connection to wait for
        # The address goes first: a harness may kill us within ~0.5 s of asking us to stop
        # (Claude: SIGINT, SIGTERM 100 ms later, SIGKILL 400 ms after that), and a socket and
        # key left behind outlive us. Accepted connections are not affected by the unlink.
        self._remove_files()
        quiet = 0
        while quiet < _SETTLE_TURNS:
            if self.conns:
                quiet = 0
                await self._drain_connections()
            else:
                quiet += 1
                await asyncio.sleep(0)
        await server.wait_closed()
        if self.late:  # acks still being written: bounded by the grace like a connection
            _, pending = await asyncio.wait(self.late, timeout=self.close_grace)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        self._remove_files()
        self.start_times.close()
        log.debug("uds ingress on %s stopped", self.path)

    async def settle(self) -> None:
        """Wait until every native frame already admitted has been dispatched."""
        await self.lane.settle()

    async def _drain_connections(self) -> None:
        tasks = []
        for conn in self.conns:
            if conn.task is None:
                conn.close()  # still reading: nothing of it was accepted yet
                self.conns.remove(conn)
            else:
                tasks.append(conn.task)
        if not tasks:
            await asyncio.sleep(0)
            return
        _, pending = await asyncio.wait(tasks, timeout=self.close_grace)
        for task in pending:
            task.cancel()  # a dispatch cancelled here is journaled unknown by the receiver
        await asyncio.gather(*tasks, return_exceptions=True)

    def _remove_files(self) -> None:
        """Remove the socket and key, but only while they are still the ones we made."""
        with contextlib.suppress(OSError):
            st = os.lstat(self.path)
            if stat.S_ISSOCK(st.st_mode) and (st.st_dev, st.st_ino) == self._socket_id:
                unlink_durable(self.path)
        if self._token is not None and self._read_key(check_mode=False) == self._token:
            with contextlib.suppress(OSError):
                unlink_durable(self.key_path)
        self._socket_id = None
        self._token = None

    def _take_whole(self, sock: socket.socket, first: bytes) -> bool:
        """Serve from the socket itself a connection whose frame came whole with it (the
        :class:`Acceptor` offers each with what it read at accept): no transport, no task
        until the receiver chain, no timer (ADR 0048). Only the usual shape (a) frame
        qualifies, an auth line and a user line, both whole, nothing after them; anything
        else is left to :class:`~crosstalk.ingress.connection.Connection`, with nothing
        consumed or recorded."""
        if self._closing:
            return False
        lines = LineBuffer(self.max_line)
        try:
            lines.feed(first)
            auth_line, user_line = lines.next(), lines.next()
            if auth_line is None or user_line is None or lines.rest():
                return False
            auth, user = parse_line(auth_line), parse_line(user_line)
        except (Close, BadFrame):
            return False
        if auth.get("type") != "auth" or user.get("type") != "user":
            return False
        peer = peer_of(sock, self.start_times)
        if connection.foreign(self, peer):
            sock.close()
            return True
        conn = connection.WholeFrame(self, sock, peer)
        try:
            self.tap.emit(UDS, IN, auth_line)
            self.first_line(conn, auth)
            if conn.closed:
                return True  # refused: answered and closed
            self.tap.emit(UDS, IN, user_line)
            conn.done_reading()
            self.frame_after_auth(conn, user)
        except Exception:  # a bug must not reach the accept loop (as Connection._read does)
            log.exception("uds ingress %s: connection failed", self.path)
            conn.close()
        return True

    # -- frames ------------------------------------------------------------------------------
    # A connection (crosstalk.ingress.connection) reads its frame and hands it here: what can
    # answer at once does, and what waits (the receiver chain) runs in the connection's task.

    def first_line(self, conn: Frames, obj: Mapping[str, Any]) -> None:
        kind = obj.get("type")
        if kind == "auth":
            token = obj.get("token")
            if not isinstance(token, str) or not self._token_ok(token):
                conn.done_reading()
                log.info("uds ingress %s: authentication failed", self.path)
                conn.reply(None, "rejected", "auth_failed")
                return
            conn.authenticated()
            return
        conn.done_reading()  # the first line is the frame
        if kind == "user":
            conn.spawn(self._shape_b(obj, conn.peer))
        elif kind == "control":
            # Receipts (peer_message_status) and other control frames are not messages: never
            # injected, never answered; the handler decides whether they name our frames.
            self._control(obj, conn.peer)
            conn.close()
        else:
            log.debug("uds ingress %s: unknown frame type", self.path)
            conn.close()

    def frame_after_auth(self, conn: Frames, obj: Mapping[str, Any]) -> None:
        """Shape (a)'s second line (the auth line has been accepted)."""
        try:
            kind = obj.get("type")
            if kind == "control":
                self._control(obj, conn.peer)
                conn.close()
                return
            if kind == capture.CAPTURE_TYPE:  # outside the cap, never a wait
                assert isinstance(conn, connection.Connection)  # _take_whole takes user frames only
                reader, writer = conn.streams()
                full = ack_line(None, "rejected", capture.REFUSED_REASON)
                conn.spawn(capture.serve(self.tap, reader, writer, full))
                return
            if kind != "user":
                raise BadFrame("not a user frame")
            frame = user_frame(obj)
        except BadFrame as exc:
            self.bad_frame_after_auth(conn, exc)
            return
        if frame.kind is None:
            conn.reply(frame.message_id, "rejected", "unknown_kind")
            return
        msg = message_of(frame, self._sender(conn.peer))
        # A retry of an admitted message is answered from the past (never denied); only a new
        # message waits for an outcome, and waiting is bounded (the module docstring).
        waits = msg.message_id not in self.receiver.entries
        if waits and (refused := self.receiver.admission.reserve_wait()) is not None:
            log.debug("uds ingress %s: no free wait slot, %s refused", self.path,
                      msg.message_id)
            conn.reply(msg.message_id, "rejected", refused)
            return
        conn.spawn(self._shape_a(conn, msg, waits))

    def bad_frame_after_auth(self, conn: Frames, exc: BadFrame) -> None:
        log.debug("uds ingress %s: bad frame after auth (%s)", self.path, exc)
        conn.reply(None, "rejected", "bad_frame")

    async def _shape_a(self, conn: Frames, msg: Message, waits: bool) -> None:
        try:
            result = await self.receiver.receive(msg, dispatch=self.lane.dispatch, fused=True)
        except ReceiverUnavailable as exc:
            log.warning("uds ingress %s: %s", self.path, exc)
            conn.reply(msg.message_id, "error", "journal_unavailable")
            return
        finally:
            if waits:
                self.receiver.admission.release_wait()
        conn.reply(result.message_id, result.state.value, result.reason)

    async def _shape_b(self, obj: Mapping[str, Any], peer: Peer | None) -> None:
        # Nothing is ever written back on this shape: Claude's sender reads EOF as success.
        try:
            frame = user_frame(obj)
        except BadFrame as exc:
            log.debug("uds ingress %s: bad native frame (%s)", self.path, exc)
            return
        desc = self._identify(peer)
        if desc is None:
            log.info("uds ingress %s: unauthenticated frame from pid %s, which is not exactly "
                     "one registered agent: closed", self.path, peer.pid if peer else "?")
            return
        if frame.kind is None:
            log.info("uds ingress %s: frame asked for a kind outside the protocol", self.path)
            return
        msg = message_of(frame, verified(desc, peer))
        try:
            admitted = await self.receiver.admit(msg)
        except ReceiverUnavailable as exc:
            log.warning("uds ingress %s: %s", self.path, exc)
            return
        if isinstance(admitted, Inbound):
            # The message is durable (journaled submitted), so EOF may go now: Claude's sender
            # reports a failure if the socket stays open 5 s, and its model would then resend
            # a frame that dedupe cannot catch. Injection follows in the agent's lane.
            self.lane.submit(admitted)

    def _control(self, obj: Mapping[str, Any], peer: Peer | None) -> None:
        if self.control is None:
            log.debug("uds ingress %s: control frame %r ignored", self.path, obj.get("action"))
            return
        try:
            self.control(obj, peer.pid if peer else None, peer.start_time if peer else None)
        except Exception:
            log.exception("uds ingress %s: control frame handler failed", self.path)

    # -- identity ----------------------------------------------------------------------------

    def _sender(self, peer: Peer | None) -> Sender:
        desc = self._identify(peer)
        if desc is not None:
            return verified(desc, peer)
        return Sender(agent_id=None, ingress=Ingress.UDS, peer_pid=peer.pid if peer else None)

    def _identify(self, peer: Peer | None) -> Descriptor | None:
        return identify(self.registry, peer, str(self.path))

    def _token_ok(self, token: str) -> bool:
        stored = self._key.current()
        return bool(stored) and stored is not None and hmac.compare_digest(
            stored.encode(), token.encode())

    def _read_key(self, *, check_mode: bool) -> str | None:
        return read_key(self.key_path, check_mode=check_mode, on_unsafe=self._warn_key)

    def _warn_key(self) -> None:
        if not self._key_warned:
            self._key_warned = True
            log.warning("uds ingress %s: key file %s is not a 0600 file of ours; refusing "
                        "every authentication", self.path, self.key_path)
