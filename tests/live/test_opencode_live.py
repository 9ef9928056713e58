"""opencode sessions as CrossTalk agents, with the real opencode 1.18.33, Claude Code and Codex
(issue 14's live scenarios).

Every opencode process here runs CrossTalk's plugin and the real ``crosstalk mcp`` as its MCP
server, in the Claude world's namespace, HOME and CROSSTALK_HOME; the assertions are on what
each model received (the mocks' request logs).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from tests.live.conftest import Timings
from tests.live.support.claude import (
    World,
    is_main,
    last_user_text,
    wait_for,
)
from tests.live.support.codex import CodexWorld, output_json, request_text
from tests.live.support.extras import ENVELOPE, journal
from tests.live.support.opencode import OpencodeWorld, UnixHttp
from tests.live.support.opencode_steps import (
    answered_call,
    claude_does,
    first_session,
    last_user_of,
    oc_descriptor,
    oc_descriptors,
    oc_tool_call,
    ready_pair,
    wait_oc_descriptor,
    wait_oc_idle,
    wait_oc_request,
    with_crosstalk,
)
from tests.live.support.steps import model_calls, unique

pytestmark = pytest.mark.live


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
    result, sent = claude_does(world, alpha, "send_message", to=oc["name"], text=text)
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
    alpha, _, tui, sid, oc = ready_pair(world, ow)

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
    result, sent = claude_does(world, alpha, "send_message", to=oc["name"], text=text)
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


def test_a_message_a_loop_never_took_is_reported_when_the_user_aborts_the_loop(
        world: World, opencode_with_claude: OpencodeWorld, timings: Timings) -> None:
    """opencode is in a tool loop, its next step's model answer held back; Claude's message is
    stored (``accepted``); the user presses Esc before the loop takes it. The opencode agent
    journals an ``unanswered`` receipt (``opencode_aborted_before_answer``) for it, long
    after the send returned, and the message, still in the session, reaches the model with
    the user's next prompt."""
    ow = with_crosstalk(opencode_with_claude)
    alpha, _, tui, sid, oc = ready_pair(world, ow)
    match, gate = unique("LOOP"), unique("gate")
    ow.mock.add_rules({"id": "abort-loop", "match": match, "session": sid,
                       "tool_call": {"name": "crosstalk_list_agents", "arguments": {}},
                       "then": {"gate": gate, "gate_timeout_s": 60, "text": "never read"}})
    tui.type(match)
    answered_call(ow, "abort-loop")  # step 2's request is in flight, held by the gate
    text = unique("NEVER-TAKEN")
    result, _ = claude_does(world, alpha, "send_message", to=oc["name"], text=text)
    assert result.get("state") == "accepted", result
    mid = str(result["message_id"])
    time.sleep(1.5)  # well past the injector's grace: only the follow-up can tell now
    pressed = time.monotonic()
    for _ in range(2):  # Esc, Esc: opencode's interrupt
        tui.tmux("send-keys", "-t", "oc", "Escape")
        time.sleep(0.3)

    def receipt() -> dict[str, Any] | None:
        return next((r for r in journal(world, oc["agent_id"])
                     if r.get("subject") == "receipt" and r.get("id") == mid), None)

    got = wait_for(receipt, 30, what="the opencode agent's receipt for the aborted message")
    timings.add("Esc -> unanswered receipt journaled", time.monotonic() - pressed)
    assert (got["status"], got["reason"]) == ("unanswered", "opencode_aborted_before_answer")
    ow.mock.open_gate(gate)
    assert not any(text in json.dumps(e.get("body")) for e in ow.entries()), \
        "the aborted loop read the message after all"
    wait_oc_idle(tui, sid)
    typed = time.time()
    tui.type(unique("NEXT"))
    carried = wait_oc_request(ow, sid, text, after=typed)
    timings.add("next prompt -> model request carrying it", carried["t"] - typed)


def test_next_turn_into_opencode_does_not_wake_it_and_its_next_turn_carries_it(
        world: World, opencode_with_claude: OpencodeWorld, timings: Timings) -> None:
    """``delivery=next_turn`` stores the message without a model call (``queued``); the
    session's model sees it first in the turn its user starts next."""
    ow = with_crosstalk(opencode_with_claude)
    alpha, _, tui, sid, oc = ready_pair(world, ow)

    text = unique("NEXT-TURN")
    result, sent = claude_does(world, alpha, "send_message", to=oc["name"], text=text,
                               delivery="next_turn")
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


#: The id of an ask in the envelope opencode's model gets (``render_peer``).
OC_ASK_ID = r'message-id="([^"]+)" from="[^"]+" kind="ask"'
#: ... and in the one Claude's model gets.
CLAUDE_ASK_ID = r"message-id=(\S+) kind=ask"


