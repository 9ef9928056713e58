"""Claude's inbox limits and CrossTalk's answers to them, with the real Claude Code 2.1.328.

* a burst of 40 messages from three sessions into one (Claude's per-sender token bucket of 30
  at 0.5/s: CrossTalk paces; nothing is dropped, duplicated or reordered);
* a message held by a receiver in bypassPermissions mode (permission-mode parity), with and
  without CrossTalk in it: the sender is told ``unknown``/``held_for_approval``, the model
  sees nothing until its user delivers it;
* seed 21 live: the receiver's shim is killed between an ask and its reply, the user
  reconnects the server with ``/mcp``, and the reply still reaches the asker exactly once.

As in ``test_claude_live.py``, what is asserted is what the *model* was sent: the bodies of
the sessions' requests to the mock.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections import Counter
from typing import Any

import pytest

from crosstalk.harness.claude.gate import listen_path_for
from tests.live.conftest import Timings
from tests.live.support.claude import LiveClaude, World, is_main, wait_for
from tests.live.support.extras import (
    agent_id_for,
    chain_rule,
    journal,
    key,
    latest_main,
    peer_messages,
    reconnect_mcp,
    result_json,
    tool_result_blocks,
    tool_uses,
    transcript,
    wait_screen,
)
from tests.live.support.gate import choose, send_once
from tests.live.support.steps import start_all, unique

pytestmark = pytest.mark.live


def press_enter_together(*sessions: LiveClaude, texts: list[str]) -> None:
    """Type a prompt into each session, then submit them all at once."""
    for claude, text in zip(sessions, texts, strict=True):
        claude.send_keys(text, enter=False)
    time.sleep(0.5)  # typed, not pasted
    for claude in sessions:
        key(claude, "Enter")


# -- 1. a burst of 40 from three senders -----------------------------------------------------

BURST = {"a1": 14, "a2": 13, "a3": 13}


def test_burst_of_40_from_three_senders(world: World, timings: Timings) -> None:
    """40 send_message calls by three models within seconds: every send is ``accepted``,
    and B's model is shown each text exactly once, in each sender's order."""
    senders = [world.session(name) for name in BURST]
    beta = world.session("beta")
    start_all(*senders, beta)
    beta.wait_idle()
    to = beta.wait_named()["name"]
    run = uuid.uuid4().hex[:8]
    texts = {name: [f"BURST-{run}-{name}-{i:02d}" for i in range(n)]
             for name, n in BURST.items()}
    triggers = {name: unique(f"GO-BURST-{name}") for name in BURST}
    # B is busy while the burst lands: its first peer turn calls a tool slowly, so messages
    # arrive mid-turn (role "system" after the tool_result) and queue for later turns.
    world.mock.add_rules(
        {"id": "b-busy", "match": f"BURST-{run}-", "session": beta.session_id,
         "delay_s": 3, "tool_use": {"name": "mcp__crosstalk__list_agents", "input": {}},
         "then": {"delay_s": 3, "text": "busy turn done"}},
        *[chain_rule(rule_id=f"burst-{c.name}", trigger=triggers[c.name],
                     session=c.session_id,
                     calls=[{"name": "mcp__crosstalk__send_message",
                             "input": {"to": to, "text": t}} for t in texts[c.name]],
                     final_text=f"sent {len(texts[c.name])}")
          for c in senders])

    press_enter_together(*senders, texts=[f"{triggers[c.name]} burst beta" for c in senders])

    # Every sender finishes its chain (its last request carries the 13th/14th tool_result).
    def results_of(claude: LiveClaude) -> list[tuple[str, dict[str, Any]]]:
        entries = claude.requests()
        uses = tool_uses(entries)
        got = tool_result_blocks(entries)
        return [(uses[i]["input"]["text"], result_json(got[i])) for i in uses if i in got]

    def all_sent() -> bool:
        return all(len(results_of(c)) == BURST[c.name] for c in senders)

    try:
        wait_for(all_sent, 90, step=0.5, what="every sender's 40 send_message results")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}: {[len(results_of(c)) for c in senders]}") from None
    expected_ids: dict[str, str] = {}
    for c in senders:
        results = results_of(c)
        assert [t for t, _ in results] == texts[c.name]
        for text, res in results:
            assert res["state"] == "accepted", (c.name, text, res)
            expected_ids[res["message_id"]] = text

    first_call = min(e["t"] for c in senders for e in c.requests()
                     if e.get("rule") == f"burst-{c.name}")
    last_result = max(e["t"] for c in senders for e in c.requests()
                      if e.get("response") and e["response"][0].get("text") ==
                      f"sent {BURST[c.name]}")
    timings.add("burst: first send_message tool_use -> last sender's last tool_result",
                last_result - first_call)

    # B's model sees all 40.
    def seen_all() -> dict[str, Any] | None:
        entry = latest_main(beta)
        if entry is None:
            return None
        ids = {s.message_id for s in peer_messages(entry)}
        return entry if set(expected_ids) <= ids else None

    try:
        final = wait_for(seen_all, 60, step=0.5, what="all 40 messages in B's requests")
    except TimeoutError as exc:
        entry = latest_main(beta)
        have = {s.message_id for s in peer_messages(entry)} if entry else set()
        missing = sorted(expected_ids[i] for i in set(expected_ids) - have)
        raise AssertionError(f"{exc}; missing {missing}\n{beta.diagnostics()}") from None
    timings.add("burst: first send_message tool_use -> B's request showing all 40",
                final["t"] - first_call)
    time.sleep(2)  # anything late (a resend, a duplicate) would show now

    mains = [e for e in beta.requests() if is_main(e)]
    seen_anywhere: set[str] = set()
    for entry in mains:
        seen = peer_messages(entry)
        counts = Counter(s.message_id for s in seen)
        dup = {expected_ids.get(i, i): n for i, n in counts.items() if n > 1}
        assert not dup, f"request {entry['seq']} shows messages more than once: {dup}"
        seen_anywhere |= set(counts)
    last = peer_messages(mains[-1])
    assert {s.message_id for s in last} == seen_anywhere == set(expected_ids)
    for s in last:
        assert s.body == expected_ids[s.message_id]
        assert s.body.split("-")[2] == s.from_name
    for name in BURST:
        order = [s.body for s in last if s.from_name == name]
        assert order == texts[name], f"{name}'s messages out of order"

    # B's journal agrees: 40 accepted, Claude sent no receipt (no drop, no hold).
    records = journal(world, beta.wait_descriptor()["agent_id"])
    states = Counter(r["state"] for r in records
                     if r.get("subject") == "message" and r.get("id") in expected_ids)
    assert states == Counter(submitted=40, dispatching=40, accepted=40), states
    assert [r for r in records if r.get("subject") == "receipt"] == []
    # How long messages waited in B's dispatch lane and its pacer (submitted -> accepted).
    at: dict[str, dict[str, float]] = {}
    for r in records:
        if r.get("subject") == "message" and r.get("id") in expected_ids:
            at.setdefault(r["id"], {})[r["state"]] = r["ts"]
    waits = sorted(v["accepted"] - v["submitted"] for v in at.values())
    timings.add("burst: B's shim, submitted -> accepted, median", waits[len(waits) // 2])
    timings.add("burst: B's shim, submitted -> accepted, max", waits[-1])
    roles = Counter(s.role for s in last)
    print(f"[live] burst: B's model got {roles['system']} of the 40 mid-turn (role system) and "
          f"{roles['user']} in user turns, over {len(mains)} main requests")
    assert roles["system"] > 0, "B was never busy when a message arrived"


# -- 2. permission-mode parity: a held message ---------------------------------------------

#: A receiver in bypassPermissions mode (research §7: the seeded settings accept the mode's
#: warning; ``IS_SANDBOX=1`` because we run as root). No ``crossSessionInbound`` setting.
BYPASS = {"permission_mode": "bypassPermissions",
          "extra_args": ("--dangerously-skip-permissions",)}


def model_saw(claude: LiveClaude, text: str) -> bool:
    return any(text in s.body for e in claude.requests() if is_main(e)
               for s in peer_messages(e))


def test_held_by_a_bypass_session_until_its_user_delivers(world: World,
                                                          timings: Timings) -> None:
    """A prompting session's send_message to a bypassPermissions session that has no
    CrossTalk (A's shim writes into its inbox): Claude holds it for its user. The sender is
    told ``unknown``/``held_for_approval``, not ``accepted``; the model sees nothing until the
    user picks "Deliver"; then it does, and Claude's ``delivered`` receipt reaches A's shim,
    which journals it."""
    alpha = world.session("alpha")
    gamma = world.session("gamma", crosstalk=False, **BYPASS)
    start_all(alpha)
    gamma.start()
    gamma.wait_idle()
    text = unique("LIVE-HELD")

    result, took = send_once(world, alpha, "gamma", text)
    timings.add("A's send_message tool_use -> tool_result (held)", took)
    assert result["state"] == "unknown", result
    assert result["reason"] == "held_for_approval", result

    screen = wait_screen(gamma, "Held message from another session",
                         "Deliver this message to Claude")
    assert "permission mode class doesn't match" in screen, screen
    wait_for(lambda: gamma.status() == "waiting", 5, what="gamma waiting on its user")
    time.sleep(1.0)
    assert not model_saw(gamma, text), "a held message reached the model"
    assert [e for e in gamma.requests() if is_main(e)] == []

    key(gamma, "Down")
    wait_screen(gamma, "\u276f Deliver this message to Claude")
    t0 = time.time()
    key(gamma, "Enter")
    entry = gamma.wait_for_request(lambda e: is_main(e) and any(
        s.body == text for s in peer_messages(e)), timeout=20)
    timings.add("user picks Deliver -> gamma's model request", entry["t"] - t0)
    (seen,) = [s for s in peer_messages(entry) if s.body == text]
    assert seen.message_id == result["message_id"]
    assert seen.from_name == "alpha"
    assert seen.mode == "prompting"
    assert seen.from_address == alpha.wait_descriptor()["uds_path"]

    agent = alpha.wait_descriptor()["agent_id"]

    def receipt() -> list[dict[str, Any]]:
        return [r for r in journal(world, agent)
                if r.get("subject") == "receipt" and r.get("id") == result["message_id"]]
    got = wait_for(receipt, 10, what="the delivered receipt in A's journal")
    timings.add("user picks Deliver -> receipt journaled by A's shim",
                got[0]["ts"] - t0)
    assert [r["status"] for r in got] == ["delivered"]


def test_a_bypass_receiver_with_crosstalk_holds_through_its_own_gate(
        world: World, timings: Timings) -> None:
    """Claude 2.1.328 skips its gate for a frame from its own descendant (selfSent), and the
    receiving shim is one; so B's detached gate helper writes peer frames (ADR 0020, which
    supersedes 0008's refusal): a prompting peer's message to a bypassPermissions session with
    CrossTalk is held for its user, exactly as without CrossTalk, never delivered unheld and
    never refused."""
    alpha, beta = world.session("alpha"), world.session("beta", **BYPASS)
    start_all(alpha, beta)
    beta.wait_idle()
    text = unique("LIVE-PARITY")
    result, took = send_once(world, alpha, "beta", text)
    timings.add("A's send_message to a bypass B with CrossTalk (held)", took)
    wait_screen(beta, "Held message from another session", "Deliver this message to Claude")
    time.sleep(1.0)
    inbound = [line for line in beta.debug_log.read_text(errors="replace").splitlines()
               if "cross-session-inbound" in line or "Routed user message" in line]
    evidence = (f"A's result {result}; B's model saw it: {model_saw(beta, text)}; B's shims "
                f"{beta.shim_pids()}; B's debug log: {inbound[-3:]}")
    assert (result.get("state"), result.get("reason")) == (
        "unknown", "held_for_approval"), evidence
    assert any("cause=mode-mismatch" in line for line in inbound), evidence
    assert not model_saw(beta, text), evidence
    choose(beta, deliver=True)
    beta.wait_for_request(lambda e: is_main(e) and any(
        s.body == text for s in peer_messages(e)), timeout=20)
    # Claude's transcript keeps the frame's origin: not selfSent, written by no shim of B's.
    def origins() -> list[dict[str, Any]]:
        return [rec["origin"] for rec in transcript(world, beta)
                if isinstance(rec.get("origin"), dict) and text in json.dumps(rec)]
    try:
        found = wait_for(origins, 15, step=0.5, what="the message's origin in B's transcript")
    except TimeoutError:
        recs = [json.dumps(r)[:400] for r in transcript(world, beta) if text in json.dumps(r)]
        raise AssertionError(f"no origin: {recs}; {evidence}") from None
    assert not found[0].get("selfSent"), found
    assert found[0].get("verifiedPeerPid") not in beta.shim_pids(), found


# -- 3. seed 21 live: the receiver's shim dies between an ask and its reply -----------------


@pytest.mark.seed(21)
def test_shim_killed_between_ask_and_reply_reconnected_by_the_user(
        world: World, timings: Timings) -> None:
    """A asks B; B's model has the question; B's shim is SIGKILLed (Claude B keeps running).
    A native SendMessage to the envelope's address now fails to connect. The user reconnects
    the server with /mcp: a new shim registers B again under the same agent_id, a native
    message is bounced with a notice listing the open ask, and B's model answers it with
    ``reply``: A's model gets the answer exactly once."""
    alpha, beta = world.session("alpha"), world.session("beta")
    start_all(alpha, beta)
    beta.wait_idle()
    before = beta.wait_descriptor()
    question, answer = unique("Q21"), unique("ANSWER21")
    trigger = unique("GO-ASK")
    world.mock.add_rules({
        "id": "a-asks", "match": trigger, "session": alpha.session_id,
        "tool_use": {"name": "mcp__crosstalk__ask", "input": {"to": "beta", "text": question}},
        "then": {"text": "asked"}})
    alpha.send_keys(f"{trigger} ask beta")
    got = beta.wait_for_request(lambda e: is_main(e) and any(
        s.body == question for s in peer_messages(e)), timeout=30)
    (asked,) = [s for s in peer_messages(got) if s.body == question]
    assert asked.kind == "ask"
    assert asked.meta == "reply-with=reply"
    results = wait_for(lambda: [result_json(b) for b in
                                tool_result_blocks(alpha.requests()).values()], 30,
                       what="A's ask result")
    assert [(r["message_id"], r["state"]) for r in results] == [(asked.message_id, "accepted")]
    beta.wait_idle()

    # The shim dies; Claude B keeps running.
    (old_shim,) = beta.shim_pids()
    killed_at = time.time()
    os.kill(old_shim, signal.SIGKILL)
    wait_for(lambda: not beta.shim_pids(), 10, what="B's shim gone")
    tried = unique("GO-NATIVE")
    world.mock.add_rules({
        "id": tried, "match": tried, "session": beta.session_id,
        "tool_use": {"name": "SendMessage", "input": {"to": f"uds:{asked.from_address}",
                                                      "message": "native while down"}},
        "then": {"text": "tried"}})
    beta.send_keys(f"{tried} answer natively")
    call = beta.wait_for_request(lambda e: e.get("rule") == tried, timeout=30)
    uid = call["response"][0]["id"]
    native = beta.wait_for_request(lambda e: uid in tool_result_blocks([e]), timeout=30)
    out = result_json(tool_result_blocks([native])[uid])
    assert out["success"] is False, out
    # The helper went with the shim and removed its socket (ADR 0020).
    assert "ECONNREFUSED" in out["message"] or "ENOENT" in out["message"], out
    beta.wait_idle()

    # The user reconnects the server: /mcp, crosstalk, Reconnect.
    t0 = time.time()
    reconnect_mcp(beta)
    after = wait_for(lambda: (d := beta.descriptor()) is not None
                     and d["pid"] in beta.shim_pids() and d, 15,
                     what="B registered by the new shim")
    timings.add("/mcp Reconnect -> new shim's descriptor", time.time() - t0)
    timings.add("shim SIGKILL -> B registered again (incl. the native attempt)",
                time.time() - killed_at)
    assert after["pid"] != old_shim
    assert after["agent_id"] == before["agent_id"] == agent_id_for(beta.session_id)
    assert after["uds_path"] == before["uds_path"]
    assert listen_path_for(after["uds_path"]) == asked.from_address  # the gate helper's

    # A native message to that address now reaches the new shim, which bounces it and tells
    # the model which message it may answer with reply.
    bounced = unique("GO-NATIVE")
    world.mock.add_rules({
        "id": bounced, "match": bounced, "session": beta.session_id,
        "tool_use": {"name": "SendMessage", "input": {"to": f"uds:{asked.from_address}",
                                                      "message": "native after reconnect"}},
        "then": {"text": "tried again"}})
    beta.send_keys(f"{bounced} answer natively")
    notice = beta.wait_for_request(lambda e: is_main(e) and any(
        "was not delivered" in s.body for s in peer_messages(e)), timeout=30)
    (text,) = [s.body for s in peer_messages(notice) if "was not delivered" in s.body]
    assert f"message_id={asked.message_id} from=alpha kind=ask" in text, text
    beta.wait_idle()

    # B's model answers with reply: A's model gets it once.
    go = unique("GO-REPLY")
    world.mock.add_rules({
        "id": go, "match": go, "session": beta.session_id,
        "tool_use": {"name": "mcp__crosstalk__reply",
                     "input": {"message_id": asked.message_id, "text": answer}},
        "then": {"text": "replied"}})
    beta.send_keys(f"{go} reply to alpha")
    call = beta.wait_for_request(lambda e: e.get("rule") == go, timeout=30)
    entry = alpha.wait_for_request(lambda e: is_main(e) and any(
        s.body == answer for s in peer_messages(e)), timeout=30)
    timings.add("B's reply tool_use -> A's model request", entry["t"] - call["t"])
    uid = call["response"][0]["id"]
    done = beta.wait_for_request(lambda e: uid in tool_result_blocks([e]), timeout=30)
    replied = result_json(tool_result_blocks([done])[uid])
    assert replied["state"] == "accepted", replied
    assert replied["in_reply_to"] == asked.message_id
    time.sleep(2.0)  # a second copy would show by now
    final = peer_messages(latest_main(alpha) or {})
    answers = [s for s in final if s.in_reply_to == asked.message_id]
    assert [(s.body, s.from_name, s.message_id) for s in answers] == [
        (answer, "beta", replied["message_id"])]
