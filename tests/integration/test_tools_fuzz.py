"""Tool arguments are an ingress too: random arguments never crash a tool or lose a message."""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crosstalk.harness.fake import FAKE_NAME_META, FAKE_SESSION_META, FakeIdentifier
from crosstalk.shim.catalog import TOOL_NAMES
from crosstalk.shim.roster import Shim
from crosstalk.shim.tools import Tools
from crosstalk.store.registry import Registry

KNOWN_ERRORS = {"invalid_arguments", "invalid_cursor", "unknown_tool", "unbound",
                "message_too_large", "no_such_message", "sender_unverified", "already_replied",
                "ask_closed", "cannot_claim_self", "cannot_release_self", "already_claimed",
                "claimer_not_primary", "not_owner", "not_claimed", "no_such_agent",
                "ambiguous_name", "unreachable", "unknown", "journal_unavailable",
                "control_not_supported", "not_delivered", "delivery_pending"}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False)
    | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=3),
    max_leaves=6)
arg_keys = st.sampled_from(["to", "text", "kind", "delivery", "deadline_seconds", "message_id",
                            "state", "after", "limit", "name", "extra"])
arguments = st.dictionaries(arg_keys, json_values | st.sampled_from(
    ["bob", "alice", "inform", "command", "ask", "immediate", "next_turn", "accepted", "s:0",
     "s:99999999999999999999"]), max_size=5)
metas = st.one_of(st.none(), st.just({FAKE_SESSION_META: "fuzz-a", FAKE_NAME_META: "alice"}),
                  st.dictionaries(st.text(max_size=10), json_values, max_size=2))


calls = st.lists(st.tuples(st.sampled_from(sorted(TOOL_NAMES | {"bogus"})), arguments, metas),
                min_size=1, max_size=12)


async def _scenario(batch: list[tuple[str, dict[str, Any], dict[str, Any] | None]]) -> None:
    home = Path(tempfile.mkdtemp(prefix="ct-fuzz-"))
    env = {"XDG_RUNTIME_DIR": tempfile.mkdtemp(prefix="ct-rt-", dir="/tmp")}
    shim = Shim(Registry(home / "state"), [FakeIdentifier(cwd="/fuzz")], env=env)
    tools = Tools(shim)
    try:
        # bob exists, so sends can really be delivered
        await tools.call("receive_message", {}, {FAKE_SESSION_META: "fuzz-b",
                                                 FAKE_NAME_META: "bob"})
        accepted: list[str] = []
        for name, args, meta in batch:
            result = await tools.call(name, args, meta)
            assert result.structured_content is not None
            assert json.loads(result.content[0].text) == result.structured_content
            if result.is_error:
                assert result.structured_content["error"] in KNOWN_ERRORS, result
            elif name == "send_message" and result.structured_content.get("state") == "accepted":
                accepted.append(str(result.structured_content["message_id"]))
        bob = next(a for a in shim.agents.values() if a.name == "bob")
        journaled = {r["id"] for r in bob.journal_records() if r.get("subject") == "message"}
        assert set(accepted) <= journaled  # every acknowledged send is durable at the receiver
        ok = await tools.call("send_message", {"to": "bob", "text": "still alive"},
                              {FAKE_SESSION_META: "fuzz-a"})
        assert ok.structured_content is not None
        assert ok.structured_content["state"] == "accepted"  # the shim still works
    finally:
        await shim.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=calls)
def test_random_tool_calls_never_crash_and_lose_nothing(
        batch: list[tuple[str, dict[str, Any], dict[str, Any] | None]]) -> None:
    asyncio.run(_scenario(batch))
