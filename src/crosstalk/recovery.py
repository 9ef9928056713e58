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

:class:`Restore` is the receiver's reader of a replay shared with the other readers of a
restart (:func:`crosstalk.core.replay.replay_into`): entries are rebuilt as the records stream
by, and a message body (:class:`~crosstalk.core.message.Message`) is rebuilt only for the few
messages still ``submitted`` at the end, not for every message the journal holds.
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
    Record,
    Unreadable,
)
from crosstalk.core.replay import Violation, replay_into
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
    reader = Restore(receiver)
    each = replay_into([reader])
    for raw in records:
        each(raw)
    return reader.finish()


class Restore:
    """The receiver's reader of a replay (:class:`~crosstalk.core.replay.Reader`).

    :meth:`step` only rebuilds memory (it runs while the journal streams, so it never
    writes); :meth:`finish` settles, writing to the journal, and returns what resumes.
    """

    def __init__(self, receiver: Receiver | None, *, agent_id: str | None = None) -> None:
        #: ``None`` for a reader that only rebuilds (a checkpoint's, :mod:`crosstalk.agent.
        #: start_pass`): it keeps its own entries, and :meth:`finish` is not for it.
        self.receiver = receiver
        self.agent_id = receiver.agent_id if receiver is not None else agent_id or "?"
        self.entries: dict[str, Inbound] = receiver.entries if receiver is not None else {}
        self.violations: list[Violation] = (receiver.replay_violations
                                            if receiver is not None else [])
        #: The first record of each message still ``submitted`` (as stored, and typed): its
        #: body, rebuilt at the end.
        self._bodies: dict[str, tuple[Mapping[str, Any], MessageSubmitted]] = {}
        # Entries share equal senders and binding dicts (nothing writes either): thousands
        # of messages from a few senders under one binding need not each hold a copy.
        self._senders: dict[Sender, Sender] = {}
        self._bindings: dict[tuple[tuple[str, Any], ...], dict[str, Any]] = {}

    def step(self, raw: Mapping[str, Any], record: Record | Unreadable,
             violation: Violation | None) -> None:
        if violation is not None:
            log.warning("receiver %s: journal record not adopted: %s", self.agent_id,
                        violation)
            self.violations.append(violation)
        elif isinstance(record, _MESSAGE_RECORDS):
            entry = self.entries.get(record.id)
            if entry is None:
                self.entries[record.id] = self._entry(record)
                if isinstance(record, MessageSubmitted):
                    self._bodies[record.id] = (raw, record)
            else:
                _restore_message(entry, record)
                if entry.state is not M.SUBMITTED:
                    self._bodies.pop(record.id, None)
        elif isinstance(record, _ASK_RECORDS):
            _restore_ask(self.entries, record)

    def finish(self) -> list[Inbound]:
        """Settle what the records left open (the module's rules); the A2A first messages to
        resume."""
        receiver = self.receiver
        if receiver is None:
            raise TypeError("a Restore without a receiver only rebuilds")
        for message_id, (_, first) in self._bodies.items():
            receiver.entries[message_id].message = first.message()
        self._bodies.clear()
        return _settle(receiver)

    def _entry(self, rec: MessageRecord) -> Inbound:
        """A message's entry from its first record (its ``message`` waits for
        :meth:`finish`)."""
        if isinstance(rec, MessageChange):
            # Its first record is gone (retention trimmed an old head, or a damaged
            # line): what the state says is all there is.
            return Inbound(rec.id, Sender(None), "inform", rec.state, Ingress.A2A.value,
                           reason=rec.reason, arrived_at=rec.ts)
        submitted = rec if isinstance(rec, MessageSubmitted) else None
        sender = self._senders.setdefault(rec.sender, rec.sender)
        return Inbound(rec.id, sender, rec.kind, rec.state, sender.ingress.value,
                       reason=rec.reason if isinstance(rec, MessageFinal) else None,
                       task_id=rec.task_id,
                       continuation=submitted is not None and submitted.continuation,
                       binding=self._binding(rec.binding),
                       deadline_seconds=(submitted.deadline_seconds
                                         if submitted is not None else 0),
                       arrived_at=rec.ts)

    def _binding(self, binding: Mapping[str, Any] | None) -> dict[str, Any] | None:
        if binding is None:
            return None
        key = tuple(binding.items())
        try:
            shared = self._bindings.get(key)
        except TypeError:  # a value that does not hash (not one the receiver writes)
            return dict(binding)
        if shared is None:
            shared = self._bindings[key] = dict(binding)
        return shared


def _settle(receiver: Receiver) -> list[Inbound]:
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


_MESSAGE_RECORDS = (MessageSubmitted, MessageFinal, MessageChange)
_ASK_RECORDS = (AskOpened, AskEnded)


def _restore_message(entry: Inbound, rec: MessageRecord) -> None:
    """A later record of a message that has its entry."""
    entry.state = rec.state
    entry.reason = None if isinstance(rec, MessageSubmitted) else rec.reason
    entry.evidence = rec.evidence if isinstance(rec, MessageChange) else None
    if entry.state is not M.SUBMITTED:
        entry.message = None


def _restore_ask(entries: Mapping[str, Inbound], rec: AskOpened | AskEnded) -> None:
    entry = entries.get(rec.id)
    if entry is None:
        return
    entry.ask = rec.state
    if isinstance(rec, AskEnded) and rec.reply is not None:
        entry.reply_text = rec.reply
