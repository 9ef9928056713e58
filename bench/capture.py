"""Capture benchmark: does ``crosstalk capture`` change delivery timing?

Two in-process agents (FakeHarness); ``alice`` sends ``bob`` N messages over A2A and N over
his uds ingress (the ``crosstalk send`` wire), one at a time, in four rounds run alternately
so the machine's drift falls on every round alike:

- ``none``: nobody captures (the tap points are one attribute check);
- ``reading``: one capture attached that reads everything as it comes;
- ``stalled``: four captures attached that never read (their queues fill and drop; the
  fan-out must still not slow anything);
- ``none`` again.

Prints one JSON line per round and transport: p50/p99 send→ack latency in microseconds, and
frames seen / dropped by the captures. Usage: ``python bench/capture.py [--n 300]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from crosstalk.agent import Agent, AgentSpec
from crosstalk.capture.tap import MAX_CAPTURES
from crosstalk.cli.send import frames
from crosstalk.core.ids import new_message_id
from crosstalk.harness.fake import FakeHarness
from crosstalk.store.registry import Registry


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


async def open_capture(agent: Agent, *, read: bool) -> tuple[asyncio.StreamWriter,
                                                             asyncio.Task[int]]:
    assert agent.uds is not None
    token = agent.uds.key_path.read_text().strip()
    reader, writer = await asyncio.open_unix_connection(agent.uds.path)
    writer.write(json.dumps({"type": "auth", "token": token}).encode() + b"\n"
                 + b'{"type":"capture"}\n')
    await writer.drain()
    hello = json.loads(await reader.readline())
    assert hello["type"] == "capture_started", hello

    async def consume() -> int:
        seen = 0
        if not read:
            await asyncio.Event().wait()  # holds the connection, never reads
        while await reader.readline():
            seen += 1
        return seen

    return writer, asyncio.ensure_future(consume())


async def uds_send(agent: Agent, text: str) -> float:
    assert agent.uds is not None
    token = agent.uds.key_path.read_text().strip()
    started = time.perf_counter()
    reader, writer = await asyncio.open_unix_connection(agent.uds.path)
    writer.write(frames(token, text, new_message_id()))
    writer.write_eof()
    ack = json.loads(await reader.readline())
    writer.close()
    assert ack["state"] == "accepted", ack
    return time.perf_counter() - started


async def a2a_send(a: Agent, b: Agent, text: str) -> float:
    assert b.descriptor is not None
    started = time.perf_counter()
    result = await a.send(b.descriptor, text)
    assert result.state == "accepted", result
    return time.perf_counter() - started


def figure(lat: list[float]) -> dict[str, int]:
    q = statistics.quantiles(lat, n=100)
    return {"p50_us": round(q[49] * 1e6), "p99_us": round(q[98] * 1e6)}


async def main(n: int) -> None:
    home = Path(tempfile.mkdtemp(prefix="ct-bench-cap-"))
    env = {"XDG_RUNTIME_DIR": tempfile.mkdtemp(prefix="ct-rt-", dir="/tmp")}
    reg = Registry(home / "state")
    a = Agent(reg, AgentSpec(FakeHarness(name="fake"), "a", "/w", "alice"), env=env)
    b = Agent(reg, AgentSpec(FakeHarness(name="fake"), "b", "/w", "bob"), env=env)
    await a.start()
    await b.start()
    rounds = {"none": 0, "reading": 1, "stalled": MAX_CAPTURES}
    lat: dict[tuple[str, str], list[float]] = {(r, t): [] for r in rounds for t in ("a2a", "uds")}
    try:
        for i in range(5):  # warm-up: connection pool, imports, first journal appends
            await a2a_send(a, b, f"warm {i}")
            await uds_send(b, f"warm {i}")
        for batch in range(10):
            for name, count in rounds.items():
                opened = [await open_capture(b, read=name == "reading") for _ in range(count)]
                for i in range(n // 10):
                    lat[name, "a2a"].append(await a2a_send(a, b, f"{name} {batch} {i}"))
                    lat[name, "uds"].append(await uds_send(b, f"{name} {batch} {i}"))
                dropped = sum(s.lost_total for s in b.tap.subscribers)
                for writer, task in opened:
                    writer.close()
                    task.cancel()
                if count and batch == 9:
                    emit(round=name, captures=count, dropped_in_last_batch=dropped)
                await asyncio.sleep(0.05)
        for (name, transport), values in lat.items():
            emit(round=name, transport=transport, n=len(values), **figure(values))
    finally:
        await a.stop()
        await b.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=300)
    asyncio.run(main(parser.parse_args().n))
