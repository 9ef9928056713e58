"""A scripted mock of the OpenAI Responses API for driving the real Codex binary.

Run inside the loopback-only network namespace (standard library only)::

    python mock_responses.py --log <requests.jsonl> --control <ctl.sock>

It binds ``127.0.0.1:<free port>`` and prints ``PORT <n>`` once both listeners are up. Codex
is pointed at it by a custom model provider whose ``base_url`` is ``http://127.0.0.1:<n>/v1``;
Codex 0.169.0 then sends ``POST /v1/responses`` (``stream: true``) and never asks for
``/v1/models``. The test process outside the namespace steers the mock over the **control
socket** (a unix socket) and reads the **request log** file directly.

Log: one JSON line per HTTP request, ``{"seq", "t", "method", "path", "kind", "thread",
"session", "headers", "body", "rule", "response"}``: ``thread`` and ``session`` are Codex's
``thread-id`` and ``session-id`` headers, ``kind`` is ``main`` (a turn's request: it carries
``tools``), ``title`` (the automatic thread-title request) or ``side``, ``body`` the parsed
JSON body, ``rule`` the id of the rule that answered (or null), ``response`` the output items
sent back.

Control protocol (the same as ``mock_api.py``'s, so its ``MockControl`` client works): connect,
write one JSON object and a newline, read one JSON line back. ``{"op": "ping"}``,
``{"op": "add_rules", "rules": [...]}``, ``{"op": "clear_rules"}``, ``{"op": "rules"}``,
``{"op": "open_gate", "name": "g"}``.

A rule (all keys optional except one of ``text``/``function_call``)::

    {"id": "r1",                  # echoed in the log
     "match": "substring",        # searched in the text of the last role=user message
     "scope": "last_user",        # or "any": every message item of the input
     "thread": "<thread id>",     # only requests with this thread-id header
     "main_only": true,           # only turn requests (they carry "tools")
     "once": true,                # consumed when it fires
     "delay_s": 0,                # hold the stream this long after response.created
     "gate": "g",                 # answer only once the test opened gate "g"; "gate_timeout_s"
     "capture": {"name": "regex"},  # searched like "match"; group 1 (else the whole match)
                                  # replaces {{name}} in "text" and in the call's arguments
     "text": "assistant text",
     "function_call": {"namespace": "mcp__crosstalk", "name": "send_message",
                       "arguments": {...} | "json string"},
     "then": {<rule without match>}}   # answers the request that carries this call's
                                  # function_call_output; inherits the captures

A rule only answers a request that ends with a user message (a new turn, or input that joined
a running one), never one that ends with a function_call_output: those get the ``then`` owed to
that call, else the default. Unmatched turn requests get the text ``MOCK-OK``; the thread-title
request (``text.format`` ``json_schema`` with a ``title`` property) gets ``{"title": "Mock
thread"}``; other side requests get ``MOCK-OK`` too.
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

from tests.live.support.mock_api import (
    MockHTTPServer,
    MockState,
    _fill,
    _with_captures,
)
from tests.live.support.mock_api import main as serve

DEFAULT_TEXT = "MOCK-OK"
TITLE = "Mock thread"


class ResponsesState(MockState):
    """Rules, follow-ups keyed by call_id, gates and the request log (thread-safe)."""

    def pick(self, body: dict[str, Any], session: str | None) -> dict[str, Any] | None:
        """The follow-up owed to a function_call_output this request carries, else (for a
        request ending with a user message) the first matching rule. ``session`` is the
        request's thread id."""
        items = input_items(body)
        main = is_turn_request(body)
        with self.lock:
            for item in reversed(items):
                if item.get("type") == "function_call_output":
                    followup = self.followups.pop(str(item.get("call_id")), None)
                    if followup is not None:
                        return _with_captures(followup, _captures(followup, body) or {})
            if not ends_with_user(items):
                return None
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

    def check_rule(self, rule: dict[str, Any]) -> str | None:
        if not (rule.get("text") or rule.get("function_call")):
            return f"rule without text or function_call: {rule}"
        return None


# -- reading a request -----------------------------------------------------------------------


def input_items(body: dict[str, Any]) -> list[dict[str, Any]]:
    raw = body.get("input")
    if isinstance(raw, str):
        return [{"type": "message", "role": "user", "content": raw}]
    return [i for i in raw or [] if isinstance(i, dict)]


def is_message(item: dict[str, Any]) -> bool:
    return bool(item.get("type", "message") == "message")


def ends_with_user(items: list[dict[str, Any]]) -> bool:
    return bool(items) and is_message(items[-1]) and items[-1].get("role") == "user"


def is_turn_request(body: dict[str, Any]) -> bool:
    return bool(body.get("tools"))


def is_title_request(body: dict[str, Any]) -> bool:
    fmt = (body.get("text") or {}).get("format") or {}
    props = (fmt.get("schema") or {}).get("properties") or {}
    return fmt.get("type") == "json_schema" and "title" in props


def item_text(item: Any) -> str:
    """Every text piece of an input item (a message's content parts, or a function call
    output's text), joined by newlines."""
    if not isinstance(item, dict):
        return ""
    content = item.get("output") if item.get("type") == "function_call_output" \
        else item.get("content")
    if isinstance(content, str):
        return content
    parts = []
    for part in content or []:
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            parts.append(part["text"])
        elif isinstance(part, str):
            parts.append(part)
    return "\n".join(parts)


