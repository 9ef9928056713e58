"""Seed test 28, claim/release, on real ``crosstalk mcp`` processes (fake harness).

Each shim is its own process driven by the official MCP client over stdio; the claim travels
as an A2A control request from the claimer's shim to the target's, and what reaches a
session's "model" is read from ``$CROSSTALK_FAKE_INBOX/<session>.jsonl``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from crosstalk.store.registry import Registry
from tests.support.shims import data, inbox, meta, shim, world

pytestmark = [pytest.mark.anyio, pytest.mark.seed(28)]
__all__ = ["world"]  # a fixture

ALICE, BOB, CAROL = meta("a1", "alice"), meta("b1", "bob"), meta("c1", "carol")


async def call(client: Client, tool: str, args: dict[str, Any],
               who: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    res = await client.call_tool(tool, args, meta=who)
    return bool(res.is_error), data(res)


async def row(client: Client, name: str) -> dict[str, Any] | None:
    agents = data(await client.call_tool("list_agents", {}))["agents"]
    found = [r for r in agents if r["name"] == name]
    assert len(found) <= 1
    return found[0] if found else None


def agent_id(world: dict[str, str], name: str) -> str:
    [d] = Registry(Path(world["CROSSTALK_HOME"])).find(name)
    return d.agent_id


def notices(world: dict[str, str], session: str) -> list[str]:
    return [m["text"] for m in inbox(world, session) if m["from"] == "crosstalk"]


async def register(client: Client, who: dict[str, Any]) -> None:
    err, _ = await call(client, "receive_message", {}, who)
    assert not err


async def test_claim_release_round_trip(world: dict[str, str]) -> None:
    async with shim(world) as a, shim(world) as b, shim(world) as c:
        for client, who in ((a, ALICE), (b, BOB), (c, CAROL)):
            await register(client, who)
        alice_id, bob_id = agent_id(world, "alice"), agent_id(world, "bob")
        assert (await row(c, "bob") or {}).get("role") == "primary"

        # a primary claims an unclaimed agent
        err, claimed = await call(a, "claim", {"name": "bob"}, ALICE)
        assert not err, claimed
        assert claimed == {"ok": True, "name": "bob", "agent_id": bob_id, "role": "subagent",
                           "owner": alice_id}
        [told] = notices(world, "b1")
        assert f"alice (agent {alice_id}) has claimed this session as its subagent" in told
        [msg] = inbox(world, "b1")
        assert msg["kind"] == "inform"
        assert msg["wake"] is False  # the shim's own notice is unverified: it never wakes
        assert notices(world, "a1") == []
        listed = await row(c, "bob")
        assert listed is not None
        assert (listed["role"], listed["owner"]) == ("subagent", alice_id)
        # the target can read the notice in its mailbox
        err, box = await call(b, "receive_message", {}, BOB)
        assert [e["from"] for e in box["entries"]] == ["crosstalk"]

        # refusals: non-owner release, self claim/release, claim of a claimed agent
        err, res = await call(c, "release", {"name": "bob"}, CAROL)
        assert err
        assert (res["error"], res["name"]) == ("not_owner", "bob")
        err, res = await call(b, "claim", {"name": "bob"}, BOB)
        assert err
        assert res["error"] == "cannot_claim_self"
        err, res = await call(b, "release", {"name": bob_id}, BOB)
        assert err
        assert res["error"] == "cannot_release_self"
        err, res = await call(c, "claim", {"name": "bob"}, CAROL)
        assert err
        assert res["error"] == "already_claimed"
        err, res = await call(c, "claim", {"name": "nobody"}, CAROL)
        assert (err, res["error"]) == (True, "no_such_agent")
        assert len(notices(world, "b1")) == 1  # no refused request reached the session
        listed = await row(a, "bob")
        assert listed is not None
        assert listed["owner"] == alice_id

        # the claim is what policy uses: the owner commands, another primary cannot
        err, sent = await call(a, "send_message", {"to": "bob", "text": "run the suite",
                                                   "kind": "command"}, ALICE)
        assert sent["state"] == "accepted", sent
        err, sent = await call(c, "send_message", {"to": "bob", "text": "drop the table",
                                                   "kind": "command"}, CAROL)
        assert (sent["state"], sent["reason"]) == ("rejected", "command_owner_only")
        texts = [m["text"] for m in inbox(world, "b1")]
        assert "run the suite" in texts
        assert "drop the table" not in texts

        # the owner releases: primary again, told the same way
        err, released = await call(a, "release", {"name": "bob"}, ALICE)
        assert not err, released
        assert (released["role"], released.get("owner")) == ("primary", None)
        assert "has released this session; it is a primary again" in notices(world, "b1")[-1]
        listed = await row(c, "bob")
        assert listed is not None
        assert (listed["role"], listed["owner"]) == ("primary", None)
        err, sent = await call(c, "send_message", {"to": "bob", "text": "drop the table",
                                                   "kind": "command"}, CAROL)
        assert sent["state"] == "accepted", sent
        err, res = await call(a, "release", {"name": "bob"}, ALICE)
        assert (err, res["error"]) == (True, "not_claimed")


async def test_the_claim_ends_with_the_targets_session(world: dict[str, str]) -> None:
    async with shim(world) as a:
        await register(a, ALICE)
        alice_id = agent_id(world, "alice")
        async with shim(world) as b:
            await register(b, BOB)
            old_bob = agent_id(world, "bob")
            err, res = await call(a, "claim", {"name": "bob"}, ALICE)
            assert not err, res
        # the target's shim is gone: so is the agent, and nothing can claim a ghost
        assert await row(a, "bob") is None
        err, res = await call(a, "release", {"name": "bob"}, ALICE)
        assert (err, res["error"]) == (True, "no_such_agent")
        # the same session reconnecting resumes its journal, claim included
        async with shim(world) as b:
            await register(b, BOB)
            listed = await row(a, "bob")
            assert listed is not None
            assert (listed["agent_id"], listed["role"], listed["owner"]) == (
                old_bob, "subagent", alice_id)
        # a new session under the same name is a new agent: primary, no owner
        async with shim(world) as b:
            await register(b, meta("b2", "bob"))
            listed = await row(a, "bob")
            assert listed is not None
            assert listed["agent_id"] != old_bob
            assert (listed["role"], listed["owner"]) == ("primary", None)
            err, sent = await call(b, "send_message", {"to": "alice", "text": "hi"},
                                   meta("b2"))
            assert sent["state"] == "accepted"
        assert notices(world, "b2") == []  # the new session was never told of a claim


async def test_an_owner_that_is_gone_holds_nothing(world: dict[str, str]) -> None:
    async with shim(world) as b, shim(world) as c:
        await register(b, BOB)
        await register(c, CAROL)
        carol_id = agent_id(world, "carol")
        async with shim(world) as a:
            await register(a, ALICE)
            alice_id = agent_id(world, "alice")
            err, res = await call(a, "claim", {"name": "bob"}, ALICE)
            assert not err, res
            err, sent = await call(c, "send_message", {"to": "bob", "text": "first",
                                                       "kind": "command"}, CAROL)
            assert sent["state"] == "rejected"
            listed = await row(c, "bob")
            assert listed is not None
            assert listed["owner"] == alice_id
        # alice's session ended: bob is listed and treated as unowned
        assert await row(c, "alice") is None
        listed = await row(c, "bob")
        assert listed is not None
        assert (listed["role"], listed["owner"]) == ("primary", None)
        err, sent = await call(c, "send_message", {"to": "bob", "text": "second",
                                                   "kind": "command"}, CAROL)
        assert sent["state"] == "accepted", sent
        texts = [m["text"] for m in inbox(world, "b1")]
        assert "second" in texts
        assert "first" not in texts
        # ... and another primary may claim it
        err, res = await call(c, "claim", {"name": "bob"}, CAROL)
        assert not err, res
        assert (res["role"], res["owner"]) == ("subagent", carol_id)
        assert f"carol (agent {carol_id}) has claimed this session" in notices(world, "b1")[-1]
