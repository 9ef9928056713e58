"""A harness's later look at a message it answered for (:attr:`Outcome.follow_up`).

Some evidence arrives after an injector has to answer. A busy opencode loop takes a message at
its *next* step, which may be minutes away, and the user may abort the turn before then: the
message then sits in the session's history, unread until the next turn. The injector answers
at once (``accepted``: stored in the session) and hands back a follow-up that watches the turn.

The agent runs that follow-up as one task of its own group (so it is cancelled when the agent
stops, like everything the agent started) and applies the receipt it ends with exactly as it
applies a late Claude receipt: journaled, shown in the mailbox, and settling the message only
if it was ``unknown``. It wraps the harness rather than the receiver so the receiver's chain
stays the one place a state is decided; the follow-up can only add a receipt to it.

At most :data:`MAX_FOLLOW_UPS` run at once per agent: each may hold a connection to the harness.
Past that a follow-up is not started and the outcome stands as the harness gave it (logged).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from crosstalk.agent.taskgroup import TaskGroup
from crosstalk.harness.base import Binding, Delivery, FollowUp, Harness, Outcome, Receipt

log = logging.getLogger(__name__)

#: Follow-ups one agent runs at once.
MAX_FOLLOW_UPS: Final = 32


@dataclass
class FollowingHarness:
    """``inner``, with each follow-up of its outcomes run in ``group`` and its receipt given to
    ``apply`` (the agent's :meth:`~crosstalk.agent.core.Agent.apply_receipt`)."""

    inner: Harness
    group: TaskGroup
    apply: Callable[[Receipt], None]
    limit: int = MAX_FOLLOW_UPS
    name: str = field(init=False)
    running: set[asyncio.Task[None]] = field(default_factory=set, init=False)

    def __post_init__(self) -> None:
        self.name = self.inner.name

    async def inject(self, binding: Binding, delivery: Delivery) -> Outcome:
        outcome = await self.inner.inject(binding, delivery)
        if isinstance(outcome, Outcome) and outcome.follow_up is not None:
            self._start(delivery.message.message_id, outcome.follow_up)
        return outcome

    def _start(self, message_id: str, follow_up: FollowUp) -> None:
        if len(self.running) >= self.limit:
            log.warning("%s: %d follow-ups running; %s keeps its first outcome", self.name,
                        len(self.running), message_id)
            return
        try:
            task = self.group.spawn(self._run(message_id, follow_up),
                                    what=f"follow-up of {message_id}")
        except RuntimeError:  # the agent is stopping: nothing left to report to
            return
        self.running.add(task)
        task.add_done_callback(self.running.discard)

    async def _run(self, message_id: str, follow_up: FollowUp) -> None:
        receipt = await follow_up()
        if receipt is None:
            return
        if receipt.message_id != message_id:  # a harness bug: never file it elsewhere
            log.warning("%s: a follow-up of %s reported on %s; ignored", self.name,
                        message_id, receipt.message_id)
            return
        self.apply(receipt)
