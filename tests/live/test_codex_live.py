"""CrossTalk with the real OpenAI Codex 0.169.0 binary (app-server over its control socket,
loopback-only network namespace, mock Responses API).

Each thread is started by the test through ``codex app-server --listen unix://``, and its
model is our mock. A test asserts on what the *model* got back: the ``function_call_output``
in the thread's next request to the mock, after the mock made the model call a CrossTalk tool
in the ``mcp__crosstalk`` namespace. Codex runs one ``crosstalk mcp`` per loaded thread, and
the shim learns which thread called from ``_meta.threadId``.

A Codex thread becomes a CrossTalk agent on its first tool call (by ``_meta.threadId``); a
message to it from a verified peer starts (or joins) a turn through the app-server that has
the thread loaded.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.live.conftest import Timings
from tests.live.support.claude import (
    World,
    alive,
    descendants,
    is_main,
    last_user_text,
    tool_results,
    wait_for,
)
from tests.live.support.codex import (
    CodexThread,
    CodexWorld,
    message_texts,
    namespace_tools,
    output_json,
    request_text,
)
from tests.live.support.extras import ENVELOPE
from tests.live.support.mock_api import message_text
from tests.live.support.mock_responses import TITLE
from tests.live.support.steps import call_and_output, model_calls, script_call, unique

pytestmark = pytest.mark.live

TOOLS = {"list_agents", "send_message", "ask", "reply", "receive_message", "claim", "release"}
SEND_STATES = {"accepted", "queued", "unreachable"}


def test_thread_calls_list_agents(codex_world: CodexWorld, timings: Timings) -> None:
    """(a) A thread started through the app-server offers CrossTalk's tools to its model in the
    ``mcp__crosstalk`` namespace; the model's ``list_agents`` call comes back as JSON with an
    ``agents`` list; the requests carry the thread's id."""
    t0 = time.monotonic()
    server = codex_world.server
    timings.add("codex app-server start -> control socket", time.monotonic() - t0)
    t1 = time.monotonic()
    alpha = codex_world.thread("alpha")
    timings.add("thread/start -> crosstalk MCP server ready", time.monotonic() - t1)
    assert alpha.id in codex_world.loaded()
    assert alpha.read()["status"]["type"] == "idle"
    assert len(server.shim_pids()) == 1

    t2 = time.monotonic()
    asked, output, took = model_calls(codex_world, alpha, "list_agents")
    timings.add("turn/start -> turn/completed (one list_agents call)", time.monotonic() - t2)
    timings.add("model's function_call -> request carrying its output", took)
    result = output_json(output)
    assert isinstance(result.get("agents"), list), result

    # What Codex sends: the turn request offers the namespace tool, and every request names
    # its thread (header and prompt_cache_key) and turn.
    assert set(namespace_tools(asked)) >= TOOLS, asked["body"]["tools"]
    headers = {k.lower(): v for k, v in asked["headers"].items()}
    assert headers["thread-id"] == alpha.id
    assert headers["session-id"] == alpha.id
    assert asked["path"] == "/v1/responses"
    assert asked["body"]["prompt_cache_key"] == alpha.id
    assert json.loads(headers["x-codex-turn-metadata"])["thread_id"] == alpha.id
    # The thread can be named through the app-server (what a Codex TUI user sees).
    alpha.set_name("crosstalk-alpha")
    assert alpha.read()["name"] == "crosstalk-alpha"


def test_send_to_unknown_name_registers_thread(codex_world: CodexWorld,
                                               timings: Timings) -> None:
    """(b) ``send_message`` to a name nobody has: ``no_such_agent``. The call made the thread
    a CrossTalk agent: a descriptor with ``harness: codex`` and ``session_ref`` = the thread id
    (the shim binds a Codex thread by ``_meta.threadId`` on its first tools/call)."""
    beta = codex_world.thread("beta")
    assert beta.descriptor() is None
    nobody = unique("nobody")
    _, output, took = model_calls(codex_world, beta, "send_message", to=nobody,
                                  text=unique("LOST"))
    timings.add("send_message (unknown name): call -> output", took)
    result = output_json(output)
    assert result.get("reason") == "no_such_agent", result
    assert "message_id" not in result, result

    # Written before the call answered (registration comes first), so it is there already.
    desc = beta.descriptor()
    assert desc is not None, beta.world.descriptors()
    assert desc["harness"] == "codex"
    assert desc["session_ref"] == beta.id
    assert desc["cwd"] == str(beta.cwd)
    # Served by this thread's own shim, a child of the app-server.
    assert desc["pid"] in codex_world.server.shim_pids()


