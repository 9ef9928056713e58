"""A uds frame that comes whole with its connection is served from the accepted socket itself,
with no transport (ADR 0048); every other connection goes the transport's way. Either way a
sender gets the same one ack, and the journal the same records.

Which way a connection went is told by counting the transports' protocol objects
(``connection.Connection``) the ingress makes.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crosstalk.core.ids import new_message_id
from crosstalk.ingress import accept, connection
from tests.support.dirs import short_dir
from tests.support.uds import Node, acks, auth, make_node, serving, user
from tests.support.waiting import eventually

pytestmark = pytest.mark.anyio


async def whole(path: Path, payload: bytes) -> bytes:
    """Connect and write the whole frame before the loop runs again: it is there to be read
    when the ingress accepts the connection (a sender in another process writes at once)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(os.fspath(path))
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        sock.setblocking(False)
        got, loop = b"", asyncio.get_running_loop()
        async with asyncio.timeout(10):
            while chunk := await loop.sock_recv(sock, 65536):
                got += chunk
        return got
    finally:
        sock.close()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    with short_dir() as d:
        yield make_node(tmp_path / "state", d / "socks" / "r.sock")


@pytest.fixture
def transports(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    made: list[object] = []

    class Counted(connection.Connection):
        def __init__(self, *args: Any) -> None:
            made.append(self)
            super().__init__(*args)

    monkeypatch.setattr(connection, "Connection", Counted)
    return made


async def test_a_whole_frame_is_served_without_a_transport(node: Node,
                                                          transports: list[object]) -> None:
    async with serving(node):
        mid = new_message_id()
        raw = await whole(node.path, auth(node.token()) + user("whole", message_id=mid))
        assert acks(raw) == [{"type": "ack", "message_id": mid, "state": "accepted",
                              "reason": None}]
        assert node.states(mid) == ["submitted", "dispatching", "accepted"]
        assert node.harness.texts() == ["whole"]
        assert transports == []
        assert node.ingress.connections == 0


async def test_a_frame_in_two_parts_goes_the_transport_way_to_the_same_end(
        node: Node, transports: list[object]) -> None:
    async with serving(node):
        mid = new_message_id()
        reader, writer = await asyncio.open_unix_connection(os.fspath(node.path))
        writer.write(auth(node.token()))
        await writer.drain()
        await asyncio.sleep(0.05)  # accepted (and read) before the user line is written
        writer.write(user("in two parts", message_id=mid))
        writer.write_eof()
        raw = await reader.read()
        writer.close()
        assert acks(raw) == [{"type": "ack", "message_id": mid, "state": "accepted",
                              "reason": None}]
        assert node.states(mid) == ["submitted", "dispatching", "accepted"]
        assert len(transports) == 1


async def test_a_whole_frame_with_a_wrong_key_is_refused_and_records_nothing(
        node: Node, transports: list[object]) -> None:
    async with serving(node):
        raw = await whole(node.path, auth("0" * 32) + user("nope"))
        assert acks(raw) == [{"type": "ack", "message_id": None, "state": "rejected",
                              "reason": "auth_failed"}]
        assert node.records() == []
        assert node.harness.writes == []
        assert transports == []


async def test_a_whole_frame_that_is_not_one_of_ours_is_answered_as_before(
        node: Node, transports: list[object]) -> None:
    async with serving(node):
        bad = b'{"type":"user","message":{"role":"user","content":7}}\n'
        raw = await whole(node.path, auth(node.token()) + bad)
        assert acks(raw) == [{"type": "ack", "message_id": None, "state": "rejected",
                              "reason": "bad_frame"}]
        mid = new_message_id()
        raw = await whole(node.path, auth(node.token())
                          + user("x", message_id=mid, kind="telepathy"))
        assert acks(raw) == [{"type": "ack", "message_id": mid, "state": "rejected",
                              "reason": "unknown_kind"}]
        assert node.records() == []
        assert transports == []


async def test_an_ack_the_socket_takes_only_in_part_is_finished_by_a_transport(
        node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    class Short:
        """The accepted socket, whose first ``send`` takes ten bytes only."""

        def __init__(self, sock: socket.socket) -> None:
            self._sock, self._first = sock, True

        def send(self, data: bytes) -> int:
            if self._first:
                self._first = False
                return self._sock.send(data[:10])
            return self._sock.send(data)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._sock, name)

    real_init = connection.WholeFrame.__init__

    def short_init(self: connection.WholeFrame, ingress: Any, sock: socket.socket,
                   peer: Any) -> None:
        real_init(self, ingress, Short(sock), peer)  # type: ignore[arg-type]

    monkeypatch.setattr(connection.WholeFrame, "__init__", short_init)
    real_connect = asyncio.BaseEventLoop.connect_accepted_socket

    async def unwrapped(self: asyncio.BaseEventLoop, factory: Any, sock: Any,
                        **kw: Any) -> Any:
        return await real_connect(self, factory, sock=getattr(sock, "_sock", sock), **kw)

    monkeypatch.setattr(asyncio.BaseEventLoop, "connect_accepted_socket", unwrapped)
    async with serving(node):
        mid = new_message_id()
        raw = await whole(node.path, auth(node.token()) + user("late", message_id=mid))
        assert acks(raw) == [{"type": "ack", "message_id": mid, "state": "accepted",
                              "reason": None}]
        assert node.states(mid) == ["submitted", "dispatching", "accepted"]
        # A refusal answered in the accept callback itself (no task) finishes late too, and
        # leaves no connection behind in the ingress's books.
        raw = await whole(node.path, auth("0" * 32) + user("nope"))
        assert acks(raw)[0]["reason"] == "auth_failed"
        assert node.ingress.connections == 0


async def test_bytes_that_come_just_after_the_connection_are_waited_for(
        node: Node, transports: list[object], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(accept, "FIRST_WAIT", 30.0)  # however slow the machine
    async with serving(node):
        mid = new_message_id()
        reader, writer = await asyncio.open_unix_connection(os.fspath(node.path))
        await asyncio.sleep(0.05)  # accepted with nothing to read yet
        writer.write(auth(node.token()) + user("soon after", message_id=mid))
        writer.write_eof()
        raw = await reader.read()
        writer.close()
        assert acks(raw)[0]["state"] == "accepted"
        assert transports == []


async def test_a_connection_silent_past_the_wait_becomes_a_transport(
        node: Node, transports: list[object]) -> None:
    async with serving(node):
        mid = new_message_id()
        reader, writer = await asyncio.open_unix_connection(os.fspath(node.path))
        await eventually(lambda: len(transports) == 1, what="made a transport")
        writer.write(auth(node.token()) + user("late", message_id=mid))
        writer.write_eof()
        raw = await reader.read()
        writer.close()
        assert acks(raw)[0]["state"] == "accepted"
        assert node.states(mid) == ["submitted", "dispatching", "accepted"]


async def test_stopping_closes_a_connection_still_waited_on(
        node: Node, transports: list[object], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(accept, "FIRST_WAIT", 30.0)
    async with serving(node):
        reader, writer = await asyncio.open_unix_connection(os.fspath(node.path))
        await asyncio.sleep(0.05)
    async with asyncio.timeout(2):
        assert await reader.read() == b""  # closed unheard, nothing answered
    writer.close()
    assert transports == []
    assert node.records() == []
