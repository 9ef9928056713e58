"""Shim benchmark: ``crosstalk mcp`` start-up, ``list_agents`` over 200 and 1,000 agents, memory.

Drives real ``python -m crosstalk mcp`` processes with the official MCP client over stdio, with
``CROSSTALK_HARNESS=fake`` standing in for the sessions (a call names its session in ``_meta``
and the shim creates that session's agent on its first call). Prints one JSON line per figure;
every figure's baseline is measured in the same run:

* ``mcp_start_to_tools_list``: spawn to the first ``tools/list`` answer. Baselines: interpreter
  start (spawn ``python -c "import sys"`` and reap it) and a bare official-SDK stdio server with
  one tool (``bench/_bare_mcp_server.py``), so the figure shows what CrossTalk adds over the SDK.
  Runs are interleaved round-robin after one untimed warm-up round.
* ``mcp_cpu_to_tools_list``: the shim's CPU time (user + system) at that answer, beside the
  bare SDK server's (``baseline_sdk_server_cpu_to_tools_list``): the same start-up cost, far
  less moved by other load on a shared machine than the wall-clock figure.
* ``list_agents_200`` (and ``_1000``): ``list_agents`` answered by a fresh shim while 200
  (1,000) agents are registered
  (fake sessions spread over several shims, one ``receive_message`` each). Baselines: the raw
  descriptor read (``Registry.scan()`` in this process on the same state directory) and an
  unbound ``tools/call`` on the same client (the stdio + dispatch floor; it touches no state).
* ``list_agents_200_claude_sessions``: the same answer when the machine has 200 Claude sessions
  without CrossTalk (sleeping processes with real records, so liveness runs for real).
  Baseline: Claude discovery in this process.
* ``shim_rss_8_agents``: VmRSS of one shim serving 8 agents. Baseline: the same shim right
  after start (0 agents); the bare SDK server's VmRSS is reported beside it. Then
  ``shim_rss_8_agents_after_a2a_send``: the same shim once one of them has sent to another
  (the A2A client side and the SDK's server stack loaded).

Percentiles are nearest-rank (with few runs p99 is the maximum). Everything lives in a temp dir
under /tmp; agents listen on 127.0.0.1 and unix sockets only. Progress goes to stderr.
Both listings run with 200 and with 1,000 agents (``--sessions 50,250``).
Usage: ``python bench/shim.py [--runs 20] [--shims 4] [--sessions 50,250] [--calls 50]
[--only start,list,rss]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from mcp import Client
from mcp.client.stdio import StdioServerParameters

from _procs import child_pids, cpu_seconds, proc_status, reap_children
from crosstalk import proc
from crosstalk.harness.claude.registry import discover as claude_discover
from crosstalk.harness.fake import FAKE_NAME_META, FAKE_SESSION_META
from crosstalk.store.registry import DescriptorLiveness, Registry

BARE_SERVER = Path(__file__).resolve().with_name("_bare_mcp_server.py")
SHIM_ARGV = ["-m", "crosstalk", "mcp"]
SHIM_TOOLS = 7
SETTLE_SECONDS = 0.3  # let a process finish what a call started before reading its RSS
FIGURE_GROUPS = ("start", "list", "rss")


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def progress(msg: str) -> None:
    print(f"bench/shim: {msg}", file=sys.stderr, flush=True)


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def ms(values: list[float]) -> dict[str, object]:
    return {"n": len(values), "p50_ms": round(pct(values, 50) * 1e3, 2),
            "p99_ms": round(pct(values, 99) * 1e3, 2), "min_ms": round(min(values) * 1e3, 2),
            "max_ms": round(max(values) * 1e3, 2)}


# -- clients -----------------------------------------------------------------------------------


def world(tmp: Path, tag: str) -> dict[str, str]:
    """An isolated environment: its own state dir, runtime (socket) dir and fake inboxes."""
    return {**os.environ, "CROSSTALK_HOME": str(tmp / f"state-{tag}"),
            "CLAUDE_CONFIG_DIR": str(tmp / f"claude-{tag}"), "HOME": str(tmp),
            "XDG_RUNTIME_DIR": str(tmp / f"rt-{tag}"), "CROSSTALK_HARNESS": "fake",
            "CROSSTALK_FAKE_INBOX": str(tmp / f"inbox-{tag}")}


def params(argv: list[str], env: dict[str, str], cwd: Path) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=argv, env=env, cwd=str(cwd))


@contextlib.asynccontextmanager
async def connect(argv: list[str], env: dict[str, str],
                  cwd: Path) -> AsyncIterator[tuple[Client, int]]:
    """An initialized client and the server's pid (call it with no other spawn in flight)."""
    before = child_pids()
    async with Client(params(argv, env, cwd), mode="legacy") as client:
        new = child_pids() - before
        if len(new) != 1:
            raise RuntimeError(f"cannot tell the server's pid among {sorted(new)}")
        yield client, new.pop()


