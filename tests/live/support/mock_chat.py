"""A scripted mock of the OpenAI Chat Completions API for driving the real opencode binary.

Run inside the loopback-only network namespace (standard library only)::

    python mock_chat.py --log <requests.jsonl> --control <ctl.sock>

It binds ``127.0.0.1:<free port>`` and prints ``PORT <n>`` once both listeners are up. opencode
1.18.33 reaches it through a custom provider (``"npm": "@ai-sdk/openai-compatible"``, bundled in
the binary) whose ``options.baseURL`` is ``http://127.0.0.1:<n>/v1``; it then only sends
``POST /v1/chat/completions`` with ``stream: true`` (research §8). The test process outside the
namespace steers the mock over the **control socket** and reads the **request log** directly.

Log: one JSON line per HTTP request, ``{"seq", "t", "method", "path", "kind", "session",
"headers", "body", "rule", "response"}``: ``session`` is opencode's ``x-session-id`` header,
``kind`` is ``main`` (a turn's request: it carries ``tools``), ``title`` (the title generator's
request) or ``side``; ``response`` is the assistant message sent back.

Control protocol: the one of ``mock_api.py`` (its ``MockControl`` client works here).

A rule (all keys optional except one of ``text``/``tool_call``)::

    {"id": "r1", "match": "substring", "scope": "last_user" | "any",
     "session": "<ses_...>",       # only requests with this x-session-id
     "main_only": true, "once": true, "delay_s": 0, "gate": "g", "gate_timeout_s": 60,
     "capture": {"name": "regex"},
     "text": "assistant text",
     "tool_call": {"name": "crosstalk_echo", "arguments": {...}},
     "then": {<rule without match>}}  # answers the request carrying this call's result

A rule only answers a request that ends with a user message; one that ends with a tool result
gets the ``then`` owed to that call, else ``MOCK-OK``. Unmatched turn requests get ``MOCK-OK``;
title requests get ``Mock title``.
"""

from __future__ import annotations

import json
import re
import sys
import time
import uuid
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

if not __package__:  # run as a script inside the namespace: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tests.live.support.mock_api import MockHTTPServer, MockState, _fill, _with_captures
from tests.live.support.mock_api import main as serve

DEFAULT_TEXT = "MOCK-OK"
TITLE = "Mock title"


def message_text(message: Any) -> str:
    """The text of one chat message (a string, or a list of text parts)."""
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "\n".join(str(p.get("text", "")) for p in content or [] if isinstance(p, dict))


def messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in body.get("messages") or [] if isinstance(m, dict)]


def last_user(body: dict[str, Any]) -> dict[str, Any]:
    for message in reversed(messages(body)):
        if message.get("role") == "user":
            return message
    return {}


def is_title_request(body: dict[str, Any]) -> bool:
    system = " ".join(message_text(m) for m in messages(body) if m.get("role") == "system")
    return "title generator" in system.lower() and not body.get("tools")


def is_turn_request(body: dict[str, Any]) -> bool:
    return bool(body.get("tools"))


def tool_call_ids(body: dict[str, Any]) -> list[str]:
    """The ids of the tool results at the end of the request (the calls being answered)."""
    out: list[str] = []
    for message in reversed(messages(body)):
        if message.get("role") != "tool":
            break
        out.append(str(message.get("tool_call_id")))
    return out


def _scope_text(rule: dict[str, Any], body: dict[str, Any]) -> str:
    if rule.get("scope", "last_user") == "any":
        return "\n".join(message_text(m) for m in messages(body) if m.get("role") != "system")
    return message_text(last_user(body))


def _captures(rule: dict[str, Any], body: dict[str, Any]) -> dict[str, str] | None:
    out: dict[str, str] = {}
    for name, pattern in (rule.get("capture") or {}).items():
        m = re.search(pattern, _scope_text(rule, body))
        if m is None:
            return None
        out[name] = m.group(1) if m.re.groups else m.group(0)
    return out


class ChatState(MockState):
    """Rules, follow-ups keyed by tool call id, gates and the request log (thread-safe)."""

    def pick(self, body: dict[str, Any], session: str | None) -> dict[str, Any] | None:
        with self.lock:
            for call_id in tool_call_ids(body):
                followup = self.followups.pop(call_id, None)
                if followup is not None:
                    return _with_captures(followup, _captures(followup, body) or {})
            items = messages(body)
            if not items or items[-1].get("role") != "user" or is_title_request(body):
                return None
            for rule in self.rules:
                if rule.get("main_only", True) and not is_turn_request(body):
                    continue
                if rule.get("session") and rule["session"] != session:
                    continue
                if rule.get("match") and rule["match"] not in _scope_text(rule, body):
                    continue
                found = _captures(rule, body)
                if found is None:
                    continue
                if rule.get("once", True):
                    self.rules.remove(rule)
                return _with_captures(rule, found)
        return None

    def check_rule(self, rule: dict[str, Any]) -> str | None:
        if not (rule.get("text") or rule.get("tool_call")):
            return f"rule without text or tool_call: {rule}"
        return None


