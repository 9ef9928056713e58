"""Real OpenAI Codex threads, driven through Codex's own app-server against our mock Responses
API, with nothing but loopback.

The layers mirror ``claude.py`` (whose :class:`~tests.live.support.claude.Netns` they reuse):

* :class:`CodexWorld` — what the Codex threads of one test share: a throw-away ``CODEX_HOME``
  whose ``config.toml`` points a custom model provider at our mock (a dummy key) and registers
  CrossTalk as the MCP server ``crosstalk``; one mock Responses API (requests told apart by
  their ``thread-id`` header); one ``codex app-server --listen unix://`` (the shared server a
  Codex TUI would use: ``$CODEX_HOME/app-server-control/app-server-control.sock``). Built with
  ``share=<a Claude World>`` it uses that world's HOME, CROSSTALK_HOME, XDG_RUNTIME_DIR,
  CLAUDE_CONFIG_DIR and network namespace, so one test's Claude sessions and Codex threads see
  each other as on a real machine.
* :class:`AppServer` — that process, started in the namespace with ``nsenter``; stopped with
  SIGTERM (it removes its socket and symlink, and its MCP children go with it).
* :class:`AppServerClient` — the test's own client: JSON-RPC over a WebSocket over the unix
  socket (standard library only; unix sockets cross the namespace boundary).
* :class:`CodexThread` — one thread (``thread/start {cwd}``): turns, its mock requests, its
  CrossTalk descriptor.

Codex 0.169.0 facts this relies on (the Codex research notes, checked live here): one MCP
server process per loaded thread, a child of the app-server; every ``tools/call`` carries
``_meta.threadId``; the model sees MCP tools as the Responses namespace ``mcp__crosstalk``
and must call them as ``{"type": "function_call", "namespace": "mcp__crosstalk", "name": …}``.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import queue
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.live.support.claude import (
    SYSTEM_PATH,
    Entry,
    LiveError,
    Mock,
    Netns,
    _die_with_parent,
    alive,
    cmdline,
    descendants,
    kill_all,
    settle_members,
    wait_for,
)
from tests.live.support.mock_responses import input_items, item_text

if TYPE_CHECKING:
    from tests.live.support.claude import World

HERE = Path(__file__).resolve().parent
MOCK_SCRIPT = HERE / "mock_responses.py"
#: The model provider's ``env_key`` and its dummy value (only the mock ever sees it).
KEY_VAR = "CROSSTALK_LIVE_MOCK_KEY"
API_KEY = "sk-crosstalk-live-dummy-000000000000"
MODEL = "mock-model"
#: Forwarded from the app-server's environment into every ``crosstalk mcp`` it starts.
ENV_VARS = ["CODEX_HOME", "CLAUDE_CONFIG_DIR", "XDG_RUNTIME_DIR", "XDG_STATE_HOME",
            "CROSSTALK_HOME"]
NAMESPACE = "mcp__crosstalk"
SHIM_ARGV = ["-m", "crosstalk", "mcp"]


def text_input(text: str) -> list[dict[str, Any]]:
    """A ``UserInput`` list of one text item."""
    return [{"type": "text", "text": text, "text_elements": []}]


def _toml(value: Any) -> str:
    """A TOML value for a string, list of strings or flat table (JSON string escapes are
    valid TOML basic-string escapes)."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML for {value!r}")


# -- the mock Responses API ------------------------------------------------------------------


class ResponsesMock(Mock):
    """Our mock Responses API, running inside the namespace; steered over its control socket."""

    script = MOCK_SCRIPT
    stem = "responses"
    label = "mock Responses API"

    @property
    def base_url(self) -> str:
        """What Codex's provider ``base_url`` is: it appends ``/responses``."""
        return f"http://127.0.0.1:{self.port}/v1"


# -- helpers on logged requests ---------------------------------------------------------------


def function_calls(entry: Entry) -> list[dict[str, Any]]:
    """The function_call items the mock answered this request with."""
    return [i for i in entry.get("response") or [] if i.get("type") == "function_call"]


def call_outputs(entry: Entry) -> list[dict[str, Any]]:
    """Every function_call_output item in the request's input (the whole history)."""
    body = entry.get("body")
    if not isinstance(body, dict):
        return []
    return [i for i in input_items(body) if i.get("type") == "function_call_output"]


def call_output(entry: Entry, call_id: str) -> dict[str, Any] | None:
    return next((i for i in call_outputs(entry) if i.get("call_id") == call_id), None)


