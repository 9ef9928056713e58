"""Claude Code: sessions bound by the shim's parent pid, messages put into its inbox socket.

A Claude shim is a child of the Claude process (``getppid()`` = the session's pid), so its
session is ``<configDir>/sessions/<ppid>.json``'s *current* ``sessionId`` — read on every use,
since ``/clear`` and ``/resume`` rewrite it under the same pid (design doc §4.2). That
evidence exists before any tool call, which is why a Claude session registers at shim start.

Injection (design doc §4.3): one frame into the session's ``messagingSocketPath``, carrying
our envelope with the agent's own uds ingress as ``from`` (a native reply comes back to the
shim, where it is bounced, seed §5) and ``session_id`` so a superseded conversation never gets
it. Sending to a Claude session *without* CrossTalk uses the same frame (inform only, §3).
"""

from __future__ import annotations

import asyncio
import os
import stat
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crosstalk.core.envelope import render_claude
from crosstalk.core.message import DeliveryMode, Ingress, Sender
from crosstalk.core.pacing import TokenBucket
from crosstalk.core.states import MessageState
from crosstalk.harness.base import (
    Binding,
    Delivery,
    Harness,
    Identity,
    Outcome,
    Receipt,
    Session,
)
from crosstalk.harness.claude import inbox, mode, receipts
from crosstalk.harness.claude.registry import (
    ClaudeSession,
    SessionBinding,
    config_dirs,
    discover,
    liveness,
    read_peer_token,
    read_record,
)
from crosstalk.store.registry import Descriptor

HARNESS = "claude"


def priority_for(delivery: Delivery) -> str:
    """``next`` joins a running turn at its next tool boundary; ``later`` waits for the turn
    to end. Unverified senders and next_turn deliveries never interrupt (CQ3)."""
    if delivery.message.delivery is DeliveryMode.NEXT_TURN or not delivery.wake:
        return "later"
    return "next"


def render(delivery: Delivery, *, from_address: str, from_mode: str = "prompting") -> str:
    msg = delivery.message
    # The shim's own notices (bounces, claims) are not a peer's claims: not "unverified".
    verified = msg.sender.verified or msg.sender.ingress is Ingress.LOCAL
    return render_claude(body=msg.text, from_address=from_address, from_name=msg.sender.label,
                         message_id=msg.message_id, kind=msg.kind.value,
                         in_reply_to=msg.in_reply_to, verified=verified, mode=from_mode)


#: How long an injection waits for an immediate receipt (held, or a first drop) after the
#: inbox closed: Claude decides while reading the frame, before it closes its side.
RECEIPT_GRACE = 0.2
#: A dropped frame is sent again only after Claude's 30 s duplicate window, so that a
#: "duplicate" answer can only mean the frame is already in the inbox.
RETRY_AFTER_DROP = 31.0
MAX_ATTEMPTS = 4


@dataclass
class _Pacer:
    bucket: TokenBucket = field(default_factory=TokenBucket)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


#: One bucket per sender address: Claude rate-limits per ``from``, and only this process
#: sends from its agents' addresses. Per event loop (an asyncio.Lock belongs to one).
_PACERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _Pacer]] = (
    weakref.WeakKeyDictionary())


def _pacer(from_address: str, bucket: Callable[[], TokenBucket]) -> _Pacer:
    pacers = _PACERS.setdefault(asyncio.get_running_loop(), {})
    pacer = pacers.get(from_address)
    if pacer is None:
        pacer = pacers[from_address] = _Pacer(bucket())
    return pacer


