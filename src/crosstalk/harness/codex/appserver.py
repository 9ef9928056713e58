"""A client of Codex's app-server: JSON-RPC over WebSocket on its control unix socket.

Facts (research ``codex.md`` §1-§3, Codex 0.169.0): the control socket is
``$CODEX_HOME/app-server-control/app-server-control.sock``; it speaks the WebSocket handshake,
then one JSON-RPC message per text frame, with no ``"jsonrpc"`` field. ``initialize`` comes
first (a request before it fails ``Not initialized``). The server sends notifications
(``{"method", "params"}``) and may send requests of its own (approvals, elicitations), which a
client that takes no part in turns answers with an error.

Every message to or from the server that names a thread (``params.threadId``, or the answer
to a request that did) is handed to that thread's agent's capture tap
(:mod:`crosstalk.capture.tap`), as the text that crossed the socket.

Every request has a deadline. What a failure means for a delivery is the caller's business,
but this module keeps the facts apart: :class:`NotSent` (nothing left this process: connect
or write failed) versus :class:`NoAnswer` (sent, then the connection closed or the deadline
passed) versus :class:`ServerError` (the server answered with an error).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:  # websockets loads with the first connection, not at shim start (ADR 0033)
    from websockets.asyncio.client import ClientConnection

from crosstalk import __version__
from crosstalk.capture.tap import CODEX_RPC, IN, OUT, TAPS
from crosstalk.core.ids import agent_id_for

log = logging.getLogger(__name__)

REQUEST_TIMEOUT: Final = 10.0
CONNECT_TIMEOUT: Final = 3.0
#: Notifications we never want (one per streamed token).
_OPT_OUT: Final = ["item/agentMessage/delta"]


class AppServerError(Exception):
    pass


class NotSent(AppServerError):
    """Nothing reached the server (connect, handshake or write failed)."""


class NoAnswer(AppServerError):
    """The request left this process, but no answer came (closed or timed out)."""


class ServerError(AppServerError):
    """The server answered with a JSON-RPC error."""

    def __init__(self, code: int | None, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


class AppServer:
    """One initialized connection. ``async with AppServer(path) as s: await s.request(...)``."""

    def __init__(self, path: str, *, timeout: float = REQUEST_TIMEOUT) -> None:
        self.path = path
        self.timeout = timeout
        self._ws: ClientConnection | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._reader: asyncio.Task[None] | None = None
        self.info: dict[str, Any] = {}
        #: Request id -> the agent its thread is, for the answer's capture.
        self._tapped: dict[int, str] = {}

    async def __aenter__(self) -> AppServer:
        await self.connect()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    async def connect(self) -> None:
        from websockets.asyncio.client import unix_connect  # first use (ADR 0033)
        from websockets.exceptions import WebSocketException  # first use (ADR 0033)
        try:
            self._ws = await asyncio.wait_for(
                unix_connect(self.path, uri="ws://localhost/", max_size=32 * 1024 * 1024,
                             open_timeout=CONNECT_TIMEOUT, compression=None),
                CONNECT_TIMEOUT + 1)
        except (OSError, TimeoutError, WebSocketException) as exc:
            raise NotSent(f"cannot connect to {self.path}: {exc!r}") from None
        self._reader = asyncio.get_running_loop().create_task(self._read())
        try:
            self.info = await self.request("initialize", {
                "clientInfo": {"name": "crosstalk", "title": "CrossTalk",
                               "version": __version__},
                "capabilities": {"experimentalApi": False,
                                 "optOutNotificationMethods": _OPT_OUT}})
        except NoAnswer as exc:
            await self.close()
            raise NotSent(f"no answer to initialize: {exc}") from None
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            with contextlib.suppress(Exception):
                await ws.close()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(BaseException):
                await self._reader
            self._reader = None
        self._fail_pending(NoAnswer("connection closed"))

    async def request(self, method: str, params: Mapping[str, Any] | None = None, *,
                      timeout: float | None = None) -> Any:
        ws = self._ws
        if ws is None:
            raise NotSent("not connected")
        rid = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        text = json.dumps({"id": rid, "method": method, "params": dict(params or {})})
        if TAPS.capturing and (agent := _agent_of(params)) is not None:
            self._tapped[rid] = agent
            TAPS.emit(agent, CODEX_RPC, OUT, text, endpoint=self.path)
        from websockets.exceptions import WebSocketException  # first use (ADR 0033)
        try:
            try:
                await ws.send(text)
            except (OSError, WebSocketException) as exc:
                raise NotSent(f"{method}: send failed: {exc!r}") from None
            try:
                return await asyncio.wait_for(asyncio.shield(future),
                                              self.timeout if timeout is None else timeout)
            except TimeoutError:
                raise NoAnswer(f"{method}: no answer in time") from None
        finally:
            self._pending.pop(rid, None)
            self._tapped.pop(rid, None)

    async def _read(self) -> None:
        from websockets.exceptions import WebSocketException  # first use (ADR 0033)
        ws = self._ws
        assert ws is not None
        try:
            async for raw in ws:
                try:
                    msg = json.loads(raw)
                except ValueError:
                    log.debug("app-server %s: not JSON", self.path)
                    continue
                if isinstance(msg, dict):
                    self._capture(msg, raw)
                    await self._on_message(ws, msg)
        except (OSError, WebSocketException) as exc:
            log.debug("app-server %s: connection ended: %r", self.path, exc)
        finally:
            self._fail_pending(NoAnswer("connection closed"))

    async def _on_message(self, ws: ClientConnection, msg: dict[str, Any]) -> None:
        from websockets.exceptions import WebSocketException  # first use (ADR 0033)
        if "method" in msg and "id" in msg:
            # A request from the server (an approval, an elicitation): we take no part.
            with contextlib.suppress(OSError, WebSocketException):
                await ws.send(json.dumps({"id": msg["id"], "error": {
                    "code": -32601, "message": "crosstalk does not handle server requests"}}))
            return
        rid = msg.get("id")
        future = self._pending.get(rid) if isinstance(rid, int) else None
        if future is None or future.done():
            return  # a notification, or an answer nobody waits for
        error = msg.get("error")
        if isinstance(error, dict):
            code = error.get("code")
            future.set_exception(ServerError(code if isinstance(code, int) else None,
                                             str(error.get("message", ""))[:500]))
        else:
            future.set_result(msg.get("result"))

    def _capture(self, msg: dict[str, Any], raw: str | bytes) -> None:
        if not TAPS.capturing:
            return
        rid = msg.get("id")
        agent = (self._tapped.get(rid) if isinstance(rid, int) and "method" not in msg
                 else _agent_of(msg.get("params")))
        if agent is not None:
            TAPS.emit(agent, CODEX_RPC, IN, raw, endpoint=self.path)

    def _fail_pending(self, exc: AppServerError) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(exc)
                future.exception()  # mark retrieved: nobody may be waiting any more


def _agent_of(params: object) -> str | None:
    """The agent a message's thread is (a Codex agent's session_ref is its thread id)."""
    thread = params.get("threadId") if isinstance(params, Mapping) else None
    return agent_id_for("codex", thread) if isinstance(thread, str) and thread else None
