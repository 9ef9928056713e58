"""The lane writes the dispatch locks of waiting uds messages ahead of their turn (ADR 0045).

What the ADR promises, checked on a real agent (journal with fsync, uds ingress, lane):

- the locks of up to ``LOCK_AHEAD`` uds messages waiting behind the one being injected are
  durable before their turn, and never one past a message that is not locked;
- only the messages that reached their turn reach the harness;
- a message locked ahead whose turn never came (the agent stopped; or was killed) is
  ``unknown``, never injected later, and still in the mailbox; the ones behind it stay
  ``submitted`` and come back ``recovered``, as before;
- an A2A message is never locked ahead (its CancelTask and its resume keep their meaning).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from crosstalk.agent import Agent
from crosstalk.agent.lane import LOCK_AHEAD
from crosstalk.cli.send import frames
from crosstalk.core.ids import new_message_id
from crosstalk.core.states import MessageState
from crosstalk.harness.fake import FakeHarness, Step
from crosstalk.store.journal_read import read_journal
from crosstalk.store.registry import Registry
from tests.support.agents import fake_agent, running
from tests.support.waiting import eventually

pytestmark = pytest.mark.anyio
M = MessageState


@pytest.fixture
def env() -> dict[str, str]:
    return {"XDG_RUNTIME_DIR": tempfile.mkdtemp(prefix="ct-rt-", dir="/tmp")}


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    return Registry(tmp_path / "state")


@pytest.fixture
async def bob(registry: Registry, env: dict[str, str]) -> AsyncIterator[Agent]:
    async with running(fake_agent(registry.home, env, "sess-b", "bob")) as (agent,):
        yield agent


def fake(agent: Agent) -> FakeHarness:
    harness = agent.spec.harness
    assert isinstance(harness, FakeHarness)
    return harness


async def uds_send(agent: Agent, text: str, mid: str) -> dict[str, object]:
    """One shape-(a) frame, as ``crosstalk send`` writes it; the ack (or ``{}`` on a close)."""
    assert agent.uds is not None
    token = agent.uds.key_path.read_text().strip()
    reader, writer = await asyncio.open_unix_connection(str(agent.uds.path))
    try:
        writer.write(frames(token, text, mid))
        await writer.drain()
        writer.write_eof()
        line = await reader.readline()
        return json.loads(line) if line else {}
    finally:
        writer.close()


def journal_states(registry: Registry, agent_id: str, mid: str) -> list[str]:
    path = registry.home / "journal" / f"{agent_id}.jsonl"
    return [r["state"] for r in read_journal(path).records
            if r.get("id") == mid and r.get("subject") == "message"]


async def _queue_behind_a_parked_inject(bob: Agent, waiting: int,
                                        ) -> tuple[list[str], list[asyncio.Task[dict[str, object]]],
                                                   asyncio.Event]:
    """m0 parked in the harness, ``waiting`` more uds messages submitted behind it; then m0
    is let through and m1 parks at a gate that is returned (still closed)."""
    assert bob.receiver is not None
    first, second = asyncio.Event(), asyncio.Event()
    fake(bob).then(Step(gate=first), Step(gate=second))
    mids = [new_message_id() for _ in range(waiting + 1)]
    acks = [asyncio.create_task(uds_send(bob, "m0", mids[0]))]
    await asyncio.wait_for(fake(bob).parked.wait(), 10)
    for i, mid in enumerate(mids[1:], 1):
        acks.append(asyncio.create_task(uds_send(bob, f"m{i}", mid)))
    receiver = bob.receiver
    await eventually(lambda: all(
        mid in receiver.entries and receiver.entries[mid].pending is None
        for mid in mids[1:]), what="the waiting messages admitted")
    assert [receiver.entries[mid].state for mid in mids[1:]] == [M.SUBMITTED] * waiting
    first.set()
    assert (await asyncio.wait_for(acks[0], 10))["state"] == "accepted"
    await eventually(lambda: fake(bob).dequeued == 2 and fake(bob).parked.is_set(),
                     what="m1 parked in the harness")
    return mids, acks, second


async def test_waiting_uds_messages_are_locked_ahead_in_order(bob: Agent,
                                                              registry: Registry) -> None:
    waiting = LOCK_AHEAD + 2
    mids, acks, gate = await _queue_behind_a_parked_inject(bob, waiting)
    receiver = bob.receiver
    assert receiver is not None
    await eventually(lambda: receiver.entries[mids[1 + LOCK_AHEAD]].pending is None,
                     what="the locks ahead durable")
    states = [receiver.entries[mid].state for mid in mids[1:]]
    # m1 is being injected, the next LOCK_AHEAD are locked, the one after still waits.
    assert states == [M.DISPATCHING] * (1 + LOCK_AHEAD) + [M.SUBMITTED]
    for mid in mids[2:2 + LOCK_AHEAD]:
        assert journal_states(registry, bob.agent_id, mid) == ["submitted", "dispatching"]
    assert journal_states(registry, bob.agent_id, mids[-1]) == ["submitted"]
    assert fake(bob).texts() == ["m0"]  # a lock ahead is not an injection
    gate.set()
    results = await asyncio.wait_for(asyncio.gather(*acks), 20)
    assert [r["state"] for r in results] == ["accepted"] * (waiting + 1)
    assert fake(bob).texts() == [f"m{i}" for i in range(waiting + 1)]
    for mid in mids:
        assert journal_states(registry, bob.agent_id, mid) == [
            "submitted", "dispatching", "accepted"]


async def test_a_lock_ahead_whose_turn_never_came_is_unknown_after_a_stop(
        registry: Registry, env: dict[str, str]) -> None:
    bob = fake_agent(registry.home, env, "sess-b", "bob")
    await bob.start()
    waiting = LOCK_AHEAD + 2
    try:
        mids, acks, _never = await _queue_behind_a_parked_inject(bob, waiting)
        assert bob.receiver is not None
        await eventually(lambda: bob.receiver is not None and all(
            bob.receiver.entries[mid].pending is None for mid in mids[1:]),
            what="the locks ahead durable")
    finally:
        bob.lane.grace_seconds = 0.2  # m1 stays parked: its dispatch is cut short
        await bob.stop()
    await asyncio.gather(*acks, return_exceptions=True)
    ahead, behind = mids[2:2 + LOCK_AHEAD], mids[2 + LOCK_AHEAD:]
    for mid in [mids[1], *ahead]:
        assert journal_states(registry, bob.agent_id, mid) == [
            "submitted", "dispatching", "unknown"]
    for mid in behind:
        assert journal_states(registry, bob.agent_id, mid) == ["submitted"]
    async with running(fake_agent(registry.home, env, "sess-b", "bob")) as (again,):
        assert again.receiver is not None
        entries = again.receiver.entries
        assert [entries[mid].state for mid in ahead] == [M.UNKNOWN] * LOCK_AHEAD
        assert [entries[mid].state for mid in behind] == [M.RECOVERED] * len(behind)
        box = {e.message_id: e.state for e in again.receiver.mailbox()}
        for mid in [*ahead, *behind]:
            assert mid in box  # surfaced, not silently dropped
        assert fake(again).writes == []  # nothing is injected again after a restart


_KILLED_AGENT = textwrap.dedent("""
    import asyncio, json, sys
    from pathlib import Path
    from crosstalk.agent import Agent, AgentSpec
    from crosstalk.harness.fake import FakeHarness, Step
    from crosstalk.store.registry import Registry

    async def main() -> None:
        first, never = asyncio.Event(), asyncio.Event()
        harness = FakeHarness(name="fake")
        harness.then(Step(gate=first), Step(gate=never))  # m0 waits; m1 never returns
        agent = Agent(Registry(Path(sys.argv[1])), AgentSpec(harness, "sess-k", "/w", "kim"),
                      env={"XDG_RUNTIME_DIR": sys.argv[2]})
        await agent.start()
        assert agent.uds is not None and agent.receiver is not None
        print(json.dumps({"uds": str(agent.uds.path), "agent_id": agent.agent_id,
                          "key": agent.uds.key_path.read_text().strip()}), flush=True)
        entries = agent.receiver.entries
        while len(entries) < int(sys.argv[3]) or any(e.pending for e in entries.values()):
            await asyncio.sleep(0.005)
        first.set()  # every message admitted behind m0: m0 goes, m1 parks, locks go ahead
        await asyncio.Event().wait()

    asyncio.run(main())
