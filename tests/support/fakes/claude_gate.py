"""The fake Claude session's inbound gate: what Claude Code 2.1.328 does with a peer's frame.

Research ``claude-code.md`` §5 and §11, as observed live:

* a frame whose writer (SO_PEERCRED pid) descends from the session is ``selfSent``: delivered,
  no gate, no receipt;
* otherwise ``crossSessionInbound`` (user settings; project and local only stricter) decides:
  ``accept`` delivers, ``hold`` holds, ``refuse`` refuses; unset, the sender's envelope
  ``from-mode`` class must equal the session's mode class (a sender asserting no mode is held
  only when the session bypasses). The session's mode is its settings' ``defaultMode``, or
  what a ``mode`` control request set (Shift+Tab at run time);
* a held or refused frame gets a ``peer_message_status`` receipt, sent to the frame's ``from``
  only if that address vets (same directory as the inbox, or a ``cc-socks`` directory with a
  1-16 hex basename) and its listener is the very process that wrote the frame (pid and start
  time); the user's Deliver / Deny later sends ``delivered`` / ``denied`` the same way.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import urllib.parse
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crosstalk import proc

_MODE_ATTR = re.compile(r'^<cross-session-message [^>\n]*?from-mode="(\w+)"')
_ENVELOPE = re.compile(r"^<cross-session-message[ >]")
_HEX_NAME = re.compile(r"^(\d+(-[0-9a-f]{8})?|[0-9a-f]{1,16})\.sock$")
_STRICT = {"accept": 0, "hold": 1, "refuse": 2}


def _settings(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


@dataclass
class Held:
    frame: dict[str, Any]
    from_path: str | None
    writer: tuple[int, str | None]


class Gate:
    def __init__(self, pid: int, socket_path: str, config_dir: Path, cwd: str) -> None:
        self.pid = pid
        self.socket_path = socket_path
        self.config_dir = config_dir
        self.cwd = cwd
        self.mode_override: str | None = None
        self.held: dict[str, Held] = {}
        self.lock = threading.Lock()
        #: What happened to receipts (sent, or why not), for tests to read.
        self.receipts: list[dict[str, Any]] = []

    def _files(self) -> list[Path]:
        return [self.config_dir / "settings.json", Path(self.cwd) / ".claude" / "settings.json",
                Path(self.cwd) / ".claude" / "settings.local.json"]

    def mode(self) -> str:
        if self.mode_override is not None:
            return self.mode_override
        found = "prompting"
        for path in self._files():
            perms = _settings(path).get("permissions")
            value = perms.get("defaultMode") if isinstance(perms, dict) else None
            if isinstance(value, str):
                found = "bypass" if value == "bypassPermissions" else "prompting"
        return found

    def policy(self) -> str | None:
        user, *project = self._files()
        value = _settings(user).get("crossSessionInbound")
        policy = value if value in _STRICT else None
        for path in project:
            value = _settings(path).get("crossSessionInbound")
            if value in _STRICT and value != "accept" and (
                    policy is None or _STRICT[value] > _STRICT[policy]):
                policy = value
        return policy

    def decide(self, frame: dict[str, Any], peer_pid: int | None) -> str:
        """``deliver``, ``hold`` or ``refuse`` for one user frame."""
        if peer_pid is None or peer_pid == self.pid or self.pid in proc.ancestors(peer_pid):
            return "deliver"  # selfSent: Claude's gate skips its own descendants
        policy = self.policy()
        if policy == "accept":
            return "deliver"
        if policy is not None:
            return policy
        content = str(frame.get("message", {}).get("content", ""))
        m = _MODE_ATTR.match(content) if _ENVELOPE.match(content) else None
        theirs = ("bypass" if m.group(1) == "bypass" else "prompting") if m else None
        mine = self.mode()
        if (theirs is None and mine == "bypass") or (theirs is not None and theirs != mine):
            return "hold"
        return "deliver"

    def on_frame(self, frame: dict[str, Any], peer_pid: int | None) -> str:
        verdict = self.decide(frame, peer_pid)
        if verdict == "deliver":
            return verdict
        writer = (peer_pid or 0, proc.process_start_time(peer_pid) if peer_pid else None)
        from_path = _path_of(frame.get("from"))
        msg_id = str(frame.get("msg_id", ""))
        if verdict == "hold":
            with self.lock:
                self.held[msg_id] = Held(frame, from_path, writer)
            self.receipt(from_path, writer, msg_id, "held")
        else:
            self.receipt(from_path, writer, msg_id, "expired", detail="refused")
        return verdict

    def release(self, msg_id: str, deliver: bool) -> dict[str, Any] | None:
        """The user's choice in the hold dialog: the frame if delivered, else ``None``."""
        with self.lock:
            held = self.held.pop(msg_id, None)
        if held is None:
            raise KeyError(f"no held message {msg_id}")
        self.receipt(held.from_path, held.writer, msg_id, "delivered" if deliver else "denied")
        return held.frame if deliver else None

    def _vets(self, path: str) -> bool:
        p = Path(path)
        if p.parent == Path(self.socket_path).parent and p.name.endswith(".sock"):
            return True
        return p.parent.name.startswith("cc-socks") and bool(_HEX_NAME.match(p.name))

    def receipt(self, from_path: str | None, writer: tuple[int, str | None], msg_id: str,
                status: str, detail: str | None = None) -> None:
        entry: dict[str, Any] = {"status": status, "orig_msg_id": msg_id, "to": from_path}
        if from_path is None or not self._vets(from_path):
            self.receipts.append({**entry, "sent": False, "why": "address does not vet"})
            return
        line: dict[str, Any] = {"type": "control", "action": "peer_message_status",
                                "status": status, "reason": f"fake {status}",
                                "from": f"uds:{self.socket_path}", "orig_msg_id": msg_id,
                                "msgV": 1, "msg_id": str(uuid.uuid4())}
        if detail:
            line["status_detail"] = detail
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(5.0)
        try:
            sock.connect(from_path)
            listener = proc.peer_credentials(sock).pid
            start = proc.process_start_time(listener)
            if (listener, start) != writer:
                self.receipts.append({**entry, "sent": False, "why": (
                    f"connected endpoint is pid {listener}, expected {writer[0]}")})
                return
            sock.sendall(json.dumps(line).encode() + b"\n")
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(4096):
                pass
            self.receipts.append({**entry, "sent": True})
        except OSError as exc:
            self.receipts.append({**entry, "sent": False, "why": f"{type(exc).__name__}"})
        finally:
            with contextlib.suppress(OSError):
                sock.close()


def _path_of(address: Any) -> str | None:
    if not isinstance(address, str) or not address.startswith("uds:"):
        return None
    return urllib.parse.unquote(address[4:])


def held_ids(gate: Gate) -> list[str]:
    with gate.lock:
        return list(gate.held)

