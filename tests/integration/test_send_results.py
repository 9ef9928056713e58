"""Send results that say what happened (issue 12, items 5 and 8).

- A receiver whose journal cannot store a message (a full disk) refuses it before accepting
  anything: on the wire a definite, retryable refusal (JSON-RPC -32600 with reason
  ``journal_unavailable`` and ``crosstalk.state: unreachable``), never -32603, which a client
  must read as "maybe delivered"; the sender's tool result says nothing was delivered and to
  retry later.
- A send to a name that matches nothing is a definite failure (``rejected`` /
  ``no_such_agent``), never ``unknown`` ("may have been delivered"), on the tool path, the
  agent's own send, and ``crosstalk send --json``.

Real parts: registered agents, real journals whose writes fail through
:class:`~tests.support.faulty_ops.FaultyOps` (ENOSPC), uvicorn on loopback, CrossTalk's client
and the a2a-sdk's own.
"""

from __future__ import annotations

import errno
import io
import json
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.utils.errors import InvalidRequestError

from crosstalk.a2a import client as ct_client
from crosstalk.a2a import wire
from crosstalk.agent import Agent as ShimAgent
from crosstalk.cli.send import EXIT_NO_TARGET, run_send
from crosstalk.harness.fake import FAKE_NAME_META, FAKE_SESSION_META, FakeIdentifier
from crosstalk.shim.roster import Shim
from crosstalk.shim.tools import Tools
from crosstalk.store.journal_read import read_journal
from crosstalk.store.registry import Registry
from tests.support.a2a import (
    Agent,
    Node,
    agents,
    bob,
    registry,
    sdk_client,
    send,
    text_message,
)
from tests.support.faulty_ops import FaultyOps

pytestmark = pytest.mark.anyio
__all__ = ["agents", "bob", "registry"]  # fixtures

NOTHING_DELIVERED = "the receiver could not store it; nothing was delivered; retry later"


def full_disk() -> FaultyOps:
    """Every journal write fails the way a full disk does."""
    ops = FaultyOps(err=errno.ENOSPC)
    ops.fail_if = lambda _data: True
    return ops


# -- item 5: over A2A, against a real agent ---------------------------------------------------


async def test_a_receiver_that_cannot_store_a_message_refuses_it_retryably(
        bob: Node, agents: dict[str, Agent]) -> None:
    """Before: ``unknown`` / ``internal_error`` (-32603) for a message that never arrived."""
    alice = agents["alice"]
    bob.journal._ops = full_disk()
    refused = await ct_client.send(bob.url, alice.token, "while the disk is full")
    assert (refused.state, refused.reason) == ("unreachable", "journal_unavailable"), refused
    assert bob.fake.writes == []
    assert bob.message_records(refused.message_id) == []
    assert bob.receiver.admission.pending_tasks == set()  # the task slot was given back
    # Retry later: the same message, once the disk has room again, is delivered once.
    bob.journal._ops = FaultyOps()
    again = await ct_client.send(bob.url, alice.token, "while the disk is full",
                                 message_id=refused.message_id)
    assert again.state == "accepted", again
    assert bob.fake.texts() == ["while the disk is full"]
    assert read_journal(bob.journal_path).damage == []


async def test_the_refusal_on_the_wire_is_a_definite_one_any_client_can_read(
        bob: Node, agents: dict[str, Agent]) -> None:
    """The SDK's own client gets InvalidRequest (-32600, as every refusal before a task),
    with the reason and state in the error's ErrorInfo metadata; no internals."""
    bob.journal._ops = full_disk()
    async with sdk_client(bob.url, agents["alice"].token) as (client, ctx):
        with pytest.raises(InvalidRequestError) as raised:
            await send(client, ctx, text_message("full"))
    assert raised.value.data == {wire.ERROR_REASON: "journal_unavailable",
                                 wire.ERROR_STATE: "unreachable"}
    body = {"jsonrpc": "2.0", "id": "1", "method": "SendMessage",
            "params": {"message": {"messageId": "m-raw", "role": "ROLE_USER",
                                   "parts": [{"text": "full"}]}}}
    async with httpx.AsyncClient() as http:
        raw = (await http.post(f"{bob.url}/", json=body, headers={
            "Authorization": f"Bearer {agents['alice'].token}", "A2A-Version": "1.0"})).json()
    assert raw["error"]["code"] == -32600, raw
    text = json.dumps(raw)
    assert "journal_unavailable" in text
    assert str(bob.journal_path) not in text
    assert "Errno" not in text


