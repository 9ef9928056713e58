"""Sustained durable throughput into one agent, with the disk's own fsync rate beside it.

Why a separate bench from deliver.py: deliver.py's burst runs its senders on the receiving
agent's own event loop, so sender CPU competes with the receiver and the figure undercounts
what real senders (other processes) see. Here the 16 concurrent senders run in a child
process; only acks that say "accepted" (journalled and fsynced, R1) are counted.

``--path a2a`` does the same over A2A: the child process registers one sending agent of its own
and its 16 concurrent sends go through the project's own client path (``Agent.send`` with the
receiver's descriptor resolved once, so no registry scan per send; the agent's pooled,
kept-alive ``httpx`` client and kept peer card). Each send waits for the answer a shim's
``send_message`` waits for: state ``accepted``, i.e. journalled, fsynced and taken by the
session, as the uds ack is; anything else is counted apart (``not_accepted``, by state and
reason). ``--path both`` (the default) prints both figures, beside one baseline.

The baseline `raw_write_fsync_per_sec` is a loop of one small `write` + `fsync` on the same
filesystem in the same run: the ceiling one-record-per-fsync could reach. Group commit is
what lets the figure go past it. With the uds path, `bare_uds_server` runs the same senders
against an asyncio unix server that only reads the frame and acks it: the floor the loop, the
kernel and the senders themselves set, with nothing of CrossTalk's work in it.

Each figure also prints the receiver's CPU per message (this process, every thread, over the
child's life: its imports cost the receiver nothing) and the senders' (over their timed
window), so a run on a slower or busier machine can still be read per message.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from crosstalk.agent import Agent, AgentSpec
from crosstalk.harness.fake import FakeHarness
from crosstalk.store.registry import Registry

_SENDERS = r"""
import asyncio, json, sys, time
from crosstalk.cli.send import frames
from crosstalk.core.ids import new_message_id

uds_path, token, total, conc = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])

async def send(i):
    reader, writer = await asyncio.open_unix_connection(uds_path)
    writer.write(frames(token, f"tp-{i}", new_message_id()))
    await writer.drain()
    writer.write_eof()
    ack = json.loads(await reader.readline())
    writer.close()
    return ack.get("state") == "accepted"

async def main():
    sem = asyncio.Semaphore(conc)
    async def one(i):
        async with sem:
            return await send(i)
    t, cpu = time.perf_counter(), time.process_time()
    ok = await asyncio.gather(*(one(i) for i in range(total)))
    print(json.dumps({"accepted": sum(ok), "seconds": time.perf_counter() - t,
                      "cpu": time.process_time() - cpu}))

asyncio.run(main())
"""


_A2A_SENDERS = r"""
import asyncio, json, sys, time
from pathlib import Path
from crosstalk.agent import Agent, AgentSpec
from crosstalk.harness.fake import FakeHarness
from crosstalk.store.registry import Registry

state, rt, to = sys.argv[1:4]
total, conc = int(sys.argv[4]), int(sys.argv[5])

async def main():
    agent = Agent(Registry(Path(state)),
                  AgentSpec(FakeHarness(name="fake"), "bench-tp-sender", "/b", "sender"),
                  env={"XDG_RUNTIME_DIR": rt})
    await agent.start()
    try:
        (target,) = agent.registry.find(to)
        await agent.send(target, "warm-up")  # card fetch and first connection, not timed
        sem = asyncio.Semaphore(conc)
        reasons = {}
        async def one(i):
            async with sem:
                res = await agent.send(target, f"tp-{i}")
            if res.state != "accepted":
                key = f"{res.state}:{res.reason}"
                reasons[key] = reasons.get(key, 0) + 1
            return res.state == "accepted"
        t, cpu = time.perf_counter(), time.process_time()
        ok = await asyncio.gather(*(one(i) for i in range(total)))
        seconds, cpu = time.perf_counter() - t, time.process_time() - cpu
    finally:
        await agent.stop()
    print(json.dumps({"accepted": sum(ok), "seconds": seconds, "cpu": cpu,
                      "not_accepted": reasons}))