@dataclass
class Injector:
    """Pacing, the frame, and what the receipts say: one injection into one session."""

    tracker: receipts.Tracker = field(default_factory=lambda: receipts.TRACKER)
    grace: float = RECEIPT_GRACE
    retry_after_drop: float = RETRY_AFTER_DROP
    max_attempts: int = MAX_ATTEMPTS
    clock: Callable[[], float] = time.monotonic
    #: Makes the bucket for a sender address the first time it sends (tests shrink it).
    bucket: Callable[[], TokenBucket] = TokenBucket

    async def deliver(self, session: ClaudeSession, delivery: Delivery, *, from_address: str,
                      session_id: str | None, from_mode: str = "prompting") -> Outcome:
        socket = session.messaging_socket_path
        if socket is None:
            return Outcome(MessageState.UNREACHABLE, "claude_no_inbox")
        pacer = _pacer(from_address, self.bucket)
        message_id = delivery.message.message_id
        msg_id = inbox.msg_id_for(message_id)
        frame = inbox.user_frame(render(delivery, from_address=from_address,
                                        from_mode=from_mode), msg_id=msg_id,
                                 from_address=from_address, priority=priority_for(delivery),
                                 session_id=session_id)
        reason = "dropped"
        token: str | None = None
        for attempt in range(self.max_attempts):
            if attempt:
                await asyncio.sleep(self.retry_after_drop)
            # FIFO: frames leave in the order they were dispatched (no await before this).
            async with pacer.lock:
                while (wait := pacer.bucket.take(self.clock())) > 0:
                    await asyncio.sleep(wait)
                if attempt == 0:
                    token = await asyncio.to_thread(read_peer_token, session)
                self.tracker.expect(msg_id, message_id, session.pid, session.recorded_start)
                got = await inbox.deliver(socket, frame, token=token)
            if got.state is not MessageState.ACCEPTED:
                self.tracker.forget(msg_id)
                return Outcome(got.state, got.reason, got.evidence)
            receipt = await self.tracker.wait(msg_id, self.grace)
            if receipt is None or receipt.status == "delivered":
                return Outcome(MessageState.ACCEPTED, None, got.evidence)
            if receipt.status == "held":
                # Waiting for that session's user: not delivered, not lost. A later
                # "delivered" / "denied" receipt settles it (Agent.apply_receipt).
                return Outcome(MessageState.UNKNOWN, "held_for_approval", "held receipt")
            if receipt.status != "dropped":
                return Outcome(MessageState.UNREACHABLE, f"receipt_{receipt.status}")
            reason = f"dropped:{receipt.reason or 'unspecified'}"
            if receipt.reason == "duplicate":
                return Outcome(MessageState.ACCEPTED, None, "already in the inbox (duplicate)")
            if receipt.reason in ("hop-loop", "hop-runaway"):
                return Outcome(MessageState.UNREACHABLE, reason)
            pacer.bucket.drain(self.clock())  # rate-limited or queue-full: back off, resend
        return Outcome(MessageState.UNKNOWN, reason)


async def deliver_to_session(session: ClaudeSession, delivery: Delivery, *,
                             from_address: str, session_id: str | None,
                             from_mode: str = "prompting") -> Outcome:
    """One message into ``session``'s inbox, as ``from_address`` (an agent's uds ingress)."""
    return await Injector().deliver(session, delivery, from_address=from_address,
                                    session_id=session_id, from_mode=from_mode)


#: The permission mode of a message's sender (``None``: it asserts none, e.g. not Claude).
SenderMode = Callable[[Sender], "mode.Mode | None"]


def parity_refusal(session: ClaudeSession, sender: Sender,
                   sender_mode: SenderMode) -> str | None:
    """Why Claude itself would not deliver this peer's message now, or ``None`` (ADR 0008).

    Claude applies its inbound rule to peers but not to its own descendants, and the shim is
    one; so the shim applies it: ``crossSessionInbound`` accept delivers, refuse and hold do
    not (we cannot ask the session's user), and with no setting the sender's mode class must
    equal the session's (a sender with no mode passes unless the session bypasses). The
    shim's own notices always pass."""
    if sender.ingress is Ingress.LOCAL:
        return None
    policy = mode.inbound_policy(session.config_dir, session.cwd)
    if policy == "accept":
        return None
    if policy is not None:
        return f"inbound_{policy}_by_setting"
    receiver = mode.session_mode(session.pid, session.config_dir, session.cwd)
    theirs = sender_mode(sender)
    if (theirs is None and receiver == "bypass") or (theirs is not None and theirs != receiver):
        return "permission_mode_parity"
    return None


@dataclass
class ClaudeHarness:
    """Injects into one Claude session process (the record at ``<config_dir>/sessions/<pid>``)."""

    config_dir: Path
    pid: int
    name: str = HARNESS
    #: Enforces Claude's permission-mode parity for peers (``None``: not enforced).
    sender_mode: SenderMode | None = None

    @property
    def record_path(self) -> Path:
        return self.config_dir / "sessions" / f"{self.pid}.json"

    async def inject(self, binding: Binding, delivery: Delivery) -> Outcome:
        session = await asyncio.to_thread(read_record, self.record_path)
        if session is None or liveness(session) != "live":
            return Outcome(MessageState.UNREACHABLE, "claude_session_gone")
        if session.session_id != binding.session_ref:
            return Outcome(MessageState.UNREACHABLE, "session_superseded")
        if delivery.reply_address is None:
            return Outcome(MessageState.UNREACHABLE, "no_reply_address")
        if self.sender_mode is not None:
            refusal = await asyncio.to_thread(parity_refusal, session, delivery.message.sender,
                                              self.sender_mode)
            if refusal is not None:
                return Outcome(MessageState.UNREACHABLE, refusal)
        return await deliver_to_session(session, delivery, from_address=delivery.reply_address,
                                        session_id=binding.session_ref)