def test_app_server_stop_unpublishes_threads(codex_world: CodexWorld,
                                             timings: Timings) -> None:
    """When the app-server stops, its threads' shims go with it and nobody can address the
    threads any more. Codex sends each MCP server SIGTERM and SIGKILL a few ms later, so a
    shim may die before it unlinks its descriptor; here one is made to lose that race for sure
    (SIGSTOPped first), and its left-over descriptor must count as dead."""
    gamma, delta = codex_world.thread("gamma"), codex_world.thread("delta")
    for thread in (gamma, delta):
        model_calls(codex_world, thread, "receive_message")
    g_desc, d_desc = gamma.wait_descriptor(), delta.wait_descriptor()
    shims = codex_world.server.shim_pids()
    assert {g_desc["pid"], d_desc["pid"]} == set(shims)

    os.kill(d_desc["pid"], signal.SIGSTOP)  # delta's shim cannot clean up
    t0 = time.monotonic()
    assert codex_world.server.stop() == []
    timings.add("app-server SIGTERM -> it and its shims gone", time.monotonic() - t0)
    assert not any(alive(p) for p in shims)
    # Orphaned by the app-server, the killed shims stay zombies until PID 1 reaps them (~2 s
    # in this VM), and CrossTalk counts a zombie's pid as live: wait until they are reaped.
    wait_for(lambda: not any(Path(f"/proc/{p}").exists() for p in shims), 15,
             what="killed shims reaped")
    timings.add("app-server SIGTERM -> its shims reaped", time.monotonic() - t0)
    assert delta.descriptor() is not None  # left behind by the SIGKILLed shim
    print(f"[codex] descriptor left by a shim that could run its SIGTERM handler: "
          f"{gamma.descriptor() is not None}")

    for desc in (g_desc, d_desc):
        done = codex_world.crosstalk("send", "--json", desc["name"], unique("TO-THE-DEAD"))
        assert done.returncode != 0, done.stdout
        assert "no live agent" in done.stderr or "no_such_agent" in done.stdout, \
            (done.stdout, done.stderr)


def _two_registered_threads(cw: CodexWorld) -> tuple[CodexThread, CodexThread,
                                                      dict[str, Any], dict[str, Any]]:
    """Threads X and Y on one app-server, each made a CrossTalk agent by one tool call."""
    x, y = cw.thread("xray"), cw.thread("yank")
    for thread in (x, y):
        _, output, _ = model_calls(cw, thread, "receive_message")
        result = output_json(output)
        assert isinstance(result.get("entries"), list), result
    return x, y, x.wait_descriptor(), y.wait_descriptor()


def test_two_threads_one_app_server(codex_world: CodexWorld, timings: Timings) -> None:
    """(c) Two threads in one app-server get one ``crosstalk mcp`` each; X's model sends to Y
    by Y's CrossTalk name and gets a definite outcome back (today ``unreachable`` /
    ``codex_thread_not_bound``: CrossTalk cannot inject into a Codex thread yet)."""
    t0 = time.monotonic()
    x, y, x_desc, y_desc = _two_registered_threads(codex_world)
    timings.add("two threads started and registered", time.monotonic() - t0)
    assert {x.id, y.id} <= set(codex_world.loaded())
    shims = codex_world.server.shim_pids()
    print(f"[codex] crosstalk mcp processes for 2 threads: {len(shims)}")
    assert len(shims) == 2, shims  # one MCP server process per loaded thread
    assert x_desc["pid"] != y_desc["pid"]
    assert {x_desc["pid"], y_desc["pid"]} == set(shims)

    text = unique("LIVE-X-TO-Y")
    _, output, took = model_calls(codex_world, x, "send_message", to=y_desc["name"],
                                  text=text)
    timings.add("send_message X -> Y: call -> output", took)
    result = output_json(output)
    print(f"[codex] send_message to a Codex thread: {result}")
    assert result.get("state") in SEND_STATES, result
    assert result.get("message_id"), result
    if result["state"] == "unreachable":
        assert result.get("reason"), result


def test_tui_thread_calls_crosstalk(codex_world: CodexWorld, timings: Timings) -> None:
    """The interactive Codex TUI joins the world's app-server; its thread (``source:
    "vscode"``) gets its ``crosstalk mcp`` from the app-server, and what the user types makes
    its model call ``send_message``: a definite outcome comes back, the thread is registered,
    and the TUI shows the model's answer and the automatic title."""
    y = codex_world.thread("yank")
    model_calls(codex_world, y, "receive_message")
    y_desc = y.wait_descriptor()

    t0 = time.monotonic()
    tui = codex_world.tui("tui")
    tx = tui.start()
    timings.add("codex TUI start -> thread listed by the app-server + prompt",
                time.monotonic() - t0)
    assert tx.info["source"] == "vscode", tx.info
    assert tx.info["threadSource"] == "user", tx.info
    assert tx.id in codex_world.loaded()

    text = unique("LIVE-TUI-TO-Y")
    trigger, rule = script_call(codex_world, tx, "send_message", to=y_desc["name"], text=text)
    after = codex_world.last_seq()
    typed = time.time()
    tui.send_keys(f"{trigger} message yank")
    asked, output, took = call_and_output(tx, rule, after)
    timings.add("TUI prompt typed (incl. 0.5 s before Enter) -> model request",
                asked["t"] - typed)
    timings.add("TUI send_message: call -> output", took)
    result = output_json(output)
    print(f"[codex] TUI send_message to a Codex thread: {result}")
    assert result.get("state") in SEND_STATES, result

    desc = tx.descriptor()
    assert desc is not None, codex_world.descriptors()
    assert desc["harness"] == "codex"
    assert desc["cwd"] == str(tui.cwd)
    # The TUI thread's shim is the app-server's child, not the TUI's.
    assert desc["pid"] in codex_world.server.shim_pids()
    assert tui.pid is not None
    assert desc["pid"] not in descendants(tui.pid)
    wait_for(lambda: "called send_message" in tui.screen(), 15, what="model answer on screen")
    # The TUI's title request (an ephemeral helper thread) names the thread.
    wait_for(lambda: tx.read().get("name") == TITLE, 15, what="automatic thread title")
    assert any(e.get("kind") == "title" for e in codex_world.mock.entries())


