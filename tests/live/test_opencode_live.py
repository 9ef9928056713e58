"""opencode sessions as CrossTalk agents, with the real opencode 1.18.33, Claude Code and Codex
(issue 14's live scenarios).

Every opencode process here runs CrossTalk's plugin and the real ``crosstalk mcp`` as its MCP
server, in the Claude world's namespace, HOME and CROSSTALK_HOME; the assertions are on what
each model received (the mocks' request logs).
"""

from __future__ import annotations

import json
import time

import pytest

from tests.live.conftest import Timings
from tests.live.support.claude import LiveClaude, World, is_main, last_user_text, tool_results
from tests.live.support.mock_api import message_text
from tests.live.support.opencode import OpencodeWorld
from tests.live.support.opencode_steps import (
    answered_call,
    first_session,
    last_user_of,
    oc_tool_call,
    wait_oc_descriptor,
    wait_oc_idle,
    wait_oc_request,
    with_crosstalk,
)
from tests.live.support.steps import unique

pytestmark = pytest.mark.live


def claude_calls(world: World, session_id: str, tool: str, **arguments: object) -> str:
    """A mock rule: Claude's model answers the returned trigger by calling CrossTalk's
    ``tool``, then says it did. Returns the trigger."""
    trigger = unique("GO")
    world.mock.add_rules({"id": f"cl-{trigger}", "match": trigger, "session": session_id,
                          "tool_use": {"name": f"mcp__crosstalk__{tool}", "input": arguments},
                          "then": {"text": f"called {tool}"}})
    return trigger


def claude_result(alpha: LiveClaude, after: int) -> dict[str, object]:
    """The JSON the last CrossTalk call of ``alpha`` answered (its tool_result)."""
    entry = alpha.wait_for_request(lambda e: bool(tool_results(e)), timeout=60, after=after)
    (block,) = tool_results(entry)
    got: dict[str, object] = json.loads(message_text({"content": block.get("content")}))
    return got


def test_claude_wakes_an_idle_opencode_tui_session_and_opencode_answers_by_name(
        world: World, opencode_with_claude: OpencodeWorld, timings: Timings) -> None:
    """A TUI session is an agent once it exists, before its model calls a tool. Claude's
    ``send_message`` to it by name wakes it (its model gets the envelope as the text of a
    new turn), and opencode's model sends back to Claude by name."""
    ow = with_crosstalk(opencode_with_claude)
    t0 = time.monotonic()
    alpha = world.session("alpha").start()
    tui = ow.tui("oc").start()
    sid = first_session(ow, tui, unique("HELLO"))
    oc = wait_oc_descriptor(world, sid)
    timings.add("opencode session -> agent (no tool call)", time.monotonic() - t0)
    assert oc["harness_pid"] == tui.pid
    alpha.wait_named()
    alpha.wait_mcp_connected()
    alpha.wait_idle()
    a_desc = alpha.wait_descriptor()
    wait_oc_idle(tui, sid)

    text = unique("CLAUDE-TO-OPENCODE")
    trigger = claude_calls(world, alpha.session_id, "send_message", to=oc["name"], text=text)
    after, sent = alpha.last_seq(), time.time()
    alpha.send_keys(f"{trigger} tell oc")
    result = claude_result(alpha, after)
    assert result.get("state") == "accepted", result
    got = wait_oc_request(ow, sid, text, after=sent)
    timings.add("claude send -> opencode model request (idle: woken)", got["t"] - sent)
    user = last_user_of(got)
    assert text in user, user[:600]
    assert str(result["message_id"]) in user
    assert a_desc["name"] in user

    back = unique("OPENCODE-TO-CLAUDE")
    rule = oc_tool_call(ow, unique("OCGO"), "send_message", to=a_desc["name"], text=back,
                        session=sid)
    tui.type(rule.removeprefix("oc-"))
    asked, answer, _ = answered_call(ow, rule)
    assert answer.get("state") == "accepted", answer
    entry = alpha.wait_for_request(lambda e: is_main(e) and back in last_user_text(e),
                                   timeout=30)
    timings.add("opencode tool call -> claude model request", entry["t"] - asked["t"])
    assert oc["name"] in last_user_text(entry)


