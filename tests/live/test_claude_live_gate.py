"""Claude's own inbound gate decides what reaches a CrossTalk session (issue 13 §1, ADR 0020),
with the real Claude Code 2.1.328.

B's shim has its detached gate helper write every peer frame, so Claude applies permission-mode
parity, ``crossSessionInbound`` and its hold dialog as it does for its own peers, and sends its
receipts to the helper's listener:

* B in bypass mode, A prompting: A is told ``held``; B's model gets nothing; B's screen shows
  the hold dialog; Deliver → B's model gets it once, and A's task says completed; a second
  message, Deny → A's task says failed (``receipt_denied``), B's model never gets it;
* bypass → bypass: delivered, not held;
* ``crossSessionInbound`` ``accept`` / ``hold`` / ``refuse`` in the user settings: delivered
  across modes / held between equal modes / refused.

What is asserted is what the *model* was sent (the bodies of its requests to the mock), what
A's tools and A2A task said, and B's journal.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.live.conftest import Timings
from tests.live.support.claude import LiveClaude, World, is_main, wait_for
from tests.live.support.extras import wait_screen
from tests.live.support.gate import (
    BYPASS,
    HOLD_DIALOG,
    choose,
    message_records,
    model_saw,
    send_once,
    task_as_sender,
    user_settings,
)
from tests.live.support.steps import start_all, unique

pytestmark = pytest.mark.live


def start_idle(*sessions: LiveClaude) -> None:
    start_all(*sessions)
    for claude in sessions:
        claude.wait_idle()


def states(world: World, receiver: LiveClaude, message_id: str) -> list[tuple[str, Any]]:
    """B's journal for one message: (state or "receipt:<status>", reason), in order."""
    out: list[tuple[str, Any]] = []
    for r in message_records(world, receiver.wait_descriptor()["agent_id"], message_id):
        if r["subject"] == "receipt":
            out.append((f"receipt:{r.get('status')}", r.get("reason")))
        else:
            out.append((r["state"], r.get("reason")))
    return out


def view(world: World, sender: LiveClaude, receiver: LiveClaude, mid: str) -> str:
    task = task_as_sender(world, sender, receiver, mid)
    return f"{task.get('state')}/{task.get('reason')} (task {task.get('task_state')})"


def view_when(world: World, sender: LiveClaude, receiver: LiveClaude, mid: str, *, word: str,
              timeout: float) -> str:
    def check() -> str | None:
        got = view(world, sender, receiver, mid)
        return got if word in got else None
    try:
        found: str = wait_for(check, timeout, step=0.5, what=f"A's task view saying {word}")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}: A's view {view(world, sender, receiver, mid)}; B's journal "
                             f"{states(world, receiver, mid)}; B's screen:\n"
                             f"{receiver.screen()}") from None
    return found


