"""The scriptable fake harness: a real adapter for tests, benchmarks and the demo.

It behaves like a harness session that records what reached it. Each injection takes the
next scripted :class:`Step` (or the default), which can succeed, refuse, fail ambiguously,
raise, return a malformed result, or block between "dequeue" and "write" until released:
exactly the branches seed test 16 and the cancel race (test 22) need.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from crosstalk.core.states import MessageState
from crosstalk.harness.base import Binding, Delivery, Outcome


@dataclass
class Step:
    """What the next injection does. ``write`` says whether the session received the text."""

    state: MessageState = MessageState.ACCEPTED
    reason: str | None = None
    evidence: str | None = "fake-ok"
    write: bool = True
    #: Raise this instead of returning (after writing, if ``write``): a disconnect.
    error: BaseException | None = None
    #: Return this object instead of an Outcome: a malformed success.
    malformed: object | None = None
    #: Wait for this event between dequeue and write (the cancel-race window).
    gate: asyncio.Event | None = None


@dataclass
class Written:
    binding: Binding
    delivery: Delivery
    text: str


@dataclass
class FakeHarness:
    name: str = "fake"
    default: Step = field(default_factory=Step)
    script: deque[Step] = field(default_factory=deque)
    writes: list[Written] = field(default_factory=list)
    #: Called for each delivery to render the text the session sees.
    render: Callable[[Delivery], str] = lambda d: d.message.text
    #: Set while an injection is parked at its gate (tests wait on it).
    parked: asyncio.Event = field(default_factory=asyncio.Event)
    dequeued: int = 0

    def then(self, *steps: Step) -> FakeHarness:
        self.script.extend(steps)
        return self

    async def inject(self, binding: Binding, delivery: Delivery) -> Outcome:
        step = self.script.popleft() if self.script else self.default
        self.dequeued += 1
        if step.gate is not None:
            self.parked.set()
            await step.gate.wait()
            self.parked.clear()
        if step.write:
            self.writes.append(Written(binding, delivery, self.render(delivery)))
        if step.error is not None:
            raise step.error
        if step.malformed is not None:
            return step.malformed  # type: ignore[return-value]  # deliberately wrong
        return Outcome(step.state, step.reason, step.evidence if step.write else None)

    def texts(self) -> list[str]:
        return [w.text for w in self.writes]
