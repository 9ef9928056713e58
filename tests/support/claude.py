"""Fake Claude Code sessions for integration tests: real processes, real files, real sockets.

:class:`FakeClaude` runs ``fakes/claude_session.py`` (a stand-in for one Claude Code 2.1.328 session
process: registry record, key file, inbox socket) and drives it over its control socket.
:meth:`FakeClaude.server_params` is the MCP "server command" for the official client: it runs
``fakes/claude_launch.py``, which has the fake Claude spawn the real ``crosstalk mcp`` on the
launcher's stdio, so the shim's parent pid is the fake session's, as under Claude Code.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any

from mcp.client.stdio import StdioServerParameters

from crosstalk.harness.claude.setup import claude_socket_dir
from tests.support.dirs import short_tmpdir

FAKES = Path(__file__).resolve().parent / "fakes"
FAKE_CLAUDE = FAKES / "claude_session.py"
CLAUDE_LAUNCH = FAKES / "claude_launch.py"
READY_TIMEOUT = 20.0
#: Keep unix socket paths well under sun_path's 108 bytes (Claude refuses > 103).
MAX_SOCKET_PATH = 100


def claude_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a test world with Claude sessions in it.

    ``os.environ`` minus any Claude variables inherited from a session running the tests, plus
    ``CROSSTALK_HOME=<tmp>/state``, ``XDG_RUNTIME_DIR=<short dir under /tmp>`` (so Claude's
    ``cc-socks`` and CrossTalk's sockets stay short), ``CLAUDE_CONFIG_DIR=<tmp>/claude`` and
    ``HOME=<tmp>/home``. The runtime directory is removed when the test process exits.
    """
    runtime = short_tmpdir("ct-rt-")
    atexit.register(shutil.rmtree, runtime, ignore_errors=True)
    home = tmp_path / "home"
    home.mkdir(parents=True, exist_ok=True)
    inherited = {k: v for k, v in os.environ.items()
                 if not (k.startswith("CLAUDE_CODE_") or k in ("CLAUDECODE", "CLAUDE_PROJECT_DIR"))}
    return {**inherited, "CROSSTALK_HOME": str(tmp_path / "state"),
            "XDG_RUNTIME_DIR": str(runtime), "CLAUDE_CONFIG_DIR": str(tmp_path / "claude"),
            "HOME": str(home)}


