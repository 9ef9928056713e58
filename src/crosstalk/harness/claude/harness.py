"""Claude Code's session as a harness: who the shim's session is, and injecting into it.

A Claude shim is a child of the Claude process (``getppid()`` = the session's pid), so its
session is ``<configDir>/sessions/<ppid>.json``'s *current* ``sessionId`` — read on every use,
since ``/clear`` and ``/resume`` rewrite it under the same pid (design doc §4.2). That
evidence exists before any tool call, which is why a Claude session registers at shim start.
Sending to a Claude session *without* CrossTalk uses the same frame (inform only, §3).
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crosstalk.core.message import Ingress, Sender
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
from crosstalk.harness.claude import mode, receipts
from crosstalk.harness.claude.injector import deliver_to_session
from crosstalk.harness.claude.registry import (
    ClaudeSession,
    SessionBinding,
    config_dirs,
    discover,
    liveness,
    read_record,
)
from crosstalk.store.registry import Descriptor

HARNESS = "claude"


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
    def for_parent(cls, env: Mapping[str, str], ppid: int, cwd: str | None = None,
                   lookup: Callable[[str], Descriptor | None] | None = None
                   ) -> ClaudeIdentifier:
        return cls([SessionBinding(d, ppid) for d in config_dirs(env)],
                   cwd=cwd or os.getcwd(), env=dict(env), lookup=lookup)

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
