"""A scripted mock of the Anthropic Messages API for driving the real Claude Code binary.

Run inside the loopback-only network namespace (standard library only, so it runs with any
Python)::

    python mock_api.py --log <requests.jsonl> --control <ctl.sock>

It binds ``127.0.0.1:<free port>`` and prints ``PORT <n>`` on stdout once both listeners are
up. The test process outside the namespace cannot reach that port; it steers the mock over
the **control socket** (a unix socket: those work across the network namespace boundary) and
reads the **request log** file directly.

Log: one JSON line per HTTP request, ``{"seq", "t", "method", "path", "session", "headers",
"body", "rule", "response"}`` — ``session`` is the ``X-Claude-Code-Session-Id`` header,
``body`` the parsed JSON body, ``rule`` the id of the rule that answered (or null),
``response`` the content blocks sent back.

Control protocol: connect, write one JSON object and a newline, read one JSON line back.
``{"op": "ping"}``, ``{"op": "add_rules", "rules": [...]}``, ``{"op": "clear_rules"}``,
``{"op": "rules"}`` (list the pending ones), ``{"op": "open_gate", "name": "g"}`` (let the
requests waiting at gate ``g`` be answered, now and later).

A rule (all keys optional except one of ``text``/``tool_use``)::

    {"id": "r1",                  # echoed in the log
     "match": "substring",        # searched in the text of the last role=user message
     "scope": "last_user",        # or "any": every message, system prompt excluded
     "session": "<session id>",   # only requests with this X-Claude-Code-Session-Id
     "main_only": true,           # only main-loop requests (they carry "tools")
     "once": true,                # consumed when it fires
     "delay_s": 0,                # sleep before answering (a long turn)
     "gate": "g",                 # answer only once the test opened gate "g" (a model that
                                  # thinks until the test says so); "gate_timeout_s": 60
     "capture": {"name": "regex"},  # searched like "match" (all must match for the rule to
                                  # apply); group 1, else the whole match, replaces {{name}}
                                  # in "text" and in every string of the tool_use input
     "text": "assistant text",
     "tool_use": {"name": "mcp__crosstalk__send_message", "input": {...}},
     "then": {<rule without match>}}   # answers the request carrying this tool_use's result;
                                  # it inherits the captures (and may add its own)

Requests that no rule answers (main loop, title generation, classifiers) get a short text
answer with ``stop_reason: end_turn``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import socket
import socketserver
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DEFAULT_TEXT = "MOCK-OK"
TITLE_TEXT = "Mock session"


class MockState:
    """Rules, follow-ups keyed by tool_use id, and the request log (thread-safe)."""

    def __init__(self, log_path: str) -> None:
        self.lock = threading.Lock()
        self.rules: list[dict[str, Any]] = []
        self.followups: dict[str, dict[str, Any]] = {}
        self.gates: dict[str, threading.Event] = {}
        self.log_path = log_path
        self.seq = 0
        # Created empty now, so "no requests yet" and "log missing" cannot be confused.
        with open(log_path, "a", encoding="utf-8"):
            pass

    def record(self, entry: dict[str, Any]) -> None:
        with self.lock:
            self.seq += 1
            entry["seq"] = self.seq
            line = json.dumps(entry, ensure_ascii=False) + "\n"
            with open(self.log_path, "a", encoding="utf-8") as f:
                f.write(line)
                f.flush()

    def add_rules(self, rules: list[dict[str, Any]]) -> int:
        with self.lock:
            for rule in rules:
                rule.setdefault("id", "rule-" + uuid.uuid4().hex[:8])
                self.rules.append(rule)
            return len(self.rules)

    def pick(self, body: dict[str, Any], session: str | None) -> dict[str, Any] | None:
        """A follow-up owed to a tool_result in this request, else the first matching rule.

        A rule with captures comes back as a copy carrying them under ``_captures``."""
        main = bool(body.get("tools"))
        with self.lock:
            for tool_use_id in tool_result_ids(last_user(body)):
                followup = self.followups.pop(tool_use_id, None)
                if followup is not None:
                    # A follow-up's own captures are optional: it is owed either way.
                    return _with_captures(followup, _captures(followup, body) or {})
            for rule in self.rules:
                if not _applies(rule, body, session, main):
                    continue
                found = _captures(rule, body)
                if found is None:
                    continue
                if rule.get("once", True):
                    self.rules.remove(rule)
                return _with_captures(rule, found)
        return None

    def gate(self, name: str) -> threading.Event:
        with self.lock:
            return self.gates.setdefault(name, threading.Event())

    def check_rule(self, rule: dict[str, Any]) -> str | None:
        """Why ``rule`` cannot be served (a mock with stricter rules overrides this)."""
        return None

    def expect_followup(self, tool_use_id: str, rule: dict[str, Any]) -> None:
        with self.lock:
            rule.setdefault("id", "then-" + uuid.uuid4().hex[:8])
            self.followups[tool_use_id] = rule


def _applies(rule: dict[str, Any], body: dict[str, Any], session: str | None,
             main: bool) -> bool:
    if rule.get("main_only", True) and not main:
        return False
    if rule.get("session") and rule["session"] != session:
        return False
    needle = rule.get("match", "")
    if not needle:
        return True
    if rule.get("scope", "last_user") == "any":
        return any(needle in message_text(m) for m in body.get("messages") or [])
    return needle in message_text(last_user(body))


def _scope_text(rule: dict[str, Any], body: dict[str, Any]) -> str:
    if rule.get("scope", "last_user") == "any":
        return "\n".join(message_text(m) for m in body.get("messages") or [])
    return message_text(last_user(body))


def _captures(rule: dict[str, Any], body: dict[str, Any]) -> dict[str, str] | None:
    """The rule's ``capture`` patterns found in its scope (None: one did not match)."""
    patterns = rule.get("capture") or {}
    if not patterns:
        return {}
    text = _scope_text(rule, body)
    out: dict[str, str] = {}
    for name, pattern in patterns.items():
        m = re.search(pattern, text)
        if m is None:
            return None
        out[name] = m.group(1) if m.re.groups else m.group(0)
    return out


