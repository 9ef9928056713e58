"""The uds ingress under pressure (issue 12, item 3): silent connections, slow deliveries.

Real unix sockets, a real registry and journal, senders in this process and in child
processes. The connection cap bounds connections that are still *reading* their frame; a
silent one is closed after a few seconds, or sooner when a newcomer needs its place. A shape
(a) sender whose frame is admitted waits for its outcome outside the cap, under the receiver's
wait limit, so slow deliveries never refuse a native frame or a Claude receipt.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from crosstalk.cli.send import send
from crosstalk.core.admission import Limits
from crosstalk.core.ids import new_message_id
from crosstalk.harness.fake import Step
from crosstalk.ingress.uds import MAX_CONNECTIONS
from tests.support.agents import register_agent
from tests.support.dirs import short_dir
from tests.support.uds import (
    Node,
    acks,
    auth,
    child_send,
    claude_frame,
    exchange,
    line,
    make_node,
    serving,
    user,
)
from tests.support.waiting import eventually

pytestmark = pytest.mark.anyio

#: Claude's sender reports a failure when the socket is still open after 5 s; a generous bound
#: below that for the EOF a native sender must get.
PROMPT_EOF = 3.0
#: Claude's inbox closes a connection without a complete line after 30 s; a silent connection
#: here must be closed well before that. A bound for waiting, not a measurement.
SILENCE_BOUND = 15.0

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@pytest.fixture
def sockdir() -> Iterator[Path]:
    with short_dir() as d:
        yield d


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "state"


class Receipts:
    """The ingress's control hook: every control frame it hands on, with the peer pid."""

    def __init__(self) -> None:
        self.frames: list[tuple[dict[str, Any], int | None]] = []

    def __call__(self, frame: Mapping[str, Any], pid: int | None, start: str | None) -> None:
        self.frames.append((dict(frame), pid))

    def ids(self) -> list[object]:
        return [f.get("orig_msg_id") for f, _ in self.frames]


def receipt(orig_msg_id: str) -> bytes:
    """A ``held`` receipt as Claude sends it back to a frame's ``from`` address (research §5)."""
    return line({"type": "control", "action": "peer_message_status", "status": "held",
                 "reason": "held for the recipient user's approval", "orig_msg_id": orig_msg_id,
                 "from": "uds:/tmp/cc-socks/4242.sock", "msgV": 1, "msg_id": str(uuid.uuid4())})


async def open_silent(path: Path, count: int) -> list[Stream]:
    """``count`` connections that never send a byte."""
    return [await asyncio.open_unix_connection(os.fspath(path)) for _ in range(count)]


async def close_all(streams: list[Stream]) -> None:
    for _, writer in streams:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def closed_by_server(stream: Stream, bound: float) -> None:
    """Wait (at most ``bound`` seconds) until the server closes ``stream``, saying nothing."""
    reader, _ = stream
    async with asyncio.timeout(bound):
        assert await reader.read() == b""


def publish_native_sender(node: Node, sockdir: Path) -> Callable[[int, str], None]:
    """A ``child_send`` hook that registers the child as an agent (a verified native sender)."""
    def publish(pid: int, started: str) -> None:
        node.registrations.append(register_agent(
            node.registry, f"native-{pid}", f"native-{pid}", pid=pid, started_at=started,
            uds_path=sockdir / f"n{pid}.sock", exact_name=True))
    return publish


# -- silent connections ------------------------------------------------------------------------