def reply_for(rule: dict[str, Any] | None, body: dict[str, Any]) -> dict[str, Any]:
    """The assistant message answering ``body``."""
    if rule is None:
        return {"role": "assistant", "content": TITLE if is_title_request(body)
                else DEFAULT_TEXT}
    captures = rule.get("_captures") or {}
    out: dict[str, Any] = {"role": "assistant",
                           "content": _fill(str(rule.get("text") or ""), captures)}
    call = rule.get("tool_call")
    if call:
        args = _fill(call.get("arguments", {}), captures)
        out["tool_calls"] = [{"index": 0, "id": "call_" + uuid.uuid4().hex[:12],
                              "type": "function",
                              "function": {"name": call["name"], "arguments": args
                                           if isinstance(args, str) else json.dumps(args)}}]
    return out


class Handler(BaseHTTPRequestHandler):
    # Close-delimited responses end the SSE stream cleanly (research §8).
    protocol_version = "HTTP/1.0"
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
        kind = None
        if isinstance(body, dict):
            kind = ("title" if is_title_request(body)
                    else "main" if is_turn_request(body) else "side")
        return {"t": time.time(), "method": self.command, "path": self.path, "kind": kind,
                "session": self.headers.get("x-session-id"), "headers": dict(self.headers),
                "body": body, "rule": None, "response": None}

    def do_GET(self) -> None:
        self.server.state.record(self._entry(None))
        if self.path.split("?", 1)[0].endswith("/models"):
            self._send_json({"object": "list", "data": [{"id": "mock-model",
                                                         "object": "model"}]})
            return
        self._send_json({"error": {"message": f"not found: {self.path}"}}, 404)

    def do_POST(self) -> None:
        body = self._read_body()
        entry = self._entry(body)
        state = self.server.state
        if not (self.path.split("?", 1)[0].rstrip("/").endswith("/chat/completions")
                and isinstance(body, dict)):
            state.record(entry)
            self._send_json({"error": {"message": f"not found: {self.path}"}}, 404)
            return
        rule = state.pick(body, entry["session"])
        reply = reply_for(rule, body)
        for call in reply.get("tool_calls") or []:
            if rule is not None and rule.get("then"):
                state.expect_followup(call["id"], _with_captures(
                    dict(rule["then"]), rule.get("_captures") or {}))
        entry["rule"] = rule.get("id") if rule else None
        entry["response"] = reply
        state.record(entry)
        self._stream(rule, reply)

    def _chunk(self, cid: str, delta: dict[str, Any], finish: str | None = None) -> None:
        obj: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk",
                               "created": int(time.time()), "model": "mock-model",
                               "choices": [{"index": 0, "delta": delta,
                                            "finish_reason": finish}]}
        if finish:
            obj["usage"] = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
        self.wfile.flush()

    def _stream(self, rule: dict[str, Any] | None, reply: dict[str, Any]) -> None:
        cid = "chatcmpl-" + uuid.uuid4().hex[:12]
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.end_headers()
        try:
            self._chunk(cid, {"role": "assistant", "content": ""})
            if rule is not None and rule.get("delay_s"):
                time.sleep(float(rule["delay_s"]))
            if rule is not None and rule.get("gate"):
                opened = self.server.state.gate(str(rule["gate"])).wait(
                    float(rule.get("gate_timeout_s", 60)))
                if not opened:
                    print(f"mock: gate {rule['gate']!r} not opened in time; answering anyway",
                          file=sys.stderr, flush=True)
            if reply.get("content"):
                self._chunk(cid, {"content": reply["content"]})
            if reply.get("tool_calls"):
                self._chunk(cid, {"tool_calls": reply["tool_calls"]})
                self._chunk(cid, {}, "tool_calls")
            else:
                self._chunk(cid, {}, "stop")
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass  # opencode aborted the request (a session abort)


def main(argv: list[str] | None = None) -> int:
    return serve(argv, state_type=ChatState, handler=Handler, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