def output_json(item: dict[str, Any]) -> dict[str, Any]:
    """The JSON object a CrossTalk tool returned, as the model saw it in a function_call_output.

    Codex wraps an MCP result as ``[{"type": "input_text", "text": "Wall time: … seconds\\n
    Output:"}, {"type": "input_text", "text": "<tool text>"}]``; the tool's text is the last
    part that parses as a JSON object."""
    output = item.get("output")
    parts = ([output] if isinstance(output, str)
             else [p.get("text") for p in output or [] if isinstance(p, dict)])
    for part in reversed(parts):
        if not isinstance(part, str):
            continue
        start = part.find("{")
        if start < 0:
            continue
        with contextlib.suppress(ValueError):
            data = json.loads(part[start:])
            if isinstance(data, dict):
                return data
    raise AssertionError(f"no JSON object in the function_call_output: {output!r}")


def message_texts(entry: Entry) -> list[tuple[str, str]]:
    """``(role, text)`` of every message item of the request's input, in order."""
    body = entry.get("body")
    if not isinstance(body, dict):
        return []
    return [(str(i.get("role")), item_text(i)) for i in input_items(body)
            if i.get("type", "message") == "message"]


def request_text(entry: Entry) -> str:
    """The text of every message and call output of the request's input."""
    body = entry.get("body")
    if not isinstance(body, dict):
        return ""
    return "\n".join(item_text(i) for i in input_items(body))


def namespace_tools(entry: Entry, namespace: str = NAMESPACE) -> list[str]:
    """The function names the request offers in the Responses ``namespace`` tool
    ``namespace`` (how Codex exposes an MCP server's tools)."""
    body = entry.get("body")
    for tool in (body.get("tools") if isinstance(body, dict) else None) or []:
        if isinstance(tool, dict) and tool.get("type") == "namespace" \
                and tool.get("name") == namespace:
            return [str(t.get("name")) for t in tool.get("tools") or [] if isinstance(t, dict)]
    return []


# -- a WebSocket client over a unix socket ----------------------------------------------------


