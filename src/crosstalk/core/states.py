"""Every state a journaled subject can be in, and every legal move between them.

Rule 1 (after h11's ``_state.py``): every transition of a message, an ask or a reply
obligation is written in the table below and nowhere else. The receiver, journal replay, the
A2A task store and retention all ask this module, so an illegal move is an error in one place
rather than a bug in three.

Rule 2: this module knows nothing about sockets, harnesses or who is asking; it only answers
"may X go to Y" and "is X still somebody's business" (unresolved work is kept by retention).

Subjects:

- ``message``: one inbound message at a receiver. ``submitted`` (deduped and journaled) →
  ``dispatching`` (a dispatch claim: from here on it is never resent) → an outcome.
  ``recovered`` is replay's verdict on a uds message that never got a claim (seed R2);
  ``bounced`` is a native reply the shim refused to forward (ADR 0009).
- ``ask``: the reply obligation an ask opens at its receiver: ``open`` until the reply tool
  answers it, its deadline passes, or its conversation goes away.
- ``task``: an A2A task at the receiving agent (journal-backed task store, seed S12).
- ``reply``: the staged forward of an answer back to the asker: ``pending`` until it is
  ``forwarded`` or definitely ``unreachable``.
- ``claim``: this agent's owner (seed §7), keyed by the agent's own id: ``claimed`` (by an
  owner; a claim over an owner that is gone is ``claimed`` -> ``claimed``) until ``released``.
  ``claimed`` counts as unresolved so retention never drops the record that makes an agent a
  subagent; a released claim ages out like anything else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum


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
    CANCELED = "canceled"  # an A2A CancelTask that won the race against the dispatch claim


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


class IllegalTransition(ValueError):
    """A subject was asked to move along an edge the table does not have."""


@dataclass(frozen=True)
class Machine:
    """One subject kind: where it may start, where it may go, and what is still open."""

    initial: frozenset[str]
    edges: Mapping[str, frozenset[str]]
    unresolved: frozenset[str]

    def states(self) -> frozenset[str]:
        return frozenset(self.edges)

    def is_terminal(self, state: str) -> bool:
        return not self.edges[state]


def _m(initial: set[str], edges: dict[str, set[str]], unresolved: set[str]) -> Machine:
    return Machine(
        initial=frozenset(initial),
        edges={k: frozenset(v) for k, v in edges.items()},
        unresolved=frozenset(unresolved),
    )


M = MessageState
A = AskState
R = ReplyState
T = TaskState
C = ClaimStatus

MACHINES: Mapping[str, Machine] = {
    "message": _m(
        initial={M.SUBMITTED, M.REJECTED, M.BOUNCED},
        edges={
            M.SUBMITTED: {M.DISPATCHING, M.REJECTED, M.RECOVERED, M.UNREACHABLE, M.CANCELED},
            M.DISPATCHING: {M.ACCEPTED, M.QUEUED, M.UNKNOWN, M.UNREACHABLE},
            # Reconciliation may settle an ambiguous dispatch, but only with positive evidence.
            M.UNKNOWN: {M.ACCEPTED, M.QUEUED, M.UNREACHABLE},
            M.ACCEPTED: set(),
            M.QUEUED: set(),
            M.REJECTED: set(),
            M.UNREACHABLE: set(),
            M.RECOVERED: set(),
            M.BOUNCED: set(),
            M.CANCELED: set(),
        },
        unresolved={M.SUBMITTED, M.DISPATCHING, M.UNKNOWN, M.RECOVERED},
    ),
    "ask": _m(
        initial={A.OPEN},
        edges={A.OPEN: {A.ANSWERED, A.EXPIRED, A.CLOSED}, A.ANSWERED: set(),
               A.EXPIRED: set(), A.CLOSED: set()},
        unresolved={A.OPEN},
    ),
    "task": _m(
        initial={T.SUBMITTED, T.REJECTED},
        edges={
            T.SUBMITTED: {T.WORKING, T.COMPLETED, T.FAILED, T.CANCELED, T.REJECTED},
            T.WORKING: {T.COMPLETED, T.FAILED, T.CANCELED, T.INPUT_REQUIRED},
            T.INPUT_REQUIRED: {T.WORKING, T.COMPLETED, T.FAILED, T.CANCELED},
            T.COMPLETED: set(), T.FAILED: set(), T.CANCELED: set(), T.REJECTED: set(),
        },
        unresolved={T.SUBMITTED, T.WORKING, T.INPUT_REQUIRED},
    ),
    "reply": _m(
        initial={R.PENDING},
        edges={R.PENDING: {R.FORWARDED, R.UNREACHABLE}, R.FORWARDED: set(), R.UNREACHABLE: set()},
        unresolved={R.PENDING},
    ),
    "claim": _m(
        initial={C.CLAIMED},
        edges={C.CLAIMED: {C.RELEASED, C.CLAIMED}, C.RELEASED: {C.CLAIMED}},
        unresolved={C.CLAIMED},
    ),
}


def machine(kind: str) -> Machine:
    try:
        return MACHINES[kind]
    except KeyError:
        raise IllegalTransition(f"no state machine for subject kind {kind!r}") from None


def check_transition(kind: str, prev: str | None, new: str) -> None:
    """Raise :class:`IllegalTransition` unless ``prev → new`` is in the table (``None`` = new)."""
    m = machine(kind)
    if new not in m.edges:
        raise IllegalTransition(f"{kind}: unknown state {new!r}")
    if prev is None:
        if new not in m.initial:
            raise IllegalTransition(f"{kind}: cannot start in {new!r}")
        return
    if prev not in m.edges:
        raise IllegalTransition(f"{kind}: unknown state {prev!r}")
    if new not in m.edges[prev]:
        raise IllegalTransition(f"{kind}: {prev!r} -> {new!r} is not allowed")


def is_unresolved(kind: str, state: str) -> bool:
    m = MACHINES.get(kind)
    return m is not None and state in m.unresolved
