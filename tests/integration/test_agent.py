"""Two agents composed from the real parts: registry, journal, receiver, uds ingress, A2A."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from crosstalk.a2a import client as a2a_client
from crosstalk.agent import Agent, AgentSpec, ReplyRefused
from crosstalk.core.ids import new_message_id
from crosstalk.core.states import AskState, MessageState
from crosstalk.harness.base import Receipt
from crosstalk.harness.fake import FakeHarness, Step
from crosstalk.store.journal import Journal
from crosstalk.store.journal_read import read_journal
from crosstalk.store.registry import AgentBusy, Registry

pytestmark = pytest.mark.anyio


@pytest.fixture
def env() -> dict[str, str]:
    return {"XDG_RUNTIME_DIR": tempfile.mkdtemp(prefix="ct-rt-", dir="/tmp")}


@pytest.fixture
async def pair(tmp_path: Path, env: dict[str, str]) -> AsyncIterator[tuple[Agent, Agent]]:
    reg = Registry(tmp_path / "state")
    a = Agent(reg, AgentSpec(FakeHarness(name="fake"), "sess-a", "/w/proj", "alice"), env=env)
    b = Agent(reg, AgentSpec(FakeHarness(name="fake"), "sess-b", "/w/proj", "bob"), env=env)
    await a.start()
    await b.start()
    try:
        yield a, b
    finally:
        await a.stop()
        await b.stop()


def harness_of(agent: Agent) -> FakeHarness:
    h = agent.spec.harness
    assert isinstance(h, FakeHarness)
    return h


async def test_publish_order_and_descriptor(pair: tuple[Agent, Agent],
                                            env: dict[str, str]) -> None:
    a, _ = pair
    live = {d.name: d for d in a.registry.live()}
    assert set(live) == {"alice", "bob"}
    d = live["alice"]
    assert d.a2a_url is not None
    assert d.a2a_url.startswith("http://127.0.0.1:")
    assert d.uds_path == f"{env['XDG_RUNTIME_DIR']}/cc-socks/{a.agent_id}.sock"
    assert Path(d.uds_path).exists()
    assert a.token not in d.to_json().decode()


async def test_a2a_send_reaches_the_other_session_once(pair: tuple[Agent, Agent]) -> None:
    a, b = pair
    result = await a.send("bob", "hello bob")
    assert result.state == "accepted"
    assert harness_of(b).texts() == ["hello bob"]
    sender = harness_of(b).writes[0].delivery.message.sender
    assert (sender.agent_id, sender.name) == (a.agent_id, "alice")
    again = await a.send("bob", "hello bob", message_id=result.message_id)
    assert again.state == "accepted"
    assert harness_of(b).texts() == ["hello bob"]


async def test_ask_then_answer_over_a2a(pair: tuple[Agent, Agent]) -> None:
    a, b = pair
    sent = await a.send("bob", "which test is flaky?", kind="ask", until_delivered=True)
    assert sent.state == "accepted"
    assert b.receiver is not None
    b.receiver.close_ask(sent.message_id, AskState.ANSWERED, "test_retry")
    assert a.registry.find("bob")[0].a2a_url is not None
    final = await a.send("bob", "which test is flaky?", kind="ask",
                         message_id=sent.message_id)
    assert final.reply == "test_retry"
    assert harness_of(b).texts() == ["which test is flaky?"]


async def test_cli_send_over_the_uds_ingress(pair: tuple[Agent, Agent], tmp_path: Path) -> None:
    _, b = pair
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "crosstalk", "send", "--json", "bob", "from a script",
        env={**os.environ, "CROSSTALK_HOME": str(tmp_path / "state")},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err
    assert json.loads(out)["state"] == "accepted"
    assert harness_of(b).texts() == ["from a script"]
    assert not harness_of(b).writes[0].delivery.message.sender.verified


async def test_restart_resumes_the_journal_and_dedupe(tmp_path: Path,
                                                      env: dict[str, str]) -> None:
    reg = Registry(tmp_path / "state")
    a = Agent(reg, AgentSpec(FakeHarness(name="fake"), "sess-a", "/w", "alice"), env=env)
    b = Agent(reg, AgentSpec(FakeHarness(name="fake"), "sess-b", "/w", "bob"), env=env)
    await a.start()
    await b.start()
    try:
        first = await a.send("bob", "before restart")
        assert first.state == "accepted"
        old_uds = b.descriptor.uds_path if b.descriptor else None
        await b.stop()
        b2 = Agent(reg, AgentSpec(FakeHarness(name="fake"), "sess-b", "/w", "bob"), env=env)
        await b2.start()
        try:
            assert b2.name == "bob"
            assert b2.descriptor is not None
            assert b2.descriptor.uds_path == old_uds  # reply addresses survive restarts
            retry = await a.send("bob", "before restart", message_id=first.message_id)
            assert retry.state == "accepted"
            assert harness_of(b2).writes == []  # the prior state, zero injections
            jpath = reg.home / "journal" / f"{b2.agent_id}.jsonl"
            states = [r["state"] for r in read_journal(jpath).records
                      if r.get("id") == first.message_id and r.get("subject") == "message"]
            assert states == ["submitted", "dispatching", "accepted"]
        finally:
            await b2.stop()
    finally:
        await a.stop()


async def test_second_start_of_one_session_is_refused(tmp_path: Path,
                                                      env: dict[str, str]) -> None:
    reg = Registry(tmp_path / "state")
    a = Agent(reg, AgentSpec(FakeHarness(name="fake"), "same", "/w", "x"), env=env)
    await a.start()
    try:
        twin = Agent(reg, AgentSpec(FakeHarness(name="fake"), "same", "/w", "x"), env=env)
        with pytest.raises(AgentBusy):
            await twin.start()
        assert [d.agent_id for d in reg.live()] == [a.agent_id]
    finally:
        await a.stop()
    assert reg.live() == []
    assert a.descriptor is not None
    assert a.descriptor.uds_path is not None
    assert not Path(a.descriptor.uds_path).exists()


@pytest.mark.seed(5)
async def test_native_reply_from_the_agents_own_session_is_bounced(
        tmp_path: Path, env: dict[str, str]) -> None:
    """A real process stands in for Claude session B (B's harness_pid) and answers natively."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c",
        "import socket, sys\n"
        "path, payload = sys.stdin.readline().strip(), sys.stdin.readline()\n"
        "s = socket.socket(socket.AF_UNIX); s.connect(path)\n"
        "s.sendall(payload.encode()); s.shutdown(socket.SHUT_WR)\n"
        "print(repr(s.recv(100)), flush=True)\n",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    reg = Registry(tmp_path / "state")
    a = Agent(reg, AgentSpec(FakeHarness(name="fake"), "sess-a", "/w", "alice"), env=env)
    b = Agent(reg, AgentSpec(FakeHarness(name="fake"), "sess-b", "/w", "bob",
                             harness_pid=child.pid), env=env)
    await a.start()
    await b.start()
    try:
        asked = await a.send("bob", "which test is flaky?", kind="ask", until_delivered=True)
        assert asked.state == "accepted"
        assert b.descriptor is not None
        assert b.descriptor.uds_path is not None
        frame = json.dumps({"type": "user", "message": {"role": "user", "content": (
            f'<cross-session-message from="uds:{b.descriptor.uds_path}" from-name="bob" '
            'from-mode="prompting">\ntest_retry, I think\n</cross-session-message>')},
            "msgV": 1, "from": f"uds:{b.descriptor.uds_path}"})
        assert child.stdin is not None
        assert child.stdout is not None
        child.stdin.write(f"{b.descriptor.uds_path}\n{frame}\n".encode())
        await child.stdin.drain()
        reply = await asyncio.wait_for(child.stdout.readline(), 30)
        assert reply.strip() == b"b''"  # native senders never get a byte back
        assert b.uds is not None
        await b.uds.settle()
        texts = harness_of(b).texts()
        assert texts[0] == "which test is flaky?"
        assert len(texts) == 2
        assert "test_retry, I think" in texts[1]
        assert asked.message_id in texts[1]
        assert harness_of(a).texts() == []  # never forwarded to the asker
        assert b.receiver is not None
        assert b.receiver.entries[asked.message_id].ask is AskState.OPEN
    finally:
        await a.stop()
        await b.stop()
        await child.wait()



async def test_a_reply_interrupted_after_its_obligation_resumes_once(
        tmp_path: Path, env: dict[str, str]) -> None:
    """R5: the staged reply goes on from its stage after a restart, and reaches A once."""
    reg = Registry(tmp_path / "state")
    a = Agent(reg, AgentSpec(FakeHarness(name="fake"), "sess-a", "/w", "alice"), env=env)
    b = Agent(reg, AgentSpec(FakeHarness(name="fake"), "sess-b", "/w", "bob"), env=env)
    await a.start()
    await b.start()
    try:
        asked = await a.send("bob", "ready to merge?", kind="ask", until_delivered=True)
        assert asked.state == "accepted"
        await b.stop()
        # The crash: the obligation was journaled, nothing after it happened.
        jpath = reg.home / "journal" / f"{b.agent_id}.jsonl"
        with Journal(jpath) as j:
            j.append({"subject": "reply", "id": asked.message_id, "state": "pending",
                      "reply_id": "0190b000-0000-7000-8000-00000000beef", "text": "yes",
                      "to": a.agent_id, "refs": [asked.message_id]})
        for _ in range(2):  # two restarts: the second finds the reply already forwarded
            b = Agent(reg, AgentSpec(FakeHarness(name="fake"), "sess-b", "/w", "bob"),
                      env=env)
            await b.start()
            for _ in range(200):
                if harness_of(a).texts():
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)
            await b.stop()
        assert harness_of(a).texts() == ["yes"]
        delivered = harness_of(a).writes[0].delivery.message
        assert delivered.in_reply_to == asked.message_id
        assert delivered.sender.name == "bob"
        states = [(r.get("subject"), r.get("state")) for r in read_journal(jpath).records
                  if r.get("id") == asked.message_id and r.get("subject") in ("ask", "reply")]
        assert states == [("ask", "open"), ("reply", "pending"), ("ask", "answered"),
                          ("reply", "forwarded")]
    finally:
        await a.stop()
        await b.stop()


