"""The shim is built after its tools are listed, once, and a call waits for the build (ADR 0043).

The official MCP client talks to the real server (``shim.catalog.build_server``) in process;
the build is a function this test controls, so what ran when is counted, not timed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest
from mcp import Client, types

from crosstalk.shim.catalog import TOOL_NAMES, build_server
from crosstalk.shim.serve import ShimBuild

pytestmark = pytest.mark.anyio


class _Shim:
    def __init__(self) -> None:
        self.closed = 0

    async def close(self) -> None:
        self.closed += 1


class _Tools:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def call(self, name: str, args: Mapping[str, Any] | None,
                   meta: Mapping[str, Any] | None) -> types.CallToolResult:
        self.calls.append(name)
        return types.CallToolResult(content=[types.TextContent(type="text", text=name)])


class _Build:
    def __init__(self, error: Exception | None = None) -> None:
        self.runs, self.error = 0, error
        self.shim, self.tools = _Shim(), _Tools()

    def __call__(self) -> Any:
        self.runs += 1
        if self.error is not None:
            raise self.error
        return self.shim, self.tools


async def test_tools_list_is_answered_without_building_and_schedules_the_build() -> None:
    build = _Build()
    shim = ShimBuild(build)
    async with Client(build_server(shim.tools, on_listed=shim.start_soon)) as client:
        listed = await client.list_tools()
        assert {t.name for t in listed.tools} == TOOL_NAMES
        assert build.runs == 0  # answered first; the build follows
        assert await shim.finished(timeout=30)
        assert build.runs == 1
        assert shim.shim is build.shim  # type: ignore[comparison-overlap]
        await client.list_tools()
        await client.call_tool("list_agents", {})
    assert build.runs == 1
    assert build.tools.calls == ["list_agents"]
    await shim.close()
    assert build.shim.closed == 1


async def test_a_call_before_any_listing_builds_and_waits() -> None:
    build = _Build()
    shim = ShimBuild(build)
    async with Client(build_server(shim.tools, on_listed=shim.start_soon)) as client:
        calls = [client.call_tool("receive_message", {}) for _ in range(3)]
        got = await asyncio.gather(*calls)
    assert [r.content[0].text for r in got] == ["receive_message"] * 3  # type: ignore[union-attr]
    assert build.runs == 1


async def test_a_failed_build_fails_each_call_with_its_error_and_is_not_retried() -> None:
    build = _Build(RuntimeError("no state directory"))
    shim = ShimBuild(build)
    async with Client(build_server(shim.tools, on_listed=shim.start_soon)) as client:
        assert len((await client.list_tools()).tools) == len(TOOL_NAMES)
        for _ in range(2):
            result = await client.call_tool("list_agents", {})
            assert result.is_error
            assert result.structured_content is not None
            assert result.structured_content["error"] == "shim_unavailable"
            assert "no state directory" in result.structured_content["hint"]
    assert build.runs == 1
    assert shim.shim is None
    await shim.close()  # nothing built, nothing to close, no error


async def test_close_waits_for_a_build_under_way() -> None:
    build = _Build()
    shim = ShimBuild(build)
    shim.start()
    await shim.close()
    assert build.runs == 1
    assert build.shim.closed == 1


@pytest.mark.parametrize("delay", [0.0, 0.05])
async def test_start_soon_starts_one_build_however_often_it_is_asked(delay: float) -> None:
    build = _Build()
    shim = ShimBuild(build)
    for _ in range(5):
        shim.start_soon(delay)
    assert await shim.finished(timeout=30)
    shim.start_soon(delay)
    await asyncio.sleep(delay * 2)
    assert build.runs == 1
