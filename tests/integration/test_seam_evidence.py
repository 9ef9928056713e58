"""The seam's argument evidence and live sessions (ADR 0022), driven through the fake harness.

Real ``crosstalk mcp`` processes spoken to with the official MCP client: a call may name its
session in the ``_fake`` argument (as opencode's plugin stamps ``_opencode``), and with
``CROSSTALK_FAKE_LIVE`` a shim registers the sessions listed in that file before any call (as
an opencode shim does from its host's event stream). The roster's own rules (the cap, a
call-bound session a set never had) are checked in process, over a real registry.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from crosstalk.harness.base import Identity, LoadedHarness
from crosstalk.harness.fake import FAKE_STAMP, FakeIdentifier, LiveFakeIdentifier
from crosstalk.shim.roster import Shim
from crosstalk.shim.tools import Tools
from crosstalk.store.registry import Registry
from tests.support.shims import data, inbox, meta, shim, world
from tests.support.waiting import TIMEOUT

pytestmark = pytest.mark.anyio
__all__ = ["world"]  # a fixture


def _names(listed: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["name"]: row for row in listed["agents"]}


async def test_a_stamp_binds_the_call_and_leaves_the_arguments(world: dict[str, str]) -> None:
    async with shim(world) as a, shim(world) as b:
        await b.call_tool("receive_message", {}, meta=meta("b1", "bob"))
        stamp = {"session": "a1", "name": "alice"}
        sent = data(await a.call_tool("send_message", {"to": "bob", "text": "stamped",
                                                       FAKE_STAMP: stamp}))
        assert sent["state"] == "accepted", sent
        [got] = inbox(world, "b1")
        assert got["from"] == "alice"
        assert got["text"] == "stamped"
        # list_agents refuses any argument: the stamp is gone before it looks
        listed = await a.call_tool("list_agents", {FAKE_STAMP: stamp})
        assert not listed.is_error, data(listed)
        assert {"alice", "bob"} <= set(_names(data(listed)))


async def test_a_malformed_stamp_is_removed_and_refused(world: dict[str, str]) -> None:
    async with shim(world) as a:
        listed = await a.call_tool("list_agents", {FAKE_STAMP: 42})
        assert not listed.is_error, data(listed)
        # refused, and not passed over for the _meta evidence the same call carries
        res = await a.call_tool("send_message", {"to": "x", "text": "hi", FAKE_STAMP: "a1"},
                                meta=meta("a1", "alice"))
        assert res.is_error
        assert data(res)["error"] == "unbound"
        assert "alice" not in _names(data(await a.call_tool("list_agents", {})))


async def test_live_sessions_are_agents_before_any_call(world: dict[str, str],
                                                        tmp_path: Path) -> None:
    live = tmp_path / "live.json"
    live.write_text(json.dumps([{"session": "l1", "name": "livey"},
                                {"session": "l2", "name": "other"}]))
    host = {**world, "CROSSTALK_FAKE_LIVE": str(live)}
    async with shim(host) as _served, shim(world) as b:
        async def listed() -> dict[str, dict[str, Any]]:
            return _names(data(await b.call_tool("list_agents", {})))

        rows: dict[str, dict[str, Any]] = {}

        async def both() -> bool:
            rows.update(await listed())
            return {"livey", "other"} <= set(rows)

        await _until(both, "both live sessions listed")
        assert rows["livey"]["crosstalk"] is True
        sent = data(await b.call_tool("send_message", {"to": "livey", "text": "before a call"},
                                      meta=meta("b1", "bob")))
        assert sent["state"] == "accepted", sent
        assert [m["text"] for m in inbox(world, "l1")] == ["before a call"]

        # l2 goes; l1 is renamed: one retired, one follows its name
        live.write_text(json.dumps([{"session": "l1", "name": "renamed"}]))

        async def changed() -> bool:
            now = await listed()
            return "other" not in now and "renamed" in now and "livey" not in now

        await _until(changed, "l2 retired and l1 renamed")

        live.write_text("[{torn")  # no evidence: nothing changes
        live.write_text(json.dumps([]))

        async def none_left() -> bool:
            return "renamed" not in await listed()

        await _until(none_left, "an empty set retires l1")


async def _until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """``eventually`` for a check that is itself a tool call (a bound, never a timing)."""
    deadline = time.monotonic() + TIMEOUT
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened within {TIMEOUT} s: {what}")
        await asyncio.sleep(0.1)


def _env() -> dict[str, str]:
    return {"XDG_RUNTIME_DIR": tempfile.mkdtemp(prefix="ct-rt-", dir="/tmp")}


async def test_the_cap_and_call_bound_sessions(tmp_path: Path) -> None:
    ident = LiveFakeIdentifier(cwd="/w", live_file=str(tmp_path / "none.json"))
    shim_ = Shim(Registry(tmp_path / "state"), [ident], env=_env(), max_live=1)
    tools = Tools(shim_)
    loaded = shim_.harnesses[0]
    assert loaded.live is ident
    assert loaded.arguments is ident
    try:
        # c1 is bound by a call; no set has shown it, so an empty set does not retire it
        await tools.call("receive_message", {FAKE_STAMP: {"session": "c1"}}, None)
        await shim_.apply_live(loaded, [])
        assert ("fake", "c1") in shim_.agents
        first, second = Identity("fake", "s1", "/w"), Identity("fake", "s2", "/w")
        await shim_.apply_live(loaded, [first, second])
        assert ("fake", "s1") in shim_.agents
        assert ("fake", "s2") not in shim_.agents  # over the cap of 1
        await shim_.apply_live(loaded, [second])
        assert ("fake", "s1") not in shim_.agents
        assert ("fake", "s2") in shim_.agents  # the cap freed, s2 registers
    finally:
        await shim_.close()


def test_capabilities_are_checked_once() -> None:
    plain = LoadedHarness.of(FakeIdentifier())
    assert plain.arguments is not None
    assert plain.live is None
    live = LoadedHarness.of(LiveFakeIdentifier(live_file="/nonexistent"))
    assert live.live is not None
