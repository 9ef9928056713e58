"""The seven tools' catalog and the MCP server that serves it: what the first ``tools/list``
needs, and nothing else.

The catalog (names, descriptions, argument schemas) is the tool contract of design doc §5.
It lives apart from the tools' implementation (:mod:`.tools`), which needs the registry, the
directory and the harness plugins: the server answers ``tools/list`` from here while the shim
is still being built (ADR 0043), and a ``tools/call`` waits for the build.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from mcp import types
from mcp.server import Server, ServerRequestContext
from mcp.shared.exceptions import MCPError

from crosstalk._version import __version__

MAX_TEXT = 64 * 1024


def _schema(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required,
            "additionalProperties": False}


_TO = {"type": "string", "minLength": 1,
       "description": "An agent name or agent_id from list_agents."}
_TEXT = {"type": "string", "minLength": 1, "description": "The message text."}

TOOLS: list[types.Tool] = [
    types.Tool(
        name="list_agents",
        description=("List the agent sessions on this machine you can message: name, harness, "
                     "cwd, status, whether CrossTalk serves them and whether they are reachable. "
                     "A session with crosstalk=false receives send_message informs only (it "
                     "cannot answer an ask). Call it before messaging someone whose exact name "
                     "you do not know; where names repeat, address one by its agent_id."),
        input_schema=_schema({}, []),
    ),
    types.Tool(
        name="send_message",
        description=("Send a message to another agent session by name; it arrives inside that "
                     "session. kind=inform (default) shares information; kind=command asks it to "
                     "act and is only allowed where you have authority. delivery=next_turn "
                     "waits for the session's next turn instead of interrupting it. No reply is "
                     "expected; use ask when you need an answer."),
        input_schema=_schema({
            "to": _TO, "text": _TEXT,
            "kind": {"type": "string", "enum": ["inform", "command"], "default": "inform"},
            "delivery": {"type": "string", "enum": ["immediate", "next_turn"],
                         "default": "immediate"},
        }, ["to", "text"]),
    ),
    types.Tool(
        name="ask",
        description=("Ask another agent session a question. It returns once the question is "
                     "delivered; the answer arrives later as a message in this session, marked "
                     "in-reply-to this message_id. deadline_seconds=0 means no deadline."),
        input_schema=_schema({
            "to": _TO, "text": _TEXT,
            "deadline_seconds": {"type": "integer", "minimum": 0, "maximum": 86400,
                                 "default": 0},
        }, ["to", "text"]),
    ),
    types.Tool(
        name="reply",
        description=("Answer a message you received, naming its message_id (shown in the "
                     "[crosstalk message-id=…] line). Use this, not a native SendMessage, to "
                     "answer an ask: only reply routes the answer back to the asker."),
        input_schema=_schema({"message_id": {"type": "string", "minLength": 1}, "text": _TEXT},
                             ["message_id", "text"]),
    ),
    types.Tool(
        name="receive_message",
        description=("Read this session's CrossTalk mailbox: messages that reached it (or "
                     "failed to), newest changes last, with a cursor to page on. Use it to find "
                     "a message_id to reply to, or to see what you may have missed."),
        input_schema=_schema({
            "state": {"type": "string", "description": "Only entries in this state."},
            "after": {"type": "string", "description": "The next_cursor of a previous call."},
            "limit": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20},
        }, []),
    ),
    types.Tool(
        name="claim",
        description=("Claim an unclaimed agent as your subagent: you become its owner, only "
                     "you may send it commands, and it is told. Only a primary may claim; "
                     "an agent never claims itself or one that another agent owns."),
        input_schema=_schema({"name": _TO}, ["name"]),
    ),
    types.Tool(
        name="release",
        description=("Release an agent you own; it becomes a primary again and is told. Only "
                     "its owner may release it."),
        input_schema=_schema({"name": _TO}, ["name"]),
    ),
]
TOOL_NAMES = {t.name for t in TOOLS}
#: JSON-RPC "invalid params": the MCP spec's answer to ``tools/call`` of an unknown tool.
INVALID_PARAMS = -32602


def tool_result(payload: Mapping[str, Any], *, error: bool = False) -> types.CallToolResult:
    """Every tool's result: JSON text plus ``structuredContent``, ``None`` fields left out."""
    data = {k: v for k, v in payload.items() if v is not None}
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(data, sort_keys=True))],
        structured_content=data, is_error=error)


def _unavailable(exc: Exception) -> types.CallToolResult:
    """A tool result the model can read, not the SDK's bare "Internal server error"."""
    return tool_result({"error": "shim_unavailable",
                        "hint": f"CrossTalk could not start in this session "
                                f"({type(exc).__name__}: {exc}); `crosstalk doctor` says more"},
                       error=True)


class Caller(Protocol):
    """What answers a ``tools/call`` of a known tool (:class:`.tools.Tools`)."""

    async def call(self, name: str, args: Mapping[str, Any] | None,
                   meta: Mapping[str, Any] | None) -> types.CallToolResult: ...


def build_server(tools: Callable[[], Awaitable[Caller]],
                 on_listed: Callable[[], None] | None = None) -> Server[Any]:
    """The shim's MCP server. ``tools`` gives the caller of known tools (awaiting its build);
    ``on_listed`` runs as each ``tools/list`` is answered."""

    async def on_list_tools(ctx: ServerRequestContext[Any, Any],
                            params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        if on_listed is not None:
            on_listed()
        return types.ListToolsResult(tools=TOOLS)

    async def on_call_tool(ctx: ServerRequestContext[Any, Any],
                           params: types.CallToolRequestParams) -> types.CallToolResult:
        if params.name not in TOOL_NAMES:
            # A protocol error, not a tool result: the MCP spec lists unknown tools among
            # protocol errors (-32602); ``isError`` means a tool ran and refused, and generic
            # clients (MCP Inspector) show the two differently. Checked before identity, so
            # an unbound call gets the same answer.
            raise MCPError(code=INVALID_PARAMS, message=f"Unknown tool: {params.name}",
                           data={"tools": sorted(TOOL_NAMES)})
        try:
            caller = await tools()
        except Exception as exc:  # the build failed, and logged why with its traceback
            return _unavailable(exc)
        return await caller.call(params.name, params.arguments, ctx.meta)

    return Server("crosstalk", version=__version__,
                  instructions=("CrossTalk: message other AI coding-agent sessions on this "
                                "machine by name (list_agents, send_message, ask, reply, "
                                "receive_message, claim, release)."),
                  on_list_tools=on_list_tools, on_call_tool=on_call_tool)