@pytest.mark.seed(3)
def test_codex_thread_receives_peer_message(codex_world: CodexWorld,
                                            timings: Timings) -> None:
    """X's model sends to Y; Y's model then sees the text: at once in a turn CrossTalk starts
    (``accepted``), or in Y's next turn (``queued``, the no-wake append)."""
    x, y, _, y_desc = _two_registered_threads(codex_world)
    text = unique("LIVE-X-TO-Y")
    after = codex_world.last_seq()
    asked, output, _ = model_calls(codex_world, x, "send_message", to=y_desc["name"],
                                   text=text)
    result = output_json(output)
    assert result.get("state") == "accepted", result  # a verified peer: turn/start
    entry = y.wait_for_request(lambda e: e.get("kind") == "main" and text in request_text(e),
                               timeout=30, after=after)
    timings.add("X's function_call -> Y's model request with the text",
                entry["t"] - asked["t"])
    seen = [t for role, t in message_texts(entry) if role == "user" and text in t]
    assert len(seen) == 1, message_texts(entry)
    # Whatever the envelope, it names the message (a reply needs its id).
    assert result["message_id"] in seen[0], seen[0]
    print(f"[codex] Y's model saw: {seen[0]!r}")


@pytest.mark.seed(4)
@pytest.mark.seed(3)
def test_codex_and_claude_share_crosstalk(world: World, codex_with_claude: CodexWorld,
                                          timings: Timings) -> None:
    """A Codex thread and a Claude session of one test share CROSSTALK_HOME, XDG_RUNTIME_DIR
    and the namespace: the Codex model's ``send_message`` to the Claude session by name is
    accepted and Claude's model gets the text in a CrossTalk envelope naming the thread; the
    Claude model's ``send_message`` back to the thread gets a definite outcome."""
    cw = codex_with_claude
    t0 = time.monotonic()
    alpha = world.session("alpha").start()
    cx = cw.thread("cx")
    alpha.wait_named()
    alpha.wait_mcp_connected()
    alpha.wait_idle()
    a_desc = alpha.wait_descriptor()
    timings.add("claude session + codex thread ready", time.monotonic() - t0)

    text = unique("LIVE-CODEX-TO-CLAUDE")
    asked, output, took = model_calls(cw, cx, "send_message", to=a_desc["name"], text=text)
    timings.add("codex send_message -> claude: call -> output", took)
    result = output_json(output)
    assert result.get("state") == "accepted", result
    cx_desc = cx.wait_descriptor()
    entry = alpha.wait_for_request(lambda e: is_main(e) and text in last_user_text(e),
                                   timeout=30)
    timings.add("codex function_call -> claude model request", entry["t"] - asked["t"])
    envelope = ENVELOPE.search(last_user_text(entry))
    assert envelope is not None, last_user_text(entry)[:600]
    assert envelope["name"] == cx_desc["name"]
    assert envelope["id"] == result["message_id"]
    assert envelope["body"] == text

    # Back: Claude's model -> the Codex thread.
    back = unique("LIVE-CLAUDE-TO-CODEX")
    trigger = unique("GO-BACK")
    world.mock.add_rules({"id": "a-answers", "match": trigger, "session": alpha.session_id,
                          "tool_use": {"name": "mcp__crosstalk__send_message",
                                       "input": {"to": cx_desc["name"], "text": back}},
                          "then": {"text": "sent back"}})
    after = alpha.last_seq()
    alpha.send_keys(f"{trigger} answer cx")
    res_entry = alpha.wait_for_request(lambda e: bool(tool_results(e)), timeout=60,
                                       after=after)
    (block,) = tool_results(res_entry)
    back_result = json.loads(message_text({"content": block.get("content")}))
    print(f"[codex] claude send_message to a Codex thread: {back_result}")
    assert back_result.get("state") == "accepted", back_result  # verified: wakes it
    if back_result["state"] == "accepted":
        got = cx.wait_for_request(lambda e: e.get("kind") == "main" and back in request_text(e),
                                  timeout=30)
        asked_back = alpha.wait_for_request(lambda e: e.get("rule") == "a-answers",
                                            after=after)
        timings.add("claude tool_use -> codex model request with the text",
                    got["t"] - asked_back["t"])
