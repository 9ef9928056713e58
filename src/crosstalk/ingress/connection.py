"""One uds ingress connection, read (ADR 0048): how a connection's bytes become the frame the
ingress judges, on one of two paths.

- :class:`WholeFrame`: a shape (a) frame that came whole with its connection (the acceptor read
  it at accept) is served from the accepted socket itself: no transport, no timer; the ack is
  one ``send`` and the socket is closed.
- :class:`Connection`: any other connection is an asyncio protocol whose bytes go into a pure
  line splitter (:class:`~crosstalk.ingress.claude_wire.LineBuffer`) as they arrive, under one
  timer armed only while a line is missing.

Both hand each line's object to their :class:`Host` (the :class:`~crosstalk.ingress.uds.
UdsIngress`, whose frame handlers decide), answer through the same calls (:class:`Frames`),
and start a task only for what waits: the receiver chain, or a capture (:func:`served`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, Protocol

from crosstalk.capture.tap import IN, OUT, UDS, Tap
from crosstalk.ingress.budget import Conn, Connections
from crosstalk.ingress.claude_wire import BadFrame, Close, LineBuffer, ack_line, parse_line
from crosstalk.ingress.peers import Peer, StartTimes, peer_of

#: The uds ingress's own logger: what a connection logs is the ingress's to say.
log = logging.getLogger("crosstalk.ingress.uds")


class Host(Protocol):
    """What a connection needs of its ingress: its bounds, its books, its frame handlers."""

    path: Path
    tap: Tap
    max_line: int
    first_line_timeout: float
    idle_timeout: float
    start_times: StartTimes
    #: Every connection being served (the reader cap, and what stop() drains).
    conns: Connections
    #: Acks a whole frame's socket could not take at once, finishing on a transport.
    late: set[asyncio.Task[None]]

    @property
    def closing(self) -> bool: ...

    def first_line(self, conn: Frames, obj: Mapping[str, Any]) -> None: ...

    def frame_after_auth(self, conn: Frames, obj: Mapping[str, Any]) -> None: ...

    def bad_frame_after_auth(self, conn: Frames, exc: BadFrame) -> None: ...


class Connection(asyncio.Protocol):
    """One connection, read as its bytes arrive: the frame's lines are split and judged in
    ``data_received`` (:class:`~crosstalk.ingress.claude_wire.LineBuffer`), under one timer,
    and a task is started only for what has to wait: the receiver chain, or a capture.

    Streams and a task per connection cost every message about a dozen loop callbacks more
    (a task, a stream reader and writer, a timeout per line, the close waiter): most of the
    loop's work once the lane stopped waiting on writes (ADR 0048)."""

    def __init__(self, ingress: Host, first: bytes) -> None:
        self.ingress = ingress
        self.peer: Peer | None = None
        self._first = first
        self._lines = LineBuffer(ingress.max_line)
        self._transport: asyncio.Transport | None = None
        self._conn: Conn | None = None
        self._authed = False
        self._since = 0.0  # loop time the current bound counts from (accept, then auth)
        self._timer: asyncio.TimerHandle | None = None

    # -- the transport's calls ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        ingress = self.ingress
        if ingress.closing:
            transport.close()
            return
        self.peer = peer = peer_of(transport.get_extra_info("socket"), ingress.start_times)
        if foreign(ingress, peer):
            transport.close()
            return
        self._conn = ingress.conns.add(self._evict)
        self._since = asyncio.get_running_loop().time()
        first, self._first = self._first, b""
        self.data_received(first)

    def data_received(self, data: bytes) -> None:
        if self._conn is None or not self._conn.reading:
            return  # the frame is in hand: what follows is not read
        try:
            self._lines.feed(data)
        except Close as exc:
            self.close(exc.reason)
            return
        self._read()

    def eof_received(self) -> bool:
        if self._conn is not None and self._conn.reading:
            self._lines.end()
            self._read()
        return True  # our side stays open: shape (a)'s ack may still be on its way

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        conn = self._conn
        if conn is not None and conn.task is None:
            self.ingress.conns.remove(conn)

    # -- reading the frame -------------------------------------------------------------------

    def _read(self) -> None:
        conn = self._conn
        assert conn is not None
        try:
            while conn.reading and (obj := self._next_object()) is not None:
                if self._authed:
                    self.done_reading()
                    self.ingress.frame_after_auth(self, obj)
                else:
                    self.ingress.first_line(self, obj)
        except Close as exc:
            self.close(exc.reason)
        except BadFrame as exc:
            if self._authed:
                self.done_reading()
                self.ingress.bad_frame_after_auth(self, exc)
            else:
                log.debug("uds ingress %s: bad first line (%s)", self.ingress.path, exc)
                self.close()
        except Exception:
            log.exception("uds ingress %s: connection failed", self.ingress.path)
            self.close()

    def _next_object(self) -> Mapping[str, Any] | None:
        """The next line's object, ``None`` until one is whole; raises :class:`Close` and
        :class:`BadFrame` as :class:`LineBuffer` and :func:`parse_line` do."""
        line = self._lines.next()
        if line is None:
            if not self._lines.eof:
                self._wait()
            elif self._authed:
                raise BadFrame("no user line after auth")
            else:
                self.close()  # a connect-and-close probe: nothing to say, nothing to record
            return None
        self.ingress.tap.emit(UDS, IN, line)
        return parse_line(line)

    def authenticated(self) -> None:
        """The auth line is good: the frame's next line must come within the idle bound."""
        self._authed = True
        self._disarm()
        self._since = asyncio.get_running_loop().time()

    def done_reading(self) -> None:
        """The frame is in hand (or the connection ends): out of the cap, off the timer."""
        self._disarm()
        if self._conn is not None:
            self.ingress.conns.done_reading(self._conn)

    # -- answering ---------------------------------------------------------------------------

    def reply(self, message_id: str | None, state: str, reason: str | None) -> None:
        """Write the one ack line and close (the transport flushes it before it closes)."""
        ack = ack_line(message_id, state, reason)
        self.ingress.tap.emit(UDS, OUT, ack)
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.write(ack)
        self.close()

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` as this connection's task; the connection ends when it does."""
        assert self._conn is not None
        self._conn.task = asyncio.get_running_loop().create_task(
            served(self.ingress, work, self._ended))

    def _ended(self) -> None:
        if self._conn is not None:
            self.ingress.conns.remove(self._conn)
        if self._transport is not None:
            self._transport.close()

    def streams(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """The rest of the connection as streams (a capture reads and writes for long): the
        transport is handed to a stream protocol, with what arrived after the frame."""
        transport = self._transport
        assert transport is not None
        reader = asyncio.StreamReader(limit=self.ingress.max_line)
        protocol = asyncio.StreamReaderProtocol(reader)
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        if rest := self._lines.rest():
            reader.feed_data(rest)
        if self._lines.eof:
            reader.feed_eof()
        return reader, asyncio.StreamWriter(transport, protocol, reader,
                                            asyncio.get_running_loop())

    # -- ending ------------------------------------------------------------------------------

    def close(self, reason: str | None = None) -> None:
        """End the connection, writing nothing more."""
        if reason is not None:
            log.debug("uds ingress %s: closed (%s)", self.ingress.path, reason)
        self._disarm()
        conn = self._conn
        if conn is not None and conn.task is None:
            self.ingress.conns.remove(conn)
        if self._transport is not None:
            self._transport.close()

    def _evict(self) -> None:
        log.debug("uds ingress %s: connection evicted for a newer one", self.ingress.path)
        self.close()

    def _wait(self) -> None:
        """The frame is not whole yet: bound the wait for its next line, from accept for the
        first line, from the auth line for the next. Armed only now, so a frame that came
        whole with its connection (every sender writes it at once) costs no timer."""
        if self._timer is None:
            ingress = self.ingress
            bound, reason = ((ingress.idle_timeout, "idle_timeout") if self._authed
                             else (ingress.first_line_timeout, "first_line_timeout"))
            self._timer = asyncio.get_running_loop().call_at(self._since + bound, self.close,
                                                             reason)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def foreign(ingress: Host, peer: Peer | None) -> bool:
    """The peer runs as another user: refused before anything it sent is read (said once
    here for both kinds of connection)."""
    if peer is not None and peer.uid != os.getuid():
        log.warning("uds ingress %s: refused a peer of uid %d", ingress.path, peer.uid)
        return True
    return False


async def served(ingress: Host, work: Coroutine[Any, Any, None],
                  ended: Callable[[], None]) -> None:
    """A connection's one task: ``work`` (the receiver chain, or a capture), then ``ended``."""
    try:
        await work
    except asyncio.CancelledError:
        # stop() cancelled us. This task is ours alone and ends here; ending it cancelled
        # would make asyncio's own done-callback log an error.
        log.debug("uds ingress %s: connection cancelled by stop", ingress.path)
    except Exception:
        log.exception("uds ingress %s: connection failed", ingress.path)
    finally:
        ended()


class Frames(Protocol):
    """What the frame handlers of :class:`UdsIngress` need of a connection."""

    peer: Peer | None

    def authenticated(self) -> None: ...
    def done_reading(self) -> None: ...
    def reply(self, message_id: str | None, state: str, reason: str | None) -> None: ...
    def spawn(self, work: Coroutine[Any, Any, None]) -> None: ...
    def close(self, reason: str | None = None) -> None: ...


class WholeFrame:
    """A connection whose frame came whole with it, served from its accepted socket: the ack
    is one ``send`` (a fresh unix socket takes ~200 KB before it would block) and the socket is
    closed. Should the ``send`` not take it all, the rest is left to a transport."""

    def __init__(self, ingress: Host, sock: socket.socket, peer: Peer | None) -> None:
        self.ingress = ingress
        self.peer = peer
        self.closed = False
        self._sock = sock
        self._conn = ingress.conns.add(self.close)

    def authenticated(self) -> None:
        pass  # the frame is already whole: no wait to bound

    def done_reading(self) -> None:
        self.ingress.conns.done_reading(self._conn)

    def reply(self, message_id: str | None, state: str, reason: str | None) -> None:
        ack = ack_line(message_id, state, reason)
        self.ingress.tap.emit(UDS, OUT, ack)
        if self.closed:
            return
        try:
            sent = self._sock.send(ack)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            sent = len(ack)  # the sender is gone: nobody left to answer
        if sent < len(ack):
            self._finish_late(ack[sent:])  # the socket is the transport's from here
        self.close()

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        self._conn.task = asyncio.get_running_loop().create_task(
            served(self.ingress, work, self._ended))

    def _ended(self) -> None:
        self.ingress.conns.remove(self._conn)
        self.close()

    def close(self, reason: str | None = None) -> None:
        if reason is not None:
            log.debug("uds ingress %s: closed (%s)", self.ingress.path, reason)
        if self._conn.task is None:
            self.ingress.conns.remove(self._conn)
        if not self.closed:
            self.closed = True
            self._sock.close()

    def _finish_late(self, rest: bytes) -> None:
        """The ack did not fit at once: a transport takes the socket and writes the rest
        before it closes (``close`` flushes)."""
        self.closed = True  # the socket is the transport's now
        sock, loop = self._sock, asyncio.get_running_loop()

        async def finish() -> None:
            try:
                transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, sock=sock)
            except OSError:
                sock.close()
                return
            transport.write(rest)
            transport.close()

        task = loop.create_task(finish())
        self.ingress.late.add(task)
        task.add_done_callback(self.ingress.late.discard)