def last_user(body: dict[str, Any]) -> dict[str, Any]:
    for item in reversed(input_items(body)):
        if is_message(item) and item.get("role") == "user":
            return dict(item)
    return {}


def _scope_text(rule: dict[str, Any], body: dict[str, Any]) -> str:
    if rule.get("scope", "last_user") == "any":
        return "\n".join(item_text(i) for i in input_items(body) if is_message(i))
    return item_text(last_user(body))


def _applies(rule: dict[str, Any], body: dict[str, Any], thread: str | None,
             main: bool) -> bool:
    if rule.get("main_only", True) and not main:
        return False
    if rule.get("thread") and rule["thread"] != thread:
        return False
    needle = rule.get("match", "")
    return not needle or needle in _scope_text(rule, body)


def _captures(rule: dict[str, Any], body: dict[str, Any]) -> dict[str, str] | None:
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






def output_items(rule: dict[str, Any] | None, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The output items answering ``body``: the rule's text and/or function call."""
    if rule is None:
        text = json.dumps({"title": TITLE}) if is_title_request(body) else DEFAULT_TEXT
        return [_message(text)]
    captures = rule.get("_captures") or {}
    out: list[dict[str, Any]] = []
    if rule.get("text"):
        out.append(_message(_fill(str(rule["text"]), captures)))
    call = rule.get("function_call")
    if call:
        args = _fill(call.get("arguments", {}), captures)
        item = {"type": "function_call", "id": "fc_" + uuid.uuid4().hex[:12],
                "call_id": "call_" + uuid.uuid4().hex[:12], "name": call["name"],
                "arguments": args if isinstance(args, str) else json.dumps(args)}
        if call.get("namespace"):
            item["namespace"] = call["namespace"]
        out.append(item)
    return out or [_message(DEFAULT_TEXT)]


def _message(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "id": "msg_" + uuid.uuid4().hex[:12],
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


# -- HTTP ------------------------------------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    # One response per connection: the SSE stream ends when the connection closes (checked
    # live with Codex 0.169.0).
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
                "thread": self.headers.get("thread-id"),
                "session": self.headers.get("session-id"),
                "headers": dict(self.headers), "body": body, "rule": None, "response": None}

    def do_GET(self) -> None:
        self.server.state.record(self._entry(None))
        if self.path.split("?", 1)[0].endswith("/models"):
            self._send_json({"object": "list", "data": [
                {"id": "mock-model", "object": "model", "owned_by": "crosstalk-live"}]})
            return
        self._send_json({"error": {"message": f"not found: {self.path}"}}, 404)

    def do_POST(self) -> None:
        body = self._read_body()
        entry = self._entry(body)
        state = self.server.state
        if not (self.path.split("?", 1)[0].rstrip("/").endswith("/responses")
                and isinstance(body, dict)):
            state.record(entry)
            self._send_json({"error": {"message": f"not found: {self.path}"}}, 404)
            return
        rule = state.pick(body, entry["thread"])
        items = output_items(rule, body)
        for item in items:
            if item["type"] == "function_call" and rule is not None and rule.get("then"):
                state.expect_followup(item["call_id"], _with_captures(
                    dict(rule["then"]), rule.get("_captures") or {}))
        entry["rule"] = rule.get("id") if rule else None
        entry["response"] = items
        if rule is not None and rule.get("_captures"):
            entry["captures"] = rule["_captures"]
        state.record(entry)
        self._stream(rule, items)

    def _stream(self, rule: dict[str, Any] | None, items: list[dict[str, Any]]) -> None:
        rid = "resp_" + uuid.uuid4().hex[:16]
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.end_headers()

        def event(data: dict[str, Any]) -> None:
            self.wfile.write(f"event: {data['type']}\ndata: {json.dumps(data)}\n\n".encode())
            self.wfile.flush()

        event({"type": "response.created", "response": {"id": rid, "status": "in_progress"}})
        if rule is not None and rule.get("delay_s"):
            time.sleep(float(rule["delay_s"]))
        if rule is not None and rule.get("gate"):
            opened = self.server.state.gate(str(rule["gate"])).wait(
                float(rule.get("gate_timeout_s", 60)))
            if not opened:
                print(f"mock: gate {rule['gate']!r} not opened in time; answering anyway",
                      file=sys.stderr, flush=True)
        for index, item in enumerate(items):
            if item["type"] == "message":
                text = item["content"][0]["text"]
                event({"type": "response.output_item.added", "output_index": index,
                       "item": dict(item, content=[], status="in_progress")})
                event({"type": "response.output_text.delta", "item_id": item["id"],
                       "output_index": index, "content_index": 0, "delta": text})
            else:
                event({"type": "response.output_item.added", "output_index": index,
                       "item": item})
            event({"type": "response.output_item.done", "output_index": index, "item": item})
        event({"type": "response.completed", "response": {
            "id": rid, "status": "completed", "output": items,
            "usage": {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": 15}}})


def main(argv: list[str] | None = None) -> int:
    return serve(argv, state_type=ResponsesState, handler=Handler, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
