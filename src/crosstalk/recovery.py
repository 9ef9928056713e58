"""A receiver's restart: rebuild it from its journal and settle what a crash left open (R2).

Records are folded through the state table (:class:`~crosstalk.core.replay.Folder`): a
record the table does not reach from its subject's state is **not adopted** (the subject
keeps its last legal state); it is logged and listed in ``Receiver.replay_violations``.
Then, for this conversation's binding:

- a message a crash left ``dispatching`` becomes ``unknown`` and is never resent;
- a uds or local message left ``submitted`` is re-checked: ``recovered`` if it passes,
  ``rejected`` if not, ``unreachable`` if it belongs to another conversation;
- an A2A first message left ``submitted`` is returned for the A2A layer to resume (re-running
  the chain from policy); a stranded A2A continuation stays ``submitted``;
- an open ask of another conversation is closed (no reply can come from this one).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from crosstalk.core.message import Ingress, Sender
from crosstalk.core.records import (
    AskEnded,
    AskOpened,
    MessageChange,
    MessageFinal,
    MessageRecord,
    MessageSubmitted,
)
from crosstalk.core.replay import Folder
from crosstalk.core.states import AskEvent, AskState, MessageEvent, MessageState
from crosstalk.inbound import Inbound

if TYPE_CHECKING:
    from crosstalk.receiver import Receiver

M = MessageState
ME = MessageEvent
#: Logged as the receiver's own: restore is the receiver's step, split out for size only.
log = logging.getLogger("crosstalk.receiver")


def restore(receiver: Receiver, records: Iterable[Mapping[str, Any]]) -> list[Inbound]:
    """Rebuild ``receiver`` from ``records`` and settle them (the module's rules); return
    the A2A first messages still ``submitted`` in this conversation, for the A2A layer to
    resume (re-running the chain from policy, dispatch included)."""
    folder = Folder()
    for raw in records:
        record, violation = folder.step(raw)
        if violation is not None:
            log.warning("receiver %s: journal record not adopted: %s", receiver.agent_id,
                        violation)
            receiver.replay_violations.append(violation)
        elif isinstance(record, MessageSubmitted | MessageFinal | MessageChange):
            _restore_message(receiver, record)
        elif isinstance(record, AskOpened | AskEnded):
            _restore_ask(receiver, record)
    resumable: list[Inbound] = []
    for entry in receiver.entries.values():
        here = receiver.binding is not None and receiver.binding.same_conversation(entry.binding)
        if entry.state is M.DISPATCHING:
            entry.message = None
            receiver.apply_event(entry, ME.DISPATCH_INTERRUPTED,
                                 "interrupted_during_dispatch", required=True)
        elif entry.state is M.SUBMITTED:
            _settle_submitted(receiver, entry, here, resumable)
        if entry.ask is AskState.OPEN:
            if here:
                receiver.admission.open_asks.add(entry.message_id)
            else:
                # Its conversation is gone: no reply can come from this one, and an open
                # ask kept forever would hold an admission slot and its records for good.
                receiver.end_ask(entry.message_id, AskEvent.CLOSED)
    return resumable


def _settle_submitted(receiver: Receiver, entry: Inbound, here: bool,
                      resumable: list[Inbound]) -> None:
    msg = entry.message
    if entry.ingress in (Ingress.UDS.value, Ingress.LOCAL.value):
        # uds and the shim's own notices have no task record to resume from: re-check.
        entry.message = None
        if msg is None or receiver.check(msg) is not None:
            receiver.apply_event(entry, ME.REJECTED, "failed_recheck_after_restart",
                                 required=True)
        elif here:
            receiver.apply_event(entry, ME.RECOVERED, "restart_before_dispatch", required=True)
        else:
            receiver.apply_event(entry, ME.UNDELIVERABLE, "bound_to_another_conversation",
                                 required=True)
    elif not here:
        entry.message = None
        receiver.apply_event(entry, ME.UNDELIVERABLE, "bound_to_another_conversation",
                             required=True)
    elif not entry.continuation and msg is not None:
        resumable.append(entry)
    # A stranded A2A continuation stays submitted: neither resumed nor surfaced (R2).


def _restore_message(receiver: Receiver, rec: MessageRecord) -> None:
    entry = receiver.entries.get(rec.id)
    if entry is None:
        if isinstance(rec, MessageChange):
            # Its first record is gone (retention trimmed an old head, or a damaged
            # line): what the state says is all there is.
            entry = Inbound(rec.id, Sender(None), "inform", rec.state, Ingress.A2A.value,
                          reason=rec.reason, arrived_at=rec.ts)
        else:
            submitted = rec if isinstance(rec, MessageSubmitted) else None
            entry = Inbound(rec.id, rec.sender, rec.kind, rec.state, rec.sender.ingress.value,
                          reason=rec.reason if isinstance(rec, MessageFinal) else None,
                          task_id=rec.task_id,
                          continuation=submitted is not None and submitted.continuation,
                          binding=dict(rec.binding) if rec.binding is not None else None,
                          message=submitted.message() if submitted is not None else None,
                          deadline_seconds=(submitted.deadline_seconds
                                            if submitted is not None else 0),
                          arrived_at=rec.ts)
        receiver.entries[rec.id] = entry
        return
    entry.state = rec.state
    entry.reason = None if isinstance(rec, MessageSubmitted) else rec.reason
    entry.evidence = rec.evidence if isinstance(rec, MessageChange) else None
    if entry.state is not M.SUBMITTED:
        entry.message = None


def _restore_ask(receiver: Receiver, rec: AskOpened | AskEnded) -> None:
    entry = receiver.entries.get(rec.id)
    if entry is None:
        return
    entry.ask = rec.state
    if isinstance(rec, AskEnded) and rec.reply is not None:
        entry.reply_text = rec.reply
