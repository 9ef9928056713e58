"""Real opencode processes (a TUI in tmux, ``opencode serve``, one-shot commands), driven
against our mock Chat Completions API, with nothing but loopback.

The layers mirror ``claude.py`` and ``codex.py`` (whose :class:`~tests.live.support.claude.Netns`
they reuse):

* :func:`ensure_opencode` — the pinned ``opencode-ai`` npm package in ``.cache/live`` (the
  native ELF ``node_modules/opencode-linux-x64/bin/opencode`` is what runs).
* :class:`OpencodeWorld` — what one test's opencode processes share: HOME and the four XDG
  dirs (opencode keeps config, data, state and cache there), CROSSTALK_HOME (where the plugin
  publishes), XDG_RUNTIME_DIR, and one mock. Its global config dir is pre-seeded (research §1:
  a ``package.json``/``package-lock.json`` naming ``@opencode-ai/plugin`` and an empty
  ``node_modules``), else opencode's offline ``npm install`` holds start-up ~70 s. Built with
  ``share=<a Claude World>`` it uses that world's HOME, CROSSTALK_HOME, XDG_RUNTIME_DIR and
  namespace.
* :class:`OpencodeTui`, :class:`OpencodeServe` — one process each, started in the namespace.
* :class:`UnixHttp` — the test's HTTP client of a plugin socket (unix sockets cross the
  namespace boundary), with an SSE reader for ``GET /event``.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
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
from tests.live.support.install import REPO, _npm_install

if TYPE_CHECKING:
    from tests.live.support.claude import World

HERE = Path(__file__).resolve().parent
PACKAGE = "opencode-ai"
VERSION = "1.18.33"
PLUGIN = REPO / "src" / "crosstalk" / "harness" / "opencode" / "crosstalk.js"
LOGGING_MCP = HERE / "logging_mcp.py"
API_KEY = "sk-crosstalk-live-opencode-dummy-0000"
#: The TUI's input placeholder: drawn once the instance has bootstrapped.
READY = "Ask anything"


# -- the binary -------------------------------------------------------------------------------


def opencode_cache_dir(env: dict[str, str] | None = None) -> Path:
    env = dict(os.environ) if env is None else env
    configured = env.get("CROSSTALK_LIVE_OPENCODE_CACHE")
    if configured:
        return Path(configured).expanduser().resolve()
    return REPO / ".cache" / "live" / f"opencode-{VERSION}"


def find_opencode(prefix: Path) -> Path | None:
    binary = prefix / "node_modules" / "opencode-linux-x64" / "bin" / "opencode"
    return binary if binary.is_file() and os.access(binary, os.X_OK) else None


def opencode_version(binary: Path) -> str | None:
    """The version of the platform package that holds ``binary``, from its package.json (the
    binary itself only ever runs inside the namespace)."""
    try:
        meta = json.loads((binary.parents[1] / "package.json").read_text())
    except (OSError, ValueError):
        return None
    version = meta.get("version") if isinstance(meta, dict) else None
    return version if isinstance(version, str) else None


def ensure_opencode(env: dict[str, str] | None = None) -> Path:
    """Install (once) and return the pinned native ``opencode`` binary."""
    return _npm_install(PACKAGE, VERSION, opencode_cache_dir(env), find=find_opencode,
                        installed=opencode_version,
                        what="native node_modules/opencode-linux-x64/bin/opencode")


# -- the mock and the plugin socket -----------------------------------------------------------


class ChatMock(Mock):
    """Our mock Chat Completions API in the namespace; steered over its control socket."""

    script = HERE / "mock_chat.py"
    stem = "chat"
    label = "mock Chat Completions API"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


class UnixHttp:
    """HTTP/1.1 over a plugin socket; JSON in and out."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)

    def request(self, method: str, route: str, body: Any = None, *, timeout: float = 10.0,
                headers: dict[str, str] | None = None) -> tuple[int, Any]:
        conn = _UnixConnection(self.path, timeout)
        try:
            conn.request(method, route, body=None if body is None else json.dumps(body),
                         headers={"content-type": "application/json", **(headers or {})})
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        try:
            return response.status, json.loads(raw) if raw else None
        except ValueError:
            return response.status, raw.decode("utf-8", "replace")

    def get(self, route: str, **kwargs: Any) -> Any:
        status, data = self.request("GET", route, **kwargs)
        if status != 200:
            raise AssertionError(f"GET {route} over {self.path}: {status} {data!r}")
        return data

    def events(self, route: str = "/event") -> EventStream:
        return EventStream(self.path, route)


