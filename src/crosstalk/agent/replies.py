"""The reply: a staged transaction (seed R4-R8) — obligation, answer the ask, forward.

One reply per inbound message (R4). Each stage is journaled before the next, so a crash
resumes from its stage (:func:`resume_reply`) instead of answering twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from crosstalk.core.ids import new_message_id
from crosstalk.core.records import ReplyEnded, ReplyStaged, parse_record
from crosstalk.core.states import (
    ASK_UNANSWERED,
    DELIVERED,
    AskEvent,
    AskState,
    MessageState,
    ReplyEvent,
    ReplyState,
    reply_event_for_send,
    reply_next,
    send_result_state,
)
from crosstalk.receiver import Inbound, Receiver
from crosstalk.store.journal import JournalError
from crosstalk.store.registry import RegistryError

if TYPE_CHECKING:
    from crosstalk.agent.core import Agent

log = logging.getLogger(__name__)

#: How long a reply to a message still being delivered waits for its outcome: a Claude frame
#: settles within its receipt grace (0.2 s) and a Codex ``turn/start`` within a request; only
#: a message still waiting for a pacing token (seen in the mailbox, not yet written) takes
#: longer, and its reply is refused as pending rather than hold the model's tool call.
DELIVERY_WAIT = 30.0


class ReplyRefused(Exception):
    """A reply the reply tool must refuse, with the contract's reason."""

    def __init__(self, reason: str, hint: str | None = None) -> None:
        super().__init__(reason)
        self.reason, self.hint = reason, hint


@dataclass
class ReplyProgress:
    """One inbound message's reply and how far it got (R5: a restart resumes from here)."""

    reply_id: str | None
    text: str | None
    #: The asker's agent_id.
    to: str | None
    state: ReplyState = ReplyState.PENDING
    #: What the reply tool returned (message_id, state, reason, in_reply_to), once sent.
    result: dict[str, Any] = field(default_factory=dict)


def reply_state(records: Iterable[Mapping[str, Any]]) -> dict[str, ReplyProgress]:
    """Each answered inbound message's reply (id, text, to, stage, result), from the journal."""
    replies: dict[str, ReplyProgress] = {}
    for raw in records:
        rec = parse_record(raw)
        if isinstance(rec, ReplyStaged):
            replies[rec.id] = ReplyProgress(rec.reply_id, rec.text, rec.to)
        elif isinstance(rec, ReplyEnded) and rec.id in replies:
            progress = replies[rec.id]
            progress.state, progress.result = rec.state, dict(rec.result)
    return replies


async def reply(agent: Agent, message_id: str, text: str) -> dict[str, Any]:
    """Answer an inbound message: obligation -> complete the ask -> forward to the asker.

    One reply per inbound message (R4): a repeat with the same text returns the first
    result; a different text is ``already_replied``. Each stage is journaled before the
    next, so a crash resumes from its stage instead of answering twice.
    """
    if agent.receiver is None or agent.journal is None:
        raise RegistryError("agent is not registered")
    entry = await _delivered(agent.receiver, message_id)
    if not entry.sender.verified or entry.sender.agent_id is None:
        raise ReplyRefused("sender_unverified", "the sender is not a registered agent; "
                           "answer with send_message if you know who it is")
    prior = agent.reply_states.get(message_id)
    ask = ask_entry(agent, message_id)
    if prior is not None:
        if prior.text != text:
            raise ReplyRefused("already_replied", "this message was already answered")
        if prior.state is not ReplyState.PENDING:
            return dict(prior.result)
    elif ask is not None and ask.ask in ASK_UNANSWERED:
        raise ReplyRefused("ask_closed", "the ask's deadline passed or it was closed; "
                           "send_message reaches the asker if it still matters")
    elif ask is not None and ask.ask is AskState.ANSWERED:
        # Answered through another message of its task (R6): one answer per ask.
        raise ReplyRefused("already_replied", "this ask was already answered")
    elif ask is None and not entry.route_open(agent.clock()):
        raise ReplyRefused("ask_closed", "an inform can be answered with reply for an "
                           "hour after it arrived; use send_message now")
    else:
        staged = ReplyStaged(id=message_id, state=reply_next(None, ReplyEvent.STAGED),
                             reply_id=new_message_id(), text=text, to=entry.sender.agent_id,
                             refs=(message_id,))
        try:
            agent.journal.append(staged.to_dict())
        except JournalError:
            raise ReplyRefused("journal_unavailable", "the reply could not be recorded; "
                               "nothing was sent, try again") from None
        prior = ReplyProgress(staged.reply_id, text, staged.to, staged.state)
        agent.reply_states[message_id] = prior
    return await complete_reply(agent, message_id, prior)


