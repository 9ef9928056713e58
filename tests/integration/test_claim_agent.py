"""Claims (seed §7) on in-process agents built from the real parts: registry, journal,
receiver, A2A server and client. The target's :meth:`Agent.apply_control` paths, including a
journal that refuses the claim record, and the A2A control hook's wire behaviour."""

from __future__ import annotations

import asyncio
import errno
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import A2ACardResolver
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import A2AError
from google.protobuf.json_format import MessageToDict

from crosstalk.a2a import client as a2a_client
from crosstalk.a2a import wire
from crosstalk.agent import Agent, AgentSpec
from crosstalk.core.message import Ingress, Sender
from crosstalk.core.policy import PRIMARY, SUBAGENT, ControlResult
from crosstalk.core.records import CLAIM
from crosstalk.core.states import MessageState
from crosstalk.harness.fake import FakeHarness, Step
from crosstalk.store.journal import Journal
from crosstalk.store.journal_read import read_journal
from crosstalk.store.registry import Registry
from tests.support.a2a import (
    make_node,
    registered_agent,
    sdk_client,
    send,
    serving,
    text_message,
)
from tests.support.faulty_ops import FaultyOps

pytestmark = pytest.mark.anyio


@pytest.fixture
def env() -> dict[str, str]:
    return {"XDG_RUNTIME_DIR": tempfile.mkdtemp(prefix="ct-rt-", dir="/tmp")}


@pytest.fixture
def reg(tmp_path: Path) -> Registry:
    return Registry(tmp_path / "state")


def new_agent(reg: Registry, env: dict[str, str], session: str, name: str) -> Agent:
    return Agent(reg, AgentSpec(FakeHarness(name="fake"), session, "/w/proj", name), env=env)


@pytest.fixture
async def trio(reg: Registry, env: dict[str, str]) -> AsyncIterator[tuple[Agent, Agent, Agent]]:
    """alice, bob and carol: three registered primaries."""
    agents = [new_agent(reg, env, f"sess-{n}", n) for n in ("alice", "bob", "carol")]
    for a in agents:
        await a.start()
    try:
        yield agents[0], agents[1], agents[2]
    finally:
        for a in agents:
            await a.stop()


def fake(agent: Agent) -> FakeHarness:
    h = agent.spec.harness
    assert isinstance(h, FakeHarness)
    return h


def claim_records(agent: Agent) -> list[dict[str, Any]]:
    return [r for r in agent.journal_records() if r.get("subject") == CLAIM]


def listed(reg: Registry, agent: Agent) -> tuple[str, str | None]:
    [d] = [d for d in reg.live() if d.agent_id == agent.agent_id]
    return d.role, d.owner


def as_sender(agent: Agent, role: str = PRIMARY) -> Sender:
    return Sender(agent_id=agent.agent_id, name=agent.name, role=role, ingress=Ingress.A2A)


# -- the round trip ----------------------------------------------------------------------


@pytest.mark.seed(28)
async def test_claim_is_journaled_published_and_told_to_the_session(
        trio: tuple[Agent, Agent, Agent], reg: Registry) -> None:
    alice, bob, _ = trio
    target, out = await alice.control_peer("bob", "claim")
    assert target is not None
    assert target.agent_id == bob.agent_id
    assert (out.ok, out.state, out.role, out.owner) == (True, "accepted", SUBAGENT,
                                                         alice.agent_id)
    assert out.notice == "accepted"
    assert bob.claim.owner == alice.agent_id
    assert listed(reg, bob) == (SUBAGENT, alice.agent_id)
    [rec] = claim_records(bob)
    assert (rec["owner"], rec["by"], rec["op"], rec["state"]) == (
        alice.agent_id, alice.agent_id, "claim", "claimed")
    assert rec["binding"]["session_ref"] == "sess-bob"
    # the session was told, by an inform from the shim itself (never the claim request)
    [written] = fake(bob).writes
    notice = written.delivery.message
    assert notice.sender.ingress is Ingress.LOCAL
    assert not notice.sender.verified
    assert notice.sender.label == "crosstalk"
    assert notice.kind.value == "inform"
    assert f"alice (agent {alice.agent_id}) has claimed this session" in written.text
    assert "control request" not in written.text
    # ... and journaled like any message: it is in bob's mailbox
    entry = bob.receiver.entries[notice.message_id] if bob.receiver else None
    assert entry is not None
    assert entry.state is MessageState.ACCEPTED
    # the claimer's own journal and session are untouched
    assert claim_records(alice) == []
    assert fake(alice).writes == []