async def test_r6_a_reply_to_a_continuation_answers_the_ask_of_its_task(
        pair: tuple[Agent, Agent]) -> None:
    """R6: every continuation message id of a task leads to the ask that opened it."""
    a, b = pair
    url = a.registry.find("bob")[0].a2a_url
    assert url is not None
    first = await a2a_client.send(url, a.token, "which test is flaky?", kind="ask",
                                  until_delivered=True)
    assert first.state == "accepted"
    assert first.task_id
    more = await a2a_client.send(url, a.token, "the one in test_a2a.py", task_id=first.task_id,
                                 until_delivered=True)
    assert more.state == "accepted"
    assert harness_of(b).texts() == ["which test is flaky?", "the one in test_a2a.py"]

    answered = await b.reply(more.message_id, "test_retry")
    assert answered["state"] == "accepted"
    task = await a2a_client.get_task(url, a.token, first.task_id)
    assert (task.task_state, task.completion, task.reply) == ("completed", "answered",
                                                              "test_retry")
    assert harness_of(a).writes[-1].delivery.message.in_reply_to == more.message_id
    # One answer per ask: the ask's own message id, answered through its continuation, is
    # already_replied; a retry of the same reply returns the first result.
    with pytest.raises(ReplyRefused) as refused:
        await b.reply(first.message_id, "test_retry")
    assert refused.value.reason == "already_replied"
    assert await b.reply(more.message_id, "test_retry") == answered
    assert len(harness_of(a).writes) == 1
    assert b.receiver is not None
    assert b.receiver.entries[first.message_id].ask is AskState.ANSWERED


