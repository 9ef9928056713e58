"""Scenario steps the live test modules share (a test module never imports another)."""

from __future__ import annotations

import uuid
from typing import Any

from tests.live.support.claude import LiveClaude
from tests.live.support.codex import (
    NAMESPACE,
    CodexThread,
    CodexWorld,
    call_output,
    function_calls,
)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def call(name: str, **arguments: Any) -> dict[str, Any]:
    """A function_call of CrossTalk's tool ``name``, as the model must emit it for Codex."""
    return {"namespace": NAMESPACE, "name": name, "arguments": arguments}


def script_call(cw: CodexWorld, thread: CodexThread, tool: str, **arguments: Any
                ) -> tuple[str, str]:
    """A mock rule: the model of ``thread`` answers a prompt carrying the returned trigger by
    calling CrossTalk's ``tool``, then says ``called <tool>``. Returns (trigger, rule id)."""
    trigger, rule = unique("GO"), unique("rule")
    cw.mock.add_rules({"id": rule, "match": trigger, "thread": thread.id,
                       "function_call": call(tool, **arguments),
                       "then": {"text": f"called {tool}"}})
    return trigger, rule


def call_and_output(thread: CodexThread, rule: str, after: int
                    ) -> tuple[dict[str, Any], dict[str, Any], float]:
    """The request the mock answered with ``rule``'s call, the function_call_output the model
    got back, and the seconds between the two requests."""
    asked = thread.wait_for_request(lambda e: e.get("rule") == rule, after=after)
    (fc,) = function_calls(asked)
    answered = thread.wait_for_request(lambda e: call_output(e, fc["call_id"]) is not None,
                                       after=asked["seq"])
    output = call_output(answered, fc["call_id"])
    assert output is not None
    return asked, output, answered["t"] - asked["t"]


def model_calls(cw: CodexWorld, thread: CodexThread, tool: str, timeout: float = 60.0,
                **arguments: Any) -> tuple[dict[str, Any], dict[str, Any], float]:
    """Make ``thread``'s model call CrossTalk's ``tool`` in a new turn (``turn/start``); see
    :func:`call_and_output` for what comes back."""
    trigger, rule = script_call(cw, thread, tool, **arguments)
    after = cw.last_seq()
    turn = thread.run_turn(f"{trigger}: call {tool}", timeout=timeout)
    assert turn["status"] == "completed", turn
    return call_and_output(thread, rule, after)


def start_all(*sessions: LiveClaude) -> None:
    for claude in sessions:
        claude.start()
    for claude in sessions:
        claude.wait_named()  # so the name a test sends to is the one it keeps
        claude.wait_mcp_connected()

