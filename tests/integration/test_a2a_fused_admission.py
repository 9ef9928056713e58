"""An A2A first message's admission, its task's first record and its dispatch lock share one
write (ADR 0046): one fsync stands between the request and the injection, not two, and a
failed write still accepts nothing and lets the sender's retry through (real agents, real
journal; the disk's failures from :class:`~tests.support.faulty_ops.FaultyOps`)."""

from __future__ import annotations

import asyncio
import errno
import json
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from crosstalk.agent import Agent
from crosstalk.core.ids import new_message_id
from crosstalk.core.states import MessageState
from crosstalk.harness.fake import FakeHarness, Step
from crosstalk.store.journal_read import read_journal
from tests.support.agents import fake_agent, running
from tests.support.faulty_ops import FaultyOps

pytestmark = pytest.mark.anyio


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[tuple[Agent, ...]]:
    env = {"XDG_RUNTIME_DIR": tempfile.mkdtemp(prefix="ct-rt-", dir="/tmp")}
    home = tmp_path / "state"
    async with running(fake_agent(home, env, "sess-a", "alice"),
                       fake_agent(home, env, "sess-b", "bob")) as agents:
        yield agents


def fake(agent: Agent) -> FakeHarness:
    harness = agent.spec.harness
    assert isinstance(harness, FakeHarness)
    return harness


def counting(agent: Agent) -> FaultyOps:
    """Count bob's journal syscalls from here on (nothing fails until a test says so)."""
    assert agent.journal is not None
    ops = FaultyOps(err=errno.ENOSPC)
    agent.journal._ops = ops
    return ops


async def test_a_first_message_is_admitted_tasked_and_locked_in_one_write(
        pair: tuple[Agent, ...]) -> None:
    alice, bob = pair
    await alice.send("bob", "warm-up")  # the card, the connection, the server stack
    assert bob.journal is not None
    await bob.journal.commit.idle()
    before = bob.journal.path.stat().st_size
    gate = asyncio.Event()
    fake(bob).then(Step(gate=gate))
    mid = new_message_id()
    sent = asyncio.create_task(alice.send("bob", "one write", message_id=mid))
    await asyncio.wait_for(fake(bob).parked.wait(), 10)
    # The message's first three records went in one write: every line of a write but its
    # last starts {"b": (docs/decisions/0001), and nothing else was written before them.
    # (The task's "working" record is staged lazy: it rides with the outcome's write, or is
    # written alone 2 ms on while the injection is parked here.)
    lines = bob.journal.path.read_bytes()[before:].splitlines()
    first = [json.loads(line) for line in lines[:3]]
    assert [(line[:5], rec["r"]["subject"], rec["r"]["state"])
            for line, rec in zip(lines, first, strict=False)] == [
        (b'{"b":', "message", "submitted"), (b'{"b":', "task", "submitted"),
        (b'{"c":', "message", "dispatching")]
    assert first[0]["r"]["id"] == first[2]["r"]["id"] == mid
    gate.set()
    assert (await asyncio.wait_for(sent, 10)).state == "accepted"
    assert fake(bob).texts() == ["warm-up", "one write"]


async def test_a_failed_fused_write_accepts_nothing_and_the_retry_is_delivered_once(
        pair: tuple[Agent, ...]) -> None:
    alice, bob = pair
    await alice.send("bob", "warm-up")
    assert bob.journal is not None
    assert bob.receiver is not None
    await bob.journal.commit.idle()
    ops = counting(bob)
    ops.fsync_broken = True  # the write that carries all three fails at its fsync
    mid = new_message_id()
    refused = await alice.send("bob", "disk full", message_id=mid)
    assert (refused.state, refused.reason) == ("unreachable", "journal_unavailable"), refused
    assert mid not in bob.receiver.entries
    assert bob.receiver.admission.pending_tasks == set()
    assert bob.lane.errors == {}  # the sender was answered; the lane has nothing to report
    ops.fsync_broken = False
    again = await alice.send("bob", "disk full", message_id=mid)
    assert again.state == "accepted", again
    assert fake(bob).texts() == ["warm-up", "disk full"]
    states = [r["state"] for r in read_journal(bob.journal.path).records
              if r.get("id") == mid and r.get("subject") == "message"]
    assert states == ["submitted", "dispatching", "accepted"]
    assert bob.receiver.entries[mid].state is MessageState.ACCEPTED
