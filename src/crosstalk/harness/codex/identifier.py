"""Recognising Codex threads, binding them to their host, and listing them (design doc §4.6).

One Codex MCP process may serve several threads (connection pooling), so the thread comes from
each request's own ``_meta``, never from the process.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from crosstalk.core.states import MessageState
from crosstalk.harness.base import Binding, Delivery, Harness, Identity, Outcome, Session
from crosstalk.harness.codex.appserver import (
    AppServer,
    AppServerError,
)
from crosstalk.harness.codex.harness import (
    DISCOVERY_TIMEOUT,
    HARNESS,
    CodexHarness,
    find_codex,
    hosts,
    inject_into,
    loaded_threads,
    thread_id_from_meta,
)
from crosstalk.harness.codex.setup import control_socket

log = logging.getLogger(__name__)


@dataclass
class CodexIdentifier:
    name: str = HARNESS
    cwd: str = field(default_factory=os.getcwd)
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    #: Endpoints recorded in live descriptors (set by the shim's composition root).
    recorded_endpoints: Callable[[], list[str]] | None = None
    #: Codex serves several threads per process: a thread is never evidence against another.
    supersession: bool = False
    harnesses: dict[str, CodexHarness] = field(default_factory=dict)

    def endpoints(self) -> list[str]:
        found = [control_socket(self.env)]
        if self.recorded_endpoints is not None:
            found += self.recorded_endpoints()
        return list(dict.fromkeys(found))

    def identify(self, meta: Mapping[str, Any] | None) -> Identity | None:
        thread = thread_id_from_meta(meta)
        if thread is None:
            return None
        return Identity(HARNESS, thread, self.cwd)

    async def bind(self, identity: Identity) -> Identity:
        """Before the thread's agent registers: its one live host (recorded as the agent's
        endpoint) and its name there (``thread.name``, the harness name of CQ8). No host or
        several: unbound, and inbound says why on each delivery."""
        async with hosts(identity.session_ref, self.endpoints(),
                         timeout=DISCOVERY_TIMEOUT) as found:
            if len(found) != 1:
                return identity
            host = found[0]
            try:
                got = await host.request("thread/read", {"threadId": identity.session_ref})
            except AppServerError as exc:
                log.debug("codex thread %s: no name (%s)", identity.session_ref, exc)
                got = None
        thread = got.get("thread") if isinstance(got, dict) else None
        name = thread.get("name") if isinstance(thread, dict) else None
        cwd = thread.get("cwd") if isinstance(thread, dict) else None
        return replace(identity, endpoint=host.path,
                       session_name=name if isinstance(name, str) and name else None,
                       cwd=cwd if isinstance(cwd, str) and cwd else identity.cwd)

    def harness_for(self, identity: Identity) -> Harness:
        return self._harness(identity.session_ref)

    def _harness(self, thread_id: str) -> CodexHarness:
        harness = self.harnesses.get(thread_id)
        if harness is None:
            harness = CodexHarness(thread_id, self.endpoints,
                                   codex=lambda: find_codex(self.env), env=self.env)
            self.harnesses[thread_id] = harness
        return harness

    async def reconcile(self, binding: Binding, message_id: str) -> Outcome | None:
        """:meth:`CodexHarness.reconcile` for the bound thread (harness.base.Reconciler)."""
        return await self._harness(binding.session_ref).reconcile(binding, message_id)

    # -- discovery (harness.base.Discovery, harness.base.AsyncDiscovery) -----------------------

    def discover(self) -> list[Session]:
        """Loaded user threads on every known app-server, for a caller without an event loop
        (``crosstalk agents``). From a loop, await :meth:`discover_async` instead."""
        return asyncio.run(self.discover_async())

    async def discover_async(self) -> list[Session]:
        """Loaded user threads on every known app-server; a thread loaded on several is listed
        once, unreachable (no single host to deliver to)."""
        by_endpoint = await asyncio.gather(*(_threads_at(e) for e in self.endpoints()
                                             if os.path.exists(e)))
        seen: dict[str, list[Session]] = {}
        for sessions in by_endpoint:
            for s in sessions:
                seen.setdefault(s.session_ref, []).append(s)
        rows: list[Session] = []
        for ref, held in seen.items():
            if len(held) == 1:
                rows.append(held[0])
            else:  # loaded on several servers: listed, but no single host to deliver to
                rows.append(Session(HARNESS, ref, held[0].name, held[0].cwd, held[0].status,
                                    reachable=False, detail="ambiguous_endpoint"))
        return rows

    async def send_native(self, session: Session, delivery: Delivery) -> Outcome:
        if session.locator is None:
            return Outcome(MessageState.UNREACHABLE, "ambiguous_endpoint")
        return await inject_into(session.locator, session.session_ref, delivery)


async def _threads_at(endpoint: str) -> list[Session]:
    try:
        async with AppServer(endpoint, timeout=DISCOVERY_TIMEOUT) as server:
            ids = await loaded_threads(server)
            reads = await asyncio.gather(
                *(server.request("thread/read", {"threadId": t}) for t in ids),
                return_exceptions=True)
    except AppServerError as exc:
        log.debug("codex endpoint %s: %s", endpoint, exc)
        return []
    rows = []
    for got in reads:
        thread = got.get("thread") if isinstance(got, dict) else None
        row = _session_row(thread, endpoint) if isinstance(thread, dict) else None
        if row is not None:
            rows.append(row)
    return rows


def _session_row(thread: Mapping[str, Any], endpoint: str) -> Session | None:
    """A user's thread (not ephemeral helpers, titles or sub-agents), as a directory row."""
    tid = thread.get("id")
    if not isinstance(tid, str) or thread.get("ephemeral") is True:
        return None
    if thread.get("threadSource") not in (None, "user") or thread.get("parentThreadId"):
        return None
    status = thread.get("status")
    kind = status.get("type") if isinstance(status, dict) else None
    if kind == "notLoaded":
        return None
    flags = status.get("activeFlags") if isinstance(status, dict) else None
    shown = {"idle": "idle", "active": "busy", "systemError": "error"}.get(str(kind), "unknown")
    detail = None
    if kind == "active" and isinstance(flags, list) and flags:
        shown, detail = "waiting", ",".join(str(f) for f in flags)[:64]
    name = thread.get("name")
    cwd = thread.get("cwd")
    return Session(HARNESS, tid, name if isinstance(name, str) and name else None,
                   cwd if isinstance(cwd, str) else None, shown,
                   reachable=kind != "systemError", locator=endpoint, detail=detail)
