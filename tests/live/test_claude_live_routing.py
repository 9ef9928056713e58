"""Routing between real Claude Code 2.1.328 sessions: native replies bounced, the reply tool,
sessions without CrossTalk, and ``/clear``.

Each scenario asserts what the *models* got: the bodies of the sessions' requests to our mock
Messages API (the envelopes, the bounce, the tool results), plus CrossTalk's journal where the
seed asks for "journaled". The mock plays each model with rules; a rule's ``capture`` lets the
model use what it was shown (the envelope's ``from`` address, the ids a bounce lists) and its
``gate`` holds a model's answer until the test lets it go (see ``support/mock_api.py``).

Claude's own SendMessage is a deferred tool (absent from ``tools``), yet a ``tool_use`` named
``SendMessage`` is executed directly, with no ToolSearch first and no permission prompt in
manual mode (2.1.328, found with this suite).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from typing import Any

import pytest

from crosstalk.harness.claude.gate import listen_path_for
from tests.live.conftest import Timings
from tests.live.support.claude import (
    Entry,
    LiveClaude,
    World,
    is_main,
    last_user_text,
    request_text,
    tool_results,
    wait_for,
)
from tests.live.support.mock_api import message_text
from tests.live.support.steps import start_all, unique

pytestmark = pytest.mark.live

#: A CrossTalk envelope as Claude shows it to its model; ``meta`` is the first body line's
#: fields (``message-id=… kind=… in-reply-to=…``).
ENVELOPE = re.compile(
    r'<cross-session-message from="uds:(?P<from>[^"]+)" from-name="(?P<name>[^"]+)"'
    r'(?: from-mode="(?P<mode>[^"]+)")?>\n'
    r"\[crosstalk (?P<meta>[^\]\n]*)\]\n"
    r"(?P<body>.*?)\n</cross-session-message>", re.S)
#: The address in an envelope, as a model would copy it into SendMessage's ``to``.
FROM_ADDRESS = r'<cross-session-message from="(uds:[^"]+)"'
BOUNCED = "was not delivered"
SEND = "mcp__crosstalk__send_message"
ASK = "mcp__crosstalk__ask"
REPLY = "mcp__crosstalk__reply"
RECEIVE = "mcp__crosstalk__receive_message"
LIST = "mcp__crosstalk__list_agents"


def meta(envelope: re.Match[str]) -> dict[str, str]:
    return dict(part.split("=", 1) for part in envelope["meta"].split())


def envelopes(text: str) -> list[re.Match[str]]:
    return list(ENVELOPE.finditer(text))


def envelope_with(entry: Entry, body: str) -> re.Match[str]:
    """The one envelope in the request's last user message whose body is ``body``."""
    found = [m for m in envelopes(last_user_text(entry)) if m["body"] == body]
    assert len(found) == 1, last_user_text(entry)[-2000:]
    return found[0]


def agent_id(session_id: str) -> str:
    """Seed §4: the first 16 hex of sha256("<harness>:<session_ref>")."""
    return hashlib.sha256(f"claude:{session_id}".encode()).hexdigest()[:16]


def step(claude: LiveClaude, rule_id: str, timeout: float = 30.0) -> Entry:
    """The request of ``claude`` that rule ``rule_id`` answered (the model's move)."""
    return claude.wait_for_request(lambda e: e.get("rule") == rule_id, timeout=timeout)


def tool_use(entry: Entry) -> dict[str, Any]:
    (block,) = [b for b in entry["response"] if b["type"] == "tool_use"]
    return dict(block)


def tool_result(claude: LiveClaude, call: Entry, timeout: float = 30.0
                ) -> tuple[Entry, dict[str, Any]]:
    """The request carrying the result of the tool_use ``call`` answered with, and that result
    as the model saw it (JSON)."""
    use_id = tool_use(call)["id"]

    def carries(e: Entry) -> bool:
        return any(b.get("tool_use_id") == use_id for b in tool_results(e))
    entry = claude.wait_for_request(carries, timeout=timeout, after=call["seq"])
    (block,) = [b for b in tool_results(entry) if b.get("tool_use_id") == use_id]
    assert not block.get("is_error"), block
    text = message_text({"content": block.get("content")})
    data = json.loads(text)
    assert isinstance(data, dict), text
    return entry, data


