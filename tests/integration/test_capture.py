"""``crosstalk capture`` against real agents (registry, journal, uds ingress, A2A, FakeHarness):
the capture client is a real subprocess; frames appear for a uds send and an A2A send, no token
or key of the state directory is in what it prints, and capturing changes no delivery."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from crosstalk import proc
from crosstalk.agent import Agent, AgentSpec
from crosstalk.capture.tap import MAX_CAPTURES
from crosstalk.config import uds_key_path
from crosstalk.core.ids import new_message_id
from crosstalk.core.message import Ingress, Message, Sender
from crosstalk.core.states import MessageState
from crosstalk.harness.base import Binding, Delivery
from crosstalk.harness.claude import Injector
from crosstalk.harness.claude.receipts import Tracker
from crosstalk.harness.claude.registry import ClaudeSession
from crosstalk.harness.codex import CodexHarness, control_socket
from crosstalk.harness.fake import FakeHarness
from crosstalk.harness.opencode import OpencodeHarness, host_record
from crosstalk.store.journal_read import read_journal
from crosstalk.store.registry import Registry
from tests.support.agents import fake_agent, running
from tests.support.fakes.codex_app_server import fake_app_server
from tests.support.fakes.opencode_instance import FakeOpencode
from tests.support.waiting import eventually

pytestmark = pytest.mark.anyio


@pytest.fixture
def env() -> dict[str, str]:
    return {"XDG_RUNTIME_DIR": tempfile.mkdtemp(prefix="ct-rt-", dir="/tmp")}


@pytest.fixture
async def pair(tmp_path: Path, env: dict[str, str]) -> AsyncIterator[tuple[Agent, Agent]]:
    home = tmp_path / "state"
    async with running(fake_agent(home, env, "sess-a", "alice", cwd="/w/proj"),
                       fake_agent(home, env, "sess-b", "bob", cwd="/w/proj")) as (a, b):
        yield a, b


def texts(agent: Agent) -> list[str]:
    harness = agent.spec.harness
    assert isinstance(harness, FakeHarness)
    return harness.texts()


def secrets_of(home: Path) -> list[str]:
    """Every token and key on disk: bearer credentials and each agent's uds key."""
    found = [p.read_text().strip() for p in (home / "credentials").glob("*.token")]
    for desc in Registry(home).live():
        assert desc.uds_path is not None
        found.append(uds_key_path(Path(desc.uds_path)).read_text().strip())
    assert len(found) >= 4
    assert all(len(s) >= 32 for s in found)
    return found


class Capture:
    """``crosstalk capture <agent>`` as a subprocess, its stdout read as JSON lines."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.raw: list[str] = []
        self.frames: list[dict[str, Any]] = []
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def start(cls, home: Path, agent: str) -> Capture:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "crosstalk", "capture", agent,
            env={**os.environ, "CROSSTALK_HOME": str(home)},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        capture = cls(proc)
        assert proc.stderr is not None
        line = await asyncio.wait_for(proc.stderr.readline(), 60)
        assert b"capturing" in line, line
        return capture

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            self.raw.append(line.decode())
            self.frames.append(json.loads(line))

    def where(self, source: str, direction: str | None = None) -> list[dict[str, Any]]:
        return [f for f in self.frames if f.get("source") == source
                and (direction is None or f.get("direction") == direction)]

    async def stop(self) -> tuple[int, str]:
        """Ctrl-C, as a user stops it; the exit code and stderr."""
        self.proc.send_signal(signal.SIGINT)
        assert self.proc.stderr is not None
        err = await asyncio.wait_for(self.proc.stderr.read(), 30)
        code = await asyncio.wait_for(self.proc.wait(), 30)
        await self._reader
        return code, err.decode()


async def cli_send(home: Path, to: str, text: str) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "crosstalk", "send", "--json", to, text,
        env={**os.environ, "CROSSTALK_HOME": str(home)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err
    ack = json.loads(out)
    assert isinstance(ack, dict)
    return ack


async def raw_capture(agent: Agent) -> tuple[asyncio.StreamReader, asyncio.StreamWriter,
                                             dict[str, Any]]:
    """A capture opened by hand on the agent's socket; its first answer line."""
    assert agent.uds is not None
    token = agent.uds.key_path.read_text().strip()
    reader, writer = await asyncio.open_unix_connection(agent.uds.path)
    writer.write(json.dumps({"type": "auth", "token": token}).encode() + b"\n"
                 + b'{"type":"capture"}\n')
    await writer.drain()
    return reader, writer, json.loads(await asyncio.wait_for(reader.readline(), 10))


