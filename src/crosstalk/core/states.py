"""Every state a journaled subject can be in, what moves it, and how the machines are coupled.

Rule 1 (after h11's ``_state.py``): callers say what **happened** to a subject (an event);
the table below says where that leads. An event the table does not list for the current
state raises :class:`IllegalTransition`, here and nowhere else. The receiver, the reply and
claim writers, the A2A task store, journal replay (:mod:`crosstalk.core.replay`) and
retention all read this one table, so an illegal move is an error in one place rather than a
bug in three.

Rule 2: some events carry the state they end in, because a collaborator decides it: a
harness reports an injection's outcome, a receipt or a reconciler settles an ambiguous one.
For those the table lists the outcomes the event may carry from each state.

Rule 3: this module knows nothing about sockets, harnesses or who is asking. The couplings
between machines are pure functions at the bottom of this file ("a delivered ask opens its
obligation", receipt → message, send result → reply); ADR 0004's message → task mapping,
the largest, is its own module beside it (:mod:`crosstalk.core.tasks`).

Subjects:

- ``message``: one inbound message at a receiver. ``submitted`` (deduped and journaled) →
  ``dispatching`` (a dispatch lock: from here on it is never resent) → an outcome.
  ``recovered`` is replay's verdict on a uds message that never got a dispatch lock (seed R2);
  ``bounced`` is a native reply the shim refused to forward (seed 000 ADR 0009, seed §5).
- ``ask``: the reply obligation an ask opens at its receiver: ``open`` until the reply tool
  answers it, its deadline passes, or its conversation goes away.
- ``task``: an A2A task at the receiving agent (journal-backed task store, seed S12). A
  record may repeat a task's state (a save that changes only metadata).
- ``reply``: the staged forward of an answer back to the asker: ``pending`` until it is
  ``forwarded`` or definitely ``unreachable``.
- ``claim``: this agent's owner (seed §7), keyed by the agent's own id: ``claimed`` (by an
  owner; a claim over an owner that is gone is ``claimed`` -> ``claimed``) until ``released``.
  ``claimed`` counts as unresolved so retention never drops the record that makes an agent a
  subagent; a released claim ages out like anything else.
- ``native_send``: an inform this agent put into a session without CrossTalk: ``dispatching``
  until the injection's outcome. Nothing waits on it, so nothing of it is unresolved.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property

from crosstalk.core.message import Kind


class Subject(StrEnum):
    MESSAGE = "message"
    ASK = "ask"
    TASK = "task"
    REPLY = "reply"
    CLAIM = "claim"
    NATIVE_SEND = "native_send"


class MessageState(StrEnum):
    SUBMITTED = "submitted"
    DISPATCHING = "dispatching"
    ACCEPTED = "accepted"
    QUEUED = "queued"
    REJECTED = "rejected"
    UNREACHABLE = "unreachable"
    UNKNOWN = "unknown"
    RECOVERED = "recovered"
    BOUNCED = "bounced"
    CANCELED = "canceled"  # an A2A CancelTask that won the race against the dispatch lock


class TaskState(StrEnum):
    """A2A task states as CrossTalk journals them (the wire names are TASK_STATE_*)."""

    SUBMITTED = "submitted"
    WORKING = "working"
    INPUT_REQUIRED = "input_required"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELED = "canceled"
    REJECTED = "rejected"


class AskState(StrEnum):
    OPEN = "open"
    ANSWERED = "answered"
    EXPIRED = "expired"
    CLOSED = "closed"


class ReplyState(StrEnum):
    PENDING = "pending"
    FORWARDED = "forwarded"
    UNREACHABLE = "unreachable"


class ClaimStatus(StrEnum):
    CLAIMED = "claimed"
    RELEASED = "released"


# -- events: what happened ------------------------------------------------------------------


class MessageEvent(StrEnum):
    ADMITTED = "admitted"  # deduped, checked and journaled
    REJECTED = "rejected"  # a deterministic check failed: on arrival, on restart, on resume
    BOUNCED = "bounced"  # a native reply from our own session, never forwarded
    LOCKED_FOR_DISPATCH = "locked_for_dispatch"
    INJECTED = "injected"  # carries the harness's outcome
    DISPATCH_INTERRUPTED = "dispatch_interrupted"  # cancelled, or a crash, after the lock
    UNDELIVERABLE = "undeliverable"  # no binding, or bound to another conversation
    CANCELED = "canceled"  # the sender canceled it before the lock
    RECOVERED = "recovered"  # a uds message a crash left unlocked passed its re-check
    #: An outcome learned after the fact: a harness receipt (:func:`receipt_settlement`), a
    #: reconciler's positive evidence, seed "Server.Resolve". Carries the outcome.
    SETTLED = "settled"


class AskEvent(StrEnum):
    OPENED = "opened"  # its message was delivered (:func:`opens_obligation`)
    ANSWERED = "answered"
    EXPIRED = "expired"
    CLOSED = "closed"  # its conversation went away


class ReplyEvent(StrEnum):
    STAGED = "staged"
    FORWARDED = "forwarded"
    FAILED = "failed"  # definitely not deliverable (:func:`reply_event_for_send`)


class ClaimEvent(StrEnum):
    CLAIMED = "claimed"
    RELEASED = "released"


class TaskEvent(StrEnum):
    CREATED = "created"
    REJECTED = "rejected"
    STARTED = "started"
    NEEDS_INPUT = "needs_input"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELED = "canceled"


class NativeSendEvent(StrEnum):
    ATTEMPTED = "attempted"
    INJECTED = "injected"  # carries the outcome


class IllegalTransition(ValueError):
    """A subject was asked to move along an edge the table does not have."""


# -- state sets, each spelt once --------------------------------------------------------------

M = MessageState
A = AskState
R = ReplyState
T = TaskState
C = ClaimStatus

#: The message reached the session's model: injected, or appended to its history (Codex).
DELIVERED: frozenset[MessageState] = frozenset({M.ACCEPTED, M.QUEUED})
#: Definitely reached no one (``unknown`` is neither delivered nor this).
UNDELIVERED: frozenset[MessageState] = frozenset({M.REJECTED, M.UNREACHABLE})
#: What an injection may end in (seed §8); also the states a send reports to its caller,
#: with ``rejected`` (:data:`SEND_RESULTS`).
INJECTION_OUTCOMES: frozenset[MessageState] = frozenset(
    {M.ACCEPTED, M.QUEUED, M.UNREACHABLE, M.UNKNOWN})
SEND_RESULTS: frozenset[MessageState] = INJECTION_OUTCOMES | {M.REJECTED}
#: An ask in these states still holds its admission slot: delivered (its obligation holds
#: it) or unknown (it may still be answered).
ASK_SLOT_HELD: frozenset[MessageState] = DELIVERED | {M.UNKNOWN}
#: A message its session may still be answering natively (the bounce lists it): delivered,
#: or still being delivered (a session can answer before the injector has the inbox's close).
NATIVE_ANSWERABLE: frozenset[MessageState] = DELIVERED | {M.DISPATCHING}
#: An ask that ended without an answer.
ASK_UNANSWERED: frozenset[AskState] = frozenset({A.EXPIRED, A.CLOSED})
#: What a settlement may end in from ``unknown``: only positive evidence settles it.
_SETTLED_FROM_UNKNOWN: frozenset[MessageState] = frozenset({M.ACCEPTED, M.QUEUED,
                                                            M.UNREACHABLE})

# -- the table --------------------------------------------------------------------------------

#: One next state, or the outcomes an event may carry.
Target = str | frozenset[str]


@dataclass(frozen=True)
class Machine:
    """One subject kind: the events that start it, the events each state takes, what is open.

    ``initial`` and ``edges`` are derived from the events: ``edges[s]`` is every state some
    event leads to from ``s`` (empty for a terminal state).
    """

    subject: str
    starts: Mapping[str, Target]
    events: Mapping[str, Mapping[str, Target]]
    unresolved: frozenset[str]
    #: A record may repeat the current state without a transition (a task's metadata save).
    repeatable: bool = False

    @cached_property
    def initial(self) -> frozenset[str]:
        return _targets(self.starts.values())

    @cached_property
    def edges(self) -> Mapping[str, frozenset[str]]:
        return {s: _targets(row.values()) for s, row in self.events.items()}

    def states(self) -> frozenset[str]:
        return frozenset(self.events)

    def is_terminal(self, state: str) -> bool:
        return not self.events[state]

    def next_state(self, state: str | None, event: str, outcome: str | None = None) -> str:
        """Where ``event`` leads from ``state`` (``None`` = the subject is new)."""
        if state is None:
            row = self.starts
        elif state in self.events:
            row = self.events[state]
        else:
            raise IllegalTransition(f"{self.subject}: unknown state {state!r}")
        target = row.get(event)
        here = "a new subject" if state is None else repr(state)
        if target is None:
            raise IllegalTransition(f"{self.subject}: {event!r} in {here} is not allowed")
        if isinstance(target, frozenset):
            if outcome not in target:
                raise IllegalTransition(
                    f"{self.subject}: {event!r} from {here} to {outcome!r} is not allowed")
            return outcome
        if outcome is not None and outcome != target:
            raise IllegalTransition(
                f"{self.subject}: {event!r} from {here} leads to {target!r}, not {outcome!r}")
        return target

    def reachable(self, state: str | None, new: str) -> bool:
        """Whether some sequence of events leads from ``state`` to ``new`` (one or more)."""
        frontier = set(self.initial) if state is None else set(self.edges.get(state, ()))
        seen: set[str] = set()
        while frontier:
            s = frontier.pop()
            if s == new:
                return True
            seen.add(s)
            frontier |= self.edges.get(s, frozenset()) - seen
        return False


def _targets(values: Iterable[Target]) -> frozenset[str]:
    out: set[str] = set()
    for t in values:
        out |= t if isinstance(t, frozenset) else {t}
    return frozenset(out)


def _machine(subject: Subject, starts: Mapping[str, Target],
             events: Mapping[str, Mapping[str, Target]], unresolved: set[str],
             *, repeatable: bool = False) -> Machine:
    return Machine(subject.value, dict(starts), {s: dict(row) for s, row in events.items()},
                   frozenset(unresolved), repeatable)


ME, AE, RE, CE, TE, NE = MessageEvent, AskEvent, ReplyEvent, ClaimEvent, TaskEvent, NativeSendEvent

_TASK_ENDS: dict[str, Target] = {TE.COMPLETED: T.COMPLETED, TE.FAILED: T.FAILED,
                                 TE.CANCELED: T.CANCELED}

MACHINES: Mapping[str, Machine] = {m.subject: m for m in (
    _machine(
        Subject.MESSAGE,
        starts={ME.ADMITTED: M.SUBMITTED, ME.REJECTED: M.REJECTED, ME.BOUNCED: M.BOUNCED},
        events={
            M.SUBMITTED: {ME.LOCKED_FOR_DISPATCH: M.DISPATCHING, ME.REJECTED: M.REJECTED,
                          ME.RECOVERED: M.RECOVERED, ME.UNDELIVERABLE: M.UNREACHABLE,
                          ME.CANCELED: M.CANCELED},
            M.DISPATCHING: {ME.INJECTED: INJECTION_OUTCOMES, ME.DISPATCH_INTERRUPTED: M.UNKNOWN,
                            ME.SETTLED: INJECTION_OUTCOMES},
            # Reconciliation may settle an ambiguous dispatch, but only with positive evidence.
            M.UNKNOWN: {ME.SETTLED: _SETTLED_FROM_UNKNOWN},
            M.ACCEPTED: {}, M.QUEUED: {}, M.REJECTED: {}, M.UNREACHABLE: {},
            M.RECOVERED: {}, M.BOUNCED: {}, M.CANCELED: {},
        },
        unresolved={M.SUBMITTED, M.DISPATCHING, M.UNKNOWN, M.RECOVERED},
    ),
    _machine(
        Subject.ASK,
        starts={AE.OPENED: A.OPEN},
        events={A.OPEN: {AE.ANSWERED: A.ANSWERED, AE.EXPIRED: A.EXPIRED, AE.CLOSED: A.CLOSED},
                A.ANSWERED: {}, A.EXPIRED: {}, A.CLOSED: {}},
        unresolved={A.OPEN},
    ),
    _machine(
        Subject.TASK,
        starts={TE.CREATED: T.SUBMITTED, TE.REJECTED: T.REJECTED},
        events={
            T.SUBMITTED: {TE.STARTED: T.WORKING, TE.REJECTED: T.REJECTED, **_TASK_ENDS},
            T.WORKING: {TE.NEEDS_INPUT: T.INPUT_REQUIRED, **_TASK_ENDS},
            T.INPUT_REQUIRED: {TE.STARTED: T.WORKING, **_TASK_ENDS},
            T.COMPLETED: {}, T.FAILED: {}, T.CANCELED: {}, T.REJECTED: {},
        },
        unresolved={T.SUBMITTED, T.WORKING, T.INPUT_REQUIRED},
        repeatable=True,
    ),
    _machine(
        Subject.REPLY,
        starts={RE.STAGED: R.PENDING},
        events={R.PENDING: {RE.FORWARDED: R.FORWARDED, RE.FAILED: R.UNREACHABLE},
                R.FORWARDED: {}, R.UNREACHABLE: {}},
        unresolved={R.PENDING},
    ),
    _machine(
        Subject.CLAIM,
        starts={CE.CLAIMED: C.CLAIMED},
        events={C.CLAIMED: {CE.RELEASED: C.RELEASED, CE.CLAIMED: C.CLAIMED},
                C.RELEASED: {CE.CLAIMED: C.CLAIMED}},
        unresolved={C.CLAIMED},
    ),
    _machine(
        Subject.NATIVE_SEND,
        starts={NE.ATTEMPTED: M.DISPATCHING},
        events={M.DISPATCHING: {NE.INJECTED: INJECTION_OUTCOMES},
                **{s: {} for s in INJECTION_OUTCOMES}},
        unresolved=set(),
    ),
)}


def machine(kind: str) -> Machine:
    try:
        return MACHINES[kind]
    except KeyError:
        raise IllegalTransition(f"no state machine for subject kind {kind!r}") from None


def process_event(subject: str, state: str | None, event: str,
                  outcome: str | None = None) -> str:
    """The state ``event`` moves ``subject`` to from ``state``; :class:`IllegalTransition`
    if the table does not list it. ``outcome`` is the state an outcome-carrying event names."""
    return machine(subject).next_state(state, event, outcome)


def message_next(state: MessageState | None, event: MessageEvent,
                 outcome: MessageState | None = None) -> MessageState:
    return MessageState(process_event(Subject.MESSAGE, state, event, outcome))


def ask_next(state: AskState | None, event: AskEvent) -> AskState:
    return AskState(process_event(Subject.ASK, state, event))


def reply_next(state: ReplyState | None, event: ReplyEvent) -> ReplyState:
    return ReplyState(process_event(Subject.REPLY, state, event))


def claim_next(state: ClaimStatus | None, event: ClaimEvent) -> ClaimStatus:
    return ClaimStatus(process_event(Subject.CLAIM, state, event))


def task_next(state: TaskState | None, event: TaskEvent) -> TaskState:
    return TaskState(process_event(Subject.TASK, state, event))


def check_transition(kind: str, prev: str | None, new: str) -> None:
    """Raise :class:`IllegalTransition` unless some event moves ``prev`` to ``new``
    (``None`` = new). For readers that see states, not events: replay and the task store."""
    m = machine(kind)
    if new not in m.events:
        raise IllegalTransition(f"{kind}: unknown state {new!r}")
    if prev is None:
        if new not in m.initial:
            raise IllegalTransition(f"{kind}: cannot start in {new!r}")
        return
    if prev not in m.events:
        raise IllegalTransition(f"{kind}: unknown state {prev!r}")
    if new not in m.edges[prev]:
        raise IllegalTransition(f"{kind}: {prev!r} -> {new!r} is not allowed")


def is_unresolved(kind: str, state: str) -> bool:
    m = MACHINES.get(kind)
    return m is not None and state in m.unresolved


# -- couplings between machines ---------------------------------------------------------------


#: The event that ends an open ask in each end state (for callers that name the end state).
ASK_EVENT_FOR: Mapping[AskState, AskEvent] = {
    A.ANSWERED: AE.ANSWERED, A.EXPIRED: AE.EXPIRED, A.CLOSED: AE.CLOSED,
}


def opens_obligation(kind: str, ask: AskState | None, state: MessageState) -> bool:
    """A delivered ask opens its reply obligation, once: moving a message of ``kind`` whose
    obligation is ``ask`` to ``state`` opens it (journaled in the same write as the move)."""
    return kind == Kind.ASK and ask is None and state in DELIVERED


def ask_deadline(now: float, deadline_seconds: int) -> float | None:
    """When an obligation opened at ``now`` expires; ``None`` for an ask without deadline."""
    return now + deadline_seconds if deadline_seconds > 0 else None


def releases_ask_slot(kind: str, state: MessageState) -> bool:
    """An ask's admission slot is freed by an outcome that is neither delivered nor unknown."""
    return kind == Kind.ASK and state not in ASK_SLOT_HELD


