"""A connection pool whose cost per request does not grow with the connections it holds.

Why not httpcore's own pool: every request passes through
``AsyncConnectionPool._assign_requests_to_connections`` several times, and each pass walks
every connection (a ``poll`` on each idle socket to see whether the server closed it) and,
for each idle one, counts all of them again. With the 16 connections 16 concurrent sends to
one peer keep, that was ~980 ``is_idle`` calls and ~55 socket polls per message, a third of
a sender's CPU (profiled, ``bench/throughput.py --path a2a``; ADR 0042).

Here each connection is its own httpcore pool of one (a *slot*): that pool's bookkeeping
walks one connection, and keeps what httpcore does well (keep-alive expiry, noticing a
server's close before reuse, the h11 state machine). This pool only picks a free slot for
the request's origin, most recently used first (its connection is the warmest), makes a new
one while fewer than ``max_connections`` are busy, and otherwise waits for one to come free.
A slot is busy from the request until its response is closed, as a pooled connection is.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Callable

import httpx

Origin = tuple[bytes, bytes, int | None]


def _origin(url: httpx.URL) -> Origin:
    return (url.raw_scheme, url.raw_host, url.port)


class _Releasing(httpx.AsyncByteStream):
    """A response body that frees its slot when it is closed (once)."""

    def __init__(self, inner: httpx.AsyncByteStream, release: Callable[[], None]) -> None:
        self._inner = inner
        self._release: Callable[[], None] | None = release

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            release, self._release = self._release, None
            if release is not None:
                release()


class SlotPool(httpx.AsyncBaseTransport):
    """Pools ``make_slot()`` transports, one connection each (see the module docstring).

    ``max_idle`` slots are kept per origin once freed; more are closed, as httpx's
    ``max_keepalive_connections`` would.
    """

    def __init__(self, make_slot: Callable[[], httpx.AsyncBaseTransport], *,
                 max_connections: int, max_idle: int) -> None:
        self._make_slot = make_slot
        self._max_connections = max_connections
        self._max_idle = max_idle
        self._idle: dict[Origin, list[httpx.AsyncBaseTransport]] = {}
        self._busy = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._closing: set[asyncio.Task[None]] = set()
        self._closed = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        origin = _origin(request.url)
        timeouts = request.extensions.get("timeout", {})
        slot = await self._acquire(origin, timeouts.get("pool"))
        try:
            response = await slot.handle_async_request(request)
        except BaseException:
            self._release(origin, slot)
            raise
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _Releasing(response.stream, lambda: self._release(origin, slot))
        return response

    async def _acquire(self, origin: Origin, timeout: float | None
                       ) -> httpx.AsyncBaseTransport:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            if self._closed:
                raise httpx.ConnectError("the connection pool is closed")
            idle = self._idle.get(origin)
            if idle:
                self._busy += 1
                return idle.pop()
            idle_count = sum(len(slots) for slots in self._idle.values())
            if self._busy + idle_count < self._max_connections:
                self._busy += 1
                return self._make_slot()
            if idle_count:  # every free slot is another origin's: give one up
                other = next(slots for slots in self._idle.values() if slots)
                self._close_slot(other.pop())
                continue
            waiter = loop.create_future()
            self._waiters.append(waiter)
            try:
                async with asyncio.timeout_at(deadline):
                    await waiter
            except TimeoutError as exc:
                self._forget(waiter)
                raise httpx.PoolTimeout(f"no connection came free in {timeout} s") from exc
            except asyncio.CancelledError:
                self._forget(waiter)
                raise

    def _forget(self, waiter: asyncio.Future[None]) -> None:
        if waiter.done() and not waiter.cancelled():
            self._wake_one()  # woken, then gave up: the turn passes on
        else:
            with contextlib.suppress(ValueError):  # a wake-up may have dropped it already
                self._waiters.remove(waiter)

    def _release(self, origin: Origin, slot: httpx.AsyncBaseTransport) -> None:
        self._busy -= 1
        idle = self._idle.setdefault(origin, [])
        if self._closed or len(idle) >= self._max_idle:
            self._close_slot(slot)
        else:
            idle.append(slot)
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _close_slot(self, slot: httpx.AsyncBaseTransport) -> None:
        task = asyncio.get_running_loop().create_task(slot.aclose())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def aclose(self) -> None:
        self._closed = True
        slots = [slot for idle in self._idle.values() for slot in idle]
        self._idle.clear()
        while self._waiters:
            self._wake_one()  # each finds the pool closed
        for slot in slots:
            await slot.aclose()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
