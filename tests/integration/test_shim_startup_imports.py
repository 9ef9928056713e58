"""What a real ``crosstalk mcp`` has imported by the time it answers its first ``tools/list``.

The first ``tools/list`` needs neither the agent stack (A2A, the receiver) nor the harness
clients (httpx, websockets): they load on first use (ADR 0033). A shim that imports them at
start pays their import time and memory in every harness session, with or without agents.
The shim runs under a wrapper that writes ``sys.modules`` on exit; it exits on stdin EOF right
after the answer, so nothing that a later call would load is there. The second test is the
control: one bound call in the same set-up does load the agent stack, so the probe sees
imports that happen after start.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from crosstalk.harness.fake import FAKE_SESSION_META
from tests.support.shims import world

__all__ = ["world"]  # a fixture

#: Kept out of start-up. ``uvicorn``/``starlette`` are not here: the MCP SDK itself imports
#: them (the bare SDK server in bench/_bare_mcp_server.py loads them too).
HEAVY = ("crosstalk.agent", "crosstalk.a2a", "crosstalk.receiver", "crosstalk.store.journal",
         "a2a", "grpc", "google.protobuf", "httpx", "httpcore", "websockets")

PROBE = """
import atexit, json, sys
def dump() -> None:
    with open(sys.argv[1], "w") as f:
        json.dump(sorted(sys.modules), f)
atexit.register(dump)
from crosstalk.cli import main
sys.exit(main(["mcp"]))
"""


def _line(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj) + "\n").encode()


def _modules_after(env: dict[str, str], tmp_path: Path, calls: list[dict[str, Any]]) -> set[str]:
    """Start the shim, initialize, list tools, make ``calls``, close stdin; its sys.modules."""
    out = tmp_path / "modules.json"
    proc = subprocess.Popen([sys.executable, "-c", PROBE, str(out)], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None
    assert proc.stdout is not None
    try:
        proc.stdin.write(_line({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "test", "version": "0"}}}))
        proc.stdin.write(_line({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        proc.stdin.write(_line({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}))
        proc.stdin.flush()
        answers = [json.loads(proc.stdout.readline()) for _ in range(2)]
        assert [a.get("id") for a in answers] == [1, 2]
        assert {t["name"] for t in answers[1]["result"]["tools"]} >= {"list_agents", "ask"}
        for n, call in enumerate(calls, start=3):
            proc.stdin.write(_line({"jsonrpc": "2.0", "id": n, "method": "tools/call",
                                    "params": call}))
            proc.stdin.flush()
            answer = json.loads(proc.stdout.readline())
            assert answer.get("id") == n, answer
            assert "result" in answer, answer
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return set(json.loads(out.read_text()))


def _loaded(modules: set[str], name: str) -> bool:
    return name in modules or any(m.startswith(name + ".") for m in modules)


def test_first_tools_list_imports_no_heavy_module(world: dict[str, str],
                                                  tmp_path: Path) -> None:
    modules = _modules_after(world, tmp_path, [])
    assert "crosstalk.shim.tools" in modules  # the probe saw the shim itself
    assert [h for h in HEAVY if _loaded(modules, h)] == []


def test_a_bound_call_loads_the_agent_stack(world: dict[str, str], tmp_path: Path) -> None:
    call = {"name": "receive_message", "arguments": {},
            "_meta": {FAKE_SESSION_META: "s1"}}
    modules = _modules_after(world, tmp_path, [call])
    assert _loaded(modules, "crosstalk.agent")
    assert _loaded(modules, "crosstalk.receiver")