def test_a_busy_opencode_session_gets_claudes_message_at_its_next_step(
        world: World, opencode_with_claude: OpencodeWorld, timings: Timings) -> None:
    """opencode is in a tool loop, its model's next answer held back by the mock: Claude's
    message is accepted (stored), and the loop's next model request — the same turn, no
    prompt typed — carries it after the tool's result."""
    ow = with_crosstalk(opencode_with_claude)
    alpha = world.session("alpha").start()
    tui = ow.tui("oc").start()
    sid = first_session(ow, tui, unique("HELLO"))
    oc = wait_oc_descriptor(world, sid)
    alpha.wait_named()
    alpha.wait_mcp_connected()
    alpha.wait_idle()
    wait_oc_idle(tui, sid)

    # Step 1: a tool call; step 2 (the answer to its result) waits on a gate.
    match, gate = unique("LOOP"), unique("gate")
    ow.mock.add_rules({"id": "loop", "match": match, "session": sid,
                       "tool_call": {"name": "crosstalk_list_agents", "arguments": {}},
                       "then": {"gate": gate, "gate_timeout_s": 90,
                                "tool_call": {"name": "crosstalk_list_agents",
                                              "arguments": {}},
                                "then": {"text": "loop done"}}})
    tui.type(match)
    asked, _, held = answered_call(ow, "loop")  # the request step 2 answers (held)
    text = unique("MID-LOOP")
    trigger = claude_calls(world, alpha.session_id, "send_message", to=oc["name"], text=text)
    after, sent = alpha.last_seq(), time.time()
    alpha.send_keys(f"{trigger} tell oc")
    result = claude_result(alpha, after)
    assert result.get("state") == "accepted", result
    timings.add("claude send -> accepted while opencode is busy", time.time() - sent)
    assert not any(text in json.dumps(e.get("body")) for e in ow.entries()), \
        "the message reached the model before the loop's next step"
    opened = time.time()
    ow.mock.open_gate(gate)
    got = wait_oc_request(ow, sid, text, after=float(held["t"]))
    timings.add("gate opened -> the next step carries it", got["t"] - opened)
    body = got["body"]
    roles = [m.get("role") for m in body["messages"]]
    # ... assistant(tool call) tool(result) assistant(tool call) tool(result) user(ours)
    assert roles[-1] == "user", roles
    assert roles[-2] == "tool", roles
    assert text in last_user_of(got)
    assert not any(match in str(m.get("content")) for m in body["messages"][-3:])
    assert all(e.get("session") == sid for e in ow.entries()
               if e.get("kind") == "main" and float(e["t"]) >= float(asked["t"]))


def test_next_turn_into_opencode_does_not_wake_it_and_its_next_turn_carries_it(
        world: World, opencode_with_claude: OpencodeWorld, timings: Timings) -> None:
    """``delivery=next_turn`` stores the message without a model call (``queued``); the
    session's model sees it first in the turn its user starts next."""
    ow = with_crosstalk(opencode_with_claude)
    alpha = world.session("alpha").start()
    tui = ow.tui("oc").start()
    sid = first_session(ow, tui, unique("HELLO"))
    oc = wait_oc_descriptor(world, sid)
    alpha.wait_named()
    alpha.wait_mcp_connected()
    alpha.wait_idle()
    wait_oc_idle(tui, sid)

    text = unique("NEXT-TURN")
    trigger = claude_calls(world, alpha.session_id, "send_message", to=oc["name"], text=text,
                           delivery="next_turn")
    after, sent = alpha.last_seq(), time.time()
    alpha.send_keys(f"{trigger} tell oc later")
    result = claude_result(alpha, after)
    assert result.get("state") == "queued", result
    timings.add("claude next_turn send -> queued", time.time() - sent)
    time.sleep(3)  # a woken session would have asked its model by now
    assert not [e for e in ow.entries() if e.get("session") == sid
                and float(e["t"]) > sent], "next_turn woke the session"
    prompt = unique("USER-TURN")
    typed = time.time()
    tui.type(prompt)
    got = wait_oc_request(ow, sid, prompt, after=typed)
    assert text in json.dumps(got["body"]), "the next turn does not carry the message"
    assert str(result["message_id"]) in json.dumps(got["body"])
