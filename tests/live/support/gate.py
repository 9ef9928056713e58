"""Helpers for the inbound-gate scenarios (``test_claude_live_gate.py``, ADR 0020): a sender
model's one ``send_message``, Claude's user settings, the receiver's journal for one message,
and the A2A task as the *sender* sees it (GetTask with the sender's own token, run inside the
namespace, where the receiver's A2A listener is).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tests.live.support.claude import LiveClaude, World, is_main, wait_for
from tests.live.support.extras import (
    journal,
    key,
    peer_messages,
    result_json,
    tool_result_blocks,
    wait_screen,
)
from tests.live.support.steps import unique

#: A session in bypassPermissions mode (research §7; ``IS_SANDBOX=1`` because we run as root).
BYPASS: dict[str, Any] = {"permission_mode": "bypassPermissions",
                          "extra_args": ("--dangerously-skip-permissions",)}
HOLD_DIALOG = ("Held message from another session", "Deliver this message to Claude")


def user_settings(world: World, **changes: Any) -> None:
    """Merge ``changes`` into the world's user ``settings.json`` (every session reads it)."""
    path = world.config_dir / "settings.json"
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data, indent=1))


def send_once(world: World, sender: LiveClaude, to: str,
              text: str) -> tuple[dict[str, Any], float]:
    """The sender's model calls send_message once: its tool result, and the call's latency."""
    trigger = unique("GO-SEND")
    world.mock.add_rules({
        "id": trigger, "match": trigger, "session": sender.session_id,
        "tool_use": {"name": "mcp__crosstalk__send_message", "input": {"to": to, "text": text}},
        "then": {"text": "sent it"}})
    after = sender.last_seq()
    sender.send_keys(f"{trigger} message {to}")
    call = sender.wait_for_request(lambda e: e.get("rule") == trigger, timeout=30, after=after)
    done = sender.wait_for_request(lambda e: call["response"][0]["id"] in tool_result_blocks([e]),
                                   timeout=60, after=call["seq"])
    block = tool_result_blocks([done])[call["response"][0]["id"]]
    assert not block.get("is_error"), block
    return result_json(block), done["t"] - call["t"]


def model_saw(claude: LiveClaude, text: str) -> int:
    """In how many of the session's main requests the model was shown ``text`` as a peer
    message, counted in the last one (a request repeats the earlier turns)."""
    mains = [e for e in claude.requests() if is_main(e)]
    if not mains:
        return 0
    return sum(s.body == text for s in peer_messages(mains[-1]))


def message_records(world: World, agent_id: str, message_id: str) -> list[dict[str, Any]]:
    """The receiver's journal records about one message: its states and its receipts."""
    return [r for r in journal(world, agent_id)
            if r.get("id") == message_id and r.get("subject") in ("message", "receipt")]


def task_as_sender(world: World, sender: LiveClaude, receiver: LiveClaude,
                   message_id: str) -> dict[str, Any]:
    """The A2A task that carries ``message_id``, as the sender gets it from the receiver
    (GetTask with the sender's token): the client's ``SendResult`` as a dict (``state``,
    ``reason``, ``task_state`` ...)."""
    rdesc, sdesc = receiver.wait_descriptor(), sender.wait_descriptor()
    tasks = [r for r in journal(world, rdesc["agent_id"])
             if r.get("subject") == "task" and message_id in (r.get("refs") or [])]
    if not tasks:
        return {"state": None, "why": "no task record names the message"}
    token = Path(sdesc["credential_ref"]).read_text().strip()
    script = (
        "import asyncio, dataclasses, json, sys\n"
        "from crosstalk.a2a import client\n"
        "r = asyncio.run(client.get_task(sys.argv[1], sys.argv[2], sys.argv[3]))\n"
        "print(json.dumps(dataclasses.asdict(r)))\n")
    done = world.netns.run(world.python, "-c", script, rdesc["a2a_url"], token,
                           str(tasks[-1]["id"]), timeout=60)
    if done.returncode != 0:
        return {"state": None, "why": done.stderr[-400:]}
    got: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return got


DENY_LINE = "\u276f Deny \u2014 drop it"
DELIVER_LINE = "\u276f Deliver this message to Claude"


def choose(claude: LiveClaude, *, deliver: bool) -> float:
    """Pick Deliver (Down, Enter) or Deny (Enter: the default) in Claude's hold dialog; the
    time of the Enter that closed it. A key pressed while the dialog is still coming up can
    be lost, so Enter is pressed again until the dialog is gone."""
    wait_screen(claude, DENY_LINE)
    if deliver:
        key(claude, "Down")
        wait_screen(claude, DELIVER_LINE)
    line = DELIVER_LINE if deliver else DENY_LINE
    for _ in range(5):
        at = time.time()
        key(claude, "Enter")
        try:
            wait_for(lambda: line not in claude.screen(), 3, step=0.1, what="the dialog closed")
            return at
        except TimeoutError:
            continue
    raise AssertionError(f"the hold dialog did not take Enter:\n{claude.screen()}")
