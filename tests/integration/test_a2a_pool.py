"""The peers' connection pool (crosstalk.a2a.pool.SlotPool) against a real HTTP/1.1 server.

The server is a few lines of asyncio on 127.0.0.1 that answers every GET with keep-alive, and
counts the connections it accepted and holds open: what a pool is for is which connections it
opens, reuses and closes, so that is what these tests look at.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import httpx
import pytest

from crosstalk.a2a.pool import SlotPool
from crosstalk.a2a.transport import new_transport
from tests.support.waiting import eventually

pytestmark = pytest.mark.anyio


@dataclass
class Server:
    port: int = 0
    accepted: int = 0
    open: int = 0
    #: Answers wait for this while it is clear (to hold requests in flight).
    go: asyncio.Event = field(default_factory=asyncio.Event)
    in_flight: int = 0
    most_in_flight: int = 0
    writers: list[asyncio.StreamWriter] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self.open += 1
        self.writers.append(writer)
        try:
            while True:
                try:
                    await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                self.in_flight += 1
                self.most_in_flight = max(self.most_in_flight, self.in_flight)
                await self.go.wait()
                self.in_flight -= 1
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        finally:
            self.open -= 1
            writer.close()


@asynccontextmanager
async def serving() -> AsyncIterator[Server]:
    server = Server()
    server.go.set()
    tcp = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    server.port = tcp.sockets[0].getsockname()[1]
    try:
        yield server
    finally:
        tcp.close()
        for writer in server.writers:
            writer.close()
        await tcp.wait_closed()


def pool(max_connections: int = 100, max_idle: int = 20) -> SlotPool:
    def slot() -> httpx.AsyncBaseTransport:
        return httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=1,
                                                            max_keepalive_connections=1))
    return SlotPool(slot, max_connections=max_connections, max_idle=max_idle)


async def held_at(server: Server, client: httpx.AsyncClient,
                  url: str) -> asyncio.Future[httpx.Response]:
    """A request sent and waiting at the server, which holds its answers from now on."""
    server.go.clear()
    sent = asyncio.ensure_future(client.get(url))
    await eventually(lambda: server.in_flight == 1, what="the request at the server")
    return sent


async def test_concurrent_rounds_reuse_one_connection_per_request_in_flight() -> None:
    async with serving() as server, httpx.AsyncClient(transport=new_transport()) as client:
        url = f"http://127.0.0.1:{server.port}/"
        for _ in range(5):
            answers = await asyncio.gather(*(client.get(url) for _ in range(16)))
            assert [a.text for a in answers] == ["ok"] * 16
        assert server.accepted == 16  # 80 requests, 16 at a time, on 16 kept connections


async def test_no_more_connections_than_the_limit_and_every_request_is_answered() -> None:
    async with serving() as server, httpx.AsyncClient(transport=pool(2)) as client:
        url = f"http://127.0.0.1:{server.port}/"
        server.go.clear()
        sends = [asyncio.ensure_future(client.get(url)) for _ in range(5)]
        await eventually(lambda: server.in_flight == 2, what="two requests at the server")
        await asyncio.sleep(0.05)  # a third would have arrived by now
        assert server.in_flight == 2
        server.go.set()
        answers = await asyncio.gather(*sends)
        assert [a.status_code for a in answers] == [200] * 5
        assert server.most_in_flight == 2
        assert server.accepted == 2


async def test_a_request_that_waits_past_its_pool_timeout_gets_pool_timeout() -> None:
    async with serving() as server, httpx.AsyncClient(transport=pool(1)) as client:
        url = f"http://127.0.0.1:{server.port}/"
        first = await held_at(server, client, url)
        with pytest.raises(httpx.PoolTimeout):
            await client.get(url, timeout=httpx.Timeout(5.0, pool=0.05))
        server.go.set()
        assert (await first).text == "ok"
        assert (await client.get(url)).text == "ok"  # the pool still works
        assert server.accepted == 1


async def test_a_cancelled_waiter_passes_its_turn_to_the_next() -> None:
    async with serving() as server, httpx.AsyncClient(transport=pool(1)) as client:
        url = f"http://127.0.0.1:{server.port}/"
        first = await held_at(server, client, url)
        second = asyncio.ensure_future(client.get(url))
        third = asyncio.ensure_future(client.get(url))
        await asyncio.sleep(0.02)
        second.cancel()
        server.go.set()
        assert (await first).text == "ok"
        assert (await third).text == "ok"
        assert second.cancelled()


async def test_a_connection_the_server_closed_while_idle_is_replaced() -> None:
    async with serving() as server, httpx.AsyncClient(transport=pool()) as client:
        url = f"http://127.0.0.1:{server.port}/"
        assert (await client.get(url)).text == "ok"
        for writer in server.writers:
            writer.close()
        await eventually(lambda: server.open == 0, what="the server closed its end")
        assert (await client.get(url)).text == "ok"
        assert server.accepted == 2


async def test_idle_connections_beyond_max_idle_are_closed() -> None:
    async with serving() as server, httpx.AsyncClient(transport=pool(max_idle=3)) as client:
        url = f"http://127.0.0.1:{server.port}/"
        await asyncio.gather(*(client.get(url) for _ in range(8)))
        await eventually(lambda: server.open == 3, what="only max_idle connections kept open")
        assert server.accepted == 8


async def test_a_full_pool_gives_up_another_origins_idle_connection() -> None:
    one = pool(1)
    async with serving() as a, serving() as b, httpx.AsyncClient(transport=one) as client:
        assert (await client.get(f"http://127.0.0.1:{a.port}/")).text == "ok"
        assert (await client.get(f"http://127.0.0.1:{b.port}/")).text == "ok"
        await eventually(lambda: a.open == 0, what="the first origin's connection closed")
        assert b.open == 1


async def test_closing_the_pool_closes_its_connections_and_fails_waiters() -> None:
    async with serving() as server:
        transport = pool(1)
        client = httpx.AsyncClient(transport=transport)
        url = f"http://127.0.0.1:{server.port}/"
        assert (await client.get(url)).text == "ok"
        held = await held_at(server, client, url)
        waiting = asyncio.ensure_future(client.get(url))
        await asyncio.sleep(0.02)
        await transport.aclose()
        with pytest.raises(httpx.ConnectError):
            await waiting
        server.go.set()
        assert (await held).text == "ok"  # the one in flight finishes, then its slot closes
        await eventually(lambda: server.open == 0, what="every connection closed")
        with pytest.raises(httpx.ConnectError):
            await client.get(url)