def test_held_for_bs_user_then_delivered_then_denied(world: World, timings: Timings) -> None:
    alpha, beta = world.session("alpha"), world.session("beta", **BYPASS)
    start_idle(alpha, beta)
    text = unique("LIVE-GATE-HELD")

    result, took = send_once(world, alpha, "beta", text)
    timings.add("A's send_message (held): tool_use -> tool_result", took)
    print(f"[live] gate: A's send_message result {result}")
    assert (result["state"], result["reason"]) == ("unknown", "held_for_approval"), result
    mid = result["message_id"]
    screen = wait_screen(beta, *HOLD_DIALOG)
    assert "alpha" in screen, screen
    held_view = view(world, alpha, beta, mid)
    print(f"[live] gate: A's task while held: {held_view}")
    assert "working" in held_view, held_view
    time.sleep(1.0)
    assert model_saw(beta, text) == 0, "a held message reached the model"
    assert ("accepted", None) not in states(world, beta, mid)

    t0 = choose(beta, deliver=True)
    entry = beta.wait_for_request(lambda e: is_main(e) and model_saw(beta, text) > 0, timeout=30)
    timings.add("B's user picks Deliver -> B's model request", entry["t"] - t0)
    got = wait_for(lambda: ("accepted", None) in states(world, beta, mid), 15,
                   what="B's journal: the held message accepted")
    assert got
    trail = states(world, beta, mid)
    print(f"[live] gate: B's journal for the delivered one: {trail}")
    # Nothing said accepted before Claude's delivered receipt.
    assert trail.index(("receipt:delivered", None)) < trail.index(("accepted", None)), trail
    assert [s for s, _ in trail].count("accepted") == 1
    delivered_view = view_when(world, alpha, beta, mid, word="completed", timeout=15)
    timings.add("B's user picks Deliver -> A's task completed", time.time() - t0)
    print(f"[live] gate: A's task after Deliver: {delivered_view}")
    time.sleep(1.0)
    assert model_saw(beta, text) == 1, "delivered more than once"

    second = unique("LIVE-GATE-DENY")
    result2, took2 = send_once(world, alpha, "beta", second)
    timings.add("A's second send_message (held): tool_use -> tool_result", took2)
    assert result2["reason"] == "held_for_approval", result2
    wait_screen(beta, *HOLD_DIALOG)
    t1 = choose(beta, deliver=False)  # Enter: the default button is Deny
    denied = view_when(world, alpha, beta, result2["message_id"], word="failed",
                       timeout=20)
    timings.add("B's user picks Deny -> A's task failed", time.time() - t1)
    print(f"[live] gate: A's task after Deny: {denied}")
    assert "receipt_denied" in denied, denied
    assert ("unreachable", "receipt_denied") in states(world, beta, result2["message_id"])
    time.sleep(2.0)
    assert model_saw(beta, second) == 0, "a denied message reached the model"


def test_bypass_to_bypass_is_delivered_not_held(world: World, timings: Timings) -> None:
    alpha, beta = world.session("alpha", **BYPASS), world.session("beta", **BYPASS)
    start_idle(alpha, beta)
    text = unique("LIVE-GATE-BYPASS")
    result, took = send_once(world, alpha, "beta", text)
    timings.add("bypass -> bypass send_message: tool_use -> tool_result", took)
    print(f"[live] gate: bypass->bypass A's result {result}")
    assert result["state"] == "accepted", result
    beta.wait_for_request(lambda e: is_main(e) and model_saw(beta, text) > 0, timeout=30)
    assert "Held message" not in beta.screen()


@pytest.mark.parametrize("policy", ["accept", "hold", "refuse"])
def test_cross_session_inbound_setting(world: World, timings: Timings, policy: str) -> None:
    """accept: a prompting peer reaches a bypass session; hold: held even between equal
    modes (Claude's notice says the setting holds it); refuse: A is told it was refused,
    B's model never gets it."""
    user_settings(world, crossSessionInbound=policy)
    alpha = world.session("alpha")
    beta = world.session("beta", **(BYPASS if policy == "accept" else {}))
    start_idle(alpha, beta)
    text = unique(f"LIVE-GATE-{policy.upper()}")
    result, took = send_once(world, alpha, "beta", text)
    timings.add(f"crossSessionInbound={policy}: send_message tool_use -> tool_result", took)
    print(f"[live] gate: crossSessionInbound={policy}: A's result {result}")
    if policy == "accept":
        assert result["state"] == "accepted", result
        beta.wait_for_request(lambda e: is_main(e) and model_saw(beta, text) > 0, timeout=30)
        return
    if policy == "hold":
        assert (result["state"], result["reason"]) == ("unknown", "held_for_approval"), result
        # With the setting (not a mode mismatch) Claude shows a notice, not the dialog.
        screen = wait_screen(beta, "Held peer message", "not delivered to Claude")
        assert 'setting is "hold"' in screen, screen
    else:
        assert result["state"] == "unreachable", result
        assert result["reason"] == "receipt_refused", result
    time.sleep(1.5)
    assert model_saw(beta, text) == 0
