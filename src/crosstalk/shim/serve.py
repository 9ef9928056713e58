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
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mcp.server import Server
from mcp.server.stdio import stdio_server

from crosstalk.config import ensure_private_dir, state_dir
from crosstalk.shim.catalog import build_server
from crosstalk.shim.stdio import RequestLines, claimed_stdin

if TYPE_CHECKING:  # built after the first tools/list answer (ADR 0043)
    from crosstalk.shim.roster import Shim
    from crosstalk.shim.tools import Tools

log = logging.getLogger(__name__)
PARENT_POLL_SECONDS = 0.5
#: From a tools/list answer to the build: the answer's write (a transport thread) goes first.
BUILD_AFTER_LIST_SECONDS = 0.01
#: A harness that never lists tools still gets its eager sessions registered this soon.
BUILD_AT_THE_LATEST_SECONDS = 1.0


class ShimBuild:
    """The shim and its tools, built once, after the first ``tools/list`` is answered.

    Building imports the registry, the directory and every harness plugin and runs their
    identifiers: tens of ms that the answer does not need (ADR 0043). The build starts on the
    first of: a ``tools/list`` answered (after a moment, so its write goes first), a
    ``tools/call`` (which waits for it), or :data:`BUILD_AT_THE_LATEST_SECONDS` after serving
    starts. A failed build fails every call that waits on it with its error, and is logged.
    """

    def __init__(self, build: Callable[[], tuple[Shim, Tools]]) -> None:
        self._build = build
        self._task: asyncio.Task[tuple[Shim, Tools]] | None = None
        self._finished = asyncio.Event()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="shim build")

    def start_soon(self, delay: float = BUILD_AFTER_LIST_SECONDS) -> None:
        if self._task is None:
            asyncio.get_running_loop().call_later(delay, self.start)

    async def _run(self) -> tuple[Shim, Tools]:
        try:
            return self._build()
        except Exception:
            log.exception("building the shim failed")
            raise
        finally:
            self._finished.set()

    async def finished(self, timeout: float) -> bool:
        """Whether the build has ended (built or failed), waiting up to ``timeout``."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._finished.wait(), timeout)
        return self._finished.is_set()

    async def tools(self) -> Tools:
        self.start()
        assert self._task is not None
        return (await asyncio.shield(self._task))[1]

    @property
    def shim(self) -> Shim | None:
        """The shim if it is built; ``None`` before that or if the build failed."""
        task = self._task
        if task is None or not task.done() or task.cancelled() or task.exception() is not None:
            return None
        return task.result()[0]

    async def close(self) -> None:
        """Close the shim, waiting for a build under way (its agents must be unpublished)."""
        if self._task is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._task)
        shim = self.shim
        if shim is not None:
            await shim.close()


async def _watch_parent(ppid: int, build: ShimBuild) -> None:
    """Poll the parent (gone: return, the shim exits) and keep eager sessions in step."""
    reported = None
    while os.getppid() == ppid:
        if not await build.finished(PARENT_POLL_SECONDS):
            continue  # the first sync follows the build at once, not a poll later
        shim = build.shim
        try:
            if shim is not None:
                await shim.sync()
        except Exception as exc:
            from crosstalk.store.registry import RegistryError, StatePathError
            if not isinstance(exc, (RegistryError, StatePathError)):
                log.warning("registering this session failed; retrying", exc_info=True)
            elif str(exc) != reported:
                # e.g. the agent lock still held by an exiting predecessor, or a directory
                # where a lock belongs: the message says why and what to do; once per reason,
                # not per poll.
                reported = str(exc)
                log.warning("registering this session failed; retrying: %s", exc)
        await asyncio.sleep(PARENT_POLL_SECONDS)
    log.info("parent %d is gone; exiting", ppid)


async def serve_stdio(env: dict[str, str], ppid: int | None = None) -> None:
    """Serve the harnesses registered in the ``crosstalk.harnesses`` group (trust order)."""
    ppid = os.getppid() if ppid is None else ppid
    home = ensure_private_dir(state_dir(env))  # a bad state dir fails the start, as it says why

    def build() -> tuple[Shim, Tools]:
        from crosstalk.shim.build import build_shim
        return build_shim(env, ppid, home)

    shim = ShimBuild(build)
    server = build_server(shim.tools, on_listed=shim.start_soon)
    try:
        with claimed_stdin() as wire:
            await _serve(server, shim, ppid, RequestLines(wire))
    finally:
        await shim.close()


async def _serve(server: Server[Any], shim: ShimBuild, ppid: int, lines: RequestLines) -> None:
    async with stdio_server(stdin=lines) as (read, write):  # type: ignore[arg-type]
        lines.answer_to(write)
        serve = asyncio.ensure_future(
            server.run(read, write, server.create_initialization_options()))
        watch = asyncio.ensure_future(_watch_parent(ppid, shim))
        shim.start_soon(BUILD_AT_THE_LATEST_SECONDS)
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
