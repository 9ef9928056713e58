"""``tools/call`` of a tool the server does not have is a JSON-RPC protocol error (issue 13 §3).

The MCP spec (server/tools, "Error Handling") lists "unknown tools" among the *protocol*
errors, answered ``-32602``; a tool result with ``isError`` is for a tool that ran and failed.
MCP Inspector and other generic clients tell the two apart: a result reads as "the tool said
no", an error as "no such tool". Driven with the official ``mcp`` ClientSession against a real
``crosstalk mcp`` process (the fake harness).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

from tests.support.shims import data, meta, world

pytestmark = pytest.mark.anyio
__all__ = ["world"]  # fixtures

INVALID_PARAMS = -32602


async def test_an_unknown_tool_is_a_protocol_error_not_a_tool_result(
        world: dict[str, str], tmp_path: Path) -> None:
    params = StdioServerParameters(command=sys.executable, args=["-m", "crosstalk", "mcp"],
                                   env=world)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        for call_meta in (meta("u1", "una"), None):  # bound to a session, and unbound
            with pytest.raises(MCPError) as caught:
                await session.call_tool("no_such_tool", {}, meta=call_meta)
            assert caught.value.code == INVALID_PARAMS, caught.value.error
            assert "no_such_tool" in caught.value.message
        # the session is still served, and a known tool still answers with a result
        listed = await session.call_tool("list_agents", {}, meta=meta("u1", "una"))
        assert not listed.is_error
        assert "agents" in data(listed)
        refused = await session.call_tool("send_message", {"to": "x"}, meta=meta("u1"))
        assert refused.is_error  # a known tool's own refusal stays a tool result
        assert data(refused)["error"] == "invalid_arguments"
