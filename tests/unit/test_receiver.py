"""The receiver chain (seed §5, §8, §13 R1/R2/R9/R10) against real journal files and FakeHarness.

Every test drives :class:`Receiver` through its public API, reads the journal back from disk
and counts what reached the fake session: "no injection" always means ``fake.writes`` did not
grow. Faults are injected through the journal's ``FileOps`` seam. Concurrency uses a gate in
the fake (a parked injection) so interleavings are forced, not hoped for.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from crosstalk.core.admission import Limits
from crosstalk.core.hops import hop_token
from crosstalk.core.message import DeliveryMode, Ingress, Kind, Message, Sender
from crosstalk.core.policy import PRIMARY, SUBAGENT, TargetRole
from crosstalk.core.states import AskEvent, AskState, IllegalTransition, MessageState
from crosstalk.harness.base import Binding, Outcome
from crosstalk.harness.fake import FakeHarness, Step
from crosstalk.receiver import (
    Inbound,
    Receiver,
    ReceiverUnavailable,
    Result,
    message_record,
)
from crosstalk.store.journal import Journal, JournalError
from crosstalk.store.journal_read import audit_journal, read_journal
from tests.support.faulty_ops import FaultyOps

M = MessageState

AGENT_ID = "ab" * 8
BINDING = Binding(harness="fake", session_ref="session-1", endpoint="endpoint-1",
                  instance_id="instance-1")
ALICE = Sender(agent_id="a1" * 8, name="alice", role=PRIMARY, ingress=Ingress.A2A)
BOB = Sender(agent_id="b0" * 8, name="bob", role=PRIMARY, ingress=Ingress.A2A)
SUB = Sender(agent_id="5b" * 8, name="sub", role=SUBAGENT, ingress=Ingress.A2A)
ALICE_UDS = replace(ALICE, ingress=Ingress.UDS, peer_pid=4242)  # alice, verified on the uds
STRANGER = Sender(agent_id=None, ingress=Ingress.UDS, peer_pid=9999)  # unverified uds peer

OUTCOME_STATES = {M.ACCEPTED, M.QUEUED, M.UNREACHABLE, M.UNKNOWN}


# -- helpers -------------------------------------------------------------------------------------


class Rig:
    """One agent: a journal file, a fake session and the receiver between them.

    ``restart`` is a shim crash and restart: the journal object and receiver are dropped
    without any cleanup, a new pair is built on the same file, and ``restore`` runs on the
    replayed records. The fake session outlives the shim, as a Claude/Codex session does.
    """

    def __init__(self, path: Path, *, limits: Limits | None = None,
                 binding: Binding | None = BINDING, ops: FaultyOps | None = None,
                 target: TargetRole | None = None, max_line: int | None = None) -> None:
        self.path = path
        self.fake = FakeHarness()
        self.target = target or TargetRole()
        self.limits = limits or Limits()
        self.journals: list[Journal] = []
        self.journal, self.receiver = self._build(binding, ops, max_line)
        self.now = 1_000.0

    def _build(self, binding: Binding | None, ops: FaultyOps | None,
               max_line: int | None) -> tuple[Journal, Receiver]:
        kwargs: dict[str, Any] = {"ops": ops}
        if max_line is not None:
            kwargs["max_line"] = max_line
        journal = Journal(self.path, **kwargs)
        self.journals.append(journal)
        receiver = Receiver(AGENT_ID, journal, self.fake, binding, self.limits,
                            reply_address="/tmp/s/me.sock", target_role=lambda: self.target,
                            clock=lambda: self.now)
        return journal, receiver

    def restart(self, *, binding: Binding | None = BINDING, ops: FaultyOps | None = None,
                limits: Limits | None = None) -> list[Inbound]:
        if limits is not None:
            self.limits = limits
        self.journal, self.receiver = self._build(binding, ops, None)
        return self.receiver.restore(self.journal.replay().records)

    def close(self) -> None:
        for j in self.journals:
            j.close()

    # what is on disk / in the session

    def records(self, mid: str, subject: str = "message") -> list[dict[str, Any]]:
        return [r for r in read_journal(self.path).records
                if r.get("subject") == subject and r.get("id") == mid]

    def states(self, mid: str) -> list[str]:
        return [r["state"] for r in self.records(mid)]

    def written(self, mid: str | None = None) -> int:
        ids = [w.delivery.message.message_id for w in self.fake.writes]
        return len(ids) if mid is None else ids.count(mid)


@pytest.fixture
def make_rig(tmp_path: Path) -> Iterator[Callable[..., Rig]]:
    rigs: list[Rig] = []

    def make(**kwargs: Any) -> Rig:
        rig = Rig(tmp_path / f"agent-{len(rigs)}.jsonl", **kwargs)
        rigs.append(rig)
        return rig

    yield make
    for rig in rigs:
        rig.close()


@pytest.fixture
def rig(make_rig: Callable[..., Rig]) -> Rig:
    return make_rig()


def msg(mid: str, sender: Sender = ALICE, text: str = "hello", kind: Kind = Kind.INFORM,
        **kwargs: Any) -> Message:
    return Message(message_id=mid, sender=sender, text=text, kind=kind, **kwargs)


async def settle(rig: Rig, predicate: Callable[[], bool], rounds: int = 200) -> None:
    """Yield to the loop, and let the journal's staged writes finish, until ``predicate``
    holds (tasks run in a fixed order and writes end when they end: no timing)."""
    for _ in range(rounds):
        if predicate():
            return
        await asyncio.sleep(0)
        await rig.receiver.journal.commit.idle()
    raise AssertionError("condition never reached")


# -- seed 6: duplicate delivery -----------------------------------------------------------------


@pytest.mark.seed(6)
@pytest.mark.anyio
async def test_duplicate_sequential_returns_prior_state(rig: Rig) -> None:
    first = await rig.receiver.receive(msg("m1"))
    assert first == Result("m1", M.ACCEPTED, None, False, "fake-ok")
    again = await rig.receiver.receive(msg("m1", text="different text, same id"))
    assert again == Result("m1", M.ACCEPTED, None, True, "fake-ok")
    assert rig.written("m1") == 1
    assert rig.states("m1") == ["submitted", "dispatching", "accepted"], "the retry wrote nothing"


@pytest.mark.seed(6)
@pytest.mark.anyio
async def test_duplicate_of_every_final_state_is_returned_unchanged(rig: Rig) -> None:
    rig.fake.then(Step(state=M.QUEUED), Step(state=M.UNREACHABLE, write=False),
                  Step(error=ConnectionResetError()))
    finals = [await rig.receiver.receive(msg(f"m{i}")) for i in range(3)]
    finals.append(await rig.receiver.receive(msg("m3", kind=Kind.COMMAND, sender=SUB)))
    assert [r.state for r in finals] == [M.QUEUED, M.UNREACHABLE, M.UNKNOWN, M.REJECTED]
    writes = rig.written()
    for i, prior in enumerate(finals):
        sender = SUB if i == 3 else ALICE
        again = await rig.receiver.receive(msg(f"m{i}", sender=sender))
        assert again == replace(prior, duplicate=True)
    assert rig.written() == writes == 2


@pytest.mark.seed(6)
@pytest.mark.anyio
async def test_concurrent_duplicates_inject_once(rig: Rig) -> None:
    gate = asyncio.Event()
    rig.fake.then(Step(gate=gate))
    results: list[Result] = []

    async def send() -> None:
        results.append(await rig.receiver.receive(msg("m1")))

    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(send)
        await settle(rig, lambda: len(results) == 4)  # four duplicates answered while one is parked
        assert rig.fake.parked.is_set()
        assert rig.written() == 0
        gate.set()
    assert sorted(r.duplicate for r in results) == [False, True, True, True, True]
    assert [r.state for r in results if not r.duplicate] == [M.ACCEPTED]
    assert all(r.state in (M.SUBMITTED, M.DISPATCHING) for r in results if r.duplicate)
    assert rig.written("m1") == 1
    assert rig.fake.dequeued == 1
    assert rig.states("m1") == ["submitted", "dispatching", "accepted"]


@pytest.mark.seed(6)
@pytest.mark.anyio
async def test_other_sender_reusing_an_id_is_a_conflict(rig: Rig) -> None:
    assert (await rig.receiver.receive(msg("m1"))).state is M.ACCEPTED
    for other in (BOB, STRANGER, replace(STRANGER, ingress=Ingress.A2A)):
        res = await rig.receiver.receive(msg("m1", sender=other, text="hijack"))
        assert res == Result("m1", M.REJECTED, "message_id_conflict")
    assert rig.written() == 1
    assert rig.fake.texts() == ["hello"]
    assert rig.receiver.entries["m1"].sender == ALICE
    assert rig.states("m1") == ["submitted", "dispatching", "accepted"]
    # the owner of the id still gets its own state back
    assert (await rig.receiver.receive(msg("m1"))).duplicate


@pytest.mark.seed(6)
@pytest.mark.anyio
async def test_native_messages_are_exempt_from_dedupe(rig: Rig) -> None:
    for mid in ("n-1", "n-2"):
        res = await rig.receiver.receive(msg(mid, sender=STRANGER, text="same text", native=True))
        assert res.state is M.ACCEPTED
        assert not res.duplicate
    assert rig.fake.texts() == ["same text", "same text"]
    # a native frame whose (fresh) id somehow collides is never answered with another state
    res = await rig.receiver.receive(msg("n-1", sender=STRANGER, text="x", native=True))
    assert res == Result("n-1", M.REJECTED, "message_id_conflict")
    assert rig.written() == 2


@pytest.mark.seed(6)
@pytest.mark.anyio
async def test_unverified_uds_sender_is_accepted_and_never_wakes(rig: Rig) -> None:
    res = await rig.receiver.receive(msg("n-1", sender=STRANGER, native=True))
    assert res.state is M.ACCEPTED
    (written,) = rig.fake.writes
    assert written.delivery.wake is False, "an unverified sender never starts a turn (CQ3)"
    assert written.delivery.reply_address == "/tmp/s/me.sock"
    assert written.binding == BINDING
    rec = rig.records("n-1")[0]
    assert rec["sender"]["key"] == "unverified"
    assert rec["binding"] == BINDING.as_record()


# -- seed 7: hop chain, A2A only -----------------------------------------------------------------


def chain(n: int) -> tuple[str, ...]:
    return tuple(hop_token(f"peer-{i}") for i in range(n))


@pytest.mark.seed(7)
@pytest.mark.anyio
async def test_hop_chain_with_own_token_is_rejected(rig: Rig) -> None:
    own = rig.receiver.hop_token
    assert own == hop_token(AGENT_ID)
    res = await rig.receiver.receive(msg("m1", hop_chain=(*chain(2), own)))
    assert res == Result("m1", M.REJECTED, "hop_chain_loop")
    assert rig.states("m1") == ["rejected"], "the rejection is journaled"
    assert rig.records("m1")[0]["reason"] == "hop_chain_loop"
    retry = await rig.receiver.receive(msg("m1", hop_chain=(*chain(2), own)))
    assert retry == Result("m1", M.REJECTED, "hop_chain_loop", duplicate=True)
    assert rig.written() == 0


@pytest.mark.seed(7)
@pytest.mark.anyio
async def test_hop_chain_length(rig: Rig) -> None:
    assert (await rig.receiver.receive(msg("m33", hop_chain=chain(33)))) == Result(
        "m33", M.REJECTED, "hop_chain_too_long")
    assert (await rig.receiver.receive(msg("m32", hop_chain=chain(32)))).state is M.ACCEPTED
    repeat = (*chain(3), chain(3)[0])
    assert (await rig.receiver.receive(msg("mrep", hop_chain=repeat))).reason == "hop_chain_loop"
    assert (await rig.receiver.receive(msg("mbad", hop_chain=("XYZ",)))).reason == (
        "hop_chain_malformed")
    assert rig.written() == 1
    assert rig.states("m33") == ["rejected"]


@pytest.mark.seed(7)
@pytest.mark.anyio
async def test_native_frames_are_not_hop_checked(rig: Rig) -> None:
    own = rig.receiver.hop_token
    native = msg("n-1", sender=STRANGER, native=True, hop_chain=(own, own, *chain(40)))
    assert (await rig.receiver.receive(native)).state is M.ACCEPTED
    verified_uds = msg("u-1", sender=ALICE_UDS, hop_chain=(own, *chain(40)))
    assert (await rig.receiver.receive(verified_uds)).state is M.ACCEPTED
    assert rig.written() == 2


# -- seed 8: policy ------------------------------------------------------------------------------


@pytest.mark.seed(8)
@pytest.mark.anyio
async def test_non_owner_command_to_subagent_is_rejected(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig(target=TargetRole(SUBAGENT, owner=ALICE.agent_id))
    res = await rig.receiver.receive(msg("c-bob", sender=BOB, kind=Kind.COMMAND, text="rm -rf"))
    assert res == Result("c-bob", M.REJECTED, "command_owner_only")
    assert rig.written() == 0
    assert rig.states("c-bob") == ["rejected"]
    assert (await rig.receiver.receive(msg("c-alice", kind=Kind.COMMAND))).state is M.ACCEPTED
    # the non-owner keeps inform and ask (ask has inform's permissions only)
    assert (await rig.receiver.receive(msg("i-bob", sender=BOB))).state is M.ACCEPTED
    assert (await rig.receiver.receive(msg("a-bob", sender=BOB, kind=Kind.ASK))).state is (
        M.ACCEPTED)
    assert [w.delivery.message.message_id for w in rig.fake.writes] == [
        "c-alice", "i-bob", "a-bob"]
    # the role is read at the moment of the check: after release bob is a primary like any
    rig.target = TargetRole()
    assert (await rig.receiver.receive(msg("c-bob2", sender=BOB, kind=Kind.COMMAND))).state is (
        M.ACCEPTED)


@pytest.mark.seed(8)
@pytest.mark.anyio
async def test_uds_kinds_and_unverified_asks_are_rejected(rig: Rig) -> None:
    for mid, sender, kind, reason in [
        ("u-cmd", ALICE_UDS, Kind.COMMAND, "uds_inform_only"),
        ("u-ask", ALICE_UDS, Kind.ASK, "uds_inform_only"),
        ("x-cmd", STRANGER, Kind.COMMAND, "uds_inform_only"),
        ("a-ask", replace(STRANGER, ingress=Ingress.A2A), Kind.ASK, "sender_unverified"),
        ("s-cmd", SUB, Kind.COMMAND, "command_primary_only"),
    ]:
        assert (await rig.receiver.receive(msg(mid, sender=sender, kind=kind))) == Result(
            mid, M.REJECTED, reason)
    assert rig.written() == 0


# -- seed 16: injector failure branches ------------------------------------------------------------


@pytest.mark.seed(16)
@pytest.mark.anyio
async def test_idle_to_active_race_is_accepted_once(rig: Rig) -> None:
    rig.fake.then(Step(state=M.ACCEPTED, evidence="joined-active-turn"))
    res = await rig.receiver.receive(msg("m1"))
    assert res == Result("m1", M.ACCEPTED, None, False, "joined-active-turn")
    assert rig.written() == 1
    assert rig.records("m1")[-1]["evidence"] == "joined-active-turn"
    assert rig.receiver.entries["m1"].evidence == "joined-active-turn"


@pytest.mark.seed(16)
@pytest.mark.anyio
async def test_refusal_then_no_wake_append_is_queued_once(rig: Rig) -> None:
    rig.fake.then(Step(state=M.QUEUED, reason="appended_after_refusal", evidence="inject_items"))
    res = await rig.receiver.receive(msg("m1"))
    assert (res.state, res.reason) == (M.QUEUED, "appended_after_refusal")
    assert rig.written() == 1
    assert rig.states("m1")[-1] == "queued"
    assert rig.records("m1")[-1]["reason"] == "appended_after_refusal"


@pytest.mark.seed(16)
@pytest.mark.anyio
@pytest.mark.parametrize("malformed", [object(), None.__class__, {"state": "accepted"}, "ok"])
async def test_malformed_success_is_unknown(rig: Rig, malformed: object) -> None:
    rig.fake.then(Step(malformed=malformed))
    res = await rig.receiver.receive(msg("m1"))
    assert (res.state, res.reason) == (M.UNKNOWN, "malformed_harness_result")
    assert rig.states("m1")[-1] == "unknown"
    retry = await rig.receiver.receive(msg("m1"))
    assert (retry.state, retry.duplicate) == (M.UNKNOWN, True)
    assert rig.written() == 1


@pytest.mark.seed(16)
@pytest.mark.anyio
async def test_definite_refusal_is_unreachable(rig: Rig) -> None:
    rig.fake.then(Step(state=M.UNREACHABLE, reason="thread_not_loaded", write=False))
    res = await rig.receiver.receive(msg("m1"))
    assert (res.state, res.reason) == (M.UNREACHABLE, "thread_not_loaded")
    assert rig.written() == 0
    assert rig.states("m1") == ["submitted", "dispatching", "unreachable"]


@pytest.mark.seed(16)
@pytest.mark.anyio
async def test_disconnect_after_acceptance_is_unknown_and_never_resent(rig: Rig) -> None:
    rig.fake.then(Step(error=ConnectionResetError()))
    res = await rig.receiver.receive(msg("m1"))
    assert res.state is M.UNKNOWN
    assert res.reason == "inject_error: ConnectionResetError"
    assert rig.written() == 1
    retry = await rig.receiver.receive(msg("m1"))
    assert (retry.state, retry.duplicate) == (M.UNKNOWN, True)
    assert rig.written() == 1
    # a restart does not re-inject it either
    assert rig.restart() == []
    assert rig.receiver.entries["m1"].state is M.UNKNOWN
    again = await rig.receiver.receive(msg("m1"))
    assert (again.state, again.duplicate) == (M.UNKNOWN, True)
    assert rig.written() == 1
    # "reconnect": the session is reachable again; new work flows, the old one is not redone
    assert (await rig.receiver.receive(msg("m2"))).state is M.ACCEPTED
    assert [w.delivery.message.message_id for w in rig.fake.writes] == ["m1", "m2"]


@pytest.mark.seed(16)
@pytest.mark.anyio
async def test_error_before_write_is_still_unknown(rig: Rig) -> None:
    # The receiver cannot tell whether bytes left: any raise after the claim is ambiguous.
    rig.fake.then(Step(write=False, error=BrokenPipeError()))
    res = await rig.receiver.receive(msg("m1"))
    assert res.state is M.UNKNOWN
    assert rig.written() == 0
    assert (await rig.receiver.receive(msg("m1"))).duplicate


@pytest.mark.seed(16)
@pytest.mark.anyio
async def test_concurrent_duplicate_on_both_ingresses_injects_once(rig: Rig) -> None:
    gate = asyncio.Event()
    rig.fake.then(Step(gate=gate))
    results: dict[Ingress, Result] = {}

    async def send(sender: Sender) -> None:
        results[sender.ingress] = await rig.receiver.receive(msg("m1", sender=sender))

    async with anyio.create_task_group() as tg:
        tg.start_soon(send, ALICE)
        tg.start_soon(send, ALICE_UDS)
        await settle(rig, lambda: len(results) == 1 and rig.fake.parked.is_set())
        gate.set()
    assert results[Ingress.A2A].state is M.ACCEPTED
    assert results[Ingress.UDS].duplicate
    assert rig.written() == 1
    assert rig.fake.dequeued == 1


@pytest.mark.seed(16)
@pytest.mark.anyio
async def test_cancelled_dispatch_is_unknown(rig: Rig) -> None:
    gate = asyncio.Event()
    rig.fake.then(Step(gate=gate))
    async with anyio.create_task_group() as tg:
        tg.start_soon(rig.receiver.receive, msg("m1"))
        await settle(rig, rig.fake.parked.is_set)
        tg.cancel_scope.cancel()
    entry = rig.receiver.entries["m1"]
    assert (entry.state, entry.reason) == (M.UNKNOWN, "dispatch_cancelled")
    assert rig.states("m1") == ["submitted", "dispatching", "unknown"]
    assert rig.restart() == []
    assert (await rig.receiver.receive(msg("m1"))).state is M.UNKNOWN
    assert rig.written() == 0


# -- seed 20: restart dedupe and R2 ---------------------------------------------------------------


@pytest.mark.seed(20)
@pytest.mark.anyio
async def test_restart_dedupe(rig: Rig) -> None:
    rig.fake.then(Step(), Step(state=M.QUEUED), Step(state=M.UNREACHABLE, write=False))
    before = [await rig.receiver.receive(msg(f"m{i}")) for i in range(3)]
    assert await rig.receiver.receive(msg("r", sender=SUB, kind=Kind.COMMAND)) == Result(
        "r", M.REJECTED, "command_primary_only")
    writes = rig.written()
    assert rig.restart() == []
    for prior in before:
        again = await rig.receiver.receive(msg(prior.message_id))
        assert again == replace(prior, duplicate=True)
    assert (await rig.receiver.receive(msg("r", sender=SUB, kind=Kind.COMMAND))).state is (
        M.REJECTED)
    assert (await rig.receiver.receive(msg("m0", sender=BOB))).reason == "message_id_conflict"
    assert rig.written() == writes == 2


@pytest.mark.seed(20)
@pytest.mark.anyio
async def test_partial_trailing_line_replays_without_it(rig: Rig) -> None:
    assert (await rig.receiver.receive(msg("m1"))).state is M.ACCEPTED
    await rig.receiver.admit(msg("m2"))
    data = rig.path.read_bytes()
    last = data.rstrip(b"\n").rsplit(b"\n", 1)[1]
    rig.path.write_bytes(data[: len(data) - len(last) // 2 - 1])  # m2's record, torn
    assert rig.restart() == [], "the torn submitted record was never acknowledged"
    assert "m2" not in rig.receiver.entries
    assert rig.receiver.entries["m1"].state is M.ACCEPTED
    assert (await rig.receiver.receive(msg("m2"))).state is M.ACCEPTED, "a retry is new work"
    assert rig.written() == 2
    assert rig.states("m2") == ["submitted", "dispatching", "accepted"]


@pytest.mark.seed(20)
@pytest.mark.anyio
async def test_unresolved_dispatch_becomes_unknown_never_reinjected(rig: Rig) -> None:
    entry = await rig.receiver.admit(msg("m1"))
    assert isinstance(entry, Inbound)
    rig.journal.append({"subject": "message", "id": "m1", "state": "dispatching",
                        "reason": None})  # the claim, then the crash
    assert rig.restart() == []
    restored = rig.receiver.entries["m1"]
    assert (restored.state, restored.reason) == (M.UNKNOWN, "interrupted_during_dispatch")
    assert restored.message is None
    assert rig.states("m1") == ["submitted", "dispatching", "unknown"]
    assert (await rig.receiver.receive(msg("m1"))).state is M.UNKNOWN
    assert await rig.receiver.dispatch(restored) == restored.result()
    assert rig.written() == 0
    assert rig.restart() == [], "a second restart changes nothing"
    assert rig.states("m1") == ["submitted", "dispatching", "unknown"]


@pytest.mark.seed(20)
@pytest.mark.anyio
async def test_uds_submitted_passing_recheck_is_recovered(rig: Rig) -> None:
    for mid, sender in (("n-1", STRANGER), ("u-1", ALICE_UDS)):
        assert isinstance(await rig.receiver.admit(msg(mid, sender=sender, native=mid[0] == "n")),
                          Inbound)
    assert rig.restart() == [], "uds messages are never resumed"
    for mid in ("n-1", "u-1"):
        entry = rig.receiver.entries[mid]
        assert entry.state is M.RECOVERED
        assert rig.states(mid) == ["submitted", "recovered"]
        retry = await rig.receiver.receive(msg(mid, sender=entry.sender))
        assert retry.state is M.RECOVERED
    assert rig.written() == 0


@pytest.mark.seed(20)
@pytest.mark.anyio
async def test_uds_submitted_failing_recheck_is_rejected(rig: Rig) -> None:
    big = "x" * 100
    assert isinstance(await rig.receiver.admit(msg("n-big", sender=STRANGER, text=big,
                                                   native=True)),
                      Inbound)
    # a uds command can only be in the journal if an older build (or another writer) put it
    # there; it is written directly, the way it would be found
    rig.journal.append(message_record(msg("u-cmd", sender=ALICE_UDS, kind=Kind.COMMAND),
                                      BINDING))
    unreadable = message_record(msg("u-bad", sender=ALICE_UDS), BINDING)
    del unreadable["text"]
    rig.journal.append(unreadable)
    assert rig.restart(limits=Limits(max_text_bytes=50)) == []
    for mid in ("n-big", "u-cmd", "u-bad"):
        assert rig.receiver.entries[mid].state is M.REJECTED, mid
        assert rig.states(mid) == ["submitted", "rejected"]
    assert rig.written() == 0


@pytest.mark.seed(20)
@pytest.mark.anyio
async def test_a2a_first_message_is_resumed_once(rig: Rig) -> None:
    assert isinstance(await rig.receiver.admit(msg("t-1", task_id="task-1")), Inbound)
    resumable = rig.restart()
    assert [e.message_id for e in resumable] == ["t-1"]
    assert rig.receiver.entries["t-1"].state is M.SUBMITTED
    assert rig.written() == 0, "restore itself never injects"
    results = await asyncio.gather(rig.receiver.resume(resumable[0]),
                                   rig.receiver.resume(resumable[0]))
    assert sorted(r.state for r in results) == [M.ACCEPTED, M.ACCEPTED]
    assert rig.written("t-1") == 1
    assert (await rig.receiver.resume(resumable[0])).state is M.ACCEPTED
    assert rig.written("t-1") == 1
    assert rig.restart() == []
    assert rig.states("t-1") == ["submitted", "dispatching", "accepted"]


@pytest.mark.seed(20)
@pytest.mark.anyio
async def test_resume_rechecks_policy(rig: Rig) -> None:
    assert isinstance(await rig.receiver.admit(msg("c-1", sender=BOB, kind=Kind.COMMAND)), Inbound)
    rig.target = TargetRole(SUBAGENT, owner=ALICE.agent_id)  # claimed by alice meanwhile
    (entry,) = rig.restart()
    res = await rig.receiver.resume(entry)
    assert res == Result("c-1", M.REJECTED, "command_owner_only")
    assert rig.states("c-1") == ["submitted", "rejected"]
    assert rig.written() == 0


@pytest.mark.seed(20)
@pytest.mark.anyio
async def test_a2a_continuation_stays_submitted(rig: Rig) -> None:
    admitted = await rig.receiver.admit(msg("k-1", task_id="task-1", continuation=True))
    assert isinstance(admitted, Inbound)
    assert rig.restart() == []
    entry = rig.receiver.entries["k-1"]
    assert entry.state is M.SUBMITTED
    assert entry.continuation
    assert rig.states("k-1") == ["submitted"]
    assert rig.written() == 0


@pytest.mark.seed(20)
@pytest.mark.anyio
@pytest.mark.parametrize("other", [replace(BINDING, session_ref="session-2"),
                                   replace(BINDING, endpoint="endpoint-2")],
                         ids=["other-session", "other-endpoint"])
async def test_records_bound_to_another_conversation_are_unreachable(
        rig: Rig, other: Binding) -> None:
    await rig.receiver.admit(msg("t-1", task_id="task-1"))
    await rig.receiver.admit(msg("k-1", task_id="task-1", continuation=True))
    await rig.receiver.admit(msg("n-1", sender=STRANGER, native=True))
    await rig.receiver.admit(msg("n-big", sender=STRANGER, native=True, text="y" * 100))
    assert rig.restart(binding=other, limits=Limits(max_text_bytes=50)) == []
    expected = {"t-1": M.UNREACHABLE, "k-1": M.UNREACHABLE, "n-1": M.UNREACHABLE,
                "n-big": M.REJECTED}
    assert {m: rig.receiver.entries[m].state for m in expected} == expected
    assert rig.receiver.entries["t-1"].reason == "bound_to_another_conversation"
    assert all(rig.receiver.entries[m].message is None for m in expected)
    for mid, state in expected.items():
        assert rig.states(mid) == ["submitted", state.value]
    assert rig.written() == 0
    # the new conversation still receives new work
    assert (await rig.receiver.receive(msg("fresh"))).state is M.ACCEPTED


# -- seed 25: admission ----------------------------------------------------------------------------


@pytest.mark.seed(25)
@pytest.mark.anyio
async def test_open_ask_limit_rejects_before_acceptance(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig(limits=Limits(max_open_asks=2))
    gates = [asyncio.Event(), asyncio.Event(), asyncio.Event()]
    rig.fake.then(Step(), *(Step(gate=g) for g in gates))
    assert (await rig.receiver.receive(msg("i-0"))).state is M.ACCEPTED
    results: dict[str, Result] = {}

    async def send(m: Message) -> None:
        results[m.message_id] = await rig.receiver.receive(m)

    async with anyio.create_task_group() as tg:
        tg.start_soon(send, msg("a-1", kind=Kind.ASK))
        tg.start_soon(send, msg("a-2", sender=BOB, kind=Kind.ASK))
        await settle(rig, lambda: rig.fake.dequeued == 3)  # both asks parked in the harness
        for mid in ("a-3", "a-4"):
            res = await rig.receiver.receive(msg(mid, kind=Kind.ASK))
            assert res == Result(mid, M.REJECTED, "too_many_open_asks")
            assert rig.records(mid) == [], "nothing journaled, nothing evicted"
        # other kinds are not held back by the ask limit
        tg.start_soon(send, msg("i-1"))
        await settle(rig, lambda: rig.fake.dequeued == 4)
        for g in gates:
            g.set()
    assert {m: r.state for m, r in results.items()} == {
        "a-1": M.ACCEPTED, "a-2": M.ACCEPTED, "i-1": M.ACCEPTED}
    # both asks are open now and still hold their slots
    assert (await rig.receiver.receive(msg("a-5", kind=Kind.ASK))).reason == "too_many_open_asks"
    for mid in ("i-0", "a-1", "a-2", "i-1"):
        assert rig.states(mid)[-1] == "accepted"
        assert rig.receiver.entries[mid].state is M.ACCEPTED
        assert (await rig.receiver.receive(msg(mid, sender=rig.receiver.entries[mid].sender))
                ).duplicate
    assert rig.written() == 4
    replayed = {(r["id"], r["state"]) for r in rig.journal.replay().records
                if r.get("subject") == "message"}
    assert {(m, "accepted") for m in ("i-0", "a-1", "a-2", "i-1")} <= replayed
    assert not {m for m, _ in replayed} & {"a-3", "a-4", "a-5"}
    # answering one frees a slot; the rejected id may then be retried and passes
    rig.receiver.close_ask("a-1", AskState.ANSWERED, "42")
    assert (await rig.receiver.receive(msg("a-3", kind=Kind.ASK))).state is M.ACCEPTED


@pytest.mark.seed(25)
@pytest.mark.anyio
async def test_size_limit(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig(limits=Limits(max_text_bytes=10))
    assert (await rig.receiver.receive(msg("ok", text="x" * 10))).state is M.ACCEPTED
    assert await rig.receiver.receive(msg("big", text="x" * 11)) == Result(
        "big", M.REJECTED, "message_too_large")
    # bytes, not characters
    assert (await rig.receiver.receive(msg("wide", text="é" * 6))).reason == "message_too_large"
    assert (await rig.receiver.receive(msg("n", sender=STRANGER, native=True, text="y" * 11))
            ).reason == "message_too_large"
    assert rig.states("big") == ["rejected"]
    assert rig.written() == 1


@pytest.mark.seed(25)
@pytest.mark.anyio
async def test_record_over_the_journal_line_cap_is_rejected_not_unavailable(
        make_rig: Callable[..., Rig]) -> None:
    # R10: the persisted-record cap is an admission error like the size limit. 1000 control
    # characters pass the 64 KiB text limit but encode to ~6000 JSON bytes.
    rig = make_rig(max_line=4096)
    res = await rig.receiver.receive(msg("ctl", text="\x01" * 1000))
    assert (res.state, res.reason) == (M.REJECTED, "message_too_large")
    assert rig.states("ctl") == ["rejected"]
    assert rig.written() == 0
    assert (await rig.receiver.receive(msg("ctl", text="\x01" * 1000))).duplicate
    assert (await rig.receiver.receive(msg("fine"))).state is M.ACCEPTED


# -- R1: durable before acknowledged ---------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("fail", ["write", "fsync"])
async def test_failed_submitted_write_is_unavailable(make_rig: Callable[..., Rig],
                                                    fail: str) -> None:
    faults = FaultyOps()
    (faults.fail_write if fail == "write" else faults.fail_fsync).add(1)
    rig = make_rig(ops=faults)
    with pytest.raises(ReceiverUnavailable):
        await rig.receiver.receive(msg("m1", kind=Kind.ASK))
    assert rig.written() == 0
    assert "m1" not in rig.receiver.entries
    assert rig.receiver.admission.open_asks == set(), "the reservation is given back"
    assert read_journal(rig.path).records == []
    # nothing was accepted, so a retry is processed as new
    assert (await rig.receiver.receive(msg("m1", kind=Kind.ASK))).state is M.ACCEPTED
    assert rig.written() == 1


@pytest.mark.anyio
@pytest.mark.parametrize("fail", ["write", "fsync"])
async def test_failed_dispatch_claim_is_unavailable_and_retry_dispatches(
        make_rig: Callable[..., Rig], fail: str) -> None:
    faults = FaultyOps()
    (faults.fail_write if fail == "write" else faults.fail_fsync).add(2)
    rig = make_rig(ops=faults)
    with pytest.raises(ReceiverUnavailable):
        await rig.receiver.receive(msg("m1"))
    assert rig.written() == 0
    assert rig.states("m1") == ["submitted"]
    # The sender saw a failure and retries: the message must not be stranded in submitted.
    retry = await rig.receiver.receive(msg("m1"))
    assert retry.state is M.ACCEPTED
    assert rig.written("m1") == 1
    assert rig.states("m1") == ["submitted", "dispatching", "accepted"]
    assert (await rig.receiver.receive(msg("m1"))).duplicate
    assert rig.written("m1") == 1


@pytest.mark.anyio
async def test_failed_dispatch_claim_then_restart_resumes_once(
        make_rig: Callable[..., Rig]) -> None:
    faults = FaultyOps()
    faults.fail_write.add(2)
    rig = make_rig(ops=faults)
    with pytest.raises(ReceiverUnavailable):
        await rig.receiver.receive(msg("m1", task_id="task-1"))
    (entry,) = rig.restart()
    assert (await rig.receiver.resume(entry)).state is M.ACCEPTED
    assert rig.written("m1") == 1


@pytest.mark.anyio
@pytest.mark.parametrize("fail", ["write", "fsync"])
async def test_failed_outcome_write_after_harness_write_is_unknown(
        make_rig: Callable[..., Rig], fail: str) -> None:
    faults = FaultyOps()
    (faults.fail_write if fail == "write" else faults.fail_fsync).add(3)
    rig = make_rig(ops=faults)
    res = await rig.receiver.receive(msg("m1"))
    assert (res.state, res.reason) == (M.UNKNOWN, "journal_write_failed")
    assert rig.written("m1") == 1
    assert rig.states("m1") == ["submitted", "dispatching"]
    assert (await rig.receiver.receive(msg("m1"))).state is M.UNKNOWN
    assert rig.restart() == []
    assert rig.receiver.entries["m1"].state is M.UNKNOWN
    assert (await rig.receiver.receive(msg("m1"))).state is M.UNKNOWN
    assert rig.written("m1") == 1


@pytest.mark.anyio
async def test_ask_outcome_and_obligation_are_durable_together(
        make_rig: Callable[..., Rig]) -> None:
    # If the open-ask record cannot be written, the result must not be accepted, and the
    # journal must not say accepted either (it would disagree with what the sender was told).
    faults = FaultyOps()
    faults.fail_if = lambda data: b'"subject":"ask"' in data
    rig = make_rig(ops=faults)
    res = await rig.receiver.receive(msg("a-1", kind=Kind.ASK))
    assert res.state is M.UNKNOWN
    assert rig.written("a-1") == 1
    assert "accepted" not in rig.states("a-1")
    assert rig.receiver.entries["a-1"].ask is None
    faults.fail_if = None
    rig.restart()
    assert rig.receiver.entries["a-1"].state is M.UNKNOWN
    assert (await rig.receiver.receive(msg("a-1", kind=Kind.ASK))).state is M.UNKNOWN
    assert rig.written("a-1") == 1


@pytest.mark.anyio
async def test_failed_rejection_write_is_unavailable(make_rig: Callable[..., Rig]) -> None:
    faults = FaultyOps()
    faults.fail_write.add(1)
    rig = make_rig(ops=faults)
    with pytest.raises(ReceiverUnavailable):
        await rig.receiver.receive(msg("c", sender=SUB, kind=Kind.COMMAND))
    assert "c" not in rig.receiver.entries
    assert (await rig.receiver.receive(msg("c", sender=SUB, kind=Kind.COMMAND))).state is (
        M.REJECTED)


@pytest.mark.anyio
async def test_unbound_receiver_is_unreachable_and_frees_the_ask_slot(
        make_rig: Callable[..., Rig]) -> None:
    rig = make_rig(binding=None, limits=Limits(max_open_asks=1))
    for mid in ("a-1", "a-2"):
        res = await rig.receiver.receive(msg(mid, kind=Kind.ASK))
        assert (res.state, res.reason) == (M.UNREACHABLE, "not_bound")
    assert rig.receiver.admission.open_asks == set()
    assert rig.written() == 0
    assert rig.states("a-1") == ["submitted", "unreachable"]


# -- cancel ---------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_cancel_before_dispatch(rig: Rig) -> None:
    entry = await rig.receiver.admit(msg("m1", kind=Kind.ASK))
    assert isinstance(entry, Inbound)
    assert rig.receiver.admission.open_asks == {"m1"}
    assert rig.receiver.cancel("m1") is True
    assert rig.receiver.admission.open_asks == set()
    assert await rig.receiver.dispatch(entry) == Result("m1", M.CANCELED, "canceled")
    assert rig.written() == 0
    assert rig.states("m1") == ["submitted", "canceled"]
    assert rig.receiver.cancel("m1") is False, "already terminal"
    assert rig.receiver.cancel("nope") is False
    assert rig.restart() == []
    assert rig.receiver.entries["m1"].state is M.CANCELED
    assert (await rig.receiver.receive(msg("m1", kind=Kind.ASK))).state is M.CANCELED
    assert rig.written() == 0


@pytest.mark.anyio
async def test_cancel_after_claim_fails(rig: Rig) -> None:
    gate = asyncio.Event()
    rig.fake.then(Step(gate=gate))
    async with anyio.create_task_group() as tg:
        tg.start_soon(rig.receiver.receive, msg("m1"))
        await settle(rig, rig.fake.parked.is_set)
        assert rig.receiver.cancel("m1") is False
        gate.set()
    assert rig.receiver.entries["m1"].state is M.ACCEPTED
    assert rig.written() == 1
    assert rig.receiver.cancel("m1") is False


# -- asks -----------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_ask_lifecycle(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig(limits=Limits(max_open_asks=1))
    seen: list[tuple[str, MessageState, AskState | None]] = []
    rig.receiver.listeners.append(lambda e: seen.append((e.message_id, e.state, e.ask)))
    res = await rig.receiver.receive(msg("a-1", kind=Kind.ASK, deadline_seconds=30,
                                         task_id="task-1"))
    assert res.state is M.ACCEPTED
    entry = rig.receiver.entries["a-1"]
    assert entry.ask is AskState.OPEN
    (opened,) = rig.records("a-1", "ask")
    assert opened["state"] == "open"
    assert opened["deadline_at"] == rig.now + 30
    assert opened["refs"] == ["task-1"]
    assert ("a-1", M.ACCEPTED, AskState.OPEN) in seen
    assert rig.receiver.admission.open_asks == {"a-1"}
    assert (await rig.receiver.receive(msg("a-2", kind=Kind.ASK))).reason == "too_many_open_asks"

    closed = rig.receiver.close_ask("a-1", AskState.ANSWERED, "the answer")
    assert (closed.ask, closed.reply_text) == (AskState.ANSWERED, "the answer")
    assert [r["state"] for r in rig.records("a-1", "ask")] == ["open", "answered"]
    assert rig.records("a-1", "ask")[-1]["reply"] == "the answer"
    assert rig.receiver.admission.open_asks == set()
    assert seen[-1] == ("a-1", M.ACCEPTED, AskState.ANSWERED)
    with pytest.raises(ValueError, match="not allowed"):
        rig.receiver.close_ask("a-1", AskState.EXPIRED)
    with pytest.raises(KeyError):
        rig.receiver.close_ask("never", AskState.ANSWERED)
    assert (await rig.receiver.receive(msg("a-2", kind=Kind.ASK))).state is M.ACCEPTED

    rig.restart()
    assert rig.receiver.entries["a-1"].ask is AskState.ANSWERED
    assert rig.receiver.entries["a-1"].reply_text == "the answer"
    assert rig.receiver.admission.open_asks == {"a-2"}, "restore re-arms open asks only"
    assert (await rig.receiver.receive(msg("a-3", kind=Kind.ASK))).reason == "too_many_open_asks"
    rig.receiver.close_ask("a-2", AskState.EXPIRED)
    assert (await rig.receiver.receive(msg("a-3", kind=Kind.ASK))).state is M.ACCEPTED


@pytest.mark.anyio
@pytest.mark.parametrize("state", [M.UNREACHABLE, M.REJECTED])
async def test_refused_ask_frees_its_slot(make_rig: Callable[..., Rig],
                                          state: MessageState) -> None:
    rig = make_rig(limits=Limits(max_open_asks=1))
    if state is M.UNREACHABLE:
        rig.fake.then(Step(state=M.UNREACHABLE, write=False))
        res = await rig.receiver.receive(msg("a-1", kind=Kind.ASK))
    else:
        res = await rig.receiver.receive(msg("a-1", sender=STRANGER, kind=Kind.ASK,
                                             native=True))
    assert res.state is state
    assert rig.receiver.entries["a-1"].ask is None
    assert rig.receiver.admission.open_asks == set()
    assert (await rig.receiver.receive(msg("a-2", kind=Kind.ASK))).state is M.ACCEPTED


@pytest.mark.anyio
async def test_unknown_ask_keeps_its_slot_and_resolve_settles_it(
        make_rig: Callable[..., Rig]) -> None:
    rig = make_rig(limits=Limits(max_open_asks=2))
    rig.fake.then(Step(error=ConnectionResetError()), Step(error=ConnectionResetError()))
    for mid in ("a-1", "a-2"):
        assert (await rig.receiver.receive(msg(mid, kind=Kind.ASK, deadline_seconds=5))
                ).state is M.UNKNOWN
    assert rig.receiver.admission.open_asks == {"a-1", "a-2"}, "it may still be answered"
    # a receipt proves a-1 arrived: its reply obligation opens (slot still held)
    rig.now = 2_000.0
    rig.receiver.resolve("a-1", M.ACCEPTED, "receipt")
    assert rig.receiver.entries["a-1"].ask is AskState.OPEN
    assert [r["state"] for r in rig.records("a-1", "ask")] == ["open"]
    assert rig.records("a-1", "ask")[0]["deadline_at"] == 2_005.0
    # a-2 is definitely lost: its slot comes back
    rig.receiver.resolve("a-2", M.UNREACHABLE, "receipt_dropped")
    assert rig.receiver.entries["a-2"].ask is None
    assert rig.receiver.admission.open_asks == {"a-1"}
    assert rig.states("a-2")[-1] == "unreachable"
    assert (await rig.receiver.receive(msg("a-3", kind=Kind.ASK))).state is M.ACCEPTED
    assert rig.written() == 3
    with pytest.raises(ValueError, match="not allowed"):
        rig.receiver.resolve("a-1", M.QUEUED)


@pytest.mark.anyio
@pytest.mark.parametrize(("receipt", "harness"), [
    (M.ACCEPTED, Step()),
    (M.UNREACHABLE, Step()),  # a later "dropped" receipt outranks the grace-period guess
    (M.ACCEPTED, Step(error=ConnectionResetError())),
])
async def test_receipt_while_the_harness_call_is_in_flight(
        rig: Rig, receipt: MessageState, harness: Step) -> None:
    # Claude receipts reach the uds ingress while the injector may still sit in its grace
    # period; resolve() then settles the claim before inject() returns.
    gate = asyncio.Event()
    rig.fake.then(replace(harness, gate=gate))
    results: list[Result] = []

    async def send() -> None:
        results.append(await rig.receiver.receive(msg("m1", kind=Kind.ASK)))

    async with anyio.create_task_group() as tg:
        tg.start_soon(send)
        await settle(rig, rig.fake.parked.is_set)
        rig.receiver.resolve("m1", receipt, "receipt")
        gate.set()
    assert [r.state for r in results] == [receipt]
    assert rig.states("m1") == ["submitted", "dispatching", receipt.value]
    assert rig.written() == 1
    opened = receipt is M.ACCEPTED
    assert (rig.receiver.entries["m1"].ask is AskState.OPEN) is opened
    assert rig.receiver.admission.open_asks == ({"m1"} if opened else set())


@pytest.mark.anyio
async def test_cancelled_dispatch_after_a_receipt_keeps_the_receipt(rig: Rig) -> None:
    gate = asyncio.Event()
    rig.fake.then(Step(gate=gate))
    async with anyio.create_task_group() as tg:
        tg.start_soon(rig.receiver.receive, msg("m1"))
        await settle(rig, rig.fake.parked.is_set)
        rig.receiver.resolve("m1", M.ACCEPTED, "receipt")
        tg.cancel_scope.cancel()
    assert rig.receiver.entries["m1"].state is M.ACCEPTED
    assert rig.states("m1") == ["submitted", "dispatching", "accepted"]


@pytest.mark.anyio
async def test_resumed_ask_is_admitted_against_the_limit(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig(limits=Limits(max_open_asks=1))
    await rig.receiver.admit(msg("a-1", kind=Kind.ASK, task_id="task-1"))
    (entry,) = rig.restart()
    assert rig.receiver.admission.open_asks == set()
    assert (await rig.receiver.resume(entry)).state is M.ACCEPTED
    assert rig.receiver.admission.open_asks == {"a-1"}, "a resumed ask holds a slot"
    assert (await rig.receiver.receive(msg("a-2", kind=Kind.ASK))).reason == "too_many_open_asks"
    rig.receiver.close_ask("a-1", AskState.ANSWERED, "ok")
    assert rig.receiver.admission.open_asks == set()


@pytest.mark.anyio
async def test_resume_over_the_ask_limit_is_rejected(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig(limits=Limits(max_open_asks=1))
    await rig.receiver.admit(msg("a-1", kind=Kind.ASK, task_id="task-1"))
    (entry,) = rig.restart()
    assert (await rig.receiver.receive(msg("a-2", sender=BOB, kind=Kind.ASK))).state is (
        M.ACCEPTED)
    res = await rig.receiver.resume(entry)
    assert res == Result("a-1", M.REJECTED, "too_many_open_asks")
    assert rig.states("a-1") == ["submitted", "rejected"]
    assert rig.receiver.admission.open_asks == {"a-2"}
    assert rig.written() == 1


# -- listeners and entries -------------------------------------------------------------------


@pytest.mark.anyio
async def test_listeners_see_every_state_in_order(rig: Rig) -> None:
    seen: list[tuple[str, str]] = []
    rig.receiver.listeners.append(lambda e: seen.append((e.message_id, e.state.value)))
    await rig.receiver.receive(msg("m1"))
    await rig.receiver.receive(msg("r", sender=SUB, kind=Kind.COMMAND))
    assert seen == [("m1", "submitted"), ("m1", "dispatching"), ("m1", "accepted"),
                    ("r", "rejected")]
    entry = rig.receiver.entries["m1"]
    assert entry.message is None, "a dispatched message can never be dispatched again"
    assert (entry.kind, entry.ingress, entry.binding) == ("inform", "a2a", BINDING.as_record())


@pytest.mark.anyio
async def test_delivery_carries_the_message(rig: Rig) -> None:
    m = msg("m1", kind=Kind.ASK, delivery=DeliveryMode.NEXT_TURN, in_reply_to="m0",
            context_id="ctx", deadline_seconds=9)
    await rig.receiver.receive(m)
    (w,) = rig.fake.writes
    assert w.delivery.message == m
    assert w.delivery.wake is False  # next_turn never wakes
    rec = rig.records("m1")[0]
    assert (rec["kind"], rec["delivery"], rec["in_reply_to"], rec["context_id"]) == (
        "ask", "next_turn", "m0", "ctx")
    assert rec["refs"] == ["m0"]


# -- randomized: any sequence of receives, faults, crashes and retries --------------------------

SENDERS = [ALICE, BOB, SUB, ALICE_UDS, STRANGER]
STEPS = {
    "accepted": Step(),
    "queued": Step(state=M.QUEUED, evidence="inject_items"),
    "unreachable": Step(state=M.UNREACHABLE, write=False),
    "unknown": Step(state=M.UNKNOWN, reason="grace_eof"),
    "reset_after_write": Step(error=ConnectionResetError()),
    "error_before_write": Step(write=False, error=OSError("refused")),
    "malformed": Step(malformed=object()),
}


#: What happens just before a receive or retry: mostly nothing, sometimes a shim crash and
#: restart, sometimes an armed journal fault that hits whichever write comes next.
BEFORE = st.sampled_from(["", "", "", "", "", "crash", "fault"])


@dataclass
class Sent:
    message: Message
    results: list[Result] = field(default_factory=list)


class ReceiverMachine(RuleBasedStateMachine):
    """Random receives (senders, kinds, reused ids, harness outcomes), journal faults, crashes
    with restore and resume, retries and ask answers; the invariants hold after every step."""

    sent = Bundle("sent")

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        self.loop = asyncio.new_event_loop()
        self.faults = FaultyOps()
        self.limits = Limits(max_open_asks=2, max_text_bytes=64)
        self.rig = Rig(Path(self.tmp.name) / "agent.jsonl", limits=self.limits, ops=self.faults)
        self.native_ids = 0
        self.history: list[Sent] = []

    def teardown(self) -> None:
        self.rig.close()
        self.loop.close()
        self.tmp.cleanup()

    # -- driving --

    def _receive(self, m: Message) -> Result | None:
        prior = self.rig.receiver.entries.get(m.message_id)
        prior_state = prior.state if prior is not None else None
        try:
            res = self.loop.run_until_complete(self.rig.receiver.receive(m))
        except ReceiverUnavailable:
            return None
        if prior is not None and not m.native and prior.sender.key == m.sender.key:
            assert res.duplicate
            if prior_state is not M.SUBMITTED:
                assert res.state is prior_state, "a retry returns the prior state"
        elif prior is not None:
            assert res == Result(m.message_id, M.REJECTED, "message_id_conflict")
        else:
            assert not res.duplicate
        assert res.state is not M.DISPATCHING, "no call returns while its own claim is open"
        return res

    def _before(self, event: str) -> None:
        if event == "crash":
            self.crash()
        elif event == "fault":
            self.faults.armed = True  # the next journal write fails, whichever it is

    @rule(target=sent, sender=st.sampled_from(SENDERS),
          kind=st.sampled_from([Kind.INFORM, Kind.INFORM, Kind.ASK, Kind.ASK, Kind.COMMAND]),
          mid=st.sampled_from(["m0", "m1", "m2", "m3", "m4", "m5"]),
          step=st.sampled_from(sorted(STEPS)), big=st.sampled_from([False] * 5 + [True]),
          before=BEFORE)
    def receive(self, *, sender: Sender, kind: Kind, mid: str, step: str, big: bool,
                before: str) -> Sent:
        self._before(before)
        native = sender is STRANGER
        if native:
            self.native_ids += 1
            mid = f"n-{self.native_ids}"
        self.rig.fake.default = STEPS[step]
        m = msg(mid, sender=sender, kind=kind, native=native,
                text="z" * (80 if big else 8), task_id=f"task-{mid}")
        sent = Sent(m)
        res = self._receive(m)
        if res is not None:
            sent.results.append(res)
        self.history.append(sent)
        return sent

    @rule(sent=sent, step=st.sampled_from(sorted(STEPS)), before=BEFORE)
    def retry(self, sent: Sent, step: str, before: str) -> None:
        self._before(before)
        self.rig.fake.default = STEPS[step]
        res = self._receive(sent.message)
        if res is not None:
            sent.results.append(res)

    @rule(sender=st.sampled_from([ALICE, BOB, ALICE_UDS, STRANGER]),
          mid=st.sampled_from(["m6", "m7", "m8"]),
          kind=st.sampled_from([Kind.INFORM, Kind.ASK]), append_claim=st.booleans(),
          continuation=st.booleans())
    def admit_then_crash(self, sender: Sender, mid: str, kind: Kind, append_claim: bool,
                         continuation: bool) -> None:
        """An ingress admitted (maybe claimed) and the shim died before the outcome."""
        native = sender is STRANGER
        if native:
            self.native_ids += 1
            mid = f"n-{self.native_ids}"
        try:
            admitted = self.loop.run_until_complete(self.rig.receiver.admit(msg(
                mid, sender=sender, kind=kind, task_id=f"task-{mid}", native=native,
                continuation=continuation and sender.ingress is Ingress.A2A)))
        except ReceiverUnavailable:
            admitted = None
        if isinstance(admitted, Inbound) and append_claim:
            with contextlib.suppress(JournalError):  # an armed fault may hit the claim
                self.rig.journal.append({"subject": "message", "id": mid,
                                         "state": "dispatching", "reason": None})
        self.crash()

    def crash(self) -> None:
        writes = len(self.rig.fake.writes)
        while True:
            try:
                resumable = self.rig.restart(ops=self.faults)
                break
            except ReceiverUnavailable:
                continue  # a journal fault during restore: the next start tries again
        assert len(self.rig.fake.writes) == writes, "restore never injects"
        for entry in self.rig.receiver.entries.values():
            assert entry.state is not M.DISPATCHING
        for entry in resumable:
            assert entry.state is M.SUBMITTED
            assert not entry.continuation
            assert entry.ingress == Ingress.A2A.value
            try:
                res = self.loop.run_until_complete(self.rig.receiver.resume(entry))
            except ReceiverUnavailable:
                continue
            for s in self.history:
                if s.message.message_id == entry.message_id:
                    s.results.append(res)
                    break

    @precondition(lambda self: any(e.ask is AskState.OPEN
                                   for e in self.rig.receiver.entries.values()))
    @rule(data=st.data())
    def answer_an_ask(self, data: st.DataObject) -> None:
        open_ids = sorted(m for m, e in self.rig.receiver.entries.items()
                          if e.ask is AskState.OPEN)
        mid = data.draw(st.sampled_from(open_ids))
        try:
            self.rig.receiver.close_ask(mid, AskState.ANSWERED, "answer")
        except ReceiverUnavailable:
            assert self.rig.receiver.entries[mid].ask is AskState.OPEN
            return
        assert mid not in self.rig.receiver.admission.open_asks

    @rule(sent=consumes(sent))
    def forget(self, sent: Sent) -> None:
        """Keep the bundle small so retries hit interesting ids."""

    # -- invariants --

    @invariant()
    def never_injected_twice(self) -> None:
        counts = Counter(w.delivery.message.message_id for w in self.rig.fake.writes)
        assert all(n == 1 for n in counts.values()), counts

    @invariant()
    def acknowledged_outcomes_are_journaled(self) -> None:
        on_disk = {(r.get("id"), r.get("state")) for r in read_journal(self.rig.path).records
                   if r.get("subject") == "message"}
        for s in self.history:
            for res in s.results:
                if res.state in (M.ACCEPTED, M.QUEUED):
                    assert (res.message_id, res.state.value) in on_disk, res

    @invariant()
    def the_journal_is_a_legal_sequence(self) -> None:
        """Whatever faults and crashes did, the table accepts every record on disk, and a
        restart adopted all of them."""
        assert audit_journal(self.rig.path) == []
        assert self.rig.receiver.replay_violations == []

    @invariant()
    def nothing_in_flight_at_rest(self) -> None:
        for entry in self.rig.receiver.entries.values():
            assert entry.state is not M.DISPATCHING
            if entry.state is not M.SUBMITTED:
                assert entry.message is None

    @invariant()
    def ask_slots_are_accounted(self) -> None:
        adm = self.rig.receiver.admission
        assert len(adm.open_asks) <= self.limits.max_open_asks
        entries = self.rig.receiver.entries
        for mid, entry in entries.items():
            if entry.ask is AskState.OPEN:
                assert mid in adm.open_asks
        for mid in adm.open_asks:
            assert entries[mid].kind == Kind.ASK.value
            assert entries[mid].state in (M.SUBMITTED, M.ACCEPTED, M.QUEUED, M.UNKNOWN)

    @invariant()
    def only_injected_states_were_written(self) -> None:
        written = {w.delivery.message.message_id for w in self.rig.fake.writes}
        for mid, entry in self.rig.receiver.entries.items():
            if entry.state in (M.REJECTED, M.RECOVERED, M.CANCELED, M.SUBMITTED):
                assert mid not in written, (mid, entry.state)


TestReceiverMachine = ReceiverMachine.TestCase
TestReceiverMachine.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def test_outcome_rejects_non_outcome_states() -> None:
    # the seam itself: a harness cannot report "submitted" or "rejected"
    for state in set(M) - OUTCOME_STATES:
        with pytest.raises(ValueError, match="cannot end"):
            Outcome(state)


# -- hardening after review ------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_failing_listener_does_not_strand_a_message(rig: Rig) -> None:
    def broken(_: Inbound) -> None:
        raise RuntimeError("listener bug")

    rig.receiver.listeners.append(broken)
    result = await rig.receiver.receive(msg("m-listener"))
    assert result.state is M.ACCEPTED
    assert rig.states("m-listener") == ["submitted", "dispatching", "accepted"]
    assert rig.written("m-listener") == 1


@pytest.mark.anyio
async def test_open_ask_of_another_conversation_is_closed_on_restore(rig: Rig) -> None:
    limits = Limits(max_open_asks=1)
    rig.limits = limits
    rig.restart(limits=limits)
    sent = await rig.receiver.receive(msg("m-ask", kind=Kind.ASK, text="q?"))
    assert sent.state is M.ACCEPTED
    other = replace(BINDING, session_ref="a-new-conversation")
    rig.restart(binding=other)
    assert [r["state"] for r in rig.records("m-ask", "ask")] == ["open", "closed"]
    assert rig.receiver.admission.open_asks == set()
    # The slot is free again for asks in the new conversation.
    again = await rig.receiver.receive(msg("m-ask-2", kind=Kind.ASK, text="q2?"))
    assert again.state is M.ACCEPTED
    # In the same conversation an open ask survives a restart and keeps its slot.
    rig.restart(binding=other)
    assert rig.receiver.admission.open_asks == {"m-ask-2"}


@pytest.mark.anyio
async def test_local_notice_submitted_at_a_crash_is_rechecked_not_resumed(rig: Rig) -> None:
    local = Sender(None, ingress=Ingress.LOCAL)
    entry = await rig.receiver.admit(msg("m-local", sender=local, text="claimed by alice"))
    assert isinstance(entry, Inbound)
    resumable = rig.restart()
    assert resumable == []
    assert rig.states("m-local") == ["submitted", "recovered"]
    assert rig.written() == 0


# -- seed 5: native replies from our own session are bounced, never forwarded ------------------


SELF_NATIVE = Sender(agent_id=AGENT_ID, name="me", role=PRIMARY, ingress=Ingress.UDS,
                     peer_pid=777)


@pytest.mark.seed(5)
@pytest.mark.anyio
async def test_native_reply_is_bounced_with_the_open_asks_listed(rig: Rig) -> None:
    a1 = await rig.receiver.receive(msg("ask-1", kind=Kind.ASK, text="first question"))
    a2 = await rig.receiver.receive(msg("ask-2", kind=Kind.ASK, text="second question"))
    assert a1.state is M.ACCEPTED
    assert a2.state is M.ACCEPTED
    before = len(rig.fake.writes)
    native = msg("native-1", sender=SELF_NATIVE, text="the answer is 42\nmore", native=True)
    result = await rig.receiver.receive(native)
    assert result.state is M.BOUNCED
    assert rig.states("native-1") == ["bounced"]
    # Nothing was forwarded anywhere; the session got one notice listing both asks.
    notice = rig.fake.writes[before:]
    assert len(notice) == 1
    assert notice[0].delivery.message.sender.name == "crosstalk"
    assert notice[0].delivery.message.sender.ingress is Ingress.LOCAL
    text = notice[0].text
    assert "the answer is 42" in text
    assert "more" not in text.split("the answer is 42", 1)[1].split("\n", 1)[0]
    assert "ask-1" in text
    assert "ask-2" in text
    # The asks stay open with their routes: only the reply tool answers them.
    assert rig.receiver.entries["ask-1"].ask is AskState.OPEN
    assert rig.receiver.entries["ask-2"].ask is AskState.OPEN
    # A native answer to the bounce notice is bounced again, not delivered.
    again = await rig.receiver.receive(msg("native-2", sender=SELF_NATIVE, text="ok",
                                           native=True))
    assert again.state is M.BOUNCED
    assert len(rig.fake.writes) == before + 2
    assert all(w.delivery.message.sender.ingress is Ingress.LOCAL
               for w in rig.fake.writes[before:])


@pytest.mark.seed(5)
@pytest.mark.anyio
async def test_bounce_notice_omits_answered_asks_and_survives_restart(rig: Rig) -> None:
    await rig.receiver.receive(msg("ask-open", kind=Kind.ASK, text="q1"))
    await rig.receiver.receive(msg("ask-done", kind=Kind.ASK, text="q2"))
    rig.receiver.close_ask("ask-done", AskState.ANSWERED, "answered already")
    rig.restart()
    await rig.receiver.receive(msg("native-3", sender=SELF_NATIVE, text="hi", native=True))
    text = rig.fake.writes[-1].text
    assert "ask-open" in text
    assert "ask-done" not in text
    assert rig.states("native-3") == ["bounced"]


@pytest.mark.seed(5)
@pytest.mark.anyio
async def test_bounce_lists_an_ask_still_being_dispatched(rig: Rig) -> None:
    """Live (issue 5): a session may answer natively before the injector has the inbox's close
    and the receipt grace behind it; the ask it answers must be listed all the same."""
    gate = asyncio.Event()
    rig.fake.then(Step(gate=gate))
    asking = asyncio.ensure_future(rig.receiver.receive(msg("ask-slow", kind=Kind.ASK,
                                                            text="q?")))
    while not rig.fake.parked.is_set():
        await asyncio.sleep(0)
    assert rig.receiver.entries["ask-slow"].state is M.DISPATCHING
    bounced = await rig.receiver.receive(msg("native-fast", sender=SELF_NATIVE, text="42",
                                             native=True))
    assert bounced.state is M.BOUNCED
    gate.set()
    assert (await asking).state is M.ACCEPTED
    notice = [w.text for w in rig.fake.writes if "was not delivered" in w.text]
    assert len(notice) == 1
    assert "ask-slow" in notice[0]


@pytest.mark.anyio
async def test_a_receipt_settles_only_an_unknown_message(rig: Rig) -> None:
    rig.fake.then(Step(error=ConnectionResetError()), Step(), Step(error=ConnectionResetError()))
    assert (await rig.receiver.receive(msg("m1", kind=Kind.ASK))).state is M.UNKNOWN
    assert (await rig.receiver.receive(msg("m2"))).state is M.ACCEPTED
    assert (await rig.receiver.receive(msg("m3"))).state is M.UNKNOWN
    assert rig.receiver.settle_by_receipt("m1", "held") is None, "held proves nothing"
    assert rig.receiver.settle_by_receipt("m1", "delivered") is M.ACCEPTED
    assert rig.receiver.entries["m1"].ask is AskState.OPEN, "a delivered ask opens"
    assert rig.receiver.settle_by_receipt("m2", "denied") is None, "accepted stands"
    assert rig.receiver.settle_by_receipt("m3", "expired") is M.UNREACHABLE
    assert rig.receiver.entries["m3"].reason == "receipt_expired"
    assert rig.receiver.settle_by_receipt("nope", "delivered") is None
    assert rig.states("m1") == ["submitted", "dispatching", "unknown", "accepted"]
    assert rig.states("m2") == ["submitted", "dispatching", "accepted"]


@pytest.mark.anyio
async def test_ending_an_ask_is_an_event(rig: Rig) -> None:
    with pytest.raises(KeyError):
        rig.receiver.end_ask("nope", AskEvent.ANSWERED)
    assert isinstance(await rig.receiver.admit(msg("q0", kind=Kind.ASK)), Inbound)
    with pytest.raises(KeyError):
        rig.receiver.close_ask("q0", AskState.ANSWERED)  # not delivered: no obligation yet
    assert (await rig.receiver.receive(msg("q", kind=Kind.ASK))).state is M.ACCEPTED
    with pytest.raises(IllegalTransition):
        rig.receiver.close_ask("q", AskState.OPEN)
    assert rig.receiver.end_ask("q", AskEvent.EXPIRED).ask is AskState.EXPIRED
    with pytest.raises(IllegalTransition):
        rig.receiver.end_ask("q", AskEvent.ANSWERED)
    assert [r["state"] for r in rig.records("q", "ask")] == ["open", "expired"]


@pytest.mark.anyio
async def test_an_admission_during_a_parked_inject_is_durable_without_it(rig: Rig) -> None:
    """While the lane injects, an admission is staged to ride with the lane's next write; a
    harness that holds the inject (a busy session) must not hold the admission with it: it is
    durable, and the message submitted on disk, while the inject is still parked."""
    gate = asyncio.Event()
    rig.fake.then(Step(gate=gate))
    async with anyio.create_task_group() as tg:
        tg.start_soon(rig.receiver.receive, msg("m1"))
        await settle(rig, rig.fake.parked.is_set)
        admitted = await rig.receiver.admit(msg("m2", sender=BOB))
        assert isinstance(admitted, Inbound)
        assert rig.states("m2") == ["submitted"], "durable while m1's inject is parked"
        assert rig.fake.parked.is_set()
        assert rig.written() == 0
        gate.set()
    assert rig.states("m1") == ["submitted", "dispatching", "accepted"]