def _with_captures(rule: dict[str, Any], found: dict[str, str]) -> dict[str, Any]:
    inherited = rule.get("_captures") or {}
    if not found and not inherited:
        return rule
    return dict(rule, _captures={**inherited, **found})


def _fill(value: Any, captures: dict[str, str]) -> Any:
    """``value`` with ``{{name}}`` replaced by each capture, in every string inside it."""
    if isinstance(value, str):
        for name, captured in captures.items():
            value = value.replace("{{" + name + "}}", captured)
        return value
    if isinstance(value, list):
        return [_fill(v, captures) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, captures) for k, v in value.items()}
    return value


def last_user(body: dict[str, Any]) -> dict[str, Any]:
    """The last ``role: "user"`` message (Claude may append ``role: "system"`` turns after it)."""
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            return message
    return {}


def message_text(message: Any) -> str:
    """Every piece of text in a message: text blocks and tool_result contents, joined."""
    if not isinstance(message, dict):
        return ""
    return _text_of(message.get("content"))


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, dict):
                if isinstance(block.get("text"), str):
                    parts.append(block["text"])
                if block.get("type") == "tool_result":
                    parts.append(_text_of(block.get("content")))
            elif isinstance(block, str):
                parts.append(block)
        return "\n".join(parts)
    return ""


def tool_result_ids(message: dict[str, Any]) -> list[str]:
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [str(b.get("tool_use_id")) for b in content
            if isinstance(b, dict) and b.get("type") == "tool_result"]