@pytest.mark.seed(28)
async def test_policy_follows_the_claim_and_release(trio: tuple[Agent, Agent, Agent],
                                                    reg: Registry) -> None:
    alice, bob, carol = trio
    before = await carol.send("bob", "run the tests", kind="command")
    assert before.state == "accepted"  # a primary takes commands from any primary
    assert (await alice.control_peer("bob", "claim"))[1].ok
    owner_cmd = await alice.send("bob", "run the linters", kind="command")
    assert owner_cmd.state == "accepted"
    other_cmd = await carol.send("bob", "delete the branch", kind="command")
    assert (other_cmd.state, other_cmd.reason) == ("rejected", "command_owner_only")
    informed = await carol.send("bob", "fyi")
    assert informed.state == "accepted"  # inform and ask stay open to everyone
    assert "delete the branch" not in fake(bob).texts()
    # only the owner releases
    _, by_carol = await carol.control_peer("bob", "release")
    assert (by_carol.ok, by_carol.reason) == (False, "not_owner")
    assert listed(reg, bob) == (SUBAGENT, alice.agent_id)
    _, by_alice = await alice.control_peer("bob", "release")
    assert (by_alice.ok, by_alice.role, by_alice.owner) == (True, PRIMARY, None)
    assert listed(reg, bob) == (PRIMARY, None)
    assert "has released this session; it is a primary again" in fake(bob).texts()[-1]
    again = await carol.send("bob", "delete the branch", kind="command")
    assert again.state == "accepted"
    assert [r["op"] for r in claim_records(bob)] == ["claim", "release"]
    # releasing what nobody holds
    _, twice = await alice.control_peer("bob", "release")
    assert (twice.ok, twice.reason) == (False, "not_claimed")


@pytest.mark.seed(28)
async def test_claim_refusals(trio: tuple[Agent, Agent, Agent], reg: Registry) -> None:
    alice, bob, carol = trio
    # self: refused locally, no round trip and nothing journaled anywhere
    target, me = await alice.control_peer("alice", "claim")
    assert target is not None
    assert (me.ok, me.state, me.reason) == (False, "rejected", "cannot_claim_self")
    _, me_too = await alice.control_peer(alice.agent_id, "release")
    assert me_too.reason == "cannot_release_self"
    # ... and refused by the target too, should a request claim to come from itself
    direct = await alice.apply_control(as_sender(alice), "claim")
    assert (direct.ok, direct.reason) == (False, "cannot_claim_self")
    assert claim_records(alice) == []
    _, nobody = await alice.control_peer("nobody", "claim")
    assert (nobody.ok, nobody.reason) == (False, "no_such_agent")
    # already claimed, by anyone, including the owner itself (not re-entrant)
    assert (await alice.control_peer("bob", "claim"))[1].ok
    _, taken = await carol.control_peer("bob", "claim")
    assert (taken.ok, taken.reason, taken.owner) == (False, "already_claimed", alice.agent_id)
    _, reclaim = await alice.control_peer("bob", "claim")
    assert reclaim.reason == "already_claimed"
    # a subagent may not claim
    _, sub = await bob.control_peer("carol", "claim")
    assert (sub.ok, sub.reason) == (False, "claimer_not_primary")
    assert listed(reg, carol) == (PRIMARY, None)
    # an unverified sender (no agent id) never claims; an unknown operation is refused
    unverified = await carol.apply_control(Sender(agent_id=None, name="alice"), "claim")
    assert unverified.reason == "sender_unverified"
    bogus = await carol.apply_control(as_sender(alice), "shutdown")
    assert (bogus.ok, bogus.reason) == (False, "bad_control")
    assert claim_records(carol) == []
    assert len(claim_records(bob)) == 1
    assert len(fake(bob).writes) == 1  # one notice, for the one claim that happened