async def test_r8_only_the_reply_tool_answers_an_ask(pair: tuple[Agent, Agent],
                                                     tmp_path: Path,
                                                     env: dict[str, str]) -> None:
    """R8: an ask is answered only by the reply obligation its own session journals, bound
    to the asker; a message that merely claims ``in_reply_to`` (even a rejected one) from
    anyone else answers nothing, and the ask still expires at its deadline."""
    a, b = pair
    c = Agent(a.registry, AgentSpec(FakeHarness(name="fake"), "sess-c", "/w", "carol"),
              env=env)
    await c.start()
    try:
        asked = await a.send("bob", "deploy now?", kind="ask", deadline_seconds=2,
                             until_delivered=True)
        assert asked.state == "accepted"
        forged = await c.send("bob", "yes (forged)", in_reply_to=asked.message_id)
        assert forged.state == "accepted"  # delivered as an inform, nothing more
        rejected = await c.send("bob", "yes (command)", kind="command",
                                in_reply_to=asked.message_id)
        assert rejected.state in {"accepted", "rejected"}
        assert b.receiver is not None
        assert b.receiver.entries[asked.message_id].ask is AskState.OPEN
        for _ in range(100):
            if b.receiver.entries[asked.message_id].ask is not AskState.OPEN:
                break
            await asyncio.sleep(0.05)
        assert b.receiver.entries[asked.message_id].ask is AskState.EXPIRED
        url = a.registry.find("bob")[0].a2a_url
        assert url is not None
        task = await a2a_client.get_task(url, a.token, str(asked.task_id))
        assert task.task_state == "failed"
        assert task.reply is None
        with pytest.raises(ReplyRefused) as refused:
            await b.reply(asked.message_id, "too late")
        assert refused.value.reason == "ask_closed"
        assert harness_of(a).texts() == []  # nothing ever reached the asker
    finally:
        await c.stop()