def shape(journal: Path, message_id: str) -> list[tuple[Any, Any, Any]]:
    """A message's journal records without their times and ids: what a capture may not
    change."""
    return [(r.get("subject") or r.get("type"), r.get("state"), r.get("reason"))
            for r in read_journal(journal).records if r.get("id") == message_id]


async def test_capture_shows_uds_and_a2a_frames_and_no_secret(
        pair: tuple[Agent, Agent], tmp_path: Path) -> None:
    a, b = pair
    home = tmp_path / "state"
    capture = await Capture.start(home, "bob")
    ack = await cli_send(home, "bob", "over the uds ingress")
    sent = await a.send("bob", "over A2A")
    assert (ack["state"], sent.state) == ("accepted", "accepted")
    await eventually(lambda: sent.message_id in json.dumps(capture.where("a2a", "out")),
                     what="the SendMessage answer")
    await eventually(lambda: len(capture.where("uds", "out")) >= 1, what="the uds ack")
    code, err = await capture.stop()
    assert code == 0, err

    uds_in = [f["frame"] for f in capture.where("uds", "in")]
    auth = next(f for f in uds_in if f.get("type") == "auth")
    assert auth["token"] == "[redacted]"
    user = next(f for f in uds_in if f.get("type") == "user")
    assert user["message"]["content"] == "over the uds ingress"
    assert user["crosstalk"]["message_id"] == ack["message_id"]
    assert capture.where("uds", "out")[0]["frame"] == {
        "type": "ack", "message_id": ack["message_id"], "state": "accepted", "reason": None}
    request = next(f["frame"] for f in capture.where("a2a", "in")
                   if f["frame"]["method"] == "POST")
    assert request["headers"]["authorization"] == "[redacted]"
    assert request["body"]["method"] == "SendMessage"
    assert "over A2A" in json.dumps(request["body"])
    answer = capture.where("a2a", "out")[-1]["frame"]
    assert answer["status"] == 200
    assert sent.message_id in json.dumps(answer["body"])
    assert {f["agent"] for f in capture.frames} == {b.agent_id}
    everything = "".join(capture.raw) + err
    for secret in secrets_of(home):
        assert secret not in everything
    assert texts(b) == ["over the uds ingress", "over A2A"]


async def test_capturing_changes_no_outcome_and_no_journal_record(
        pair: tuple[Agent, Agent], tmp_path: Path) -> None:
    a, b = pair
    home = tmp_path / "state"
    plain = await a.send("bob", "first, nobody captures")
    plain_ack = await cli_send(home, "bob", "by script, nobody captures")
    capture = await Capture.start(home, "bob")
    seen = await a.send("bob", "second, captured")
    seen_ack = await cli_send(home, "bob", "by script, captured")
    await eventually(lambda: len(capture.where("uds", "out")) >= 1, what="the uds ack")
    code, _ = await capture.stop()
    assert code == 0
    assert (plain.state, plain.reason) == (seen.state, seen.reason) == ("accepted", None)
    assert {k: v for k, v in plain_ack.items() if k != "message_id"} == {
        k: v for k, v in seen_ack.items() if k != "message_id"}
    assert b.journal is not None
    journal = b.journal.path
    assert shape(journal, plain.message_id) == shape(journal, seen.message_id)
    assert shape(journal, plain_ack["message_id"]) == shape(journal, seen_ack["message_id"])
    assert shape(journal, seen.message_id)  # not two empty lists
    assert texts(b) == ["first, nobody captures", "by script, nobody captures",
                        "second, captured", "by script, captured"]


async def test_a_fifth_capture_is_refused_and_open_ones_block_no_send(
        pair: tuple[Agent, Agent], tmp_path: Path) -> None:
    _, b = pair
    home = tmp_path / "state"
    opened = [await raw_capture(b) for _ in range(MAX_CAPTURES)]
    try:
        assert all(hello["type"] == "capture_started" for _, _, hello in opened)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "crosstalk", "capture", "bob",
            env={**os.environ, "CROSSTALK_HOME": str(home)},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 1
        assert b"too_many_captures" in err
        assert out == b""
        # Four captures held open, past the ingress's first-line timeout: a send still goes
        # straight through, and every capture sees it.
        assert b.uds is not None
        await asyncio.sleep(b.uds.first_line_timeout + 0.5)
        started = time.monotonic()
        ack = await cli_send(home, "bob", "while four captures are open")
        assert ack["state"] == "accepted"
        assert time.monotonic() - started < 30
        for reader, _, _ in opened:
            lines: list[str] = []
            while not any('"ack"' in line for line in lines):
                lines.append((await asyncio.wait_for(reader.readline(), 10)).decode())
            assert any("while four captures are open" in line for line in lines)
        assert b.uds.reading == 0  # none of them counts against the reader cap
    finally:
        for _, writer, _ in opened:
            writer.close()
    await eventually(lambda: not b.tap.subscribers, what="the closed captures to end")
    assert texts(b) == ["while four captures are open"]


