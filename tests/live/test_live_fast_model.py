"""A fast model finds the message it was just shown and answers it (issue 13, §2), live.

The receiving model (the mock, :mod:`tests.live.support.fast`) answers the request carrying a
peer message with ``receive_message`` at once and then ``reply``s to the id the envelope named,
so its calls reach CrossTalk while the message may still be being delivered: Claude shows a
frame to its model ~100 ms after its inbox read it, and CrossTalk learns the outcome only when
its receipt grace (200 ms) has passed; Codex's model may be asked before ``turn/start`` has
answered. For an inform and an ask, to a Claude receiver and to a Codex receiver, the tests
assert what the tool results said (the message listed with its id, kind, sender and a
"being delivered" or delivered state; the reply accepted) and what the sender finally saw (its
send accepted, the answer in its own session, in reply to its message).
"""

from __future__ import annotations

import pytest

from tests.live.conftest import Timings
from tests.live.support.claude import World, is_main, last_user_text, request_text
from tests.live.support.codex import CodexWorld, output_json
from tests.live.support.codex import request_text as codex_text
from tests.live.support.extras import ENVELOPE, IN_REPLY_TO
from tests.live.support.fast import (
    claude_fast_model,
    claude_step,
    claude_tool_json,
    codex_fast_model,
    listed,
)
from tests.live.support.steps import call_and_output, model_calls, start_all, unique

pytestmark = pytest.mark.live

#: What a fast model may find its message in: still being delivered, or delivered already
#: (the race with the receipt grace or the ``turn/start`` answer is real; each run prints it).
SHOWN = {"delivering", "accepted"}
TOOL = {"inform": "mcp__crosstalk__send_message", "ask": "mcp__crosstalk__ask"}


@pytest.mark.parametrize("kind", ["inform", "ask"])
def test_a_claude_receiver_answers_at_once(world: World, timings: Timings, kind: str) -> None:
    alpha, beta = world.session("alpha"), world.session("beta")
    start_all(alpha, beta)
    beta.wait_idle()
    alpha.wait_descriptor()
    beta.wait_descriptor()
    text, answer, go = unique(f"LIVE-FAST-{kind}"), unique("LIVE-FAST-ANSWER"), unique("GO")
    world.mock.add_rules(
        {"id": "a-send", "match": go, "session": alpha.session_id,
         "tool_use": {"name": TOOL[kind], "input": {"to": "beta", "text": text}},
         "then": {"id": "a-sent", "text": "sent"}},
        claude_fast_model(beta.session_id, text, answer, "b"))

    alpha.send_keys(f"{go} message beta")
    send_call = claude_step(alpha, "a-send")
    _, sent = claude_tool_json(alpha, send_call)
    assert sent["state"] == "accepted", sent
    mid = sent["message_id"]

    shown = claude_step(beta, "b-receive")  # the request carrying the message
    timings.add(f"{kind}: A's tool_use -> B's model shown the message",
                shown["t"] - send_call["t"])
    assert text in last_user_text(shown)
    assert shown["captures"]["mid"] == mid
    reply_call, mailbox = claude_tool_json(beta, shown)
    timings.add(f"{kind}: B's model shown it -> receive_message result",
                reply_call["t"] - shown["t"])
    entry = listed(mailbox, mid)
    print(f"[fast claude {kind}] receive_message listed it as {entry['state']!r}")
    assert (entry["kind"], entry["from"]) == (kind, "alpha")
    assert entry["state"] in SHOWN, entry
    # While delivering the text is withheld (the model has it already); once accepted, shown.
    assert entry["text"] == ("" if entry["state"] == "delivering" else text), entry

    answered, replied = claude_tool_json(beta, claude_step(beta, "b-reply"))
    timings.add(f"{kind}: B's reply tool_use -> its result", answered["t"] - reply_call["t"])
    assert replied.get("error") is None, replied
    assert (replied["state"], replied["in_reply_to"]) == ("accepted", mid)

    # What the sender finally sees: the answer in its own session, in reply to its message
    # (it may join the turn A's own tool call is still in: anywhere in the request).
    at_a = alpha.wait_for_request(lambda e: is_main(e) and answer in request_text(e),
                                  after=send_call["seq"])
    (env,) = [m for m in ENVELOPE.finditer(request_text(at_a)) if m["body"] == answer]
    assert env["name"] == "beta"
    assert IN_REPLY_TO.search(env["meta"])[1] == mid  # type: ignore[index]
    assert env["id"] == replied["message_id"]


@pytest.mark.parametrize("kind", ["inform", "ask"])
def test_a_codex_receiver_answers_at_once(codex_world: CodexWorld, timings: Timings,
                                          kind: str) -> None:
    cw = codex_world
    x, y = cw.thread("xray"), cw.thread("yank")
    for thread in (x, y):  # each becomes a CrossTalk agent on its first call
        model_calls(cw, thread, "receive_message")
    y_desc = y.wait_descriptor()
    x.wait_descriptor()
    text, answer = unique(f"LIVE-FAST-{kind}"), unique("LIVE-FAST-ANSWER")
    cw.mock.add_rules(codex_fast_model(y.id, text, answer, "y"))

    after = cw.last_seq()
    tool = "send_message" if kind == "inform" else "ask"
    asked, output, _ = model_calls(cw, x, tool, to=y_desc["name"], text=text)
    sent = output_json(output)
    assert sent.get("state") == "accepted", sent
    mid = sent["message_id"]

    shown, received, took = call_and_output(y, "y-receive", after)
    timings.add(f"{kind}: X's function_call -> Y's model shown the message",
                shown["t"] - asked["t"])
    timings.add(f"{kind}: Y's receive_message call -> its output", took)
    assert text in codex_text(shown)
    entry = listed(output_json(received), mid)
    print(f"[fast codex {kind}] receive_message listed it as {entry['state']!r}")
    assert (entry["kind"], entry["from"]) == (kind, x.descriptor()["name"])
    assert entry["state"] in SHOWN, entry
    assert entry["text"] == ("" if entry["state"] == "delivering" else text), entry

    _, replied_out, took = call_and_output(y, "y-reply", after)
    timings.add(f"{kind}: Y's reply call -> its output", took)
    replied = output_json(replied_out)
    assert replied.get("error") is None, replied
    assert (replied["state"], replied["in_reply_to"]) == ("accepted", mid)

    # What the sender finally sees: the answer in X's thread, in reply to its message.
    at_x = x.wait_for_request(lambda e: e.get("kind") == "main" and answer in codex_text(e),
                              timeout=30, after=after)
    seen = codex_text(at_x)
    assert f'in-reply-to="{mid}"' in seen, seen[-1500:]
    assert f'message-id="{replied["message_id"]}"' in seen