asyncio.run(main())
"""


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def raw_write_fsync_per_sec(tmp: Path, seconds: float = 1.0) -> float:
    """One small appended record per fsync, as fast as the disk allows."""
    fd = os.open(tmp / "raw.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    line = json.dumps({"type": "submitted", "text": "x" * 64}).encode() + b"\n"
    n = 0
    t = time.perf_counter()
    try:
        while time.perf_counter() - t < seconds:
            os.write(fd, line)
            os.fsync(fd)
            n += 1
    finally:
        os.close(fd)
    return n / (time.perf_counter() - t)


async def sustained(tmp: Path, path: str, total: int, conc: int) -> dict[str, object]:
    """One receiving agent here; the senders (uds frames or A2A) in a child process."""
    rt, state = tmp / f"rt-{path}", tmp / f"state-{path}"
    agent = Agent(Registry(state),
                  AgentSpec(FakeHarness(name="fake"), "bench-tp", "/b", "receiver"),
                  env={"XDG_RUNTIME_DIR": str(rt)})
    await agent.start()
    try:
        if path == "uds":
            assert agent.uds is not None
            uds_path, token = str(agent.uds.path), agent.uds.key_path.read_text().strip()
            argv = ["-c", _SENDERS, uds_path, token, str(total), str(conc)]
        else:
            argv = ["-c", _A2A_SENDERS, str(state), str(rt), "receiver", str(total), str(conc)]
        cpu = time.process_time()
        proc = await asyncio.create_subprocess_exec(sys.executable, *argv,
                                                    stdout=subprocess.PIPE)
        out, _ = await proc.communicate()
        cpu = time.process_time() - cpu
        if proc.returncode != 0:
            raise SystemExit(f"the {path} senders failed (exit {proc.returncode})")
        res = json.loads(out)
    finally:
        await agent.stop()
    extra = {"not_accepted": res["not_accepted"]} if res.get("not_accepted") else {}
    # The receiver's CPU (every thread) over the child's whole life: the child's imports
    # before its timed window cost the receiver nothing, so this is its CPU for the messages.
    n = max(res["accepted"], 1)
    return {"accepted": res["accepted"], "seconds": round(res["seconds"], 3),
            "per_sec": round(res["accepted"] / res["seconds"], 1),
            "receiver_cpu_us_per_msg": round(cpu / n * 1e6),
            "sender_cpu_us_per_msg": round(res["cpu"] / n * 1e6), **extra}


class _BareAck(asyncio.Protocol):
    """The least a uds server can do for a shape (a) frame: take its two lines, ack, close."""

    ACK = b'{"type":"ack","message_id":null,"state":"accepted","reason":null}\n'

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport, self.buf = transport, b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.buf.count(b"\n") >= 2:
            self.transport.write(self.ACK)
            self.transport.close()

    def eof_received(self) -> bool:
        return True


async def bare_uds(tmp: Path, total: int, conc: int) -> dict[str, object]:
    """The same senders against a bare asyncio unix server (no key, identity, journal or
    session): the floor the event loop, the kernel and the senders set on this machine."""
    path = str(tmp / "bare.sock")
    server = await asyncio.get_running_loop().create_unix_server(_BareAck, path)
    try:
        cpu = time.process_time()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _SENDERS, path, "x" * 32, str(total), str(conc),
            stdout=subprocess.PIPE)
        out, _ = await proc.communicate()
        cpu = time.process_time() - cpu
    finally:
        server.close()
        await server.wait_closed()
    res = json.loads(out)
    n = max(res["accepted"], 1)
    return {"accepted": res["accepted"], "per_sec": round(res["accepted"] / res["seconds"], 1),
            "receiver_cpu_us_per_msg": round(cpu / n * 1e6),
            "sender_cpu_us_per_msg": round(res["cpu"] / n * 1e6)}


def main(total: int, conc: int, paths: list[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="ct-bench-tp-", dir="/tmp") as d:
        tmp = Path(d)
        raw = raw_write_fsync_per_sec(tmp)
        emit(figure="raw_write_fsync_per_sec", per_sec=round(raw, 1))
        if "uds" in paths:
            emit(figure="bare_uds_server", messages=total, concurrency=conc,
                 **asyncio.run(bare_uds(tmp, total, conc)))
        for path in paths:
            res = asyncio.run(sustained(tmp, path, total, conc))
            emit(figure=f"{path}_sustained_into_one_agent", messages=total, concurrency=conc,
                 senders="separate process", **res, baseline="raw_write_fsync_per_sec",
                 baseline_per_sec=round(raw, 1))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--path", choices=["uds", "a2a", "both"], default="both")
    args = ap.parse_args()
    main(args.messages, args.concurrency, ["uds", "a2a"] if args.path == "both" else [args.path])
