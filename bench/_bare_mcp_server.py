"""A bare official-SDK stdio MCP server with one tool: the start-up baseline for bench/shim.py.

It is built the way ``crosstalk.shim.serve`` builds the shim (low-level ``Server``,
``stdio_server``, ``asyncio.run``) but imports nothing from CrossTalk, so the difference in
start-to-first ``tools/list`` time between the two is what CrossTalk adds over the SDK.
Run as ``python bench/_bare_mcp_server.py``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from mcp import types
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server

TOOL = types.Tool(
    name="echo",
    description="Echo the text back.",
    input_schema={"type": "object", "properties": {"text": {"type": "string"}},
                  "required": ["text"], "additionalProperties": False},
)


async def on_list_tools(ctx: ServerRequestContext[Any, Any],
                        params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[TOOL])


async def on_call_tool(ctx: ServerRequestContext[Any, Any],
                       params: types.CallToolRequestParams) -> types.CallToolResult:
    text = str((params.arguments or {}).get("text", ""))
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


async def main() -> None:
    server: Server[Any] = Server("bare", on_list_tools=on_list_tools, on_call_tool=on_call_tool)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    asyncio.run(main())
