"""Claude's own inbound gate decides every peer injection (issue 13 §1, ADR 0020).

Real ``crosstalk mcp`` shims under fake Claude sessions whose inbox gates like Claude 2.1.328
(``tests/support/fakes/claude_gate.py``: SO_PEERCRED ancestry for ``selfSent``, parity by the
envelope's ``from-mode``, ``crossSessionInbound``, receipts only to a ``from`` listener owned by
the very process that wrote the frame). The shim's gate helper writes peers' frames, so the
gate applies; the helper lives exactly as long as its shim.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from crosstalk.proc import ancestors
from tests.support.claude import claude_env, running
from tests.support.claude_world import Node, world
from tests.support.waiting import eventually

pytestmark = pytest.mark.anyio
__all__ = ["world"]  # a fixture

BYPASS = {"permissions": {"defaultMode": "bypassPermissions"}}


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return claude_env(tmp_path)


def settings(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def project(node: Node) -> Path:
    return Path(node.fc.cwd) / ".claude" / "settings.json"


def saw(node: Node, text: str) -> bool:
    return any(text in c for c in node.contents())


async def entry(node: Node, message_id: str, **filters: Any) -> dict[str, Any]:
    got = await node.call("receive_message", limit=100, **filters)
    (found,) = [e for e in got["entries"] if e["message_id"] == message_id]
    return dict(found)


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 20.0) -> None:
    """:func:`eventually` for a check that has to await (a tool call)."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened within {timeout} s: {what}")
        await anyio.sleep(0.05)


def helper_pid(node: Node) -> int:
    """The writer of the last peer frame the session got (its SO_PEERCRED pid)."""
    pids = [f["peer_pid"] for f in node.fc.frames()
            if f["frame"].get("type") == "user" and f.get("peer_pid")]
    return int(pids[-1])


async def test_a_bypass_session_holds_a_prompting_peer_until_its_user_decides(
        world: Callable[..., Node]) -> None:
    alice, bob = world("alice"), world("bob")
    await alice.connect()
    await bob.connect()
    settings(project(bob), BYPASS)

    sent = await alice.call("send_message", to="bob", text="held one")
    assert (sent["state"], sent["reason"]) == ("unknown", "held_for_approval"), sent
    assert "holding the message" in sent["hint"]
    assert not saw(bob, "held one")
    ids, receipts = bob.fc.held()
    assert len(ids) == 1
    assert [r["sent"] for r in receipts] == [True], receipts  # the writer owns the listener
    # Bob's model sees nothing of it either, as with Claude's own peers: not listed, and
    # asked for by state, its text is withheld (or the hold would mean nothing).
    listed = await bob.call("receive_message", limit=100)
    assert sent["message_id"] not in [e["message_id"] for e in listed["entries"]], listed
    held = await entry(bob, sent["message_id"], state="unknown")
    assert (held["state"], held.get("reason")) == ("unknown", "held_for_approval"), held
    assert (held["text"], held["withheld"]) == ("", "held_for_approval"), held
    assert "held one" not in json.dumps(listed) + json.dumps(held)

    bob.fc.decide(ids[0], deliver=True)
    await eventually(lambda: saw(bob, "held one"), what="the delivered message at bob")

    async def settled(want: str) -> bool:
        return (await entry(bob, sent["message_id"]))["state"] == want
    await until(lambda: settled("accepted"), "bob's entry accepted")
    assert sum("held one" in c for c in bob.contents()) == 1

    second = await alice.call("send_message", to="bob", text="denied one")
    assert second["reason"] == "held_for_approval"
    ids, _ = bob.fc.held()
    bob.fc.decide(ids[0], deliver=False)

    async def denied() -> bool:
        e = await entry(bob, second["message_id"], state="unreachable")
        return (e["state"], e.get("reason")) == ("unreachable", "receipt_denied")
    await until(denied, "bob's entry unreachable (denied)")
    assert not saw(bob, "denied one")
    listed = await bob.call("receive_message", limit=100)
    assert second["message_id"] not in [e["message_id"] for e in listed["entries"]]
    gone = await entry(bob, second["message_id"], state="unreachable")
    assert (gone["text"], gone["withheld"]) == ("", "receipt_denied"), gone


