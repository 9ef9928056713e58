"""A stdio MCP server that logs every message it receives, for the opencode plugin's live tests.

    python logging_mcp.py <server name> <log.jsonl>

Standard library only (hand-written JSON-RPC, one object per line, as opencode speaks it). It
logs its start-up (pid, ppid, cwd, the ``OPENCODE*`` environment) and each message received,
and offers one tool, ``echo``, which returns its arguments as JSON text. Registered in opencode
under two names (``crosstalk`` and another), it shows which of them get the plugin's stamp:
the model sees ``crosstalk_echo`` and ``<other>_echo``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

NAME, LOG = sys.argv[1], sys.argv[2]
TOOLS = [{"name": "echo", "description": "Return the call's arguments.",
          "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}}}]


def log(kind: str, obj: Any) -> None:
    with open(LOG, "a", encoding="utf-8") as f:
        f.write(json.dumps({"t": time.time(), "server": NAME, "pid": os.getpid(),
                            "kind": kind, "msg": obj}) + "\n")


def send(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> None:
    log("startup", {"ppid": os.getppid(), "cwd": os.getcwd(),
                    "env": {k: v for k, v in os.environ.items()
                            if k.startswith(("OPENCODE", "CROSSTALK"))}})
    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            log("unparsable", line)
            continue
        log("recv", msg)
        method, mid = msg.get("method"), msg.get("id")
        if mid is None or method is None:
            continue
        params = msg.get("params") or {}
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": mid, "result": {
                "protocolVersion": params.get("protocolVersion", "2025-06-18"),
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": NAME, "version": "0"}}})
        elif method == "tools/list":
            send({"jsonrpc": "2.0", "id": mid, "result": {"tools": TOOLS}})
        elif method == "tools/call":
            text = json.dumps({"server": NAME, "arguments": params.get("arguments")})
            send({"jsonrpc": "2.0", "id": mid, "result": {
                "content": [{"type": "text", "text": text}], "isError": False}})
        elif method == "ping":
            send({"jsonrpc": "2.0", "id": mid, "result": {}})
        else:
            send({"jsonrpc": "2.0", "id": mid,
                  "error": {"code": -32601, "message": f"no method {method}"}})


if __name__ == "__main__":
    main()
