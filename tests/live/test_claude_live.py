"""CrossTalk with the real Claude Code 2.1.328 binary (tmux, loopback-only namespace, mock API).

What a test asserts is what the *model* got: the body of the next request the session sent to
our mock Messages API. Sessions share one CLAUDE_CONFIG_DIR, CROSSTALK_HOME and
XDG_RUNTIME_DIR, as on a real machine.
"""

from __future__ import annotations

import contextlib
import json
import re
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from crosstalk.harness.claude.gate import listen_path_for
from tests.live.conftest import Timings
from tests.live.support.claude import (
    World,
    is_main,
    last_user_text,
    tool_results,
    user_text_blocks,
    wait_for,
)
from tests.live.support.mock_api import message_text
from tests.live.support.steps import start_all, unique

pytestmark = pytest.mark.live

#: The envelope Claude shows its model for a peer message that CrossTalk injected.
ENVELOPE = re.compile(
    r'<cross-session-message from="uds:(?P<from>[^"]+)" from-name="(?P<name>[^"]+)"'
    r'(?: from-mode="(?P<mode>[^"]+)")?>\n'
    r"\[crosstalk message-id=(?P<id>\S+) kind=(?P<kind>\w+)[^\]\n]*\]\n"
    r"(?P<body>.*?)\n</cross-session-message>", re.S)


def result_json(block: dict[str, Any]) -> dict[str, Any]:
    """The JSON object a CrossTalk tool returned, as the model saw it in a tool_result."""
    text = message_text({"content": block.get("content")})
    data = json.loads(text)
    assert isinstance(data, dict), text
    return data


def peer_turn(entry: dict[str, Any], text: str) -> str:
    """The text block of the request's last user message that carries ``text``: Claude's
    wrapper around a peer message."""
    blocks = [b for b in user_text_blocks(entry) if text in b]
    assert len(blocks) == 1, user_text_blocks(entry)
    return blocks[0]


def test_registered_at_startup(world: World, timings: Timings) -> None:
    """A Claude session with CrossTalk is a registered agent before its model does anything."""
    t0 = time.monotonic()
    alpha = world.session("alpha").start()
    timings.add("claude start -> registry record + prompt", time.monotonic() - t0)
    record = alpha.record()
    assert record is not None

    desc = alpha.wait_descriptor(timeout=15)
    timings.add("claude start -> CrossTalk descriptor", time.monotonic() - t0)

    assert desc["harness"] == "claude"
    assert desc["session_ref"] == record["sessionId"]
    assert desc["harness_pid"] == alpha.pid
    # Claude first records a name derived from the cwd, then the --name (research §10); the
    # descriptor follows it.
    assert alpha.wait_named(timeout=10)["agent_id"] == desc["agent_id"]
    assert (alpha.record() or {}).get("name") == "alpha"
    uds = Path(desc["uds_path"])
    assert stat.S_ISSOCK(uds.stat().st_mode), f"{uds} is not a socket"
    # The shim that registered it is Claude's own child.
    assert desc["pid"] in alpha.shim_pids()
    # No model turn was needed.
    assert alpha.main_requests() == []

    # And /exit unpublishes it: Claude's record and our descriptor go.
    descriptor_file = world.state / "agents" / f"{desc['agent_id']}.json"
    t1 = time.monotonic()
    assert alpha.stop() == []
    wait_for(lambda: not descriptor_file.exists() and not alpha.record_path.exists(), 10,
             what="record and descriptor removed after /exit")
    timings.add("/exit -> record and descriptor gone", time.monotonic() - t1)


def test_exit_removes_ingress_socket_and_key(world: World, timings: Timings) -> None:
    """/exit leaves nothing of the agent in the runtime dir: no socket, no key file."""
    alpha = world.session("alpha")
    start_all(alpha)
    uds = Path(alpha.wait_descriptor()["uds_path"])
    key = uds.with_suffix(".key")
    assert uds.exists()
    assert key.exists()
    t1 = time.monotonic()
    assert alpha.stop() == []
    wait_for(lambda: not alpha.record_path.exists(), 10, what="claude record removed")
    with contextlib.suppress(TimeoutError):
        wait_for(lambda: not uds.exists() and not key.exists(), 5,
                 what="uds socket and key removed after /exit")
    timings.add("/exit -> (uds socket and key gone, or 5 s)", time.monotonic() - t1)
    left = [p.name for p in (uds, key) if p.exists()]
    assert left == [], "left behind after /exit"