def never_saw(claude: LiveClaude, *texts: str) -> None:
    """None of ``texts`` appears anywhere in any request ``claude`` ever sent."""
    for entry in claude.requests():
        seen = json.dumps(entry.get("body"), ensure_ascii=False)
        for text in texts:
            assert text not in seen, f"{claude.name} got {text!r} (request {entry['seq']})"


def journal_texts(world: World, agent: str) -> list[str]:
    return [str(r.get("text")) for r in world.journal(agent) if r.get("text")]


def bounced_records(world: World, agent: str) -> list[dict[str, Any]]:
    return [r for r in world.journal(agent)
            if r.get("subject") == "message" and r.get("state") == "bounced"]


# -- seed 1 + 11: a native reply is bounced; the reply tool routes --------------------------


@pytest.mark.seed(1)
@pytest.mark.seed(11)
def test_native_reply_is_bounced_and_the_reply_tool_routes(world: World,
                                                           timings: Timings) -> None:
    """A asks B; B's model answers with Claude's own SendMessage to the envelope's address:
    the frame reaches B's own shim, is journaled bounced, B's model is told (with A's message
    id) and nothing reaches A. B's model then calls ``reply`` with the id the bounce listed and
    A's model gets the answer, in-reply-to its ask."""
    t_test = time.monotonic()
    alpha, beta = world.session("alpha"), world.session("beta")
    start_all(alpha, beta)
    beta.wait_idle()
    a_desc, b_desc = alpha.wait_descriptor(), beta.wait_descriptor()
    question, native, answer = unique("LIVE-Q"), unique("LIVE-NATIVE"), unique("LIVE-ANSWER")
    trigger = unique("GO-ASK")
    world.mock.add_rules(
        {"id": "a-ask", "match": trigger, "session": alpha.session_id,
         "tool_use": {"name": ASK, "input": {"to": "beta", "text": question}},
         "then": {"id": "a-asked", "text": "asked beta"}},
        # B's model answers natively, to the address the envelope named; it "thinks" until
        # the test has seen A's ask accepted (a native reply within ~0.35 s of the injection
        # gets a bounce that lists no open message: the ask is still "dispatching").
        {"id": "b-native", "match": question, "session": beta.session_id, "gate": "native",
         "capture": {"addr": FROM_ADDRESS},
         "tool_use": {"name": "SendMessage", "input": {"to": "{{addr}}", "message": native}},
         "then": {"id": "b-native-sent", "text": "answered natively"}},
        # The bounce: B's model reads its mailbox, then replies to the id the bounce lists.
        {"id": "b-mailbox", "match": BOUNCED, "session": beta.session_id,
         "capture": {"mid": r"- message_id=(\S+) "},
         "tool_use": {"name": RECEIVE, "input": {}},
         "then": {"id": "b-reply",
                  "tool_use": {"name": REPLY, "input": {"message_id": "{{mid}}",
                                                        "text": answer}},
                  "then": {"id": "b-replied", "text": "replied"}}})

    alpha.send_keys(f"{trigger} ask beta")
    ask_call = step(alpha, "a-ask")
    _, asked = tool_result(alpha, ask_call)
    assert asked["state"] == "accepted", asked
    ask_id = asked["message_id"]
    timings.add("A's ask tool_use -> A's tool_result", time.time() - ask_call["t"])

    # B's model got the ask in an envelope whose address is B's own shim (research §6).
    got = beta.wait_for_request(lambda e: is_main(e) and question in last_user_text(e))
    timings.add("A's ask tool_use -> B's model request", got["t"] - ask_call["t"])
    env = envelope_with(got, question)
    assert env["name"] == "alpha"
    # Written by B's gate helper, from its own listener (ADR 0020).
    assert env["from"] == listen_path_for(b_desc["uds_path"])
    assert meta(env)["message-id"] == ask_id
    assert meta(env)["kind"] == "ask"
    assert got["rule"] == "b-native"

    # Seed 11: the shim has no record in Claude's registry (no sessions/<pid>.json names its
    # socket), so Claude's SendMessage finds no key for it: the frame comes unauthenticated
    # and the shim knows the sender by its peer pid.
    records = [json.loads(p.read_text())
               for p in (world.config_dir / "sessions").glob("*.json")]
    assert env["from"] not in [r.get("messagingSocketPath") for r in records]
    digest = hashlib.sha256(env["from"].encode()).hexdigest()
    assert list((world.config_dir / "sessions").glob(f"*.{digest}.key")) == []

    t_native = time.time()
    world.mock.open_gate("native")
    native_call = step(beta, "b-native")
    sent_to = tool_use(native_call)["input"]["to"]
    assert sent_to == f"uds:{env['from']}"
    _, sent = tool_result(beta, native_call)
    assert sent["success"] is True, sent  # Claude believes it delivered the frame

    bounce = beta.wait_for_request(lambda e: is_main(e) and BOUNCED in last_user_text(e),
                                   after=native_call["seq"])
    timings.add("B's native SendMessage -> B's model gets the bounce", bounce["t"] - t_native)
    (notice,) = [m for m in envelopes(last_user_text(bounce)) if BOUNCED in m["body"]]
    assert f'"{native}"' in notice["body"]  # quotes the first line of the bounced frame
    assert f"- message_id={ask_id} from=alpha kind=ask" in notice["body"]
    assert bounce["rule"] == "b-mailbox"
    assert bounce["captures"]["mid"] == ask_id

    # Journaled bounced at B's shim, sent by B itself over the uds ingress.
    (rec,) = bounced_records(world, b_desc["agent_id"])
    assert rec["text"] == native
    assert rec["reason"] == "native_reply_not_forwarded"
    assert rec["sender"]["agent_id"] == b_desc["agent_id"]
    assert rec["sender"]["ingress"] == "uds"
    # B's own Claude sent it to its gate helper, which handed it to B's shim: the shim
    # relays it into its own ingress, so the connecting pid on record is the shim's (ADR 0020).
    assert rec["sender"]["peer_pid"] in beta.shim_pids()

    # B's mailbox (its receive_message call) shows the bounced frame and the open ask.
    mailbox_call = step(beta, "b-mailbox")
    _, mailbox = tool_result(beta, mailbox_call)
    by_id = {e["message_id"]: e for e in mailbox["entries"]}
    assert by_id[ask_id]["state"] == "accepted"
    assert by_id[ask_id]["ask"] == "open"
    assert [e["text"] for e in mailbox["entries"] if e["state"] == "bounced"] == [native]

    # The reply tool with the listed id: A's model gets the answer, in reply to its ask.
    reply_call = step(beta, "b-reply")
    assert tool_use(reply_call)["input"]["message_id"] == ask_id
    _, replied = tool_result(beta, reply_call)
    assert replied["state"] == "accepted", replied
    at_a = alpha.wait_for_request(lambda e: is_main(e) and answer in last_user_text(e),
                                  after=ask_call["seq"])
    timings.add("B's reply tool_use -> A's model request", at_a["t"] - reply_call["t"])
    env = envelope_with(at_a, answer)
    assert env["name"] == "beta"
    assert meta(env)["in-reply-to"] == ask_id
    assert meta(env)["kind"] == "inform"  # a reply is an inform in reply to the ask
    assert meta(env)["message-id"] == replied["message_id"]

    # Nothing of the native answer ever reached A (its model, or its shim's journal).
    never_saw(alpha, native)
    assert native not in journal_texts(world, a_desc["agent_id"])
    timings.add("whole scenario", time.monotonic() - t_test)