async def test_the_capture_ends_when_the_agent_stops(tmp_path: Path,
                                                     env: dict[str, str]) -> None:
    reg = Registry(tmp_path / "state")
    b = Agent(reg, AgentSpec(FakeHarness(name="fake"), "sess-b", "/w", "bob"), env=env)
    await b.start()
    capture = await Capture.start(tmp_path / "state", "bob")
    started = time.monotonic()
    await b.stop()
    assert capture.proc.stderr is not None
    err = await asyncio.wait_for(capture.proc.stderr.read(), 30)
    assert await asyncio.wait_for(capture.proc.wait(), 30) == 0
    assert b"closed the capture" in err
    assert time.monotonic() - started < 2.0  # no connection grace spent on a capture


async def test_a_wrong_key_is_refused(pair: tuple[Agent, Agent]) -> None:
    _, b = pair
    assert b.uds is not None
    reader, writer = await asyncio.open_unix_connection(b.uds.path)
    writer.write(b'{"type":"auth","token":"' + b"0" * 32 + b'"}\n{"type":"capture"}\n')
    await writer.drain()
    answer = json.loads(await asyncio.wait_for(reader.readline(), 10))
    writer.close()
    assert (answer["state"], answer["reason"]) == ("rejected", "auth_failed")
    assert not b.tap.subscribers