async def delivery_outcome(receiver: Receiver, entry: Inbound, timeout: float) -> Inbound:
    """``entry`` once its injection has an outcome (or ``timeout`` passed).

    A model can answer a message while it is still ``dispatching`` (the mailbox's
    ``delivering``): Claude shows a frame ~100 ms after its inbox reads it, and the injector
    learns the outcome only when the receipt grace ends. The reply waits for that outcome
    rather than answer first: only a delivery opens the obligation (ADR 0019), so neither the
    asker nor the journal is ever told "answered" for a message whose injection failed, and
    the asker's view keeps its order (delivered, then answered).
    """
    if entry.state is not MessageState.DISPATCHING:
        return entry
    settled = asyncio.Event()

    def on_change(changed: Inbound) -> None:
        if changed.message_id == entry.message_id and (
                changed.state is not MessageState.DISPATCHING):
            settled.set()

    receiver.listeners.append(on_change)
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(settled.wait(), timeout)
    finally:
        receiver.listeners.remove(on_change)
    return receiver.entries.get(entry.message_id, entry)


async def _delivered(receiver: Receiver, message_id: str) -> Inbound:
    """The delivered inbound message a reply answers (one still being delivered is waited
    for, :func:`delivery_outcome`); :class:`ReplyRefused` if there is none."""
    entry = receiver.entries.get(message_id)
    if entry is not None and entry.state is MessageState.DISPATCHING:
        entry = await delivery_outcome(receiver, entry, DELIVERY_WAIT)
        if entry.state not in DELIVERED:
            raise _not_delivered(entry)
    if entry is None or entry.state not in DELIVERED:
        raise ReplyRefused("no_such_message", "no delivered inbound message has that id; "
                           "see receive_message, or use send_message")
    return entry


def _not_delivered(entry: Inbound) -> ReplyRefused:
    """The refusal of a reply to a message whose delivery failed, or is still open."""
    if entry.state is MessageState.DISPATCHING:
        return ReplyRefused("delivery_pending", "that message is still being delivered; "
                            "call reply again in a moment")
    why = f"{entry.state.value}: {entry.reason}" if entry.reason else entry.state.value
    return ReplyRefused("not_delivered", f"that message was not delivered ({why}), so it "
                        "cannot be answered with reply; nothing was sent")


async def complete_reply(agent: Agent, message_id: str,
                         prior: ReplyProgress) -> dict[str, Any]:
    """The stages after the obligation: answer the ask (completes its task), forward."""
    assert agent.receiver is not None
    ask = ask_entry(agent, message_id)
    if ask is not None and ask.ask is AskState.OPEN:
        agent.receiver.end_ask(ask.message_id, AskEvent.ANSWERED, prior.text)
    return await forward_reply(agent, message_id, str(prior.to), prior)


def ask_entry(agent: Agent, message_id: str) -> Inbound | None:
    """The ask a reply to ``message_id`` answers: that message's own, or, for a
    continuation of an ask's task, the ask that opened it (R6)."""
    if agent.receiver is None:
        return None
    ask_id = agent.a2a.ask_of(message_id) if agent.a2a is not None else None
    if ask_id is None:
        return None
    entry = agent.receiver.entries.get(ask_id)
    this = agent.receiver.entries.get(message_id)
    if entry is None or this is None or entry.sender.agent_id != this.sender.agent_id:
        return None  # only the asker's own continuations answer for its ask
    return entry


async def resume_reply(agent: Agent, message_id: str, prior: ReplyProgress) -> None:
    try:
        await complete_reply(agent, message_id, prior)
    except Exception:
        log.exception("agent %s: resuming the reply to %s failed", agent.agent_id,
                      message_id)


async def forward_reply(agent: Agent, message_id: str, to_agent: str,
                        prior: ReplyProgress) -> dict[str, Any]:
    assert agent.journal is not None
    res = await agent.send(to_agent, prior.text or "", message_id=prior.reply_id,
                           in_reply_to=message_id)
    result = {"message_id": prior.reply_id, "state": send_result_state(res.state),
              "reason": res.reason, "in_reply_to": message_id}
    # Forwarded when delivered, unreachable when definitely not (or the asker is gone);
    # anything else (unknown) stays pending and is resumed later.
    event = reply_event_for_send(res.state, res.reason)
    if event is not None:
        state = reply_next(ReplyState.PENDING, event)
        if prior.state is ReplyState.PENDING:  # not ended meanwhile by a concurrent forward
            try:
                agent.journal.append(ReplyEnded(id=message_id, state=state,
                                                result=result).to_dict())
            except JournalError:
                # Forwarded, but not recorded: a resume re-sends with the same reply id, and
                # the asker's receiver answers that retry from its dedupe record.
                log.warning("agent %s: reply outcome not journaled", agent.agent_id)
        prior.state = state
    prior.result = result
    return result