# -- seed 5 + 13: two askers, one native answer, replies reach only their asker -------------


@pytest.mark.seed(5)
@pytest.mark.seed(13)
def test_two_asks_one_bounce_and_replies_reach_only_their_asker(world: World,
                                                                timings: Timings) -> None:
    """A and C both ask B. B answers natively once: one bounce listing both ids, nothing
    forwarded, both asks still open; a native answer to the bounce is bounced again. The
    reply tool naming A's id reaches A only; naming C's id, C only."""
    t_test = time.monotonic()
    alpha, beta, gamma = world.session("alpha"), world.session("beta"), world.session("gamma")
    start_all(alpha, beta, gamma)
    beta.wait_idle()
    descs = {c.name: c.wait_descriptor() for c in (alpha, beta, gamma)}
    q_a, q_c = unique("LIVE-QA"), unique("LIVE-QC")
    native, again = unique("LIVE-NATIVE"), unique("LIVE-NATIVE-AGAIN")
    ans_a, ans_c = unique("LIVE-ANS-A"), unique("LIVE-ANS-C")
    go_a, go_c = unique("GO-A"), unique("GO-C")
    world.mock.add_rules(
        {"id": "a-ask", "match": go_a, "session": alpha.session_id,
         "tool_use": {"name": ASK, "input": {"to": "beta", "text": q_a}},
         "then": {"text": "asked"}},
        {"id": "c-ask", "match": go_c, "session": gamma.session_id,
         "tool_use": {"name": ASK, "input": {"to": "beta", "text": q_c}},
         "then": {"text": "asked"}},
        {"id": "b-noted", "match": q_a, "session": beta.session_id, "text": "noted"},
        {"id": "b-native", "match": q_c, "session": beta.session_id, "gate": "native",
         "capture": {"addr": FROM_ADDRESS},
         "tool_use": {"name": "SendMessage", "input": {"to": "{{addr}}", "message": native}},
         "then": {"text": "answered natively"}},
        # A native answer to the bounce itself, to the address the bounce came from.
        {"id": "b-native-again", "match": BOUNCED, "session": beta.session_id,
         "capture": {"addr": FROM_ADDRESS},
         "tool_use": {"name": "SendMessage", "input": {"to": "{{addr}}", "message": again}},
         "then": {"text": "answered the bounce natively"}})

    alpha.send_keys(f"{go_a} ask beta")
    a_call = step(alpha, "a-ask")
    _, from_a = tool_result(alpha, a_call)
    assert from_a["state"] == "accepted", from_a
    beta.wait_for_request(lambda e: e.get("rule") == "b-noted")
    beta.wait_idle()
    gamma.send_keys(f"{go_c} ask beta")
    c_call = step(gamma, "c-ask")
    _, from_c = tool_result(gamma, c_call)
    assert from_c["state"] == "accepted", from_c
    id_a, id_c = from_a["message_id"], from_c["message_id"]
    got_c = step(beta, "b-native")
    timings.add("C's ask tool_use -> B's model request", got_c["t"] - c_call["t"])
    assert meta(envelope_with(got_c, q_c))["message-id"] == id_c

    # After the (second) bounce B's model replies with the reply tool: to A, then to C (held
    # until the test has looked at the asks).
    world.mock.add_rules(
        {"id": "b-replies", "match": BOUNCED, "session": beta.session_id, "gate": "replies",
         "tool_use": {"name": REPLY, "input": {"message_id": id_a, "text": ans_a}},
         "then": {"id": "b-reply-c",
                  "tool_use": {"name": REPLY, "input": {"message_id": id_c, "text": ans_c}},
                  "then": {"text": "replied to both"}}})

    t_native = time.time()
    world.mock.open_gate("native")
    native_call = step(beta, "b-native")
    _, sent = tool_result(beta, native_call)
    assert sent["success"] is True, sent
    bounce = beta.wait_for_request(lambda e: is_main(e) and BOUNCED in last_user_text(e),
                                   after=native_call["seq"])
    timings.add("B's native SendMessage -> B's model gets the bounce", bounce["t"] - t_native)
    (notice,) = [m for m in envelopes(last_user_text(bounce)) if BOUNCED in m["body"]]
    listed = re.findall(r"^- message_id=(\S+) from=(\S+) kind=(\w+)$", notice["body"], re.M)
    # One bounce listing both open asks, newest first.
    assert listed == [(id_c, "gamma", "ask"), (id_a, "alpha", "ask")], notice["body"]
    assert bounce["rule"] == "b-native-again"
    assert tool_use(bounce)["input"]["to"] == f"uds:{descs['beta']['uds_path']}"

    # The native answer to the bounce is bounced again, not delivered anywhere.
    second = beta.wait_for_request(lambda e: is_main(e) and BOUNCED in last_user_text(e),
                                   after=bounce["seq"])
    assert f'"{again}"' in last_user_text(second)
    assert second["rule"] == "b-replies"
    (notice,) = [m for m in envelopes(last_user_text(second)) if BOUNCED in m["body"]]
    assert re.findall(r"^- message_id=(\S+) ", notice["body"], re.M) == [id_c, id_a]
    b_id = descs["beta"]["agent_id"]
    assert [r["text"] for r in bounced_records(world, b_id)] == [native, again]
    # Both asks are still open: nothing answered them.
    asks = {r["id"]: r["state"] for r in world.journal(b_id) if r.get("subject") == "ask"}
    assert asks == {id_a: "open", id_c: "open"}
    tasks = {r["id"]: r["state"] for r in world.journal(b_id) if r.get("subject") == "task"}
    assert sorted(tasks.values()) == ["working", "working"], tasks
    world.mock.open_gate("replies")

    # The reply tool naming A's message: A gets it, C does not.
    reply_a = step(beta, "b-replies")
    _, done_a = tool_result(beta, reply_a)
    assert done_a["state"] == "accepted", done_a
    reply_c = step(beta, "b-reply-c")
    _, done_c = tool_result(beta, reply_c)
    assert done_c["state"] == "accepted", done_c
    at_a = alpha.wait_for_request(lambda e: is_main(e) and ans_a in last_user_text(e))
    at_c = gamma.wait_for_request(lambda e: is_main(e) and ans_c in last_user_text(e))
    timings.add("B's reply tool_use -> A's model request", at_a["t"] - reply_a["t"])
    timings.add("B's reply tool_use -> C's model request", at_c["t"] - reply_c["t"])
    assert meta(envelope_with(at_a, ans_a))["in-reply-to"] == id_a
    assert meta(envelope_with(at_c, ans_c))["in-reply-to"] == id_c
    time.sleep(1.0)  # a misrouted copy would have arrived by now (replies take < 1 s)
    never_saw(alpha, ans_c, native, again)
    never_saw(gamma, ans_a, native, again)
    for name in ("alpha", "gamma"):
        texts = journal_texts(world, descs[name]["agent_id"])
        assert native not in texts
        assert again not in texts
    asks = {r["id"]: r["state"] for r in world.journal(b_id) if r.get("subject") == "ask"}
    assert asks == {id_a: "answered", id_c: "answered"}, asks
    tasks = {r["id"]: r["state"] for r in world.journal(b_id) if r.get("subject") == "task"}
    assert sorted(tasks.values()) == ["completed", "completed"], tasks
    timings.add("whole scenario", time.monotonic() - t_test)