class UnixWebSocket:
    """RFC 6455 client framing (text frames, masked; ping answered) over a unix socket: what
    ``codex app-server --listen unix://`` speaks. Standard library only."""

    def __init__(self, path: Path, timeout: float = 10.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(("GET / HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n"
                           "Connection: Upgrade\r\nSec-WebSocket-Key: " + key + "\r\n"
                           "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError(f"closed during the WebSocket handshake: {buf!r}")
            buf += chunk
        head, self._rest = buf.split(b"\r\n\r\n", 1)
        status = head.split(b"\r\n", 1)[0]
        if b" 101 " not in status + b" ":
            raise ConnectionError(f"WebSocket handshake refused: {head.decode(errors='replace')}")
        self.sock.settimeout(None)
        self._wlock = threading.Lock()

    def send(self, payload: bytes, opcode: int = 1) -> None:
        n = len(payload)
        if n < 126:
            header = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
        elif n < 1 << 16:
            header = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
        else:
            header = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i & 3] for i, b in enumerate(payload))
        with self._wlock:
            self.sock.sendall(header + mask + masked)

    def _exact(self, n: int) -> bytes:
        while len(self._rest) < n:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise EOFError
            self._rest += chunk
        out, self._rest = self._rest[:n], self._rest[n:]
        return out

    def messages(self) -> Iterator[str]:
        """Each text message until the server closes (fragments reassembled)."""
        parts = b""
        try:
            while True:
                b0, b1 = self._exact(2)
                n = b1 & 0x7F
                if n == 126:
                    n = struct.unpack("!H", self._exact(2))[0]
                elif n == 127:
                    n = struct.unpack("!Q", self._exact(8))[0]
                mask = self._exact(4) if b1 & 0x80 else b""
                data = self._exact(n)
                if mask:
                    data = bytes(b ^ mask[i & 3] for i, b in enumerate(data))
                opcode = b0 & 0x0F
                if opcode == 9:
                    self.send(data, opcode=10)
                elif opcode == 8:
                    return
                elif opcode in (0, 1, 2):
                    parts += data
                    if b0 & 0x80:
                        yield parts.decode()
                        parts = b""
        except (EOFError, OSError):
            return

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.send(struct.pack("!H", 1000), opcode=8)
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class RpcError(RuntimeError):
    """The app-server answered a request with an error."""

    def __init__(self, method: str, error: dict[str, Any]) -> None:
        super().__init__(f"{method}: {error.get('message')} ({error.get('code')})")
        self.method, self.error = method, error


class AppServerClient:
    """A JSON-RPC client of the app-server (messages carry no ``"jsonrpc"`` field).

    Every notification is kept in :attr:`notifications` (never consumed), so a test can wait
    for one that arrived before it started waiting. Server requests (approvals, elicitations)
    are declined and noted in :attr:`server_requests`: with ``approval_policy = "never"`` none
    is expected."""

    def __init__(self, path: Path, name: str = "crosstalk_live") -> None:
        self.name = name
        self.ws = UnixWebSocket(path)
        self._next = 1
        self._pending: dict[int, queue.Queue[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self._cond = threading.Condition()
        self.notifications: list[dict[str, Any]] = []
        self.server_requests: list[dict[str, Any]] = []
        self.closed = False
        self._reader = threading.Thread(target=self._read, name=f"appserver-{name}",
                                        daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for raw in self.ws.messages():
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            if "id" in msg and "method" not in msg:
                with self._lock:
                    waiter = self._pending.pop(msg["id"], None)
                if waiter is not None:
                    waiter.put(msg)
            elif "id" in msg:
                self.server_requests.append(msg)
                self._send({"id": msg["id"], "error": {
                    "code": -32601, "message": "the CrossTalk live tests answer no requests"}})
            else:
                with self._cond:
                    self.notifications.append(msg)
                    self._cond.notify_all()
        with self._cond:
            self.closed = True
            self._cond.notify_all()
        with self._lock:
            for waiter in self._pending.values():
                waiter.put({"error": {"code": -1, "message": "connection closed"}})
            self._pending.clear()

    def _send(self, msg: dict[str, Any]) -> None:
        self.ws.send(json.dumps(msg).encode())

    def request(self, method: str, params: dict[str, Any] | None = None,
                timeout: float = 30.0) -> dict[str, Any]:
        """The result of ``method``; :class:`RpcError` if the server answered an error."""
        waiter: queue.Queue[dict[str, Any]] = queue.Queue()
        with self._lock:
            rid = self._next
            self._next += 1
            self._pending[rid] = waiter
        msg: dict[str, Any] = {"id": rid, "method": method}
        if params is not None:
            msg["params"] = params
        self._send(msg)
        try:
            reply = waiter.get(timeout=timeout)
        except queue.Empty:
            with self._lock:
                self._pending.pop(rid, None)
            raise TimeoutError(f"app-server {method}: no answer within {timeout:.0f} s") from None
        if "error" in reply:
            raise RpcError(method, reply["error"])
        result: dict[str, Any] = reply.get("result") or {}
        return result

    def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        self._send({"method": method, **({"params": params} if params is not None else {})})

    def initialize(self) -> dict[str, Any]:
        result = self.request("initialize", {
            "clientInfo": {"name": self.name, "title": "CrossTalk live tests",
                           "version": "0"},
            "capabilities": {"experimentalApi": True,
                             "optOutNotificationMethods": ["item/agentMessage/delta"]}})
        self.notify("initialized")
        return result

    def mark(self) -> int:
        with self._cond:
            return len(self.notifications)

    def wait_notification(self, predicate: Callable[[dict[str, Any]], bool],
                          timeout: float = 30.0, *, since: int = 0) -> dict[str, Any]:
        """The first notification at index ``>= since`` matching ``predicate``."""
        deadline = time.monotonic() + timeout
        index = since
        with self._cond:
            while True:
                while index < len(self.notifications):
                    note = self.notifications[index]
                    index += 1
                    if predicate(note):
                        return note
                left = deadline - time.monotonic()
                if self.closed or left <= 0:
                    seen = sorted({n.get("method", "?") for n in self.notifications[since:]})
                    raise TimeoutError(
                        f"no matching app-server notification within {timeout:.0f} s"
                        f"{' (connection closed)' if self.closed else ''}; seen: {seen}")
                self._cond.wait(left)

    def close(self) -> None:
        self.ws.close()
        self._reader.join(timeout=5)


# -- the app-server process -------------------------------------------------------------------


class AppServer:
    """``codex app-server --listen unix://`` in the namespace: the control-socket server of
    the world's CODEX_HOME."""

    def __init__(self, world: CodexWorld, codex_home: Path | None = None) -> None:
        self.world = world
        #: Another CODEX_HOME than the world's: a second, independent app-server (its own
        #: control socket) sharing the world's CrossTalk state and mock.
        self.codex_home = codex_home or world.codex_home
        tag = "" if codex_home is None else "-" + codex_home.name
        self.stderr_path = world.root / f"app-server{tag}.err"
        # A symlink to /tmp/codex-daemon-<uid>/<sha256 of this path> (TMPDIR is not honoured);
        # the server removes both on SIGTERM.
        self.socket_path = self.codex_home / "app-server-control" / "app-server-control.sock"
        self.socket_target: Path | None = None
        self._children: set[int] = set()
        env = world.codex_env(self.codex_home)
        with self.stderr_path.open("ab") as err:
            # nsenter without a PID namespace execs the command: proc.pid is codex itself.
            self.proc = subprocess.Popen(
                world.netns.argv("env", "-i", *(f"{k}={v}" for k, v in env.items()),
                                 str(world.binary), "app-server", "--listen", "unix://"),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                cwd=world.root, preexec_fn=_die_with_parent)
        try:
            wait_for(self._listening, 30, step=0.05, what="app-server control socket")
        except TimeoutError as exc:
            self.stop()
            raise LiveError(f"{exc}\n{self.stderr_tail()}") from None
        with contextlib.suppress(OSError):
            self.socket_target = self.socket_path.parent / os.readlink(self.socket_path)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _listening(self) -> bool:
        if self.proc.poll() is not None:
            raise LiveError(f"codex app-server exited ({self.proc.returncode}) at start-up\n"
                            + self.stderr_tail())
        if not self.socket_path.exists():
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.connect(str(self.socket_path))
        except OSError:
            return False
        return True

    def connect(self, name: str = "crosstalk_live") -> AppServerClient:
        client = AppServerClient(self.socket_path, name)
        client.initialize()
        return client

    def children(self) -> list[int]:
        """Live descendants of the app-server (its ``crosstalk mcp`` shims, among others);
        each one seen is remembered for the leak check at :meth:`stop`."""
        pids = descendants(self.pid) if alive(self.pid) else []
        self._children.update(pids)
        return pids

    def shim_pids(self) -> list[int]:
        return [p for p in self.children() if cmdline(p)[-3:] == SHIM_ARGV]

    def stderr_tail(self, n: int = 4000) -> str:
        try:
            return "app-server stderr:\n" + self.stderr_path.read_text(errors="replace")[-n:]
        except OSError:
            return "app-server stderr: (none)"

    def stop(self, timeout: float = 10.0) -> list[str]:
        """SIGTERM, then SIGKILL after ``timeout``; notes on whatever had to be killed."""
        notes: list[str] = []
        self.children()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                notes.append(f"codex app-server {self.pid} ignored SIGTERM for {timeout:.0f} s; "
                             "killed")
                self.proc.kill()
                self.proc.wait(timeout=5)
        with contextlib.suppress(TimeoutError):
            wait_for(lambda: not any(alive(p) for p in self._children), 5.0, what="children")
        for pid in kill_all(sorted(self._children)):
            notes.append(f"app-server child {pid} {' '.join(cmdline(pid)) or '?'} outlived it "
                         "by 5 s; killed")
        for path in (self.socket_path, self.socket_target):
            if path is not None and (path.is_symlink() or path.exists()):
                notes.append(f"{path} was left after the app-server stopped")
        return notes


# -- one test's Codex world --------------------------------------------------------------------


class CodexWorld:
    """The shared setting of one test's Codex threads (see the module docstring)."""

    def __init__(self, netns: Netns, binary: Path, *, share: World | None = None,
                 python: str = sys.executable) -> None:
        self.netns = netns
        self.binary = binary
        self.python = python
        self.share = share
        if share is not None:
            if share.netns is not netns:
                raise LiveError("a CodexWorld sharing a Claude World must use its namespace")
            self.root = share.root / "codex"
            self.root.mkdir(mode=0o700)
            self.home, self.state, self.runtime = share.home, share.state, share.runtime
            self.claude_config = share.config_dir
        else:
            # Short: sun_path is 108 bytes.
            self.root = Path(tempfile.mkdtemp(prefix="ctx-", dir="/tmp"))
            self.home, self.state = self.root / "home", self.root / "state"
            self.runtime, self.claude_config = self.root / "run", self.root / "claude"
            for d in (self.home, self.state, self.runtime, self.claude_config):
                d.mkdir(mode=0o700)
        self.codex_home = self.root / "codex-home"
        self.xdg_state = self.root / "xdg-state"
        for d in (self.codex_home, self.xdg_state):
            d.mkdir(mode=0o700)
        self.threads: list[CodexThread] = []
        self.tuis: list[CodexTui] = []
        self.clients: list[AppServerClient] = []
        self.leftovers: list[str] = []
        self._server: AppServer | None = None
        self._client: AppServerClient | None = None
        #: Further app-servers, each on a CODEX_HOME of its own (:meth:`extra_server`).
        self.extra_servers: list[AppServer] = []
        try:
            self.mock = ResponsesMock(netns, self.root)
            self.write_config()
        except BaseException:
            if share is None:
                shutil.rmtree(self.root, ignore_errors=True)
            raise

    # -- configuration ---------------------------------------------------------------------

    def mcp_env(self) -> dict[str, str]:
        """The literal ``env`` of the ``crosstalk`` MCP server: the CrossTalk state and the
        runtime dir a Claude World in the same test uses."""
        return {"CROSSTALK_HOME": str(self.state), "XDG_RUNTIME_DIR": str(self.runtime),
                "CROSSTALK_LOG": "INFO"}

    def write_config(self, extra: str = "", codex_home: Path | None = None, *,
                     crosstalk: bool = True) -> None:
        """``config.toml``: the mock provider, trust, and (unless ``crosstalk`` is false, e.g.
        for ``crosstalk install`` to add it) the rig's own ``[mcp_servers.crosstalk]``."""
        provider = {"name": "CrossTalk live mock", "base_url": self.mock.base_url,
                    "wire_api": "responses", "env_key": KEY_VAR}
        lines = [
            f"model = {_toml(MODEL)}",
            'model_provider = "crosstalk_mock"',
            'approval_policy = "never"',
            'sandbox_mode = "danger-full-access"',
            "check_for_update_on_startup = false",
            "",
            "[model_providers.crosstalk_mock]",
            *(f"{k} = {_toml(v)}" for k, v in provider.items()),
            "request_max_retries = 0",
            "stream_max_retries = 0",
            "supports_websockets = false",
            "",
            # Trust covers every directory below (no trust prompt in a TUI started there).
            f"[projects.{_toml(str(self.root))}]",
            'trust_level = "trusted"',
            "",
            "[analytics]",
            "enabled = false",
            "",
            "[feedback]",
            "enabled = false",
            "",
        ]
        if crosstalk:
            lines += [
                "[mcp_servers.crosstalk]",
                f"command = {_toml(self.python)}",
                f"args = {_toml(SHIM_ARGV)}",
                f"env_vars = {_toml(ENV_VARS)}",
                f"env = {_toml(self.mcp_env())}",
                "startup_timeout_sec = 30",
                # send_message may wait up to 150 s for a delivery outcome.
                "tool_timeout_sec = 180",
                "",
            ]
        (codex_home or self.codex_home).joinpath("config.toml").write_text(
            "\n".join(lines) + extra)

    def codex_env(self, codex_home: Path | None = None) -> dict[str, str]:
        """The whole environment of a Codex process (the app-server; a TUI)."""
        return {"PATH": SYSTEM_PATH, "HOME": str(self.home), "LANG": "C.UTF-8",
                "CODEX_HOME": str(codex_home or self.codex_home),
                KEY_VAR: API_KEY, "CROSSTALK_HOME": str(self.state),
                "XDG_RUNTIME_DIR": str(self.runtime), "XDG_STATE_HOME": str(self.xdg_state),
                "CLAUDE_CONFIG_DIR": str(self.claude_config)}

    @property
    def env(self) -> dict[str, str]:
        """The environment of a CrossTalk command run by the test (``crosstalk send``)."""
        inherited = {k: v for k, v in os.environ.items()
                     if not (k.startswith(("CLAUDE_CODE_", "CROSSTALK_", "CODEX_"))
                             or k in ("CLAUDECODE", "CLAUDE_PROJECT_DIR", "CLAUDE_CONFIG_DIR"))}
        return {**inherited, "HOME": str(self.home), "CODEX_HOME": str(self.codex_home),
                "CLAUDE_CONFIG_DIR": str(self.claude_config), "CROSSTALK_HOME": str(self.state),
                "XDG_RUNTIME_DIR": str(self.runtime)}

    # -- the server and its threads ----------------------------------------------------------

    @property
    def server(self) -> AppServer:
        """The app-server (started on first use)."""
        if self._server is None:
            self._server = AppServer(self)
        return self._server

    @property
    def client(self) -> AppServerClient:
        """The test's default app-server client (its name becomes the threads' originator)."""
        if self._client is None:
            self._client = self.connect()
        return self._client

    def connect(self, name: str = "crosstalk_live", *, server: AppServer | None = None
                ) -> AppServerClient:
        client = (server or self.server).connect(name)
        self.clients.append(client)
        return client

    def extra_server(self, tag: str) -> AppServer:
        """Another ``codex app-server`` on a CODEX_HOME of its own (``<root>/<tag>``, same
        config): its own control socket, the same CROSSTALK_HOME, XDG_RUNTIME_DIR and mock.
        Stopped by :meth:`close`."""
        home = self.root / tag
        home.mkdir(mode=0o700)
        self.write_config(codex_home=home)
        server = AppServer(self, home)
        self.extra_servers.append(server)
        return server

    def stop_server(self) -> list[str]:
        """Stop the app-server (and so its threads' shims) and drop the default client; the
        next use of :attr:`server` starts a new one on the same CODEX_HOME. Notes on what had
        to be killed."""
        notes: list[str] = []
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None
        if self._server is not None:
            notes = self._server.stop()
            self._server = None
        return notes

    def thread(self, name: str, *, client: AppServerClient | None = None,
               wait_mcp: bool = True, cwd: Path | None = None) -> CodexThread:
        """A new thread whose cwd is ``cwd``, else ``<root>/t-<name>/<name>``."""
        thread = CodexThread(self, name, client or self.client, cwd=cwd)
        self.threads.append(thread)
        if wait_mcp:
            thread.wait_mcp_ready()
        return thread

    def tui(self, name: str) -> CodexTui:
        """An interactive ``codex`` in tmux on this world's app-server (call ``start()``)."""
        tui = CodexTui(self, name)
        self.tuis.append(tui)
        return tui

    def loaded(self) -> list[str]:
        return list(self.client.request("thread/loaded/list", {}).get("data") or [])

    def descriptors(self) -> list[dict[str, Any]]:
        """Every readable CrossTalk descriptor in ``<CROSSTALK_HOME>/agents``."""
        out = []
        for path in sorted((self.state / "agents").glob("*.json")):
            with contextlib.suppress(OSError, ValueError):
                data = json.loads(path.read_text())
                if isinstance(data, dict):
                    out.append(data)
        return out

    def last_seq(self) -> int:
        entries = self.mock.entries()
        return int(entries[-1]["seq"]) if entries else 0

    def crosstalk(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run the ``crosstalk`` CLI of this venv, outside the namespace, as a user would."""
        script = Path(self.python).parent / "crosstalk"
        argv = [str(script)] if script.exists() else [self.python, "-m", "crosstalk"]
        return subprocess.run([*argv, *args], capture_output=True, text=True, timeout=timeout,
                              env=self.env, cwd=self.root, check=False)

    def close(self) -> None:
        """Stop the clients, the app-server (and so every shim) and the mock. In a world of
        its own, anything still in the namespace then is a leak (killed, and noted in
        :attr:`leftovers`); a shared one leaves that sweep to its Claude World."""
        for tui in reversed(self.tuis):
            try:
                self.leftovers.extend(tui.stop())
            except Exception as exc:  # keep tearing down the rest
                self.leftovers.append(f"tui {tui.name}: stop failed: {exc!r}")
        for client in self.clients:
            with contextlib.suppress(Exception):
                client.close()
        for server in [*self.extra_servers, *([self._server] if self._server else [])]:
            try:
                self.leftovers.extend(server.stop())
            except Exception as exc:  # keep tearing down the rest
                self.leftovers.append(f"app-server stop failed: {exc!r}")
            # Not a leak of the rig: Codex sends its MCP servers SIGTERM and SIGKILL ~5 ms
            # later, so a shim may die before unlinking its descriptor; readers must treat
            # such a descriptor as dead (test_app_server_stop_unpublishes_threads).
            stale = [d for d in self.descriptors() if d.get("harness") == "codex"]
            if stale:
                print(f"[codex] {len(stale)} descriptor(s) outlived their SIGKILLed shims: "
                      + ", ".join(str(d.get("name")) for d in stale))
        self.mock.close()
        if self.share is None:
            settle_members(self.netns)
            for pid in kill_all(self.netns.members()):
                self.leftovers.append(f"process {pid} ({' '.join(cmdline(pid)) or '?'}) was "
                                      "still in the namespace after teardown; killed")
            shutil.rmtree(self.root, ignore_errors=True)

    def diagnostics(self) -> str:
        parts = [f"codex world {self.root}"]
        for thread in self.threads:
            parts.append(thread.diagnostics())
        for tui in self.tuis:
            parts.append(f"--- tui {tui.name} pid={tui.pid} thread={tui.thread_id}\n"
                         + tui.screen())
        for server in [*([self._server] if self._server else []), *self.extra_servers]:
            parts.append(server.stderr_tail())
        with contextlib.suppress(OSError):
            parts.append("mock stderr:\n" + self.mock.stderr_path.read_text()[-2000:])
        for entry in self.mock.entries()[-12:]:
            parts.append(f"mock #{entry.get('seq')} {entry.get('kind')} thread="
                         f"{entry.get('thread')} rule={entry.get('rule')} response="
                         f"{json.dumps(entry.get('response'))[:300]}")
        parts.append("descriptors: " + json.dumps(self.descriptors())[:2000])
        return "\n".join(parts)


# -- one thread ------------------------------------------------------------------------------


class CodexThread:
    """One Codex thread on the world's app-server, started by ``thread/start {cwd}``."""

    def __init__(self, world: CodexWorld, name: str, client: AppServerClient, *,
                 existing: dict[str, Any] | None = None, cwd: Path | None = None) -> None:
        self.world = world
        self.name = name
        self.client = client
        self._started_at = client.mark()
        if existing is None:
            self.cwd = cwd or world.root / f"t-{name}" / name
            self.cwd.mkdir(parents=True, exist_ok=cwd is not None)
            existing = client.request("thread/start", {"cwd": str(self.cwd)})["thread"]
        else:  # a thread someone else started (a TUI's), seen through the app-server
            self.cwd = Path(existing["cwd"])
        self.info: dict[str, Any] = existing
        self.id: str = existing["id"]

    def resume(self, client: AppServerClient | None = None, *, wait_mcp: bool = True
               ) -> None:
        """``thread/resume`` on ``client`` (default: the world's, e.g. of a restarted
        app-server), which becomes this thread's client."""
        self.client = client or self.world.client
        self._started_at = self.client.mark()
        self.info = self.client.request("thread/resume", {"threadId": self.id})["thread"]
        if wait_mcp:
            self.wait_mcp_ready()

    # -- turns -----------------------------------------------------------------------------

    def start_turn(self, text: str, *, client: AppServerClient | None = None) -> str:
        """``turn/start`` with one text input; the turn id (an active thread returns the id of
        the turn the input joined)."""
        result = (client or self.client).request(
            "turn/start", {"threadId": self.id, "input": text_input(text)})
        return str(result["turn"]["id"])

    def wait_turn(self, turn_id: str, timeout: float = 60.0, *, since: int = 0
                  ) -> dict[str, Any]:
        """The ``turn`` of the ``turn/completed`` notification of ``turn_id``."""
        def done(note: dict[str, Any]) -> bool:
            params = note.get("params") or {}
            return (note.get("method") == "turn/completed" and params.get("threadId") == self.id
                    and (params.get("turn") or {}).get("id") == turn_id)
        try:
            note = self.client.wait_notification(done, timeout, since=since)
        except TimeoutError as exc:
            raise AssertionError(f"{self.name}: turn {turn_id} not completed: {exc}\n"
                                 f"{self.world.diagnostics()}") from None
        turn: dict[str, Any] = note["params"]["turn"]
        return turn

    def run_turn(self, text: str, timeout: float = 60.0) -> dict[str, Any]:
        """Start a turn and wait until it completes; the completed ``turn``."""
        since = self.client.mark()
        return self.wait_turn(self.start_turn(text), timeout, since=since)

    # -- what the thread is -------------------------------------------------------------------

    def read(self) -> dict[str, Any]:
        thread: dict[str, Any] = self.client.request("thread/read", {"threadId": self.id})[
            "thread"]
        return thread

    def set_name(self, name: str) -> None:
        self.client.request("thread/name/set", {"threadId": self.id, "name": name})

    def wait_mcp_ready(self, timeout: float = 30.0) -> None:
        """Until the app-server reports the ``crosstalk`` MCP server of this thread started
        (``mcpServer/startupStatus/updated``), so the first turn already offers its tools."""
        def ready(note: dict[str, Any]) -> bool:
            params = note.get("params") or {}
            return (note.get("method") == "mcpServer/startupStatus/updated"
                    and params.get("name") == "crosstalk"
                    and params.get("status") in ("ready", "failed", "cancelled")
                    and params.get("threadId") in (None, self.id))
        try:
            note = self.client.wait_notification(ready, timeout, since=self._started_at)
        except TimeoutError as exc:
            raise LiveError(f"{self.name}: crosstalk MCP server not started: {exc}\n"
                            f"{self.world.diagnostics()}") from None
        if note["params"].get("status") != "ready":
            raise LiveError(f"{self.name}: crosstalk MCP server failed to start: {note}\n"
                            f"{self.world.diagnostics()}")

    def descriptor(self) -> dict[str, Any] | None:
        """This thread's CrossTalk descriptor (``harness: codex``, ``session_ref`` = the
        thread id); CrossTalk writes it on the thread's first ``tools/call``."""
        for desc in self.world.descriptors():
            if desc.get("harness") == "codex" and desc.get("session_ref") == self.id:
                return desc
        return None

    def wait_descriptor(self, timeout: float = 15.0) -> dict[str, Any]:
        try:
            found: dict[str, Any] = wait_for(self.descriptor, timeout,
                                             what=f"CrossTalk descriptor of {self.name}")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{self.world.diagnostics()}") from None
        return found

    # -- its requests to the mock ---------------------------------------------------------------

    def requests(self) -> list[Entry]:
        """The mock's log entries for this thread (by the ``thread-id`` header)."""
        return [e for e in self.world.mock.entries() if e.get("thread") == self.id]

    def main_requests(self) -> list[Entry]:
        return [e for e in self.requests() if e.get("kind") == "main"]

    def wait_for_request(self, predicate: Callable[[Entry], bool], timeout: float = 30.0,
                         *, after: int = 0) -> Entry:
        """The first of this thread's logged requests with ``seq > after`` matching
        ``predicate``."""
        def find() -> Entry | None:
            return next((e for e in self.requests()
                         if e.get("seq", 0) > after and predicate(e)), None)
        try:
            found: Entry = wait_for(find, timeout, step=0.1,
                                    what=f"a matching request from thread {self.name}")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{self.world.diagnostics()}") from None
        return found

    def diagnostics(self) -> str:
        lines = [f"--- thread {self.name} id={self.id} cwd={self.cwd}"]
        with contextlib.suppress(Exception):
            info = self.read()
            lines.append(f"status={info.get('status')} name={info.get('name')!r}")
        for entry in self.requests()[-6:]:
            last = json.dumps((entry.get("body") or {}).get("input", [])[-1:])[:300]
            lines.append(f"  #{entry.get('seq')} {entry.get('kind')} rule={entry.get('rule')} "
                         f"last input={last}")
        return "\n".join(lines)


# -- an interactive Codex TUI ---------------------------------------------------------------------


class CodexTui:
    """One interactive ``codex`` in its own tmux server inside the namespace. With the world's
    app-server running it joins it over the control socket (``daemon_auto_start``): its thread
    lives in the app-server (``source: "vscode"``), and so do the thread's MCP servers."""

    def __init__(self, world: CodexWorld, name: str) -> None:
        self.world = world
        self.name = name
        self.dir = world.root / f"tui-{name}"
        self.cwd = self.dir / name
        self.cwd.mkdir(parents=True)
        self.tmux_socket = self.dir / "tmux.sock"
        self.pid: int | None = None
        self.thread_id: str | None = None
        self._children: set[int] = set()
        self.stopped = False

    def tmux(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["tmux", "-S", str(self.tmux_socket), *args], capture_output=True,
                              text=True, timeout=15, check=False)
        if check and done.returncode != 0:
            raise LiveError(f"tmux {' '.join(args)} failed: {done.stderr.strip()}")
        return done

    def start(self, timeout: float = 30.0) -> CodexThread:
        """Start the TUI (after the app-server, so it joins that one rather than starting a
        managed daemon) and return its thread, once the app-server lists it and the prompt is
        drawn."""
        w = self.world
        w.server  # noqa: B018 -- started first, on purpose
        env = {**w.codex_env(), "TERM": "xterm-256color"}
        command = ("exec env -i " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
                   + " " + shlex.quote(str(w.binary)))
        done = subprocess.run(
            w.netns.argv("tmux", "-S", str(self.tmux_socket), "new-session", "-d", "-s", "cx",
                         "-x", "200", "-y", "50", "-c", str(self.cwd), command,
                         ";", "set-option", "-t", "cx", "remain-on-exit", "on"),
            capture_output=True, text=True, timeout=30, check=False)
        if done.returncode != 0:
            raise LiveError(f"tmux new-session failed: {done.stderr.strip()}")
        self.pid = int(self.tmux("display-message", "-p", "-t", "cx", "#{pane_pid}")
                       .stdout.strip())
        try:
            info: dict[str, Any] = wait_for(self._thread, timeout, step=0.2,
                                            what=f"TUI {self.name}: thread and prompt")
        except TimeoutError as exc:
            raise LiveError(f"{exc}\nscreen:\n{self.screen()}\n{w.diagnostics()}") from None
        self.thread_id = info["id"]
        thread = CodexThread(w, self.name, w.client, existing=info)
        w.threads.append(thread)
        return thread

    def _thread(self) -> dict[str, Any] | None:
        if not alive(self.pid or 0):
            raise LiveError(f"TUI {self.name} exited during start-up\n{self.screen()}")
        if "Ask Codex" not in self.screen():
            return None
        for thread_id in self.world.loaded():
            with contextlib.suppress(RpcError):
                info: dict[str, Any] = self.world.client.request(
                    "thread/read", {"threadId": thread_id})["thread"]
                if info.get("cwd") == str(self.cwd) and not info.get("ephemeral"):
                    return info
        return None

    def screen(self) -> str:
        done = self.tmux("capture-pane", "-p", "-t", "cx", check=False)
        return done.stdout if done.returncode == 0 else ""

    def send_keys(self, text: str, *, enter: bool = True) -> None:
        """Type ``text`` into the prompt (literally), then press Enter."""
        self.tmux("send-keys", "-t", "cx", "-l", text)
        if enter:
            time.sleep(0.5)  # typed, not pasted
            self.tmux("send-keys", "-t", "cx", "Enter")

    def stop(self, timeout: float = 10.0) -> list[str]:
        """``/quit``, then kill whatever is left; notes on what had to be killed."""
        if self.stopped:
            return []
        self.stopped = True
        notes: list[str] = []
        if self.pid is not None:
            self._children.update(descendants(self.pid))
            if alive(self.pid):
                with contextlib.suppress(LiveError, subprocess.TimeoutExpired):
                    self.tmux("send-keys", "-t", "cx", "-l", "/quit", check=False)
                    time.sleep(0.5)
                    self.tmux("send-keys", "-t", "cx", "Enter", check=False)
                with contextlib.suppress(TimeoutError):
                    wait_for(lambda: not alive(self.pid or 0), timeout, what="codex TUI exit")
            if alive(self.pid):
                notes.append(f"TUI {self.name}: codex {self.pid} ignored /quit; killed")
                kill_all([self.pid])
        for pid in kill_all(sorted(self._children)):
            notes.append(f"TUI {self.name}: child {pid} {' '.join(cmdline(pid)) or '?'} "
                         "outlived it; killed")
        with contextlib.suppress(LiveError, subprocess.TimeoutExpired):
            self.tmux("kill-server", check=False)
        return notes