async def test_r7_an_inform_route_expires_after_an_hour(tmp_path: Path,
                                                       env: dict[str, str]) -> None:
    """R7: reply answers an inform for an hour; after that it is ask_closed, and the bounce
    notice no longer lists it."""
    now = [1_800_000_000.0]
    reg = Registry(tmp_path / "state")
    a = Agent(reg, AgentSpec(FakeHarness(name="fake"), "sess-a", "/w", "alice"), env=env)
    b = Agent(reg, AgentSpec(FakeHarness(name="fake"), "sess-b", "/w", "bob"), env=env,
              clock=lambda: now[0])
    await a.start()
    await b.start()
    try:
        early = await a.send("bob", "fyi one")
        late = await a.send("bob", "fyi two")
        assert early.state == late.state == "accepted"
        now[0] += 3599
        assert (await b.reply(early.message_id, "thanks"))["state"] == "accepted"
        now[0] += 2
        with pytest.raises(ReplyRefused) as refused:
            await b.reply(late.message_id, "thanks again")
        assert refused.value.reason == "ask_closed"
        assert b.receiver is not None
        assert not b.receiver.entries[late.message_id].route_open(now[0])
        # Restored from the journal, the arrival time (and so the expiry) survives a restart.
        await b.stop()
        b = Agent(reg, AgentSpec(FakeHarness(name="fake"), "sess-b", "/w", "bob"), env=env,
                  clock=lambda: now[0])
        await b.start()
        assert b.receiver is not None
        assert not b.receiver.entries[late.message_id].route_open(now[0])
        now[0] -= 2
        assert b.receiver.entries[late.message_id].route_open(now[0])
    finally:
        await a.stop()
        await b.stop()


