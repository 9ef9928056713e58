"""Steps the opencode scenario tests share: the real ``crosstalk mcp`` as opencode's MCP server,
opencode sessions as CrossTalk agents, and what opencode's model received.

The rig is :mod:`tests.live.support.opencode` (processes, the mock Chat Completions API); this
module only adds the CrossTalk side of a scenario.
"""

from __future__ import annotations

import json
import time
from typing import Any

from tests.live.support.claude import Entry, LiveClaude, World, tool_results, wait_for
from tests.live.support.mock_api import message_text as claude_text
from tests.live.support.mock_chat import last_user, message_text, messages
from tests.live.support.opencode import OpencodeTui, OpencodeWorld
from tests.live.support.steps import unique


def crosstalk_entry(ow: OpencodeWorld) -> dict[str, Any]:
    """The ``mcp.crosstalk`` entry ``crosstalk install`` writes, with this venv's interpreter
    (opencode runs ``env -i``: only absolute paths reach it)."""
    return {"crosstalk": {"type": "local", "command": [ow.python, "-m", "crosstalk", "mcp"],
                          "environment": {"CROSSTALK_HARNESS": "opencode"}, "enabled": True}}


def with_crosstalk(ow: OpencodeWorld) -> OpencodeWorld:
    """The world's opencode config with the real CrossTalk MCP server (no stand-ins)."""
    ow.write_config({"mcp": crosstalk_entry(ow)}, servers=())
    return ow


def oc_descriptors(world: World) -> list[dict[str, Any]]:
    return [d for d in world.descriptors() if d.get("harness") == "opencode"]


def oc_descriptor(world: World, session_id: str) -> dict[str, Any] | None:
    return next((d for d in oc_descriptors(world) if d.get("session_ref") == session_id), None)


def wait_oc_descriptor(world: World, session_id: str, timeout: float = 30.0) -> dict[str, Any]:
    found: dict[str, Any] = wait_for(lambda: oc_descriptor(world, session_id), timeout,
                                     step=0.1, what=f"the agent of opencode {session_id}")
    return found


def oc_requests(ow: OpencodeWorld, session_id: str, after: float = 0.0) -> list[Entry]:
    """The turn requests opencode's model got for ``session_id`` since ``after`` (epoch s)."""
    return [e for e in ow.entries() if e.get("kind") == "main"
            and e.get("session") == session_id and float(e.get("t") or 0) > after]


def wait_oc_request(ow: OpencodeWorld, session_id: str, text: str, after: float = 0.0,
                    timeout: float = 60.0) -> Entry:
    """The first turn request of ``session_id`` since ``after`` whose messages hold ``text``."""
    def found() -> Entry | None:
        return next((e for e in oc_requests(ow, session_id, after)
                     if text in request_text(e)), None)
    entry: Entry = wait_for(found, timeout, step=0.1,
                            what=f"opencode {session_id}'s model given {text!r}")
    return entry


def request_text(entry: Entry) -> str:
    """Every message of a chat request, as text (tool results included)."""
    body = entry.get("body")
    if not isinstance(body, dict):
        return ""
    return "\n".join(message_text(m) for m in messages(body))


def last_user_of(entry: Entry) -> str:
    body = entry.get("body")
    return message_text(last_user(body)) if isinstance(body, dict) else ""


def tool_result(entry: Entry, call_id: str) -> dict[str, Any] | None:
    """The JSON CrossTalk's tool answered the call ``call_id`` with, as opencode's model got
    it (a ``tool`` message; MCP text content)."""
    body = entry.get("body")
    for m in messages(body) if isinstance(body, dict) else []:
        if m.get("role") == "tool" and m.get("tool_call_id") == call_id:
            try:
                got = json.loads(message_text(m))
            except ValueError:
                return {"_text": message_text(m)}
            return got if isinstance(got, dict) else {"_value": got}
    return None


