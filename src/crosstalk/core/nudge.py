"""The send nudge (seed 000 §4 "Messaging limits and the nudge"): a hint, never a guard.

CrossTalk does not limit how many messages a session sends. Instead each agent counts its
sends per peer (the peer's agent_id, or ``harness:session_ref`` for a native session), and when
a count reaches :data:`NUDGE_FIRST` (30), then 60, 120, 240 and so on, doubling, the send
result's hint asks the model whether the exchange is still making progress. The send itself is
delivered as usual.

What counts: every send from ``send_message``, ``ask`` and ``reply``, except

- one that came back ``rejected`` or ``unreachable`` (it reached no one; a model that keeps
  retrying an unreachable peer is therefore never nudged);
- one to a name that matches no session (reason ``no_such_agent``; the seed's ``unknown``,
  reported ``rejected`` since issue 12). The seed names the inform case; the rule here applies
  to every kind, since the reason is the same: it reached no peer;
- a retried reply (one reply per inbound message, R4: the retry returns the first result and
  is not a second send).

**The numbers are guesses** (the seed says so): whether models heed the hint is unmeasured.
The nudge also misses fan-out (one message to many peers, each below the threshold), restarts
(the count lives in memory and resets), failed sends, ``crosstalk send`` and any client that
goes around the shim, native bounces, and Claude's own SendMessage.

Pure: no I/O, no clock. The caller journals each firing (:meth:`Nudge.record`; the journal adds
the time) and puts :func:`combine_hint` into the send result.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from crosstalk.core.records import NudgeRecord
from crosstalk.core.states import UNDELIVERED

#: The first count that fires a nudge; the next ones double it (60, 120, 240, ...). A guess.
NUDGE_FIRST = 30

#: Outcomes that reached no peer and so are never counted.
NOT_COUNTED_STATES: frozenset[str] = UNDELIVERED

#: The send kinds the tools produce (``reply`` may also be reported as the inform it travels as).
SEND_KINDS = frozenset({"inform", "command", "ask", "reply"})


@dataclass(frozen=True)
class Nudge:
    """One firing: ``count`` sends to ``peer`` so far, and the hint for the model."""

    peer: str
    count: int
    hint: str

    def record(self) -> NudgeRecord:
        """The journal record of this firing (the journal stamps ``seq`` and ``ts``)."""
        return NudgeRecord(peer=self.peer, count=self.count)


def is_threshold(count: int, first: int = NUDGE_FIRST) -> bool:
    """True when ``count`` is ``first * 2**k`` for some ``k >= 0``."""
    if count < first or count % first:
        return False
    q = count // first
    return q & (q - 1) == 0


def nudge_hint(peer_label: str, count: int) -> str:
    return (f"You have now sent {count} messages to {peer_label} in this session. "
            f"Check whether the exchange with {peer_label} is making progress; if it is not, "
            "you may stop messaging it, or tell your user. (This message was delivered.)")


def combine_hint(existing: str | None, nudge: Nudge) -> str:
    """Append the nudge's hint to a hint the send result already carries."""
    if existing is None or not existing.strip():
        return nudge.hint
    return f"{existing.rstrip()}\n{nudge.hint}"


@dataclass
class NudgeCounter:
    """Send counts of one sending agent, per peer, in memory (reset on restart)."""

    first: int = NUDGE_FIRST
    _counts: dict[str, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.first < 1:
            raise ValueError(f"first must be at least 1, got {self.first}")

    def count(self, peer: str) -> int:
        return self._counts.get(peer, 0)

    def record(self, peer: str, outcome_state: str, *, kind: str, no_such_agent: bool = False,
               retried_reply: bool = False, peer_name: str | None = None) -> Nudge | None:
        """Count one send to ``peer`` with its outcome; return a :class:`Nudge` if one fires.

        ``peer_name`` (optional) is how the hint names the peer; by default it names ``peer``.
        """
        if kind not in SEND_KINDS:
            raise ValueError(f"unknown send kind {kind!r}; expected one of "
                             f"{', '.join(sorted(SEND_KINDS))}")
        if not peer:
            raise ValueError("peer must be a non-empty key (agent_id or harness:session_ref)")
        if outcome_state in NOT_COUNTED_STATES or no_such_agent or retried_reply:
            return None
        n = self._counts.get(peer, 0) + 1
        self._counts[peer] = n
        if not is_threshold(n, self.first):
            return None
        return Nudge(peer, n, nudge_hint(peer_name or peer, n))
