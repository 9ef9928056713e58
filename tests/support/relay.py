"""A raw-socket relay in front of a real A2A listener that plays a server closing an idle
keep-alive connection at the very moment the client reuses it.

The race in the wild: uvicorn closes a connection idle for ``timeout_keep_alive`` seconds;
a client whose pool still holds it writes its next request just as the close happens, and
reads EOF (or a reset) where a response should be. Here the moment is forced: :meth:`Relay.trap`
arms every connection open now, and the next request one of them carries (of the given HTTP
method) is answered the chosen way. Connections opened after the trap pass untouched, so a
client that retries on a fresh connection gets through.

Ways to answer the trapped request (:class:`Trap`):

- ``drop``: read it, forward nothing, close (FIN): the server never saw it.
- ``reset``: the same, closing with RST (``SO_LINGER`` 0): the client reads ECONNRESET.
- ``swallow``: forward it, wait for the server's first response bytes (so the server has
  processed it), relay none of them, close: processed, but no response byte reached the client.
- ``partial``: forward it and relay the response's headers and first ``partial_bytes`` body
  bytes only, then close: a partial answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from dataclasses import dataclass, field
from typing import Literal

Action = Literal["drop", "reset", "swallow", "partial"]


@dataclass
class Trap:
    action: Action
    method: bytes
    partial_bytes: int = 0


@dataclass
class _Conn:
    trap: Trap | None = None
    #: The server's answer to the last request has (started to) come back: the next client
    #: bytes are a new request on a reused connection.
    answered: bool = False
    #: Requests this connection carried (each a burst of client bytes after an answer).
    requests: list[bytes] = field(default_factory=list)


class Relay:
    """``127.0.0.1:<port>`` forwarding byte for byte to ``upstream_port`` until trapped."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.url = ""
        #: Connections accepted, in order.
        self.connections: list[_Conn] = []
        #: How many trapped requests were answered the trap's way.
        self.sprung = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        if self._server is not None:
            await self._server.wait_closed()

    def refuse_new(self) -> None:
        """Stop accepting: a new connection is refused, the open ones go on."""
        if self._server is not None:
            self._server.close()

    def trap(self, action: Action, *, method: bytes = b"GET", partial_bytes: int = 0) -> int:
        """Arm every connection open now for its next ``method`` request; returns how many."""
        armed = 0
        for conn in self.connections:
            if conn.trap is None:
                conn.trap = Trap(action, method, partial_bytes)
                armed += 1
        return armed

    def requests(self, method: bytes | None = None) -> list[bytes]:
        """Every request's first bytes, over all connections (``method`` filters)."""
        return [r for c in self.connections for r in c.requests
                if method is None or r.startswith(method + b" ")]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        conn = _Conn()
        self.connections.append(conn)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        downstream = asyncio.get_running_loop().create_task(
            self._downstream(conn, up_reader, writer))
        try:
            while data := await reader.read(65536):
                if conn.answered or not conn.requests:
                    conn.requests.append(data[:64])
                    conn.answered = False
                    trap = conn.trap
                    if trap is not None and data.startswith(trap.method + b" "):
                        conn.trap = None
                        await self._spring(trap, data, reader=reader, writer=writer,
                                           up_reader=up_reader, up_writer=up_writer,
                                           downstream=downstream)
                        return
                up_writer.write(data)
                await up_writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            downstream.cancel()
            with contextlib.suppress(BaseException):
                await downstream
            writer.close()
            up_writer.close()
            self._tasks.discard(task)

    async def _downstream(self, conn: _Conn, up_reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await up_reader.read(65536):
                conn.answered = True
                writer.write(data)
                await writer.drain()

    async def _spring(self, trap: Trap, data: bytes, *, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter, up_reader: asyncio.StreamReader,
                      up_writer: asyncio.StreamWriter, downstream: asyncio.Task[None]) -> None:
        """Answer the trapped request ``trap.action``'s way, then leave the connection closed."""
        downstream.cancel()
        with contextlib.suppress(BaseException):
            await downstream
        self.sprung += 1
        if trap.action == "reset":
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return
        if trap.action == "drop":
            return
        # swallow / partial: the server gets the whole request (its body may follow in more
        # reads) and answers; the client gets none, or only part, of that answer.
        up_writer.write(data)
        await up_writer.drain()
        pump = asyncio.get_running_loop().create_task(_copy(reader, up_writer))
        try:
            head = await _response_head(up_reader, trap.partial_bytes)
        finally:
            pump.cancel()
            with contextlib.suppress(BaseException):
                await pump
        if trap.action == "partial":
            writer.write(head)
            await writer.drain()


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()


async def _response_head(up_reader: asyncio.StreamReader, body_bytes: int) -> bytes:
    """The response's status line and headers plus its first ``body_bytes`` body bytes (fewer
    if the server closes first): the server has processed the request once this returns."""
    got = b""
    while True:
        chunk = await up_reader.read(65536)
        got += chunk
        end = got.find(b"\r\n\r\n")
        if not chunk or (end >= 0 and len(got) > end + 4 + body_bytes):
            return got[:end + 4 + body_bytes] if end >= 0 else got
