"""Codex: threads identified by ``_meta.threadId`` on every ``tools/call`` (design doc §4.6).

One Codex MCP process may serve several threads (connection pooling), so the thread comes from
each request's own ``_meta``, never from the process. Injection goes through the app-server
that has the thread loaded (``$CODEX_HOME/app-server-control/app-server-control.sock``, plus
any endpoint a descriptor recorded): exactly one host binds; several are
``ambiguous_endpoint``; none is ``unreachable`` with a reason that says so (seed §3 CQ10, R11:
missing evidence is unreachable). A verified immediate message starts (or joins) a turn; a
next_turn or unverified one is appended to the thread's history without waking it (CQ3).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from crosstalk.core.envelope import render_peer
from crosstalk.core.message import Ingress
from crosstalk.core.states import MessageState
from crosstalk.harness.base import Binding, Delivery, Harness, Identity, Outcome, Session
from crosstalk.harness.codex.appserver import (
    REQUEST_TIMEOUT,
    AppServer,
    AppServerError,
    NotSent,
    ServerError,
)

log = logging.getLogger(__name__)

HARNESS = "codex"
#: ``codex queue`` is a local write; longer means something is wrong.
QUEUE_TIMEOUT: Final = 20.0
#: Discovery must not stall list_agents on a hung app-server.
DISCOVERY_TIMEOUT: Final = 3.0
MAX_THREADS: Final = 500


def control_socket(env: Mapping[str, str]) -> str:
    """``$CODEX_HOME/app-server-control/app-server-control.sock`` (CODEX_HOME: ``~/.codex``)."""
    home = env.get("CODEX_HOME") or os.path.join(env.get("HOME") or str(Path.home()),
                                                 ".codex")
    return os.path.join(home, "app-server-control", "app-server-control.sock")
_THREAD_ID = re.compile(r"^[0-9A-Za-z][0-9A-Za-z._:-]{0,127}$")


def thread_id_from_meta(meta: Mapping[str, Any] | None) -> str | None:
    """``_meta.threadId``, else ``_meta["x-codex-turn-metadata"].thread_id``; validated."""
    if not meta:
        return None
    candidates: list[object] = [meta.get("threadId")]
    turn = meta.get("x-codex-turn-metadata")
    if isinstance(turn, Mapping):
        candidates.append(turn.get("thread_id"))
    for value in candidates:
        if isinstance(value, str) and _THREAD_ID.fullmatch(value):
            return value
    return None


def render(delivery: Delivery) -> str:
    msg = delivery.message
    return render_peer(body=msg.text, from_name=msg.sender.label, message_id=msg.message_id,
                       kind=msg.kind.value, in_reply_to=msg.in_reply_to,
                       verified=msg.sender.verified or msg.sender.ingress is Ingress.LOCAL)


async def loaded_threads(server: AppServer) -> list[str]:
    """Every thread id loaded in that app-server process (paged)."""
    ids: list[str] = []
    cursor: str | None = None
    while len(ids) < MAX_THREADS:
        page = await server.request("thread/loaded/list",
                                    {"cursor": cursor} if cursor else {})
        data = page.get("data") if isinstance(page, dict) else None
        ids.extend(t for t in data or [] if isinstance(t, str))
        cursor = page.get("nextCursor") if isinstance(page, dict) else None
        if not isinstance(cursor, str) or not cursor:
            break
    return ids


@contextlib.asynccontextmanager
async def hosts(thread_id: str, endpoints: Sequence[str], *,
                timeout: float = REQUEST_TIMEOUT) -> AsyncIterator[list[AppServer]]:
    """Open connections to the app-servers that have ``thread_id`` loaded (CQ10: ``thread/read``
    alone could answer from stored history; only the loaded list proves a live host). The
    caller uses the one it needs on the same connection; all are closed on exit."""
    async def probe(endpoint: str) -> AppServer | None:
        server = AppServer(endpoint, timeout=DISCOVERY_TIMEOUT)
        try:
            await server.connect()
            if thread_id in await loaded_threads(server):
                server.timeout = timeout
                return server
        except AppServerError as exc:
            log.debug("codex endpoint %s: %s", endpoint, exc)
        await server.close()
        return None

    found = await asyncio.gather(*(probe(e) for e in dict.fromkeys(endpoints)
                                   if os.path.exists(e)))
    open_hosts = [s for s in found if s is not None]
    try:
        yield open_hosts
    finally:
        await asyncio.gather(*(s.close() for s in open_hosts))


async def inject_into(endpoint: str, thread_id: str, delivery: Delivery, *,
                      timeout: float = REQUEST_TIMEOUT) -> Outcome:
    """:func:`inject_on` a fresh connection to ``endpoint``."""
    server = AppServer(endpoint, timeout=timeout)
    try:
        await server.connect()
    except AppServerError as exc:
        log.info("codex inject into %s via %s: %s", thread_id, endpoint, exc)
        return Outcome(MessageState.UNREACHABLE, "app_server_unreachable")
    try:
        return await inject_on(server, thread_id, delivery)
    finally:
        await server.close()


async def inject_on(server: AppServer, thread_id: str, delivery: Delivery) -> Outcome:
    """``turn/start`` (verified and immediate: wakes an idle thread, joins a running turn) or
    ``thread/inject_items`` (next_turn or unverified: the model sees it on its next request)."""
    text = render(delivery)
    try:
        if delivery.wake:
            result = await server.request("turn/start", {
                "threadId": thread_id,
                "input": [{"type": "text", "text": text, "text_elements": []}]})
            turn = result.get("turn") if isinstance(result, dict) else None
            turn_id = turn.get("id") if isinstance(turn, dict) else None
            if not isinstance(turn_id, str) or not turn_id:
                return Outcome(MessageState.UNKNOWN, "malformed_turn_start")
            return Outcome(MessageState.ACCEPTED, None, f"turn {turn_id}")
        await server.request("thread/inject_items", {
            "threadId": thread_id,
            "items": [{"type": "message", "role": "user",
                       "content": [{"type": "input_text", "text": text}]}]})
        return Outcome(MessageState.QUEUED, None, "inject_items")
    except NotSent as exc:
        log.info("codex inject into %s via %s: %s", thread_id, server.path, exc)
        return Outcome(MessageState.UNREACHABLE, "app_server_unreachable")
    except ServerError as exc:
        reason = ("codex_thread_not_loaded" if "not found" in exc.message
                  else f"app_server_refused:{exc.code}")
        return Outcome(MessageState.UNREACHABLE, reason)
    except AppServerError as exc:  # sent, no answer: ambiguous, never resent
        log.warning("codex inject into %s via %s: %s", thread_id, server.path, exc)
        return Outcome(MessageState.UNKNOWN, "app_server_no_answer")


async def durable_queue(codex: str, thread_id: str, delivery: Delivery,
                        env: Mapping[str, str]) -> Outcome:
    """``codex queue --thread ID --message TEXT``: Codex's own durable queue, drained when the
    thread next loads or its holder's turn ends (research §3). Only for a thread no shared
    app-server has loaded (a holder without a socket, or none running)."""
    try:
        proc = await asyncio.create_subprocess_exec(
            codex, "queue", "--thread", thread_id, "--message", render(delivery),
            env=dict(env), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    except OSError as exc:
        log.info("codex queue for %s: cannot run %s: %s", thread_id, codex, exc)
        return Outcome(MessageState.UNREACHABLE, "codex_thread_not_loaded")
    try:
        out, err = await asyncio.wait_for(proc.communicate(), QUEUE_TIMEOUT)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        return Outcome(MessageState.UNKNOWN, "durable_queue_no_answer")
    if proc.returncode == 0 and b"Queued message" in out:
        return Outcome(MessageState.QUEUED, "durable_queue", out.decode(errors="replace")
                       .strip()[:200])
    log.info("codex queue for %s failed (%s): %s", thread_id, proc.returncode,
             err.decode(errors="replace").strip()[:300])
    return Outcome(MessageState.UNREACHABLE, "codex_thread_not_loaded")


def find_codex(env: Mapping[str, str]) -> str | None:
    """The ``codex`` CLI: ``$CROSSTALK_CODEX_BIN``, else our parent if it is codex (the
    app-server or ``codex exec`` that started this shim), else ``codex`` on PATH."""
    configured = env.get("CROSSTALK_CODEX_BIN")
    if configured:
        return configured
    with contextlib.suppress(OSError):
        parent = os.readlink(f"/proc/{os.getppid()}/exe")
        if os.path.basename(parent) == "codex":
            return parent
    return shutil.which("codex", path=env.get("PATH"))


@dataclass
class CodexHarness:
    """Injects into one thread, through whichever known app-server has it loaded now."""

    thread_id: str
    endpoints: Callable[[], list[str]]
    name: str = HARNESS
    timeout: float = REQUEST_TIMEOUT
    #: Where ``codex queue`` comes from (``None``: no durable path, a thread not loaded on a
    #: shared server is unreachable).
    codex: Callable[[], str | None] = lambda: None
    env: Mapping[str, str] = field(default_factory=dict)

    async def inject(self, binding: Binding, delivery: Delivery) -> Outcome:
        async with hosts(self.thread_id, self.endpoints(), timeout=self.timeout) as found:
            if len(found) > 1:
                return Outcome(MessageState.UNREACHABLE, "ambiguous_endpoint")
            if found:
                return await inject_on(found[0], self.thread_id, delivery)
        codex = self.codex()
        if codex is None:
            return Outcome(MessageState.UNREACHABLE, "codex_thread_not_loaded")
        return await durable_queue(codex, self.thread_id, delivery, self.env)

    async def reconcile(self, binding: Binding, message_id: str) -> Outcome | None:
        """Positive evidence that an ambiguous ``turn/start`` reached the thread: a turn in
        its history whose user input carries our message-id (seed test 20). Appended items
        are not in that history, so they stay unknown; never resent either way."""
        marker = f'message-id="{message_id}"'
        async with hosts(self.thread_id, self.endpoints(), timeout=self.timeout) as found:
            if len(found) != 1:
                return None
            try:
                page = await found[0].request("thread/turns/list", {
                    "threadId": self.thread_id, "limit": 50, "itemsView": "full"})
            except AppServerError as exc:
                log.info("codex reconcile %s: %s", message_id, exc)
                return None
        for turn in page.get("data", []) if isinstance(page, dict) else []:
            if isinstance(turn, dict) and any(marker in text for text in _texts(turn)):
                return Outcome(MessageState.ACCEPTED, None, f"turn {turn.get('id')}")
        return None


def _texts(value: Any) -> Iterator[str]:
    """Every ``text`` string anywhere in a turn's items (user inputs carry our envelope)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "text" and isinstance(item, str):
                yield item
            else:
                yield from _texts(item)
    elif isinstance(value, list):
        for item in value:
            yield from _texts(item)


