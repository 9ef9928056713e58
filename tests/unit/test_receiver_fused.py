"""The fused admission (``Receiver.receive(..., fused=True)``, the uds ingress's path): the
``submitted`` and ``dispatching`` records share one write, so one fsync precedes the harness.
What must hold: the lock is never written without the admission; a failed shared write
accepted nothing (the sender is told, nothing reached the harness) and a retry starts over
and dispatches exactly once; a copy in flight waits for the first write."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from crosstalk.core.states import MessageState as M
from crosstalk.receiver import ReceiverUnavailable
from tests.support.faulty_ops import FaultyOps
from tests.unit.test_receiver import Rig, make_rig, msg

__all__ = ["make_rig"]


@pytest.mark.anyio
async def test_one_write_carries_admission_and_lock(make_rig: Callable[..., Rig]) -> None:
    ops = FaultyOps()
    rig = make_rig(ops=ops)
    result = await rig.receiver.receive(msg("m1"), fused=True)
    assert result.state is M.ACCEPTED
    assert rig.states("m1") == ["submitted", "dispatching", "accepted"]
    assert ops.fsyncs == 2, "submitted+dispatching in one write, the outcome in another"


@pytest.mark.anyio
@pytest.mark.parametrize("fail", ["write", "fsync"])
async def test_a_failed_shared_write_accepted_nothing_and_a_retry_dispatches_once(
        make_rig: Callable[..., Rig], fail: str) -> None:
    ops = FaultyOps()
    (ops.fail_write if fail == "write" else ops.fail_fsync).add(1)
    rig = make_rig(ops=ops)
    with pytest.raises(ReceiverUnavailable):
        await rig.receiver.receive(msg("m1"), fused=True)
    assert rig.written() == 0, "nothing reached the harness"
    assert rig.states("m1") == [], "neither record is on disk"
    assert "m1" not in rig.receiver.entries, "the message was never accepted"
    retry = await rig.receiver.receive(msg("m1"), fused=True)
    assert retry.state is M.ACCEPTED
    assert not retry.duplicate
    assert rig.written("m1") == 1
    assert rig.states("m1") == ["submitted", "dispatching", "accepted"]


@pytest.mark.anyio
async def test_a_copy_in_flight_waits_for_the_first_and_injects_once(
        make_rig: Callable[..., Rig]) -> None:
    rig = make_rig()
    first, copy = await asyncio.gather(rig.receiver.receive(msg("m1"), fused=True),
                                       rig.receiver.receive(msg("m1"), fused=True))
    assert first.state is M.ACCEPTED
    assert not first.duplicate
    assert copy.duplicate
    assert copy.state is M.ACCEPTED, "answered with a durable state"
    assert rig.written("m1") == 1
    assert rig.states("m1") == ["submitted", "dispatching", "accepted"]


@pytest.mark.anyio
async def test_a_too_large_record_is_rejected_and_nothing_locked(
        make_rig: Callable[..., Rig]) -> None:
    rig = make_rig(max_line=700)
    result = await rig.receiver.receive(msg("m1", text="é" * 300), fused=True)
    assert result.state is M.REJECTED
    assert result.reason == "message_too_large"
    assert rig.written() == 0
    assert rig.states("m1") == ["rejected"], "no dispatching record without its admission"