""")


async def test_locks_ahead_survive_a_sigkill_as_unknown(registry: Registry,
                                                        env: dict[str, str]) -> None:
    """SIGKILL with locks written ahead: after the restart those messages are ``unknown``
    and the ones behind them ``recovered``; nothing acknowledged is lost, nothing injected."""
    waiting = LOCK_AHEAD + 2
    mids = [new_message_id() for _ in range(waiting + 1)]
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_AGENT, str(registry.home),
                             env["XDG_RUNTIME_DIR"], str(len(mids))], stdout=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    senders: list[asyncio.Task[None]] = []
    try:
        assert proc.stdout is not None
        info = json.loads(await asyncio.to_thread(proc.stdout.readline))
        kim = _Remote(info["uds"], info["key"])
        senders.append(asyncio.create_task(kim.send("m0", mids[0])))
        path = registry.home / "journal" / f"{info['agent_id']}.jsonl"

        def states() -> dict[str, list[str]]:
            seen: dict[str, list[str]] = {}
            for r in read_journal(path).records:
                if r.get("subject") == "message":
                    seen.setdefault(r["id"], []).append(r["state"])
            return seen
        await eventually(lambda: mids[0] in states(), what="m0 admitted")
        senders += [asyncio.create_task(kim.send(f"m{i}", mid))
                    for i, mid in enumerate(mids[1:], 1)]
        await eventually(lambda: sum(states().get(mid, [])[-1:] == ["dispatching"]
                                     for mid in mids) == 1 + LOCK_AHEAD,
                         what="m1 dispatching and the locks ahead durable")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    await asyncio.gather(*senders, return_exceptions=True)
    seen = states()
    assert seen[mids[0]] == ["submitted", "dispatching", "accepted"]
    # The lane's order is the order of admission (concurrent senders may be admitted in any
    # order): the first 1 + LOCK_AHEAD of them were locked, the rest were only submitted.
    admitted = [mid for mid in seen if mid in mids[1:]]  # journal order of first records
    assert sorted(admitted) == sorted(mids[1:])
    locked, behind = admitted[:1 + LOCK_AHEAD], admitted[1 + LOCK_AHEAD:]
    assert all(seen[mid] == ["submitted", "dispatching"] for mid in locked)
    assert all(seen[mid] == ["submitted"] for mid in behind)
    async with running(fake_agent(registry.home, env, "sess-k", "kim")) as (again,):
        assert again.receiver is not None
        entries = again.receiver.entries
        assert [entries[mid].state for mid in locked] == [M.UNKNOWN] * (1 + LOCK_AHEAD)
        assert [entries[mid].state for mid in behind] == (
            [M.RECOVERED] * (waiting - LOCK_AHEAD - 1))
        box = {e.message_id for e in again.receiver.mailbox()}
        assert set(mids[1:]) <= box  # surfaced, none silently dropped
        assert fake(again).writes == []


class _Remote:
    def __init__(self, uds: str, key: str) -> None:
        self.uds, self.key = uds, key

    async def send(self, text: str, mid: str) -> None:
        reader, writer = await asyncio.open_unix_connection(self.uds)
        try:
            writer.write(frames(self.key, text, mid))
            await writer.drain()
            writer.write_eof()
            await reader.readline()
        finally:
            writer.close()


async def test_an_a2a_message_is_never_locked_ahead(bob: Agent, registry: Registry,
                                                    env: dict[str, str]) -> None:
    """A2A messages waiting behind a parked inject stay ``submitted`` (cancelable) until
    their turn, and a uds message behind them is not locked past them."""
    async with running(fake_agent(registry.home, env, "sess-a", "alice")) as (alice,):
        assert bob.receiver is not None
        receiver = bob.receiver
        first, second = asyncio.Event(), asyncio.Event()
        fake(bob).then(Step(gate=first), Step(gate=second))
        m0 = new_message_id()
        ack0 = asyncio.create_task(uds_send(bob, "m0", m0))
        await asyncio.wait_for(fake(bob).parked.wait(), 10)
        sent = [await alice.send("bob", f"a{i}", return_immediately=True) for i in range(3)]
        m_uds = new_message_id()
        ack_uds = asyncio.create_task(uds_send(bob, "u", m_uds))
        await eventually(lambda: m_uds in receiver.entries
                         and receiver.entries[m_uds].pending is None, what="u admitted")
        first.set()
        assert (await asyncio.wait_for(ack0, 10))["state"] == "accepted"
        await eventually(lambda: fake(bob).dequeued == 2 and fake(bob).parked.is_set(),
                         what="a0 parked")
        await asyncio.sleep(0.05)  # time for a lock ahead to be written, were there one
        assert receiver.entries[sent[0].message_id].state is M.DISPATCHING
        assert [receiver.entries[s.message_id].state for s in sent[1:]] == [M.SUBMITTED] * 2
        assert receiver.entries[m_uds].state is M.SUBMITTED
        assert receiver.entries[sent[2].message_id].cancelable
        second.set()
        assert (await asyncio.wait_for(ack_uds, 10))["state"] == "accepted"
        assert fake(bob).texts() == ["m0", "a0", "a1", "a2", "u"]