async def test_claude_inbox_frames_and_receipts_are_captured_without_the_peer_token(
        tmp_path: Path, env: dict[str, str]) -> None:
    """An injection into a Claude-like inbox (never a byte back; a ``held`` receipt sent to
    the frame's ``from``, the agent's real uds ingress): the frame written, what the socket
    proved, the receipt as a uds line and as read, and no ``peerToken`` anywhere."""
    tracker = Tracker()
    reg = Registry(tmp_path / "state")
    b = Agent(reg, AgentSpec(FakeHarness(name="fake"), "sess-b", "/w", "bob"), env=env,
              control_sinks=[tracker.on_control])
    await b.start()
    short = Path(tempfile.mkdtemp(prefix="ct-cap-", dir="/tmp"))
    inbox_path = short / "inbox.sock"

    async def inbox(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read()
        writer.close()
        frame = json.loads(data.decode().splitlines()[-1])
        receipt = {"type": "control", "action": "peer_message_status", "status": "held",
                   "orig_msg_id": frame["msg_id"], "msgV": 1}
        _, w = await asyncio.open_unix_connection(frame["from"].removeprefix("uds:"))
        w.write(json.dumps(receipt).encode() + b"\n")
        w.write_eof()
        w.close()

    server = await asyncio.start_unix_server(inbox, str(inbox_path))
    peer_token = secrets.token_hex(16)
    session = ClaudeSession(pid=os.getpid(), session_id="sess-1", config_dir=tmp_path,
                            record_path=tmp_path / "sessions" / f"{os.getpid()}.json",
                            messaging_socket_path=str(inbox_path),
                            proc_start=proc.process_start_time(os.getpid()),
                            pid_domain=proc.pid_domain())
    assert session.key_path is not None
    session.key_path.parent.mkdir(parents=True)
    session.key_path.write_text(json.dumps({"peerToken": peer_token}))
    session.key_path.chmod(0o600)
    try:
        capture = await Capture.start(tmp_path / "state", "bob")
        assert b.uds is not None
        msg = Message(message_id=new_message_id(), text="into claude",
                      sender=Sender(agent_id="a" * 16, name="alice", ingress=Ingress.A2A))
        out = await Injector(tracker=tracker, grace=2.0).deliver(
            session, Delivery(msg, str(b.uds.path)), from_address=str(b.uds.path),
            session_id="sess-1")
        assert (out.state, out.reason) == (MessageState.UNKNOWN, "held_for_approval")
        await eventually(lambda: capture.where("claude_receipt"), what="the receipt")
        code, err = await capture.stop()
    finally:
        server.close()
        await b.stop()
    assert code == 0, err
    auth, user = (f["frame"] for f in capture.where("claude_inbox", "out"))
    assert auth == {"type": "auth", "token": "[redacted]"}
    assert user["session_id"] == "sess-1"
    assert "into claude" in user["message"]["content"]
    (proved,) = capture.where("claude_inbox", "in")
    assert proved["frame"]["inbox_result"] == "accepted"
    assert any(f["frame"].get("action") == "peer_message_status"
               for f in capture.where("uds", "in"))
    (receipt,) = capture.where("claude_receipt", "in")
    assert receipt["frame"]["status"] == "held"
    assert receipt["frame"]["message_id"] == msg.message_id
    assert peer_token not in "".join(capture.raw) + err


async def test_codex_json_rpc_for_the_agents_thread_is_captured(
        tmp_path: Path, env: dict[str, str]) -> None:
    """Codex traffic is tagged by thread: the ``turn/start`` for this agent's thread and its
    answer appear; ``initialize`` and the loaded-thread probe (no thread) do not."""
    codex_home = Path(tempfile.mkdtemp(prefix="ct-cx-", dir="/tmp"))
    async with fake_app_server(Path(control_socket({"CODEX_HOME": str(codex_home)}))) as srv:
        thread = srv.add("worker", cwd="/w")
        reg = Registry(tmp_path / "state")
        agent = Agent(reg, AgentSpec(FakeHarness(name="codex"), thread.id, "/w", "worker"),
                      env=env)
        await agent.start()
        try:
            capture = await Capture.start(tmp_path / "state", "worker")
            msg = Message(message_id=new_message_id(), text="from alice",
                          sender=Sender(agent_id="a" * 16, name="alice", ingress=Ingress.A2A))
            out = await CodexHarness(thread.id, lambda: [str(srv.path)], timeout=2.0).inject(
                Binding("codex", thread.id, None, "inst"), Delivery(msg))
            assert out.state is MessageState.ACCEPTED
            await eventually(lambda: capture.where("codex_rpc", "in"), what="the answer")
            code, err = await capture.stop()
        finally:
            await agent.stop()
    assert code == 0, err
    (request,) = [f["frame"] for f in capture.where("codex_rpc", "out")]
    assert request["method"] == "turn/start"
    assert request["params"]["threadId"] == thread.id
    assert "from alice" in request["params"]["input"][0]["text"]
    answers = [f["frame"] for f in capture.where("codex_rpc", "in") if "result" in f["frame"]]
    assert answers[0]["id"] == request["id"]
    assert answers[0]["result"]["turn"]["id"] == thread.turn
    assert not any(f["frame"].get("method") in ("initialize", "thread/loaded/list")
                   for f in capture.where("codex_rpc"))


async def test_opencode_http_for_the_agents_session_is_captured(
        tmp_path: Path, env: dict[str, str]) -> None:
    """What the opencode injector sends its host instance (``prompt_async`` with the envelope)
    and what it reads back (the 204, the event that proves the message stored) appear."""
    folder = tempfile.mkdtemp(prefix="ct-oc-", dir="/tmp")
    project = tmp_path / "project"
    project.mkdir()
    state = tmp_path / "state"
    fake = await FakeOpencode(os.path.join(folder, "i.sock"), str(project), str(state)).start()
    try:
        sid = fake.add_session("work")
        reg = Registry(state)
        host_env = {"CROSSTALK_HOME": str(state)}
        harness = OpencodeHarness(sid, lambda: host_record(host_env, fake.pid, fake.directory))
        bob = Agent(reg, AgentSpec(harness, sid, str(project), "bob"), env=env)
        alice = Agent(reg, AgentSpec(FakeHarness(name="fake"), "sess-a", "/w", "alice"),
                      env=env)
        await bob.start()
        await alice.start()
        try:
            capture = await Capture.start(state, "bob")
            sent = await alice.send("bob", "into opencode", until_delivered=True)
            assert sent.state == "accepted"

            def evidence_captured() -> bool:  # the frame the evidence came in, not any frame
                return any(f["frame"].get("type") == "message.part.updated"
                           for f in capture.where("opencode_http", "in"))

            await eventually(evidence_captured, what="the evidence frame")
            code, err = await capture.stop()
            keys = secrets_of(state)
        finally:
            await alice.stop()
            await bob.stop()
    finally:
        await fake.stop()
    assert code == 0, err
    (post,) = [f["frame"] for f in capture.where("opencode_http", "out")]
    assert post["path"] == f"/session/{sid}/prompt_async"
    assert "into opencode" in post["body"]["parts"][0]["text"]
    back = [f["frame"] for f in capture.where("opencode_http", "in")]
    assert {"status": 204} in back
    assert any(e.get("type") == "message.part.updated"
               and e["properties"]["part"].get("metadata", {}).get("crosstalk", {})
               .get("msg_id") == sent.message_id for e in back)
    assert not [k[:4] for k in keys if k in "".join(capture.raw)]