async def test_concurrent_claims_one_wins(trio: tuple[Agent, Agent, Agent]) -> None:
    alice, bob, carol = trio
    (_, a), (_, c) = await asyncio.gather(alice.control_peer("bob", "claim"),
                                          carol.control_peer("bob", "claim"))
    assert sorted([a.ok, c.ok]) == [False, True]
    loser = c if a.ok else a
    assert loser.reason == "already_claimed"
    [rec] = claim_records(bob)
    assert bob.claim.owner == rec["owner"] == (alice.agent_id if a.ok else carol.agent_id)


# -- the journal decides -------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["write", "fsync"])
async def test_a_claim_the_journal_refuses_changes_nothing(
        trio: tuple[Agent, Agent, Agent], reg: Registry, fault: str) -> None:
    alice, bob, _ = trio
    assert bob.journal is not None
    ops = (FaultyOps(fail_write={1}) if fault == "write" else FaultyOps(fail_fsync={1}))
    bob.journal._ops = ops
    result = await bob.apply_control(as_sender(alice), "claim")
    assert (result.ok, result.reason, result.failed) == (False, "journal_unavailable", True)
    assert (result.role, result.owner) == (PRIMARY, None)
    assert ops.raised == 1
    assert bob.claim.owner is None
    assert listed(reg, bob) == (PRIMARY, None)
    assert fake(bob).writes == []  # the session was told nothing
    assert claim_records(bob) == []
    assert read_journal(bob.journal.path).damage == []  # rolled back, not torn
    # the same over the wire: the target answers FAILED, the claimer sees the reason
    bob.journal._ops = FaultyOps(fail_write={1})
    _, out = await alice.control_peer("bob", "claim")
    assert (out.ok, out.state, out.reason) == (False, "accepted", "journal_unavailable")
    assert bob.claim.owner is None
    # once the journal works again the claim goes through
    bob.journal._ops = FaultyOps()
    _, ok = await alice.control_peer("bob", "claim")
    assert ok.ok
    assert [r["owner"] for r in claim_records(bob)] == [alice.agent_id]


async def test_a_refused_release_keeps_the_claim(trio: tuple[Agent, Agent, Agent],
                                                 reg: Registry) -> None:
    alice, bob, carol = trio
    assert (await alice.control_peer("bob", "claim"))[1].ok
    assert bob.journal is not None
    bob.journal._ops = FaultyOps(fail_write={1}, err=errno.ENOSPC)
    _, out = await alice.control_peer("bob", "release")
    assert (out.ok, out.reason) == (False, "journal_unavailable")
    assert listed(reg, bob) == (SUBAGENT, alice.agent_id)
    cmd = await carol.send("bob", "rm -rf", kind="command")
    assert cmd.state == "rejected"  # still owned: policy did not move either
    assert len(fake(bob).writes) == 1  # only the claim's notice


async def test_descriptor_or_notice_failure_does_not_undo_a_journaled_claim(
        trio: tuple[Agent, Agent, Agent], reg: Registry,
        monkeypatch: pytest.MonkeyPatch) -> None:
    alice, bob, carol = trio
    assert bob.registration is not None

    def refuse(*_: object) -> None:
        raise OSError(errno.ENOSPC, "no space")

    monkeypatch.setattr(bob.registration, "publish", refuse)
    fake(bob).then(Step(state=MessageState.UNREACHABLE, reason="gone", write=False))
    _, out = await alice.control_peer("bob", "claim")
    assert out.ok
    assert out.notice == "unreachable"
    assert bob.claim.owner == alice.agent_id  # the journal is the truth ...
    assert len(claim_records(bob)) == 1
    assert listed(reg, bob) == (PRIMARY, None)  # ... the descriptor is behind (logged)
    cmd = await carol.send("bob", "rm -rf", kind="command")
    assert (cmd.state, cmd.reason) == ("rejected", "command_owner_only")


# -- session lifetimes -----------------------------------------------------------------------