def test_ask_and_reply_between_opencode_and_claude_both_ways(
        world: World, opencode_with_claude: OpencodeWorld, timings: Timings) -> None:
    """Claude asks opencode, whose model answers with ``crosstalk_reply``: Claude's model gets
    the answer in reply to its ask. Then opencode asks Claude, Claude's model replies, and
    opencode's model gets the answer."""
    ow = with_crosstalk(opencode_with_claude)
    alpha, a_desc, tui, sid, oc = ready_pair(world, ow)

    question, answer = unique("Q-FROM-CLAUDE"), unique("A-FROM-OPENCODE")
    ow.mock.add_rules({"id": "oc-replies", "match": question, "session": sid,
                       "capture": {"mid": OC_ASK_ID},
                       "tool_call": {"name": "crosstalk_reply",
                                     "arguments": {"message_id": "{{mid}}", "text": answer}},
                       "then": {"text": "replied"}})
    asked, sent = claude_does(world, alpha, "ask", to=oc["name"], text=question)
    assert asked.get("state") == "accepted", asked
    got = wait_oc_request(ow, sid, question, after=sent)
    assert 'kind="ask"' in last_user_of(got)
    assert "crosstalk_reply" in json.dumps(got["body"])  # the synthetic hint says how
    _, replied, _ = answered_call(ow, "oc-replies")
    assert replied.get("state") == "accepted", replied
    at_a = alpha.wait_for_request(lambda e: is_main(e) and answer in last_user_text(e),
                                  timeout=30)
    timings.add("claude ask -> claude model gets opencode's reply", at_a["t"] - sent)
    assert f"in-reply-to={asked['message_id']}" in last_user_text(at_a)

    question2, answer2 = unique("Q-FROM-OPENCODE"), unique("A-FROM-CLAUDE")
    world.mock.add_rules({"id": "cl-replies", "match": question2, "session": alpha.session_id,
                          "capture": {"mid": CLAUDE_ASK_ID},
                          "tool_use": {"name": "mcp__crosstalk__reply",
                                       "input": {"message_id": "{{mid}}", "text": answer2}},
                          "then": {"text": "replied"}})
    go = unique("OCASK")
    rule = oc_tool_call(ow, go, "ask", to=a_desc["name"], text=question2, session=sid)
    typed = time.time()
    tui.type(go)
    _, oc_asked, _ = answered_call(ow, rule)
    assert oc_asked.get("state") == "accepted", oc_asked
    back = wait_oc_request(ow, sid, answer2, after=typed)
    timings.add("opencode ask -> opencode model gets claude's reply", back["t"] - typed)
    assert f'in-reply-to="{oc_asked["message_id"]}"' in last_user_of(back)


def test_opencode_claude_and_codex_list_each_other_and_opencode_sends_to_codex(
        world: World, codex_with_claude: CodexWorld, opencode_with_claude: OpencodeWorld,
        timings: Timings) -> None:
    """Codex's ``send_message`` to the opencode session by name wakes it; the opencode session
    is listed ``crosstalk: true`` by Claude's and Codex's ``list_agents`` and lists both; its
    ``send_message`` to the Codex thread by name wakes the thread with the text."""
    cw, ow = codex_with_claude, with_crosstalk(opencode_with_claude)
    alpha, a_desc, tui, sid, oc = ready_pair(world, ow)
    cx = cw.thread("cx")
    hello = unique("CODEX-TO-OPENCODE")
    asked, output, _ = model_calls(cw, cx, "send_message", to=oc["name"], text=hello)
    assert output_json(output).get("state") == "accepted", output
    cx_desc = cx.wait_descriptor()  # the call registered the thread
    got = wait_oc_request(ow, sid, hello, after=float(asked["t"]))
    timings.add("codex function_call -> opencode model request", got["t"] - asked["t"])
    assert cx_desc["name"] in last_user_of(got)
    wait_oc_idle(tui, sid)
    _, listed_cx, _ = model_calls(cw, cx, "list_agents")
    by_name = {a["name"]: a for a in output_json(listed_cx)["agents"]}
    assert by_name[oc["name"]]["crosstalk"] is True, by_name[oc["name"]]
    assert by_name[oc["name"]]["harness"] == "opencode"

    done, _ = claude_does(world, alpha, "list_agents")
    listed_a = {a["name"]: a for a in done["agents"]}
    assert listed_a[oc["name"]]["crosstalk"] is True, listed_a[oc["name"]]

    go = unique("OCLIST")
    rule = oc_tool_call(ow, go, "list_agents", session=sid)
    tui.type(go)
    _, listed_oc, _ = answered_call(ow, rule)
    names = {a["name"]: a for a in listed_oc["agents"]}
    assert names[a_desc["name"]]["crosstalk"] is True
    assert names[cx_desc["name"]]["crosstalk"] is True

    text, go = unique("OPENCODE-TO-CODEX"), unique("OCSEND")
    rule = oc_tool_call(ow, go, "send_message", to=cx_desc["name"], text=text, session=sid)
    tui.type(go)
    asked, sent, _ = answered_call(ow, rule)
    assert sent.get("state") == "accepted", sent
    got = cx.wait_for_request(lambda e: e.get("kind") == "main" and text in request_text(e),
                              timeout=30)
    timings.add("opencode tool call -> codex model request", got["t"] - asked["t"])
    assert oc["name"] in request_text(got)