# -- seed 26 (Claude half): a session without CrossTalk ---------------------------------------


@pytest.mark.seed(26)
def test_session_without_crosstalk_gets_informs_and_cannot_send(world: World,
                                                                timings: Timings) -> None:
    """D runs without CrossTalk. A lists it (``crosstalk: false``), its inform lands in D's
    model, its ask is refused (``native_inform_only``). D's own SendMessage to A's agent
    address is refused by A's shim: D is not a registered agent; nothing reaches A."""
    t_test = time.monotonic()
    alpha, delta = world.session("alpha"), world.session("delta", crosstalk=False)
    start_all(alpha)
    delta.start()
    wait_for(lambda: (delta.record() or {}).get("name") == "delta", 10, what="delta named")
    delta.wait_idle()
    a_desc = alpha.wait_descriptor()
    inform, question, native = unique("LIVE-INFORM"), unique("LIVE-ASK"), unique("LIVE-FROM-D")
    go, go_d, go_check = unique("GO-LIST"), unique("GO-D"), unique("GO-CHECK")
    world.mock.add_rules(
        {"id": "a-list", "match": go, "session": alpha.session_id,
         "tool_use": {"name": LIST, "input": {}},
         "then": {"id": "a-inform", "tool_use": {"name": SEND, "input": {
             "to": "delta", "text": inform}},
             "then": {"id": "a-ask", "tool_use": {"name": ASK, "input": {
                 "to": "delta", "text": question}},
                 "then": {"text": "done"}}}},
        # D's model answers the inform natively, to the address its envelope names.
        {"id": "d-native", "match": go_d, "session": delta.session_id, "scope": "any",
         "capture": {"addr": FROM_ADDRESS},
         "tool_use": {"name": "SendMessage", "input": {"to": "{{addr}}", "message": native}},
         "then": {"text": "sent natively"}},
        {"id": "a-check", "match": go_check, "session": alpha.session_id,
         "tool_use": {"name": RECEIVE, "input": {}},
         "then": {"text": "checked"}})

    alpha.send_keys(f"{go} list and write to delta")
    _, listed = tool_result(alpha, step(alpha, "a-list"))
    rows = [r for r in listed["agents"] if r["name"] == "delta"]
    assert len(rows) == 1, listed
    assert rows[0]["crosstalk"] is False
    assert rows[0]["reachable"] is True
    assert rows[0]["agent_id"] == agent_id(delta.session_id)

    inform_call = step(alpha, "a-inform")
    _, told = tool_result(alpha, inform_call)
    assert told["state"] == "accepted", told
    assert "without CrossTalk" in told["hint"]
    got = delta.wait_for_request(lambda e: is_main(e) and inform in last_user_text(e))
    timings.add("A's send_message tool_use -> D's model request", got["t"] - inform_call["t"])
    env = envelope_with(got, inform)
    assert env["name"] == "alpha"
    assert meta(env) == {"message-id": told["message_id"], "kind": "inform"}
    # D has no shim: the address it is shown is A's own agent address.
    assert env["from"] == a_desc["uds_path"]

    _, asked = tool_result(alpha, step(alpha, "a-ask"))
    assert (asked["state"], asked["reason"]) == ("rejected", "native_inform_only"), asked
    assert "inform" in asked["hint"]
    delta.wait_idle()

    # D's model sends natively to A's agent address: the frame is refused (no state).
    a_journal = len(world.journal(a_desc["agent_id"]))
    delta.send_keys(f"{go_d} answer alpha")
    d_call = step(delta, "d-native")
    assert tool_use(d_call)["input"]["to"] == f"uds:{a_desc['uds_path']}"
    _, sent = tool_result(delta, d_call)
    assert sent["success"] is True, sent  # Claude cannot tell: the shim closes, says nothing
    alpha.wait_idle()
    after = alpha.last_seq()
    time.sleep(2.0)  # an admitted frame reaches the model in < 1 s (see the timings)
    alpha.send_keys(f"{go_check} any mail?")
    _, mailbox = tool_result(alpha, step(alpha, "a-check"))
    assert all(native not in (e.get("text") or "") for e in mailbox["entries"]), mailbox
    assert [e for e in alpha.requests() if e["seq"] > after and native in request_text(e)] == []
    never_saw(alpha, native)
    assert len(world.journal(a_desc["agent_id"])) == a_journal  # nothing journaled
    timings.add("whole scenario", time.monotonic() - t_test)


