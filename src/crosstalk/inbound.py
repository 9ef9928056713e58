"""What the receiver knows about each inbound message, and what it answers the ingresses.

:class:`Inbound` is the receiver's in-memory view of one message (rebuilt from the journal on
restart, :mod:`crosstalk.recovery`); :class:`Result` is what an ingress is told;
:class:`ReceiverUnavailable` means nothing was accepted. The rules that move an entry are
:mod:`crosstalk.receiver`'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from crosstalk.core.message import Message, Sender
from crosstalk.core.states import AskState, MessageState

if TYPE_CHECKING:
    from crosstalk.store.commit import Group

#: How long ``reply`` may answer an inform after it arrived (seed R7: inform routes expire).
INFORM_ROUTE_SECONDS = 3600.0


class ReceiverUnavailable(Exception):
    """The journal refused a write before acceptance: the message was not accepted."""


class NeverAdmitted(ReceiverUnavailable):
    """A dispatch of a message whose own admission record failed: it was never accepted, and
    whoever admitted it answers its sender (not a failure of the dispatch lane)."""


@dataclass(frozen=True)
class Result:
    message_id: str
    state: MessageState
    reason: str | None = None
    duplicate: bool = False
    evidence: str | None = None


@dataclass
class Inbound:
    """What this receiver knows about one inbound message."""

    message_id: str
    sender: Sender
    kind: str
    state: MessageState
    ingress: str
    reason: str | None = None
    task_id: str | None = None
    continuation: bool = False
    binding: dict[str, Any] | None = None
    #: Present while the message may still be dispatched (in flight or resumable).
    message: Message | None = None
    ask: AskState | None = None
    reply_text: str | None = None
    evidence: str | None = None
    #: An ask's deadline, kept so a reply obligation can still be opened after dispatch (a
    #: late ``resolve`` of an unknown ask).
    deadline_seconds: int = 0
    #: The dispatch lock could not be journaled: never locked, never sent, so a retry of the
    #: same message_id may dispatch it (R1) instead of finding it stranded in ``submitted``.
    stalled: bool = False
    #: When the message was admitted (journal time): an inform's reply route lasts an hour.
    arrived_at: float | None = None
    #: The entry's last staged write while it is not yet durable (group commit): the entry
    #: moves only when it is, and a copy of the message waits for it.
    pending: Group | None = field(default=None, repr=False, compare=False)
    #: The ``submitted`` record's write (admission), kept to wait on and to learn its fate.
    admission: Group | None = field(default=None, repr=False, compare=False)
    #: A write the dispatch lock must follow and may share (an A2A task's first record).
    prerequisite: Group | None = field(default=None, repr=False, compare=False)
    #: The admission record was refused: the message was never accepted.
    failed: bool = False
    #: The dispatch lock the lane staged while the message still waited its turn (ADR 0045),
    #: until the dispatch that takes it over starts.
    locked_ahead: Group | None = field(default=None, repr=False, compare=False)

    def route_open(self, now: float) -> bool:
        """Whether ``reply`` may still answer it (R7): an ask while open; an inform for
        :data:`INFORM_ROUTE_SECONDS` after it arrived."""
        if self.ask is not None:
            return self.ask is AskState.OPEN
        return self.arrived_at is None or now - self.arrived_at <= INFORM_ROUTE_SECONDS

    @property
    def cancelable(self) -> bool:
        """Not locked for dispatch, nor with a write in flight (the lock, or its admission,
        is then taken first: a cancel loses)."""
        return self.state is MessageState.SUBMITTED and self.pending is None

    def result(self, *, duplicate: bool = False) -> Result:
        return Result(self.message_id, self.state, self.reason, duplicate, self.evidence)


Listener = Callable[[Inbound], None]


def answered(result: Result) -> asyncio.Future[Result]:
    """A dispatch that ends at once, shaped like one whose outcome is still being written."""
    done: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
    done.set_result(result)
    return done