@pytest.mark.seed(28)
async def test_resume_of_the_same_session_keeps_the_claim(reg: Registry,
                                                          env: dict[str, str]) -> None:
    alice = new_agent(reg, env, "sess-alice", "alice")
    bob = new_agent(reg, env, "sess-bob", "bob")
    await alice.start()
    await bob.start()
    try:
        assert (await alice.control_peer("bob", "claim"))[1].ok
        await bob.stop()
        assert [d.name for d in reg.live()] == ["alice"]  # gone while its shim is down
        again = new_agent(reg, env, "sess-bob", "bob")
        await again.start()
        try:
            assert again.claim.owner == alice.agent_id
            assert listed(reg, again) == (SUBAGENT, alice.agent_id)
            assert (await alice.send("bob", "go", kind="command")).state == "accepted"
        finally:
            await again.stop()
        # a new session under the same name is a new agent: it starts primary
        fresh = new_agent(reg, env, "sess-bob-2", "bob")
        await fresh.start()
        try:
            assert fresh.agent_id != bob.agent_id
            assert listed(reg, fresh) == (PRIMARY, None)
        finally:
            await fresh.stop()
    finally:
        await alice.stop()


async def test_a_claim_journaled_under_another_binding_does_not_apply(
        reg: Registry, env: dict[str, str]) -> None:
    bob = new_agent(reg, env, "sess-bob", "bob")
    await bob.start()
    path = bob.journal.path if bob.journal else None
    await bob.stop()
    assert path is not None
    owner = "0123456789abcdef"
    with Journal(path) as j:
        j.append({"type": CLAIM, "subject": "claim", "id": bob.agent_id,
                  "state": "claimed", "owner": owner, "op": "claim",
                  "binding": {"harness": "fake", "session_ref": "another-session"}})
        j.append({"type": CLAIM, "subject": "claim", "id": bob.agent_id,
                  "state": "claimed", "owner": owner, "op": "claim"})  # no binding at all
    again = new_agent(reg, env, "sess-bob", "bob")
    await again.start()
    try:
        assert again.claim.owner is None
        assert listed(reg, again) == (PRIMARY, None)
    finally:
        await again.stop()
    # the same record under this session's binding does apply (the control for the above)
    with Journal(path) as j:
        j.append({"type": CLAIM, "subject": "claim", "id": bob.agent_id,
                  "state": "claimed", "owner": owner, "op": "claim",
                  "binding": {"harness": "fake", "session_ref": "sess-bob"}})
    third = new_agent(reg, env, "sess-bob", "bob")
    await third.start()
    try:
        assert third.claim.owner == owner
        assert listed(reg, third) == (SUBAGENT, owner)
    finally:
        await third.stop()


@pytest.mark.seed(28)
async def test_an_owner_that_is_gone_holds_nothing(reg: Registry, env: dict[str, str]) -> None:
    alice = new_agent(reg, env, "sess-alice", "alice")
    bob = new_agent(reg, env, "sess-bob", "bob")
    carol = new_agent(reg, env, "sess-carol", "carol")
    for a in (alice, bob, carol):
        await a.start()
    try:
        assert (await alice.control_peer("bob", "claim"))[1].ok
        assert (await carol.send("bob", "x", kind="command")).state == "rejected"
        await alice.stop()
        # the journaled claim stays, but to policy bob has no owner now
        assert bob.claim.owner == alice.agent_id
        assert bob.effective_claim().owner is None
        assert (await carol.send("bob", "x2", kind="command")).state == "accepted"
        # the owner's session comes back (same agent_id): the claim holds again
        back = new_agent(reg, env, "sess-alice", "alice")
        await back.start()
        try:
            assert back.agent_id == alice.agent_id
            assert bob.effective_claim().owner == alice.agent_id
            assert (await carol.send("bob", "x3", kind="command")).state == "rejected"
        finally:
            await back.stop()
        # gone again: another primary may claim, and the record names who it replaced
        _, out = await carol.control_peer("bob", "claim")
        assert (out.ok, out.owner) == (True, carol.agent_id)
        assert claim_records(bob)[-1]["previous"] == alice.agent_id
        assert listed(reg, bob) == (SUBAGENT, carol.agent_id)
    finally:
        for a in (bob, carol):
            await a.stop()


