"""Spec gating scenarios (seed §11: 2, 3, 10, 12, 18, 26) against the real Codex 0.169.0.

Each test drives real Codex threads through ``codex app-server`` against the mock Responses API
(see ``test_codex_live.py`` and ``support/codex.py``) and asserts on what the *receiving*
thread's model got in its requests to the mock: a verified immediate message becomes
``turn/start`` (wakes an idle thread, joins a running turn: ``accepted``); ``next_turn`` or an
unverified sender becomes ``thread/inject_items`` (``queued``, never wakes).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.live.conftest import Timings
from tests.live.support.claude import Entry, World, tool_results, wait_for
from tests.live.support.codex import (
    AppServerClient,
    CodexThread,
    CodexWorld,
    call_output,
    message_texts,
    output_json,
    request_text,
)
from tests.live.support.mock_api import message_text
from tests.live.support.steps import model_calls, unique

pytestmark = pytest.mark.live

#: How long "stays idle" is watched for.
QUIET_S = 3.0
#: How long Y's busy turn runs its shell command.
BUSY_S = 4
#: The same, when the sender is a Claude session (a keystroke, a model request and a tool
#: call of its own fit in it with room to spare).
CLAUDE_BUSY_S = 8


def register(cw: CodexWorld, *threads: CodexThread) -> dict[str, dict[str, Any]]:
    """One ``receive_message`` call per thread (its first tools/call registers it); the
    descriptors by thread name."""
    out = {}
    for thread in threads:
        _, output, _ = model_calls(cw, thread, "receive_message")
        assert isinstance(output_json(output).get("entries"), list), output
        out[thread.name] = thread.wait_descriptor()
    return out


def user_texts(entry: Entry) -> list[str]:
    return [t for role, t in message_texts(entry) if role == "user"]


def carries(entry: Entry, text: str) -> bool:
    return entry.get("kind") == "main" and any(text in t for t in user_texts(entry))


def turn_id(entry: Entry) -> str | None:
    headers = {k.lower(): v for k, v in (entry.get("headers") or {}).items()}
    raw = headers.get("x-codex-turn-metadata")
    meta = json.loads(raw) if raw else {}
    value = meta.get("turn_id")
    return value if isinstance(value, str) else None


def turns_started(client: AppServerClient, thread: CodexThread, since: int) -> list[str]:
    return [str(((n.get("params") or {}).get("turn") or {}).get("id"))
            for n in client.notifications[since:]
            if n.get("method") == "turn/started"
            and (n.get("params") or {}).get("threadId") == thread.id]


def assert_quiet(thread: CodexThread, after: int, seconds: float = QUIET_S) -> None:
    """No model request from ``thread`` after seq ``after`` for ``seconds``; still idle."""
    time.sleep(seconds)
    late = [e.get("seq") for e in thread.requests() if e.get("seq", 0) > after]
    assert late == [], f"{thread.name} was woken: requests {late}\n{thread.diagnostics()}"
    assert thread.read()["status"]["type"] == "idle", thread.read()["status"]


def send(cw: CodexWorld, sender: CodexThread, tool: str = "send_message", **arguments: Any
         ) -> tuple[dict[str, Any], float]:
    """``sender``'s model calls ``tool`` in a turn of its own; (its JSON result, seconds from
    the call to the request carrying its output)."""
    _, output, took = model_calls(cw, sender, tool, **arguments)
    return output_json(output), took


@pytest.mark.seed(2)
def test_mid_turn_message_joins_running_turn(codex_world: CodexWorld, timings: Timings) -> None:
    """Seed 2: Y is mid-turn (its model ran ``exec_command`` ``sleep 4``); X's verified
    immediate message is ``accepted`` at once, and reaches Y's model at the next model
    boundary of the *same* turn: the request carrying the command's output, same ``turn_id``
    in ``x-codex-turn-metadata``. No separate turn is started."""
    t0 = time.monotonic()
    cw = codex_world
    x, y = cw.thread("xray"), cw.thread("yank")
    descs = register(cw, x, y)

    trigger = unique("BUSY")
    cw.mock.add_rules({"id": "y-busy", "match": trigger, "thread": y.id,
                       "function_call": {"name": "exec_command", "arguments": {
                           "cmd": f"sleep {BUSY_S}", "login": False, "yield_time_ms": 20000}},
                       "then": {"text": "busy turn done"}})
    since = y.client.mark()
    after = cw.last_seq()
    busy_turn = y.start_turn(f"{trigger}: work for a while")
    held = y.wait_for_request(lambda e: e.get("rule") == "y-busy", after=after)
    assert turn_id(held) == busy_turn, held["headers"]
    (exec_call,) = [i for i in held["response"] if i.get("type") == "function_call"]
    y.client.wait_notification(
        lambda n: n.get("method") == "item/started"
        and (n.get("params") or {}).get("threadId") == y.id
        and ((n.get("params") or {}).get("item") or {}).get("type") == "commandExecution",
        15, since=since)
    assert y.read()["status"]["type"] == "active"

    text = unique("LIVE-MIDTURN")
    sent_at = time.time()
    result, took = send(cw, x, to=descs["yank"]["name"], text=text)
    timings.add("seed 2: X send_message to busy Y: call -> output", took)
    assert result.get("state") == "accepted", result
    # Still running its command: nothing new reached Y's model yet.
    assert [e["seq"] for e in y.requests() if e["seq"] > held["seq"]] == []

    got = y.wait_for_request(lambda e: carries(e, text), after=held["seq"], timeout=30)
    timings.add("seed 2: X's turn start -> Y's request with the text (command ~"
                f"{BUSY_S} s)", got["t"] - sent_at)
    # The very next request of the running turn carries it, with the command's output.
    nxt = min((e for e in y.requests() if e["seq"] > held["seq"]), key=lambda e: e["seq"])
    assert nxt["seq"] == got["seq"], (nxt["seq"], got["seq"])
    assert turn_id(got) == busy_turn, (turn_id(got), busy_turn)
    assert call_output(got, exec_call["call_id"]) is not None, got["body"]["input"][-3:]
    assert got["t"] - held["t"] >= BUSY_S - 0.5, "the command was cut short"
    (seen,) = [t for t in user_texts(got) if text in t]
    assert result["message_id"] in seen, seen
    done = y.wait_turn(busy_turn, since=since)
    assert done["status"] == "completed", done
    # No separate turn for the message: only the busy one was started on Y.
    time.sleep(1.0)
    assert turns_started(y.client, y, since) == [busy_turn]
    assert all(turn_id(e) == busy_turn for e in y.requests()
               if e["seq"] > held["seq"] and e.get("kind") == "main")
    print(f"[codex seeds] mid-turn: Y's model saw {seen!r}")
    timings.add("seed 2: whole scenario", time.monotonic() - t0)


@pytest.mark.seed(2)
def test_claude_mid_turn_message_joins_running_codex_turn(
        world: World, codex_with_claude: CodexWorld, timings: Timings) -> None:
    """Seed 2, Claude -> Codex: Y is mid-turn (``exec_command`` ``sleep 8``); a real Claude
    session's model calls ``mcp__crosstalk__send_message`` to Y by its CrossTalk name: the
    result is ``accepted`` at once, and the text reaches Y's model in the very next request of
    the *same* turn (same ``turn_id``), carrying the command's output. No turn is started for
    it."""
    t0 = time.monotonic()
    cw = codex_with_claude
    alpha = world.session("alpha").start()
    y = cw.thread("yank")
    alpha.wait_named()
    alpha.wait_mcp_connected()
    alpha.wait_idle()
    a_desc = alpha.wait_descriptor()
    y_desc = register(cw, y)["yank"]
    timings.add("seed 2 (claude): claude session + codex thread ready", time.monotonic() - t0)

    text = unique("LIVE-CLAUDE-MIDTURN")
    go = unique("GO-CLAUDE")
    world.mock.add_rules({"id": "a-sends", "match": go, "session": alpha.session_id,
                          "tool_use": {"name": "mcp__crosstalk__send_message",
                                       "input": {"to": y_desc["name"], "text": text}},
                          "then": {"text": "sent"}})
    trigger = unique("BUSY")
    cw.mock.add_rules({"id": "y-busy", "match": trigger, "thread": y.id,
                       "function_call": {"name": "exec_command", "arguments": {
                           "cmd": f"sleep {CLAUDE_BUSY_S}", "login": False,
                           "yield_time_ms": 30000}},
                       "then": {"text": "busy turn done"}})
    since = y.client.mark()
    after = cw.last_seq()
    busy_turn = y.start_turn(f"{trigger}: work for a while")
    held = y.wait_for_request(lambda e: e.get("rule") == "y-busy", after=after)
    assert turn_id(held) == busy_turn, held["headers"]
    (exec_call,) = [i for i in held["response"] if i.get("type") == "function_call"]
    y.client.wait_notification(
        lambda n: n.get("method") == "item/started"
        and (n.get("params") or {}).get("threadId") == y.id
        and ((n.get("params") or {}).get("item") or {}).get("type") == "commandExecution",
        15, since=since)
    assert y.read()["status"]["type"] == "active"

    a_after = alpha.last_seq()
    keys_at = time.time()
    alpha.send_keys(f"{go} tell yank")
    asked = alpha.wait_for_request(lambda e: e.get("rule") == "a-sends", after=a_after,
                                   timeout=60)
    answered = alpha.wait_for_request(lambda e: bool(tool_results(e)), after=asked["seq"],
                                      timeout=60)
    (block,) = tool_results(answered)
    result = json.loads(message_text({"content": block.get("content")}))
    print(f"[codex seeds] claude send_message to busy Y: {result}")
    timings.add("seed 2 (claude): keys -> claude tool_use request", asked["t"] - keys_at)
    timings.add("seed 2 (claude): claude tool_use -> tool_result request",
                answered["t"] - asked["t"])
    assert result.get("state") == "accepted", result
    # Claude had its answer while Y was still running its command: nothing new reached Y.
    assert answered["t"] - held["t"] < CLAUDE_BUSY_S - 0.5, (answered["t"], held["t"])
    assert y.read()["status"]["type"] == "active"

    got = y.wait_for_request(lambda e: carries(e, text), after=held["seq"], timeout=30)
    timings.add("seed 2 (claude): claude tool_use -> Y's request with the text (command ~"
                f"{CLAUDE_BUSY_S} s)", got["t"] - asked["t"])
    nxt = min((e for e in y.requests() if e["seq"] > held["seq"]), key=lambda e: e["seq"])
    assert nxt["seq"] == got["seq"], (nxt["seq"], got["seq"])
    assert turn_id(got) == busy_turn, (turn_id(got), busy_turn)
    assert call_output(got, exec_call["call_id"]) is not None, got["body"]["input"][-3:]
    assert got["t"] - held["t"] >= CLAUDE_BUSY_S - 0.5, "the command was cut short"
    (seen,) = [t for t in user_texts(got) if text in t]
    assert result["message_id"] in seen, seen
    assert f'from="{a_desc["name"]}"' in seen, seen
    assert 'verified="true"' in seen, seen
    done = y.wait_turn(busy_turn, since=since)
    assert done["status"] == "completed", done
    time.sleep(1.0)
    assert turns_started(y.client, y, since) == [busy_turn]
    assert all(turn_id(e) == busy_turn for e in y.requests()
               if e["seq"] > held["seq"] and e.get("kind") == "main")
    print(f"[codex seeds] claude mid-turn: Y's model saw {seen!r}")
    timings.add("seed 2 (claude): whole scenario", time.monotonic() - t0)


@pytest.mark.seed(3)
def test_deferred_and_unverified_do_not_wake(codex_world: CodexWorld, timings: Timings) -> None:
    """Seed 3: Y idle. X's ``next_turn`` message is ``queued`` and Y stays idle; the
    unverified ``crosstalk send`` CLI is ``queued`` too, still no wake; a turn started later
    on Y by its user consumes both (its first model request carries both texts)."""
    t0 = time.monotonic()
    cw = codex_world
    x, y = cw.thread("xray"), cw.thread("yank")
    descs = register(cw, x, y)
    y_name = descs["yank"]["name"]

    deferred = unique("LIVE-NEXT-TURN")
    after = cw.last_seq()
    result, took = send(cw, x, to=y_name, text=deferred, delivery="next_turn")
    timings.add("seed 3: next_turn send: call -> output", took)
    assert result.get("state") == "queued", result
    assert_quiet(y, after)

    unverified = unique("LIVE-CLI")
    t1 = time.monotonic()
    done = cw.crosstalk("send", "--json", y_name, unverified)
    timings.add("seed 3: crosstalk send CLI", time.monotonic() - t1)
    assert done.returncode == 0, (done.stdout, done.stderr)
    ack = json.loads(done.stdout)
    assert ack.get("state") == "queued", ack
    assert_quiet(y, after)

    trigger = unique("LATER")
    after = cw.last_seq()
    turn = y.run_turn(f"{trigger}: anything new?")
    assert turn["status"] == "completed", turn
    first = y.wait_for_request(lambda e: e.get("kind") == "main", after=after)
    assert carries(first, deferred), user_texts(first)
    assert carries(first, unverified), user_texts(first)
    assert carries(first, trigger), user_texts(first)
    texts = user_texts(first)
    print(f"[codex seeds] Y's first request of its own turn, last user items: {texts[-3:]!r}")
    # Each was delivered once.
    assert sum(deferred in t for t in texts) == 1, texts
    assert sum(unverified in t for t in texts) == 1, texts
    timings.add("seed 3: whole scenario", time.monotonic() - t0)


@pytest.mark.seed(12)
@pytest.mark.seed(18)
def test_same_cwd_threads_and_second_app_server(codex_world: CodexWorld,
                                               timings: Timings) -> None:
    """Seeds 12 + 18: A and B share one cwd on the default app-server; C lives on a second
    app-server (its own CODEX_HOME and control socket, the same CrossTalk state). A sends to B
    and to C by name (immediate, and next_turn to C): each message reaches only its own
    thread's model, and nothing for C reaches the default server's threads."""
    t0 = time.monotonic()
    cw = codex_world
    shared = cw.root / "t-shared" / "proj"
    a = cw.thread("alpha", cwd=shared)
    b = cw.thread("bravo", cwd=shared)
    other = cw.extra_server("codex-home-b")
    client_b = cw.connect("crosstalk_live_b", server=other)
    c = cw.thread("charlie", client=client_b)
    timings.add("seed 12: three threads on two app-servers ready", time.monotonic() - t0)
    assert a.cwd == b.cwd
    assert c.id in (client_b.request("thread/loaded/list", {}).get("data") or [])
    assert c.id not in cw.loaded()
    descs = register(cw, a, b, c)
    names = {n: d["name"] for n, d in descs.items()}
    print(f"[codex seeds] names: {names}")
    assert len(set(names.values())) == 3, names
    assert descs["alpha"]["agent_id"] != descs["bravo"]["agent_id"]
    # C's shim runs under the second app-server.
    assert descs["charlie"]["pid"] in other.shim_pids()
    assert descs["charlie"]["pid"] not in cw.server.shim_pids()

    to_b, to_c, to_c_later = unique("FOR-BRAVO"), unique("FOR-CHARLIE"), unique("C-NEXT")
    after = cw.last_seq()
    for target, text in (("bravo", to_b), ("charlie", to_c)):
        asked_at = time.time()
        result, took = send(cw, a, to=names[target], text=text)
        timings.add(f"seed 12: A -> {target}: call -> output", took)
        assert result.get("state") == "accepted", (target, result)
        thread = b if target == "bravo" else c
        got = thread.wait_for_request(lambda e, t=text: carries(e, t), after=after, timeout=30)
        timings.add(f"seed 12: A's turn start -> {target}'s model request",
                    got["t"] - asked_at)
    result, _ = send(cw, a, to=names["charlie"], text=to_c_later, delivery="next_turn")
    assert result.get("state") == "queued", result
    assert_quiet(c, cw.last_seq(), 2.0)
    trigger = unique("C-TURN")
    mark = cw.last_seq()
    c.run_turn(f"{trigger}: go")
    first = c.wait_for_request(lambda e: e.get("kind") == "main", after=mark)
    assert carries(first, to_c_later), user_texts(first)

    # Only its own: B never saw C's texts, C never saw B's, A (the sender) saw neither as a
    # message (it only wrote them into its own tool calls).
    for thread, foreign in ((a, (to_b, to_c, to_c_later)), (b, (to_c, to_c_later)),
                            (c, (to_b,))):
        for entry in thread.requests():
            for text in foreign:
                assert not any(text in t for t in user_texts(entry)), (thread.name, text)
    assert all(to_b not in request_text(e) for e in c.requests())
    # The default app-server's own record of its threads holds nothing meant for C.
    for thread in (a, b):
        dumped = json.dumps(cw.client.request("thread/read", {"threadId": thread.id,
                                                              "includeTurns": True}))
        assert to_b in dumped, thread.name  # the history is there (A's call, B's input)
        assert to_c not in dumped or thread is a, thread.name
        assert to_c_later not in dumped or thread is a, thread.name
    timings.add("seed 12/18: whole scenario", time.monotonic() - t0)


async def _unbound_calls(env: dict[str, str], cwd: Path, to: str, text: str
                        ) -> tuple[dict[str, Any], Any, Any]:
    """``crosstalk mcp`` run by the test (no Codex, no Claude around it): list_agents, then
    send_message and receive_message with no ``_meta`` at all."""
    params = StdioServerParameters(command=sys.executable, args=["-m", "crosstalk", "mcp"],
                                   env=env, cwd=str(cwd))
    async with Client(params) as client:
        listed = await client.call_tool("list_agents", {})
        sent = await client.call_tool("send_message", {"to": to, "text": text})
        received = await client.call_tool("receive_message", {})
    return json.loads(listed.content[0].text), sent, received


@pytest.mark.seed(12)
def test_call_without_thread_id_is_unbound(codex_world: CodexWorld, timings: Timings) -> None:
    """Seed 12: a ``crosstalk mcp`` whose calls carry no ``_meta.threadId`` (nor any other
    evidence of a session) is unbound: ``list_agents`` works and lists the world's loaded Codex
    threads (found over the app-server's control socket), ``send_message`` and
    ``receive_message`` answer ``unbound``; nothing is sent, nothing registers."""
    t0 = time.monotonic()
    cw = codex_world
    x = cw.thread("xray")
    z = cw.thread("zulu")
    x_name = register(cw, x)["xray"]["name"]
    z_name = unique("zulu-native")
    z.set_name(z_name)
    before = {d.get("agent_id") for d in cw.descriptors()}

    text = unique("LIVE-UNBOUND")
    after = cw.last_seq()
    t1 = time.monotonic()
    listed, sent, received = asyncio.run(_unbound_calls(cw.env, cw.root, x_name, text))
    timings.add("seed 12 (unbound): MCP client start + 3 calls", time.monotonic() - t1)
    rows = listed.get("agents") or []
    print(f"[codex seeds] unbound list_agents: {rows}")
    codex_rows = {r.get("name"): r for r in rows if r.get("harness") == "codex"}
    assert {x_name, z_name} <= set(codex_rows), rows
    assert codex_rows[x_name].get("crosstalk") is True, codex_rows[x_name]
    assert codex_rows[z_name].get("crosstalk") is False, codex_rows[z_name]
    for res in (sent, received):
        payload = json.loads(res.content[0].text)
        print(f"[codex seeds] unbound call: is_error={res.is_error} {payload}")
        assert res.is_error, payload
        assert payload.get("error") == "unbound", payload
    # Nothing was sent, nothing registered.
    assert {d.get("agent_id") for d in cw.descriptors()} == before
    assert_quiet(x, after, 2.0)
    assert all(text not in request_text(e) for e in cw.mock.entries())
    timings.add("seed 12 (unbound): whole scenario", time.monotonic() - t0)


@pytest.mark.seed(26)
def test_native_codex_thread_inform_only(codex_world: CodexWorld, timings: Timings) -> None:
    """Seed 26 (Codex half): Z is loaded but never called a CrossTalk tool; X's
    ``list_agents`` lists it with ``crosstalk: false``; an inform to it by name reaches Z's
    model; an ``ask`` to it is rejected with ``native_inform_only``."""
    t0 = time.monotonic()
    cw = codex_world
    x = cw.thread("xray")
    z = cw.thread("zulu")
    register(cw, x)
    z_name = unique("zulu-native")
    z.set_name(z_name)
    assert z.descriptor() is None

    listed, took = send(cw, x, "list_agents")
    timings.add("seed 26: list_agents with a native Codex thread", took)
    rows = [r for r in listed.get("agents") or [] if r.get("name") == z_name]
    assert len(rows) == 1, listed
    row = rows[0]
    print(f"[codex seeds] native row: {row}")
    assert row.get("crosstalk") is False, row
    assert row.get("harness") == "codex", row

    text = unique("LIVE-NATIVE")
    after = cw.last_seq()
    result, took = send(cw, x, to=z_name, text=text)
    timings.add("seed 26: inform to native thread: call -> output", took)
    assert result.get("state") in ("accepted", "queued"), result
    if result["state"] == "queued":  # appended, no wake: Z's next turn consumes it
        z.run_turn(unique("Z-TURN"))
    got = z.wait_for_request(lambda e: carries(e, text), after=after, timeout=30)
    print(f"[codex seeds] native Z got ({result['state']}): "
          f"{[t for t in user_texts(got) if text in t]!r}")

    asked, _ = send(cw, x, "ask", to=z_name, text=unique("LIVE-NATIVE-ASK"))
    assert asked.get("state") == "rejected", asked
    assert asked.get("reason") == "native_inform_only", asked
    assert z.descriptor() is None  # still not a CrossTalk agent
    timings.add("seed 26: whole scenario", time.monotonic() - t0)


@pytest.mark.seed(10)
def test_app_server_restart_reregisters(codex_world: CodexWorld, timings: Timings) -> None:
    """Seed 10: X and Y registered; the app-server stops (and its shims with it); a new one
    starts on the same CODEX_HOME and resumes both threads; one tool call each re-registers
    them under the same names and agent_ids, and X -> Y is delivered again."""
    t0 = time.monotonic()
    cw = codex_world
    x, y = cw.thread("xray"), cw.thread("yank")
    before = register(cw, x, y)
    old_shims = cw.server.shim_pids()

    t1 = time.monotonic()
    assert cw.stop_server() == []
    wait_for(lambda: not any(Path(f"/proc/{p}").exists() for p in old_shims), 15,
             what="old shims reaped")
    timings.add("seed 10: app-server stop -> shims reaped", time.monotonic() - t1)

    t2 = time.monotonic()
    client = cw.client  # a new app-server on the same CODEX_HOME
    for thread in (x, y):
        assert thread.id not in cw.loaded()
        thread.resume(client)
    assert {x.id, y.id} <= set(cw.loaded())
    timings.add("seed 10: new app-server + thread/resume x2 (MCP ready)", time.monotonic() - t2)

    after = register(cw, x, y)
    for name in ("xray", "yank"):
        assert after[name]["name"] == before[name]["name"], (before[name], after[name])
        assert after[name]["agent_id"] == before[name]["agent_id"], (before[name], after[name])
        assert after[name]["pid"] in cw.server.shim_pids()
        assert after[name]["pid"] not in old_shims

    text = unique("LIVE-AFTER-RESTART")
    mark = cw.last_seq()
    asked_at = time.time()
    result, took = send(cw, x, to=after["yank"]["name"], text=text)
    timings.add("seed 10: X -> Y after restart: call -> output", took)
    assert result.get("state") == "accepted", result
    got = y.wait_for_request(lambda e: carries(e, text), after=mark, timeout=30)
    timings.add("seed 10: X's turn start -> Y's model request", got["t"] - asked_at)
    timings.add("seed 10: whole scenario", time.monotonic() - t0)
