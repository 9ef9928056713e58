"""Fake Claude sessions whose children are real ``crosstalk mcp`` shims, each spoken to by the
official MCP client: :class:`Node` is one session and its shim, ``world`` (a fixture; a test
module imports it to use it) makes them and stops them, and their shims, at teardown. ``world``
takes the session environment from the test module's ``env`` fixture.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from crosstalk.core.ids import agent_id_for
from crosstalk.store.registry import Registry
from tests.support.claude import FakeClaude, running
from tests.support.waiting import eventually, eventually_sync

META_LINE = re.compile(r"^\[crosstalk message-id=(\S+) kind=(\w+)", re.M)


def data(result: Any) -> dict[str, Any]:
    assert result.structured_content is not None
    return dict(json.loads(result.content[0].text))


@dataclass
class Node:
    """One fake Claude session, and the MCP client of its shim when it has one."""

    fc: FakeClaude
    env: dict[str, str]
    client: Client | None = None
    stack: contextlib.AsyncExitStack = field(default_factory=contextlib.AsyncExitStack)

    @property
    def agent_id(self) -> str:
        return agent_id_for("claude", self.fc.session_id)

    async def connect(self) -> Client:
        """Start the shim (as Claude does at session start) and wait for its registration."""
        self.client = await self.stack.enter_async_context(Client(self.fc.server_params()))
        aid = self.agent_id
        await eventually(lambda: Registry(Path(self.env["CROSSTALK_HOME"])).live_descriptor(aid)
                    is not None, what=f"{self.fc.name} registered")
        return self.client

    async def disconnect(self) -> None:
        await self.stack.aclose()
        self.stack = contextlib.AsyncExitStack()
        self.client = None

    async def call(self, tool: str, **args: Any) -> dict[str, Any]:
        assert self.client is not None
        return data(await self.client.call_tool(tool, args))

    def inbound(self) -> list[dict[str, Any]]:
        """User frames that reached this session's model (not dropped by the session guard)."""
        return [f for f in self.fc.frames()
                if f["frame"].get("type") == "user" and not f.get("dropped")]

    def contents(self) -> list[str]:
        return [str(f["frame"]["message"]["content"]) for f in self.inbound()]

    def message_ids(self) -> list[tuple[str, str]]:
        return [(m.group(1), m.group(2)) for c in self.contents()
                for m in [META_LINE.search(c)] if m]


@pytest.fixture
async def world(tmp_path: Path, env: dict[str, str]) -> AsyncIterator[Callable[..., Node]]:
    nodes: list[Node] = []

    def make(name: str, **kw: Any) -> Node:
        node = Node(FakeClaude(tmp_path, name, env=env, **kw).start(), env)
        nodes.append(node)
        return node

    yield make
    shims: set[int] = set()
    for node in nodes:
        with contextlib.suppress(Exception):
            await node.disconnect()
        if node.fc.alive():
            shims.update(node.fc.kill_shims("KILL"))
        node.fc.stop()
    eventually_sync(lambda: not any(running(p) for p in shims), timeout=10)
