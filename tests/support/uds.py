"""Parts for the uds ingress tests: a receiving agent behind its ingress, clients, a sender
in another process, and a loop thread for blocking clients.

Everything is real: the registry on disk, the journal with fsync, unix sockets in a short
directory under /tmp (sun_path is 108 bytes), and child processes for peer credentials.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from crosstalk import proc
from crosstalk.agent.lane import DispatchLane
from crosstalk.agent.taskgroup import TaskGroup
from crosstalk.config import journal_path
from crosstalk.core.admission import Limits
from crosstalk.core.ids import agent_id_for, new_instance_id
from crosstalk.harness.base import Binding
from crosstalk.harness.fake import FakeHarness
from crosstalk.ingress.uds import CLOSE_GRACE, UdsIngress
from crosstalk.receiver import Receiver
from crosstalk.store.files import FileOps
from crosstalk.store.journal import Journal
from crosstalk.store.journal_read import read_journal
from crosstalk.store.registry import Registration, Registry

#: The sender script :func:`child_send` runs.
UDS_SENDER = Path(__file__).resolve().parent / "fakes" / "uds_sender.py"
T = TypeVar("T")


@dataclass
class Node:
    """One receiving agent: journal, fake harness, receiver, its dispatch lane (in the agent's
    task group, as :class:`crosstalk.agent.Agent` runs it) and its uds ingress."""

    home: Path
    agent_id: str
    journal: Journal
    harness: FakeHarness
    receiver: Receiver
    ingress: UdsIngress
    registry: Registry
    group: TaskGroup
    lane: DispatchLane
    registrations: list[Registration] = field(default_factory=list)

    async def start(self) -> None:
        await self.lane.start()
        await self.ingress.start()

    async def stop(self) -> None:
        """The agent's order: socket and key gone, the lane closed (the dispatch in flight
        gets its grace), the ingress drained, the group closed."""
        self.ingress.close_listener()
        await self.lane.close()
        await self.ingress.stop()
        await self.group.close()

    @property
    def path(self) -> Path:
        return self.ingress.path

    def token(self) -> str:
        return self.ingress.key_path.read_text().strip()

    def records(self) -> list[dict[str, Any]]:
        return read_journal(journal_path(self.home, self.agent_id)).records

    def states(self, message_id: str) -> list[str]:
        return [r["state"] for r in self.records() if r.get("id") == message_id]


def make_node(home: Path, sock_path: Path, *, session: str = "receiver-session",
              ops: FileOps | None = None, limits: Limits | None = None,
              **ingress_kw: Any) -> Node:
    registry = Registry(home)
    agent_id = agent_id_for("fake", session)
    jpath = journal_path(home, agent_id)
    jpath.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    journal = Journal(jpath, ops=ops)
    harness = FakeHarness()
    binding = Binding("fake", session, None, new_instance_id())
    receiver = Receiver(agent_id=agent_id, journal=journal, harness=harness, binding=binding,
                        limits=limits or Limits(), reply_address=str(sock_path))
    group = TaskGroup(f"agent {agent_id}")
    lane = DispatchLane(receiver, group,
                        grace_seconds=ingress_kw.get("close_grace", CLOSE_GRACE))
    ingress = UdsIngress(sock_path, receiver, registry, lane=lane, **ingress_kw)
    return Node(home, agent_id, journal, harness, receiver, ingress, registry, group, lane)


@contextlib.asynccontextmanager
async def serving(node: Node) -> AsyncIterator[Node]:
    await node.start()
    try:
        yield node
    finally:
        await node.stop()
        for r in node.registrations:
            r.close()
        node.journal.close()


# -- wire helpers -----------------------------------------------------------------------------


def line(obj: dict[str, Any]) -> bytes:
    """One NDJSON line, non-ASCII unescaped as JavaScript's JSON.stringify writes it."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def auth(token: str) -> bytes:
    return line({"type": "auth", "token": token})


