"""A fast model finds the message it was just shown (issue 13, §2).

Claude shows an injected frame to its model about 100 ms after the inbox reads it, while the
injector still waits out its receipt grace; a model that answers at once calls
``receive_message`` and ``reply`` while the message is ``dispatching``. Here bob's session is a
fake whose "model" has the text the moment it is written and whose injection outcome comes only
when the test says so (the grace), and bob's model calls the tools in that window, through the
same tool layer a harness calls (:class:`~crosstalk.shim.tools.Tools`), with alice as the
sender on a real A2A listener, journal and registry.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from crosstalk.core.states import MessageState
from crosstalk.harness.base import Binding, Delivery, Outcome
from crosstalk.harness.fake import (
    FAKE_NAME_META,
    FAKE_SESSION_META,
    FakeHarness,
    FakeIdentifier,
    Written,
)
from crosstalk.shim.roster import Shim
from crosstalk.shim.tools import Tools
from crosstalk.store.registry import Registry

pytestmark = pytest.mark.anyio

ALICE = {FAKE_SESSION_META: "a1", FAKE_NAME_META: "alice"}
BOB = {FAKE_SESSION_META: "b1", FAKE_NAME_META: "bob"}
#: Long enough for a reply call to reach bob's receiver while the delivery is still open; a
#: bound on waiting, not a timing assertion (the reply must not end before the outcome).
SETTLE = 0.5


@dataclass
class GraceHarness(FakeHarness):
    """The session has the text as soon as it is written; the injection's outcome comes only
    when :attr:`release` is set (Claude: the inbox closed, the receipt grace runs)."""

    outcome: Outcome = field(default_factory=lambda: Outcome(MessageState.ACCEPTED, None, "ok"))
    release: asyncio.Event = field(default_factory=asyncio.Event)
    written: asyncio.Event = field(default_factory=asyncio.Event)

    async def inject(self, binding: Binding, delivery: Delivery) -> Outcome:
        self.writes.append(Written(binding, delivery, delivery.message.text))
        self.written.set()
        await self.release.wait()
        return self.outcome


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[tuple[Tools, GraceHarness]]:
    env = {"XDG_RUNTIME_DIR": tempfile.mkdtemp(prefix="ct-rt-", dir="/tmp")}
    bob_session = GraceHarness(name="fake")
    ident = FakeIdentifier(cwd="/m", harnesses={"b1": bob_session})
    shim = Shim(Registry(tmp_path / "state"), [ident], env=env)
    tools = Tools(shim)
    try:
        await call(tools, "receive_message", {}, BOB)  # bob is an agent before alice sends
        await call(tools, "receive_message", {}, ALICE)
        yield tools, bob_session
    finally:
        bob_session.release.set()
        await shim.close()


async def call(tools: Tools, name: str, args: dict[str, Any],
               meta: dict[str, Any]) -> dict[str, Any]:
    result = await tools.call(name, args, meta)
    assert result.structured_content is not None
    return dict(result.structured_content)


def one(entries: list[dict[str, Any]], message_id: str) -> dict[str, Any]:
    found = [e for e in entries if e["message_id"] == message_id]
    assert len(found) == 1, entries
    return found[0]


async def written_id(bob_session: GraceHarness) -> str:
    """The id of the message bob's model was just shown (the frame carries it)."""
    await asyncio.wait_for(bob_session.written.wait(), 20)
    return bob_session.writes[-1].delivery.message.message_id


async def test_an_inform_is_listed_delivering_the_moment_it_is_written(
        rig: tuple[Tools, GraceHarness]) -> None:
    tools, bob_session = rig
    send = asyncio.create_task(call(tools, "send_message", {"to": "bob", "text": "fyi"}, ALICE))
    mid = await written_id(bob_session)

    seen = await call(tools, "receive_message", {}, BOB)
    entry = one(seen["entries"], mid)
    assert (entry["kind"], entry["from"], entry["state"]) == ("inform", "alice", "delivering")
    # Its text waits for the outcome: the model that was shown it has it already.
    assert (entry["text"], entry["withheld"]) == ("", "delivering")
    only = await call(tools, "receive_message", {"state": "delivering"}, BOB)
    assert [e["message_id"] for e in only["entries"]] == [mid]

    bob_session.release.set()
    assert (await send)["state"] == "accepted"
    later = await call(tools, "receive_message", {"after": seen["next_cursor"]}, BOB)
    assert one(later["entries"], mid)["state"] == "accepted"


