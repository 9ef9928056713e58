"""Claude Code's session as a harness: who the shim's session is, and injecting into it.

A Claude shim is a child of the Claude process (``getppid()`` = the session's pid), so its
session is ``<configDir>/sessions/<ppid>.json``'s *current* ``sessionId`` — read on every use,
since ``/clear`` and ``/resume`` rewrite it under the same pid (design doc §4.2). That
evidence exists before any tool call, which is why a Claude session registers at shim start.
Sending to a Claude session *without* CrossTalk uses the same frame (inform only, §3).
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crosstalk.config import state_dir, uds_path_for
from crosstalk.core.ids import agent_id_for
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
from crosstalk.harness.claude import mode
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
log = logging.getLogger(__name__)


#: The permission mode of a message's sender (``None``: it asserts none, e.g. not Claude).
SenderMode = Callable[[Sender], "mode.Mode | None"]


@dataclass
class ClaudeHarness:
    """Injects into one Claude session process (the record at ``<config_dir>/sessions/<pid>``).

    A peer's message is written by the agent's gate helper, a process Claude does not count
    as its own, so Claude's inbound gate decides it: parity with the modes as they are now,
    ``crossSessionInbound``, the hold dialog, expiry (ADR 0020). The shim's own notices
    (bounces, claim notices) are the session's own business and are written by the shim."""

    config_dir: Path
    pid: int
    name: str = HARNESS
    #: A sender's mode class for the envelope's ``from-mode`` (``None``: it asserts none).
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
        reply = delivery.reply_address
        if reply is None:
            return Outcome(MessageState.UNREACHABLE, "no_reply_address")
        from crosstalk.harness.claude import gate  # with the first injection (ADR 0034)
        from crosstalk.harness.claude.injector import deliver_to_session

        sender = delivery.message.sender
        if sender.ingress is Ingress.LOCAL:
            return await deliver_to_session(session, delivery, from_address=reply,
                                            session_id=binding.session_ref)
        try:
            link = await gate.link_for(gate.Target(session.pid, session.recorded_start, reply))
        except gate.HelperError as exc:
            log.warning("claude session %d: %s", session.pid, exc)
            return Outcome(MessageState.UNREACHABLE, "gate_helper_unavailable")
        theirs = (await asyncio.to_thread(self.sender_mode, sender)
                  if self.sender_mode is not None else None)
        return await deliver_to_session(session, delivery, from_address=link.path,
                                        session_id=binding.session_ref,
                                        from_mode=_mode_attr(theirs), write=link.write)


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

    async def bind(self, identity: Identity) -> Identity:
        """Start the agent's gate helper before the agent registers (``Binder``; the identity
        is unchanged): a native reply to the address a previous shim's frames named (it
        depends only on the agent) must find a listener as soon as the agent is back."""
        session = await asyncio.to_thread(self.current)
        if session is None or session.session_id != identity.session_ref:
            return identity
        env = dict(self.env)
        reply = await asyncio.to_thread(uds_path_for, state_dir(env),
                                        agent_id_for(HARNESS, identity.session_ref), env)
        from crosstalk.harness.claude import gate  # with the first agent (ADR 0034)

        try:
            await gate.link_for(gate.Target(session.pid, session.recorded_start, str(reply)))
        except gate.HelperError as exc:  # the first injection tries again
            log.warning("claude session %d: %s", session.pid, exc)
        return identity

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
        from crosstalk.harness.claude.injector import deliver_to_session  # ADR 0034

        sender_mode = await asyncio.to_thread(self.sender_mode, delivery.message.sender)
        return await deliver_to_session(record, delivery, from_address=delivery.reply_address,
                                        session_id=record.session_id,
                                        from_mode=_mode_attr(sender_mode))


def _mode_attr(m: mode.Mode | None) -> str | None:
    """The envelope's ``from-mode``: the sender's real class, or none it could prove."""
    return m


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
    """A control frame that reached an agent's uds ingress (directly, or relayed from the
    gate helper with its real sender's credentials): receipts nobody waits for."""
    from crosstalk.harness.claude import gate, receipts  # with the first frame (ADR 0034)

    real = gate.unwrap(frame, peer_pid, peer_start)
    if real is None:
        return []
    return receipts.TRACKER.on_control(*real)