def running(pid: int) -> bool:
    """The process exists and is not a zombie (``/proc/<pid>/stat`` state ``Z``)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return raw[raw.rfind(b")") + 1:].split()[0] != b"Z"


class FakeClaude:
    """One fake Claude Code session process. ``with FakeClaude(...) as c:`` starts and stops it.

    After :meth:`start`: ``pid``, ``session_id`` (current; :meth:`clear` changes it),
    ``socket`` (inbox path), ``key_path``, ``record_path``, ``config_dir``, ``frames_path``
    (JSONL of what the inbox received), ``ctl_path`` (control socket), ``cwd``, ``socket_dir``.
    """

    def __init__(self, root: Path, name: str, *, env: dict[str, str],
                 session_id: str | None = None, config_dir: Path | None = None,
                 socket_dir: Path | None = None, no_status: bool = False) -> None:
        self.root = root
        self.name = name
        self.env = dict(env)
        self.session_id = session_id or str(uuid.uuid4())
        configured = env.get("CLAUDE_CONFIG_DIR")
        self.config_dir = config_dir or (Path(configured) if configured else root / "claude")
        self._own_dirs: list[Path] = []
        if socket_dir is None:
            if env.get("XDG_RUNTIME_DIR") or env.get("CLAUDE_CODE_TMPDIR"):
                socket_dir = claude_socket_dir(env)
            else:
                own = short_tmpdir("ct-cc-")
                self._own_dirs.append(own)
                socket_dir = own / "cc-socks"
        self.socket_dir = socket_dir
        self.no_status = no_status
        root.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix=f"fc-{name}-", dir=root))
        self.cwd = self.dir / name
        self.frames_path = self.dir / "frames.jsonl"
        ctl_dir = short_tmpdir("ct-fc-")
        self._own_dirs.append(ctl_dir)
        self.ctl_path = ctl_dir / "ctl.sock"
        self.proc: subprocess.Popen[bytes] | None = None
        self.pid = 0
        self.socket = Path()
        self.key_path = Path()
        self.record_path = Path()

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> FakeClaude:
        """Start the process and wait (≤ 20 s) until its record, key and sockets exist."""
        if self.proc is not None:
            raise RuntimeError("already started")
        self.cwd.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, str(FAKE_CLAUDE), "--config-dir", str(self.config_dir),
               "--socket-dir", str(self.socket_dir), "--session-id", self.session_id,
               "--name", self.name, "--cwd", str(self.cwd), "--frames", str(self.frames_path),
               "--ctl", str(self.ctl_path)]
        if self.no_status:
            cmd.append("--no-status")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     env=self.env, cwd=self.cwd)
        got: list[bytes] = []
        stdout = self.proc.stdout
        assert stdout is not None
        reader = threading.Thread(target=lambda: got.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(READY_TIMEOUT)
        if not got or not got[0].strip():
            self.stop()
            raise RuntimeError(f"fake Claude {self.name!r} did not become ready "
                               f"(exit code {self.proc.returncode})")
        ready = json.loads(got[0])
        self.pid = int(ready["ready"])
        self.socket = Path(ready["socket"])
        self.key_path = Path(ready["key"])
        self.record_path = Path(ready["record"])
        if len(os.fsencode(self.socket)) >= MAX_SOCKET_PATH:
            self.stop()
            raise RuntimeError(f"inbox path too long for a unix socket: {self.socket}")
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Ask it to exit (it removes record, key and socket), kill it if it does not. Idempotent.

        Spawned shims are left alone, as when Claude exits: they notice their parent is gone.
        """
        p = self.proc
        if p is not None and p.poll() is None:
            try:
                self._request({"op": "exit"}, timeout=5.0)
            except (OSError, ValueError):
                p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if p is not None and p.stdout is not None:
            p.stdout.close()
        for d in self._own_dirs:
            shutil.rmtree(d, ignore_errors=True)
        self._own_dirs.clear()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self) -> FakeClaude:
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- what an MCP client runs ---------------------------------------------------------------

    def server_params(self) -> StdioServerParameters:
        """``python claude_launch.py <ctl>``: the shim runs as this session's child."""
        return StdioServerParameters(command=sys.executable,
                                     args=[str(CLAUDE_LAUNCH), str(self.ctl_path)],
                                     env=dict(self.env))

    # -- control -------------------------------------------------------------------------------

    def _request(self, req: dict[str, Any], timeout: float = 20.0) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(self.ctl_path))
            sock.sendall(json.dumps(req).encode() + b"\n")
            buf = b""
            while b"\n" not in buf:
                chunk = sock.recv(65536)
                if not chunk:
                    raise ValueError(f"control socket closed without a reply to {req['op']}")
                buf += chunk
        reply = json.loads(buf.split(b"\n", 1)[0])
        assert isinstance(reply, dict)
        if reply.get("ok") is False and "error" in reply and req["op"] != "send":
            raise RuntimeError(f"fake Claude refused {req['op']}: {reply['error']}")
        return reply

    def clear(self, new_session_id: str | None = None) -> str:
        """``/clear``: the record is rewritten in place with a new sessionId (returned)."""
        session_id = new_session_id or str(uuid.uuid4())
        self._request({"op": "clear", "session_id": session_id})
        self.session_id = session_id
        return session_id

    def rename(self, name: str) -> None:
        self._request({"op": "rename", "name": name})
        self.name = name

    def set_status(self, status: str) -> None:
        self._request({"op": "status", "status": status})

    def send(self, to_path: Path | str, content: str, auth: str | None = None) -> dict[str, Any]:
        """Send like Claude's SendMessage tool from this process: ``{"ok", "error", "secs",
        "bytes_back", "msg_id"}``; ok only if it connected, wrote and saw the receiver close."""
        req: dict[str, Any] = {"op": "send", "to": str(to_path), "content": content}
        if auth is not None:
            req["auth"] = auth
        return self._request(req)

    def set_mode(self, mode: str | None) -> None:
        """Switch the session's permission mode class at run time (Shift+Tab); ``None``
        goes back to its settings."""
        self._request({"op": "mode", "mode": mode})

    def held(self) -> tuple[list[str], list[dict[str, Any]]]:
        """The msg_ids held for the user now, and every receipt the gate tried to send."""
        got = self._request({"op": "held"})
        return list(got["ids"]), list(got["receipts"])

    def decide(self, msg_id: str, deliver: bool) -> None:
        """The user's choice in the hold dialog."""
        self._request({"op": "deliver" if deliver else "deny", "msg_id": msg_id})

    def shims(self) -> list[int]:
        """Pids of the shims this session spawned that are still running."""
        return [int(p) for p in self._request({"op": "shims"})["pids"]]

    def kill_shims(self, sig: str = "KILL") -> list[int]:
        return [int(p) for p in self._request({"op": "kill_shims", "signal": sig})["pids"]]

    # -- observations --------------------------------------------------------------------------

    def frames(self) -> list[dict[str, Any]]:
        """Every user/control line the inbox received, in order (``[]`` before the first)."""
        try:
            text = self.frames_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        out: list[dict[str, Any]] = []
        for line in text.splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # a line still being appended
        return out

    def record(self) -> dict[str, Any]:
        """The record file's JSON as it is now (raw dict)."""
        obj = json.loads(self.record_path.read_text(encoding="utf-8"))
        assert isinstance(obj, dict)
        return obj

    def peer_token(self) -> str:
        """The inbox peerToken from the key file."""
        token = json.loads(self.key_path.read_text(encoding="utf-8"))["peerToken"]
        assert isinstance(token, str)
        return token

