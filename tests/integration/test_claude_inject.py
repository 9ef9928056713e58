"""The Claude injector against an inbox that behaves like Claude's, receipts included.

A real unix-socket inbox (never a byte back, closes at EOF) that can answer a frame with a
``peer_message_status`` receipt sent, like Claude's, on a new connection to the frame's
``from`` address; a real listener there hands control frames to the tracker with the
``SO_PEERCRED`` pid, as an agent's uds ingress does. Issue 5: pacing under Claude's bucket,
held is not delivered, a drop is retried and never taken for success.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from crosstalk import proc
from crosstalk.core.ids import new_message_id
from crosstalk.core.message import Ingress, Message, Sender
from crosstalk.core.pacing import TokenBucket
from crosstalk.core.states import MessageState
from crosstalk.harness.base import Delivery
from crosstalk.harness.claude import Injector
from crosstalk.harness.claude.receipts import Tracker
from crosstalk.harness.claude.registry import ClaudeSession
from tests.support.uds import UDS_SENDER

pytestmark = pytest.mark.anyio


@dataclass
class Inbox:
    """Claude-like inbox; ``script`` says what to answer each frame with (default: nothing)."""

    path: Path
    script: list[str] = field(default_factory=list)
    frames: list[dict[str, Any]] = field(default_factory=list)
    arrived: list[float] = field(default_factory=list)
    later: list[tuple[str, str]] = field(default_factory=list)  # (from address, msg_id)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read()  # to EOF: the sender half-closes
        action = self.script.pop(0) if self.script else "ok"
        lines = [json.loads(line) for line in data.decode().splitlines() if line.strip()]
        frame = next((f for f in lines if f.get("type") == "user"), None)
        if frame is not None:
            self.frames.append(frame)
            self.arrived.append(time.monotonic())
        if action == "writeback":
            writer.write(b"{}\n")
            await writer.drain()
        writer.close()
        if frame is None or action in ("ok", "writeback"):
            return
        address = frame["from"].removeprefix("uds:")
        if action == "held-later":
            self.later.append((address, frame["msg_id"]))
            action = "held"
        status, _, reason = action.partition(":")
        await send_receipt(address, frame["msg_id"], status, reason or None)


async def send_receipt(address: str, msg_id: str, status: str, reason: str | None) -> None:
    receipt: dict[str, Any] = {"type": "control", "action": "peer_message_status",
                               "status": status, "orig_msg_id": msg_id, "msgV": 1,
                               "msg_id": new_message_id()}
    if reason:
        receipt["drop_reason"] = reason
    _, w = await asyncio.open_unix_connection(address)
    w.write(json.dumps(receipt).encode() + b"\n")
    w.write_eof()
    w.close()


@dataclass
class World:
    inbox: Inbox
    tracker: Tracker
    session: ClaudeSession
    reply_address: str
    late: list[Any]


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    short = Path(tempfile.mkdtemp(prefix="ct-inj-", dir="/tmp"))
    inbox = Inbox(short / "inbox.sock")
    tracker = Tracker()
    late: list[Any] = []

    async def on_reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        pid = proc.peer_credentials(sock).pid
        data = await reader.read()
        writer.close()
        for line in data.decode().splitlines():
            late.extend(tracker.on_control(json.loads(line), pid,
                                           proc.process_start_time(pid)))

    inbox_server = await asyncio.start_unix_server(inbox.handle, str(inbox.path))
    reply_path = short / "reply.sock"
    reply_server = await asyncio.start_unix_server(on_reply, str(reply_path))
    session = ClaudeSession(pid=os.getpid(), session_id="sess-1", config_dir=tmp_path,
                            record_path=tmp_path / "sessions" / f"{os.getpid()}.json",
                            messaging_socket_path=str(inbox.path),
                            proc_start=proc.process_start_time(os.getpid()),
                            pid_domain=proc.pid_domain())
    try:
        yield World(inbox, tracker, session, str(reply_path), late)
    finally:
        for server in (inbox_server, reply_server):
            server.close()
            await server.wait_closed()
        for p in short.iterdir():
            p.unlink()
        short.rmdir()


def delivery(text: str, world: World) -> Delivery:
    msg = Message(message_id=new_message_id(), text=text,
                  sender=Sender(agent_id="a" * 16, name="alice", ingress=Ingress.A2A))
    return Delivery(msg, world.reply_address)


def injector(world: World, **kw: Any) -> Injector:
    defaults: dict[str, Any] = {"tracker": world.tracker, "grace": 0.3,
                                "retry_after_drop": 0.05}
    return Injector(**(defaults | kw))


async def deliver(world: World, d: Delivery, **kw: Any) -> Any:
    return await injector(world, **kw).deliver(world.session, d,
                                               from_address=world.reply_address,
                                               session_id="sess-1")


async def test_a_frame_the_inbox_read_is_accepted(world: World) -> None:
    d = delivery("hello", world)
    out = await deliver(world, d)
    assert out.state is MessageState.ACCEPTED
    (frame,) = world.inbox.frames
    assert frame["session_id"] == "sess-1"
    assert frame["from"] == f"uds:{world.reply_address}"
    assert frame["msg_id"] == d.message.message_id
    assert frame["priority"] == "next"
    assert f"[crosstalk message-id={d.message.message_id} kind=inform" in (
        frame["message"]["content"])


async def test_held_is_not_delivered_and_its_release_comes_later(world: World) -> None:
    world.inbox.script.append("held-later")
    d = delivery("needs approval", world)
    out = await deliver(world, d)
    assert (out.state, out.reason) == (MessageState.UNKNOWN, "held_for_approval")
    ((address, msg_id),) = world.inbox.later
    await send_receipt(address, msg_id, "delivered", None)
    for _ in range(100):
        if world.late:
            break
        await asyncio.sleep(0.02)
    assert [(r.message_id, r.status) for r in world.late] == [(d.message.message_id,
                                                               "delivered")]


@pytest.mark.parametrize(("receipt", "state", "reason"), [
    ("dropped:duplicate", MessageState.ACCEPTED, None),
    ("dropped:hop-loop", MessageState.UNREACHABLE, "dropped:hop-loop"),
    ("denied", MessageState.UNREACHABLE, "receipt_denied"),
])
async def test_receipts_that_settle_at_once(world: World, receipt: str, state: MessageState,
                                           reason: str | None) -> None:
    world.inbox.script.append(receipt)
    out = await deliver(world, delivery("x", world))
    assert (out.state, out.reason) == (state, reason)
    assert len(world.inbox.frames) == 1


async def test_a_drop_is_retried_with_the_same_msg_id(world: World) -> None:
    world.inbox.script.extend(["dropped:rate-limited", "dropped:queue-full", "ok"])
    d = delivery("again", world)
    out = await deliver(world, d, bucket=lambda: TokenBucket(capacity=5, rate=100.0))
    assert out.state is MessageState.ACCEPTED
    assert [f["msg_id"] for f in world.inbox.frames] == [d.message.message_id] * 3


async def test_drops_past_the_attempts_are_unknown_never_success(world: World) -> None:
    world.inbox.script.extend(["dropped:queue-full"] * 3)
    out = await deliver(world, delivery("lost?", world), max_attempts=3,
                        bucket=lambda: TokenBucket(capacity=5, rate=100.0))
    assert (out.state, out.reason) == (MessageState.UNKNOWN, "dropped:queue-full")
    assert len(world.inbox.frames) == 3


async def test_a_receipt_from_another_process_is_ignored(world: World) -> None:
    """Only the session the frame went to may report on it (pid + start time)."""
    d = delivery("mine", world)
    inj = injector(world, grace=1.5)
    task = asyncio.ensure_future(inj.deliver(world.session, d,
                                             from_address=world.reply_address,
                                             session_id="sess-1"))
    for _ in range(100):
        if world.inbox.frames:
            break
        await asyncio.sleep(0.01)
    forged = {"type": "control", "action": "peer_message_status", "status": "denied",
              "orig_msg_id": d.message.message_id}
    child = await asyncio.create_subprocess_exec(
        sys.executable, str(UDS_SENDER), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE)
    assert child.stdin is not None
    assert child.stdout is not None
    await child.stdout.readline()
    payload = (json.dumps(forged) + "\n").encode().decode("latin-1")
    child.stdin.write(json.dumps({"path": world.reply_address, "payload": payload}).encode()
                      + b"\n")
    await child.stdin.drain()
    await child.stdout.readline()
    await child.wait()
    out = await task
    assert out.state is MessageState.ACCEPTED
    assert world.late == []


async def test_a_burst_is_paced_in_order_and_nothing_is_lost(world: World) -> None:
    """A bucket of 4 refilled at 20/s: 12 frames all arrive, in order, no faster than the
    bucket allows (Claude's is 30 at 0.5/s; the shape is the same)."""
    inj = injector(world, grace=0.0, bucket=lambda: TokenBucket(capacity=4, rate=20.0))
    ds = [delivery(f"m{i}", world) for i in range(12)]
    outs = await asyncio.gather(*(inj.deliver(world.session, d,
                                              from_address=world.reply_address,
                                              session_id="sess-1") for d in ds))
    assert {o.state for o in outs} == {MessageState.ACCEPTED}
    assert [f["msg_id"] for f in world.inbox.frames] == [d.message.message_id for d in ds]
    spread = world.inbox.arrived[-1] - world.inbox.arrived[0]
    assert spread >= 0.9 * (12 - 4) / 20.0  # 8 frames had to wait for a token each


async def test_inbox_failures_map_to_states(world: World, tmp_path: Path) -> None:
    world.inbox.script.append("writeback")
    out = await deliver(world, delivery("x", world))
    assert (out.state, out.reason) == (MessageState.UNKNOWN, "inbox_wrote_back")
    gone = ClaudeSession(pid=os.getpid(), session_id="sess-1", config_dir=tmp_path,
                         record_path=tmp_path / "x.json",
                         messaging_socket_path=str(tmp_path / "none.sock"))
    out = await injector(world).deliver(gone, delivery("x", world),
                                        from_address=world.reply_address, session_id=None)
    assert (out.state, out.reason) == (MessageState.UNREACHABLE, "inbox_missing")
    dead = Path(tempfile.mkdtemp(prefix="ct-dead-", dir="/tmp")) / "dead.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(dead))  # a socket file nobody listens on
    refused = ClaudeSession(pid=os.getpid(), session_id="sess-1", config_dir=tmp_path,
                            record_path=tmp_path / "x.json", messaging_socket_path=str(dead))
    out = await injector(world).deliver(refused, delivery("x", world),
                                        from_address=world.reply_address, session_id=None)
    assert (out.state, out.reason) == (MessageState.UNREACHABLE, "inbox_not_listening")
    with contextlib.suppress(OSError):
        dead.unlink()
        dead.parent.rmdir()
