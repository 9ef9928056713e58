"""What this agent sends: to peers over A2A (messages, claims), and native informs into sessions
without CrossTalk (seed §3).
"""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING

import httpx

from crosstalk.a2a import client as a2a_client
from crosstalk.a2a.peers import PeerCards
from crosstalk.a2a.transport import new_http_client
from crosstalk.core.ids import new_message_id
from crosstalk.core.message import DeliveryMode, Ingress, Kind, Message, Sender
from crosstalk.core.records import NativeSendAttempted, NativeSendEnded
from crosstalk.core.states import MessageState, NativeSendEvent, Subject, process_event
from crosstalk.harness.base import Delivery, Discovery, Outcome, Session
from crosstalk.receiver import ReceiverUnavailable
from crosstalk.store.journal import JournalError
from crosstalk.store.registry import Descriptor, RegistryError

if TYPE_CHECKING:
    from crosstalk.agent.core import Agent

log = logging.getLogger(__name__)
#: The peers' cards an agent keeps, with the pooled HTTP client they were kept on (a stopped
#: agent closes its client; the next one starts with no cards).
_cards: weakref.WeakKeyDictionary[Agent, tuple[httpx.AsyncClient, PeerCards]] = (
    weakref.WeakKeyDictionary())

def native_send_next(state: MessageState | None, event: NativeSendEvent,
                     outcome: MessageState | None = None) -> MessageState:
    """Where ``event`` moves a native send (the table's ``native_send`` machine)."""
    return MessageState(process_event(Subject.NATIVE_SEND, state, event, outcome))


async def control_peer(agent: Agent, to: str, op: str) -> tuple[Descriptor | None,
                                                          a2a_client.ControlOutcome]:
    """Claim or release the agent named ``to`` (name or agent_id), as this agent.

    An agent never claims or releases itself: refused here, without a round trip. The
    target decides everything else; identity travels only as this agent's bearer token.
    """
    target = peer(agent, to)
    if isinstance(target, str):
        return None, a2a_client.ControlOutcome(False, "rejected", target)
    if target.agent_id == agent.agent_id:
        reason = "cannot_claim_self" if op == "claim" else "cannot_release_self"
        return target, a2a_client.ControlOutcome(False, "rejected", reason)
    if target.a2a_url is None:
        return target, a2a_client.ControlOutcome(False, "unreachable", "no_a2a_listener")
    text = (f"{agent.name} asks to {op} this session (a CrossTalk control request; "
            "it is applied by the shim, never delivered as a message).")
    outcome = await a2a_client.control(target.a2a_url, agent.token, op, text=text,
                                       expect_name=target.name, httpx_client=http_client(agent),
                                       cards=peer_cards(agent))
    return target, outcome


def peer(agent: Agent, to: str) -> Descriptor | str:
    """The one live agent ``to`` names (name or agent_id), else the reason there is none."""
    targets = agent.registry.find(to)
    if len(targets) != 1:
        return "no_such_agent" if not targets else "ambiguous_name"
    return targets[0]


def http_client(agent: Agent) -> httpx.AsyncClient:
    """One HTTP client per agent: peers' connections are reused (~5 ms a send, not ~35)."""
    if agent.http is None:
        agent.http = new_http_client()
    return agent.http


def peer_cards(agent: Agent) -> PeerCards:
    """The peers' cards this agent keeps between sends, tied to its pooled HTTP client."""
    http = http_client(agent)
    kept = _cards.get(agent)
    if kept is None or kept[0] is not http:
        kept = _cards[agent] = (http, PeerCards())
    return kept[1]


async def send(agent: Agent, to: str | Descriptor, text: str, *, kind: str = "inform",
               delivery: str = "immediate", deadline_seconds: int = 0,
               message_id: str | None = None, in_reply_to: str | None = None,
               return_immediately: bool = False,
               until_delivered: bool = False) -> a2a_client.SendResult:
    """Send to a registered agent over A2A, as this agent: by name or agent_id, or by the
    descriptor a caller already resolved (no second registry scan)."""
    target = to if isinstance(to, Descriptor) else peer(agent, to)
    if isinstance(target, str):  # no_such_agent / ambiguous_name: definitely sent nowhere
        return a2a_client.SendResult(message_id="", state="rejected", reason=target)
    if target.a2a_url is None:
        return a2a_client.SendResult(message_id="", state="unreachable",
                                     reason="no_a2a_listener")
    return await a2a_client.send(
        target.a2a_url, agent.token, text, kind=kind, delivery=delivery,
        httpx_client=http_client(agent), cards=peer_cards(agent),
        deadline_seconds=deadline_seconds, message_id=message_id, in_reply_to=in_reply_to,
        return_immediately=return_immediately, until_delivered=until_delivered,
        expect_name=target.name)


async def send_native(agent: Agent, discovery: Discovery, session: Session, text: str, *,
                      delivery: str = "immediate") -> a2a_client.SendResult:
    """An inform into a session without CrossTalk, put in by this shim (seed §3).

    The intent is journaled before anything is sent (a failed write sends nothing), the
    outcome after. The frame's ``from`` is this agent's uds ingress: a native answer comes
    back here, where a session without CrossTalk is an unverified sender (test 26).
    """
    if agent.journal is None or agent.uds is None:
        raise RegistryError("agent is not registered")
    mid = new_message_id()
    agent.native_sends.add(mid)
    to = f"{session.harness}:{session.session_ref}"
    try:
        agent.journal.append(NativeSendAttempted(
            id=mid, state=native_send_next(None, NativeSendEvent.ATTEMPTED), to=to,
            to_name=session.name).to_dict())
    except JournalError as exc:
        raise ReceiverUnavailable(str(exc)) from None
    claim = agent.effective_claim()
    msg = Message(message_id=mid, text=text, kind=Kind.INFORM,
                  delivery=DeliveryMode(delivery), sent_at=agent.clock(),
                  sender=Sender(agent_id=agent.agent_id, name=agent.name, role=claim.role,
                                ingress=Ingress.LOCAL))
    try:
        outcome = await discovery.send_native(session, Delivery(msg, str(agent.uds.path)))
    except Exception as exc:  # after the attempt began: ambiguous, never resent
        log.warning("agent %s: native send to %s failed: %r", agent.agent_id, to, exc)
        outcome = Outcome(MessageState.UNKNOWN, "native_send_failed")
    ended = native_send_next(MessageState.DISPATCHING, NativeSendEvent.INJECTED, outcome.state)
    agent.journal_event(NativeSendEnded(id=mid, state=ended, to=to, reason=outcome.reason))
    return a2a_client.SendResult(message_id=mid, state=outcome.state.value,
                                 reason=outcome.reason)