def meta(session: str, name: str) -> dict[str, Any]:
    return {FAKE_SESSION_META: session, FAKE_NAME_META: name}


def payload(result: Any) -> dict[str, Any]:
    if result.structured_content is None:
        raise RuntimeError(f"tool result without structured content: {result}")
    return dict(result.structured_content)


async def register(client: Client, session: str, name: str) -> None:
    got = payload(await client.call_tool("receive_message", {}, meta=meta(session, name)))
    if "entries" not in got:
        raise RuntimeError(f"session {session} did not register: {got}")


# -- 1. start to first tools/list ------------------------------------------------------------


async def spawn_to_exit(env: dict[str, str], cwd: Path) -> float:
    t = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "import sys", env=env,
                                                cwd=cwd, stdin=subprocess.DEVNULL)
    code = await proc.wait()
    took = time.perf_counter() - t
    if code != 0:
        raise RuntimeError(f"python -c 'import sys' exited {code}")
    return took


async def spawn_to_tools_list(argv: list[str], env: dict[str, str], cwd: Path,
                              expect: int, cpu: list[float] | None = None) -> float:
    """Wall time from spawn to the first ``tools/list`` answer; the server's CPU time by then
    is appended to ``cpu`` (on a shared machine it moves far less than wall time)."""
    client = Client(params(argv, env, cwd), mode="legacy")
    before = child_pids()
    t = time.perf_counter()
    async with client as c:
        listed = await c.list_tools()
        took = time.perf_counter() - t
        if cpu is not None:
            new = child_pids() - before
            if len(new) != 1:
                raise RuntimeError(f"cannot tell the server's pid among {sorted(new)}")
            cpu.append(cpu_seconds(new.pop()))
    if len(listed.tools) != expect:
        raise RuntimeError(f"{argv}: listed {len(listed.tools)} tools, expected {expect}")
    return took


async def bench_start(tmp: Path, runs: int) -> None:
    env = world(tmp, "start")
    cpu: dict[str, list[float]] = {"sdk": [], "crosstalk": []}
    kinds: dict[str, Callable[[], Awaitable[float]]] = {
        "interpreter": lambda: spawn_to_exit(env, tmp),
        "sdk": lambda: spawn_to_tools_list([str(BARE_SERVER)], env, tmp, 1, cpu["sdk"]),
        "crosstalk": lambda: spawn_to_tools_list(SHIM_ARGV, env, tmp, SHIM_TOOLS,
                                                 cpu["crosstalk"]),
    }
    samples: dict[str, list[float]] = {k: [] for k in kinds}
    for i in range(runs + 1):  # round 0 warms the page cache and bytecode caches
        progress(f"start-up round {i}/{runs}")
        for kind, run in kinds.items():
            took = await run()
            if i:
                samples[kind].append(took)
            elif kind in cpu:
                cpu[kind].clear()
    interp, sdk, ct = samples["interpreter"], samples["sdk"], samples["crosstalk"]
    emit(figure="baseline_interpreter_start", **ms(interp),
         note="spawn python -c 'import sys' and reap it")
    emit(figure="baseline_sdk_server_start_to_tools_list", **ms(sdk),
         note="bare official-SDK stdio server with one tool; includes initialize")
    emit(figure="mcp_start_to_tools_list", **ms(ct),
         baseline="baseline_sdk_server_start_to_tools_list",
         over_sdk_p50_ms=round((pct(ct, 50) - pct(sdk, 50)) * 1e3, 1),
         over_interpreter_p50_ms=round((pct(ct, 50) - pct(interp, 50)) * 1e3, 1),
         vs_sdk=round(pct(ct, 50) / pct(sdk, 50), 2),
         note="spawn python -m crosstalk mcp, initialize, first tools/list answered")
    emit(figure="baseline_sdk_server_cpu_to_tools_list", **ms(cpu["sdk"]),
         note="the bare SDK server's user+system CPU time at its first tools/list answer")
    emit(figure="mcp_cpu_to_tools_list", **ms(cpu["crosstalk"]),
         baseline="baseline_sdk_server_cpu_to_tools_list",
         over_sdk_p50_ms=round((pct(cpu["crosstalk"], 50) - pct(cpu["sdk"], 50)) * 1e3, 1),
         note="the shim's user+system CPU time at its first tools/list answer (10 ms ticks); "
              "a shared machine moves it far less than the wall-clock figure")