async def test_cross_session_inbound_and_modes_decide_as_claude_does(
        world: Callable[..., Node]) -> None:
    alice, bob = world("alice"), world("bob")
    await alice.connect()
    await bob.connect()
    user = bob.fc.config_dir / "settings.json"

    # Both bypass: equal classes, delivered, and the envelope says the sender's real mode.
    settings(project(bob), BYPASS)
    settings(project(alice), BYPASS)
    both = await alice.call("send_message", to="bob", text="bypass to bypass")
    assert both["state"] == "accepted", both
    assert any('from-mode="bypass"' in c for c in bob.contents() if "bypass to bypass" in c)
    project(alice).unlink()

    settings(user, {"crossSessionInbound": "accept"})
    accepted = await alice.call("send_message", to="bob", text="accepted by setting")
    assert accepted["state"] == "accepted", accepted
    assert saw(bob, "accepted by setting")

    project(bob).unlink()
    settings(user, {"crossSessionInbound": "hold"})  # held even between equal modes
    held = await alice.call("send_message", to="bob", text="held by setting")
    assert (held["state"], held["reason"]) == ("unknown", "held_for_approval"), held
    assert not saw(bob, "held by setting")

    settings(user, {"crossSessionInbound": "refuse"})
    refused = await alice.call("send_message", to="bob", text="refused by setting")
    assert (refused["state"], refused["reason"]) == ("unreachable", "receipt_refused"), refused
    assert not saw(bob, "refused by setting")

    # A mode switched at run time counts: Claude decides with the modes as they are now.
    user.unlink()
    bob.fc.set_mode("bypass")
    switched = await alice.call("send_message", to="bob", text="after shift-tab")
    assert switched["reason"] == "held_for_approval", switched
    assert not saw(bob, "after shift-tab")

    # The shim's own notices are the session's own: never held.
    assert (await alice.call("claim", name="bob"))["ok"] is True
    await eventually(lambda: saw(bob, "claimed this session"), what="the claim notice")


async def test_a_native_reply_to_the_helper_address_is_bounced_as_before(
        world: Callable[..., Node]) -> None:
    alice, bob = world("alice"), world("bob")
    await alice.connect()
    await bob.connect()
    asked = await alice.call("ask", to="bob", text="question for bob")
    assert asked["state"] == "accepted"
    address = re.search(r'from="uds:([^"]+)"', bob.contents()[0])
    assert address is not None
    desc_path = Path(address.group(1))
    assert desc_path.name.startswith("c")
    assert desc_path.suffix == ".sock"

    out = bob.fc.send(address.group(1), "native answer")
    assert (out["ok"], out["bytes_back"]) == (True, 0), out
    await eventually(lambda: saw(bob, "was not delivered"), what="the bounce notice")
    assert asked["message_id"] in next(c for c in bob.contents() if "was not delivered" in c)
    assert alice.inbound() == []
    bounced = await bob.call("receive_message", state="bounced")
    assert [e["state"] for e in bounced["entries"]] == ["bounced"]

    # Only the session may speak at that address: anyone else is dropped there.
    out = alice.fc.send(address.group(1), "a stranger at bob's helper")
    assert out["ok"] is True
    bounced = await bob.call("receive_message", state="bounced")
    assert len(bounced["entries"]) == 1


async def test_the_helper_is_detached_and_dies_with_its_shim(
        world: Callable[..., Node]) -> None:
    alice, bob = world("alice"), world("bob")
    await alice.connect()
    await bob.connect()
    sent = await alice.call("send_message", to="bob", text="written by the helper")
    assert sent["state"] == "accepted"
    helper = helper_pid(bob)
    (shim,) = bob.fc.shims()
    assert helper != shim
    assert bob.fc.pid not in ancestors(helper), "the helper still descends from Claude"
    sock = Path(str(bob.inbound()[-1]["frame"]["from"]).removeprefix("uds:"))
    assert sock.exists()

    bob.fc.kill_shims("KILL")
    await eventually(lambda: not running(helper), what="the helper gone with its shim")
    assert not running(shim)
    await eventually(lambda: not sock.exists(), what="the helper's socket removed")


async def test_a_killed_helper_is_replaced_and_nothing_is_reported_delivered_unseen(
        world: Callable[..., Node]) -> None:
    alice, bob = world("alice"), world("bob")
    await alice.connect()
    await bob.connect()
    first = await alice.call("send_message", to="bob", text="before the kill")
    assert first["state"] == "accepted"
    old = helper_pid(bob)
    assert old not in bob.fc.shims()  # the helper wrote it, not the shim
    os.kill(old, signal.SIGKILL)
    await eventually(lambda: not running(old), what="the helper killed")

    again = await alice.call("send_message", to="bob", text="after the kill")
    assert again["state"] == "accepted", again
    assert saw(bob, "after the kill")
    new = helper_pid(bob)
    assert new != old
    assert running(new)
    assert bob.fc.pid not in ancestors(new)


async def test_a_held_ask_is_answerable_once_delivered_and_the_answer_is_gated_too(
        world: Callable[..., Node]) -> None:
    alice, bob = world("alice"), world("bob")
    await alice.connect()
    await bob.connect()
    settings(project(bob), BYPASS)
    asked = await alice.call("ask", to="bob", text="held question")
    assert (asked["state"], asked["reason"]) == ("unknown", "held_for_approval"), asked
    ids, _ = bob.fc.held()
    bob.fc.decide(ids[0], deliver=True)
    await eventually(lambda: saw(bob, "held question"), what="the question at bob")

    # The answer crosses the same gate the other way: bypass into prompting is held too.
    done = await bob.call("reply", message_id=asked["message_id"], text="late answer")
    assert (done["state"], done["reason"]) == ("unknown", "held_for_approval"), done
    assert not saw(alice, "late answer")
    ids, _ = alice.fc.held()
    alice.fc.decide(ids[0], deliver=True)
    await eventually(lambda: saw(alice, "late answer"), what="the answer at alice")