async def test_silent_connections_do_not_shut_out_senders(home: Path, sockdir: Path) -> None:
    """A full cap of silent same-user connections: ``crosstalk send`` and a native frame still
    get through at once, each taking the place of the oldest silent connection. (The silent
    ones are let wait a minute here, so that no timeout frees a place for the senders.)"""
    node = make_node(home, sockdir / "cc-socks" / "r.sock", first_line_timeout=60.0)
    async with serving(node):
        node.registrations.append(register_agent(node.registry, "receiver-session", "receiver",
                                                 uds_path=node.path, exact_name=True))
        silent = await open_silent(node.path, MAX_CONNECTIONS)
        await eventually(lambda: node.ingress.connections == MAX_CONNECTIONS,
                         what="every silent connection accepted")
        sent = await asyncio.to_thread(send, node.home, "receiver", "through the crowd",
                                       timeout=20)
        assert (sent.state, sent.exit_code) == ("accepted", 0)
        await closed_by_server(silent[0], SILENCE_BOUND)  # the oldest gave its place
        silent += await open_silent(node.path, 1)  # and the cap is full again
        await eventually(lambda: node.ingress.connections == MAX_CONNECTIONS)
        got = await child_send(node.path, claude_frame("native through the crowd"),
                               publish_native_sender(node, sockdir))
        assert got.error is None
        assert got.reply == b""
        assert got.secs < PROMPT_EOF  # Claude's sender takes a later EOF for a failure
        await closed_by_server(silent[1], SILENCE_BOUND)
        await node.ingress.settle()
        assert node.harness.texts() == ["through the crowd", "native through the crowd"]
        # Nobody else lost a place: one silent connection per sender was evicted.
        await eventually(lambda: node.ingress.connections == MAX_CONNECTIONS - 1)
        assert not any(reader.at_eof() for reader, _ in silent[2:])
        await close_all(silent)


async def test_a_silent_connection_is_closed_within_seconds(home: Path, sockdir: Path) -> None:
    """No complete first line within a few seconds of connect: closed, long before the 30 s
    Claude's inbox allows; nothing journaled, and a sender afterwards is served."""
    node = make_node(home, sockdir / "r.sock")
    async with serving(node):
        quiet = await open_silent(node.path, 1)
        _, dribbler = partial = await asyncio.open_unix_connection(os.fspath(node.path))
        dribbler.write(b'{"type":"user","message":{"content":"never fini')
        await dribbler.drain()
        await closed_by_server(quiet[0], SILENCE_BOUND)
        await closed_by_server(partial, SILENCE_BOUND)
        await eventually(lambda: node.ingress.connections == 0)
        assert node.records() == []
        raw, _ = await exchange(node.path, auth(node.token()) + user("after the quiet ones"))
        assert acks(raw)[0]["state"] == "accepted"
        await close_all([*quiet, partial])


async def test_a_newcomer_evicts_the_oldest_reading_connection_never_one_in_the_chain(
        home: Path, sockdir: Path) -> None:
    node = make_node(home, sockdir / "r.sock", max_connections=2)
    gate = asyncio.Event()
    node.harness.then(Step(gate=gate))
    async with serving(node):
        ids = [new_message_id() for _ in range(3)]

        def deliver(text: str, mid: str) -> asyncio.Task[tuple[bytes, float]]:
            return asyncio.create_task(exchange(
                node.path, auth(node.token()) + user(text, message_id=mid), timeout=30))

        parked = deliver("parked", ids[0])
        async with asyncio.timeout(10):
            await node.harness.parked.wait()
        oldest, younger = await open_silent(node.path, 2)
        await eventually(lambda: node.ingress.connections == 3)
        newcomer = deliver("newcomer", ids[1])
        await closed_by_server(oldest, SILENCE_BOUND)  # its place went to the newcomer
        await eventually(lambda: ids[1] in node.receiver.entries)
        # The younger silent connection kept its place and may still speak.
        _, writer = younger
        writer.write(auth(node.token()) + user("younger, late", message_id=ids[2]))
        writer.write_eof()
        await eventually(lambda: ids[2] in node.receiver.entries)
        assert not parked.done()  # in the chain: never evicted, never answered early
        gate.set()
        async with asyncio.timeout(30):
            late = await younger[0].read()
        answers = [acks((await parked)[0]), acks((await newcomer)[0]), acks(late)]
        assert answers == [[{"type": "ack", "message_id": mid, "state": "accepted",
                             "reason": None}] for mid in ids]
        assert node.harness.texts() == ["parked", "newcomer", "younger, late"]
        await close_all([oldest, younger])


# -- slow deliveries ---------------------------------------------------------------------------


