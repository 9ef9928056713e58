"""One registered agent: its locks, journal, receiver, uds ingress, A2A listener, descriptor.

The order of :meth:`Agent.start` is the seed's (§3 "Publish order and ownership"): take the
agent lock and the name, replay the journal, bind the uds ingress and the A2A listener,
then publish the descriptor (temp + rename). Until the descriptor is published nobody can
find the agent, so nobody can send to a half-built one; :meth:`Agent.stop` undoes it in
reverse and removes only what this instance wrote.

Everything the agent runs in the background — its dispatch lane (one, ordered, for both
ingresses), the ask clock, start-up recovery, the watch on its own descriptor — is a task of
its one :class:`~crosstalk.agent.taskgroup.TaskGroup`; stop ends with that group closing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from crosstalk import proc
from crosstalk.a2a.server import A2AServer
from crosstalk.agent import claims, replies
from crosstalk.agent.checkpoints import CheckpointPolicy, Checkpoints, Started, start_pass
from crosstalk.agent.claims import claim_state
from crosstalk.agent.followups import FollowingHarness
from crosstalk.agent.lane import DispatchLane
from crosstalk.agent.replies import ReplyProgress, reply_state
from crosstalk.agent.taskgroup import TaskGroup
from crosstalk.capture.tap import CLAUDE_RECEIPT, IN, TAPS, Tap
from crosstalk.config import ensure_private_dir, journal_path, uds_path_for
from crosstalk.core.admission import Limits
from crosstalk.core.ids import agent_id_for, new_instance_id
from crosstalk.core.mailbox import MailboxEntry
from crosstalk.core.message import Sender
from crosstalk.core.naming import name_candidates
from crosstalk.core.policy import ClaimState, ControlResult, TargetRole
from crosstalk.core.records import ReceiptRecord, Record
from crosstalk.core.states import MessageState, ReplyState
from crosstalk.harness.base import (
    Binding,
    ControlSink,
    Discovery,
    Harness,
    Outcome,
    Receipt,
    Reconciler,
    Session,
)
from crosstalk.ingress.uds import UdsIngress
from crosstalk.receiver import Receiver, ReceiverUnavailable
from crosstalk.store import collector
from crosstalk.store.journal import Journal, JournalError
from crosstalk.store.journal_read import ReadMark
from crosstalk.store.registry import (
    Descriptor,
    NameChoice,
    Registration,
    Registry,
    RegistryError,
    own_process_identity,
)

if TYPE_CHECKING:  # the client side (httpx, a2a-sdk client) loads with the first send
    import httpx

    from crosstalk.a2a import client as a2a_client

log = logging.getLogger(__name__)

#: How often a live agent checks that its descriptor is still the one it published: a torn or
#: removed descriptor makes it invisible and unreachable, and only its owner may rewrite it.
DESCRIPTOR_CHECK_SECONDS = 1.0


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
                 reconciler: Reconciler | None = None,
                 checkpoint_policy: CheckpointPolicy | None = None) -> None:
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
        self.http: httpx.AsyncClient | None = None
        self.reply_states: dict[str, ReplyProgress] = {}
        #: All the agent's background work: the dispatch lane, the ask clock, recovery.
        self.group = TaskGroup(f"agent {self.agent_id}")
        self.lane: DispatchLane | None = None
        self._recovery: asyncio.Task[None] | None = None
        #: Harnesses that read control frames (receipts) arriving at this agent's uds ingress.
        self.control_sinks = list(control_sinks)
        #: Finds evidence that an ambiguous injection reached the session (Codex), if any.
        self.reconciler = reconciler
        self.native_sends: set[str] = set()
        #: When the restart checkpoint is written (ADR 0018); what the last start read.
        self.checkpoint_policy = checkpoint_policy or CheckpointPolicy()
        self.checkpoints: Checkpoints | None = None
        self.started: Started | None = None
        #: Every frame its ingresses read and its injector writes, for ``crosstalk capture``.
        self.tap = Tap(self.agent_id)

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
            uds_path = uds_path_for(self.registry.home, self.agent_id, self.env)
            TAPS.register(self.tap, [str(uds_path)])  # the injector knows the reply address
            binding = Binding(spec.harness.name, spec.session_ref, spec.endpoint,
                              new_instance_id())
            harness = FollowingHarness(spec.harness, self.group, self.apply_receipt)
            self.receiver = Receiver(agent_id=self.agent_id, journal=self.journal,
                                     harness=harness, binding=binding, limits=self.limits,
                                     reply_address=str(uds_path),
                                     target_role=self._target_role, clock=self.clock)
            self.checkpoints = Checkpoints(self.journal, self.agent_id,
                                           self.checkpoint_policy, self.group)
            await self.group.open()  # (the lane opens it too; the checkpoint write is its task)
            with collector.paused():
                # One streaming pass for every reader of the journal, from a restart
                # checkpoint when one holds (issue 12, item 6; ADR 0018).
                self.started = start_pass(self.journal, self.receiver, self.checkpoint_policy)
                read = self.started.readers
                assert read is not None
                self.claim = claim_state(read.claims.records)
                self.reply_states = reply_state(read.replies.records)
                self.checkpoints.started(self.started)  # before finish() settles anything
                resumable = read.restore.finish()
            self.receiver.follow(read.mailbox, ReadMark(self.started.replay.ino,
                                                        self.started.replay.end))
            self.lane = DispatchLane(self.receiver, self.group)
            await self.lane.start()
            self.uds = UdsIngress(uds_path, self.receiver, self.registry, lane=self.lane,
                                  idle_timeout=self.idle_timeout, control=self._on_control,
                                  tap=self.tap)
            await self.uds.start()
            self.a2a = A2AServer(receiver=self.receiver, registry=self.registry,
                                 agent_id=self.agent_id, name=choice.name, lane=self.lane,
                                 limits=self.limits, tap=self.tap)
            self._wire_claims(read.claims.records)
            with collector.paused():
                self.a2a.restore(read.tasks, resumable)
            self.started.release()
            del read
            url = await self.a2a.start()
            cred = reg.issue_credential()
            self.tap.secrets.add(self.token)
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
            self._recovery = self.group.spawn(self._recover(), what="recovery")
            self.group.spawn(self._keep_descriptor(), what="descriptor watch")
            if self.checkpoint_policy.enabled:
                self.group.spawn(self.checkpoints.keep(), what="checkpoint advance")
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
        """Unpublish first (nobody new finds us), then close listeners, journal and locks.

        The dispatch in flight gets the lane's grace, then is cancelled (journaled
        ``unknown``); messages waiting in the lane stay ``submitted`` for the next start to
        restore. Once the agent's task group has closed, nothing the agent started runs.
        """
        reg, self.registration = self.registration, None
        if reg is not None:
            reg.close()  # removes our descriptor and token only if they are still ours
        if self.uds is not None:
            # Socket and key next (the harness may kill us within half a second); the rest
            # of the ingress winds down below.
            self.uds.close_listener()
        recovery, self._recovery = self._recovery, None
        if recovery is not None:
            recovery.cancel()
            await asyncio.wait({recovery})
        if self.a2a is not None:
            with contextlib.suppress(Exception):
                await self.a2a.stop()
            self.a2a = None
        if self.lane is not None:
            await self.lane.close()
            self.lane = None
        if self.uds is not None:
            with contextlib.suppress(Exception):
                await self.uds.stop()
            self.uds = None
        await self.group.close()
        if self.journal is not None:
            await self.journal.commit.idle()  # what was staged is written (or failed) first
        TAPS.unregister(self.tap)
        checkpoints, self.checkpoints = self.checkpoints, None
        if checkpoints is not None and self.journal is not None:
            try:  # nothing of ours writes any more: the next start reads only what follows
                await checkpoints.at_stop()
            except Exception:
                log.exception("agent %s: checkpoint at stop failed", self.agent_id)
        if self.http is not None:
            await self.http.aclose()
            self.http = None
        if self.journal is not None:
            self.journal.close()
            self.journal = None

    async def _keep_descriptor(self) -> None:
        """Put back our descriptor whenever it was torn, removed or replaced (in the loop's
        thread, so it never interleaves with a claim's or a rename's publish)."""
        failed = None
        while (reg := self.registration) is not None and reg.active:
            try:
                if reg.keep_published():
                    log.warning("agent %s: its descriptor was damaged or missing; rewritten",
                                self.agent_id)
                failed = None
            except (OSError, RegistryError) as exc:
                if str(exc) != failed:
                    failed = str(exc)
                    log.warning("agent %s: cannot rewrite its damaged descriptor: %s",
                                self.agent_id, exc)
            await asyncio.sleep(DESCRIPTOR_CHECK_SECONDS)

    def mailbox(self) -> list[MailboxEntry]:
        if self.receiver is None:
            raise RegistryError("agent is not registered")
        return self.receiver.mailbox()

    def journal_records(self) -> list[dict[str, Any]]:
        if self.journal is None:
            raise RegistryError("agent is not registered")
        return self.journal.replay().records

    def journal_event(self, record: Record) -> None:
        """Journal a record that gates nothing (e.g. a nudge); a failure is only logged."""
        if self.journal is None:
            return
        try:
            self.journal.append(record.to_dict())
        except JournalError:
            log.warning("agent %s: could not journal %s", self.agent_id, record.subject)

    def _on_control(self, frame: Mapping[str, Any], pid: int | None,
                    start: str | None) -> None:
        for sink in self.control_sinks:
            for receipt in sink(frame, pid, start):
                self.tap.emit(CLAUDE_RECEIPT, IN, receipt, late=True)
                self.apply_receipt(receipt)

    def apply_receipt(self, receipt: Receipt) -> None:
        """A late receipt for a message this agent injected (into its own session, or a
        native inform into another): journaled; a held message the session's user released,
        denied or let expire is settled (unknown -> accepted / unreachable)."""
        if self.journal is None or self.receiver is None:
            return
        entry = self.receiver.entries.get(receipt.message_id)
        if entry is None and receipt.message_id not in self.native_sends:
            return  # another agent's frame (receipts are tracked per process)
        self.journal_event(ReceiptRecord(id=receipt.message_id, status=receipt.status,
                                         reason=receipt.reason))
        if entry is None or entry.state is not MessageState.UNKNOWN:
            if receipt.status in ("dropped", "unanswered"):
                log.warning("agent %s: %s was %s by the session after it was taken (%s)",
                            self.agent_id, receipt.message_id, receipt.status, receipt.reason)
            return
        try:
            self.receiver.settle_by_receipt(receipt.message_id, receipt.status)
        except ReceiverUnavailable as exc:
            log.warning("agent %s: receipt not applied: %s", self.agent_id, exc)

    def _wire_claims(self, records: Sequence[Mapping[str, Any]]) -> None:
        """At start, after the A2A server exists: claims from *this* session only, and the
        server's control hook. (One line in :meth:`start`; kept apart so it stays one.)"""
        self.claim = claim_state(records, (self.spec.harness.name, self.spec.session_ref))
        if self.a2a is not None:
            self.a2a.claim_handler = self.apply_control

    def effective_claim(self) -> ClaimState:
        """The claim as policy sees it: an owner that is no longer registered counts as absent
        (:meth:`Registry.live_owner`); the journaled claim itself is kept."""
        return claims.effective_claim(self)

    async def apply_control(self, sender: Sender, op: str) -> ControlResult:
        """A verified peer's claim or release of this agent (the A2A server's control hook);
        see :func:`crosstalk.agent.claims.apply_control`."""
        return await claims.apply_control(self, sender, op)

    # -- what this agent sends ----------------------------------------------------------------

    async def control_peer(self, to: str, op: str) -> tuple[Descriptor | None,
                                                              a2a_client.ControlOutcome]:
        """Claim or release the agent named ``to`` (name or agent_id), as this agent."""
        from crosstalk.agent import outbound  # with the first send (ADR 0034)

        return await outbound.control_peer(self, to, op)

    async def send(self, to: str | Descriptor, text: str, *, kind: str = "inform",
                   delivery: str = "immediate", deadline_seconds: int = 0,
                   message_id: str | None = None, in_reply_to: str | None = None,
                   return_immediately: bool = False,
                   until_delivered: bool = False) -> a2a_client.SendResult:
        """Send to a registered agent over A2A, as this agent: by name or agent_id, or by the
        descriptor a caller already resolved (no second registry scan)."""
        from crosstalk.agent import outbound  # with the first send (ADR 0034)

        return await outbound.send(
            self, to, text, kind=kind, delivery=delivery, deadline_seconds=deadline_seconds,
            message_id=message_id, in_reply_to=in_reply_to,
            return_immediately=return_immediately, until_delivered=until_delivered)

    async def send_native(self, discovery: Discovery, session: Session, text: str, *,
                          delivery: str = "immediate") -> a2a_client.SendResult:
        """An inform into a session without CrossTalk, put in by this shim (seed §3)."""
        from crosstalk.agent import outbound  # with the first send (ADR 0034)

        return await outbound.send_native(self, discovery, session, text, delivery=delivery)

    # -- reply (seed R4-R8) -------------------------------------------------------------------

    async def reply(self, message_id: str, text: str) -> dict[str, Any]:
        """Answer an inbound message: obligation -> complete the ask -> forward to the asker
        (:func:`crosstalk.agent.replies.reply`)."""
        return await replies.reply(self, message_id, text)

    async def _recover(self) -> None:
        """After a restart: replies a crash left between their stages go on from where they
        stopped (R5), and ambiguous dispatches are reconciled, side by side."""
        async with asyncio.TaskGroup() as recovery:
            for message_id, prior in self.reply_states.items():
                if prior.state is ReplyState.PENDING and prior.to is not None:
                    recovery.create_task(replies.resume_reply(self, message_id, prior))
            recovery.create_task(self._reconcile_unknown())

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