async def test_an_ask_being_delivered_is_answered_by_reply(
        rig: tuple[Tools, GraceHarness]) -> None:
    tools, bob_session = rig
    ask = asyncio.create_task(call(tools, "ask", {"to": "bob", "text": "port?"}, ALICE))
    mid = await written_id(bob_session)

    entry = one((await call(tools, "receive_message", {}, BOB))["entries"], mid)
    assert (entry["kind"], entry["from"], entry["state"]) == ("ask", "alice", "delivering")
    reply = asyncio.create_task(call(tools, "reply", {"message_id": mid, "text": "8080"}, BOB))
    await asyncio.wait({reply}, timeout=SETTLE)  # the reply reaches bob while delivering
    bob_session.release.set()

    answered = await reply
    assert answered.get("error") is None, answered
    assert (answered["state"], answered["in_reply_to"]) == ("accepted", mid)
    assert (await ask)["state"] == "accepted"
    entry = one((await call(tools, "receive_message", {}, BOB))["entries"], mid)
    assert (entry["state"], entry["ask"]) == ("accepted", "answered")
    # What the asker finally sees: the answer in its own mailbox, in reply to its ask.
    got = await replies_to(tools, mid)
    assert [e["text"] for e in got] == ["8080"]


async def test_an_inform_being_delivered_is_answered_by_reply(
        rig: tuple[Tools, GraceHarness]) -> None:
    tools, bob_session = rig
    send = asyncio.create_task(call(tools, "send_message", {"to": "bob", "text": "hi"}, ALICE))
    mid = await written_id(bob_session)
    reply = asyncio.create_task(call(tools, "reply", {"message_id": mid, "text": "hey"}, BOB))
    await asyncio.wait({reply}, timeout=SETTLE)
    bob_session.release.set()
    answered = await reply
    assert (answered.get("error"), answered.get("state")) == (None, "accepted"), answered
    assert (await send)["state"] == "accepted"
    assert [e["text"] for e in await replies_to(tools, mid)] == ["hey"]


@pytest.mark.parametrize(("outcome", "shown"), [
    (Outcome(MessageState.UNREACHABLE, "permission_mode_parity"), "unreachable"),
    (Outcome(MessageState.UNKNOWN, "held_for_approval", "held receipt"), "unknown"),
])
async def test_a_reply_to_a_delivery_that_then_fails_is_refused_and_never_forwarded(
        rig: tuple[Tools, GraceHarness], outcome: Outcome, shown: str) -> None:
    """Never "accepted" without evidence: a refused (or held) injection is what the entry and
    the asker see, and the reply the fast model sent in the meantime reaches no one."""
    tools, bob_session = rig
    bob_session.outcome = outcome
    ask = asyncio.create_task(call(tools, "ask", {"to": "bob", "text": "ok?"}, ALICE))
    mid = await written_id(bob_session)
    assert one((await call(tools, "receive_message", {}, BOB))["entries"],
               mid)["state"] == "delivering"
    reply = asyncio.create_task(call(tools, "reply", {"message_id": mid, "text": "yes"}, BOB))
    await asyncio.wait({reply}, timeout=SETTLE)
    bob_session.release.set()

    refused = await reply
    assert refused["error"] == "not_delivered", refused
    assert str(outcome.reason) in refused["hint"]
    entry = one((await call(tools, "receive_message", {"state": shown}, BOB))["entries"], mid)
    assert (entry["state"], entry["reason"], entry.get("ask")) == (shown, outcome.reason, None)
    listed = (await call(tools, "receive_message", {}, BOB))["entries"]
    held = outcome.reason == "held_for_approval"  # withheld by default (ADR 0020)
    assert (mid in [e["message_id"] for e in listed]) is not held
    sent = await ask
    assert (sent["state"], sent["reason"]) == (shown, outcome.reason)
    assert await replies_to(tools, mid, wait=False) == []


async def replies_to(tools: Tools, mid: str, *, wait: bool = True) -> list[dict[str, Any]]:
    """Alice's mailbox entries in reply to ``mid`` (waiting for the first, unless not)."""
    found: list[dict[str, Any]] = []

    async def look() -> None:
        seen = await call(tools, "receive_message", {"limit": 100}, ALICE)
        found[:] = [e for e in seen["entries"] if e["in_reply_to"] == mid]

    await look()
    if wait:
        for _ in range(400):
            if found:
                break
            await asyncio.sleep(0.05)
            await look()
    return found