def identity_of(session: ClaudeSession, fallback_cwd: str) -> Identity:
    return Identity(HARNESS, session.session_id, session.cwd or fallback_cwd,
                    session_name=session.name, endpoint=session.messaging_socket_path,
                    harness_pid=session.pid)


@dataclass
class ClaudeIdentifier:
    """Recognises the shim's own Claude session: the parent's record, in any config root.

    ``identify`` ignores the request's ``_meta`` (Claude sends only its tool-use id there);
    the evidence is the process tree plus the record, so it runs after Codex in trust order
    and a call from a Codex thread is never taken for Claude's.
    """

    bindings: Sequence[SessionBinding]
    cwd: str = field(default_factory=os.getcwd)
    #: The environment whose config roots :meth:`discover` reads.
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    name: str = HARNESS
    #: Agents register at shim start, not on their first call (design doc §4.2).
    eager: bool = True
    supersession: bool = True
    #: A live descriptor by agent_id (the registry's), to learn a verified sender's session.
    lookup: Callable[[str], Descriptor | None] | None = None

    @classmethod
    def for_parent(cls, env: Mapping[str, str], ppid: int,
                   cwd: str | None = None) -> ClaudeIdentifier:
        return cls([SessionBinding(d, ppid) for d in config_dirs(env)],
                   cwd=cwd or os.getcwd(), env=dict(env))

    def current(self) -> ClaudeSession | None:
        """The parent session as its record says now (blocking: stat, and reads on change)."""
        for binding in self.bindings:
            session = binding.current()
            if session is not None:
                return session
        return None

    def identify(self, meta: Mapping[str, Any] | None) -> Identity | None:
        session = self.current()
        return identity_of(session, self.cwd) if session is not None else None

    def harness_for(self, identity: Identity) -> Harness:
        session = self.current()
        if session is None or session.session_id != identity.session_ref:
            # Raced a /clear: inject re-checks the record and refuses a superseded session.
            pid = identity.harness_pid or (self.bindings[0].ppid if self.bindings else 0)
            config = self.bindings[0].config_dir if self.bindings else Path("/nonexistent")
            return ClaudeHarness(config, pid, sender_mode=self.sender_mode)
        return ClaudeHarness(session.config_dir, session.pid, sender_mode=self.sender_mode)

    def sender_mode(self, sender: Sender) -> mode.Mode | None:
        """A verified Claude sender's session mode (its process and settings); ``None`` for
        any other sender: it asserts no mode."""
        if sender.agent_id is None or self.lookup is None:
            return None
        desc = self.lookup(sender.agent_id)
        if desc is None or desc.harness != HARNESS or desc.harness_pid is None:
            return None
        for root in config_dirs(self.env):
            record = read_record(root / "sessions" / f"{desc.harness_pid}.json")
            if record is not None and record.session_id == desc.session_ref:
                return mode.session_mode(record.pid, record.config_dir, record.cwd)
        return None


    def on_control(self, frame: Mapping[str, Any], peer_pid: int | None,
                   peer_start: str | None) -> list[Receipt]:
        return on_control(frame, peer_pid, peer_start)

    # -- discovery (harness.base.Discovery) ----------------------------------------------

    def discover(self) -> list[Session]:
        return [session_row(s) for s in discover(self.env)]

    async def send_native(self, session: Session, delivery: Delivery) -> Outcome:
        if session.locator is None or delivery.reply_address is None:
            return Outcome(MessageState.UNREACHABLE, "claude_session_gone")
        record = await asyncio.to_thread(read_record, Path(session.locator))
        if (record is None or liveness(record) != "live"
                or record.session_id != session.session_ref):
            return Outcome(MessageState.UNREACHABLE, "claude_session_gone")
        # Claude applies its own inbound rule here (we are not its descendant): say the
        # sending session's real mode, or a bypass receiver holds a bypass sender too.
        sender_mode = await asyncio.to_thread(self.sender_mode, delivery.message.sender)
        return await deliver_to_session(record, delivery, from_address=delivery.reply_address,
                                        session_id=record.session_id,
                                        from_mode=_mode_attr(sender_mode))


def _mode_attr(m: mode.Mode | None) -> str:
    return "bypass" if m == "bypass" else "prompting"


def session_row(s: ClaudeSession) -> Session:
    socket = s.messaging_socket_path
    return Session(HARNESS, s.session_id, s.name, s.cwd, s.status,
                   reachable=socket is not None and _is_socket(socket), pid=s.pid,
                   locator=str(s.record_path), address=socket, detail=s.waiting_for)


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def on_control(frame: Mapping[str, Any], peer_pid: int | None,
               peer_start: str | None) -> list[Receipt]:
    """A control frame that reached an agent's uds ingress: receipts nobody waits for."""
    return receipts.TRACKER.on_control(frame, peer_pid, peer_start)
