"""The agent's runner of harness follow-ups (crosstalk.agent.followups): each runs in the
agent's task group, its receipt reaches the agent, a cap bounds them, and stopping the agent
ends them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from crosstalk.agent.followups import FollowingHarness
from crosstalk.agent.taskgroup import TaskGroup
from crosstalk.core.ids import new_message_id
from crosstalk.core.message import Ingress, Message, Sender
from crosstalk.core.states import MessageState
from crosstalk.harness.base import Binding, Delivery, Outcome, Receipt

pytestmark = pytest.mark.anyio

BINDING = Binding("stub", "s", None, "i")


@dataclass
class Gated:
    """A harness whose every outcome comes with a follow-up that waits for ``release``."""

    name: str = "stub"
    release: asyncio.Event = field(default_factory=asyncio.Event)
    started: int = 0
    report_on: str | None = None

    async def inject(self, binding: Binding, delivery: Delivery) -> Outcome:
        mid = delivery.message.message_id

        async def watch() -> Receipt | None:
            self.started += 1
            await self.release.wait()
            return Receipt(self.report_on or mid, "unanswered", "stub_reason")

        return Outcome(MessageState.ACCEPTED, None, "stored", follow_up=watch)


def delivery() -> Delivery:
    sender = Sender(agent_id="a" * 16, name="alice", ingress=Ingress.A2A)
    return Delivery(Message(message_id=new_message_id(), sender=sender, text="hi"))


async def test_a_follow_up_runs_in_the_group_and_its_receipt_is_applied() -> None:
    group = TaskGroup("t")
    await group.open()
    got: list[Receipt] = []
    inner = Gated()
    harness = FollowingHarness(inner, group, got.append)
    assert harness.name == "stub"
    d = delivery()
    out = await harness.inject(BINDING, d)
    assert out.state is MessageState.ACCEPTED  # answered at once, not after the watch
    assert got == []
    inner.release.set()
    for _ in range(100):
        if got:
            break
        await asyncio.sleep(0.01)
    assert got == [Receipt(d.message.message_id, "unanswered", "stub_reason")]
    assert not harness.running
    await group.close()


async def test_a_receipt_for_another_message_is_not_applied() -> None:
    group = TaskGroup("t")
    await group.open()
    got: list[Receipt] = []
    inner = Gated(report_on=new_message_id())
    harness = FollowingHarness(inner, group, got.append)
    await harness.inject(BINDING, delivery())
    inner.release.set()
    await asyncio.sleep(0.05)
    assert inner.started == 1
    assert got == []
    await group.close()


async def test_the_cap_bounds_follow_ups_and_closing_the_group_ends_them() -> None:
    group = TaskGroup("t")
    await group.open()
    got: list[Receipt] = []
    inner = Gated()
    harness = FollowingHarness(inner, group, got.append, limit=3)
    outs = [await harness.inject(BINDING, delivery()) for _ in range(5)]
    assert all(o.state is MessageState.ACCEPTED for o in outs)  # outcomes stand past the cap
    await asyncio.sleep(0.05)
    assert inner.started == 3
    assert len(harness.running) == 3
    await group.close()  # the agent stops: its follow-ups end with it
    assert not harness.running
    assert got == []
    await harness.inject(BINDING, delivery())  # after stop: no follow-up, no error
    assert not harness.running
