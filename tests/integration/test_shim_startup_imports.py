"""What a real ``crosstalk mcp`` has imported by the time it answers its first ``tools/list``,
and what its first agent has imported before it sends anything.

The first ``tools/list`` needs neither the agent stack (A2A, the receiver) nor the harness
clients (httpx, websockets): they load on first use (ADR 0033). A shim that imports them at
start pays their import time and memory in every harness session, with or without agents.
The shim runs under a wrapper that writes ``sys.modules`` on exit; it exits on stdin EOF right
after the answer, so nothing that a later call would load is there. The second test is the
control: one bound call in the same set-up does load the agent stack, so the probe sees
imports that happen after start.

An agent that has not sent needs only the server side: its client side (``agent.outbound``,
the A2A client and transport, the card cache) loads with its first send, and httpx's command-
line client (rich, pygments: ~4 MB) never loads in a shim (ADR 0034). An agent that has not
been sent to over A2A has not loaded the SDK's server stack either (ADR 0044). The last test
is the control: a send from one session to another in the same shim loads the client side
and the receiver's server stack, and works.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from crosstalk.harness.fake import FAKE_NAME_META, FAKE_SESSION_META
from tests.support.shims import world

__all__ = ["world"]  # a fixture

#: Kept out of start-up. ``uvicorn``/``starlette`` are not here: the MCP SDK itself imports
#: them (the bare SDK server in bench/_bare_mcp_server.py loads them too).
HEAVY = ("crosstalk.agent", "crosstalk.a2a", "crosstalk.receiver", "crosstalk.store.journal",
         "a2a", "grpc", "google.protobuf", "httpx", "httpcore", "websockets",
         # ADR 0034: the records and mailbox (tool calls), Claude's injection side (the
         # harness packages re-export lazily), a CLI's rendering
         "crosstalk.core.records", "crosstalk.core.mailbox", "crosstalk.core.nudge",
         "crosstalk.harness.claude.injector", "crosstalk.harness.claude.gate",
         "crosstalk.harness.claude.receipts", "rich", "pygments",
         "argparse")  # a bare `crosstalk mcp` builds no parser

#: Kept out of an agent until it sends (ADR 0034): the client side, and httpx's CLI for good.
CLIENT_SIDE = ("crosstalk.agent.outbound", "crosstalk.a2a.client", "crosstalk.a2a.transport",
               "crosstalk.a2a.peers")
NEVER = ("httpx._main", "rich", "pygments")
#: Kept out of an agent until its first A2A request (ADR 0044): the SDK's server stack, and
#: our request handler and app on it.
SERVER_STACK = ("a2a.server.tasks", "a2a.server.request_handlers", "a2a.server.routes",
                "crosstalk.a2a.handler", "crosstalk.a2a.asgi")

PROBE = """
import atexit, json, sys
def dump() -> None:
    with open(sys.argv[1], "w") as f:
        json.dump(sorted(k for k, v in sys.modules.items() if v is not None), f)