def user(content: str, *, message_id: str | None = None, kind: str | None = None,
         **extra: Any) -> bytes:
    """A user line; ``message_id``/``kind`` go into our ``crosstalk`` metadata."""
    frame: dict[str, Any] = {"type": "user", "message": {"role": "user", "content": content}}
    meta = {k: v for k, v in (("message_id", message_id), ("kind", kind)) if v is not None}
    if meta:
        frame["crosstalk"] = meta
    frame.update(extra)
    return line(frame)


async def exchange(path: Path, payload: bytes, *, half_close: bool = True,
                   timeout: float = 10.0) -> tuple[bytes, float]:
    """Connect, write, (half-close), read to EOF. Returns the bytes and seconds to EOF."""
    reader, writer = await asyncio.open_unix_connection(os.fspath(path))
    got = b""
    start = time.monotonic()
    try:
        # A server that closes with our bytes unread resets the connection: that is a close.
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            if payload:
                writer.write(payload)
                await writer.drain()
            if half_close:
                writer.write_eof()
            async with asyncio.timeout(timeout):
                while chunk := await reader.read(65536):
                    got += chunk
        return got, time.monotonic() - start
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def claude_frame(text: str, *, from_name: str = "trusted-boss", extra_attrs: str = "",
                 msg_id: str | None = None) -> bytes:
    """The exact shape Claude Code 2.1.328's SendMessage writes (research §6)."""
    content = (f'<cross-session-message from="uds:/tmp/cc-socks/4242.sock" '
               f'from-name="{from_name}" from-mode="prompting"{extra_attrs}>\n{text}\n'
               "</cross-session-message>")
    return line({"msgV": 1, "msg_id": msg_id or str(uuid.uuid4()), "type": "user",
                 "message": {"role": "user", "content": content}, "priority": "next",
                 "from": "uds:/tmp/cc-socks/4242.sock"})


def acks(raw: bytes) -> list[dict[str, Any]]:
    return [json.loads(x) for x in raw.splitlines() if x.strip()]


# -- a sender in another process (for peer credentials) --------------------------------------


@dataclass
class ChildResult:
    pid: int
    reply: bytes
    secs: float
    error: str | None


async def child_send(path: Path, payload: bytes,
                     before_send: Callable[[int, str], None]) -> ChildResult:
    """Start a real process, let ``before_send(pid, start_time)`` publish descriptors for it,
    then have it connect, write ``payload``, half-close and read to EOF."""
    p = await asyncio.create_subprocess_exec(
        sys.executable, str(UDS_SENDER), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE)
    assert p.stdin is not None
    assert p.stdout is not None
    try:
        async with asyncio.timeout(30):
            ready = json.loads(await p.stdout.readline())
            assert ready == {"ready": p.pid}
            started = proc.process_start_time(p.pid)
            assert started is not None
            before_send(p.pid, started)
            cmd = {"path": str(path), "payload": payload.decode("latin-1")}
            p.stdin.write(json.dumps(cmd).encode() + b"\n")
            await p.stdin.drain()
            out = json.loads(await p.stdout.readline())
            await p.wait()
    finally:
        if p.returncode is None:
            p.kill()
            await p.wait()
    return ChildResult(p.pid, out["reply"].encode("latin-1"), out["secs"], out.get("error"))


# -- a server on its own loop thread (for blocking clients: subprocesses, hypothesis) ---------


class LoopThread:
    """An event loop in a thread; the ingress runs there while the test blocks freely."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Awaitable[T], timeout: float = 60.0) -> T:
        async def wrap() -> T:
            return await coro

        return asyncio.run_coroutine_threadsafe(wrap(), self.loop).result(timeout)

    def pending_tasks(self) -> list[asyncio.Task[Any]]:
        async def others() -> list[asyncio.Task[Any]]:
            me = asyncio.current_task()
            return [t for t in asyncio.all_tasks() if t is not me]

        return self.run(others())

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
        self.loop.close()
