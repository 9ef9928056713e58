"""Claims (seed §7): this agent as a claim's target — check, journal, adopt, republish, tell.

A claim makes this agent a subagent of its claimer: only the owner may send it commands. The
latest claim record journaled under this session decides the role (:func:`claim_state`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from crosstalk.core.ids import new_message_id
from crosstalk.core.message import Ingress, Kind, Message, Sender
from crosstalk.core.policy import ClaimState, ControlResult, check_claim, check_release
from crosstalk.core.records import ClaimRecord, parse_record
from crosstalk.core.states import ClaimEvent, ClaimStatus, claim_next
from crosstalk.receiver import ReceiverUnavailable
from crosstalk.store.journal import JournalError
from crosstalk.store.registry import RegistryError

if TYPE_CHECKING:
    from crosstalk.agent.core import Agent

log = logging.getLogger(__name__)

#: Who the target session is told a claim or release came through.
CROSSTALK_SENDER = Sender(agent_id=None, name="crosstalk", ingress=Ingress.LOCAL)


def claim_state(records: Iterable[Mapping[str, Any]],
                 session: tuple[str, str] | None = None) -> ClaimState:
    """The latest claim record in an agent's journal decides its role (seed §7).

    With ``session`` = (harness, session_ref), only records journaled under that session
    count: a resume of the same session keeps its claim (the journal replays it, seed §9),
    but a claim recorded under another binding never applies to this one.
    """
    owner: str | None = None
    for raw in records:
        rec = parse_record(raw)
        if not isinstance(rec, ClaimRecord):
            continue
        if session is not None:
            binding = rec.binding
            if binding is None or (binding.get("harness"),
                                   binding.get("session_ref")) != session:
                continue
        owner = rec.owner
    return ClaimState(owner)


def effective_claim(agent: Agent) -> ClaimState:
    """The claim as policy sees it: an owner that is no longer registered counts as absent
    (:meth:`Registry.live_owner`); the journaled claim itself is kept."""
    if agent.claim.owner is None or agent.registry.live_owner(agent.claim.owner) is not None:
        return agent.claim
    return ClaimState()


async def apply_control(agent: Agent, sender: Sender, op: str) -> ControlResult:
    """A verified peer's claim or release of this agent (the A2A server's control hook).

    Check -> journal -> adopt -> republish -> tell the session. Check, journal write and
    adoption run without an ``await`` in between, so two concurrent claims cannot both
    pass the check. The journal record is the claim: if it cannot be written nothing
    changes. A descriptor that fails to republish is logged (policy reads the journaled
    state, not the descriptor); the session's notice is best effort and its receiver
    state is reported.
    """
    current = agent.effective_claim()
    if agent.journal is None or agent.receiver is None:
        return ControlResult(False, "not_registered", current.role, current.owner,
                             failed=True)
    if op == "claim":
        verdict = check_claim(sender, agent.agent_id, current)
        owner, event = sender.agent_id, ClaimEvent.CLAIMED
    elif op == "release":
        verdict = check_release(sender, agent.agent_id, current)
        owner, event = None, ClaimEvent.RELEASED
    else:
        return ControlResult(False, "bad_control", current.role, current.owner)
    if not verdict.ok:
        return ControlResult(False, verdict.reason, current.role, current.owner)
    binding = agent.receiver.binding
    # The journaled claim (not the effective one): a claim over an owner that is gone is
    # claimed -> claimed.
    status = claim_next(ClaimStatus.CLAIMED if agent.claim.owner is not None else None, event)
    record = ClaimRecord(id=agent.agent_id, state=status, owner=owner, by=sender.agent_id,
                         by_name=sender.name, op=op,
                         previous=agent.claim.owner if agent.claim.owner != owner else None,
                         binding=binding.as_record() if binding is not None else None)
    try:
        agent.journal.append(record.to_dict())
    except JournalError as exc:
        log.error("agent %s: %s by %s not journaled: %s", agent.agent_id, op,
                  sender.agent_id, exc)
        return ControlResult(False, "journal_unavailable", current.role, current.owner,
                             failed=True)
    agent.claim = ClaimState(owner)
    publish_claim(agent)
    notice = await tell_session(agent, sender, op)
    return ControlResult(True, None, agent.claim.role, agent.claim.owner, notice=notice)


def publish_claim(agent: Agent) -> None:
    reg = agent.registration
    base = reg.descriptor if reg is not None else None
    base = base or agent.descriptor
    if reg is None or base is None:
        return
    updated = replace(base, role=agent.claim.role, owner=agent.claim.owner)
    try:
        reg.publish(updated)
    except (OSError, RegistryError) as exc:
        log.error("agent %s: descriptor not republished after a claim change (%s); "
                  "list_agents shows the old role until the next publish", agent.agent_id,
                  exc)
        return
    agent.descriptor = updated


async def tell_session(agent: Agent, by: Sender, op: str) -> str | None:
    """Inject the claim/release notice (an inform from the shim itself, journaled)."""
    if agent.receiver is None:
        return None
    who = f"{by.name or 'an agent'} (agent {by.agent_id})"
    text = (f"{who} has claimed this session as its subagent: only it may send you "
            "commands now." if op == "claim"
            else f"{who} has released this session; it is a primary again.")
    msg = Message(message_id=new_message_id(), sender=CROSSTALK_SENDER, text=text,
                  kind=Kind.INFORM, sent_at=agent.clock())
    try:
        result = await agent.receiver.receive(msg)
    except ReceiverUnavailable as exc:
        log.warning("agent %s: %s notice not delivered: %s", agent.agent_id, op, exc)
        return "not_journaled"
    return result.state.value