# -- 2. list_agents with 200 (1,000) agents----------------------------------------------------


async def timed_calls(client: Client, calls: int, name: str,
                      args: dict[str, Any]) -> tuple[list[float], dict[str, Any]]:
    lat, last = [], {}
    for _ in range(calls):
        t = time.perf_counter()
        res = await client.call_tool(name, args)
        lat.append(time.perf_counter() - t)
        last = payload(res)
    return lat, last


async def time_listing(lister: Client, reg: Registry, total: int, calls: int,
                       ) -> tuple[list[Any], list[float], list[float], list[float]]:
    """list_agents answered by ``lister``; the unbound-call floor; the in-process scan."""
    first = payload(await lister.call_tool("list_agents", {}))["agents"]  # also a warm-up
    if len(first) != total:
        raise RuntimeError(f"list_agents shows {len(first)} agents, not {total}")
    progress(f"timing {calls} list_agents calls")
    lat, last = await timed_calls(lister, calls, "list_agents", {})
    if len(last["agents"]) != total:
        raise RuntimeError("agents went missing while listing")
    floor, last = await timed_calls(lister, calls, "send_message", {"to": "x", "text": "y"})
    if last.get("error") != "unbound":
        raise RuntimeError(f"expected an unbound refusal: {last}")
    scan = []
    reg.scan()
    for _ in range(calls):
        t = time.perf_counter()
        listed, _bad = reg.scan()
        scan.append(time.perf_counter() - t)
        live = sum(1 for item in listed if item.liveness is DescriptorLiveness.LIVE)
        if live != total:
            raise RuntimeError(f"Registry.scan() sees {live} live agents, not {total}")
    return first, lat, floor, scan


async def bench_list_agents(tmp: Path, shims: int, sessions: int, calls: int) -> None:
    env = world(tmp, f"list-{shims * sessions}")
    total = shims * sessions
    up = [asyncio.Event() for _ in range(shims)]
    done = [asyncio.Event() for _ in range(shims)]
    go, stop = asyncio.Event(), asyncio.Event()

    async def serve_sessions(k: int) -> None:
        async with Client(params(SHIM_ARGV, env, tmp), mode="legacy") as c:
            up[k].set()
            await go.wait()
            await asyncio.gather(*(register(c, f"s{k}-{i}", f"bench-{k}-{i}")
                                   for i in range(sessions)))
            done[k].set()
            await stop.wait()

    async with asyncio.TaskGroup() as tg:
        try:
            for k in range(shims):
                tg.create_task(serve_sessions(k))
            progress(f"starting {shims} shims and a lister")
            async with Client(params(SHIM_ARGV, env, tmp), mode="legacy") as lister:
                for ev in up:
                    await ev.wait()
                progress(f"registering {total} agents ({shims} shims x {sessions} sessions)")
                t = time.perf_counter()
                go.set()
                for ev in done:
                    await ev.wait()
                register_seconds = time.perf_counter() - t

                first, lat, floor, scan = await time_listing(
                    lister, Registry(Path(env["CROSSTALK_HOME"])), total, calls)
        finally:
            stop.set()
        progress("stopping shims")
    emit(figure=f"baseline_registry_scan_{total}", agents=total, **ms(scan),
         note="Registry.scan() in-process on the same state dir (descriptor read + liveness)")
    emit(figure="baseline_unbound_call_roundtrip", **ms(floor),
         note="tools/call refused as unbound by the same shim: stdio + dispatch, no state")
    emit(figure=f"list_agents_{total}", agents=total, shims=shims,
         answer_bytes=len(json.dumps({"agents": first}, sort_keys=True)), **ms(lat),
         baseline=f"baseline_registry_scan_{total}",
         over_scan_p50_ms=round((pct(lat, 50) - pct(scan, 50)) * 1e3, 2),
         over_roundtrip_p50_ms=round((pct(lat, 50) - pct(floor, 50)) * 1e3, 2),
         register_seconds=round(register_seconds, 2),
         note="unbound list_agents from a separate shim; register_seconds is for all agents, "
              "one receive_message each, sessions concurrent")


