"""The fake Claude Code session rig itself: real processes, files and sockets.

``tests/support/fakes/claude_session.py`` must look like Claude Code 2.1.328 to CrossTalk's own
reader (record, key, liveness), behave like Claude's inbox (no byte back, close at EOF,
session_id check, /clear), spawn real shims as its children through ``claude_launch.py``, and
send like Claude's SendMessage tool from its own pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from crosstalk import proc
from crosstalk.harness.claude.registry import liveness, read_peer_token, read_record
from tests.support.claude import FakeClaude, claude_env, running
from tests.support.dirs import short_dir
from tests.support.uds import LoopThread
from tests.support.waiting import eventually_sync

TOOLS = {"list_agents", "send_message", "ask", "reply", "receive_message", "claim", "release"}

Factory = Callable[..., FakeClaude]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return claude_env(tmp_path)


@pytest.fixture
def fake_claude(tmp_path: Path, env: dict[str, str]) -> Iterator[Factory]:
    """Start fake sessions; at teardown stop them and make sure no shim outlives the test."""
    started: list[FakeClaude] = []
    shims: set[int] = set()

    def make(name: str = "alpha", **kw: Any) -> FakeClaude:
        fc = FakeClaude(tmp_path, name, env=env, **kw).start()
        started.append(fc)
        return fc

    yield make
    for fc in started:
        if fc.alive():
            shims.update(fc.kill_shims("KILL"))
        fc.stop()
        assert not fc.alive()
    eventually_sync(lambda: not any(running(p) for p in shims), timeout=10)


def frame(content: str, **extra: Any) -> dict[str, Any]:
    return {"type": "user", "message": {"role": "user", "content": content}, **extra}


def ndjson(*objs: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(o, separators=(",", ":")).encode() + b"\n" for o in objs)


def deliver(path: Path, payload: bytes, timeout: float = 10.0) -> bytes:
    """A plain client: connect, write, half-close, read to EOF; returns what came back."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(path))
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        back = b""
        while chunk := s.recv(65536):
            back += chunk
        return back


# -- record, key, liveness ---------------------------------------------------------------------


def test_record_and_key_read_as_a_live_claude_session(fake_claude: Factory,
                                                      env: dict[str, str]) -> None:
    fc = fake_claude("alpha")
    assert fc.record_path == Path(env["CLAUDE_CONFIG_DIR"]) / "sessions" / f"{fc.pid}.json"
    assert fc.socket == Path(env["XDG_RUNTIME_DIR"]) / "cc-socks" / f"{fc.pid}.sock"
    assert fc.socket.stat().st_mode & 0o777 == 0o600
    assert fc.socket.parent.stat().st_mode & 0o777 == 0o700
    assert fc.record_path.parent.stat().st_mode & 0o777 == 0o700
    assert fc.key_path.stat().st_mode & 0o777 == 0o600

    s = read_record(fc.record_path)
    assert s is not None
    assert (s.pid, s.session_id, s.status, s.name, s.name_source) == (
        fc.pid, fc.session_id, "idle", "alpha", "user")
    assert (s.version, s.peer_protocol, s.kind, s.entrypoint) == (
        "2.1.328", 1, "interactive", "cli")
    assert s.socket_path == fc.socket
    assert s.proc_start == proc.process_start_time(fc.pid)
    assert s.pid_domain == proc.pid_domain()
    assert liveness(s) == "live"
    assert s.key_path == fc.key_path
    token = read_peer_token(s)
    assert token is not None
    assert token == fc.peer_token()

    fc.rename("beta")
    fc.set_status("busy")
    s2 = read_record(fc.record_path)
    assert s2 is not None
    assert (s2.name, s2.name_source, s2.status) == ("beta", "peer", "busy")

    ino = fc.record_path.stat().st_ino
    fc.clear()
    assert fc.record_path.stat().st_ino == ino  # rewritten in place, not replaced
    assert read_peer_token(s2) == token  # /clear keeps pid, socket and key

    record, key, sock = fc.record_path, fc.key_path, fc.socket
    fc.stop()
    assert not record.exists()
    assert not key.exists()
    assert not sock.exists()


