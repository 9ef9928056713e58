"""The A2A listener against a local attacker (issue 12, item 2): every connection that does not
finish its request is closed within bounds, at most ``MAX_CONNECTIONS`` are held, a sender keeps
being served while an attacker holds slow connections, and running out of file descriptors
costs one log line, not a flood, with service back once descriptors free up.

Real parts only: uvicorn on 127.0.0.1, raw sockets, the a2a-sdk's own client, an attacker and
a descriptor-starved agent in processes of their own. Bounds are generous waits, never timing
assertions.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.types import a2a_pb2 as pb

from crosstalk.a2a.listener import MAX_CONNECTIONS, Listener
from crosstalk.core.ids import new_message_id
from crosstalk.harness.fake import FakeHarness, Step
from crosstalk.store.registry import Registry
from tests.support.a2a import Agent, make_node, registered_agent, sdk_client, send, serving
from tests.support.a2a import text_message as a2a_text
from tests.support.dirs import short_dir
from tests.support.uds import acks, auth, exchange, user
from tests.support.waiting import eventually

pytestmark = pytest.mark.anyio

FAKES = Path(__file__).resolve().parents[1] / "support" / "fakes"
REPO = Path(__file__).resolve().parents[2]
#: How long any one wait may take before the test fails (a bound, not a measurement).
BOUND = 30.0
#: Rounds of sends under attack, half a second apart (five sends each).
ROUNDS = 20


@pytest.fixture
def parties(tmp_path: Path) -> Iterator[tuple[Registry, Agent, Agent]]:
    registry = Registry(tmp_path / "state")
    bob, alice = registered_agent(registry, "bob"), registered_agent(registry, "alice")
    yield registry, bob, alice
    for agent in (bob, alice):
        agent.registration.close()


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def _send_body(text: str) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {
        "message": {"messageId": new_message_id(), "role": "ROLE_USER",
                    "parts": [{"text": text}]}}}).encode()


def _headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Content-Type": "application/json",
            "A2A-Version": "1.0"}


async def _until_closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the server still sends, up to its close (EOF or reset)."""
    got = b""
    with contextlib.suppress(ConnectionResetError, BrokenPipeError):
        async with asyncio.timeout(BOUND):
            while chunk := await reader.read(65536):
                got += chunk
    return got