async def bench_claude_discovery(tmp: Path, sessions: int, calls: int) -> None:
    """``list_agents`` when the machine has ``sessions`` Claude sessions without CrossTalk.

    Each "session" is a real sleeping process with a Claude record in the world's config dir,
    so the liveness check (pid + start time) runs for real. Baseline: ``discover()`` in-process.
    """
    env = world(tmp, f"claude-{sessions}")
    records = Path(env["CLAUDE_CONFIG_DIR"]) / "sessions"
    records.mkdir(parents=True, mode=0o700)
    sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(sessions)]
    try:
        domain = proc.pid_domain()
        for i, child in enumerate(sleepers):
            record = {"pid": child.pid, "sessionId": str(uuid.uuid4()), "cwd": str(tmp),
                      "startedAt": int(time.time() * 1000),
                      "procStart": proc.process_start_time(child.pid), "version": "2.1.328",
                      "kind": "interactive", "entrypoint": "cli", "pidDomain": domain,
                      "messagingSocketPath": str(tmp / f"cc-{child.pid}.sock"),
                      "name": f"claude-{i}", "status": "idle"}
            (records / f"{child.pid}.json").write_text(json.dumps(record))
        base = []
        for _ in range(calls):
            t = time.perf_counter()
            found = claude_discover(env)
            base.append(time.perf_counter() - t)
            if len(found) != sessions:
                raise RuntimeError(f"discover() found {len(found)} sessions, not {sessions}")
        async with Client(params(SHIM_ARGV, env, tmp), mode="legacy") as lister:
            lat = []
            for _ in range(calls):
                t = time.perf_counter()
                listed = payload(await lister.call_tool("list_agents", {}))["agents"]
                lat.append(time.perf_counter() - t)
                if len(listed) != sessions:
                    raise RuntimeError(f"list_agents listed {len(listed)}, not {sessions}")
    finally:
        for child in sleepers:
            child.kill()
            child.wait()
    emit(figure=f"baseline_claude_discover_{sessions}", sessions=sessions, **ms(base),
         note="harness.claude.registry.discover() in-process (record read + liveness)")
    emit(figure=f"list_agents_{sessions}_claude_sessions", sessions=sessions, **ms(lat),
         baseline=f"baseline_claude_discover_{sessions}",
         over_discover_p50_ms=round((pct(lat, 50) - pct(base, 50)) * 1e3, 2),
         note="unbound list_agents; every row a Claude session without CrossTalk")


# -- 3. resident memory ----------------------------------------------------------------------


