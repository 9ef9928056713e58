"""Who can be messaged: CrossTalk agents (descriptors) merged with harness sessions (seed §3).

A session with CrossTalk appears once, as its agent, with the status its harness reports;
a session without CrossTalk appears as a *native* row (``crosstalk: false``): it receives
informs, put in natively by the sender's shim, and can neither send nor answer an ask.

Supersession (seed §3): where one process holds one session at a time (Claude), a live
process whose record names another session proves the descriptor's session was replaced
(``/clear``); that agent is not listed and its name and agent_id resolve to nothing.

Address forms for ``to`` (design doc §5): a name, an agent_id, ``<harness>:<pid|session
ref|name|agent_id>`` and ``uds:<path>`` (an agent's uds ingress or a session's socket).
Blocking (file reads): from an event loop, call :meth:`Directory.snapshot` in a thread. A
directory built with that ``loop`` runs each async discovery (Codex's sockets) on it, awaited
from the thread, so a listing never starts an event loop of its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from crosstalk.core.ids import agent_id_for
from crosstalk.harness.base import AsyncDiscovery, Discovery, Session
from crosstalk.store.registry import Descriptor, DescriptorLiveness, Registry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Entry:
    """One addressable session: a CrossTalk agent (``descriptor``) or a native ``session``."""

    name: str
    harness: str
    agent_id: str
    cwd: str | None
    status: str
    crosstalk: bool
    reachable: bool
    descriptor: Descriptor | None = None
    session: Session | None = None
    role: str | None = None
    owner: str | None = None

    def row(self) -> dict[str, Any]:
        row: dict[str, Any] = {"name": self.name, "agent_id": self.agent_id,
                               "harness": self.harness, "cwd": self.cwd,
                               "status": self.status, "crosstalk": self.crosstalk,
                               "reachable": self.reachable}
        if self.crosstalk:
            row.update(role=self.role, owner=self.owner)
        if self.session is not None and self.session.detail:
            row["waiting_for"] = self.session.detail
        return row

    @property
    def peer_key(self) -> str:
        """Who the send nudge counts against (seed §4): agent_id, else harness:session_ref."""
        if self.descriptor is not None:
            return self.agent_id
        assert self.session is not None
        return f"{self.harness}:{self.session.session_ref}"


@dataclass(frozen=True)
class Unresolved:
    reason: str  # no_such_agent | ambiguous_name
    candidates: tuple[Entry, ...] = ()

    @property
    def hint(self) -> str:
        if self.reason == "ambiguous_name":
            ids = ", ".join(f"{e.agent_id} ({e.harness}, {e.cwd or '?'})"
                            for e in self.candidates)
            return f"several sessions have that name; send to one of these agent_ids: {ids}"
        return "no live session has that name or id; call list_agents"


class Directory:
    def __init__(self, registry: Registry, discoveries: Sequence[Discovery] = (), *,
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.registry = registry
        self.discoveries = list(discoveries)
        #: The event loop this directory's caller runs on (the shim's), or None (the CLI).
        self.loop = loop
        #: Each discovery with its async form if it has one, checked once, here.
        self._listers: list[tuple[Discovery, AsyncDiscovery | None]] = [
            (d, d if isinstance(d, AsyncDiscovery) else None) for d in self.discoveries]

    def discovery_for(self, harness: str) -> Discovery | None:
        return next((d for d in self.discoveries if d.name == harness), None)

    def _sessions(self) -> list[tuple[Discovery, Session]]:
        found: list[tuple[Discovery, Session]] = []
        for discovery, async_form in self._listers:
            try:
                found.extend((discovery, s) for s in self._discover(discovery, async_form))
            except Exception:  # one broken harness registry must not hide the others
                log.exception("discovery of %s sessions failed", discovery.name)
        return found

    def _discover(self, discovery: Discovery, async_form: AsyncDiscovery | None
                  ) -> list[Session]:
        """An async discovery runs on :attr:`loop` when called from another thread: the
        worker waits while the loop does the I/O. On the loop's own thread (waiting there would
        deadlock) or with no loop running, the blocking :meth:`Discovery.discover`."""
        loop = self.loop
        if (loop is None or async_form is None or not loop.is_running()
                or _running_loop() is loop):
            return discovery.discover()
        try:
            pending = asyncio.run_coroutine_threadsafe(async_form.discover_async(), loop)
        except RuntimeError:  # the loop closed since the check: nothing left to run on
            return discovery.discover()
        return pending.result()

    def snapshot(self) -> list[Entry]:
        listed, _ = self.registry.scan()
        live = [item.descriptor for item in listed if item.liveness is DescriptorLiveness.LIVE]
        live_ids = {d.agent_id for d in live}
        sessions = self._sessions()
        by_ref = {(s.harness, s.session_ref): s for _, s in sessions}
        by_pid = {(s.harness, s.pid): s for disc, s in sessions
                  if disc.supersession and s.pid is not None}
        entries: list[Entry] = []
        served: set[tuple[str, str]] = set()
        for d in live:
            current = by_pid.get((d.harness, d.harness_pid)) if d.harness_pid else None
            if current is not None and current.session_ref != d.session_ref:
                continue  # superseded: its process now holds another session
            served.add((d.harness, d.session_ref))
            session = by_ref.get((d.harness, d.session_ref))
            owner = d.owner if d.owner in live_ids else None  # a gone owner holds nothing
            listening = d.a2a_url is not None
            entries.append(Entry(
                name=d.name, harness=d.harness, agent_id=d.agent_id, cwd=d.cwd,
                status=session.status if session is not None else "unknown",
                crosstalk=True,
                reachable=listening and (session.reachable if session is not None else True),
                descriptor=d, session=session, role=d.role if owner else "primary",
                owner=owner))
        for _, s in sessions:
            if (s.harness, s.session_ref) in served:
                continue
            entries.append(Entry(
                name=s.name or f"{s.harness}:{s.pid if s.pid is not None else s.session_ref}",
                harness=s.harness, agent_id=agent_id_for(s.harness, s.session_ref), cwd=s.cwd,
                status=s.status, crosstalk=False, reachable=s.reachable, session=s))
        entries.sort(key=lambda e: (e.name, e.agent_id))
        return entries

    def resolve(self, to: str, entries: Sequence[Entry] | None = None) -> Entry | Unresolved:
        """The one entry ``to`` names, or why there is none."""
        entries = self.snapshot() if entries is None else entries
        return resolve(to, entries)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def resolve(to: str, entries: Sequence[Entry]) -> Entry | Unresolved:
    harness, sep, rest = to.partition(":")
    if sep and harness == "uds":
        found = [e for e in entries
                 if (e.descriptor is not None and e.descriptor.uds_path == rest)
                 or (e.session is not None and e.session.address == rest)]
        return _one(found)
    if sep and rest and harness in {e.harness for e in entries}:
        pool = [e for e in entries if e.harness == harness]
        exact = [e for e in pool
                 if rest in (e.agent_id, e.session.session_ref if e.session else None,
                             e.descriptor.session_ref if e.descriptor else None)
                 or (e.session is not None and str(e.session.pid) == rest)]
        if exact:
            return _one(exact)
        return _one([e for e in pool if e.name == rest])
    by_id = [e for e in entries if e.agent_id == to]
    if by_id:
        return _one(by_id)
    return _one([e for e in entries if e.name == to])


def _one(found: list[Entry]) -> Entry | Unresolved:
    if not found:
        return Unresolved("no_such_agent")
    if len(found) > 1:
        return Unresolved("ambiguous_name", tuple(found))
    return found[0]