@dataclass
class CodexIdentifier:
    name: str = HARNESS
    cwd: str = field(default_factory=os.getcwd)
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    #: Endpoints recorded in live descriptors (set by the shim's composition root).
    recorded_endpoints: Callable[[], list[str]] | None = None
    #: Codex serves several threads per process: a thread is never evidence against another.
    supersession: bool = False
    harnesses: dict[str, Harness] = field(default_factory=dict)

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
        harness = self.harnesses.get(identity.session_ref)
        if harness is None:
            harness = CodexHarness(identity.session_ref, self.endpoints,
                                   codex=lambda: find_codex(self.env), env=self.env)
            self.harnesses[identity.session_ref] = harness
        return harness

    # -- discovery (harness.base.Discovery) ----------------------------------------------

    def discover(self) -> list[Session]:
        """Loaded user threads on every known app-server (blocking: its own event loop)."""
        return asyncio.run(self._discover())

    async def _discover(self) -> list[Session]:
        by_endpoint = await asyncio.gather(*(_threads_at(e) for e in self.endpoints()
                                             if os.path.exists(e)))
        seen: dict[str, list[Session]] = {}
        for sessions in by_endpoint:
            for s in sessions:
                seen.setdefault(s.session_ref, []).append(s)
        rows: list[Session] = []
        for ref, hosts in seen.items():
            if len(hosts) == 1:
                rows.append(hosts[0])
            else:  # loaded on several servers: listed, but no single host to deliver to
                rows.append(Session(HARNESS, ref, hosts[0].name, hosts[0].cwd, hosts[0].status,
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
