"""The trust table (seed §7) and the claim rules: who may send what to whom.

``kind`` is a routing hint chosen by the sending model, not a trust boundary; the table exists
to stop forged or unauthorised ``command`` reaching a model. A rejected message is never
downgraded and delivered anyway (F7): the text would carry the same request.

=========  ==========================================  ===============================
kind       to a subagent                               to a primary
=========  ==========================================  ===============================
inform     any registered agent; unverified allowed    any; unverified allowed
ask        verified senders only                       verified senders only
command    its owner only                              any registered primary
other      rejected                                    rejected
=========  ==========================================  ===============================
"""

from __future__ import annotations

from dataclasses import dataclass

from crosstalk.core.message import Ingress, Kind, Sender

PRIMARY = "primary"
SUBAGENT = "subagent"


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str | None = None

    @classmethod
    def allow(cls) -> Verdict:
        return cls(True)

    @classmethod
    def deny(cls, reason: str) -> Verdict:
        return cls(False, reason)


@dataclass(frozen=True)
class TargetRole:
    """The receiving agent's role and owner at the moment of the check."""

    role: str = PRIMARY
    owner: str | None = None  # agent_id of the owner when role == subagent


def authorize(kind: str, sender: Sender, target: TargetRole) -> Verdict:
    """Apply the trust table; identity comes only from the verified ``sender``."""
    try:
        k = Kind(kind)
    except ValueError:
        return Verdict.deny("unknown_kind")
    if sender.ingress is Ingress.UDS and k is not Kind.INFORM:
        # The uds ingress has no kind encoding beyond inform (seed §5).
        return Verdict.deny("uds_inform_only")
    if k is Kind.INFORM:
        return Verdict.allow()
    if not sender.verified:
        return Verdict.deny("sender_unverified")
    if k is Kind.ASK:
        return Verdict.allow()
    # command
    if target.role == SUBAGENT:
        if target.owner is not None and sender.agent_id == target.owner:
            return Verdict.allow()
        return Verdict.deny("command_owner_only")
    if sender.role == PRIMARY:
        return Verdict.allow()
    return Verdict.deny("command_primary_only")


@dataclass(frozen=True)
class ClaimState:
    """An agent's role as its journal says: unclaimed (primary) or owned by ``owner``."""

    owner: str | None = None

    @property
    def role(self) -> str:
        return SUBAGENT if self.owner else PRIMARY


def check_claim(claimer: Sender, target_id: str, current: ClaimState) -> Verdict:
    """Any registered primary may claim an unclaimed registered agent, never itself."""
    if not claimer.verified:
        return Verdict.deny("sender_unverified")
    if claimer.agent_id == target_id:
        return Verdict.deny("cannot_claim_self")
    if claimer.role != PRIMARY:
        return Verdict.deny("claimer_not_primary")
    if current.owner is not None:
        return Verdict.deny("already_claimed")
    return Verdict.allow()


def check_release(releaser: Sender, target_id: str, current: ClaimState) -> Verdict:
    """Only the owner releases; an agent never releases itself."""
    if not releaser.verified:
        return Verdict.deny("sender_unverified")
    if releaser.agent_id == target_id:
        return Verdict.deny("cannot_release_self")
    if current.owner is None:
        return Verdict.deny("not_claimed")
    if current.owner != releaser.agent_id:
        return Verdict.deny("not_owner")
    return Verdict.allow()


@dataclass(frozen=True)
class ControlResult:
    """What a claim or release did at the target (the A2A ``crosstalk.control_result``).

    ``role``/``owner`` are the target's state after the request (unchanged when refused).
    ``failed`` marks a refusal that is the target's own fault (its journal refused the
    record), not a verdict: the same request may succeed later. ``notice`` is the receiver
    state of the inform that told the target session (``None`` when nothing was sent).
    """

    ok: bool
    reason: str | None
    role: str
    owner: str | None
    failed: bool = False
    notice: str | None = None

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"ok": self.ok, "reason": self.reason, "role": self.role,
                                  "owner": self.owner}
        if self.notice is not None:
            out["notice"] = self.notice
        return out
