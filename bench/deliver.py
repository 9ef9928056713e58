"""Delivery benchmark: send→inject latency over A2A and over uds.

Throughput (messages/s into one agent) lives in bench/throughput.py.

Every acknowledgement is durable (the receiver journals submitted, dispatching and the outcome
with fsync before answering). Baseline, measured in the same run: one raw unix-socket
round trip in which the server appends the line to a file and fsyncs before answering —
the floor for any durable, acknowledged local hand-off.

Timing starts ``--settle`` seconds (2.5) after the agents start: a session sends for hours, and
the registry keeps the parse of a descriptor only once the file has settled (ADR 0039), so
the first seconds of an agent's life are not its steady state.

Prints one JSON line per figure. Usage: ``python bench/deliver.py [--n 300] [--settle 2.5]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from crosstalk.agent import Agent, AgentSpec
from crosstalk.cli.send import frames
from crosstalk.core.ids import new_message_id
from crosstalk.harness.base import Binding, Delivery, Outcome
from crosstalk.harness.fake import FakeHarness
from crosstalk.store.registry import Registry


class TimedHarness(FakeHarness):
    """A fake session that notes when each message arrived (perf_counter)."""

    def __init__(self) -> None:
        super().__init__(name="fake")
        self.arrived: dict[str, float] = {}

    async def inject(self, binding: Binding, delivery: Delivery) -> Outcome:
        self.arrived[delivery.message.text] = time.perf_counter()
        return await super().inject(binding, delivery)


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def summary(name: str, lat: list[float], **extra: object) -> None:
    q = statistics.quantiles(lat, n=100)
    emit(figure=name, n=len(lat), p50_us=round(q[49] * 1e6), p99_us=round(q[98] * 1e6),
         **extra)


async def baseline(tmp: Path, n: int) -> list[float]:
    path = tmp / "raw.sock"
    fd = os.open(tmp / "raw.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await reader.readline()
        os.write(fd, line)
        os.fsync(fd)
        writer.write(b"ok\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(handle, path=str(path))
    lat = []
    line = json.dumps({"type": "user", "message": {"role": "user", "content": "x" * 64}})
    try:
        for _ in range(n):
            t = time.perf_counter()
            reader, writer = await asyncio.open_unix_connection(str(path))
            writer.write(line.encode() + b"\n")
            await writer.drain()
            await reader.readline()
            writer.close()
            lat.append(time.perf_counter() - t)
    finally:
        server.close()
        await server.wait_closed()
        os.close(fd)
    return lat


async def uds_send(uds_path: str, token: str, text: str) -> dict[str, object]:
    reader, writer = await asyncio.open_unix_connection(uds_path)
    writer.write(frames(token, text, new_message_id()))
    await writer.drain()
    writer.write_eof()
    ack = json.loads(await reader.readline())
    writer.close()
    return ack  # type: ignore[no-any-return]


async def main(n: int, settle: float) -> None:
    with tempfile.TemporaryDirectory(prefix="ct-bench-", dir="/tmp") as d:
        tmp = Path(d)
        emit(**{"figure": "baseline_raw_uds_write_fsync",
                **_stats(await baseline(tmp, n))})
        env = {"XDG_RUNTIME_DIR": str(tmp / "rt")}
        reg = Registry(tmp / "state")
        sink = TimedHarness()
        a = Agent(reg, AgentSpec(FakeHarness(name="fake"), "bench-a", "/b", "sender"), env=env)
        b = Agent(reg, AgentSpec(sink, "bench-b", "/b", "receiver"), env=env)
        await a.start()
        await b.start()
        await asyncio.sleep(settle)  # steady state: the registry's descriptors settled
        try:
            assert b.uds is not None
            uds_path, token = str(b.uds.path), b.uds.key_path.read_text().strip()
            lat = []
            for i in range(n):
                text = f"uds-{i}"
                t = time.perf_counter()
                ack = await uds_send(uds_path, token, text)
                assert ack["state"] == "accepted", ack
                lat.append(sink.arrived[text] - t)
            summary("uds_send_to_inject", lat, baseline="baseline_raw_uds_write_fsync")

            lat = []
            for i in range(n):
                text = f"a2a-{i}"
                t = time.perf_counter()
                res = await a.send("receiver", text)
                assert res.state == "accepted", res
                lat.append(sink.arrived[text] - t)
            summary("a2a_send_to_inject", lat, baseline="baseline_raw_uds_write_fsync",
                    note=("the card and SDK client are kept between sends (revalidated "
                          "after the card's max-age, 5 s); one pooled HTTP connection"))

        finally:
            await a.stop()
            await b.stop()


def _stats(lat: list[float]) -> dict[str, object]:
    q = statistics.quantiles(lat, n=100)
    return {"n": len(lat), "p50_us": round(q[49] * 1e6), "p99_us": round(q[98] * 1e6)}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--settle", type=float, default=2.5,
                    help="seconds between the agents' start and the first timed send")
    args = ap.parse_args()
    asyncio.run(main(args.n, args.settle))
