"""Accepting connections on a listening socket, without asyncio's flood when descriptors run out.

asyncio's selector accept loop (CPython 3.11-3.13, python/cpython#151615) keeps calling
``accept()`` after EMFILE/ENFILE: every failure logs a traceback and schedules one more retry,
and the retries multiply. Measured here with ``RLIMIT_NOFILE=256`` and 300 idle connections:
100,000 log lines (7 MB) in 3 s, the loop spinning, both of an agent's ingresses stalled. Both
ingresses (the A2A listener's uvicorn and the uds ingress) accept through :class:`Acceptor`
instead:

- out of descriptors (EMFILE, ENFILE, ENOBUFS, ENOMEM), it stops reading the socket, asks its
  owner to shed a connection it can spare (``shed``), and tries again after a pause that
  doubles from :data:`RETRY_FIRST` to :data:`RETRY_MAX` while the shortage lasts;
- it logs one line (no traceback) when a shortage starts and one when accepting works again,
  each at most once a minute (:class:`Throttled`), each saying how many it held back.

Each accepted socket becomes a transport through ``loop.connect_accepted_socket``, as
``loop.create_server`` would have made it, unless its owner takes it first (``take``: a uds
frame that came whole with its connection is served from the socket itself, ADR 0048).
What the peer has already sent is read as it is accepted and handed to its protocol first,
so an owner that must close connections to make room judges a newcomer by its request, not
by a guess (a sender writes its request as it connects; under a flood, a connection not yet
read would otherwise look like any other).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

#: Errors that mean "no descriptor or buffer for a new connection right now".
EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
#: First pause after a failed accept, in seconds; doubled while failures go on.
RETRY_FIRST = 0.05
#: Longest pause between accept attempts while failures go on.
RETRY_MAX = 1.0
#: Pause after shedding a connection: its descriptor is closed on the next loop turn.
RETRY_AFTER_SHED = 0.01
#: Connections taken per readiness event (asyncio takes 100). Few, so that under a flood of
#: new connections the ones already taken are read before many more arrive: a connection that
#: is made to give way is judged by what it sent (measured: with 100, 2-4 % of a sender's
#: fresh connections were displaced before their request was read, under 400 reconnecting
#: slowloris connections; with 8, none of 500). 8 a loop turn is still thousands a second.
ACCEPTS_PER_EVENT = 8
#: At most one log line per this many seconds while a shortage lasts.
LOG_INTERVAL = 60.0

#: Most bytes read from a connection as it is accepted.
FIRST_READ = 64 * 1024
#: Where the owner takes whole requests (``take``), how long an accepted connection with
#: nothing to read yet is waited on before it is made a transport anyway.
FIRST_WAIT = 0.05

#: Makes the protocol for one accepted connection, given the bytes its peer had already sent
#: (read at accept). The protocol must take them as its first data in ``connection_made``:
#: the transport starts reading only after that returns.
ProtocolFactory = Callable[[bytes], asyncio.BaseProtocol]


class Throttled:
    """One log line per ``interval`` at most; the next line says how many were held back."""

    def __init__(self, logger: logging.Logger, interval: float = LOG_INTERVAL) -> None:
        self.logger = logger
        self.interval = interval
        self._last: float | None = None
        self._held = 0

    def warning(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if self._last is not None and now - self._last < self.interval:
            self._held += 1
            return
        held, self._held, self._last = self._held, 0, now
        if held:
            self.logger.warning(message + " (%d more like it since the last line)",
                                *args, held)
        else:
            self.logger.warning(message, *args)


class Acceptor:
    """Serve ``sock`` (bound, not yet listening): each connection gets ``factory()``'s
    protocol. Quacks like the ``asyncio.Server`` it replaces: :meth:`close`,
    :meth:`wait_closed`, :meth:`is_serving`.

    ``shed`` is asked, when descriptors run out, to close one connection the owner can spare
    (an idle one, say); it returns whether it did.
    """

    def __init__(self, sock: socket.socket, factory: ProtocolFactory, *, name: str,
                 backlog: int = 100, shed: Callable[[], bool] | None = None,
                 take: Callable[[socket.socket, bytes], bool] | None = None) -> None:
        self.sock = sock
        self.factory = factory
        #: Offered each accepted socket with its first bytes (read at accept, or as soon as
        #: they come within :data:`FIRST_WAIT`): the owner may take it and serve it without
        #: a transport (say ``True``; the socket is then its to close), or leave it to
        #: ``factory`` (``False``, nothing consumed).
        self.take = take
        self.name = name
        self.backlog = backlog
        self.shed = shed
        self._loop = asyncio.get_running_loop()
        self._reading = False
        self._closed = False
        self._retry: asyncio.TimerHandle | None = None
        self._delay = RETRY_FIRST
        self._short = False
        self._failures = 0
        self._starting: set[asyncio.Task[None]] = set()
        #: Accepted sockets with nothing to read yet, by descriptor, and their deadlines.
        self._waiting: dict[int, tuple[socket.socket, asyncio.TimerHandle]] = {}
        self._short_log = Throttled(log)
        self._resumed_log = Throttled(log)

    def start(self) -> None:
        """Listen and start accepting."""
        self.sock.setblocking(False)
        self.sock.listen(self.backlog)
        self._read()

    def is_serving(self) -> bool:
        return not self._closed

    def close(self) -> None:
        """Stop accepting and close the listening socket (connections already made stay)."""
        if self._closed:
            return
        self._closed = True
        self._unread()
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        for fd in list(self._waiting):  # nothing of theirs was read: closed unheard
            self._unwait(fd)[0].close()
        self.sock.close()

    async def wait_closed(self) -> None:
        """Return once the connections accepted before :meth:`close` have their transports."""
        while self._starting:
            await asyncio.gather(*self._starting, return_exceptions=True)

    # -- the accept loop ---------------------------------------------------------------

    def _read(self) -> None:
        if not self._closed and not self._reading:
            self._loop.add_reader(self.sock.fileno(), self._accept)
            self._reading = True

    def _unread(self) -> None:
        if self._reading:
            self._reading = False
            with contextlib.suppress(ValueError, OSError):  # the socket may be closed
                self._loop.remove_reader(self.sock.fileno())

    def _accept(self) -> None:
        for _ in range(ACCEPTS_PER_EVENT):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue  # the peer gave up while queued: nothing to serve
            except OSError as exc:
                self._shortage(exc)
                return
            if self._short:
                self._resumed_log.warning("%s: accepting again after %d failed accepts",
                                          self.name, self._failures)
                self._short, self._failures = False, 0
            self._delay = RETRY_FIRST
            conn.setblocking(False)
            try:
                first = _first_bytes(conn)
            except OSError:
                conn.close()  # reset while queued
                continue
            if self.take is not None and not first:
                self._wait_first(conn)
            else:
                self._hand_over(conn, first)

    def _hand_over(self, conn: socket.socket, first: bytes) -> None:
        """To the owner, if it takes the socket as it is; else to a transport."""
        if first and self.take is not None and self.take(conn, first):
            return
        task = self._loop.create_task(self._connect(conn, first))
        self._starting.add(task)
        task.add_done_callback(self._starting.discard)

    def _wait_first(self, conn: socket.socket) -> None:
        """Nothing to read yet where the owner takes whole requests: a sender writes right
        after it connects, so wait for its first bytes, up to :data:`FIRST_WAIT`, before the
        connection is made a transport (whose own bounds then apply)."""
        fd = conn.fileno()
        self._loop.add_reader(fd, self._first_came, fd)
        self._waiting[fd] = (conn, self._loop.call_later(FIRST_WAIT, self._no_first, fd))

    def _first_came(self, fd: int) -> None:
        conn, _ = self._unwait(fd)
        try:
            first = _first_bytes(conn)
        except OSError:
            conn.close()  # reset before it said anything
            return
        self._hand_over(conn, first)

    def _no_first(self, fd: int) -> None:
        conn, _ = self._unwait(fd)
        self._hand_over(conn, b"")

    def _unwait(self, fd: int) -> tuple[socket.socket, asyncio.TimerHandle]:
        conn, timer = self._waiting.pop(fd)
        timer.cancel()
        self._loop.remove_reader(fd)
        return conn, timer

    def _shortage(self, exc: OSError) -> None:
        """Pause accepting (the socket stays readable, so reading on would spin), shed a
        connection if the owner can spare one, and try again later; say so once."""
        self._failures += 1
        self._short = True
        self._short_log.warning("%s: cannot accept (%s); pausing, retrying up to every %.2f s",
                          self.name, errno.errorcode.get(exc.errno or 0, str(exc)), RETRY_MAX)
        self._unread()
        shed = exc.errno in EXHAUSTED and self.shed is not None and self.shed()
        delay = RETRY_AFTER_SHED if shed else self._delay
        if not shed:
            self._delay = min(self._delay * 2, RETRY_MAX)
        self._retry = self._loop.call_later(delay, self._resume)

    def _resume(self) -> None:
        self._retry = None
        self._read()

    async def _connect(self, conn: socket.socket, first: bytes) -> None:
        try:
            await self._loop.connect_accepted_socket(lambda: self.factory(first), sock=conn)
        except OSError:
            conn.close()  # the peer is already gone


def _first_bytes(conn: socket.socket) -> bytes:
    """What the peer has sent so far (a client writes its request as it connects), or b""."""
    try:
        return conn.recv(FIRST_READ)
    except (BlockingIOError, InterruptedError):
        return b""