@pytest.mark.seed(19)
def test_idle_session_wakes_on_crosstalk_send(world: World, timings: Timings) -> None:
    """Seed 19, unverified-sender half (CQ3): ``crosstalk send`` into an idle Claude session
    starts a turn, and the model sees the text in Claude's peer-message wrapper."""
    alpha = world.session("alpha")
    start_all(alpha)
    alpha.wait_idle()
    name = alpha.wait_named()["name"]
    text = unique("LIVE-IDLE-WAKE")
    after = alpha.last_seq()

    t0 = time.time()
    done = world.crosstalk("send", "--json", name, text)
    sent_in = time.time() - t0
    assert done.returncode == 0, done.stderr
    ack = json.loads(done.stdout)
    assert ack["state"] == "accepted", ack
    timings.add("crosstalk send (CLI process, incl. start-up) -> ack", sent_in)

    entry = alpha.wait_for_request(lambda e: is_main(e) and text in last_user_text(e),
                                   timeout=30, after=after)
    timings.add("crosstalk send -> model request (idle wake)", entry["t"] - t0)
    seen = peer_turn(entry, text)
    assert seen.startswith("Another Claude session sent a message:\n"), seen[:200]
    envelope = ENVELOPE.search(seen)
    assert envelope is not None, seen[:600]
    assert envelope["body"] == text
    assert envelope["id"] == ack["message_id"]
    # The frame is written by A's gate helper, from its own listener (ADR 0020).
    assert envelope["from"] == listen_path_for(alpha.wait_descriptor()["uds_path"])


@pytest.mark.seed(1)
def test_claude_to_claude_through_the_shim(world: World, timings: Timings) -> None:
    """Seed 1, first half: A's model calls ``mcp__crosstalk__send_message`` to B by name; A's
    tool result says accepted, and B's model gets the text in a CrossTalk envelope from A."""
    alpha, beta = world.session("alpha"), world.session("beta")
    start_all(alpha, beta)
    beta.wait_idle()
    a_desc, b_desc = alpha.wait_descriptor(), beta.wait_descriptor()
    text = unique("LIVE-A-TO-B")
    trigger = unique("GO-SEND")
    world.mock.add_rules({
        "id": "a-sends", "match": trigger, "session": alpha.session_id,
        "tool_use": {"name": "mcp__crosstalk__send_message",
                     "input": {"to": b_desc["name"], "text": text}},
        "then": {"text": "sent it"}})
    after = alpha.last_seq()

    alpha.send_keys(f"{trigger} please message beta")
    call = alpha.wait_for_request(lambda e: e.get("rule") == "a-sends", timeout=30,
                                  after=after)
    result_entry = alpha.wait_for_request(lambda e: bool(tool_results(e)), timeout=30,
                                          after=call["seq"])
    (block,) = tool_results(result_entry)
    assert block["tool_use_id"] == call["response"][0]["id"]
    assert not block.get("is_error"), block
    result = result_json(block)
    assert result["state"] == "accepted", result
    timings.add("A's tool_use -> A's tool_result (send_message call)",
                result_entry["t"] - call["t"])

    entry = beta.wait_for_request(lambda e: is_main(e) and text in last_user_text(e),
                                  timeout=30)
    timings.add("A's tool_use -> B's model request", entry["t"] - call["t"])
    seen = peer_turn(entry, text)
    assert seen.startswith("Another Claude session sent a message:\n"), seen[:200]
    envelope = ENVELOPE.search(seen)
    assert envelope is not None, seen[:600]
    assert envelope["name"] == a_desc["name"]
    # The receiving shim injects as its own agent's uds ingress (a native reply comes back to
    # it, where it is bounced), naming the sender in from-name.
    assert envelope["from"] == listen_path_for(b_desc["uds_path"])
    assert envelope["mode"] == "prompting"
    assert envelope["id"] == result["message_id"]
    assert envelope["kind"] == "inform"
    assert envelope["body"] == text
