"""Putting one message into one Claude session's inbox: the frame, pacing, and the receipts.

Injection (design doc §4.3): one frame into the session's ``messagingSocketPath``, carrying
our envelope, a ``from`` address whose listener is the process that writes the frame (the
agent's uds ingress when the shim writes; the gate helper's socket when the helper writes a
peer's frame, ADR 0020 — either way a native reply comes back to the agent, where it is
bounced, seed §5) and ``session_id`` so a superseded conversation never gets it. Claude
rate-limits per ``from`` address and may drop, hold or deny a frame after taking it; what its
receipts say decides the outcome (ADR 0007).
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from crosstalk.capture.tap import CLAUDE_INBOX, CLAUDE_RECEIPT, IN, OUT, TAPS
from crosstalk.core.envelope import render_claude
from crosstalk.core.message import DeliveryMode, Ingress
from crosstalk.core.pacing import TokenBucket
from crosstalk.core.states import MessageState
from crosstalk.harness.base import (
    Delivery,
    Outcome,
)
from crosstalk.harness.claude import inbox, receipts
from crosstalk.harness.claude.registry import (
    ClaudeSession,
    read_peer_token,
)


def priority_for(delivery: Delivery) -> str:
    """``next`` joins a running turn at its next tool boundary; ``later`` waits for the turn
    to end. Unverified senders and next_turn deliveries never interrupt (CQ3)."""
    if delivery.message.delivery is DeliveryMode.NEXT_TURN or not delivery.wake:
        return "later"
    return "next"


def render(delivery: Delivery, *, from_address: str, from_mode: str | None = "prompting") -> str:
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


#: Writes encoded bytes into the inbox at a path: this process, or the gate helper.
Write = Callable[[str, bytes], Awaitable[inbox.InboxResult]]


async def _write_here(socket_path: str, payload: bytes) -> inbox.InboxResult:
    return await inbox.write_bytes(socket_path, payload)


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
                      session_id: str | None, from_mode: str | None = "prompting",
                      write: Write = _write_here) -> Outcome:
        """One frame from ``from_address``, written by ``write`` (whose process must own the
        listener at ``from_address``, or Claude's receipts never come back)."""
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
        tap = TAPS.tap_for(delivery.reply_address)  # the agent whose frames these are
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
                try:
                    payload = inbox.encode(frame, token)
                except ValueError:
                    return Outcome(MessageState.UNREACHABLE, "frame_too_large")
                self.tracker.expect(msg_id, message_id, session.pid, session.recorded_start)
                tap.emit(CLAUDE_INBOX, OUT, payload, inbox=socket, attempt=attempt + 1)
                got = await write(socket, payload)
                # What the socket proved (the inbox never writes back).
                tap.emit(CLAUDE_INBOX, IN, {"inbox_result": got.state.value,
                                            "reason": got.reason, "evidence": got.evidence},
                         inbox=socket)
            if got.state is not MessageState.ACCEPTED:
                self.tracker.forget(msg_id)
                return Outcome(got.state, got.reason, got.evidence)
            receipt = await self.tracker.wait(msg_id, self.grace)
            tap.emit(CLAUDE_RECEIPT, IN, receipt or {"receipt": None, "grace": self.grace})
            if receipt is None or receipt.status == "delivered":
                return Outcome(MessageState.ACCEPTED, None, got.evidence)
            if receipt.status == "held":
                # Waiting for that session's user: not delivered, not lost. A later
                # "delivered" / "denied" receipt settles it (Agent.apply_receipt).
                return Outcome(MessageState.UNKNOWN, "held_for_approval", "held receipt")
            if receipt.status != "dropped":
                # denied, expired; Claude's crossSessionInbound "refuse" is expired/refused.
                status = "refused" if receipt.reason == "refused" else receipt.status
                return Outcome(MessageState.UNREACHABLE, f"receipt_{status}")
            reason = f"dropped:{receipt.reason or 'unspecified'}"
            if receipt.reason == "duplicate":
                return Outcome(MessageState.ACCEPTED, None, "already in the inbox (duplicate)")
            if receipt.reason in ("hop-loop", "hop-runaway"):
                return Outcome(MessageState.UNREACHABLE, reason)
            pacer.bucket.drain(self.clock())  # rate-limited or queue-full: back off, resend
        return Outcome(MessageState.UNKNOWN, reason)


async def deliver_to_session(session: ClaudeSession, delivery: Delivery, *,
                             from_address: str, session_id: str | None,
                             from_mode: str | None = "prompting",
                             write: Write = _write_here) -> Outcome:
    """One message into ``session``'s inbox, as ``from_address`` (an agent's uds ingress)."""
    return await Injector().deliver(session, delivery, from_address=from_address,
                                    session_id=session_id, from_mode=from_mode, write=write)