async def bench_rss(tmp: Path, agents: int) -> None:
    env = world(tmp, "rss")
    progress("measuring the bare SDK server's memory")
    async with connect([str(BARE_SERVER)], env, tmp) as (client, pid):
        await client.list_tools()
        await asyncio.sleep(SETTLE_SECONDS)
        bare = proc_status(pid)
    progress(f"measuring a shim's memory with 0, 1 and {agents} agents")
    async with connect(SHIM_ARGV, env, tmp) as (client, pid):
        await client.list_tools()
        await asyncio.sleep(SETTLE_SECONDS)
        zero = proc_status(pid)
        one = zero
        for i in range(agents):
            await register(client, f"r{i}", f"rss-{i}")
            if i == 0:
                await asyncio.sleep(SETTLE_SECONDS)
                one = proc_status(pid)
        await asyncio.sleep(SETTLE_SECONDS)
        full = proc_status(pid)
        served = [d for d in Registry(Path(env["CROSSTALK_HOME"])).live() if d.pid == pid]
        if len(served) != agents:
            raise RuntimeError(f"the shim serves {len(served)} agents, not {agents}")
        # One message from one of them to another, over A2A: the client side and the SDK's
        # server stack are loaded from then on (ADR 0034, ADR 0044).
        sent = payload(await client.call_tool("send_message", {"to": "rss-1", "text": "x"},
                                              meta=meta("r0", "rss-0")))
        if sent.get("state") != "accepted":
            raise RuntimeError(f"the send within the shim was not accepted: {sent}")
        await asyncio.sleep(SETTLE_SECONDS)
        talked = proc_status(pid)
    emit(figure="baseline_shim_rss_0_agents", rss_kb=zero["VmRSS"], hwm_kb=zero["VmHWM"],
         threads=zero["Threads"], fds=zero["fds"], bare_sdk_server_rss_kb=bare["VmRSS"],
         note="crosstalk mcp after its first tools/list answer, no agent yet")
    per_agent = (full["VmRSS"] - zero["VmRSS"]) / agents
    rest = (full["VmRSS"] - one["VmRSS"]) / (agents - 1) if agents > 1 else None
    emit(figure=f"shim_rss_{agents}_agents", agents=agents, rss_kb=full["VmRSS"],
         hwm_kb=full["VmHWM"], threads=full["Threads"], fds=full["fds"],
         baseline="baseline_shim_rss_0_agents", baseline_rss_kb=zero["VmRSS"],
         per_agent_kb=round(per_agent, 1),
         first_agent_kb=one["VmRSS"] - zero["VmRSS"],
         per_further_agent_kb=None if rest is None else round(rest, 1))
    emit(figure=f"shim_rss_{agents}_agents_after_a2a_send", agents=agents,
         rss_kb=talked["VmRSS"], hwm_kb=talked["VmHWM"], baseline="baseline_shim_rss_0_agents",
         baseline_rss_kb=zero["VmRSS"], over_8_agents_kb=talked["VmRSS"] - full["VmRSS"],
         note="the same shim after one send_message between two of its agents (A2A)")


async def run(args: argparse.Namespace, tmp: Path) -> None:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    if "start" in args.only:
        await bench_start(tmp, args.runs)
    if "list" in args.only:
        for sessions in args.sessions:
            await bench_list_agents(tmp, args.shims, sessions, args.calls)
            await bench_claude_discovery(tmp, args.shims * sessions, args.calls)
    if "rss" in args.only:
        await bench_rss(tmp, args.agents)


def _counts(text: str) -> list[int]:
    return [int(part) for part in text.split(",")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--runs", type=int, default=20, help="timed start-ups of each kind")
    ap.add_argument("--shims", type=int, default=4, help="shims serving the listed agents")
    ap.add_argument("--sessions", type=_counts, default=[50, 250],
                    help="fake sessions per shim, one listing per count (default 50,250: "
                         "200 and 1,000 agents)")
    ap.add_argument("--calls", type=int, default=50, help="timed list_agents calls")
    ap.add_argument("--agents", type=int, default=8, help="agents in the memory figure")
    ap.add_argument("--only", type=lambda t: set(t.split(",")), default=set(FIGURE_GROUPS),
                    help="figure groups to run, of " + ",".join(FIGURE_GROUPS) + " (default all)")
    args = ap.parse_args()
    if not args.only <= set(FIGURE_GROUPS):
        ap.error(f"--only takes {','.join(FIGURE_GROUPS)}")
    if min(args.runs, args.shims, *args.sessions, args.calls, args.agents) < 1:
        ap.error("every count must be at least 1")
    tmp = Path(tempfile.mkdtemp(prefix="ct-bs-", dir="/tmp"))
    try:
        asyncio.run(run(args, tmp))
    except (KeyboardInterrupt, asyncio.CancelledError):
        progress("interrupted")
        return 130
    finally:
        reap_children()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
