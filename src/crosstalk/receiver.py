"""The one receiver chain every inbound message goes through (seed §5).

    authenticate (the ingress) → dedupe → hop chain → policy + admission → dispatch claim → inject

Rules this module enforces, and why:

- **Durable before acknowledged (R1).** Acceptance is journaled (``submitted``) before the
  chain goes on, the dispatch claim (``dispatching``) before the harness is touched, and the
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
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from crosstalk.core.admission import Admission, Limits
from crosstalk.core.hops import check_hop_chain, hop_token
from crosstalk.core.ids import new_message_id
from crosstalk.core.mailbox import bounce_text, build_entries
from crosstalk.core.message import DeliveryMode, Ingress, Kind, Message, Sender
from crosstalk.core.policy import TargetRole, authorize
from crosstalk.core.states import AskState, MessageState, check_transition
from crosstalk.harness.base import Binding, Delivery, Harness, Outcome
from crosstalk.store.journal import Journal, JournalError, RecordTooLarge

M = MessageState
log = logging.getLogger(__name__)


#: How long ``reply`` may answer an inform after it arrived (seed R7: inform routes expire).
INFORM_ROUTE_SECONDS = 3600.0


class ReceiverUnavailable(Exception):
    """The journal refused a write before acceptance: the message was not accepted."""


@dataclass(frozen=True)
class Result:
    message_id: str
    state: MessageState
    reason: str | None = None
    duplicate: bool = False
    evidence: str | None = None


@dataclass
class Entry:
    """What this receiver knows about one inbound message."""

    message_id: str
    sender: Sender
    kind: str
    state: MessageState
    ingress: str
    reason: str | None = None
    task_id: str | None = None
    continuation: bool = False
    binding: dict[str, Any] | None = None
    #: Present while the message may still be dispatched (in flight or resumable).
    message: Message | None = None
    ask: AskState | None = None
    reply_text: str | None = None
    evidence: str | None = None
    #: An ask's deadline, kept so a reply obligation can still be opened after dispatch (a
    #: late ``resolve`` of an unknown ask).
    deadline_seconds: int = 0
    #: The dispatch claim could not be journaled: never claimed, never sent, so a retry of the
    #: same message_id may dispatch it (R1) instead of finding it stranded in ``submitted``.
    stalled: bool = False
    #: When the message was admitted (journal time): an inform's reply route lasts an hour.
    arrived_at: float | None = None

    def route_open(self, now: float) -> bool:
        """Whether ``reply`` may still answer it (R7): an ask while open; an inform for
        :data:`INFORM_ROUTE_SECONDS` after it arrived."""
        if self.ask is not None:
            return self.ask is AskState.OPEN
        return self.arrived_at is None or now - self.arrived_at <= INFORM_ROUTE_SECONDS

    def result(self, *, duplicate: bool = False) -> Result:
        return Result(self.message_id, self.state, self.reason, duplicate, self.evidence)


Listener = Callable[[Entry], None]


def sender_record(sender: Sender) -> dict[str, Any]:
    return {"key": sender.key, "agent_id": sender.agent_id, "name": sender.name,
            "role": sender.role, "ingress": sender.ingress.value, "peer_pid": sender.peer_pid,
            "reply_address": sender.reply_address}


def sender_from_record(data: Mapping[str, Any]) -> Sender:
    ingress = data.get("ingress")
    return Sender(
        agent_id=data.get("agent_id") if isinstance(data.get("agent_id"), str) else None,
        name=data.get("name") if isinstance(data.get("name"), str) else None,
        role=data.get("role") if isinstance(data.get("role"), str) else None,
        ingress=Ingress(ingress) if ingress in {i.value for i in Ingress} else Ingress.A2A,
        peer_pid=data.get("peer_pid") if isinstance(data.get("peer_pid"), int) else None,
        reply_address=(data.get("reply_address")
                       if isinstance(data.get("reply_address"), str) else None),
    )


def message_record(msg: Message, binding: Binding | None) -> dict[str, Any]:
    refs = [r for r in (msg.task_id, msg.in_reply_to) if r]
    return {
        "subject": "message", "id": msg.message_id, "state": M.SUBMITTED.value,
        "sender": sender_record(msg.sender), "kind": msg.kind.value,
        "delivery": msg.delivery.value, "text": msg.text, "in_reply_to": msg.in_reply_to,
        "context_id": msg.context_id, "task_id": msg.task_id, "continuation": msg.continuation,
        "deadline_seconds": msg.deadline_seconds, "hop_chain": list(msg.hop_chain),
        "native": msg.native, "claimed": msg.claimed, "sent_at": msg.sent_at,
        "binding": binding.as_record() if binding else None, "refs": refs,
    }


def message_from_record(rec: Mapping[str, Any]) -> Message | None:
    """Rebuild the message a ``submitted`` record holds, or ``None`` if it is unreadable."""
    try:
        sender = sender_from_record(rec.get("sender") or {})
        return Message(
            message_id=str(rec["id"]), sender=sender, text=str(rec["text"]),
            kind=Kind(rec.get("kind", "inform")),
            delivery=DeliveryMode(rec.get("delivery", "immediate")),
            in_reply_to=rec.get("in_reply_to"), context_id=rec.get("context_id"),
            task_id=rec.get("task_id"), continuation=bool(rec.get("continuation")),
            deadline_seconds=int(rec.get("deadline_seconds") or 0),
            hop_chain=tuple(rec.get("hop_chain") or ()), native=bool(rec.get("native")),
            sent_at=rec.get("sent_at"),
        )
    except (KeyError, ValueError, TypeError):
        return None


@dataclass
class Receiver:
    """The chain for one agent. Single event loop; not thread-safe by design."""

    agent_id: str
    journal: Journal
    harness: Harness
    binding: Binding | None
    limits: Limits = field(default_factory=Limits)
    reply_address: str | None = None
    target_role: Callable[[], TargetRole] = TargetRole
    clock: Callable[[], float] = time.time
    entries: dict[str, Entry] = field(default_factory=dict)
    listeners: list[Listener] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.admission = Admission(self.limits)
        self.hop_token = hop_token(self.agent_id)

    # -- the chain -------------------------------------------------------------------------

    async def receive(self, msg: Message,
                      dispatch: Callable[[Entry], Awaitable[Result]] | None = None) -> Result:
        """Admit then dispatch ``msg`` — through ``dispatch`` (the agent's lane) if given."""
        run = dispatch or self.dispatch
        admitted = self.admit(msg)
        if isinstance(admitted, Result):
            prior = self.entries.get(msg.message_id)
            if (admitted.duplicate and prior is not None and prior.stalled
                    and prior.state is M.SUBMITTED and prior.message is not None):
                # Fix (R1, tests/unit/test_receiver.py): the sender was told the first attempt
                # failed (ReceiverUnavailable at the dispatch claim) and retries; returning the
                # durable ``submitted`` state left the message undispatched until a restart.
                prior.stalled = False
                return replace(await run(prior), duplicate=True)
            return admitted
        result = await run(admitted)
        if admitted.message_id != msg.message_id:  # a bounce notice went out in its place
            return self.entries[msg.message_id].result()
        return result

    def admit(self, msg: Message) -> Entry | Result:
        """Dedupe, checks and the durable ``submitted`` record, all without yielding.

        Returns the admitted :class:`Entry`, or the final :class:`Result` when the message
        stops here (duplicate or rejected).
        """
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
        try:
            self.journal.append(message_record(msg, self.binding))
        except RecordTooLarge:
            # Fix (R10): the persisted-record cap is an admission limit like the text size
            # (e.g. control characters JSON-escape sixfold). It was ReceiverUnavailable, an
            # outage the sender would retry forever; it is a deterministic rejection.
            self._release(msg.message_id, msg.kind.value)
            return self._reject(msg, "message_too_large")
        except JournalError as exc:
            self._release(msg.message_id, msg.kind.value)
            raise ReceiverUnavailable(f"journal refused the message: {exc}") from exc
        entry = Entry(msg.message_id, msg.sender, msg.kind.value, M.SUBMITTED,
                      msg.sender.ingress.value, task_id=msg.task_id,
                      continuation=msg.continuation,
                      binding=self.binding.as_record() if self.binding else None, message=msg,
                      deadline_seconds=msg.deadline_seconds, arrived_at=self.clock())
        self.entries[msg.message_id] = entry
        self._notify(entry)
        return entry

    def _bounce(self, msg: Message) -> Entry | Result:
        """A native reply from our own session: journal it bounced, never forward it.

        The session answered an injected message with its harness's own send (Claude's
        SendMessage to the reply address in the envelope). That frame has no correlation id,
        so guessing which message it answers could hand one asker another's answer (seed
        ADR 0009, live round 4). Instead the session is told, by a notice admitted here and
        dispatched like any message, which inbound messages it may answer with ``reply``.
        A bounce opens no route; a native answer to the notice is bounced again.
        """
        entry = self._record_final(msg, M.BOUNCED, "native_reply_not_forwarded",
                                   text=msg.text)
        now = self.clock()
        open_inbound = [
            e for e in build_entries(self.journal.replay().records)
            if e.sender_agent_id not in (None, self.agent_id) and e.reply is None
            and (e.ask == AskState.OPEN.value or (
                # Still dispatching counts: a session can answer natively before the injector
                # has the inbox's close (and the receipt grace) behind it (live, issue 5).
                e.ask is None
                and e.state in (M.ACCEPTED.value, M.QUEUED.value, M.DISPATCHING.value)
                and (known := self.entries.get(e.message_id)) is not None
                and known.route_open(now)))
        ]
        first_line = msg.text.splitlines()[0] if msg.text else ""
        notice = Message(message_id=new_message_id(),
                         sender=Sender(None, name="crosstalk", ingress=Ingress.LOCAL),
                         text=bounce_text(first_line, open_inbound), in_reply_to=None)
        admitted = self.admit(notice)
        return admitted if isinstance(admitted, Entry) else entry.result()

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

    def _release(self, message_id: str, kind: str) -> None:
        if kind == Kind.ASK.value:
            self.admission.release_ask(message_id)

    def _reject(self, msg: Message, reason: str) -> Result:
        return self._record_final(msg, M.REJECTED, reason, task_id=msg.task_id).result()

    def _record_final(self, msg: Message, state: MessageState, reason: str,
                      **extra: Any) -> Entry:
        """Journal a message that ends on arrival (rejected, bounced), then index it."""
        record = {"subject": "message", "id": msg.message_id, "state": state.value,
                  "reason": reason, "sender": sender_record(msg.sender), "kind": msg.kind.value,
                  "native": msg.native,
                  "binding": self.binding.as_record() if self.binding else None, **extra}
        try:
            self.journal.append(record)
        except JournalError as exc:
            raise ReceiverUnavailable(f"journal refused the {state.value} record: {exc}") from exc
        entry = Entry(msg.message_id, msg.sender, msg.kind.value, state,
                      msg.sender.ingress.value, reason=reason, task_id=msg.task_id)
        self.entries[msg.message_id] = entry
        self._notify(entry)
        return entry

    async def dispatch(self, entry: Entry) -> Result:
        """Claim the dispatch, inject, journal the outcome."""
        if entry.state is not M.SUBMITTED or entry.message is None:
            return entry.result()  # canceled (or already dispatched) while waiting
        msg = entry.message
        if self.binding is None:
            self._transition(entry, M.UNREACHABLE, "not_bound", required=True)
            entry.message = None
            # Fix: an unbound ask used to keep its admission slot forever.
            self._after_outcome(entry)
            return entry.result()
        try:
            self._transition(entry, M.DISPATCHING, None, required=True)
        except ReceiverUnavailable:
            entry.stalled = True  # nothing was claimed or sent: a retry may dispatch (R1)
            raise
        try:
            outcome = await self.harness.inject(self.binding,
                                                Delivery(msg, self.reply_address))
            if not isinstance(outcome, Outcome):
                outcome = Outcome(M.UNKNOWN, "malformed_harness_result")
        except asyncio.CancelledError:
            if self._claimed(entry):  # not already settled by a receipt (see below)
                self._transition(entry, M.UNKNOWN, "dispatch_cancelled", required=False)
            raise
        except Exception as exc:  # a disconnect after the claim is ambiguous by definition
            outcome = Outcome(M.UNKNOWN, f"inject_error: {type(exc).__name__}")
        entry.message = None  # never dispatched again
        if not self._claimed(entry):
            # Fix: resolve() (a Claude receipt reaching the uds ingress during the injector's
            # grace period) settled the claim while inject() was in flight. The later outcome
            # write raised IllegalTransition out of dispatch; the receipt is the better
            # evidence and resolve() already did the ask bookkeeping, so it stands.
            return entry.result()
        self._transition(entry, outcome.state, outcome.reason, evidence=outcome.evidence,
                         required=False, ask_record=self._ask_record(entry, outcome.state))
        self._after_outcome(entry)
        return entry.result()

    @staticmethod
    def _claimed(entry: Entry) -> bool:
        """Still held by this dispatch's claim (the state may change while inject awaits)."""
        return entry.state is M.DISPATCHING

    def _after_outcome(self, entry: Entry) -> None:
        if entry.kind == Kind.ASK.value and entry.state not in (M.ACCEPTED, M.QUEUED,
                                                                 M.UNKNOWN):
            # A delivered ask's slot is held by its open obligation; an unknown ask keeps its
            # slot: it may still be answered. Anything else frees it.
            self._release(entry.message_id, entry.kind)

    def cancel(self, message_id: str) -> bool:
        """Cancel a message that has not been claimed for dispatch (the A2A CancelTask race)."""
        entry = self.entries.get(message_id)
        if entry is None or entry.state is not M.SUBMITTED:
            return False
        self._transition(entry, M.CANCELED, "canceled", required=True)
        entry.message = None
        self._release(message_id, entry.kind)
        return True

    # -- state changes ---------------------------------------------------------------------

    def _transition(self, entry: Entry, state: MessageState, reason: str | None, *,
                    required: bool, evidence: str | None = None,
                    ask_record: dict[str, Any] | None = None) -> None:
        """Journal then apply a state change.

        ``required`` writes gate what happens next and raise :class:`ReceiverUnavailable`;
        a failed outcome write after the harness write makes the state ``unknown`` (R1).
        ``ask_record`` (the reply obligation a delivered ask opens) goes into the same write
        as the outcome: both are durable or neither is.
        """
        check_transition("message", entry.state, state)
        record: dict[str, Any] = {"subject": "message", "id": entry.message_id,
                                  "state": state.value, "reason": reason}
        if evidence:
            record["evidence"] = evidence
        try:
            self.journal.append_batch([record] if ask_record is None else [record, ask_record])
        except JournalError as exc:
            if required:
                raise ReceiverUnavailable(f"journal refused {state.value}: {exc}") from exc
            if state is not M.UNKNOWN and entry.state is M.DISPATCHING:
                state, reason, evidence = M.UNKNOWN, "journal_write_failed", None
            ask_record = None
        entry.state, entry.reason, entry.evidence = state, reason, evidence
        if ask_record is not None:
            entry.ask = AskState.OPEN
            self.admission.open_asks.add(entry.message_id)  # already reserved, or delivered
        self._notify(entry)

    def _ask_record(self, entry: Entry, state: MessageState) -> dict[str, Any] | None:
        """The open-ask record if moving ``entry`` to ``state`` opens its reply obligation.

        Fix: this used to be a second append after the outcome; when only it failed, the
        entry went ``accepted`` -> ``unknown`` (an edge the state table forbids) while the
        journal kept ``accepted``, so the sender and a restarted shim disagreed.
        """
        if entry.kind != Kind.ASK.value or entry.ask is not None or state not in (
                M.ACCEPTED, M.QUEUED):
            return None
        secs = entry.deadline_seconds
        return {"subject": "ask", "id": entry.message_id, "state": AskState.OPEN.value,
                "deadline_at": (self.clock() + secs) if secs > 0 else None,
                "sender": entry.sender.key, "refs": [r for r in (entry.task_id,) if r]}

    def close_ask(self, message_id: str, state: AskState, reply_text: str | None = None) -> Entry:
        """Answer, expire or close an open ask (journaled first); listeners complete tasks."""
        entry = self.entries.get(message_id)
        if entry is None or entry.ask is None:
            raise KeyError(message_id)
        check_transition("ask", entry.ask.value, state.value)
        record: dict[str, Any] = {"subject": "ask", "id": message_id, "state": state.value}
        if reply_text is not None:
            record["reply"] = reply_text
        try:
            self.journal.append(record)
        except JournalError as exc:
            raise ReceiverUnavailable(f"journal refused the ask update: {exc}") from exc
        entry.ask, entry.reply_text = state, reply_text
        self.admission.release_ask(message_id)
        self._notify(entry)
        return entry

    def resolve(self, message_id: str, state: MessageState, reason: str | None = None) -> None:
        """Apply an outcome learned after the fact (a receipt, a reconciler's evidence)."""
        entry = self.entries[message_id]
        # Fix: settling an unknown ask used to skip the ask bookkeeping: a proven delivery
        # opened no reply obligation, and a definite loss kept its admission slot forever.
        self._transition(entry, state, reason, required=True,
                         ask_record=self._ask_record(entry, state))
        self._after_outcome(entry)

    def _notify(self, entry: Entry) -> None:
        # A listener (the A2A task store, a mailbox view) reacts to a state already journaled;
        # its failure must not break the chain, e.g. strand a message in ``dispatching``.
        for listener in list(self.listeners):
            try:
                listener(entry)
            except Exception:
                log.exception("receiver %s: listener failed on %s", self.agent_id,
                              entry.message_id)

    # -- restart ---------------------------------------------------------------------------

    def restore(self, records: Iterable[Mapping[str, Any]]) -> list[Entry]:
        """Rebuild from the journal and settle what a crash left open (seed R2).

        Returns A2A first messages still ``submitted`` in this conversation: the A2A layer
        resumes them (re-running the chain from policy, dispatch included).
        """
        for rec in records:
            if rec.get("subject") == "message":
                self._restore_message(rec)
            elif rec.get("subject") == "ask":
                self._restore_ask(rec)
        resumable: list[Entry] = []
        for entry in self.entries.values():
            here = self.binding is not None and self.binding.same_conversation(entry.binding)
            if entry.state is M.DISPATCHING:
                entry.message = None
                self._transition(entry, M.UNKNOWN, "interrupted_during_dispatch", required=True)
            elif entry.state is M.SUBMITTED:
                self._settle_submitted(entry, here, resumable)
            if entry.ask is AskState.OPEN:
                if here:
                    self.admission.open_asks.add(entry.message_id)
                else:
                    # Its conversation is gone: no reply can come from this one, and an open
                    # ask kept forever would hold an admission slot and its records for good.
                    self.close_ask(entry.message_id, AskState.CLOSED)
        return resumable

    def _settle_submitted(self, entry: Entry, here: bool, resumable: list[Entry]) -> None:
        msg = entry.message
        if entry.ingress in (Ingress.UDS.value, Ingress.LOCAL.value):
            # uds and the shim's own notices have no task record to resume from: re-check.
            entry.message = None
            if msg is None or self.check(msg) is not None:
                self._transition(entry, M.REJECTED, "failed_recheck_after_restart",
                                 required=True)
            elif here:
                self._transition(entry, M.RECOVERED, "restart_before_dispatch", required=True)
            else:
                self._transition(entry, M.UNREACHABLE, "bound_to_another_conversation",
                                 required=True)
        elif not here:
            entry.message = None
            self._transition(entry, M.UNREACHABLE, "bound_to_another_conversation",
                             required=True)
        elif not entry.continuation and msg is not None:
            resumable.append(entry)
        # A stranded A2A continuation stays submitted: neither resumed nor surfaced (R2).

    def _restore_message(self, rec: Mapping[str, Any]) -> None:
        mid, state = rec.get("id"), rec.get("state")
        if not isinstance(mid, str) or state not in {s.value for s in MessageState}:
            return
        entry = self.entries.get(mid)
        if entry is None:
            msg = message_from_record(rec) if state == M.SUBMITTED.value else None
            sender = sender_from_record(rec.get("sender") or {})
            deadline = rec.get("deadline_seconds")
            entry = Entry(mid, sender, str(rec.get("kind", "inform")), M(state),
                          sender.ingress.value, reason=rec.get("reason"),
                          task_id=rec.get("task_id"),
                          continuation=bool(rec.get("continuation")),
                          binding=rec.get("binding"), message=msg,
                          deadline_seconds=deadline if isinstance(deadline, int) else 0,
                          arrived_at=ts if isinstance(ts := rec.get("ts"), (int, float))
                          else None)
            self.entries[mid] = entry
            return
        entry.state, entry.reason = M(state), rec.get("reason")
        entry.evidence = rec.get("evidence")
        if entry.state is not M.SUBMITTED:
            entry.message = None

    def _restore_ask(self, rec: Mapping[str, Any]) -> None:
        entry = self.entries.get(str(rec.get("id")))
        if entry is None or rec.get("state") not in {s.value for s in AskState}:
            return
        entry.ask = AskState(rec["state"])
        if isinstance(rec.get("reply"), str):
            entry.reply_text = rec["reply"]

    async def resume(self, entry: Entry) -> Result:
        """Re-run an A2A first message from policy, dispatch included (seed R2)."""
        msg = entry.message
        if msg is None or entry.state is not M.SUBMITTED:
            return entry.result()
        # Fix (R9): "re-runs the chain from policy", and admission is part of policy: a resumed
        # ask used to be dispatched without a slot, so open asks could exceed the limit.
        reason = self.check(msg) or self._reserve(msg)
        if reason is not None:
            self._transition(entry, M.REJECTED, reason, required=True)
            entry.message = None  # after the write: if it fails, the resume can be retried
            return entry.result()
        return await self.dispatch(entry)