def prompt(api: UnixHttp, session_id: str, text: str) -> None:
    """A user turn of ``session_id`` through opencode's own API (as ``opencode attach`` or a
    web client would start one)."""
    status, body = api.request("POST", f"/session/{session_id}/prompt_async",
                               {"parts": [{"type": "text", "text": text}]})
    assert status == 204, (status, body)


def test_two_sessions_of_one_serve_are_bound_each_by_its_own_id(
        world: World, opencode_with_claude: OpencodeWorld, timings: Timings) -> None:
    """One ``opencode serve``, one shim, two sessions: each is its own agent, and each one's
    ``send_message`` reaches Claude under its own name. A shim that opencode did not start,
    with opencode's environment and a stamp naming one of those sessions, binds nothing."""
    ow = with_crosstalk(opencode_with_claude)
    alpha = world.session("alpha").start()
    srv = ow.serve("srv").start()
    api = srv.api()
    sids = []
    for title in ("first", "second"):
        status, made = api.request("POST", "/session", {"title": unique(title)})
        assert status == 200, (status, made)
        sids.append(made["id"])
    t0 = time.monotonic()
    for sid in sids:
        prompt(api, sid, unique("HELLO"))  # starts the instance's MCP server too
    descs = [wait_oc_descriptor(world, sid, timeout=60) for sid in sids]
    timings.add("two serve sessions -> agents", time.monotonic() - t0)
    assert len({d["pid"] for d in descs}) == 1  # one shim serves both
    assert len({d["name"] for d in descs}) == 2
    alpha.wait_named()
    alpha.wait_mcp_connected()
    alpha.wait_idle()
    a_desc = alpha.wait_descriptor()
    for sid in sids:
        wait_for(lambda sid=sid: sid not in (api.get("/session/status") or {}), 60,
                 what=f"{sid} idle")

    texts = {}
    for sid in sids:
        texts[sid] = unique("FROM-SERVE")
        go = unique("SRVGO")
        oc_tool_call(ow, go, "send_message", to=a_desc["name"], text=texts[sid], session=sid)
        prompt(api, sid, go)
    for sid, desc in zip(sids, descs, strict=True):
        entry = alpha.wait_for_request(
            lambda e, sid=sid: is_main(e) and texts[sid] in last_user_text(e), timeout=60)
        envelope = [m for m in ENVELOPE.finditer(last_user_text(entry))
                    if texts[sid] in m["body"]]
        assert envelope, last_user_text(entry)[:800]
        assert envelope[0]["name"] == desc["name"]

    # The forged stamp: opencode's environment, the instance's directory, the pid of the
    # opencode that hosts the sessions -- but the shim's parent is this test.
    forged = asyncio.run(forged_call(world, srv.pid or 0, Path(descs[0]["cwd"]), sids[0],
                                     a_desc["name"]))
    assert forged.get("error") == "unbound", forged
    assert len(oc_descriptors(world)) == 2


async def forged_call(world: World, opencode_pid: int, cwd: Path, session_id: str,
                      to: str) -> dict[str, Any]:
    env = {**world.env, "OPENCODE": "1", "OPENCODE_PID": str(opencode_pid),
           "CROSSTALK_HARNESS": "opencode"}
    params = StdioServerParameters(command=sys.executable, args=["-m", "crosstalk", "mcp"],
                                   env=env, cwd=str(cwd))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        got = await session.call_tool("send_message", {
            "to": to, "text": unique("FORGED"),
            "_opencode": {"sessionID": session_id, "callID": "call_forged"}})
    text = got.content[0].text  # type: ignore[union-attr]
    out: dict[str, Any] = json.loads(text)
    return out