atexit.register(dump)
from crosstalk.cli import main
sys.exit(main(["mcp"]))
"""


def _line(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj) + "\n").encode()


def _modules_after(env: dict[str, str], tmp_path: Path, calls: list[dict[str, Any]],
                   results: list[dict[str, Any]] | None = None) -> set[str]:
    """Start the shim, initialize, list tools, make ``calls`` (their results appended to
    ``results``), close stdin; its sys.modules."""
    out = tmp_path / "modules.json"
    _run_probe(PROBE, out, env, calls, results)
    return set(json.loads(out.read_text()))


def _run_probe(probe: str, out: Path, env: dict[str, str], calls: list[dict[str, Any]],
               results: list[dict[str, Any]] | None) -> None:
    proc = subprocess.Popen([sys.executable, "-c", probe, str(out)], env=env,
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
            if results is not None:
                results.append(answer["result"]["structuredContent"])
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _loaded(modules: set[str], name: str) -> bool:
    return name in modules or any(m.startswith(name + ".") for m in modules)


def test_first_tools_list_imports_no_heavy_module(world: dict[str, str],
                                                  tmp_path: Path) -> None:
    modules = _modules_after(world, tmp_path, [])
    assert "crosstalk.shim.catalog" in modules  # the probe saw the shim itself
    assert [h for h in HEAVY if _loaded(modules, h)] == []


#: Built after the first tools/list answer (ADR 0043): the roster, the tools, the registry and
#: every harness plugin.
BUILT_LATER = ("crosstalk.shim.build", "crosstalk.shim.roster", "crosstalk.shim.tools",
               "crosstalk.directory", "crosstalk.store.registry", "crosstalk.harness.loader",
               "crosstalk.harness.claude", "crosstalk.harness.codex")

#: The shim, with sys.modules noted each time a build is scheduled (at serving start and as
#: tools/list is answered) and at exit.
SCHEDULE_PROBE = """
import atexit, json, sys
from crosstalk.shim.serve import ShimBuild
seen = []
start_soon = ShimBuild.start_soon
def noting(self, *args):
    seen.append(sorted(k for k, v in sys.modules.items() if v is not None))
    start_soon(self, *args)
ShimBuild.start_soon = noting
def dump() -> None:
    with open(sys.argv[1], "w") as f:
        json.dump(seen, f)
atexit.register(dump)
from crosstalk.cli import main
sys.exit(main(["mcp"]))
"""


def test_the_shim_is_built_after_the_tools_list_answer(world: dict[str, str],
                                                       tmp_path: Path) -> None:
    out = tmp_path / "scheduled.json"
    call = {"name": "receive_message", "arguments": {}, "_meta": {FAKE_SESSION_META: "s1"}}
    results: list[dict[str, Any]] = []
    _run_probe(SCHEDULE_PROBE, out, world, [call], results)
    scheduled = [set(m) for m in json.loads(out.read_text())]
    assert len(scheduled) == 2  # at serving start, and as tools/list was answered
    assert [[m for m in BUILT_LATER if _loaded(s, m)] for s in scheduled] == [[], []]
    assert "entries" in results[0]  # and the call is served by the build


def test_a_bound_call_loads_the_agent_stack(world: dict[str, str], tmp_path: Path) -> None:
    call = {"name": "receive_message", "arguments": {},
            "_meta": {FAKE_SESSION_META: "s1"}}
    modules = _modules_after(world, tmp_path, [call])
    assert _loaded(modules, "crosstalk.agent")
    assert _loaded(modules, "crosstalk.receiver")


def _bound(tool: str, session: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": tool, "arguments": arguments,
            "_meta": {FAKE_SESSION_META: session, FAKE_NAME_META: name}}


def test_an_agent_that_has_not_sent_loads_no_client_side(world: dict[str, str],
                                                         tmp_path: Path) -> None:
    modules = _modules_after(world, tmp_path, [_bound("receive_message", "s1", "alice"),
                                               _bound("receive_message", "s2", "bob")])
    assert _loaded(modules, "crosstalk.agent")  # two agents are serving
    assert _loaded(modules, "crosstalk.a2a.listener")  # each on its A2A listener
    assert [m for m in CLIENT_SIDE + NEVER + SERVER_STACK if _loaded(modules, m)] == []


def test_a_send_loads_the_client_side_and_is_delivered(world: dict[str, str],
                                                       tmp_path: Path) -> None:
    answers: list[dict[str, Any]] = []
    modules = _modules_after(world, tmp_path, [
        _bound("receive_message", "s2", "bob"),
        _bound("send_message", "s1", "alice", to="bob", text="hello"),
        _bound("receive_message", "s2", "bob")], answers)
    sent, inbox = answers[1], answers[2]
    assert "error" not in sent, sent
    assert [e["text"] for e in inbox["entries"]] == ["hello"], inbox
    assert [m for m in CLIENT_SIDE if not _loaded(modules, m)] == []
    assert [m for m in SERVER_STACK if not _loaded(modules, m)] == []  # bob answered on A2A
    assert [m for m in NEVER if _loaded(modules, m)] == []
