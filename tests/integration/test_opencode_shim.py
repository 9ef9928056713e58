"""A real ``crosstalk mcp`` under a real opencode-like parent, driven by the official MCP client.

The parent is the fake opencode instance run as a process
(``tests/support/fakes/opencode_instance.py``): it serves its API on a unix socket, publishes
its record, and runs the shim as its child with ``OPENCODE_PID`` and ``OPENCODE=1``, on the
stdio the MCP client speaks over. Another shim (the fake harness) plays the peer.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.support.shims import data, inbox, meta, shim, world
from tests.support.waiting import TIMEOUT, eventually_sync

pytestmark = pytest.mark.anyio
__all__ = ["world"]  # a fixture

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Host:
    """The fake opencode process: commands in, results and prompts out (files)."""

    control: Path
    prompts: Path
    directory: Path

    def command(self, **cmd: Any) -> Any:
        out = Path(str(self.control) + ".out")
        done = len(out.read_text().splitlines()) if out.exists() else 0
        with self.control.open("a") as f:
            f.write(json.dumps(cmd) + "\n")
        eventually_sync(lambda: out.exists() and len(out.read_text().splitlines()) > done,
                        what=f"the fake opencode applied {cmd}")
        return json.loads(out.read_text().splitlines()[done])["result"]

    def prompts_to(self, sid: str) -> list[dict[str, Any]]:
        if not self.prompts.exists():
            return []
        rows = [json.loads(line) for line in self.prompts.read_text().splitlines()]
        return [r["body"] for r in rows if r["session"] == sid]


@asynccontextmanager
async def hosted(env: dict[str, str], tmp_path: Path) -> AsyncIterator[tuple[Client, Host]]:
    folder = tempfile.mkdtemp(prefix="ct-oc-", dir="/tmp")
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    host = Host(tmp_path / "control.jsonl", tmp_path / "prompts.jsonl", project)
    config = tmp_path / "opencode.json"
    config.write_text(json.dumps({"socket": os.path.join(folder, "i.sock"),
                                  "directory": str(project), "state": env["CROSSTALK_HOME"],
                                  "control": str(host.control),
                                  "prompts": str(host.prompts)}))
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "tests.support.fakes.opencode_instance", str(config), "--",
              sys.executable, "-m", "crosstalk", "mcp"],
        env={**env, "PYTHONPATH": str(REPO)}, cwd=str(REPO))
    try:
        async with Client(params, mode="legacy") as client:  # type: ignore[arg-type]
            yield client, host
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def rows(listed: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in listed["agents"]}


async def test_a_session_is_an_agent_before_its_model_calls(world: dict[str, str],
                                                            tmp_path: Path) -> None:
    async with hosted(world, tmp_path) as (oc, host), shim(world) as peer:
        await peer.call_tool("receive_message", {}, meta=meta("b1", "bob"))
        sid = host.command(op="session", title="alpha")
        found: dict[str, dict[str, Any]] = {}

        async def listed() -> bool:
            found.update(rows(data(await peer.call_tool("list_agents", {}))))
            # discovery may list it (crosstalk: false) a moment before its agent registers
            return "alpha" in found and found["alpha"]["crosstalk"] is True

        await _until(listed, "the opencode session registered")
        assert found["alpha"]["harness"] == "opencode"
        sent = data(await peer.call_tool("send_message", {"to": "alpha", "text": "wake up"},
                                         meta=meta("b1")))
        assert sent["state"] == "accepted", sent
        [body] = host.prompts_to(sid)
        assert "wake up" in body["parts"][0]["text"]
        assert body["parts"][0]["metadata"]["crosstalk"]["msg_id"] == sent["message_id"]

        # the model's own call: bound by the stamp, which leaves the arguments first
        stamp = {"sessionID": sid, "callID": "call_1"}
        back = data(await oc.call_tool("send_message", {"to": "bob", "text": "hi bob",
                                                        "_opencode": stamp}))
        assert back["state"] == "accepted", back
        assert [(m["from"], m["text"]) for m in inbox(world, "b1")] == [("alpha", "hi bob")]
        mine = await oc.call_tool("list_agents", {"_opencode": stamp})
        assert not mine.is_error, data(mine)
        box = data(await oc.call_tool("receive_message", {"_opencode": stamp}))
        assert [e["message_id"] for e in box["entries"]] == [sent["message_id"]]

        host.command(op="delete", sid=sid)

        async def retired() -> bool:
            return "alpha" not in rows(data(await peer.call_tool("list_agents", {})))

        await _until(retired, "the deleted session retired")


async def test_a_sub_agent_session_is_not_an_agent(world: dict[str, str],
                                                   tmp_path: Path) -> None:
    async with hosted(world, tmp_path) as (oc, host), shim(world) as peer:
        await peer.call_tool("receive_message", {}, meta=meta("b1", "bob"))
        root = host.command(op="session", title="root-one")
        child = host.command(op="session", title="child-one", parent=root)

        async def listed() -> bool:
            now = rows(data(await peer.call_tool("list_agents", {})))
            return "root-one" in now and now["root-one"]["crosstalk"] is True

        await _until(listed, "the root session registered")
        assert "child-one" not in rows(data(await peer.call_tool("list_agents", {})))
        # the sub-agent's own call is its root session's
        sent = data(await oc.call_tool("send_message", {
            "to": "bob", "text": "from the helper",
            "_opencode": {"sessionID": child, "callID": "call_2"}}))
        assert sent["state"] == "accepted", sent
        assert [m["from"] for m in inbox(world, "b1")] == ["root-one"]


async def test_a_forged_stamp_from_a_shim_not_under_opencode_binds_nothing(
        world: dict[str, str], tmp_path: Path) -> None:
    async with hosted(world, tmp_path) as (_oc, host):
        sid = host.command(op="session", title="victim")
        # OPENCODE_PID names a live process, but not this shim's parent
        forged = {**world, "OPENCODE": "1", "OPENCODE_PID": str(os.getppid())}
        async with shim(forged) as other:
            stamp = {"sessionID": sid, "callID": "call_x"}
            res = await other.call_tool("send_message", {"to": "victim", "text": "x",
                                                         "_opencode": stamp})
            assert res.is_error
            assert data(res)["error"] == "unbound"
            listed = await other.call_tool("list_agents", {"_opencode": stamp})
            assert not listed.is_error, data(listed)


async def _until(check: Callable[[], Any], what: str) -> None:
    """``eventually`` for a check that is itself a tool call (a bound, never a timing)."""
    deadline = time.monotonic() + TIMEOUT
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened within {TIMEOUT} s: {what}")
        await asyncio.sleep(0.1)

