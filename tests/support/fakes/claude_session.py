"""A stand-in for one running Claude Code 2.1.328 session process (run as a script).

It does what a real session does on disk and on its inbox socket (research ``claude-code.md``
§2-§6), so real ``crosstalk mcp`` shims can run as its children and find their session by their
parent pid (``<configDir>/sessions/<ppid>.json``):

* binds ``<socket-dir>/<pid>.sock`` (0600 in a 0700 directory), publishes the key file
  ``<config>/sessions/<pid>.<sha256hex(socket path)>.key`` (0600) and the record
  ``<config>/sessions/<pid>.json``, rewritten *in place* on every change, as Claude does;
* its inbox reads NDJSON lines until EOF, never writes a byte back, closes at the peer's
  half-close, drops a connection whose line exceeds 1,048,576 chars or that sends no complete
  line within 30 s, and appends every ``user``/``control`` line it gets to ``--frames``;
* a control socket (``--ctl``, one JSON line per request and reply) lets a test spawn shims
  with a launcher's stdio fds (``claude_launch.py``), ``/clear``, rename, change the status,
  send like Claude's SendMessage tool, list or kill the shims, and exit.

Stdout carries exactly one line, ``{"ready": pid, ...}``, once everything is in place.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from claude_gate import Gate  # beside this script

from crosstalk import proc

VERSION = "2.1.328"
MAX_LINE_CHARS = 1_048_576
SEND_TIMEOUT = 5.0
_ADDRESS_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789:_/.\\-")
_SIGNALS = {"KILL": signal.SIGKILL, "TERM": signal.SIGTERM, "INT": signal.SIGINT}


def now_ms() -> int:
    return int(time.time() * 1000)


def address(path: str) -> str:
    """``uds:<path>`` with characters outside ``[A-Za-z0-9:_/.\\-]`` percent-encoded (``fz()``)."""
    out = []
    for ch in path:
        if ch in _ADDRESS_SAFE:
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8"))
    return "uds:" + "".join(out)


def compact(obj: Any) -> bytes:
    """JSON as JavaScript's ``JSON.stringify`` writes it (compact, non-ASCII unescaped)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o777 != 0o700:
        path.chmod(0o700)