async def test_slow_deliveries_leave_room_for_native_frames_and_receipts(
        home: Path, sockdir: Path) -> None:
    """A full cap of shape (a) senders whose deliveries are stuck in a slow injection: a native
    frame is journaled and closed at once and a receipt reaches its handler; every sender then
    gets the outcome of its own delivery, never an earlier answer."""
    receipts = Receipts()
    node = make_node(home, sockdir / "cc-socks" / "r.sock", control=receipts)
    gate = asyncio.Event()  # the slow injection: held until the checks below are done
    node.harness.default = Step(gate=gate)
    async with serving(node):
        ids = [new_message_id() for _ in range(MAX_CONNECTIONS)]
        senders = [asyncio.create_task(exchange(
            node.path, auth(node.token()) + user(f"slow {i}", message_id=mid), timeout=60))
            for i, mid in enumerate(ids)]
        await eventually(lambda: all(mid in node.receiver.entries for mid in ids),
                         what="every slow message admitted")
        async with asyncio.timeout(10):
            await node.harness.parked.wait()
        got = await child_send(node.path, claude_frame("native while busy"),
                               publish_native_sender(node, sockdir))
        assert got.error is None
        assert got.reply == b""
        assert got.secs < PROMPT_EOF
        native = [r for r in node.records() if r.get("state") == "submitted"
                  and r.get("id") not in ids]
        assert len(native) == 1, native  # durable before its EOF, waiting in the lane
        orig = str(uuid.uuid4())
        got = await child_send(node.path, receipt(orig), lambda pid, started: None)
        assert got.error is None
        assert got.reply == b""
        await eventually(lambda: orig in receipts.ids(), what="the receipt handed on")
        assert not any(s.done() for s in senders)  # nobody told anything before delivery
        gate.set()
        answers = [acks((await s)[0]) for s in senders]
        assert answers == [[{"type": "ack", "message_id": mid, "state": "accepted",
                             "reason": None}] for mid in ids]
        await node.ingress.settle()
        # in the order they were admitted (the senders connect concurrently), the native last
        admitted = [r["id"] for r in node.records()
                    if r.get("state") == "submitted" and r.get("id") in ids]
        assert sorted(admitted) == sorted(ids)
        assert node.harness.texts() == [*(f"slow {ids.index(mid)}" for mid in admitted),
                                        "native while busy"]


async def test_waiting_senders_beyond_the_wait_limit_are_refused_before_admission(
        home: Path, sockdir: Path) -> None:
    """Waiting for an outcome is bounded by the receiver's wait limit (as on A2A): beyond it
    a shape (a) frame is refused before anything is journaled, a definite and retryable
    answer; native frames, which never wait, still get through."""
    node = make_node(home, sockdir / "r.sock", limits=Limits(max_waits=2))
    gate = asyncio.Event()
    node.harness.default = Step(gate=gate)
    async with serving(node):
        first, second, third = (new_message_id() for _ in range(3))
        waiting = [asyncio.create_task(exchange(
            node.path, auth(node.token()) + user(text, message_id=mid), timeout=60))
            for text, mid in (("one", first), ("two", second))]
        await eventually(lambda: {first, second} <= set(node.receiver.entries))
        raw, _ = await exchange(node.path, auth(node.token()) + user("three", message_id=third),
                                timeout=10)
        assert acks(raw) == [{"type": "ack", "message_id": third, "state": "rejected",
                              "reason": "too_many_waits"}]
        assert node.states(third) == []  # nothing journaled: a retry is a fresh attempt
        got = await child_send(node.path, claude_frame("native, never waits"),
                               publish_native_sender(node, sockdir))
        assert got.reply == b""
        assert got.secs < PROMPT_EOF
        gate.set()
        assert [acks((await w)[0])[0]["state"] for w in waiting] == ["accepted", "accepted"]
        raw, _ = await exchange(node.path, auth(node.token()) + user("three", message_id=third))
        assert acks(raw) == [{"type": "ack", "message_id": third, "state": "accepted",
                              "reason": None}]
        assert node.harness.texts() == ["one", "two", "native, never waits", "three"]
