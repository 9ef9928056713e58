"""The one receiver chain every inbound message goes through (seed §5).

    authenticate (the ingress) → dedupe → hop chain → policy + admission → dispatch lock → inject

Rules this module enforces, and why:

- **Durable before acknowledged (R1).** Acceptance is journaled (``submitted``) before the
  chain goes on, the dispatch lock (``dispatching``) before the harness is touched, and the
  outcome before it is returned. A failed write before the harness write raises
  :class:`ReceiverUnavailable` (nothing was accepted); a failed write after it turns the answer
  into ``unknown``, never ``accepted``.
- **Dedupe is atomic.** The check, the journal write and the index update run without an
  ``await`` in between, so two concurrent copies of one (sender, message_id) — even on two
  ingresses at once — cannot both reach the harness. A retry returns the prior state.
- **Native frames are exempt.** A Claude frame has no id of ours: it gets a fresh one and
  repeating the same text is legal (F6).
- **An ambiguous dispatch is never resent.** Once ``dispatching`` is journaled the message
  can only end in an outcome; a crash there replays as ``unknown`` (R2).
- **Admission rejects, never evicts.** Limit breaches are transient rejections that leave no
  dedupe record (a later retry may pass); policy, hop and size rejections are deterministic and
  are journaled, so a retry gets the same answer.
- **Every state write asks the table.** Each journaled move is an event of
  :mod:`crosstalk.core.states` (:meth:`Receiver.apply_event`), first records included.

What the receiver holds per message is :mod:`crosstalk.inbound`; how an entry moves (each
journaled event, through the group commit or at once) is :mod:`crosstalk.changes`; its restart
is :mod:`crosstalk.recovery`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from crosstalk import recovery
from crosstalk.changes import EntryChanges
from crosstalk.core.admission import Admission, Limits
from crosstalk.core.hops import check_hop_chain, hop_token
from crosstalk.core.ids import new_message_id
from crosstalk.core.mailbox import MailboxEntry, MailboxFold, bounce_text
from crosstalk.core.message import Ingress, Kind, Message, Sender, with_valid_unicode
from crosstalk.core.policy import TargetRole, authorize
from crosstalk.core.records import (
    MessageFinal,
    MessageSubmitted,
)
from crosstalk.core.replay import Violation
from crosstalk.core.states import (
    NATIVE_ANSWERABLE,
    AskState,
    MessageEvent,
    MessageState,
    message_next,
)
from crosstalk.harness.base import Binding, Delivery, Harness, Outcome
from crosstalk.inbound import (
    Inbound,
    Listener,
    NeverAdmitted,
    ReceiverUnavailable,
    Result,
    answered,
)
from crosstalk.store.commit import Group
from crosstalk.store.journal import Journal, JournalError, RecordTooLarge
from crosstalk.store.journal_read import ReadMark

M = MessageState
ME = MessageEvent
log = logging.getLogger(__name__)

#: The receiver's view of a message lives in :mod:`crosstalk.inbound`; callers import it here.
__all__ = ["Inbound", "Listener", "NeverAdmitted", "Receiver", "ReceiverUnavailable", "Result",
           "message_record"]


def message_record(msg: Message, binding: Binding | None) -> dict[str, Any]:
    """The journal record of an admitted message (its first, ``submitted``)."""
    return MessageSubmitted.record_of(msg, binding.as_record() if binding else None)


@dataclass
class Receiver(EntryChanges):
    """The chain for one agent. Single event loop; not thread-safe by design."""

    agent_id: str
    journal: Journal
    harness: Harness
    binding: Binding | None
    limits: Limits = field(default_factory=Limits)
    reply_address: str | None = None
    target_role: Callable[[], TargetRole] = TargetRole
    clock: Callable[[], float] = time.time
    entries: dict[str, Inbound] = field(default_factory=dict)
    listeners: list[Listener] = field(default_factory=list)
    #: Journal records :meth:`restore` did not adopt (illegal for the state table).
    replay_violations: list[Violation] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.admission = Admission(self.limits)
        self.hop_token = hop_token(self.agent_id)
        self._mailbox = MailboxFold()
        self._mailbox_mark: ReadMark | None = None
        #: Dispatches between their lock and their outcome's record (the lane's one, or none):
        #: an admission meanwhile is staged lazy, to ride with the lane's next write.
        self._injecting = 0

    def mailbox(self) -> list[MailboxEntry]:
        """Every message's mailbox entry, ordered by latest change: the journal folded as it
        grows, each record read once (``receive_message`` polls this)."""
        def restart() -> None:  # the journal was replaced (retention) or cut: fold anew
            self._mailbox = MailboxFold()
        def add(record: Mapping[str, Any]) -> None:  # the fold restart() left, not the old one
            self._mailbox.add(record)

        self._mailbox_mark = self.journal.read_since(self._mailbox_mark, add, restart)
        return self._mailbox.entries()

    def follow(self, fold: MailboxFold, mark: ReadMark) -> None:
        self._mailbox, self._mailbox_mark = fold, mark  # a start pass's, read up to mark

    # -- the chain -------------------------------------------------------------------------

    async def receive(self, msg: Message,
                      dispatch: Callable[[Inbound], Awaitable[Result]] | None = None, *,
                      fused: bool = False) -> Result:
        """Admit then dispatch ``msg`` — through ``dispatch`` (the agent's lane) if given.

        ``fused``: the admission is not awaited before the dispatch. Its record is staged and
        the dispatch lock, staged in the same turn when the lane is free, shares its write
        (one fsync before the harness, not two; ADR 0036). The lock is written only if the
        admission is, so a failed write accepted nothing and the sender's retry starts over.
        """
        run = dispatch or self.dispatch
        admitted = await (self._stage_admit(msg) if fused else self.admit(msg))
        if isinstance(admitted, Result):
            prior = self.entries.get(msg.message_id)
            if (admitted.duplicate and prior is not None and prior.stalled
                    and prior.state is M.SUBMITTED and prior.message is not None):
                # R1: the sender was told the first attempt failed (ReceiverUnavailable at the
                # dispatch lock) and retries; nothing was locked or sent, so the retry
                # dispatches it rather than leave it ``submitted`` until a restart.
                prior.stalled = False
                return replace(await run(prior), duplicate=True)
            return admitted
        try:
            result = await run(admitted)
        except ReceiverUnavailable:
            rejected = await self._admitted(admitted)  # the admission's own failure wins
            if isinstance(rejected, Result):
                return rejected
            raise
        if admitted.message_id != msg.message_id:  # a bounce notice went out in its place
            return self.entries[msg.message_id].result()
        return result

    async def admit(self, msg: Message) -> Inbound | Result:
        """Dedupe, checks and the durable ``submitted`` record.

        Returns the admitted :class:`Inbound` once its record is durable, or the final
        :class:`Result` when the message stops here (duplicate or rejected). Text that is not
        valid Unicode is repaired first (lone surrogates become U+FFFD, journaled as
        ``repaired``): never dropped.
        """
        admitted = await self._stage_admit(msg)
        if isinstance(admitted, Inbound):
            return await self._admitted(admitted)
        return admitted

    async def _stage_admit(self, msg: Message) -> Inbound | Result:
        """:meth:`stage_admit`, after any write in flight for the same message id: a copy is
        answered only with a state already durable."""
        await self.settled(msg.message_id)
        return self.stage_admit(msg)

    async def settled(self, message_id: str) -> Inbound | None:
        """The entry of ``message_id`` once no write of it is in flight (``None``: there is
        none, or its admission failed). The first copy's waiter resumes first, so whatever
        it does right after its write (an A2A task) is done before a copy looks."""
        while True:
            entry = self.entries.get(message_id)
            if entry is None or entry.pending is None:
                return entry
            await entry.pending.settled()

    async def _admitted(self, entry: Inbound) -> Inbound | Result:
        """Wait for ``entry``'s admission record: the entry, its rejection (too large), or
        :class:`ReceiverUnavailable` (nothing was accepted)."""
        group = entry.admission
        if group is None:
            return entry
        await group.settled()
        if isinstance(group.result, RecordTooLarge):
            return self.entries[entry.message_id].result()
        if isinstance(group.result, JournalError):
            raise ReceiverUnavailable(f"journal refused the message: {group.result}"
                                      ) from group.result
        return entry

    @property
    def injecting(self) -> bool:
        """A dispatch is between its lock and its outcome's record: the lane writes again
        soon, so a record that gates nothing may ride with that write (ADR 0038)."""
        return self._injecting > 0

    def stage_admit(self, msg: Message, *, lazy: bool = False) -> Inbound | Result:
        """Dedupe, checks, and the ``submitted`` record staged, all without yielding: the
        entry is indexed before its write, so a concurrent copy waits for it. ``lazy``: the
        caller stages an eager write in this same turn (ADR 0046), or the lane injects."""
        msg = with_valid_unicode(msg)
        if msg.native and msg.sender.agent_id == self.agent_id:
            return self._bounce(msg)
        prior = self.entries.get(msg.message_id)
        if prior is not None:
            if msg.native or prior.sender.key != msg.sender.key:
                # A fresh native id never collides; another sender reusing an id is refused
                # rather than answered with someone else's state.
                return Result(msg.message_id, M.REJECTED, "message_id_conflict")
            return prior.result(duplicate=True)
        reason = self.check(msg)
        if reason is not None:
            return self._reject(msg, reason)
        reason = self._reserve(msg)
        if reason is not None:
            return Result(msg.message_id, M.REJECTED, reason)  # transient: not journaled
        state = message_next(None, ME.ADMITTED)
        group = self.journal.commit.stage([message_record(msg, self.binding)],
                                          lazy=lazy or self.injecting)
        entry = Inbound(msg.message_id, msg.sender, msg.kind.value, state,
                      msg.sender.ingress.value, task_id=msg.task_id,
                      continuation=msg.continuation,
                      binding=self.binding.as_record() if self.binding else None, message=msg,
                      deadline_seconds=msg.deadline_seconds, arrived_at=self.clock())
        entry.pending = entry.admission = group
        self.entries[msg.message_id] = entry
        group.then(lambda: self._on_admission(entry, msg))
        return entry

    def _on_admission(self, entry: Inbound, msg: Message) -> None:
        group = entry.admission
        assert group is not None
        if entry.pending is group:
            entry.pending = None
        if group.written:
            self._notify(entry)
            return
        entry.message = None  # never dispatched: a queued dispatch finds it gone
        entry.failed = True
        if self.entries.get(msg.message_id) is entry:
            del self.entries[msg.message_id]
        self._release(msg.message_id, msg.kind.value)
        if isinstance(group.result, RecordTooLarge):
            # R10: the persisted-record cap is an admission limit like the text size (e.g.
            # control characters JSON-escape sixfold): a deterministic rejection, not an
            # outage the sender would retry forever.
            with contextlib.suppress(ReceiverUnavailable):
                self._reject(msg, "message_too_large")

    def _bounce(self, msg: Message) -> Inbound | Result:
        """A native reply from our own session: journal it bounced, never forward it.

        The session answered an injected message with its harness's own send (Claude's
        SendMessage to the reply address in the envelope). That frame has no correlation id,
        so guessing which message it answers could hand one asker another's answer (seed 000
        ADR 0009, seed §5). Instead the session is told, by a notice admitted here and
        dispatched like any message, which inbound messages it may answer with ``reply``.
        A bounce opens no route; a native answer to the notice is bounced again.
        """
        entry = self._record_final(msg, ME.BOUNCED, "native_reply_not_forwarded",
                                   text=msg.text)
        now = self.clock()
        open_inbound = [
            e for e in self.mailbox()
            if e.sender_agent_id not in (None, self.agent_id) and e.reply is None
            and (e.ask == AskState.OPEN.value or (
                # Still dispatching counts: a session can answer natively before the injector
                # has the inbox's close (and the receipt grace) behind it (live, issue 5).
                e.ask is None
                and e.state in NATIVE_ANSWERABLE
                and (known := self.entries.get(e.message_id)) is not None
                and known.route_open(now)))
        ]
        first_line = msg.text.splitlines()[0] if msg.text else ""
        notice = Message(message_id=new_message_id(),
                         sender=Sender(None, name="crosstalk", ingress=Ingress.LOCAL),
                         text=bounce_text(first_line, open_inbound), in_reply_to=None)
        admitted = self.stage_admit(notice)
        return admitted if isinstance(admitted, Inbound) else entry.result()

    def check(self, msg: Message) -> str | None:
        """The deterministic checks: hop chain (A2A only), policy, size."""
        if msg.sender.ingress is Ingress.A2A:
            reason = check_hop_chain(msg.hop_chain, self.hop_token)
            if reason is not None:
                return reason
        verdict = authorize(msg.kind.value, msg.sender, self.target_role())
        if not verdict.ok:
            return verdict.reason
        return self.admission.check_size(msg.text_bytes)

    def _reserve(self, msg: Message) -> str | None:
        if msg.kind is Kind.ASK:
            return self.admission.reserve_ask(msg.message_id)
        return None

    def _reject(self, msg: Message, reason: str) -> Result:
        return self._record_final(msg, ME.REJECTED, reason, task_id=msg.task_id).result()

    def _record_final(self, msg: Message, event: MessageEvent, reason: str, *,
                      task_id: str | None = None, text: str | None = None) -> Inbound:
        """Journal a message that ends on arrival (rejected, bounced), then index it."""
        state = message_next(None, event)
        record = MessageFinal(id=msg.message_id, state=state, reason=reason, sender=msg.sender,
                              kind=msg.kind.value, native=msg.native,
                              binding=self.binding.as_record() if self.binding else None,
                              task_id=task_id, text=text)
        try:
            self.journal.append(record.to_dict())
        except JournalError as exc:
            raise ReceiverUnavailable(f"journal refused the {state.value} record: {exc}") from exc
        entry = Inbound(msg.message_id, msg.sender, msg.kind.value, state,
                      msg.sender.ingress.value, reason=reason, task_id=msg.task_id)
        self.entries[msg.message_id] = entry
        self._notify(entry)
        return entry

    async def dispatch(self, entry: Inbound) -> Result:
        """Claim the dispatch, inject, journal the outcome."""
        return await (await self.dispatch_staged(entry))

    async def dispatch_staged(self, entry: Inbound) -> asyncio.Future[Result]:
        """:meth:`dispatch` up to the outcome's record, staged: the future gives the result
        once that record is durable. The lane dispatches the next message meanwhile, so the
        next dispatch lock shares the outcome's write (ADR 0036)."""
        ahead, entry.locked_ahead = entry.locked_ahead, None  # its lock, staged by the lane
        if ahead is None:
            while (entry.pending is not None and entry.pending is not entry.admission
                   and entry.pending is not entry.prerequisite):
                # Another dispatch of it has a write in flight: its state, once durable.
                await entry.pending.settled()
            if entry.failed:
                raise NeverAdmitted("journal refused the message")
            if entry.state is not M.SUBMITTED or entry.message is None:
                return answered(entry.result())  # canceled (or already dispatched) meanwhile
            if self.binding is None:
                await self._admitted(entry)
                self.apply_event(entry, ME.UNDELIVERABLE, "not_bound", required=True)
                entry.message = None
                # An unbound ask gives its admission slot back like any undelivered ask.
                self._after_outcome(entry)
                return answered(entry.result())
        self._injecting += 1
        try:
            return await self._lock_and_inject(entry, entry.message, ahead)
        finally:
            self._injecting -= 1

    def lock_ahead(self, entry: Inbound) -> bool:
        """Stage the dispatch lock of a uds message that waits next in the lane, so that it
        shares the write the lane stages now and is durable when its turn comes (ADR 0045).

        Only a uds message is locked ahead: it has no CancelTask to lose (seed 22) and no
        resume to miss (a uds message ``submitted`` at a restart is surfaced ``recovered``,
        never injected), so the one thing that changes is that a crash before its turn leaves
        it ``unknown`` where it would have been ``recovered``. Whether it was staged.
        """
        if (entry.ingress != Ingress.UDS.value or entry.state is not M.SUBMITTED
                or entry.message is None or entry.failed or entry.locked_ahead is not None
                or self.binding is None
                or (entry.pending is not None and entry.pending is not entry.admission)):
            return False
        entry.locked_ahead = self.stage_event(entry, ME.LOCKED_FOR_DISPATCH, None,
                                              required=True)
        return True

    async def release_locked_ahead(self, entry: Inbound) -> None:
        """A message locked ahead whose turn never came (its lane stopped first): journaled
        ``unknown`` like any dispatch cut short, as a restart would find it."""
        lock, entry.locked_ahead = entry.locked_ahead, None
        if lock is None:
            return
        await lock.settled()
        if lock.written and self._dispatch_held(entry):
            entry.message = None
            self.apply_event(entry, ME.DISPATCH_INTERRUPTED, "dispatch_cancelled",
                             required=False)

    async def _lock_and_inject(self, entry: Inbound, msg: Message | None,
                               lock: Group | None = None) -> asyncio.Future[Result]:
        """Journal the dispatch lock (or wait for the one :meth:`lock_ahead` staged), then
        inject; had the lock's write failed, nothing was locked or sent (R1)."""
        assert self.binding is not None
        if lock is None:
            # Staged after the admission when that is still in flight: one write for both.
            lock = self.stage_event(entry, ME.LOCKED_FOR_DISPATCH, None, required=True)
        await lock.settled()
        if not lock.written:
            if entry.failed:  # the lock followed its admission, which failed
                raise NeverAdmitted("journal refused the message")
            entry.stalled = True  # nothing was locked or sent: a retry may dispatch (R1)
            failure = lock.result
            raise ReceiverUnavailable(
                f"journal refused {ME.LOCKED_FOR_DISPATCH.value}: {failure}") from (
                failure if isinstance(failure, BaseException) else None)
        if msg is None or not self._dispatch_held(entry):
            return answered(entry.result())
        return await self._inject(entry, msg)

    async def _inject(self, entry: Inbound, msg: Message) -> asyncio.Future[Result]:
        """Inject a message whose dispatch lock is durable, and stage its outcome."""
        assert self.binding is not None
        try:
            outcome = await self.harness.inject(self.binding,
                                                Delivery(msg, self.reply_address))
            if not isinstance(outcome, Outcome):
                outcome = Outcome(M.UNKNOWN, "malformed_harness_result")
        except asyncio.CancelledError:
            if self._dispatch_held(entry):  # not already settled by a receipt (see below)
                self.apply_event(entry, ME.DISPATCH_INTERRUPTED, "dispatch_cancelled",
                                 required=False)
            raise
        except Exception as exc:  # a disconnect after the lock is ambiguous by definition
            outcome = Outcome(M.UNKNOWN, f"inject_error: {type(exc).__name__}")
        entry.message = None  # never dispatched again
        if not self._dispatch_held(entry):
            # resolve() (a Claude receipt reaching the uds ingress during the injector's grace
            # period) settled the message while inject() was in flight: the receipt is the
            # better evidence and resolve() did the ask bookkeeping, so it stands (the table
            # has no move from a settled state for the late outcome anyway).
            return answered(entry.result())
        group = self.stage_event(entry, ME.INJECTED, outcome.reason, outcome=outcome.state,
                                 evidence=outcome.evidence, required=False,
                                 ask_record=self._ask_record(entry, outcome.state),
                                 then=lambda: self._after_outcome(entry))
        done: asyncio.Future[Result] = asyncio.get_running_loop().create_future()

        def finish() -> None:  # after stage_event's own callback moved the entry
            if not done.done():
                done.set_result(entry.result())  # a lost write made it unknown

        group.then(finish)
        return done

    @staticmethod
    def _dispatch_held(entry: Inbound) -> bool:
        """Still held by this dispatch (the state may change while inject awaits)."""
        return entry.state is M.DISPATCHING

    def cancel(self, message_id: str) -> bool:
        """Cancel a message that has not been locked for dispatch (the A2A CancelTask race)."""
        entry = self.entries.get(message_id)
        if entry is None or not entry.cancelable:
            return False
        self.apply_event(entry, ME.CANCELED, "canceled", required=True)
        entry.message = None
        self._release(message_id, entry.kind)
        return True

    # -- restart ---------------------------------------------------------------------------

    def restore(self, records: Iterable[Mapping[str, Any]]) -> list[Inbound]:
        """Rebuild from the journal and settle what a crash left open (seed R2); see
        :func:`crosstalk.recovery.restore`. Returns the A2A first messages to resume."""
        return recovery.restore(self, records)

    def restorer(self) -> recovery.Restore:
        """The receiver's reader for a replay it shares with other readers (an agent's
        start reads its journal once for all of them); its ``finish()`` then does what
        :meth:`restore` does after reading."""
        return recovery.Restore(self)

    async def resume(self, entry: Inbound) -> Result:
        """Re-run an A2A first message from policy, dispatch included (seed R2)."""
        msg = entry.message
        if msg is None or entry.state is not M.SUBMITTED:
            return entry.result()
        # R9: "re-runs the chain from policy", and admission is part of policy: a resumed ask
        # takes a slot like a new one, so open asks never exceed the limit.
        reason = self.check(msg) or self._reserve(msg)
        if reason is not None:
            self.apply_event(entry, ME.REJECTED, reason, required=True)
            entry.message = None  # after the write: if it fails, the resume can be retried
            return entry.result()
        return await self.dispatch(entry)