def first_session(ow: OpencodeWorld, tui: OpencodeTui, prompt: str,
                  timeout: float = 60.0) -> str:
    """Type ``prompt`` (the mock answers it with text) and return the session it created."""
    t0 = time.time()
    tui.type(prompt)

    def sid() -> str | None:
        return next((str(e["session"]) for e in ow.entries() if e.get("kind") == "main"
                     and e.get("session") and float(e.get("t") or 0) >= t0 - 1
                     and prompt in request_text(e)), None)
    got: str = wait_for(sid, timeout, step=0.1, what=f"{tui.name}: a session for {prompt!r}")
    return got


def wait_oc_idle(tui: OpencodeTui, session_id: str, timeout: float = 60.0) -> None:
    """Until ``GET /session/status`` lists ``session_id`` no more (idle ones are absent)."""
    api = tui.api()
    wait_for(lambda: session_id not in (api.get("/session/status") or {}), timeout,
             step=0.2, what=f"opencode {session_id} idle")


def oc_tool_call(ow: OpencodeWorld, match: str, tool: str, *, then: str | None = None,
                 session: str | None = None, **arguments: Any) -> str:
    """A mock rule: opencode's model answers a prompt holding ``match`` by calling
    CrossTalk's ``tool`` (``crosstalk_<tool>``), then says ``then``. Returns the rule id."""
    rule_id = f"oc-{match}"
    rule: dict[str, Any] = {"id": rule_id, "match": match,
                            "tool_call": {"name": f"crosstalk_{tool}", "arguments": arguments},
                            "then": {"text": then or f"called {tool}"}}
    if session is not None:
        rule["session"] = session
    ow.mock.add_rules(rule)
    return rule_id


def answered_call(ow: OpencodeWorld, rule_id: str, timeout: float = 60.0
                  ) -> tuple[Entry, dict[str, Any], Entry]:
    """The request ``rule_id`` answered with a tool call, CrossTalk's answer to it, and the
    request that carried the answer back to opencode's model."""
    asked: Entry = wait_for(lambda: next((e for e in ow.entries() if e.get("rule") == rule_id),
                                         None), timeout, step=0.1, what=f"rule {rule_id}")
    calls = (asked.get("response") or {}).get("tool_calls") or []
    call_id = calls[0]["id"]

    def back() -> tuple[Entry, dict[str, Any]] | None:
        for e in ow.entries():
            got = tool_result(e, call_id)
            if got is not None:
                return e, got
        return None
    entry, result = wait_for(back, timeout, step=0.1, what=f"the result of {rule_id}'s call")
    return asked, result, entry


def ready_pair(world: World, ow: OpencodeWorld) -> tuple[LiveClaude, dict[str, Any],
                                                        OpencodeTui, str, dict[str, Any]]:
    """A Claude session and an opencode TUI session, both agents, both idle."""
    alpha = world.session("alpha").start()
    tui = ow.tui("oc").start()
    sid = first_session(ow, tui, unique("HELLO"))
    oc = wait_oc_descriptor(world, sid)
    alpha.wait_named()
    alpha.wait_mcp_connected()
    alpha.wait_idle()
    wait_oc_idle(tui, sid)
    return alpha, alpha.wait_descriptor(), tui, sid, oc


def claude_does(world: World, alpha: LiveClaude, tool: str,
                **arguments: object) -> tuple[dict[str, Any], float]:
    """Claude's model calls CrossTalk's ``tool`` (a mock rule its user's prompt triggers);
    returns the JSON the call answered and when the prompt was typed (wall clock)."""
    trigger = unique("GO")
    world.mock.add_rules({"id": f"cl-{trigger}", "match": trigger,
                          "session": alpha.session_id,
                          "tool_use": {"name": f"mcp__crosstalk__{tool}", "input": arguments},
                          "then": {"text": f"called {tool}"}})
    after, typed = alpha.last_seq(), time.time()
    alpha.send_keys(f"{trigger} {tool}")
    entry = alpha.wait_for_request(lambda e: bool(tool_results(e)), timeout=60, after=after)
    (block,) = tool_results(entry)
    got: dict[str, Any] = json.loads(claude_text({"content": block.get("content")}))
    return got, typed
