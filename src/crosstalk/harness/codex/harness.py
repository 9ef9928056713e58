"""Injecting into one Codex thread, through the app-server that has it loaded (design doc §4.6).

Injection goes through the app-server that has the thread loaded (the shared control socket,
plus any endpoint a descriptor recorded): exactly one host binds; several are
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
from dataclasses import dataclass, field
from typing import Any, Final

from crosstalk.core.envelope import render_peer
from crosstalk.core.message import Ingress
from crosstalk.core.states import MessageState
from crosstalk.harness.base import Binding, Delivery, Outcome
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
