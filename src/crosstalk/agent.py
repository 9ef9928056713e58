"""One registered agent: its locks, journal, receiver, uds ingress, A2A listener, descriptor.

The order of :meth:`Agent.start` is the seed's (§3 "Publish order and ownership"): take the
agent lock and the name, replay the journal, bind the uds ingress and the A2A listener,
then publish the descriptor (temp + rename). Until the descriptor is published nobody can
find the agent, so nobody can send to a half-built one; :meth:`Agent.stop` undoes it in
reverse and removes only what this instance wrote.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from crosstalk import proc
from crosstalk.a2a import client as a2a_client
from crosstalk.a2a.server import A2AServer
from crosstalk.config import ensure_private_dir, journal_path, uds_path_for
from crosstalk.core.admission import Limits
from crosstalk.core.ids import agent_id_for, new_instance_id, new_message_id
from crosstalk.core.naming import name_candidates
from crosstalk.core.policy import ClaimState, TargetRole
from crosstalk.core.states import AskState, MessageState, ReplyState
from crosstalk.harness.base import Binding, Harness
from crosstalk.ingress.uds import UdsIngress
from crosstalk.receiver import Receiver
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
                 idle_timeout: float = 30.0) -> None:
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
        return TargetRole(self.claim.role, self.claim.owner)

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
                                  idle_timeout=self.idle_timeout)
            await self.uds.start()
            self.a2a = A2AServer(receiver=self.receiver, registry=self.registry,
                                 agent_id=self.agent_id, name=choice.name, limits=self.limits)
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
        except BaseException:
            await self.stop()
            raise
        return choice

    async def stop(self) -> None:
        """Unpublish first (nobody new finds us), then close listeners, journal and locks."""
        reg, self.registration = self.registration, None
        if reg is not None:
            reg.close()  # removes our descriptor and token only if they are still ours
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
        if prior is not None:
            if prior["text"] != text:
                raise ReplyRefused("already_replied", "this message was already answered")
            if prior["state"] != ReplyState.PENDING.value:
                return dict(prior["result"])
        elif entry.ask in (AskState.EXPIRED, AskState.CLOSED):
            raise ReplyRefused("ask_closed", "the ask's deadline passed or it was closed; "
                               "send_message reaches the asker if it still matters")
        else:
            prior = {"reply_id": new_message_id(), "text": text,
                     "state": ReplyState.PENDING.value, "result": {}}
            self.journal.append({"subject": "reply", "id": message_id, "state": "pending",
                                 "reply_id": prior["reply_id"], "text": text,
                                 "to": entry.sender.agent_id, "refs": [message_id]})
            self._replies[message_id] = prior
        if entry.ask is AskState.OPEN:
            self.receiver.close_ask(message_id, AskState.ANSWERED, text)
        return await self._forward_reply(message_id, entry.sender.agent_id, prior)

    async def _forward_reply(self, message_id: str, to_agent: str,
                             prior: dict[str, Any]) -> dict[str, Any]:
        assert self.journal is not None
        res = await self.send(to_agent, prior["text"], message_id=prior["reply_id"],
                              in_reply_to=message_id)
        state = (ReplyState.FORWARDED if res.state in ("accepted", "queued")
                 else ReplyState.UNREACHABLE if res.state in ("unreachable", "rejected")
                 else ReplyState.PENDING)
        result = {"message_id": prior["reply_id"], "state": res.state if res.state in
                  _SEND_STATES else "unknown", "reason": res.reason, "in_reply_to": message_id}
        if state is not ReplyState.PENDING:
            self.journal.append({"subject": "reply", "id": message_id, "state": state.value,
                                 "result": result})
        prior.update(state=state.value, result=result)
        return result

    async def send(self, to: str, text: str, *, kind: str = "inform",
                   delivery: str = "immediate", deadline_seconds: int = 0,
                   message_id: str | None = None, in_reply_to: str | None = None,
                   return_immediately: bool = False,
                   until_delivered: bool = False) -> a2a_client.SendResult:
        """Send to a registered agent (by name or agent_id) over A2A, as this agent."""
        targets = self.registry.find(to)
        if len(targets) != 1:
            reason = "no_such_agent" if not targets else "ambiguous_name"
            return a2a_client.SendResult(message_id="", state="unknown", reason=reason)
        target = targets[0]
        if target.a2a_url is None:
            return a2a_client.SendResult(message_id="", state="unreachable",
                                         reason="no_a2a_listener")
        if self._http is None:
            self._http = a2a_client.new_http_client()
        return await a2a_client.send(
            target.a2a_url, self.token, text, kind=kind, delivery=delivery,
            httpx_client=self._http,
            deadline_seconds=deadline_seconds, message_id=message_id, in_reply_to=in_reply_to,
            return_immediately=return_immediately, until_delivered=until_delivered,
            expect_name=target.name)


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
                                  "state": "pending", "result": {}}
        elif rec["id"] in replies:
            replies[rec["id"]].update(state=rec.get("state"), result=rec.get("result") or {})
    return replies


def _claim_state(records: list[dict[str, Any]]) -> ClaimState:
    """The latest claim record in an agent's journal decides its role (seed §7)."""
    owner: str | None = None
    for rec in records:
        if rec.get("type") == "claim":
            value = rec.get("owner")
            owner = value if isinstance(value, str) else None
    return ClaimState(owner)