#: What a harness receipt settles an ``unknown`` message to (Claude's peer_message_status:
#: a held message the session's user released, denied or let expire).
_RECEIPT_SETTLES: Mapping[str, tuple[MessageState, str | None]] = {
    "delivered": (M.ACCEPTED, None),
    "denied": (M.UNREACHABLE, "receipt_denied"),
    "expired": (M.UNREACHABLE, "receipt_expired"),
}


def receipt_settlement(state: MessageState, status: str) -> tuple[MessageState, str | None] | None:
    """The (outcome, reason) a receipt with ``status`` settles a message in ``state`` to, as a
    :attr:`MessageEvent.SETTLED`; ``None`` when it settles nothing. Only ``unknown`` messages
    are settled: any other state already has better evidence than a late receipt."""
    if state is not M.UNKNOWN:
        return None
    return _RECEIPT_SETTLES.get(status)


#: Send results that mean the addressee is no more (the registry has no such agent now).
_GONE_REASONS = frozenset({"no_such_agent", "ambiguous_name"})
#: Refusals that may pass later: the receiver could not store the message (nothing accepted).
_RETRYABLE_REASONS = frozenset({"journal_unavailable"})


def reply_event_for_send(state: str, reason: str | None) -> ReplyEvent | None:
    """What a forward's send result means for the reply: forwarded when delivered, failed when
    definitely not deliverable (or the asker is gone), ``None`` (stays pending, resumed
    later or sent again by a repeated reply) otherwise: ``unknown``, or a refusal that may
    pass later."""
    if state in DELIVERED:
        return ReplyEvent.FORWARDED
    if reason in _RETRYABLE_REASONS:
        return None
    if state in UNDELIVERED or reason in _GONE_REASONS:
        return ReplyEvent.FAILED
    return None


def send_result_state(state: str) -> str:
    """A send's state as the tools report it: one of :data:`SEND_RESULTS`, else ``unknown``."""
    return state if state in SEND_RESULTS else M.UNKNOWN.value