async def _read_response(reader: asyncio.StreamReader) -> bytes:
    """One HTTP response with a Content-Length body."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    return head + await reader.readexactly(length)


async def test_connections_that_never_finish_a_request_are_closed(
        tmp_path: Path, parties: tuple[Registry, Agent, Agent]) -> None:
    """Silent, trickling, idle after a response, and stalled mid-body: each is closed by the
    server (head, keep-alive and body bounds), and nothing of the stalled body is journaled."""
    registry, bob, alice = parties
    node = make_node(registry, bob, tmp_path / "bob.jsonl")
    async with serving(node):
        host, port = _address(node.url)
        conns = [await asyncio.open_connection(host, port) for _ in range(4)]
        (_, silent), (_, trickle), (idle_r, idle), (_, stalled) = conns
        idle.write(b"GET /.well-known/agent-card.json HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b" 200 " in (await _read_response(idle_r)).split(b"\r\n")[0]
        body = _send_body("never finished")
        stalled.write(b"POST / HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + alice.token.encode()
                      + b"\r\nContent-Type: application/json\r\nContent-Length: "
                      + str(len(body)).encode() + b"\r\n\r\n" + body[:20])
        del silent

        async def drip() -> None:
            with contextlib.suppress(OSError):
                for byte in b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000:
                    trickle.write(bytes([byte]))
                    await trickle.drain()
                    await asyncio.sleep(0.5)

        dripping = asyncio.create_task(drip())
        try:
            leftovers = await asyncio.gather(*(_until_closed(r) for r, _ in conns))
        finally:
            dripping.cancel()
            for _, writer in conns:
                writer.close()
        assert leftovers == [b"", b"", b"", b""]
    assert node.fake.writes == []
    assert [r for r in node.records() if r.get("subject") == "message"] == []


async def _attacker(url: str, count: int) -> asyncio.subprocess.Process:
    host, port = _address(url)
    return await asyncio.create_subprocess_exec(
        sys.executable, str(FAKES / "slow_clients.py"), host, str(port), str(count),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)


async def _event(process: asyncio.subprocess.Process) -> dict[str, Any]:
    assert process.stdout is not None
    async with asyncio.timeout(BOUND):
        line = await process.stdout.readline()
    assert line, "the attacker exited"
    event: dict[str, Any] = json.loads(line)
    return event


@pytest.mark.slow
async def test_slow_connections_cannot_shut_out_a_sender(
        tmp_path: Path, parties: tuple[Registry, Agent, Agent]) -> None:
    """400 slowloris connections, reopened as soon as they are closed, and a real sender
    (the a2a-sdk client; on a kept-alive connection and on a new one per request) whose every
    send succeeds throughout: 100 sends across ~10 s. The server never holds more than the
    cap, and closes every one of the first 400 slow connections."""
    registry, bob, alice = parties
    node = make_node(registry, bob, tmp_path / "bob.jsonl")
    async with serving(node):
        attacker = await _attacker(node.url, 400)
        peak = 0

        async def watch() -> None:
            nonlocal peak
            while True:
                peak = max(peak, node.server.listener.connections)
                await asyncio.sleep(0.02)

        watching = asyncio.create_task(watch())
        try:
            assert await _event(attacker) == {"event": "connected"}
            fresh = httpx.AsyncClient(timeout=BOUND, limits=httpx.Limits(
                max_keepalive_connections=0))
            async with sdk_client(node.url, alice.token) as (kept, kept_ctx), \
                    sdk_client(node.url, alice.token, http=fresh) as (new, new_ctx):
                for i in range(ROUNDS):
                    # One send on a kept-alive connection, and four on new ones at once.
                    tasks = await asyncio.gather(
                        send(kept, kept_ctx, a2a_text(f"legit {i}.0")),
                        *(send(new, new_ctx, a2a_text(f"legit {i}.{j}")) for j in range(1, 5)))
                    assert [t.status.state for t in tasks] == [pb.TASK_STATE_COMPLETED] * 5, i
                    await asyncio.sleep(0.5)
            await fresh.aclose()
            # The first 400 never finished a head: the server closed every one of them.
            assert await _event(attacker) == {"event": "first_wave_closed"}
        finally:
            watching.cancel()
            assert attacker.stdin is not None
            attacker.stdin.close()
            done = await _event(attacker)
            await attacker.wait()
    assert sorted(node.fake.texts()) == sorted(
        f"legit {i}.{j}" for i in range(ROUNDS) for j in range(5))
    assert done["closed"] >= 400
    assert 0 < peak <= MAX_CONNECTIONS


async def test_over_the_cap_with_every_connection_serving_a_new_one_is_refused_at_once(
        tmp_path: Path, parties: tuple[Registry, Agent, Agent]) -> None:
    """Three connections each wait for their message's delivery (the first is held in the
    session): with a cap of three, a fourth is closed without a byte read or written; once
    they finish, new connections are served again."""
    registry, bob, alice = parties
    fake = FakeHarness()
    gate = asyncio.Event()
    fake.then(Step(gate=gate))
    node = make_node(registry, bob, tmp_path / "bob.jsonl", fake=fake,
                     listener=Listener(max_connections=3))
    async with serving(node):
        clients = [httpx.AsyncClient(base_url=node.url, timeout=BOUND) for _ in range(3)]
        try:
            waits = [asyncio.create_task(c.post("/", content=_send_body(f"held {i}"),
                                                headers=_headers(alice.token)))
                     for i, c in enumerate(clients)]
            await eventually(lambda: fake.parked.is_set() and node.server.listener.busy == 3,
                             what="three requests in flight")
            host, port = _address(node.url)
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"GET /.well-known/agent-card.json HTTP/1.1\r\nHost: x\r\n\r\n")
            assert await _until_closed(reader) == b""
            writer.close()
            gate.set()
            answers = [(await w).json() for w in waits]
            assert [a["result"]["task"]["status"]["state"] for a in answers] == [
                "TASK_STATE_COMPLETED"] * 3
            card = await clients[0].get("/.well-known/agent-card.json")
            assert card.status_code == 200
        finally:
            for c in clients:
                await c.aclose()
    assert sorted(fake.texts()) == ["held 0", "held 1", "held 2"]


@contextlib.asynccontextmanager
async def _starved_agent(state: Path, sock_dir: Path, spare: int, log: Path) -> AsyncIterator[
        tuple[asyncio.subprocess.Process, dict[str, Any]]]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with log.open("wb") as err:
        child = await asyncio.create_subprocess_exec(
            sys.executable, str(FAKES / "fd_starved_agent.py"), str(state), str(sock_dir),
            str(spare), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=err, env=env, cwd=REPO)
    try:
        assert child.stdout is not None
        async with asyncio.timeout(BOUND * 2):
            ready: dict[str, Any] = json.loads(await child.stdout.readline())
        yield child, ready
    finally:
        if child.stdin is not None:
            child.stdin.close()
        try:
            async with asyncio.timeout(BOUND):
                await child.wait()
        except TimeoutError:
            child.kill()
            await child.wait()


@dataclass
class LogRecord:
    """One record of the child's log: its logger and its lines (a traceback included)."""

    logger: str
    lines: list[str]


