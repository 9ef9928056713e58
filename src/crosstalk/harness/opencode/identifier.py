"""Recognising opencode sessions in a shim, and registering them as they go live (issue 14
items 3-4; research §6).

opencode starts one MCP process per instance (process x directory), shared by every session
there, and tells it nothing per call but a progress token. CrossTalk's plugin stamps
``_opencode: {sessionID, callID}`` into the arguments of CrossTalk's own tools; the shim
removes it before the tools see the arguments (harness.base.ArgumentEvidence).

The stamp is evidence only where it cannot be forged by someone else: when the shim's parent
*is* opencode (``OPENCODE_PID`` equals our parent pid, ``OPENCODE`` set). A shim started by
anything else (a Claude started from opencode's bash tool inherits ``OPENCODE_PID``) still
removes ``_opencode`` from every call, and binds nothing by it. That is
:class:`OpencodeIdentifier`, present in every shim, so every shim also lists opencode
sessions (:mod:`.discovery`). :class:`HostedOpencodeIdentifier` is the one under opencode: it
binds stamped calls, and follows its host instance's event stream to register every live
root session of the instance before its model calls a tool (harness.base.LiveSessions).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from crosstalk.harness.base import Binding, Delivery, Harness, Identity, Outcome, Session
from crosstalk.harness.opencode.discovery import OpencodeDiscovery
from crosstalk.harness.opencode.harness import HARNESS, OpencodeHarness
from crosstalk.harness.opencode.http import Instance, OpencodeError
from crosstalk.harness.opencode.records import InstanceRecord, RecordError, host_record
from crosstalk.harness.opencode.sessions import SESSION_ID, LiveSet

log = logging.getLogger(__name__)

STAMP: Final = "_opencode"
#: How many parents of a sub-agent session the shim asks its host for, at most.
MAX_ANCESTRY: Final = 8
#: After the host's stream failed or could not open: wait before the shim restarts it.
RETRY_SECONDS: Final = 2.0


def parent_is_opencode(env: Mapping[str, str], ppid: int) -> bool:
    """``OPENCODE_PID`` names our parent, and ``OPENCODE`` is set (research §2, §6)."""
    return bool(env.get("OPENCODE")) and env.get("OPENCODE_PID", "") == str(ppid) and ppid > 1


@dataclass
class OpencodeIdentifier:
    """In every shim: removes the stamp (binds nothing by it), lists opencode sessions."""

    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str = "/"
    name: str = HARNESS
    #: harness.base.ArgumentEvidence: the argument the shim removes from every call.
    stamp: str = STAMP
    #: One process hosts many sessions: one is never evidence against another.
    supersession: bool = False

    def __post_init__(self) -> None:
        self._discovery = OpencodeDiscovery(self.env)

    def identify(self, meta: Mapping[str, Any] | None) -> Identity | None:
        return None  # opencode's _meta carries no session

    def identify_stamped(self, meta: Mapping[str, Any] | None,
                         stamp: object) -> Identity | None:
        if stamp is not None:
            log.debug("an _opencode stamp in a shim whose parent is not opencode: ignored")
        return None

    def harness_for(self, identity: Identity) -> Harness:
        raise LookupError("this shim binds no opencode session")

    # -- discovery (harness.base.Discovery, AsyncDiscovery) ----------------------------------

    def discover(self) -> list[Session]:
        return self._discovery.discover()

    async def discover_async(self) -> list[Session]:
        return await self._discovery.discover_async()

    async def send_native(self, session: Session, delivery: Delivery) -> Outcome:
        return await self._discovery.send_native(session, delivery)


@dataclass
class HostedOpencodeIdentifier(OpencodeIdentifier):
    """The shim of one opencode instance: our parent ``ppid`` in directory ``cwd``."""

    ppid: int = 0
    sessions: LiveSet = field(default_factory=LiveSet)
    harnesses: dict[str, OpencodeHarness] = field(default_factory=dict)
    #: Stamped sessions the host said have no parent (not yet live by the stream).
    _roots: set[str] = field(default_factory=set)

    def host(self) -> InstanceRecord:
        """The host instance's live record (:class:`RecordError` if it is gone or forged)."""
        return host_record(self.env, self.ppid, self.cwd)

    def identify_stamped(self, meta: Mapping[str, Any] | None,
                         stamp: object) -> Identity | None:
        if not isinstance(stamp, Mapping):
            return None
        sid = stamp.get("sessionID")
        if not isinstance(sid, str) or not SESSION_ID.fullmatch(sid):
            return None
        if not self.sessions.knows(sid) and sid not in self._roots:
            self._learn_ancestry(sid)
        root = self.sessions.root_of(sid)  # a sub-agent's call is its root session's
        return Identity(HARNESS, root, self.cwd, session_name=self.sessions.live.get(root),
                        harness_pid=self.ppid)

    def _learn_ancestry(self, session_id: str) -> None:
        """A session the event stream has not shown yet (a sub-agent's first call can
        reach us before its ``session.created``): ask the host for its parents, so the
        call is bound to its root and never makes the sub-agent an agent. In the roster's
        worker thread (harness.base.ArgumentEvidence), so on a loop of its own. If the
        host cannot answer, the call is bound to the stamped session as it stands: the
        lookup never fails a call of our own host's session."""
        try:
            record = self.host()
            parents = asyncio.run(_parents(record.socket, self.env, session_id,
                                           self.sessions.knows))
        except (RecordError, OpencodeError) as exc:
            log.info("opencode host %d: parents of %s unknown (%s)", self.ppid, session_id,
                     exc)
            return
        for child, parent in parents:
            self.sessions.children.setdefault(child, parent)
        if not parents:
            self._roots.add(session_id)  # asked once: the stream names it live soon

    def harness_for(self, identity: Identity) -> Harness:
        harness = self.harnesses.get(identity.session_ref)
        if harness is None:
            harness = OpencodeHarness(identity.session_ref, self.host, env=self.env)
            self.harnesses[identity.session_ref] = harness
        return harness

    async def reconcile(self, binding: Binding, message_id: str) -> Outcome | None:
        """harness.base.Reconciler: our message among the session's stored messages."""
        harness = self.harnesses.get(binding.session_ref) or OpencodeHarness(
            binding.session_ref, self.host, env=self.env)
        return await harness.reconcile(binding, message_id)

    def identities(self) -> list[Identity]:
        return [Identity(HARNESS, sid, self.cwd, session_name=name, harness_pid=self.ppid)
                for sid, name in sorted(self.sessions.live.items())]

    async def live_sessions(self) -> AsyncIterator[Sequence[Identity]]:
        """The host's live root sessions, each time they change. Ends (after a pause) when
        the host's record or stream fails; the shim starts it again. A failure yields
        nothing: it is no evidence that a session went away."""
        try:
            record = await asyncio.to_thread(self.host)
        except RecordError as exc:
            log.info("opencode host %d: no live record (%s)", self.ppid, exc.reason)
            await asyncio.sleep(RETRY_SECONDS)
            return
        try:
            async with Instance(record.socket, env=self.env) as api:
                events = api.events()
                first = await anext(events)
                if first.get("type") != "server.connected":
                    log.info("opencode host %d: stream began with %s", self.ppid,
                             first.get("type"))
                self.sessions.directory = record.directory
                await self.sessions.recheck(api, since_ms=record.written_ms)
                yield self.identities()
                async for event in events:
                    if event.get("type") == "server.instance.disposed":
                        return
                    if await self.sessions.apply(api, event):
                        yield self.identities()
        except (OpencodeError, StopAsyncIteration) as exc:
            log.info("opencode host %d: event stream ended (%s)", self.ppid, exc)
        await asyncio.sleep(RETRY_SECONDS)


async def _parents(socket: str, env: Mapping[str, str], session_id: str,
                   known: Callable[[str], bool]) -> list[tuple[str, str]]:
    """``(child, parent)`` from ``session_id`` up to its root, read from the host
    (``GET /session/{id}``), up to a session already ``known``, at most
    :data:`MAX_ANCESTRY` steps."""
    links: list[tuple[str, str]] = []
    async with Instance(socket, env=env) as api:
        for _ in range(MAX_ANCESTRY):
            info = await api.get(f"/session/{session_id}")
            parent = info.get("parentID") if isinstance(info, dict) else None
            if not isinstance(parent, str) or not SESSION_ID.fullmatch(parent):
                break
            links.append((session_id, parent))
            session_id = parent
            if known(parent):
                break
    return links