async def test_a_subagent_whose_owner_is_gone_claims_as_a_primary(
        reg: Registry, env: dict[str, str]) -> None:
    alice = new_agent(reg, env, "sess-alice", "alice")
    bob = new_agent(reg, env, "sess-bob", "bob")
    carol = new_agent(reg, env, "sess-carol", "carol")
    for a in (alice, bob, carol):
        await a.start()
    try:
        assert (await alice.control_peer("bob", "claim"))[1].ok
        assert (await bob.control_peer("carol", "claim"))[1].reason == "claimer_not_primary"
        await alice.stop()
        await asyncio.sleep(1.1)  # carol's server caches a sender's descriptor for 1 s
        _, out = await bob.control_peer("carol", "claim")
        assert (out.ok, out.owner) == (True, bob.agent_id)
    finally:
        for a in (bob, carol):
            await a.stop()


# -- the A2A control hook on the wire ---------------------------------------------------------


def reason(exc: A2AError) -> object:
    return exc.data.get(wire.ERROR_REASON) if isinstance(exc.data, dict) else None


async def card_extensions(url: str) -> list[str]:
    async with httpx.AsyncClient(timeout=10) as http:
        card = await A2ACardResolver(http, url).get_agent_card()
    return [e.uri for e in card.capabilities.extensions]


async def test_control_requests_on_the_wire(reg: Registry, tmp_path: Path) -> None:
    carol = registered_agent(reg, "carol")
    alice = registered_agent(reg, "alice")
    node = make_node(reg, carol, tmp_path / "carol.jsonl")
    seen: list[tuple[str | None, str]] = []

    async def handler(sender: Sender, op: str) -> ControlResult:
        seen.append((sender.agent_id, op))
        if op == "release":
            return ControlResult(False, "not_claimed", PRIMARY, None)
        return ControlResult(True, None, SUBAGENT, sender.agent_id, notice="accepted")

    async with serving(node), sdk_client(node.url, alice.token) as (client, ctx):
        # no handler: not advertised, and refused (our client would not even send it)
        assert await card_extensions(node.url) == []
        with pytest.raises(A2AError) as refused:
            await send(client, ctx, text_message("claim please", control="claim"))
        assert reason(refused.value) == "control_not_supported"
        out = await a2a_client.control(node.url, alice.token, "claim", text="x")
        assert (out.ok, out.state, out.reason) == (False, "rejected", "control_not_supported")

        node.server.claim_handler = handler
        assert await card_extensions(node.url) == [wire.CONTROL_EXTENSION]
        task = await send(client, ctx, text_message("claim please", control="claim"))
        assert task.status.state == pb.TASK_STATE_COMPLETED
        result = MessageToDict(task.metadata)[wire.CONTROL_RESULT]
        assert result == {"ok": True, "reason": None, "role": SUBAGENT,
                          "owner": alice.agent_id, "notice": "accepted"}
        assert seen == [(alice.agent_id, "claim")]  # identity from the bearer only
        task = await send(client, ctx, text_message("release", control="release"))
        assert task.status.state == pb.TASK_STATE_REJECTED
        assert MessageToDict(task.metadata)[wire.REASON] == "not_claimed"
        # malformed control requests are refused before the handler runs
        for bad in ({"control": "shutdown"}, {"control": "claim", "kind": "command"},
                    {"control": "claim", "deadline_seconds": 5}):
            with pytest.raises(A2AError) as err:
                await send(client, ctx, text_message("x", **bad))
            assert reason(err.value) == "bad_control", bad
        with pytest.raises(A2AError) as cont:
            await send(client, ctx, text_message("x", task_id="some-task", control="claim"))
        assert reason(cont.value) == "bad_control"
        assert len(seen) == 2
        # no control request ever reached the session or the journal as a message
        assert node.fake.writes == []
        assert node.receiver.entries == {}
        assert not [r for r in node.records() if r.get("subject") in ("message", "task")]
    # a wrong bearer never reaches the handler
    async with serving(node):
        out = await a2a_client.control(node.url, "not-a-token", "claim", text="x")
        assert (out.ok, out.state, out.reason) == (False, "rejected", "unauthorized")
    assert len(seen) == 2
