"""A fake opencode instance, written from the research notes (``opencode.md`` §3-§5).

A real HTTP/1.1 server on a real unix socket (0600, as CrossTalk's plugin serves it), speaking
the routes the opencode harness uses, emitting the events opencode 1.18.33 emits, and
publishing a real instance record as the plugin would:

- ``GET /global/health`` → ``{"healthy": true, "version"}``;
- ``GET /session?roots=true``, ``GET /session/{id}``, ``GET /session/status`` (busy only),
  ``GET /permission`` (pending), ``GET /session/{id}/message``;
- ``POST /session/{id}/prompt_async``: 404 ``NotFoundError`` for an unknown session, else 204,
  then (in a task, as opencode forks a fiber) ``message.updated`` (user) and one
  ``message.part.updated`` per part, echoing ``metadata``; unless ``noReply``, a turn:
  ``session.status`` busy, an assistant ``message.updated`` parented to the user message,
  ``session.status`` idle and ``session.idle``;
- ``GET /event``: SSE, ``server.connected`` first.

Knobs (:class:`Behaviour`) make it misbehave the ways a test needs: no evidence after a 204,
every route but health missing (another opencode version), an abort before the answer, the
instance vanishing when a prompt arrives. Run as a process
(``python -m tests.support.fakes.opencode_instance CONFIG.json -- CMD...``) it is a real
opencode-like *parent*: it serves, publishes, and runs ``CMD`` (a ``crosstalk mcp``) as its
child on its own stdin/stdout with ``OPENCODE_PID`` and ``OPENCODE=1`` set, as opencode does.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import itertools
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from crosstalk import proc

VERSION = "1.18.33"
_ids = itertools.count(1)


def new_id(prefix: str) -> str:
    return f"{prefix}_{int(time.time() * 1000):012x}{next(_ids):014d}"


@dataclass
class Behaviour:
    evidence: bool = True
    routes_missing: bool = False
    abort_next: bool = False
    #: A waking prompt joins a loop that is still running (a tool loop): it is stored, and the
    #: loop takes it only at :meth:`FakeOpencode.finish_step` (or never: ``abort``).
    hold_turns: bool = False
    #: The user aborts the running loop just after a ``GET /session/{id}/message`` has been
    #: answered (the rows sent are from before the abort): a reader racing an abort.
    abort_after_messages_read: bool = False
    vanish_on_prompt: bool = False
    #: Answer 204, then go away before storing it (disposed: the streams end).
    vanish_after_prompt: bool = False
    #: ``prompt_async`` is not a route (another version), the other routes are.
    prompt_route_missing: bool = False
    #: Health answers as something else (a socket that is not opencode's).
    not_opencode: bool = False
    #: As ``OPENCODE_SERVER_PASSWORD``: every route wants Basic ``opencode:<password>``.
    password: str | None = None


@dataclass
class Prompt:
    session: str
    body: dict[str, Any]


@dataclass
class FakeOpencode:
    socket_path: str
    directory: str
    state: str
    behaviour: Behaviour = field(default_factory=Behaviour)
    sessions: dict[str, dict[str, Any]] = field(default_factory=dict)
    busy: set[str] = field(default_factory=set)
    permissions: list[dict[str, Any]] = field(default_factory=list)
    messages: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    prompts: list[Prompt] = field(default_factory=list)
    pid: int = field(default_factory=os.getpid)
    #: Where each prompt is also appended as a JSON line (for a test in another process).
    prompts_file: str | None = None
    _server: asyncio.Server | None = None
    _streams: list[asyncio.Queue[dict[str, Any] | None]] = field(default_factory=list)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def record_path(self) -> Path:
        digest = hashlib.sha256(self.directory.encode()).hexdigest()[:12]
        return Path(self.state) / "opencode" / f"{self.pid}-{digest}.json"

    async def start(self) -> FakeOpencode:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        self._server = await asyncio.start_unix_server(self._handle, path=self.socket_path)
        os.chmod(self.socket_path, 0o600)
        self.publish()
        return self

    def publish(self, **overrides: Any) -> None:
        """Write the record as the plugin does (temp + rename, 0600, in a 0700 directory)."""
        folder = self.record_path.parent
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        record = {"format": "crosstalk-opencode-instance", "version": 1, "pid": self.pid,
                  "process_start": proc.process_start_time(self.pid),
                  "directory": self.directory, "socket": self.socket_path,
                  "opencode_version": VERSION, "written_at": time.time(), **overrides}
        tmp = folder / (self.record_path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        os.replace(tmp, self.record_path)

    async def stop(self, *, unpublish: bool = True) -> None:
        """Dispose: the streams end (``server.instance.disposed``), the files go."""
        self.emit("server.instance.disposed", {"directory": self.directory})
        for q in self._streams:
            q.put_nowait(None)
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._tasks):
            task.cancel()
        if unpublish:
            for path in (self.socket_path, str(self.record_path)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)

    # -- the model of opencode -----------------------------------------------------------

    def add_session(self, title: str | None = None, *, parent: str | None = None,
                    slug: str | None = None, emit: bool = True) -> str:
        sid = new_id("ses")
        now = int(time.time() * 1000)
        info: dict[str, Any] = {"id": sid, "slug": slug or f"slug-{len(self.sessions)}",
                                "projectID": "global", "directory": self.directory,
                                "title": title or "New session - " + time.strftime(
                                    "%Y-%m-%dT%H:%M:%S.000Z"),
                                "version": VERSION, "time": {"created": now, "updated": now}}
        if parent is not None:
            info["parentID"] = parent
        self.sessions[sid] = info
        self.messages[sid] = []
        if emit:
            self.emit("session.created", {"sessionID": sid, "info": info})
        return sid

    def rename(self, sid: str, title: str) -> None:
        self.sessions[sid]["title"] = title
        self.emit("session.updated", {"sessionID": sid, "info": self.sessions[sid]})

    def delete(self, sid: str) -> None:
        info = self.sessions.pop(sid)
        self.emit("session.deleted", {"sessionID": sid, "info": info})

    def set_busy(self, sid: str, busy: bool) -> None:
        (self.busy.add if busy else self.busy.discard)(sid)
        self.emit("session.status", {"sessionID": sid,
                                     "status": {"type": "busy" if busy else "idle"}})
        if not busy:
            self.emit("session.idle", {"sessionID": sid})

    def start_step(self, sid: str) -> str:
        """A step of a running loop: an assistant message, parented to the latest user
        message, not finished; the session busy."""
        users = [m["info"]["id"] for m in self.messages[sid] if m["info"]["role"] == "user"]
        step = {"id": new_id("msg"), "sessionID": sid, "role": "assistant",
                "parentID": users[-1] if users else None, "time": {"created": 0}}
        self.messages[sid].append({"info": step, "parts": []})
        self.emit("message.updated", {"sessionID": sid, "info": step})
        if sid not in self.busy:
            self.set_busy(sid, True)
        return str(step["id"])

    def finish_step(self, sid: str) -> None:
        """The running step ends; a user message newer than it forces one more step (which
        reads it, research §4), then the loop ends."""
        last = self.messages[sid][-1]["info"]
        if last["role"] == "user":
            self.start_step(sid)
        self.set_busy(sid, False)

    def abort(self, sid: str) -> None:
        """Esc: the running step fails with ``MessageAbortedError``; the loop ends."""
        steps = [m["info"] for m in self.messages[sid] if m["info"]["role"] == "assistant"]
        error = {"name": "MessageAbortedError", "data": {"message": "Aborted"}}
        if steps:
            steps[-1]["error"] = error
            self.emit("message.updated", {"sessionID": sid, "info": steps[-1]})
        self.emit("session.error", {"sessionID": sid, "error": error})
        self.set_busy(sid, False)

    def ask_permission(self, sid: str) -> str:
        pid = new_id("per")
        perm = {"id": pid, "sessionID": sid, "permission": "bash", "patterns": ["*"],
                "tool": {"messageID": new_id("msg"), "callID": "call_1"}}
        self.permissions.append(perm)
        self.emit("permission.asked", perm)
        return pid

    def emit(self, kind: str, properties: dict[str, Any]) -> None:
        event = {"id": new_id("evt"), "type": kind, "properties": properties}
        for q in self._streams:
            q.put_nowait(event)

    def texts(self, sid: str) -> list[str]:
        """The visible text of every prompt that reached ``sid`` (what the user sees)."""
        return [p["text"] for pr in self.prompts if pr.session == sid
                for p in pr.body.get("parts", []) if not p.get("synthetic")]

    async def _store(self, sid: str, body: dict[str, Any]) -> None:
        await asyncio.sleep(0.01)  # a forked fiber: after the 204
        if not self.behaviour.evidence:
            return
        uid = new_id("msg")
        user = {"id": uid, "sessionID": sid, "role": "user", "time": {"created": 0}}
        parts = [{**p, "id": new_id("prt"), "sessionID": sid, "messageID": uid}
                 for p in body.get("parts", [])]
        self.messages[sid].append({"info": user, "parts": parts})
        self.emit("message.updated", {"sessionID": sid, "info": user})
        for part in parts:
            self.emit("message.part.updated", {"sessionID": sid, "part": part,
                                               "time": time.time()})
        if body.get("noReply"):
            return
        if self.behaviour.hold_turns:
            if sid not in self.busy:
                self.start_step(sid)
            return
        self.set_busy(sid, True)
        if self.behaviour.abort_next:
            self.behaviour.abort_next = False
            self.emit("session.error", {"sessionID": sid, "error": {
                "name": "MessageAbortedError", "data": {"message": "Aborted"}}})
            self.set_busy(sid, False)
            return
        answer = {"id": new_id("msg"), "sessionID": sid, "role": "assistant",
                  "parentID": uid, "time": {"created": 0}}
        self.messages[sid].append({"info": answer, "parts": []})
        self.emit("message.updated", {"sessionID": sid, "info": answer})
        self.set_busy(sid, False)

    # -- HTTP ----------------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, target, _ = lines[0].split(" ", 2)
            headers = {k.strip().lower(): v.strip() for k, _, v in
                       (line.partition(":") for line in lines[1:] if line)}
            length = int(headers.get("content-length") or 0)
            raw = await reader.readexactly(length) if length else b""
            url = urlsplit(target)
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            if self.behaviour.password is not None:
                want = base64.b64encode(f"opencode:{self.behaviour.password}".encode())
                if headers.get("authorization", "") != "Basic " + want.decode():
                    await _answer(writer, 401, "Unauthorized")
                    return
            if url.path == "/event" and not self.behaviour.routes_missing:
                await self._stream(writer)
                return
            status, body = await self._route(method, unquote(url.path), query, raw)
            if status is None:
                writer.transport.abort()  # vanished mid-request
                return
            await _answer(writer, status, body)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError,
                asyncio.CancelledError):
            pass  # a client gone, or the instance disposed under a stream
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _stream(self, writer: asyncio.StreamWriter) -> None:
        q: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._streams.append(q)
        try:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                         b"cache-control: no-cache\r\nconnection: close\r\n\r\n")
            q.put_nowait({"id": new_id("evt"), "type": "server.connected", "properties": {}})
            while (event := await q.get()) is not None:
                writer.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                await writer.drain()
        finally:
            self._streams.remove(q)

    async def _route(self, method: str, path: str, query: dict[str, str],
                     raw: bytes) -> tuple[int | None, Any]:
        if path == "/global/health":
            if self.behaviour.not_opencode:
                return 200, {"hello": "world"}
            return 200, {"healthy": True, "version": VERSION}
        if self.behaviour.routes_missing:
            return 404, "404 Not Found"
        parts = path.strip("/").split("/")
        if method == "GET" and path == "/session":
            rows = sorted(self.sessions.values(), key=lambda s: -s["time"]["updated"])
            if query.get("roots") == "true":
                rows = [s for s in rows if "parentID" not in s]
            return 200, rows
        if method == "GET" and path == "/session/status":
            return 200, {sid: {"type": "busy"} for sid in self.busy}
        if method == "GET" and path == "/permission":
            return 200, self.permissions
        if len(parts) >= 2 and parts[0] == "session":
            sid = parts[1]
            if sid not in self.sessions:
                return 404, {"name": "NotFoundError",
                             "data": {"message": f"Session not found: {sid}"}}
            if method == "GET" and len(parts) == 2:
                return 200, self.sessions[sid]
            if method == "GET" and parts[2:] == ["message"]:
                return 200, self._messages_of(sid)
            if method == "POST" and parts[2:] == ["prompt_async"]:
                return self._prompt(sid, raw)
        return 404, "404 Not Found"

    def _messages_of(self, sid: str) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = json.loads(json.dumps(self.messages[sid]))  # as sent
        if self.behaviour.abort_after_messages_read:
            self.behaviour.abort_after_messages_read = False
            asyncio.get_running_loop().call_soon(self.abort, sid)
        return rows

    def _prompt(self, sid: str, raw: bytes) -> tuple[int | None, Any]:
        if self.behaviour.prompt_route_missing:
            return 404, "404 Not Found"
        body = json.loads(raw or b"{}")
        if not isinstance(body, dict) or not isinstance(body.get("parts"), list):
            return 400, {"name": "BadRequest"}
        self.prompts.append(Prompt(sid, body))
        if self.prompts_file:
            with open(self.prompts_file, "a") as f:
                f.write(json.dumps({"session": sid, "body": body}) + "\n")
        if self.behaviour.vanish_on_prompt:
            task = asyncio.get_running_loop().create_task(self.stop())
            self._tasks.add(task)
            return None, None
        if self.behaviour.vanish_after_prompt:
            task = asyncio.get_running_loop().create_task(self.stop())
            self._tasks.add(task)
            return 204, None
        task = asyncio.get_running_loop().create_task(self._store(sid, body))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return 204, None


async def _answer(writer: asyncio.StreamWriter, status: int, body: Any) -> None:
    if body is None:
        data = b""
        kind = b"text/plain"
    elif isinstance(body, str):
        data, kind = body.encode(), b"text/plain"
    else:
        data, kind = json.dumps(body).encode(), b"application/json"
    writer.write(f"HTTP/1.1 {status} X\r\n".encode() + b"content-type: " + kind +
                 f"\r\ncontent-length: {len(data)}\r\nconnection: close\r\n\r\n".encode() +
                 data)
    await writer.drain()


# -- as a process: an opencode-like parent of a shim ----------------------------------------


async def _control(fake: FakeOpencode, path: str) -> None:
    """Commands from the test, one JSON line each appended to ``path``: ``{"op": "session",
    "title"}``, ``{"op": "busy", "sid", "busy"}``, ``{"op": "delete", "sid"}``. Each applied
    command's result is appended to ``path + ".out"``."""
    done = 0
    while True:
        with contextlib.suppress(FileNotFoundError):
            lines = Path(path).read_text().splitlines()
            for line in lines[done:]:
                cmd = json.loads(line)
                result: Any = None
                if cmd["op"] == "session":
                    result = fake.add_session(cmd.get("title"), parent=cmd.get("parent"))
                elif cmd["op"] == "busy":
                    fake.set_busy(cmd["sid"], bool(cmd["busy"]))
                elif cmd["op"] == "delete":
                    fake.delete(cmd["sid"])
                with open(path + ".out", "a") as out:
                    out.write(json.dumps({"result": result}) + "\n")
            done = len(lines)
        await asyncio.sleep(0.05)


async def _main(config: dict[str, Any], command: list[str]) -> int:
    fake = await FakeOpencode(config["socket"], config["directory"], config["state"],
                              prompts_file=config.get("prompts")).start()
    control = asyncio.get_running_loop().create_task(_control(fake, config["control"]))
    env = {**os.environ, "OPENCODE": "1", "OPENCODE_PID": str(os.getpid()), "AGENT": "1"}
    child = await asyncio.create_subprocess_exec(*command, env=env, cwd=config["directory"])
    code = await child.wait()
    control.cancel()
    await fake.stop()
    return code


if __name__ == "__main__":
    sep = sys.argv.index("--")
    cfg = json.loads(Path(sys.argv[1]).read_text())
    sys.exit(asyncio.run(_main(cfg, sys.argv[sep + 1:])))