def _records(log: Path) -> list[LogRecord]:
    records: list[LogRecord] = []
    for line in log.read_text(errors="replace").splitlines():
        head = re.match(r"(DEBUG|INFO|WARNING|ERROR|CRITICAL) (\S+): ", line)
        if head is not None:
            records.append(LogRecord(head.group(2), [line]))
        elif records:
            records[-1].lines.append(line)
        else:
            records.append(LogRecord("?", [line]))
    return records


#: The loggers that speak for accepting and serving A2A connections.
LISTENING = ("asyncio", "crosstalk.ingress.accept", "crosstalk.a2a", "uvicorn", "a2a")


def _exhausted(records: list[LogRecord]) -> list[LogRecord]:
    return [r for r in records if r.logger.startswith(LISTENING)
            and any("EMFILE" in x or "Too many open files" in x for x in r.lines)]


@pytest.mark.slow
async def test_running_out_of_descriptors_logs_once_and_service_resumes(
        tmp_path: Path) -> None:
    """An agent with 40 descriptors to spare and 150 idle connections at its A2A listener:
    accept fails with EMFILE. That costs a bounded number of log lines (asyncio logged one
    traceback per retry, and the retries multiplied); a sender is served even then (a waiting
    connection gives way), and once the connections close, both the A2A listener and the uds
    ingress serve again.

    A uds sender that arrives while descriptors are short may be dropped: the ingress reads the
    peer's ``/proc`` entry to identify it and gets EMFILE too (the uds ingress's own business);
    what this test holds the uds ingress to is that its accept loop does not flood and comes
    back."""
    with short_dir() as sock_dir:
        log = tmp_path / "agent.log"
        async with _starved_agent(tmp_path / "state", sock_dir, 40, log) as (_, ready):
            host, port = _address(ready["url"])
            idle = [await asyncio.open_connection(host, port) for _ in range(150)]
            await eventually(lambda: _exhausted(_records(log)), what="accept hit EMFILE",
                             timeout=BOUND)
            await asyncio.sleep(2)  # a flood, if there is one, has long started by now
            # A uds sender arrives while no descriptor is free for it.
            uds_probe = asyncio.create_task(exchange(
                Path(ready["uds"]), auth(ready["uds_token"]) + user("probe"), timeout=BOUND))
            async with httpx.AsyncClient(timeout=BOUND) as http:
                # Still short of descriptors: a waiting connection gives way to the sender.
                during = await http.post(ready["url"] + "/", content=_send_body("during"),
                                         headers=_headers(ready["token"]))
                await asyncio.sleep(1)
                flooded = _records(log)
                for _, writer in idle:
                    writer.close()
                after = await http.post(ready["url"] + "/", content=_send_body("after"),
                                        headers=_headers(ready["token"]))
            for resp in (during, after):
                assert resp.json()["result"]["task"]["status"]["state"] == (
                    "TASK_STATE_COMPLETED"), resp.text
            with contextlib.suppress(OSError, TimeoutError):
                await uds_probe
            raw, _ = await exchange(Path(ready["uds"]), auth(ready["uds_token"]) + user("uds"))
            assert [a["state"] for a in acks(raw)] == ["accepted"]
        records = _records(log)
    assert len(_exhausted(flooded)) <= 3, [r.lines[0] for r in flooded[:20]]
    assert len(records) < 20, [r.lines[0] for r in records[:40]]
    listening = [r for r in records if r.logger.startswith(LISTENING)]
    assert not [r for r in listening if len(r.lines) > 1], [r.lines for r in listening]
