"""A fast model for the live scenarios: it answers a peer message the moment it sees it.

The mock answers the request that carries the peer message with a ``receive_message`` call at
once (no delay, no gate), and the request carrying that result with a ``reply`` to the id the
message named: the model's tool calls reach CrossTalk within milliseconds of the model being
shown the message, while CrossTalk may still be delivering it (Claude: the receipt grace after
its inbox read the frame; Codex: the ``turn/start`` answer). Rules for Claude's mock
(:mod:`tests.live.support.mock_api`) and Codex's (:mod:`tests.live.support.mock_responses`).
"""

from __future__ import annotations

import json
from typing import Any

from tests.live.support.claude import Entry, LiveClaude, tool_results
from tests.live.support.mock_api import message_text
from tests.live.support.steps import call

#: The message id in CrossTalk's first body line of a Claude envelope.
CLAUDE_MESSAGE_ID = r"\[crosstalk message-id=(\S+) kind="
#: The message id in the ``<peer-message>`` envelope CrossTalk gives Codex.
CODEX_MESSAGE_ID = r'<peer-message [^>]*message-id="([^"]+)"'


def claude_fast_model(session_id: str, text: str, answer: str, prefix: str) -> dict[str, Any]:
    """Rule ids ``<prefix>-receive`` (the request carrying the message, answered with
    receive_message), ``<prefix>-reply`` (the one carrying its result, answered with reply)
    and ``<prefix>-done``."""
    return {"id": f"{prefix}-receive", "match": text, "session": session_id,
            "capture": {"mid": CLAUDE_MESSAGE_ID},
            "tool_use": {"name": "mcp__crosstalk__receive_message", "input": {}},
            "then": {"id": f"{prefix}-reply",
                     "tool_use": {"name": "mcp__crosstalk__reply",
                                  "input": {"message_id": "{{mid}}", "text": answer}},
                     "then": {"id": f"{prefix}-done", "text": "answered"}}}


def codex_fast_model(thread_id: str, text: str, answer: str, prefix: str) -> dict[str, Any]:
    """:func:`claude_fast_model` for a Codex thread (function calls in the namespace)."""
    return {"id": f"{prefix}-receive", "match": text, "thread": thread_id,
            "capture": {"mid": CODEX_MESSAGE_ID},
            "function_call": call("receive_message"),
            "then": {"id": f"{prefix}-reply",
                     "function_call": call("reply", message_id="{{mid}}", text=answer),
                     "then": {"id": f"{prefix}-done", "text": "answered"}}}


def claude_step(claude: LiveClaude, rule_id: str, timeout: float = 30.0) -> Entry:
    """The request of ``claude`` that rule ``rule_id`` answered (the model's move)."""
    return claude.wait_for_request(lambda e: e.get("rule") == rule_id, timeout=timeout)


def claude_tool_json(claude: LiveClaude, answered: Entry, timeout: float = 30.0
                     ) -> tuple[Entry, dict[str, Any]]:
    """The request carrying the result of the one tool_use ``answered`` was answered with,
    and that result as the model saw it (a CrossTalk tool's JSON)."""
    (use,) = [b for b in answered["response"] if b["type"] == "tool_use"]

    def results(e: Entry) -> list[dict[str, Any]]:
        return [b for b in tool_results(e) if b.get("tool_use_id") == use["id"]]

    entry = claude.wait_for_request(lambda e: bool(results(e)), timeout=timeout,
                                    after=answered["seq"])
    (block,) = results(entry)
    data = json.loads(message_text({"content": block.get("content")}))
    assert isinstance(data, dict), data
    return entry, data


def listed(mailbox: dict[str, Any], message_id: str) -> dict[str, Any]:
    """The one ``receive_message`` entry of ``message_id``."""
    found = [e for e in mailbox.get("entries", []) if e.get("message_id") == message_id]
    assert len(found) == 1, mailbox
    return found[0]
