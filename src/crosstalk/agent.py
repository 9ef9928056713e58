"""One registered agent: its locks, journal, receiver, uds ingress, A2A listener, descriptor.

The order of :meth:`Agent.start` is the seed's (§3 "Publish order and ownership"): take the
agent lock and the name, replay the journal, bind the uds ingress and the A2A listener,
then publish the descriptor (temp + rename). Until the descriptor is published nobody can
find the agent, so nobody can send to a half-built one; :meth:`Agent.stop` undoes it in
reverse and removes only what this instance wrote.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import httpx

from crosstalk import proc
from crosstalk.a2a import client as a2a_client
from crosstalk.a2a.server import A2AServer
from crosstalk.config import ensure_private_dir, journal_path, uds_path_for
from crosstalk.core.admission import Limits
from crosstalk.core.ids import agent_id_for, new_instance_id, new_message_id
from crosstalk.core.mailbox import RECEIPT_RECORD
from crosstalk.core.message import DeliveryMode, Ingress, Kind, Message, Sender
from crosstalk.core.naming import name_candidates
from crosstalk.core.policy import (
    ClaimState,
    ControlResult,
    TargetRole,
    Verdict,
    check_claim,
    check_release,
)
from crosstalk.core.states import AskState, ClaimStatus, MessageState, ReplyState
from crosstalk.harness.base import (
    Binding,
    ControlSink,
    Delivery,
    Discovery,
    Harness,
    Outcome,
    Receipt,
    Reconciler,
    Session,
)
from crosstalk.ingress.uds import UdsIngress
from crosstalk.receiver import Entry, Receiver, ReceiverUnavailable
from crosstalk.store.journal import Journal, JournalError
from crosstalk.store.registry import (
    Descriptor,
    NameChoice,
    Registration,
    Registry,
    RegistryError,
    own_process_identity,
)

log = logging.getLogger(__name__)
_SEND_STATES = {"accepted", "queued", "rejected", "unreachable", "unknown"}
#: The journal record type of a claim on this agent (seed §5 "claims on this agent").
CLAIM_RECORD = "claim"
#: The journal record of an inform this agent put into a session without CrossTalk.
NATIVE_SEND_RECORD = "native_send"
#: Who the target session is told a claim or release came through.
CROSSTALK_SENDER = Sender(agent_id=None, name="crosstalk", ingress=Ingress.LOCAL)


@dataclass(frozen=True)
class AgentSpec:
    """What the harness knows about the session an agent stands for."""

    harness: Harness
    session_ref: str
    cwd: str
    session_name: str | None = None
    endpoint: str | None = None
    harness_pid: int | None = None
    harness_version: str | None = None


class Agent:
    """A session made into a CrossTalk agent, inside the caller's asyncio loop."""

    def __init__(self, registry: Registry, spec: AgentSpec, *, limits: Limits | None = None,
                 env: dict[str, str] | None = None, clock: Callable[[], float] = time.time,
                 idle_timeout: float = 30.0,
                 control_sinks: Sequence[ControlSink] = (),
                 reconciler: Reconciler | None = None) -> None:
        self.registry = registry
        self.spec = spec
        self.limits = limits or Limits()
        self.env = env
        self.clock = clock
        self.idle_timeout = idle_timeout
        self.agent_id = agent_id_for(spec.harness.name, spec.session_ref)
        self.claim = ClaimState()
        self.registration: Registration | None = None
        self.name_choice: NameChoice | None = None
        self.journal: Journal | None = None
        self.receiver: Receiver | None = None
        self.uds: UdsIngress | None = None
        self.a2a: A2AServer | None = None
        self.descriptor: Descriptor | None = None
        self._http: httpx.AsyncClient | None = None
        self._replies: dict[str, dict[str, Any]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        #: Harnesses that read control frames (receipts) arriving at this agent's uds ingress.
        self.control_sinks = list(control_sinks)
        #: Finds evidence that an ambiguous injection reached the session (Codex), if any.
        self.reconciler = reconciler
        self._native_sends: set[str] = set()

    @property
    def name(self) -> str:
        if self.registration is None or self.registration.name is None:
            raise RegistryError("agent is not registered")
        return self.registration.name

    @property
    def token(self) -> str:
        if self.registration is None or self.registration.token is None:
            raise RegistryError("agent is not registered")
        return self.registration.token

    def _target_role(self) -> TargetRole:
        claim = self.effective_claim()
        return TargetRole(claim.role, claim.owner)

    async def start(self) -> NameChoice:
        spec = self.spec
        reg = self.registry.acquire(self.agent_id)
        self.registration = reg
        try:
            choice = reg.take_name(name_candidates(spec.harness.name, spec.cwd, self.agent_id,
                                                   spec.session_name))
            self.name_choice = choice
            jpath = journal_path(self.registry.home, self.agent_id)
            ensure_private_dir(jpath.parent)
            self.journal = Journal(jpath, clock=self.clock)
            records = self.journal.replay().records
            self.claim = _claim_state(records)
            self._replies = _reply_state(records)
            uds_path = uds_path_for(self.registry.home, self.agent_id, self.env)
            binding = Binding(spec.harness.name, spec.session_ref, spec.endpoint,
                              new_instance_id())
            self.receiver = Receiver(agent_id=self.agent_id, journal=self.journal,
                                     harness=spec.harness, binding=binding, limits=self.limits,
                                     reply_address=str(uds_path),
                                     target_role=self._target_role, clock=self.clock)
            resumable = self.receiver.restore(records)
            self.uds = UdsIngress(uds_path, self.receiver, self.registry,
                                  idle_timeout=self.idle_timeout, control=self._on_control)
            await self.uds.start()
            self.a2a = A2AServer(receiver=self.receiver, registry=self.registry,
                                 agent_id=self.agent_id, name=choice.name, limits=self.limits)
            self._wire_claims(records)
            self.a2a.restore(records, resumable)
            url = await self.a2a.start()
            cred = reg.issue_credential()
            pid, started = own_process_identity()
            harness_started = (proc.process_start_time(spec.harness_pid)
                               if spec.harness_pid else None)
            self.descriptor = Descriptor(
                agent_id=self.agent_id, name=choice.name, harness=spec.harness.name,
                session_ref=spec.session_ref, cwd=spec.cwd, pid=pid, started_at=started,
                instance_id=binding.instance_id, credential_ref=str(cred),
                role=self.claim.role, owner=self.claim.owner, harness_pid=spec.harness_pid,
                harness_started_at=harness_started, a2a_url=url, uds_path=str(uds_path),
                harness_endpoint=spec.endpoint, harness_version=spec.harness_version,
                pid_domain=proc.pid_domain(),
            )
            reg.publish(self.descriptor)
            self._resume_replies()
            self._spawn(self._reconcile_unknown())
        except BaseException:
            await self.stop()
            raise
        return choice

    def follow_name(self, session_name: str | None) -> NameChoice | None:
        """Take the name the harness now gives the session (a rename), or the preferred name
        a fallback was waiting for once it is free (seed §3). The alias only: agent_id,
        sockets, journal, claims and routes stay. ``None`` when nothing changed."""
        reg = self.registration
        if reg is None or reg.name is None:
            return None
        spec = self.spec
        candidates = list(name_candidates(spec.harness.name, spec.cwd, self.agent_id,
                                          session_name))
        if session_name == spec.session_name and reg.name == candidates[0]:
            return None
        old = reg.name
        choice = reg.rename(candidates)
        self.spec = replace(spec, session_name=session_name)
        self.name_choice = choice
        if reg.descriptor is not None:
            self.descriptor = reg.descriptor
        if self.a2a is not None:
            self.a2a.name = choice.name
        if choice.name == old:
            return None
        log.info("agent %s renamed %r -> %r", self.agent_id, old, choice.name)
        return choice

    async def stop(self) -> None:
        """Unpublish first (nobody new finds us), then close listeners, journal and locks."""
        reg, self.registration = self.registration, None
        if reg is not None:
            reg.close()  # removes our descriptor and token only if they are still ours
        if self.uds is not None:
            # Socket and key next (the harness may kill us within half a second); the rest
            # of the ingress winds down below.
            self.uds.close_listener()
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        if self.a2a is not None:
            with contextlib.suppress(Exception):
                await self.a2a.stop()
            self.a2a = None
        if self.uds is not None:
            with contextlib.suppress(Exception):
                await self.uds.stop()
            self.uds = None
        if self._http is not None:
            await self._http.aclose()
            self._http = None
        if self.journal is not None:
            self.journal.close()
            self.journal = None

    # -- journal access for the tools ---------------------------------------------------------

    def journal_records(self) -> list[dict[str, Any]]:
        if self.journal is None:
            raise RegistryError("agent is not registered")
        return self.journal.replay().records

    def journal_event(self, record: dict[str, Any]) -> None:
        """Journal a record that gates nothing (e.g. a nudge); a failure is only logged."""
        if self.journal is None:
            return
        try:
            self.journal.append(record)
        except JournalError:
            log.warning("agent %s: could not journal %s", self.agent_id, record.get("type"))

    # -- receipts (what a harness said after taking a message) ------------------------------

    def _on_control(self, frame: Mapping[str, Any], pid: int | None,
                    start: str | None) -> None:
        for sink in self.control_sinks:
            for receipt in sink(frame, pid, start):
                self.apply_receipt(receipt)

    def apply_receipt(self, receipt: Receipt) -> None:
        """A late receipt for a message this agent injected (into its own session, or a
        native inform into another): journaled; a held message the session's user released,
        denied or let expire is settled (unknown -> accepted / unreachable)."""
        if self.journal is None or self.receiver is None:
            return
        entry = self.receiver.entries.get(receipt.message_id)
        if entry is None and receipt.message_id not in self._native_sends:
            return  # another agent's frame (receipts are tracked per process)
        self.journal_event({"type": RECEIPT_RECORD, "id": receipt.message_id,
                            "status": receipt.status, "reason": receipt.reason})
        if entry is None or entry.state is not MessageState.UNKNOWN:
            if receipt.status == "dropped":
                log.warning("agent %s: %s was dropped by the session after it was taken "
                            "(%s)", self.agent_id, receipt.message_id, receipt.reason)
            return
        settled = {"delivered": (MessageState.ACCEPTED, None),
                   "denied": (MessageState.UNREACHABLE, "receipt_denied"),
                   "expired": (MessageState.UNREACHABLE, "receipt_expired")}.get(receipt.status)
        if settled is not None:
            try:
                self.receiver.resolve(receipt.message_id, *settled)
            except ReceiverUnavailable as exc:
                log.warning("agent %s: receipt not applied: %s", self.agent_id, exc)

    # -- claims (seed §7): this agent as a claim's target -----------------------------------

    def _wire_claims(self, records: list[dict[str, Any]]) -> None:
        """At start, after the A2A server exists: claims from *this* session only, and the
        server's control hook. (One line in :meth:`start`; kept apart so it stays one.)"""
        self.claim = _claim_state(records, (self.spec.harness.name, self.spec.session_ref))
        if self.a2a is not None:
            self.a2a.control_handler = self.apply_control

    def effective_claim(self) -> ClaimState:
        """The claim as policy sees it: an owner that is no longer registered counts as absent
        (:meth:`Registry.live_owner`); the journaled claim itself is kept."""
        if self.claim.owner is None or self.registry.live_owner(self.claim.owner) is not None:
            return self.claim
        return ClaimState()

    async def apply_control(self, sender: Sender, op: str) -> ControlResult:
        """A verified peer's claim or release of this agent (the A2A server's control hook).

        Check -> journal -> adopt -> republish -> tell the session. Check, journal write and
        adoption run without an ``await`` in between, so two concurrent claims cannot both
        pass the check. The journal record is the claim: if it cannot be written nothing
        changes. A descriptor that fails to republish is logged (policy reads the journaled
        state, not the descriptor); the session's notice is best effort and its receiver
        state is reported.
        """
        current = self.effective_claim()
        if self.journal is None or self.receiver is None:
            return ControlResult(False, "not_registered", current.role, current.owner,
                                 failed=True)
        if op == "claim":
            verdict = check_claim(sender, self.agent_id, current)
            owner, status = sender.agent_id, ClaimStatus.CLAIMED
        elif op == "release":
            verdict = check_release(sender, self.agent_id, current)
            owner, status = None, ClaimStatus.RELEASED
        else:
            verdict, owner, status = Verdict.deny("bad_control"), None, ClaimStatus.RELEASED
        if not verdict.ok:
            return ControlResult(False, verdict.reason, current.role, current.owner)
        binding = self.receiver.binding
        record = {"type": CLAIM_RECORD, "subject": "claim", "id": self.agent_id,
                  "state": status.value, "owner": owner, "by": sender.agent_id,
                  "by_name": sender.name, "op": op,
                  "previous": self.claim.owner if self.claim.owner != owner else None,
                  "binding": binding.as_record() if binding is not None else None}
        try:
            self.journal.append(record)
        except JournalError as exc:
            log.error("agent %s: %s by %s not journaled: %s", self.agent_id, op,
                      sender.agent_id, exc)
            return ControlResult(False, "journal_unavailable", current.role, current.owner,
                                 failed=True)
        self.claim = ClaimState(owner)
        self._publish_claim()
        notice = await self._tell_session(sender, op)
        return ControlResult(True, None, self.claim.role, self.claim.owner, notice=notice)

    def _publish_claim(self) -> None:
        reg = self.registration
        base = reg.descriptor if reg is not None else None
        base = base or self.descriptor
        if reg is None or base is None:
            return
        updated = replace(base, role=self.claim.role, owner=self.claim.owner)
        try:
            reg.publish(updated)
        except (OSError, RegistryError) as exc:
            log.error("agent %s: descriptor not republished after a claim change (%s); "
                      "list_agents shows the old role until the next publish", self.agent_id,
                      exc)
            return
        self.descriptor = updated

    async def _tell_session(self, by: Sender, op: str) -> str | None:
        """Inject the claim/release notice (an inform from the shim itself, journaled)."""
        if self.receiver is None:
            return None
        who = f"{by.name or 'an agent'} (agent {by.agent_id})"
        text = (f"{who} has claimed this session as its subagent: only it may send you "
                "commands now." if op == "claim"
                else f"{who} has released this session; it is a primary again.")
        msg = Message(message_id=new_message_id(), sender=CROSSTALK_SENDER, text=text,
                      kind=Kind.INFORM, sent_at=self.clock())
        try:
            result = await self.receiver.receive(msg)
        except ReceiverUnavailable as exc:
            log.warning("agent %s: %s notice not delivered: %s", self.agent_id, op, exc)
            return "not_journaled"
        return result.state.value

    # -- claims (seed §7): this agent as the claimer -----------------------------------------

    async def control_peer(self, to: str, op: str) -> tuple[Descriptor | None,
                                                              a2a_client.ControlOutcome]:
        """Claim or release the agent named ``to`` (name or agent_id), as this agent.

        An agent never claims or releases itself: refused here, without a round trip. The
        target decides everything else; identity travels only as this agent's bearer token.
        """
        target = self._peer(to)
        if isinstance(target, str):
            return None, a2a_client.ControlOutcome(False, "rejected", target)
        if target.agent_id == self.agent_id:
            reason = "cannot_claim_self" if op == "claim" else "cannot_release_self"
            return target, a2a_client.ControlOutcome(False, "rejected", reason)
        if target.a2a_url is None:
            return target, a2a_client.ControlOutcome(False, "unreachable", "no_a2a_listener")
        text = (f"{self.name} asks to {op} this session (a CrossTalk control request; "
                "it is applied by the shim, never delivered as a message).")
        outcome = await a2a_client.control(target.a2a_url, self.token, op, text=text,
                                           expect_name=target.name, httpx_client=self._client())
        return target, outcome

    def _peer(self, to: str) -> Descriptor | str:
        """The one live agent ``to`` names (name or agent_id), else the reason there is none."""
        targets = self.registry.find(to)
        if len(targets) != 1:
            return "no_such_agent" if not targets else "ambiguous_name"
        return targets[0]

    def _client(self) -> httpx.AsyncClient:
        """One HTTP client per agent: peers' connections are reused (~5 ms a send, not ~35)."""
        if self._http is None:
            self._http = a2a_client.new_http_client()
        return self._http

    # -- reply: the staged transaction (seed R4-R8) ---------------------------------------

    async def reply(self, message_id: str, text: str) -> dict[str, Any]:
        """Answer an inbound message: obligation -> complete the ask -> forward to the asker.

        One reply per inbound message (R4): a repeat with the same text returns the first
        result; a different text is ``already_replied``. Each stage is journaled before the
        next, so a crash resumes from its stage instead of answering twice.
        """
        if self.receiver is None or self.journal is None:
            raise RegistryError("agent is not registered")
        entry = self.receiver.entries.get(message_id)
        if entry is None or entry.state not in (MessageState.ACCEPTED, MessageState.QUEUED):
            raise ReplyRefused("no_such_message", "no delivered inbound message has that id; "
                               "see receive_message, or use send_message")
        if not entry.sender.verified or entry.sender.agent_id is None:
            raise ReplyRefused("sender_unverified", "the sender is not a registered agent; "
                               "answer with send_message if you know who it is")
        prior = self._replies.get(message_id)
        ask = self._ask_entry(message_id)
        if prior is not None:
            if prior["text"] != text:
                raise ReplyRefused("already_replied", "this message was already answered")
            if prior["state"] != ReplyState.PENDING.value:
                return dict(prior["result"])
        elif ask is not None and ask.ask in (AskState.EXPIRED, AskState.CLOSED):
            raise ReplyRefused("ask_closed", "the ask's deadline passed or it was closed; "
                               "send_message reaches the asker if it still matters")
        elif ask is not None and ask.ask is AskState.ANSWERED:
            # Answered through another message of its task (R6): one answer per ask.
            raise ReplyRefused("already_replied", "this ask was already answered")
        elif ask is None and not entry.route_open(self.clock()):
            raise ReplyRefused("ask_closed", "an inform can be answered with reply for an "
                               "hour after it arrived; use send_message now")
        else:
            prior = {"reply_id": new_message_id(), "text": text, "to": entry.sender.agent_id,
                     "state": ReplyState.PENDING.value, "result": {}}
            try:
                self.journal.append({"subject": "reply", "id": message_id, "state": "pending",
                                     "reply_id": prior["reply_id"], "text": text,
                                     "to": entry.sender.agent_id, "refs": [message_id]})
            except JournalError:
                raise ReplyRefused("journal_unavailable", "the reply could not be recorded; "
                                   "nothing was sent, try again") from None
            self._replies[message_id] = prior
        return await self._complete_reply(message_id, prior)

    async def _complete_reply(self, message_id: str, prior: dict[str, Any]) -> dict[str, Any]:
        """The stages after the obligation: answer the ask (completes its task), forward."""
        assert self.receiver is not None
        ask = self._ask_entry(message_id)
        if ask is not None and ask.ask is AskState.OPEN:
            self.receiver.close_ask(ask.message_id, AskState.ANSWERED, prior["text"])
        return await self._forward_reply(message_id, str(prior["to"]), prior)

    def _ask_entry(self, message_id: str) -> Entry | None:
        """The ask a reply to ``message_id`` answers: that message's own, or, for a
        continuation of an ask's task, the ask that opened it (R6)."""
        if self.receiver is None:
            return None
        ask_id = self.a2a.ask_of(message_id) if self.a2a is not None else None
        if ask_id is None:
            return None
        entry = self.receiver.entries.get(ask_id)
        this = self.receiver.entries.get(message_id)
        if entry is None or this is None or entry.sender.agent_id != this.sender.agent_id:
            return None  # only the asker's own continuations answer for its ask
        return entry

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reconcile_unknown(self) -> None:
        """Settle ambiguous dispatches of this conversation, only on the harness's positive
        evidence (seed test 20); without it they stay unknown and are never resent."""
        reconciler = self.reconciler
        receiver = self.receiver
        if reconciler is None or receiver is None or receiver.binding is None:
            return
        binding = receiver.binding
        for entry in list(receiver.entries.values()):
            if entry.state is not MessageState.UNKNOWN or not binding.same_conversation(
                    entry.binding):
                continue
            try:
                found = await reconciler.reconcile(binding, entry.message_id)
            except Exception:
                log.exception("agent %s: reconciling %s failed", self.agent_id,
                              entry.message_id)
                continue
            if isinstance(found, Outcome) and found.state is MessageState.ACCEPTED:
                try:
                    receiver.resolve(entry.message_id, MessageState.ACCEPTED, None)
                except ReceiverUnavailable as exc:
                    log.warning("agent %s: reconciled %s not journaled: %s", self.agent_id,
                                entry.message_id, exc)

    def _resume_replies(self) -> None:
        """Replies a crash left between their stages go on from where they stopped (R5)."""
        for message_id, prior in self._replies.items():
            if prior["state"] == ReplyState.PENDING.value and isinstance(prior.get("to"), str):
                task = asyncio.get_running_loop().create_task(
                    self._resume_reply(message_id, prior))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _resume_reply(self, message_id: str, prior: dict[str, Any]) -> None:
        try:
            await self._complete_reply(message_id, prior)
        except Exception:
            log.exception("agent %s: resuming the reply to %s failed", self.agent_id,
                          message_id)

    async def _forward_reply(self, message_id: str, to_agent: str,
                             prior: dict[str, Any]) -> dict[str, Any]:
        assert self.journal is not None
        res = await self.send(to_agent, prior["text"], message_id=prior["reply_id"],
                              in_reply_to=message_id)
        gone = res.reason in ("no_such_agent", "ambiguous_name")  # the asker is no more
        state = (ReplyState.FORWARDED if res.state in ("accepted", "queued")
                 else ReplyState.UNREACHABLE if res.state in ("unreachable", "rejected") or gone
                 else ReplyState.PENDING)
        result = {"message_id": prior["reply_id"], "state": res.state if res.state in
                  _SEND_STATES else "unknown", "reason": res.reason, "in_reply_to": message_id}
        if state is not ReplyState.PENDING:
            try:
                self.journal.append({"subject": "reply", "id": message_id,
                                     "state": state.value, "result": result})
            except JournalError:
                # Forwarded, but not recorded: a resume re-sends with the same reply id, and
                # the asker's receiver answers that retry from its dedupe record.
                log.warning("agent %s: reply outcome not journaled", self.agent_id)
        prior.update(state=state.value, result=result)
        return result

    async def send(self, to: str | Descriptor, text: str, *, kind: str = "inform",
                   delivery: str = "immediate", deadline_seconds: int = 0,
                   message_id: str | None = None, in_reply_to: str | None = None,
                   return_immediately: bool = False,
                   until_delivered: bool = False) -> a2a_client.SendResult:
        """Send to a registered agent over A2A, as this agent: by name or agent_id, or by the
        descriptor a caller already resolved (no second registry scan)."""
        target = to if isinstance(to, Descriptor) else self._peer(to)
        if isinstance(target, str):
            return a2a_client.SendResult(message_id="", state="unknown", reason=target)
        if target.a2a_url is None:
            return a2a_client.SendResult(message_id="", state="unreachable",
                                         reason="no_a2a_listener")
        return await a2a_client.send(
            target.a2a_url, self.token, text, kind=kind, delivery=delivery,
            httpx_client=self._client(),
            deadline_seconds=deadline_seconds, message_id=message_id, in_reply_to=in_reply_to,
            return_immediately=return_immediately, until_delivered=until_delivered,
            expect_name=target.name)

    async def send_native(self, discovery: Discovery, session: Session, text: str, *,
                          delivery: str = "immediate") -> a2a_client.SendResult:
        """An inform into a session without CrossTalk, put in by this shim (seed §3).

        The intent is journaled before anything is sent (a failed write sends nothing), the
        outcome after. The frame's ``from`` is this agent's uds ingress: a native answer comes
        back here, where a session without CrossTalk is an unverified sender (test 26).
        """
        if self.journal is None or self.uds is None:
            raise RegistryError("agent is not registered")
        mid = new_message_id()
        self._native_sends.add(mid)
        to = f"{session.harness}:{session.session_ref}"
        try:
            self.journal.append({"type": NATIVE_SEND_RECORD, "id": mid, "to": to,
                                 "to_name": session.name, "state": "dispatching"})
        except JournalError as exc:
            raise ReceiverUnavailable(str(exc)) from None
        claim = self.effective_claim()
        msg = Message(message_id=mid, text=text, kind=Kind.INFORM,
                      delivery=DeliveryMode(delivery), sent_at=self.clock(),
                      sender=Sender(agent_id=self.agent_id, name=self.name, role=claim.role,
                                    ingress=Ingress.LOCAL))
        try:
            outcome = await discovery.send_native(session, Delivery(msg, str(self.uds.path)))
        except Exception as exc:  # after the attempt began: ambiguous, never resent
            log.warning("agent %s: native send to %s failed: %r", self.agent_id, to, exc)
            outcome = Outcome(MessageState.UNKNOWN, "native_send_failed")
        self.journal_event({"type": NATIVE_SEND_RECORD, "id": mid, "to": to,
                            "state": outcome.state.value, "reason": outcome.reason})
        return a2a_client.SendResult(message_id=mid, state=outcome.state.value,
                                     reason=outcome.reason)


class ReplyRefused(Exception):
    """A reply the reply tool must refuse, with the contract's reason."""

    def __init__(self, reason: str, hint: str | None = None) -> None:
        super().__init__(reason)
        self.reason, self.hint = reason, hint


def _reply_state(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    replies: dict[str, dict[str, Any]] = {}
    for rec in records:
        if rec.get("subject") != "reply" or not isinstance(rec.get("id"), str):
            continue
        if rec.get("state") == ReplyState.PENDING.value:
            replies[rec["id"]] = {"reply_id": rec.get("reply_id"), "text": rec.get("text"),
                                  "to": rec.get("to"), "state": "pending", "result": {}}
        elif rec["id"] in replies:
            replies[rec["id"]].update(state=rec.get("state"), result=rec.get("result") or {})
    return replies


def _claim_state(records: list[dict[str, Any]],
                 session: tuple[str, str] | None = None) -> ClaimState:
    """The latest claim record in an agent's journal decides its role (seed §7).

    With ``session`` = (harness, session_ref), only records journaled under that session
    count: a resume of the same session keeps its claim (the journal replays it, seed §9),
    but a claim recorded under another binding never applies to this one.
    """
    owner: str | None = None
    for rec in records:
        if rec.get("type") != CLAIM_RECORD:
            continue
        if session is not None:
            binding = rec.get("binding")
            if not isinstance(binding, dict) or (
                    binding.get("harness"), binding.get("session_ref")) != session:
                continue
        value = rec.get("owner")
        owner = value if isinstance(value, str) else None
    return ClaimState(owner)