class EventStream:
    """``GET /event`` over a plugin socket, read by a thread; every event kept in order."""

    def __init__(self, path: str, route: str) -> None:
        self.events: list[dict[str, Any]] = []
        self.status: int | None = None
        self._cond = threading.Condition()
        self._conn = _UnixConnection(path, 3600)
        self._conn.request("GET", route, headers={"accept": "text/event-stream"})
        self._response = self._conn.getresponse()
        self.status = self._response.status
        self.content_type = self._response.getheader("content-type")
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        with contextlib.suppress(OSError, ValueError, http.client.HTTPException):
            while True:
                line = self._response.fp.readline()
                if not line:
                    break
                if line.startswith(b"data: "):
                    with contextlib.suppress(ValueError):
                        event = json.loads(line[6:])
                        with self._cond:
                            self.events.append(event)
                            self._cond.notify_all()

    def wait(self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 30.0
             ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = next((e for e in self.events if predicate(e)), None)
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    seen = sorted({str(e.get("type")) for e in self.events})
                    raise TimeoutError(f"no matching event within {timeout:.0f} s; seen {seen}")
                self._cond.wait(left)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self._conn.sock is not None:
                self._conn.sock.shutdown(socket.SHUT_RDWR)
        self._conn.close()


# -- one test's world -------------------------------------------------------------------------


class OpencodeWorld:
    """The shared setting of one test's opencode processes (see the module docstring)."""

    def __init__(self, netns: Netns, binary: Path, *, share: World | None = None,
                 python: str = sys.executable) -> None:
        self.netns = netns
        self.binary = binary
        self.python = python
        self.share = share
        if share is not None:
            if share.netns is not netns:
                raise LiveError("an OpencodeWorld sharing a Claude World must use its namespace")
            self.root = share.root / "opencode"
            self.root.mkdir(mode=0o700)
            self.home, self.state, self.runtime = share.home, share.state, share.runtime
        else:
            # Short: the plugin's socket lives under CROSSTALK_HOME (<= 103 bytes).
            self.root = Path(tempfile.mkdtemp(prefix="oc-", dir="/tmp"))
            self.home, self.state = self.root / "home", self.root / "state"
            self.runtime = self.root / "run"
            for d in (self.home, self.state, self.runtime):
                d.mkdir(mode=0o700)
        self.config_home = self.home / ".config"
        self.config_dir = self.config_home / "opencode"
        self.mcp_log = self.root / "mcp.jsonl"
        self.processes: list[OpencodeTui | OpencodeServe] = []
        self.leftovers: list[str] = []
        try:
            self.mock = ChatMock(netns, self.root)
            self.seed_config_dir()
            self.write_config()
        except BaseException:
            if share is None:
                shutil.rmtree(self.root, ignore_errors=True)
            raise

    # -- configuration ---------------------------------------------------------------------

    @property
    def records_dir(self) -> Path:
        """Where the plugin publishes: ``<CROSSTALK_HOME>/opencode``."""
        return self.state / "opencode"

    def seed_config_dir(self, *, plugin: bool = True) -> None:
        """The global config dir as opencode would leave it after installing its plugin SDK
        (so start-up does not wait on npm), plus our plugin unless ``plugin`` is false."""
        self.config_dir.mkdir(parents=True, exist_ok=True)
        (self.config_dir / "node_modules").mkdir(exist_ok=True)
        deps = {"@opencode-ai/plugin": VERSION}
        (self.config_dir / "package.json").write_text(json.dumps({"dependencies": deps}))
        (self.config_dir / "package-lock.json").write_text(json.dumps(
            {"lockfileVersion": 3, "packages": {"": {"dependencies": deps}}}))
        if plugin:
            (self.config_dir / "plugin").mkdir(exist_ok=True)
            shutil.copy(PLUGIN, self.config_dir / "plugin" / "crosstalk.js")

    def base_config(self) -> dict[str, Any]:
        """The mock provider and the offline settings (research §1)."""
        return {
            "$schema": "https://opencode.ai/config.json",
            "model": "mock/mock-model", "small_model": "mock/mock-model",
            "autoupdate": False, "share": "disabled",
            "provider": {"mock": {"npm": "@ai-sdk/openai-compatible", "name": "Mock",
                                  "options": {"baseURL": self.mock.base_url,
                                              "apiKey": API_KEY},
                                  "models": {"mock-model": {"name": "Mock Model",
                                                            "tool_call": True}}}},
        }

    def logging_servers(self, *names: str) -> dict[str, Any]:
        """``mcp`` entries running :mod:`logging_mcp` under each name."""
        return {name: {"type": "local", "enabled": True,
                       "command": [self.python, str(LOGGING_MCP), name, str(self.mcp_log)]}
                for name in names}

    def write_config(self, extra: dict[str, Any] | None = None, *,
                     servers: tuple[str, ...] = ("crosstalk", "other")) -> Path:
        """``opencode.json``: the base config, logging MCP servers, then ``extra``."""
        config = self.base_config()
        if servers:
            config["mcp"] = self.logging_servers(*servers)
        config.update(extra or {})
        path = self.config_dir / "opencode.json"
        path.write_text(json.dumps(config, indent=2) + "\n")
        return path

    def env(self) -> dict[str, str]:
        """The whole environment of an opencode process."""
        return {"PATH": SYSTEM_PATH, "HOME": str(self.home), "TERM": "xterm-256color",
                "LANG": "C.UTF-8", "XDG_CONFIG_HOME": str(self.config_home),
                "XDG_DATA_HOME": str(self.home / ".local" / "share"),
                "XDG_STATE_HOME": str(self.home / ".local" / "state"),
                "XDG_CACHE_HOME": str(self.home / ".cache"),
                "XDG_RUNTIME_DIR": str(self.runtime), "CROSSTALK_HOME": str(self.state),
                "OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_AUTOUPDATE": "1"}

    def project(self, name: str) -> Path:
        """A fresh project directory ``<root>/p-<name>`` (a git repository, as users have)."""
        path = self.root / f"p-{name}"
        path.mkdir()
        # With a first commit: opencode names a project by its root commit (repositories
        # without one all share the "global" project, and so their session lists).
        subprocess.run(["git", "init", "-q", str(path)], check=True, capture_output=True)
        subprocess.run(["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t",
                        "commit", "-q", "--allow-empty", "-m", name], check=True,
                       capture_output=True)
        return path

    # -- processes -------------------------------------------------------------------------

    def tui(self, name: str, cwd: Path | None = None, args: Sequence[str] = ()) -> OpencodeTui:
        """``opencode [args]`` in tmux (``args=("attach", url)``: a TUI client of a server)."""
        tui = OpencodeTui(self, name, cwd or self.project(name), args)
        self.processes.append(tui)
        return tui

    def serve(self, name: str, cwd: Path | None = None) -> OpencodeServe:
        serve = OpencodeServe(self, name, cwd or self.project(name))
        self.processes.append(serve)
        return serve

    def run(self, *args: str, cwd: Path | None = None, timeout: float = 90.0
            ) -> subprocess.CompletedProcess[str]:
        """A one-shot ``opencode <args>`` in the namespace (``env -i``: only the world's env)."""
        env = [f"{k}={v}" for k, v in self.env().items()]
        return subprocess.run(self.netns.argv("env", "-i", *env, str(self.binary), *args),
                              capture_output=True, text=True, timeout=timeout,
                              cwd=cwd or self.root, check=False)

    # -- what the plugin published ----------------------------------------------------------

    def records(self) -> list[dict[str, Any]]:
        """Every readable record in ``<CROSSTALK_HOME>/opencode``."""
        out = []
        for path in sorted(self.records_dir.glob("*.json")) if self.records_dir.is_dir() else []:
            with contextlib.suppress(OSError, ValueError):
                data = json.loads(path.read_text())
                if isinstance(data, dict):
                    out.append({**data, "_path": str(path)})
        return out

    def record_for(self, pid: int, directory: Path | None = None) -> dict[str, Any] | None:
        return next((r for r in self.records() if r.get("pid") == pid and (
            directory is None or r.get("directory") == str(directory.resolve()))), None)

    def wait_record(self, pid: int, directory: Path | None = None, timeout: float = 60.0
                    ) -> dict[str, Any]:
        found: dict[str, Any] = wait_for(lambda: self.record_for(pid, directory), timeout,
                                         step=0.1, what=f"plugin record of opencode {pid}")
        return found

    def mcp_calls(self, server: str | None = None) -> list[dict[str, Any]]:
        """The ``tools/call`` requests the logging MCP servers received (their params)."""
        out = []
        with contextlib.suppress(OSError):
            for line in self.mcp_log.read_text().splitlines():
                with contextlib.suppress(ValueError):
                    entry = json.loads(line)
                    msg = entry.get("msg") or {}
                    if entry.get("kind") == "recv" and msg.get("method") == "tools/call" and (
                            server is None or entry.get("server") == server):
                        out.append({"server": entry.get("server"), **(msg.get("params") or {})})
        return out

    def entries(self) -> list[Entry]:
        return self.mock.entries()

    # -- teardown ----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every process and the mock. In a world of its own, anything still in the
        namespace then is a leak (killed, noted in :attr:`leftovers`)."""
        for proc in reversed(self.processes):
            try:
                self.leftovers.extend(proc.stop())
            except Exception as exc:  # keep tearing down the rest
                self.leftovers.append(f"{proc.name}: stop failed: {exc!r}")
        self.mock.close()
        if self.share is None:
            settle_members(self.netns)
            for pid in kill_all(self.netns.members()):
                self.leftovers.append(f"process {pid} ({' '.join(cmdline(pid)) or '?'}) was "
                                      "still in the namespace after teardown; killed")
            shutil.rmtree(self.root, ignore_errors=True)

    def diagnostics(self) -> str:
        parts = [f"opencode world {self.root}", f"records: {self.records()}"]
        for proc in self.processes:
            parts.append(proc.diagnostics())
        with contextlib.suppress(OSError):
            parts.append("mock stderr:\n" + self.mock.stderr_path.read_text()[-2000:])
        log = self.home / ".local" / "share" / "opencode" / "log"
        for path in sorted(log.glob("*.log"))[-2:] if log.is_dir() else []:
            with contextlib.suppress(OSError):
                lines = path.read_text(errors="replace").splitlines()
                parts.append(f"{path.name} (tail):\n" + "\n".join(x[:300] for x in lines[-30:]))
        return "\n".join(parts)


# -- one opencode process ------------------------------------------------------------------


class _Process:
    name: str
    world: OpencodeWorld
    cwd: Path
    pid: int | None
    _children: set[int]
    stopped: bool

    def children(self) -> list[int]:
        """Live descendants (its MCP servers among them); each is remembered for the leak
        check at :meth:`stop`."""
        pids = descendants(self.pid) if self.pid and alive(self.pid) else []
        self._children.update(pids)
        return pids

    def record(self) -> dict[str, Any] | None:
        return self.world.record_for(self.pid or 0, self.cwd)

    def wait_record(self, timeout: float = 60.0) -> dict[str, Any]:
        return self.world.wait_record(self.pid or 0, self.cwd, timeout)

    def api(self, directory: Path | None = None) -> UnixHttp:
        record = (self.world.wait_record(self.pid or 0, directory) if directory is not None
                  else self.wait_record())
        return UnixHttp(record["socket"])

    def kill9(self) -> None:
        """SIGKILL opencode: nothing of it may clean up (its MCP children see EOF and go)."""
        self.children()
        if self.pid and alive(self.pid):
            os.kill(self.pid, signal.SIGKILL)
            wait_for(lambda: not alive(self.pid or 0), 10, what="opencode killed")

    def _reap_children(self, notes: list[str]) -> None:
        with contextlib.suppress(TimeoutError):
            wait_for(lambda: not any(alive(p) for p in self._children), 5.0, what="children")
        for pid in kill_all(sorted(self._children)):
            notes.append(f"{self.name}: child {pid} {' '.join(cmdline(pid)) or '?'} outlived "
                         "opencode by 5 s; killed")

    def diagnostics(self) -> str:
        return f"--- {type(self).__name__} {self.name} pid={self.pid} cwd={self.cwd}"


class OpencodeTui(_Process):
    """An interactive ``opencode`` (no ``--port``: no TCP listener) in its own tmux server."""

    def __init__(self, world: OpencodeWorld, name: str, cwd: Path,
                 args: Sequence[str] = ()) -> None:
        self.world, self.name, self.cwd, self.args = world, name, cwd, tuple(args)
        self.tmux_socket = world.root / f"tmux-{name}.sock"
        self.pid = None
        self._children = set()
        self.stopped = False

    def tmux(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["tmux", "-S", str(self.tmux_socket), *args], capture_output=True,
                              text=True, timeout=15, check=False)
        if check and done.returncode != 0:
            raise LiveError(f"tmux {' '.join(args)} failed: {done.stderr.strip()}")
        return done

    def start(self, timeout: float = 90.0) -> OpencodeTui:
        """Start it and wait for the input box (the instance has bootstrapped then)."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.world.env().items())
        command = " ".join(["exec env -i", env, shlex.quote(str(self.world.binary)),
                            *map(shlex.quote, self.args)])
        done = subprocess.run(
            self.world.netns.argv("tmux", "-S", str(self.tmux_socket), "new-session", "-d",
                                  "-s", "oc", "-x", "160", "-y", "45", "-c", str(self.cwd),
                                  command, ";", "set-option", "-t", "oc", "remain-on-exit",
                                  "on"),
            capture_output=True, text=True, timeout=30, check=False)
        if done.returncode != 0:
            raise LiveError(f"tmux new-session failed: {done.stderr.strip()}")
        self.pid = int(self.tmux("display-message", "-p", "-t", "oc", "#{pane_pid}")
                       .stdout.strip())
        binary = self.world.binary.resolve()

        def exe() -> str:
            with contextlib.suppress(OSError):
                return os.readlink(f"/proc/{self.pid}/exe")
            return ""
        try:
            wait_for(lambda: Path(exe()) == binary, 10, step=0.02, what="opencode exec")
            wait_for(lambda: READY in self.screen(), timeout, step=0.2,
                     what=f"{self.name}: the TUI's input box")
        except TimeoutError as exc:
            raise LiveError(f"{exc}\n{self.diagnostics()}") from None
        return self

    def screen(self) -> str:
        done = self.tmux("capture-pane", "-p", "-t", "oc", check=False)
        return done.stdout if done.returncode == 0 else ""

    def type(self, text: str) -> None:
        """Type ``text`` into the input box, then Enter (a separate send-keys: research §1)."""
        self.tmux("send-keys", "-t", "oc", "-l", text)
        time.sleep(0.5)
        self.tmux("send-keys", "-t", "oc", "Enter")

    def exit(self, timeout: float = 20.0) -> None:
        """``/exit`` as a user types it (after Escape, which dismisses a permission prompt:
        typed text does not reach the input box while one is open); waits for the end."""
        self.children()
        if "Permission required" in self.screen():
            self.tmux("send-keys", "-t", "oc", "Escape")
            wait_for(lambda: "Permission required" not in self.screen(), 10,
                     what=f"{self.name}: the permission prompt dismissed")
        self.tmux("send-keys", "-t", "oc", "-l", "/exit")
        time.sleep(0.5)
        self.tmux("send-keys", "-t", "oc", "Enter")
        wait_for(lambda: not alive(self.pid or 0), timeout, what=f"{self.name} exit")

    def stop(self) -> list[str]:
        if self.stopped:
            return []
        self.stopped = True
        notes: list[str] = []
        if self.pid is not None:
            self.children()
            if alive(self.pid):
                with contextlib.suppress(LiveError, TimeoutError, subprocess.TimeoutExpired):
                    self.exit()
            if alive(self.pid):
                notes.append(f"{self.name}: opencode {self.pid} ignored /exit; killed")
                kill_all([self.pid])
        self._reap_children(notes)
        with contextlib.suppress(LiveError, subprocess.TimeoutExpired):
            self.tmux("kill-server", check=False)
        return notes

    def diagnostics(self) -> str:
        return f"{super().diagnostics()}\nscreen:\n{self.screen()}"


class OpencodeServe(_Process):
    """``opencode serve --port 0`` (its TCP port is not used: the tests go through the
    plugin's socket)."""

    def __init__(self, world: OpencodeWorld, name: str, cwd: Path) -> None:
        self.world, self.name, self.cwd = world, name, cwd
        self.out_path = world.root / f"serve-{name}.out"
        self._children = set()
        self.stopped = False
        env = [f"{k}={v}" for k, v in world.env().items()]
        with self.out_path.open("wb") as out:
            # nsenter without a PID namespace execs: proc.pid is opencode itself.
            self.proc = subprocess.Popen(
                world.netns.argv("env", "-i", *env, str(world.binary), "serve", "--port", "0"),
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
                preexec_fn=_die_with_parent)
        self.pid = self.proc.pid

    @property
    def port(self) -> int | None:
        """The TCP port it printed (``opencode server listening on http://127.0.0.1:N``)."""
        with contextlib.suppress(OSError):
            for line in self.out_path.read_text(errors="replace").splitlines():
                if "listening on http://" in line:
                    return int(line.rsplit(":", 1)[1].strip().rstrip("/"))
        return None

    def touch(self, directory: Path) -> None:
        """One request for ``directory`` over TCP, inside the namespace: ``serve`` creates an
        instance (and so runs its plugins) only when a request first names its directory."""
        port = self.port
        if port is not None:
            self.world.netns.run("curl", "-s", "-m", "3", "-o", "/dev/null",
                                 "-H", f"x-opencode-directory: {directory}",
                                 f"http://127.0.0.1:{port}/session", timeout=10)

    def start(self, timeout: float = 90.0) -> OpencodeServe:
        """Until its plugin published the cwd's instance and that socket answers health."""
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise LiveError(f"opencode serve exited ({self.proc.returncode})\n"
                                + self.diagnostics())
            record = self.record()
            if record is None:
                self.touch(self.cwd)
                return False
            with contextlib.suppress(OSError, http.client.HTTPException):
                return UnixHttp(record["socket"]).request("GET", "/global/health",
                                                          timeout=3)[0] == 200
            return False
        try:
            wait_for(ready, timeout, step=0.2, what=f"{self.name}: serve published")
        except TimeoutError as exc:
            raise LiveError(f"{exc}\n{self.diagnostics()}") from None
        return self

    def terminate(self, timeout: float = 20.0) -> int:
        """SIGTERM, as a service manager stops it; its exit status."""
        self.children()
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def stop(self) -> list[str]:
        if self.stopped:
            return []
        self.stopped = True
        notes: list[str] = []
        self.children()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                notes.append(f"{self.name}: opencode serve ignored SIGTERM; killed")
                self.proc.kill()
                self.proc.wait(timeout=5)
        self._reap_children(notes)
        return notes

    def diagnostics(self) -> str:
        out = ""
        with contextlib.suppress(OSError):
            out = self.out_path.read_text(errors="replace")[-2000:]
        return f"{super().diagnostics()}\noutput:\n{out}"