def blocks_for(rule: dict[str, Any] | None, main: bool) -> list[dict[str, Any]]:
    if rule is None:
        return [{"type": "text", "text": DEFAULT_TEXT if main else TITLE_TEXT}]
    out: list[dict[str, Any]] = []
    captures = rule.get("_captures") or {}
    if rule.get("text"):
        out.append({"type": "text", "text": _fill(str(rule["text"]), captures)})
    if rule.get("tool_use"):
        tool = rule["tool_use"]
        out.append({"type": "tool_use", "id": "toolu_" + uuid.uuid4().hex[:24],
                    "name": tool["name"], "input": _fill(tool.get("input", {}), captures)})
    return out or [{"type": "text", "text": DEFAULT_TEXT}]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: MockHTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _read_body(self) -> Any:
        n = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(n) if n else b""
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode("utf-8", "replace")

    def _send_json(self, obj: Any, code: int = 200) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _entry(self, body: Any) -> dict[str, Any]:
        return {"t": time.time(), "method": self.command, "path": self.path,
                "session": self.headers.get("X-Claude-Code-Session-Id"),
                "headers": dict(self.headers), "body": body, "rule": None, "response": None}

    def do_GET(self) -> None:
        self.server.state.record(self._entry(None))
        self._send_json({})

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        body = self._read_body()
        entry = self._entry(body)
        path = self.path.split("?", 1)[0]
        if path.endswith("/v1/messages/count_tokens"):
            self.server.state.record(entry)
            self._send_json({"input_tokens": max(1, len(json.dumps(body)) // 4)})
            return
        if not (path.endswith("/v1/messages") and isinstance(body, dict)):
            self.server.state.record(entry)
            self._send_json({})
            return
        state = self.server.state
        main = bool(body.get("tools"))
        rule = state.pick(body, entry["session"])
        blocks = blocks_for(rule, main)
        for block in blocks:
            if block["type"] == "tool_use" and rule is not None and rule.get("then"):
                state.expect_followup(block["id"], _with_captures(
                    dict(rule["then"]), rule.get("_captures") or {}))
        entry["rule"] = rule.get("id") if rule else None
        entry["response"] = blocks
        if rule is not None and rule.get("_captures"):
            entry["captures"] = rule["_captures"]
        state.record(entry)
        if rule is not None and rule.get("delay_s"):
            time.sleep(float(rule["delay_s"]))
        if rule is not None and rule.get("gate"):
            opened = state.gate(str(rule["gate"])).wait(float(rule.get("gate_timeout_s", 60)))
            if not opened:
                print(f"mock: gate {rule['gate']!r} not opened in time; answering anyway",
                      file=sys.stderr, flush=True)
        self._answer(body, blocks)

    def _answer(self, body: dict[str, Any], blocks: list[dict[str, Any]]) -> None:
        stop = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
        msg: dict[str, Any] = {
            "id": "msg_" + uuid.uuid4().hex[:24], "type": "message", "role": "assistant",
            "model": body.get("model", "mock"), "content": [], "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 1,
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}
        if not body.get("stream"):
            msg.update(content=blocks, stop_reason=stop)
            msg["usage"]["output_tokens"] = 5
            self._send_json(msg)
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.end_headers()

        def event(name: str, data: dict[str, Any]) -> None:
            self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
            self.wfile.flush()

        event("message_start", {"type": "message_start", "message": msg})
        for i, block in enumerate(blocks):
            if block["type"] == "text":
                event("content_block_start", {"type": "content_block_start", "index": i,
                                              "content_block": {"type": "text", "text": ""}})
                delta = {"type": "text_delta", "text": block["text"]}
            else:
                event("content_block_start", {"type": "content_block_start", "index": i,
                                              "content_block": dict(block, input={})})
                delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            event("content_block_delta", {"type": "content_block_delta", "index": i,
                                          "delta": delta})
            event("content_block_stop", {"type": "content_block_stop", "index": i})
        event("message_delta", {"type": "message_delta",
                                "delta": {"stop_reason": stop, "stop_sequence": None},
                                "usage": {"output_tokens": 5}})
        event("message_stop", {"type": "message_stop"})
        self.close_connection = True


class MockHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, state: MockState,
                 handler: type[BaseHTTPRequestHandler] | None = None) -> None:
        super().__init__(("127.0.0.1", 0), handler or Handler)
        self.state = state


class ControlSocketHandler(socketserver.StreamRequestHandler):
    server: ControlServer

    def handle(self) -> None:
        line = self.rfile.readline(1 << 20)
        try:
            request = json.loads(line)
            reply = self.server.dispatch(request)
        except Exception as exc:  # a bad request must not kill the control loop
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        self.wfile.write(json.dumps(reply).encode() + b"\n")


class ControlServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, state: MockState) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        super().__init__(path, ControlSocketHandler)
        os.chmod(path, 0o600)
        self.state = state

    def dispatch(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "ping":
            return {"ok": True}
        if op == "add_rules":
            rules = request.get("rules")
            if not isinstance(rules, list) or not all(isinstance(r, dict) for r in rules):
                return {"ok": False, "error": "rules must be a list of objects"}
            for rule in rules:
                why = self.state.check_rule(rule)
                if why is not None:
                    return {"ok": False, "error": why}
            return {"ok": True, "pending": self.state.add_rules(rules)}
        if op == "clear_rules":
            with self.state.lock:
                self.state.rules.clear()
                self.state.followups.clear()
            return {"ok": True}
        if op == "open_gate":
            name = request.get("name")
            if not isinstance(name, str) or not name:
                return {"ok": False, "error": "open_gate needs a name"}
            self.state.gate(name).set()
            return {"ok": True}
        if op == "rules":
            with self.state.lock:
                return {"ok": True, "rules": list(self.state.rules),
                        "followups": dict(self.state.followups)}
        return {"ok": False, "error": f"unknown op {op!r}"}


def main(argv: list[str] | None = None, *, state_type: type[MockState] = MockState,
         handler: type[BaseHTTPRequestHandler] | None = None, doc: str | None = None) -> int:
    """Serve the mock (HTTP on 127.0.0.1) and its control socket; print ``PORT <n>``."""
    parser = argparse.ArgumentParser(description=(doc or __doc__ or "").split("\n\n")[0])
    parser.add_argument("--log", required=True)
    parser.add_argument("--control", required=True)
    args = parser.parse_args(argv)
    state = state_type(args.log)
    http = MockHTTPServer(state, handler)
    control = ControlServer(args.control, state)
    threading.Thread(target=control.serve_forever, daemon=True).start()
    print(f"PORT {http.server_address[1]}", flush=True)
    try:
        http.serve_forever()
    finally:
        control.server_close()
        with contextlib.suppress(OSError):
            os.unlink(args.control)
    return 0


class MockControl:
    """The test side of the control socket (usable from outside the namespace)."""

    def __init__(self, path: str, timeout: float = 10.0) -> None:
        self.path = path
        self.timeout = timeout

    def call(self, request: dict[str, Any]) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(self.timeout)
            sock.connect(self.path)
            sock.sendall(json.dumps(request).encode() + b"\n")
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                buf += chunk
        reply = json.loads(buf)
        if not isinstance(reply, dict) or not reply.get("ok"):
            raise RuntimeError(f"mock control {request.get('op')!r} failed: {reply!r}")
        return reply

    def ping(self) -> bool:
        try:
            self.call({"op": "ping"})
        except (OSError, ValueError, RuntimeError):
            return False
        return True

    def add_rules(self, *rules: dict[str, Any]) -> None:
        self.call({"op": "add_rules", "rules": list(rules)})

    def clear_rules(self) -> None:
        self.call({"op": "clear_rules"})

    def open_gate(self, name: str) -> None:
        self.call({"op": "open_gate", "name": name})


def read_log(path: str) -> list[dict[str, Any]]:
    """Every complete line of the request log (a line being written is skipped)."""
    try:
        with open(path, encoding="utf-8") as f:
            raw = f.read()
    except FileNotFoundError:
        return []
    out = []
    for line in raw.split("\n"):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # torn tail: the writer is mid-line
    return out


if __name__ == "__main__":
    sys.exit(main())
