"""How a receiver's entry moves: each change an event of the state table, journaled first.

Two ways to journal a change. :meth:`EntryChanges.apply_event` writes at once (a sync append,
which takes whatever is staged ahead of it into the same write). :meth:`EntryChanges.stage_event`
goes through the journal's group commit (:mod:`crosstalk.store.commit`): the entry moves only
in the write's callback, once the records are durable — so a waiter that was cancelled cannot
leave the entry behind its journal — and until then it is ``pending``: a copy of the message
waits for it, a cancel finds it taken (ADR 0036).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from crosstalk.core.admission import Admission
from crosstalk.core.message import Kind
from crosstalk.core.records import AskEnded, AskOpened, MessageChange
from crosstalk.core.states import (
    ASK_EVENT_FOR,
    AskEvent,
    AskState,
    IllegalTransition,
    MessageEvent,
    MessageState,
    ask_deadline,
    ask_next,
    message_next,
    opens_obligation,
    receipt_settlement,
    releases_ask_slot,
)
from crosstalk.inbound import Inbound, Listener, ReceiverUnavailable
from crosstalk.store.commit import Group
from crosstalk.store.journal import Journal, JournalError

M = MessageState
ME = MessageEvent
log = logging.getLogger(__name__)


class EntryChanges:
    """The receiver's state changes (a base of :class:`crosstalk.receiver.Receiver`)."""

    agent_id: str
    journal: Journal
    clock: Callable[[], float]
    entries: dict[str, Inbound]
    listeners: list[Listener]
    admission: Admission

    def _release(self, message_id: str, kind: str) -> None:
        if kind == Kind.ASK.value:
            self.admission.release_ask(message_id)

    def _after_outcome(self, entry: Inbound) -> None:
        if releases_ask_slot(entry.kind, entry.state):
            # A delivered ask's slot is held by its open obligation; an unknown ask keeps its
            # slot: it may still be answered. Anything else frees it.
            self._release(entry.message_id, entry.kind)

    def apply_event(self, entry: Inbound, event: MessageEvent, reason: str | None, *,
                    required: bool, outcome: MessageState | None = None,
                    evidence: str | None = None, ask_record: AskOpened | None = None) -> None:
        """Ask the table where ``event`` leads, journal that, then apply it.

        ``required`` writes gate what happens next and raise :class:`ReceiverUnavailable`;
        a failed outcome write after the harness write makes the state ``unknown`` (R1), as a
        restart would find it. ``ask_record`` (the reply obligation a delivered ask opens)
        goes into the same write as the outcome: both are durable or neither is.
        """
        state, batch = self._event_records(entry, event, reason, outcome=outcome,
                                           evidence=evidence, ask_record=ask_record)
        try:
            self.journal.append_batch(batch)
        except JournalError as exc:
            if required:
                raise ReceiverUnavailable(f"journal refused {state.value}: {exc}") from exc
            self._event_lost(entry, state, reason, evidence)
            return
        self._event_applied(entry, state, reason, evidence, ask_record)

    def stage_event(self, entry: Inbound, event: MessageEvent, reason: str | None, *,
                    required: bool, outcome: MessageState | None = None,
                    evidence: str | None = None, ask_record: AskOpened | None = None,
                    then: Callable[[], None] | None = None) -> Group:
        """Stage the event's records; the entry moves when they are durable (in the write's
        callback, so a cancelled waiter cannot leave it behind its journal). Until then the
        entry is ``pending``: a copy of the message waits, a cancel finds it taken."""
        state, batch = self._event_records(entry, event, reason, outcome=outcome,
                                           evidence=evidence, ask_record=ask_record)
        group = self.journal.commit.stage(batch, after=entry.pending)
        entry.pending = group

        def written() -> None:
            if entry.pending is group:
                entry.pending = None
            if group.written:
                self._event_applied(entry, state, reason, evidence, ask_record)
            elif not required:
                self._event_lost(entry, state, reason, evidence)
            if then is not None:
                then()

        group.then(written)
        return group

    @staticmethod
    def _event_records(entry: Inbound, event: MessageEvent, reason: str | None, *,
                       outcome: MessageState | None, evidence: str | None,
                       ask_record: AskOpened | None
                       ) -> tuple[MessageState, list[dict[str, Any]]]:
        state = message_next(entry.state, event, outcome)
        record = MessageChange(id=entry.message_id, state=state, reason=reason,
                               evidence=evidence).to_dict()
        return state, [record] if ask_record is None else [record, ask_record.to_dict()]

    def _event_lost(self, entry: Inbound, state: MessageState, reason: str | None,
                    evidence: str | None) -> None:
        """A change that gates nothing could not be journaled: a dispatch's outcome becomes
        ``unknown``, as a restart would find it (R1)."""
        if state is not M.UNKNOWN and entry.state is M.DISPATCHING:
            state = message_next(entry.state, ME.DISPATCH_INTERRUPTED)
            reason, evidence = "journal_write_failed", None
        self._event_applied(entry, state, reason, evidence, None)

    def _event_applied(self, entry: Inbound, state: MessageState, reason: str | None,
                       evidence: str | None, ask_record: AskOpened | None) -> None:
        entry.state, entry.reason, entry.evidence = state, reason, evidence
        if ask_record is not None:
            entry.ask = ask_record.state
            self.admission.open_asks.add(entry.message_id)  # already reserved, or delivered
        self._notify(entry)

    def _ask_record(self, entry: Inbound, state: MessageState) -> AskOpened | None:
        """The open-ask record if moving ``entry`` to ``state`` opens its reply obligation.

        It is written in the outcome's own batch: as a second append, a failure of only it
        would leave the journal ``accepted`` while the entry had to become ``unknown``.
        """
        if not opens_obligation(entry.kind, entry.ask, state):
            return None
        return AskOpened(id=entry.message_id, state=ask_next(None, AskEvent.OPENED),
                         deadline_at=ask_deadline(self.clock(), entry.deadline_seconds),
                         sender_key=entry.sender.key,
                         refs=tuple(r for r in (entry.task_id,) if r))

    def close_ask(self, message_id: str, state: AskState, reply_text: str | None = None) -> Inbound:
        """Answer, expire or close an open ask (the end ``state`` names the event)."""
        entry = self.entries.get(message_id)
        if entry is None or entry.ask is None:
            raise KeyError(message_id)
        event = ASK_EVENT_FOR.get(state)
        if event is None:
            raise IllegalTransition(f"ask: no event ends an ask in {state.value!r}")
        return self.end_ask(message_id, event, reply_text)

    def end_ask(self, message_id: str, event: AskEvent, reply_text: str | None = None) -> Inbound:
        """Answer, expire or close an open ask (journaled first); listeners complete tasks."""
        entry = self.entries.get(message_id)
        if entry is None or entry.ask is None:
            raise KeyError(message_id)
        state = ask_next(entry.ask, event)
        try:
            self.journal.append(AskEnded(id=message_id, state=state, reply=reply_text).to_dict())
        except JournalError as exc:
            raise ReceiverUnavailable(f"journal refused the ask update: {exc}") from exc
        entry.ask, entry.reply_text = state, reply_text
        self.admission.release_ask(message_id)
        self._notify(entry)
        return entry

    def resolve(self, message_id: str, state: MessageState, reason: str | None = None) -> None:
        """Apply an outcome learned after the fact (a receipt, a reconciler's evidence)."""
        entry = self.entries[message_id]
        # Settling an unknown ask does the ask bookkeeping too: a proven delivery opens its
        # reply obligation, a definite loss frees its admission slot.
        self.apply_event(entry, ME.SETTLED, reason, outcome=state, required=True,
                         ask_record=self._ask_record(entry, state))
        self._after_outcome(entry)

    def settle_by_receipt(self, message_id: str, status: str) -> MessageState | None:
        """Settle an ``unknown`` message by a harness receipt's ``status``
        (:func:`~crosstalk.core.states.receipt_settlement`); the new state, or ``None`` if the
        receipt settles nothing (no such message, not unknown, a status that proves nothing).
        Raises :class:`ReceiverUnavailable` if the settlement cannot be journaled."""
        entry = self.entries.get(message_id)
        settled = receipt_settlement(entry.state, status) if entry is not None else None
        if settled is None:
            return None
        self.resolve(message_id, *settled)
        return settled[0]

    def _notify(self, entry: Inbound) -> None:
        # A listener (the A2A task store, a mailbox view) reacts to a state already journaled;
        # its failure must not break the chain, e.g. strand a message in ``dispatching``.
        for listener in list(self.listeners):
            try:
                listener(entry)
            except Exception:
                log.exception("receiver %s: listener failed on %s", self.agent_id,
                              entry.message_id)