def test_exit_removes_the_agent_and_kill_9_leaves_nothing_listed_live(
        world: World, opencode_with_claude: OpencodeWorld, timings: Timings) -> None:
    """``/exit`` of a TUI removes its plugin record and its sessions' descriptors; after a
    ``kill -9`` of another, ``crosstalk agents`` lists none of its sessions live."""
    ow = with_crosstalk(opencode_with_claude)
    one, two = ow.tui("one").start(), ow.tui("two").start()
    sid1 = first_session(ow, one, unique("HELLO"))
    sid2 = first_session(ow, two, unique("HELLO"))
    d1, d2 = wait_oc_descriptor(world, sid1), wait_oc_descriptor(world, sid2)

    t0 = time.monotonic()
    one.exit()
    wait_for(lambda: oc_descriptor(world, sid1) is None, 30, what="the descriptor removed")
    timings.add("/exit -> descriptor gone", time.monotonic() - t0)
    assert ow.record_for(one.pid or 0) is None
    assert not Path(d1["uds_path"]).exists()

    two.kill9()
    t1 = time.monotonic()

    def listed_live() -> list[dict[str, Any]]:
        done = world.crosstalk("agents", "--json")
        assert done.returncode == 0, done.stderr
        ids = (d1["agent_id"], d2["agent_id"])
        return [a for a in json.loads(done.stdout) if a["agent_id"] in ids and a["reachable"]]
    wait_for(lambda: listed_live() == [], 30, what="no live listing of the killed sessions")
    timings.add("kill -9 -> not listed live", time.monotonic() - t1)
    assert ow.record_for(two.pid or 0) is not None  # left stale by the kill: ignored


def test_crosstalk_install_registers_tui_sessions_and_uninstall_restores_the_config(
        world: World, opencode_with_claude: OpencodeWorld, timings: Timings) -> None:
    """``crosstalk install`` (the CLI, as a user runs it) writes the MCP entry into the user's
    opencode config and places the plugin: a TUI started after it has its session registered
    before any tool call, listed ``crosstalk: true`` by Claude. ``crosstalk uninstall`` then
    leaves the user's opencode config byte for byte as it was, and removes the plugin."""
    ow = opencode_with_claude
    ow.write_config(servers=())  # the user's own config: the provider, no CrossTalk
    config = ow.config_dir / "opencode.json"
    plugin = ow.config_dir / "plugin" / "crosstalk.js"
    plugin.unlink()  # the rig's copy: install must place its own
    before = config.read_bytes()
    alpha = world.session("alpha").start()  # before install: its --mcp-config only

    t0 = time.monotonic()
    done = world.crosstalk("install")
    assert done.returncode == 0, (done.stdout, done.stderr)
    timings.add("crosstalk install", time.monotonic() - t0)
    entry = json.loads(config.read_text())["mcp"]["crosstalk"]
    assert entry["type"] == "local"
    assert entry["command"][-1] == "mcp"
    assert entry["environment"] == {"CROSSTALK_HARNESS": "opencode"}
    assert plugin.is_file()

    tui = ow.tui("oc").start()
    sid = first_session(ow, tui, unique("HELLO"))
    oc = wait_oc_descriptor(world, sid)
    assert not [c for c in ow.mcp_calls() if c.get("server") == "crosstalk"]  # no tool call
    alpha.wait_named()
    alpha.wait_mcp_connected()
    alpha.wait_idle()
    done, _ = claude_does(world, alpha, "list_agents")
    listed = {a["name"]: a for a in done["agents"]}
    assert listed[oc["name"]]["crosstalk"] is True, listed[oc["name"]]
    assert listed[oc["name"]]["harness"] == "opencode"

    tui.exit()
    done = world.crosstalk("uninstall")
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert config.read_bytes() == before
    assert not plugin.exists()


def test_an_opencode_without_crosstalks_entry_is_listed_and_gets_informs_natively(
        world: World, opencode_with_claude: OpencodeWorld, timings: Timings) -> None:
    """A TUI that has the plugin but not CrossTalk's MCP entry: its session is listed
    ``crosstalk: false`` by Claude, and Claude's ``send_message`` to it by name is put in by
    Claude's own shim (through the plugin's socket): its model gets the envelope."""
    ow = opencode_with_claude
    ow.write_config(servers=())  # the plugin, no MCP entry
    alpha = world.session("alpha").start()
    tui = ow.tui("bare").start()
    sid = first_session(ow, tui, unique("HELLO"))
    alpha.wait_named()
    alpha.wait_mcp_connected()
    alpha.wait_idle()
    wait_oc_idle(tui, sid)

    done, _ = claude_does(world, alpha, "list_agents")
    rows = [a for a in done["agents"] if a["harness"] == "opencode"]
    assert len(rows) == 1, rows
    (row,) = rows
    assert row["crosstalk"] is False, row
    assert oc_descriptors(world) == []

    text = unique("INFORM-TO-BARE")
    result, sent = claude_does(world, alpha, "send_message", to=row["name"], text=text)
    assert result.get("state") == "accepted", result
    got = wait_oc_request(ow, sid, text, after=sent)
    timings.add("claude send -> opencode (no CrossTalk) model request", got["t"] - sent)
    assert alpha.wait_descriptor()["name"] in last_user_of(got)