async def test_a_continuation_the_receiver_cannot_store_is_refused_the_same_way(
        bob: Node, agents: dict[str, Agent]) -> None:
    """An open ask's task, continued while the receiver's disk is full."""
    alice = agents["alice"]
    first = await ct_client.send(bob.url, alice.token, "which test is flaky?", kind="ask",
                                 until_delivered=True)
    assert first.state == "accepted", first
    assert first.task_id
    bob.journal._ops = full_disk()
    more = await ct_client.send(bob.url, alice.token, "and more", task_id=first.task_id)
    assert (more.state, more.reason) == ("unreachable", "journal_unavailable"), more
    assert bob.fake.texts() == ["which test is flaky?"]


# -- the tool path: in-process shims on real agents -------------------------------------------


def who(name: str) -> dict[str, str]:
    return {FAKE_SESSION_META: f"session-{name}", FAKE_NAME_META: name}


@pytest.fixture
async def tools(tmp_path: Path) -> AsyncIterator[Tools]:
    env = {"XDG_RUNTIME_DIR": tempfile.mkdtemp(prefix="ct-rt-", dir="/tmp")}
    shim = Shim(Registry(tmp_path / "state"), [FakeIdentifier(cwd="/w")], env=env)
    tools = Tools(shim)
    for name in ("alice", "bob"):  # a first call registers each session as an agent
        await tools.call("receive_message", {}, who(name))
    try:
        yield tools
    finally:
        await shim.close()


def agent_named(tools: Tools, name: str) -> ShimAgent:
    return next(a for a in tools.shim.agents.values() if a.name == name)


async def call(tools: Tools, name: str, args: dict[str, Any],
               caller: str = "alice") -> tuple[bool, dict[str, Any]]:
    result = await tools.call(name, args, who(caller))
    assert result.structured_content is not None
    return result.is_error, result.structured_content


@pytest.mark.parametrize("tool", ["send_message", "ask"])
async def test_the_tool_says_nothing_was_delivered_when_the_receiver_cannot_store_it(
        tools: Tools, tool: str) -> None:
    bob = agent_named(tools, "bob")
    assert bob.journal is not None
    bob.journal._ops = full_disk()
    _, res = await call(tools, tool, {"to": "bob", "text": "disk full?"})
    assert (res["state"], res["reason"]) == ("unreachable", "journal_unavailable"), res
    assert res["hint"] == NOTHING_DELIVERED
    bob.journal._ops = FaultyOps()
    _, ok = await call(tools, tool, {"to": "bob", "text": "disk full?"})
    assert ok["state"] == "accepted", ok


# -- item 8: a name that matches nothing ------------------------------------------------------


@pytest.mark.parametrize("tool", ["send_message", "ask"])
async def test_a_send_to_a_name_nobody_has_is_a_definite_failure(tools: Tools,
                                                                 tool: str) -> None:
    """Before: ``unknown`` / ``no_such_agent`` (``unknown`` elsewhere means "may have been
    delivered")."""
    _, res = await call(tools, tool, {"to": "nobody", "text": "anyone?"})
    assert (res["state"], res["reason"]) == ("rejected", "no_such_agent"), res
    assert "list_agents" in res["hint"]
    assert "message_id" not in res


async def test_the_agents_own_send_to_a_name_nobody_has_is_rejected(tools: Tools) -> None:
    res = await agent_named(tools, "alice").send("nobody", "anyone?")
    assert (res.state, res.reason) == ("rejected", "no_such_agent")


def test_crosstalk_send_json_says_no_such_agent(tmp_path: Path) -> None:
    """``crosstalk send --json``: exit 3 and a clear line on stderr, as before, and now a
    result a script can read on stdout."""
    home = tmp_path / "state"
    (home / "agents").mkdir(parents=True)
    out, err = io.StringIO(), io.StringIO()
    code = run_send(home, "nobody", "anyone?", as_json=True, out=out, err=err)
    assert code == EXIT_NO_TARGET
    assert "nobody" in err.getvalue()
    assert json.loads(out.getvalue()) == {"state": "rejected", "reason": "no_such_agent",
                                          "to": "nobody"}


async def test_a_reply_the_asker_cannot_store_can_be_sent_again(tools: Tools) -> None:
    """A reply refused as ``journal_unavailable`` stays pending: repeating the same reply
    forwards it once the asker's disk has room (a reply that definitely failed could not)."""
    _, asked = await call(tools, "ask", {"to": "alice", "text": "ready?"}, caller="bob")
    assert asked["state"] == "accepted", asked
    bob = agent_named(tools, "bob")
    assert bob.journal is not None
    bob.journal._ops = full_disk()
    args = {"message_id": asked["message_id"], "text": "yes"}
    _, refused = await call(tools, "reply", args)
    assert (refused["state"], refused["reason"]) == ("unreachable", "journal_unavailable")
    assert refused["hint"] == NOTHING_DELIVERED
    bob.journal._ops = FaultyOps()
    _, forwarded = await call(tools, "reply", args)
    assert forwarded["state"] == "accepted", forwarded
    assert forwarded["message_id"] == refused["message_id"]  # the same reply, sent again