class FakeClaude:
    def __init__(self, args: argparse.Namespace) -> None:
        self.pid = os.getpid()
        self.config_dir = Path(args.config_dir)
        self.sessions_dir = self.config_dir / "sessions"
        self.socket_dir = Path(args.socket_dir)
        self.cwd = str(args.cwd)
        self.frames_path = Path(args.frames)
        self.ctl_path = Path(args.ctl)
        self.shim_cmd: list[str] = (json.loads(args.shim_cmd) if args.shim_cmd
                                    else [sys.executable, "-m", "crosstalk", "mcp"])
        self.idle_timeout = float(args.idle_timeout)
        self.socket_path = str(self.socket_dir / f"{self.pid}.sock")
        digest = hashlib.sha256(self.socket_path.encode("utf-8")).hexdigest()
        self.key_path = self.sessions_dir / f"{self.pid}.{digest}.key"
        self.record_path = self.sessions_dir / f"{self.pid}.json"
        self.peer_token = secrets.token_hex(16)
        #: What Claude hands its children as CLAUDE_CODE_MESSAGING_TOKEN (not the peerToken).
        self.child_token = secrets.token_hex(16)
        start = proc.process_start_time(self.pid)
        if start is None:
            raise SystemExit("cannot read this process's start time")
        self.proc_start = start
        self.pid_domain = proc.pid_domain()
        started = now_ms()
        self.record: dict[str, Any] = {
            "pid": self.pid, "sessionId": args.session_id, "cwd": self.cwd,
            "startedAt": started, "procStart": self.proc_start, "version": VERSION,
            "peerProtocol": 1, "peerFeatures": [], "kind": "interactive",
            "entrypoint": "sdk-cli" if args.no_status else "cli",
            "pidDomain": self.pid_domain, "messagingSocketPath": self.socket_path,
            "name": args.name, "nameSource": "user", "nameSince": started,
        }
        if not args.no_status:
            self.record["status"] = "idle"
        self.record["updatedAt"] = started
        if not args.no_status:
            self.record["statusUpdatedAt"] = started
        self.lock = threading.Lock()  # record and frames file
        self.shims: dict[int, subprocess.Popen[bytes]] = {}
        self.shims_lock = threading.Lock()
        self.stopping = threading.Event()
        self.inbox: socket.socket | None = None
        self.ctl: socket.socket | None = None
        #: Claude's inbound gate for frames from non-descendants (held, refused, receipts).
        self.gate = Gate(self.pid, self.socket_path, self.config_dir, self.cwd)

    # -- files ---------------------------------------------------------------------------------

    def write_record(self, **changes: Any) -> None:
        """Read-modify-write in place (O_TRUNC + write, like Claude's ``VD``), never a rename."""
        with self.lock:
            self.record.update(changes)
            self.record["updatedAt"] = now_ms()
            fd = os.open(self.record_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
                         0o644)
            try:
                data = compact(self.record)
                while data:
                    data = data[os.write(fd, data):]
            finally:
                os.close(fd)

    def write_key(self) -> None:
        key = {"peerToken": self.peer_token, "procStart": self.proc_start,
               "pidDomain": self.pid_domain}
        fd = os.open(self.key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, compact(key))
        finally:
            os.close(fd)

    def append_frame(self, entry: dict[str, Any]) -> None:
        with self.lock:
            fd = os.open(self.frames_path,
                         os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, compact(entry) + b"\n")
                os.fsync(fd)
            finally:
                os.close(fd)

    # -- start and stop ------------------------------------------------------------------------

    def start(self) -> None:
        private_dir(self.sessions_dir)
        private_dir(self.socket_dir)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)  # a stale socket of a dead process with our pid
        inbox = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            inbox.bind(self.socket_path)
        finally:
            os.umask(old)
        os.chmod(self.socket_path, 0o600)
        inbox.listen(128)
        self.inbox = inbox
        self.write_key()
        self.write_record()
        ctl = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.ctl_path)
        ctl.bind(str(self.ctl_path))
        ctl.listen(16)
        self.ctl = ctl
        for target, sock in ((self.serve_inbox_conn, inbox), (self.serve_ctl_conn, ctl)):
            threading.Thread(target=self.accept_loop, args=(sock, target), daemon=True).start()
        ready = {"ready": self.pid, "socket": self.socket_path, "key": str(self.key_path),
                 "record": str(self.record_path)}
        sys.stdout.write(json.dumps(ready) + "\n")
        sys.stdout.flush()

    def cleanup(self) -> None:
        """Remove record, key, inbox and control socket (clean exit). Shims are left alone."""
        for sock in (self.inbox, self.ctl):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.close()
        for path in (self.record_path, self.key_path, Path(self.socket_path), self.ctl_path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def accept_loop(self, listener: socket.socket, target: Any) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                if self.stopping.is_set():
                    return
                time.sleep(0.05)
                continue
            threading.Thread(target=target, args=(conn,), daemon=True).start()

    # -- inbox ---------------------------------------------------------------------------------

    def serve_inbox_conn(self, conn: socket.socket) -> None:
        with conn:
            try:
                peer_pid: int | None = proc.peer_credentials(conn).pid
            except OSError:
                peer_pid = None
            state: dict[str, Any] = {"lines": 0, "auth": False, "auth_ok": False,
                                     "auth_as": None}
            deadline = time.monotonic() + self.idle_timeout
            buf = b""
            while True:
                if state["lines"] == 0:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return  # no complete line within the idle timeout: close
                    conn.settimeout(left)
                else:
                    conn.settimeout(None)
                try:
                    chunk = conn.recv(65536)
                except TimeoutError:
                    return
                except OSError:
                    return
                if not chunk:
                    if buf.strip():
                        self.handle_line(buf, state, peer_pid)  # a final fragment at EOF
                    return  # the peer half-closed: close our side, write nothing
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for raw in lines:
                    if len(raw.decode("utf-8", "replace")) > MAX_LINE_CHARS:
                        return  # "Line exceeded 1048576 chars": destroy the connection
                    self.handle_line(raw, state, peer_pid)
                if len(buf) > MAX_LINE_CHARS and len(
                        buf.decode("utf-8", "replace")) > MAX_LINE_CHARS:
                    return

    def handle_line(self, raw: bytes, state: dict[str, Any], peer_pid: int | None) -> None:
        text = raw.decode("utf-8", "replace").strip()
        if not text:
            return  # blank lines are skipped
        first = state["lines"] == 0
        state["lines"] += 1
        try:
            obj = json.loads(text)
        except ValueError:
            return  # unparseable lines are skipped (Claude logs them)
        if not isinstance(obj, dict):
            return
        kind = obj.get("type")
        if kind == "auth" and first:
            token = obj.get("token")
            state["auth"] = True
            state["auth_ok"] = token == self.peer_token
            state["auth_as"] = ("peer" if token == self.peer_token
                                else "child" if token == self.child_token else None)
            return
        if kind not in ("user", "control"):
            return
        with self.lock:
            current = self.record["sessionId"]
        dropped = None
        if "session_id" in obj and obj["session_id"] != current:
            dropped = "session_id_mismatch"
        elif kind == "user":
            verdict = self.gate.on_frame(obj, peer_pid)
            dropped = None if verdict == "deliver" else verdict  # held / refuse
        self.append_frame({"at": time.time(), "auth": state["auth"], "auth_ok": state["auth_ok"],
                           "auth_as": state["auth_as"], "peer_pid": peer_pid, "frame": obj,
                           "dropped": dropped})
        if (dropped is None and kind == "control" and obj.get("action") == "rename"
                and isinstance(obj.get("name"), str) and obj["name"]):
            # A peer's rename control frame renames the session (research §2).
            self.write_record(name=obj["name"], nameSource="peer", nameSince=now_ms())

    # -- control -------------------------------------------------------------------------------

    def serve_ctl_conn(self, conn: socket.socket) -> None:
        send_lock = threading.Lock()
        fds: list[int] = []

        def reply(obj: dict[str, Any]) -> None:
            with send_lock, contextlib.suppress(OSError):
                conn.sendall(json.dumps(obj).encode() + b"\n")

        buf = b""
        try:
            while True:
                try:
                    data, got, _flags, _addr = socket.recv_fds(conn, 65536, 16)
                except OSError:
                    return
                fds.extend(got)
                if not data:
                    return
                buf += data
                *lines, buf = buf.split(b"\n")
                for raw in lines:
                    if not raw.strip():
                        continue
                    try:
                        req = json.loads(raw)
                        if not isinstance(req, dict):
                            raise TypeError("a request is a JSON object")
                        self.handle_request(req, fds, reply)
                    except Exception as exc:  # a bad request gets an error reply
                        reply({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            with contextlib.suppress(OSError):
                conn.close()

    def handle_request(self, req: dict[str, Any], fds: list[int], reply: Any) -> None:
        op = req.get("op")
        if op == "spawn":
            self.op_spawn(fds, reply)
        elif op == "clear":
            session_id = req.get("session_id") or str(uuid.uuid4())
            self.write_record(sessionId=str(session_id))
            reply({"ok": True, "session_id": session_id})
        elif op == "rename":
            self.write_record(name=str(req["name"]), nameSource="peer", nameSince=now_ms())
            reply({"ok": True})
        elif op == "status":
            self.write_record(status=str(req["status"]), statusUpdatedAt=now_ms())
            reply({"ok": True})
        elif op == "send":
            token = req.get("auth")
            reply(self.send(str(req["to"]), str(req["content"]),
                            token if isinstance(token, str) else None))
        elif op == "shims":
            reply({"pids": self.running_shims()})
        elif op == "kill_shims":
            reply({"pids": self.kill_shims(str(req.get("signal", "KILL")))})
        elif op in ("mode", "held", "deliver", "deny"):
            reply(self.gate_request(op, req))
        elif op == "exit":
            reply({"ok": True})
            self.stopping.set()
        else:
            raise ValueError(f"unknown op {op!r}")

    def gate_request(self, op: str, req: dict[str, Any]) -> dict[str, Any]:
        """Run-time mode switches and the user's hold-dialog choices (:mod:`claude_gate`)."""
        if op == "mode":
            self.gate.mode_override = req.get("mode")
        elif op == "held":
            return {"ids": list(self.gate.held), "receipts": self.gate.receipts}
        else:
            frame = self.gate.release(str(req["msg_id"]), deliver=op == "deliver")
            if frame is not None:  # the user delivered it: now the model gets it
                self.append_frame({"at": time.time(), "auth": True, "auth_ok": True,
                                   "auth_as": "peer", "peer_pid": None, "frame": frame,
                                   "dropped": None, "released": True})
        return {"ok": True}

    def op_spawn(self, fds: list[int], reply: Any) -> None:
        if len(fds) < 3:
            raise ValueError("spawn needs three fds (stdin, stdout, stderr)")
        mine = fds[:3]
        del fds[:3]
        try:
            shim = self.spawn(mine)
        finally:
            for fd in mine:
                with contextlib.suppress(OSError):
                    os.close(fd)
        reply({"pid": shim.pid})  # before the watcher can send {"exit": ...}
        threading.Thread(target=self.watch, args=(shim, reply), daemon=True).start()

    def kill_shims(self, name: str) -> list[int]:
        sig = _SIGNALS[name.upper().removeprefix("SIG")]
        with self.shims_lock:
            procs = list(self.shims.values())
        for p in procs:
            with contextlib.suppress(OSError):
                p.send_signal(sig)
        return [p.pid for p in procs]

    def running_shims(self) -> list[int]:
        with self.shims_lock:
            return sorted(self.shims)

    def spawn(self, fds: list[int]) -> subprocess.Popen[bytes]:
        """Start the shim command with the launcher's stdio, as Claude starts an MCP server."""
        with self.lock:
            session_id = self.record["sessionId"]
        env = {**os.environ,
               "CLAUDE_CONFIG_DIR": str(self.config_dir),
               "CLAUDE_CODE_SESSION_ID": session_id,
               "CLAUDE_CODE_MESSAGING_SOCKET": self.socket_path,
               "CLAUDE_CODE_MESSAGING_TOKEN": self.child_token,
               "CLAUDE_CODE_ENTRYPOINT": self.record["entrypoint"],
               "CLAUDE_CODE_LAUNCHED_BY_SESSION_IDS": session_id,
               "CLAUDE_PROJECT_DIR": self.cwd,
               "CLAUDECODE": "1"}
        p = subprocess.Popen(self.shim_cmd, stdin=fds[0], stdout=fds[1], stderr=fds[2],
                             cwd=self.cwd, env=env, close_fds=True)
        with self.shims_lock:
            self.shims[p.pid] = p
        return p

    def watch(self, p: subprocess.Popen[bytes], reply: Any) -> None:
        rc = p.wait()
        with self.shims_lock:
            self.shims.pop(p.pid, None)
        reply({"exit": rc})

    def send(self, to: str, content: str, token: str | None) -> dict[str, Any]:
        """Claude's SendMessage sender (research §6): optional auth line, one user frame,
        half-close, then wait (5 s idle timeout) for the receiver to close."""
        frame = {"msgV": 1, "msg_id": str(uuid.uuid4()), "type": "user",
                 "message": {"role": "user", "content": content}, "priority": "next",
                 "from": address(self.socket_path)}
        payload = compact(frame) + b"\n"
        if token is not None:
            payload = compact({"type": "auth", "token": token}) + b"\n" + payload
        started = time.monotonic()
        back = 0
        connected = wrote = False
        error: str | None = None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(SEND_TIMEOUT)
        try:
            sock.connect(to)
            connected = True
            sock.sendall(payload)
            wrote = True
            sock.shutdown(socket.SHUT_WR)
            while True:  # it never reads what comes back, but must see the close
                chunk = sock.recv(65536)
                if not chunk:
                    break
                back += len(chunk)
        except TimeoutError:
            error = f"Timed out sending to {address(to)}"
        except ConnectionResetError:
            pass  # the receiver closed with bytes unread: that is a close
        except OSError as exc:
            error = f"{type(exc).__name__}: {exc}"
        finally:
            sock.close()
        ok = connected and wrote and error is None
        return {"ok": ok, "error": error, "secs": time.monotonic() - started,
                "bytes_back": back, "msg_id": frame["msg_id"]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--config-dir", required=True)
    ap.add_argument("--socket-dir", required=True)
    ap.add_argument("--session-id", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--cwd", required=True)
    ap.add_argument("--frames", required=True)
    ap.add_argument("--ctl", required=True)
    ap.add_argument("--shim-cmd", default=None, help="JSON list; default: python -m crosstalk mcp")
    ap.add_argument("--no-status", action="store_true", help="no status field (like sdk-cli)")
    ap.add_argument("--idle-timeout", default=30.0, type=float,
                    help="close an inbox connection with no complete line after this long")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    fake = FakeClaude(parse_args(argv))

    def on_term(_signum: int, _frame: Any) -> None:
        fake.stopping.set()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    try:
        fake.start()
        while not fake.stopping.wait(0.2):
            pass
    finally:
        fake.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
