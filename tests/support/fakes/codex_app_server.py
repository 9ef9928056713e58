"""A fake Codex app-server for integration tests, written from the protocol notes
(research ``codex.md`` §1-§3): WebSocket over a unix socket, JSON-RPC without ``"jsonrpc"``,
``initialize`` first, threads that are loaded or not, ``turn/start`` (a new turn when idle,
the running turn's id when active) and ``thread/inject_items`` (silent append).

Everything that reached a thread is recorded in :attr:`FakeAppServer.inputs`, as the model
would see it on its next request.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, unix_serve


@dataclass
class Thread:
    id: str
    name: str | None = None
    cwd: str = "/"
    status: str = "idle"  # idle | active | notLoaded | systemError
    ephemeral: bool = False
    thread_source: str = "user"
    parent: str | None = None
    turn: str | None = None

    def wire(self) -> dict[str, Any]:
        status: dict[str, Any] = {"type": self.status}
        if self.status == "active":
            status["activeFlags"] = []
        return {"id": self.id, "name": self.name, "cwd": self.cwd, "status": status,
                "ephemeral": self.ephemeral, "threadSource": self.thread_source,
                "parentThreadId": self.parent, "source": "vscode"}


@dataclass
class Input:
    thread: str
    how: str  # "turn/start" | "inject_items"
    text: str
    turn: str | None


@dataclass
class FakeAppServer:
    path: Path
    threads: dict[str, Thread] = field(default_factory=dict)
    inputs: list[Input] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    #: method -> error message to answer with, once.
    fail: dict[str, str] = field(default_factory=dict)
    #: methods to swallow without an answer (a server that hangs).
    hang: set[str] = field(default_factory=set)
    #: methods carried out whose answer is lost (the connection stays silent).
    lose_answer: set[str] = field(default_factory=set)
    #: thread id -> its turns, oldest first: {"id", "items": [userMessage items]}.
    turns: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    _server: Server | None = None
    _ids: Any = field(default_factory=lambda: itertools.count(1))

    def add(self, name: str | None = None, **kw: Any) -> Thread:
        t = Thread(id=str(uuid.uuid4()), name=name, **kw)
        self.threads[t.id] = t
        return t

    def texts(self, thread: str) -> list[str]:
        return [i.text for i in self.inputs if i.thread == thread]

    async def start(self) -> FakeAppServer:
        self._server = await unix_serve(self._handle, str(self.path))
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        with contextlib.suppress(OSError):
            self.path.unlink()

    async def _handle(self, ws: ServerConnection) -> None:
        initialized = False
        async for raw in ws:
            msg = json.loads(raw)
            self.requests.append(msg)
            method, rid, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
            if rid is None:
                continue  # a notification
            if method in self.hang:
                continue
            if method in self.fail:
                await ws.send(json.dumps({"id": rid, "error": {
                    "code": -32600, "message": self.fail.pop(method)}}))
                continue
            if method == "initialize":
                if initialized:
                    result: Any = None
                    await ws.send(json.dumps({"id": rid, "error": {
                        "code": -32600, "message": "Already initialized"}}))
                    continue
                initialized = True
                result = {"userAgent": "fake/0.169.0", "codexHome": str(self.path.parent)}
            elif not initialized:
                await ws.send(json.dumps({"id": rid, "error": {
                    "code": -32600, "message": "Not initialized"}}))
                continue
            else:
                try:
                    result = self._call(method, params)
                except KeyError as exc:
                    await ws.send(json.dumps({"id": rid, "error": {
                        "code": -32600, "message": str(exc.args[0])}}))
                    continue
                if method in self.lose_answer:
                    continue
            await ws.send(json.dumps({"id": rid, "result": result}))

    def _loaded(self, tid: Any) -> Thread:
        t = self.threads.get(tid) if isinstance(tid, str) else None
        if t is None or t.status == "notLoaded":
            raise KeyError(f"thread not found: {tid}")
        return t

    def _call(self, method: str, params: dict[str, Any]) -> Any:
        if method == "thread/loaded/list":
            return {"data": [t.id for t in self.threads.values() if t.status != "notLoaded"],
                    "nextCursor": None}
        if method == "thread/read":
            t = self.threads.get(params.get("threadId", ""))
            if t is None:
                raise KeyError(f"thread not found: {params.get('threadId')}")
            return {"thread": t.wire()}
        if method == "turn/start":
            t = self._loaded(params.get("threadId"))
            text = "".join(i.get("text", "") for i in params.get("input", []))
            if t.turn is None or t.status != "active":
                t.turn, t.status = f"turn-{next(self._ids)}", "active"
                self.turns.setdefault(t.id, []).append({"id": t.turn, "items": []})
            self.turns[t.id][-1]["items"].append({
                "type": "userMessage", "content": [{"type": "text", "text": text}]})
            self.inputs.append(Input(t.id, "turn/start", text, t.turn))
            return {"turn": {"id": t.turn, "status": "inProgress", "items": []}}
        if method == "thread/turns/list":
            t = self._loaded(params.get("threadId"))
            return {"data": list(reversed(self.turns.get(t.id, []))), "nextCursor": None}
        if method == "thread/inject_items":
            t = self._loaded(params.get("threadId"))
            for item in params.get("items", []):
                if not isinstance(item, dict) or "type" not in item:
                    raise KeyError("items[0] is not a valid response item: missing field "
                                   "`type`")
                text = "".join(c.get("text", "") for c in item.get("content", []))
                self.inputs.append(Input(t.id, "inject_items", text, None))
            return {}
        raise KeyError(f"unknown method {method}")


@contextlib.asynccontextmanager
async def fake_app_server(path: Path) -> AsyncIterator[FakeAppServer]:
    path.parent.mkdir(parents=True, exist_ok=True)
    server = await FakeAppServer(path).start()
    try:
        yield server
    finally:
        await server.stop()


def finish_turn(server: FakeAppServer, thread: str) -> None:
    """The running turn of ``thread`` ends (the thread goes idle)."""
    t = server.threads[thread]
    t.status, t.turn = "idle", None