@pytest.mark.parametrize(("status", "state", "task_state"), [
    ("delivered", MessageState.ACCEPTED, "completed"),
    ("denied", MessageState.UNREACHABLE, "failed"),
])
async def test_a_held_message_is_settled_by_its_later_receipt(
        pair: tuple[Agent, Agent], status: str, state: MessageState, task_state: str) -> None:
    """Issue 5: a message the session held for its user is unknown (never "delivered") until
    the harness's receipt says released or denied; the sender's task then settles."""
    a, b = pair
    harness_of(b).then(Step(MessageState.UNKNOWN, "held_for_approval", evidence="held"))
    sent = await a.send("bob", "needs your user's ok", until_delivered=True)
    assert (sent.state, sent.reason) == ("unknown", "held_for_approval")
    assert b.receiver is not None
    b.apply_receipt(Receipt("0190b000-0000-7000-8000-000000000000", "delivered"))  # not ours
    b.apply_receipt(Receipt(sent.message_id, status))
    assert b.receiver.entries[sent.message_id].state is state
    url = a.registry.find("bob")[0].a2a_url
    assert url is not None
    task = await a2a_client.get_task(url, a.token, str(sent.task_id))
    assert task.task_state == task_state
    receipts = [r for r in b.journal_records() if r.get("subject") == "receipt"]
    assert [(r["id"], r["status"]) for r in receipts] == [(sent.message_id, status)]


async def _uds_shape_a(path: str, token: str, text: str, message_id: str) -> dict[str, object]:
    """``crosstalk send``'s two lines over the agent's socket; returns the ack."""
    reader, writer = await asyncio.open_unix_connection(path)
    try:
        for line in ({"type": "auth", "token": token},
                     {"type": "user", "message": {"role": "user", "content": text},
                      "crosstalk": {"message_id": message_id}}):
            writer.write(json.dumps(line).encode() + b"\n")
        await writer.drain()
        writer.write_eof()
        ack: dict[str, object] = json.loads(await reader.readline())
        return ack
    finally:
        writer.close()


async def test_both_ingresses_share_the_agents_one_ordered_lane(
        pair: tuple[Agent, Agent]) -> None:
    """A uds frame arriving while an A2A message is being injected waits its turn, submitted,
    and is injected after it: one injection at a time per agent, in arrival order."""
    a, b = pair
    gate = asyncio.Event()
    harness_of(b).then(Step(gate=gate))
    first = await a.send("bob", "over a2a", return_immediately=True)
    await asyncio.wait_for(harness_of(b).parked.wait(), 10)
    assert b.uds is not None
    assert b.receiver is not None
    mid = new_message_id()
    ack = asyncio.create_task(_uds_shape_a(
        str(b.uds.path), b.uds.key_path.read_text().strip(), "over uds", mid))
    async with asyncio.timeout(10):
        while mid not in b.receiver.entries:
            await asyncio.sleep(0.002)
    await asyncio.sleep(0.05)  # time for a second, concurrent injection, were there one
    assert b.receiver.entries[first.message_id].state is MessageState.DISPATCHING
    assert b.receiver.entries[mid].state is MessageState.SUBMITTED  # waiting in the lane
    assert harness_of(b).dequeued == 1
    gate.set()
    assert (await asyncio.wait_for(ack, 10))["state"] == "accepted"
    assert harness_of(b).texts() == ["over a2a", "over uds"]


async def test_stop_closes_the_agents_task_group(tmp_path: Path, env: dict[str, str]) -> None:
    """Lane, ask clock, recovery: when stop() returns, nothing the agent started runs."""
    reg = Registry(tmp_path / "state")
    a = Agent(reg, AgentSpec(FakeHarness(name="fake"), "sess-a", "/w", "alice"), env=env)
    b = Agent(reg, AgentSpec(FakeHarness(name="fake"), "sess-b", "/w", "bob"), env=env)
    await a.start()
    before = asyncio.all_tasks()
    await b.start()
    asked = await a.send("bob", "still there?", kind="ask", deadline_seconds=60,
                         until_delivered=True)
    assert asked.state == "accepted"
    assert b.lane is not None
    assert b.lane.armed  # the ask's deadline timer runs on the agent's clock
    await b.stop()
    assert asyncio.all_tasks() - before == set()
    assert b.lane is None
    await a.stop()