# -- seed 32: /clear --------------------------------------------------------------------------


@pytest.mark.seed(32)
def test_clear_keeps_the_name_and_routes_to_the_new_conversation(world: World,
                                                                 timings: Timings) -> None:
    """``/clear`` in B: a new sessionId, B's old agent leaves the directory and a new one takes
    the same name (no fallback suffix); A lists B once, with the new agent_id, and a message
    to B's name reaches B's new conversation."""
    t_test = time.monotonic()
    alpha, beta = world.session("alpha"), world.session("beta")
    start_all(alpha, beta)
    beta.wait_idle()
    old_sid = beta.session_id
    old_desc = beta.wait_descriptor()
    assert old_desc["agent_id"] == agent_id(old_sid)
    before, after_clear = unique("LIVE-BEFORE-CLEAR"), unique("LIVE-AFTER-CLEAR")
    go1, go2 = unique("GO-BEFORE"), unique("GO-AFTER")
    world.mock.add_rules(
        {"id": "a-before", "match": go1, "session": alpha.session_id,
         "tool_use": {"name": SEND, "input": {"to": "beta", "text": before}},
         "then": {"text": "sent"}},
        {"id": "a-list", "match": go2, "session": alpha.session_id,
         "tool_use": {"name": LIST, "input": {}},
         "then": {"id": "a-old", "tool_use": {"name": SEND, "input": {
             "to": old_desc["agent_id"], "text": "old agent?"}},
             "then": {"id": "a-after", "tool_use": {"name": SEND, "input": {
                 "to": "beta", "text": after_clear}},
                 "then": {"text": "sent again"}}}})

    # The old conversation has a message in it.
    alpha.send_keys(f"{go1} tell beta")
    beta.wait_for_request(lambda e: is_main(e) and before in last_user_text(e))
    beta.wait_idle()
    alpha.wait_idle()

    t0 = time.monotonic()
    beta.send_keys("/clear")

    def new_session() -> str | None:
        sid = (beta.record() or {}).get("sessionId")
        return str(sid) if sid and sid != old_sid else None
    new_sid: str = wait_for(new_session, 10, what="a new sessionId after /clear")
    timings.add("/clear -> new sessionId in the record", time.monotonic() - t0)
    new_agent = agent_id(new_sid)

    def switched() -> bool:
        ids = [d["agent_id"] for d in world.descriptors()]
        return old_desc["agent_id"] not in ids and new_agent in ids
    try:
        wait_for(switched, 10, what="old descriptor gone, new one published")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}: {world.descriptors()}") from None
    timings.add("/clear -> descriptors switched to the new agent", time.monotonic() - t0)
    betas = [d for d in world.descriptors() if d.get("session_ref") == new_sid]
    assert [(d["name"], d["agent_id"]) for d in betas] == [("beta", new_agent)]
    assert betas[0]["uds_path"] != old_desc["uds_path"]  # the address is per agent

    alpha.send_keys(f"{go2} list and write to beta")
    _, listed = tool_result(alpha, step(alpha, "a-list"))
    rows = [r for r in listed["agents"] if r["name"].startswith("beta")]
    assert [(r["name"], r["agent_id"], r["crosstalk"]) for r in rows] == [
        ("beta", new_agent, True)], listed
    assert old_desc["agent_id"] not in [r.get("agent_id") for r in listed["agents"]]
    _, gone = tool_result(alpha, step(alpha, "a-old"))
    assert (gone["state"], gone["reason"]) == ("rejected", "no_such_agent"), gone

    send_call = step(alpha, "a-after")
    _, sent = tool_result(alpha, send_call)
    assert sent["state"] == "accepted", sent
    got = beta.wait_for_request(lambda e: is_main(e) and after_clear in last_user_text(e))
    timings.add("A's send_message tool_use -> B's model request (after /clear)",
                got["t"] - send_call["t"])
    assert got["session"] == new_sid  # B's new conversation
    assert before not in request_text(got)  # which does not carry the old one
    env = envelope_with(got, after_clear)
    assert meta(env)["message-id"] == sent["message_id"]
    assert env["from"] == listen_path_for(betas[0]["uds_path"])
    never_saw(beta, "old agent?")
    timings.add("whole scenario", time.monotonic() - t_test)