def test_no_status_and_sigterm_cleanup(fake_claude: Factory) -> None:
    fc = fake_claude("sdk", no_status=True)
    assert "status" not in fc.record()
    s = read_record(fc.record_path)
    assert s is not None
    assert s.status == "unknown"
    assert fc.proc is not None
    fc.proc.send_signal(signal.SIGTERM)
    assert fc.proc.wait(10) == 0
    assert not fc.record_path.exists()
    assert not fc.key_path.exists()
    assert not fc.socket.exists()


# -- the inbox ---------------------------------------------------------------------------------


def test_inbox_records_frames_and_checks_session_id(fake_claude: Factory) -> None:
    fc = fake_claude("alpha")
    # ListAgents-style connect-and-close probes are harmless
    assert deliver(fc.socket, b"") == b""

    back = deliver(fc.socket, ndjson({"type": "auth", "token": fc.peer_token()},
                                     frame("hello", msgV=1, session_id=fc.session_id)))
    assert back == b""  # the inbox never writes a byte; it closes at our EOF
    got = fc.frames()  # appended (and fsynced) before the connection was closed
    assert len(got) == 1
    assert got[0]["auth"] is True
    assert got[0]["auth_ok"] is True
    assert got[0]["peer_pid"] == os.getpid()
    assert got[0]["frame"]["message"]["content"] == "hello"
    assert got[0]["dropped"] is None

    # wrong token: still recorded, auth_ok False; no auth line: auth False
    assert deliver(fc.socket, ndjson({"type": "auth", "token": "0" * 32}, frame("w"))) == b""
    assert deliver(fc.socket, ndjson(frame("plain"))) == b""
    # a final fragment without a newline is parsed at EOF
    assert deliver(fc.socket, json.dumps(frame("tail")).encode()) == b""
    got = fc.frames()
    assert [(f["frame"]["message"]["content"], f["auth"], f["auth_ok"]) for f in got[1:]] == [
        ("w", True, False), ("plain", False, False), ("tail", False, False)]

    assert deliver(fc.socket, ndjson(frame("not yours", session_id="not-this-session"))) == b""
    assert fc.frames()[-1]["dropped"] == "session_id_mismatch"

    old = fc.session_id
    new = fc.clear()
    assert new != old
    s = read_record(fc.record_path)
    assert s is not None
    assert s.session_id == new
    assert s.pid == fc.pid
    assert s.socket_path == fc.socket
    assert deliver(fc.socket, ndjson(frame("stale", session_id=old),
                                     frame("fresh", session_id=new))) == b""
    last = fc.frames()[-2:]
    assert [(f["frame"]["message"]["content"], f["dropped"]) for f in last] == [
        ("stale", "session_id_mismatch"), ("fresh", None)]


def test_inbox_control_rename_and_oversized_line(fake_claude: Factory) -> None:
    fc = fake_claude("alpha")
    assert deliver(fc.socket, ndjson({"type": "control", "action": "rename",
                                      "name": "renamed"})) == b""
    f = fc.frames()[-1]
    assert f["frame"]["type"] == "control"
    assert f["dropped"] is None
    s = read_record(fc.record_path)
    assert s is not None
    assert (s.name, s.name_source) == ("renamed", "peer")

    # a line over 1,048,576 chars: the inbox drops the connection without reading on
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
        c.settimeout(10)
        c.connect(str(fc.socket))
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            c.sendall(b"x" * (1_048_576 + 65536))
        closed = b""
        with contextlib.suppress(ConnectionResetError):
            closed = c.recv(1)
        assert closed == b""
    assert len(fc.frames()) == 1


# -- shims spawned as the session's children -----------------------------------------------------


