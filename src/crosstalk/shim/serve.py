"""``crosstalk mcp``: run the shim over stdio until the harness goes away.

It exits on stdin EOF (the harness closed the connection) and when its parent process dies
(a leftover shim must not keep an agent looking alive): the parent pid is polled, since a
re-parented process sees a different ``getppid()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from mcp.server import Server
from mcp.server.stdio import stdio_server

from crosstalk.config import ensure_private_dir, state_dir
from crosstalk.harness.loader import identifiers
from crosstalk.harness.plugin import ShimContext
from crosstalk.shim.roster import Shim
from crosstalk.shim.stdio import RequestLines, claimed_stdin
from crosstalk.shim.tools import Tools, build_server
from crosstalk.store.registry import Registry, RegistryError, StatePathError

log = logging.getLogger(__name__)
PARENT_POLL_SECONDS = 0.5


def shim_context(env: dict[str, str], ppid: int, registry: Registry) -> ShimContext:
    """What the harnesses' identifiers are built from in this process."""
    return ShimContext(env=env, ppid=ppid, cwd=os.getcwd(),
                       live_descriptor=registry.live_descriptor,
                       recorded_endpoints=_RecordedEndpoints(registry))


@dataclass
class _RecordedEndpoints:
    """Harness endpoints that live agents were bound to (Codex's app-servers, seed CQ10), by
    harness. Cached for a moment: every list_agents and delivery asks, and each answer is a
    registry scan."""

    registry: Registry
    ttl: float = 2.0
    _at: float = float("-inf")
    _found: dict[str, list[str]] = field(default_factory=dict)

    def __call__(self, harness: str) -> list[str]:
        now = time.monotonic()
        if now - self._at > self.ttl:
            found: dict[str, list[str]] = {}
            for d in self.registry.live():
                if d.harness_endpoint:
                    found.setdefault(d.harness, []).append(d.harness_endpoint)
            self._at, self._found = now, found
        return list(self._found.get(harness, ()))


async def _watch_parent(ppid: int, shim: Shim) -> None:
    """Poll the parent (gone: return, the shim exits) and keep eager sessions in step."""
    reported = None
    while os.getppid() == ppid:
        try:
            await shim.sync()
        except (RegistryError, StatePathError) as exc:
            # e.g. the agent lock still held by an exiting predecessor, or a directory where
            # a lock belongs: the message says why and what to do; once per reason, not per poll.
            if str(exc) != reported:
                reported = str(exc)
                log.warning("registering this session failed; retrying: %s", exc)
        except Exception:
            log.warning("registering this session failed; retrying", exc_info=True)
        await asyncio.sleep(PARENT_POLL_SECONDS)
    log.info("parent %d is gone; exiting", ppid)


async def serve_stdio(env: dict[str, str], ppid: int | None = None) -> None:
    """Serve the harnesses registered in the ``crosstalk.harnesses`` group (trust order)."""
    ppid = os.getppid() if ppid is None else ppid
    registry = Registry(ensure_private_dir(state_dir(env)))
    shim = Shim(registry, identifiers(shim_context(env, ppid, registry)), env=env)
    server = build_server(Tools(shim))
    try:
        with claimed_stdin() as wire:
            await _serve(server, shim, ppid, RequestLines(wire))
    finally:
        await shim.close()


async def _serve(server: Server[Any], shim: Shim, ppid: int, lines: RequestLines) -> None:
    async with stdio_server(stdin=lines) as (read, write):  # type: ignore[arg-type]
        lines.answer_to(write)
        serve = asyncio.ensure_future(
            server.run(read, write, server.create_initialization_options()))
        watch = asyncio.ensure_future(_watch_parent(ppid, shim))
        try:
            done, _ = await asyncio.wait({serve, watch}, return_when=asyncio.FIRST_COMPLETED)
            if watch in done:
                # Orphaned: clean up, then leave at once. The stdio reader is a thread
                # blocked on a stdin that may never reach EOF; an orderly shutdown would
                # wait for it forever and keep this agent looking alive.
                await shim.close()
                logging.shutdown()
                os._exit(0)
        finally:
            for task in (serve, watch):
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            # Inside the stdio context: leaving it may wait on a reader thread blocked on
            # a stdin that never closes, and the agents must be unpublished regardless.
            await shim.close()


async def _serve_until_signalled(env: dict[str, str], ppid: int | None) -> None:
    """SIGTERM/SIGINT cancel the serve task, so the shim's cleanup runs (descriptors removed)."""
    loop = asyncio.get_running_loop()
    main = asyncio.ensure_future(serve_stdio(env, ppid))
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, main.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await main


def skip_httpx_cli() -> None:
    """Keep httpx's command-line client out of this process (ADR 0034).

    ``import httpx`` imports ``httpx._main`` when rich, pygments and click are installed
    (textual, for ``crosstalk watch``, brings rich and pygments): some 70 modules and ~4 MB in
    every shim with an agent, for a CLI the shim never runs. A ``None`` entry in
    ``sys.modules`` makes that import raise ``ImportError``, which httpx catches (its
    ``httpx.main`` then says the CLI is unavailable; the ``httpx`` command is another process
    and unaffected). Once httpx is loaded there is nothing left to keep out."""
    if "httpx" not in sys.modules:
        sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]


def run_mcp(ppid: int | None = None) -> int:
    """``ppid`` is the parent as seen at process start (the parent may die during imports)."""
    skip_httpx_cli()
    env = dict(os.environ)
    logging.basicConfig(level=os.environ.get("CROSSTALK_LOG", "WARNING").upper(),
                        format="crosstalk mcp: %(levelname)s %(name)s: %(message)s")
    asyncio.run(_serve_until_signalled(env, ppid))
    return 0