@pytest.mark.anyio
async def test_mcp_client_reaches_a_shim_whose_parent_is_the_session(
        fake_claude: Factory) -> None:
    fc = fake_claude("alpha")
    async with Client(fc.server_params()) as client:
        listed = await client.list_tools()
        assert {t.name for t in listed.tools} == TOOLS
        assert len(listed.tools) == 7
        pids = fc.shims()
        assert len(pids) == 1
        assert proc.parent_pid(pids[0]) == fc.pid
        env = Path(f"/proc/{pids[0]}/environ").read_bytes().split(b"\0")
        assert f"CLAUDE_CODE_SESSION_ID={fc.session_id}".encode() in env
        assert f"CLAUDE_CODE_MESSAGING_SOCKET={fc.socket}".encode() in env
        assert Path(f"/proc/{pids[0]}/cwd").resolve() == fc.cwd.resolve()
    deadline = time.monotonic() + 5
    while fc.shims():
        assert time.monotonic() < deadline, "the shim outlived its MCP client"
        await asyncio.sleep(0.05)
    assert not running(pids[0])


# -- sending like Claude's SendMessage -----------------------------------------------------------


class PeerServer:
    """A plain asyncio unix server recording each connection's SO_PEERCRED pid and bytes."""

    def __init__(self, loop: LoopThread, path: Path, *, close_at_eof: bool) -> None:
        self.loop, self.path, self.close_at_eof = loop, path, close_at_eof
        self.peers: list[int] = []
        self.received: list[bytes] = []
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.AbstractServer | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.peers.append(proc.peer_credentials(writer.get_extra_info("socket")).pid)
        self.writers.append(writer)
        if not self.close_at_eof:
            return  # hold the connection open, read nothing
        self.received.append(await reader.read())
        writer.close()

    async def start(self) -> None:
        self.server = await asyncio.start_unix_server(self.handle, path=str(self.path))

    async def stop(self) -> None:
        for w in self.writers:
            w.close()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


@contextlib.contextmanager
def peer_server(close_at_eof: bool) -> Iterator[PeerServer]:
    loop = LoopThread()
    try:
        with short_dir() as d:
            server = PeerServer(loop, d / "peer.sock", close_at_eof=close_at_eof)
            loop.run(server.start())
            try:
                yield server
            finally:
                loop.run(server.stop())
    finally:
        loop.close()


def test_send_comes_from_the_session_pid(fake_claude: Factory) -> None:
    fc = fake_claude("alpha")
    with peer_server(close_at_eof=True) as server:
        token = uuid.uuid4().hex
        res = fc.send(server.path, "hi there", auth=token)
        assert res["ok"] is True, res
        assert res["error"] is None
        assert res["bytes_back"] == 0
        assert res["secs"] < 5
        assert server.peers == [fc.pid]
        lines = [json.loads(x) for x in server.received[0].splitlines()]
        assert lines[0] == {"type": "auth", "token": token}
        assert list(lines[1]) == ["msgV", "msg_id", "type", "message", "priority", "from"]
        assert lines[1]["message"] == {"role": "user", "content": "hi there"}
        assert lines[1]["from"] == f"uds:{fc.socket}"
        assert lines[1]["msg_id"] == res["msg_id"]
        assert str(uuid.UUID(lines[1]["msg_id"], version=4)) == lines[1]["msg_id"]

        # without a token: the frame alone; and to nowhere: an error, not a hang
        assert fc.send(server.path, "again")["ok"] is True
        assert len(server.received[1].splitlines()) == 1
    gone = fc.send(server.path, "nobody home")
    assert gone["ok"] is False
    assert gone["error"]


@pytest.mark.slow
def test_send_times_out_when_the_receiver_never_closes(fake_claude: Factory) -> None:
    fc = fake_claude("alpha")
    with peer_server(close_at_eof=False) as server:
        res = fc.send(server.path, "hello?")
        assert res["ok"] is False
        assert "Timed out" in res["error"]
        assert 4.5 < res["secs"] < 8
        assert server.peers == [fc.pid]
