"""Soak under attack: many agents all-to-all while a local attacker holds connections open.

``4 processes x 4 agents`` (in-process agents on the fake harness, each its own A2A listener
and uds ingress) send to each other for ``--seconds``, over A2A (``Agent.send``) and, one
send in ``--uds-every``, as shape (a) uds frames. Meanwhile an attacker process keeps
``--slow`` slowloris connections open against the agents' A2A listeners (a header byte per
second, reopened when the server closes one) and ``--silent`` connections against their uds
sockets that never write. Loopback and unix sockets only, bounded in count and time.

Counted at the end, from every sender's results and every receiver's injections:

- **lost**: acknowledged (accepted/queued/delivered) but never injected;
- **duplicated**: injected more than once;
- **spurious**: a send answered with anything else, by reason;
- latency of the acknowledgement and of send → inject (CLOCK_MONOTONIC is machine-wide).

- **journal_lost**: acknowledged, yet no receiver's journal holds its ``submitted`` record
  (read back from the journals after the run, not from what the senders were told).

Baseline in the same run: the same all-to-all with no attacker, and the disk's own
``raw_write_fsync_per_sec`` (one small write + fsync in a loop, bench/throughput.py's). Prints
one JSON line per figure. Usage: ``python bench/soak.py [--seconds 60] [--slow 400]
[--silent 64]``; ``--no-attack`` runs only the plain all-to-all (issue 16's "4 processes x 4
agents" figure, ``soak_all_to_all``); ``--profile DIR`` leaves one cProfile dump per worker.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from _stats import percentile  # bench/_stats.py: shared by the benches
from crosstalk.agent import Agent, AgentSpec
from crosstalk.cli.send import frames, read_key
from crosstalk.config import uds_key_path
from crosstalk.core.ids import new_message_id
from crosstalk.harness.base import Binding, Delivery, Outcome
from crosstalk.harness.fake import FakeHarness
from crosstalk.store.journal_read import read_journal
from crosstalk.store.registry import Registry
from throughput import raw_write_fsync_per_sec  # the same baseline as the throughput bench

OK = {"accepted", "queued", "delivered"}
SETTLE_SECONDS = 10.0


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


class Recording(FakeHarness):
    """A fake session that notes when each message id arrived."""

    def __init__(self) -> None:
        super().__init__(name="fake")
        self.arrived: list[tuple[str, float]] = []

    async def inject(self, binding: Binding, delivery: Delivery) -> Outcome:
        self.arrived.append((delivery.message.message_id, time.monotonic()))
        return await super().inject(binding, delivery)


# -- one worker process: 4 agents -------------------------------------------------------------


async def _uds_send(agent_names: dict[str, Any], to: str, text: str) -> tuple[str, str, str]:
    d = agent_names[to]
    token = read_key(uds_key_path(Path(d.uds_path)))
    mid = new_message_id()
    reader, writer = await asyncio.open_unix_connection(d.uds_path)
    try:
        writer.write(frames(token, text, mid))
        await writer.drain()
        writer.write_eof()
        line = await asyncio.wait_for(reader.readline(), 60)
    finally:
        writer.close()
    if not line:
        return mid, "unknown", "closed_without_ack"
    ack = json.loads(line)
    return mid, str(ack.get("state")), str(ack.get("reason"))


async def _worker(args: argparse.Namespace) -> None:
    index, state, rt, out = args.worker, Path(args.state), Path(args.rt), Path(args.out)
    total, seconds, in_flight, uds_every = (args.agents, args.seconds, args.in_flight,
                                            args.uds_every)
    reg = Registry(state)
    env = {"XDG_RUNTIME_DIR": str(rt)}
    sinks = [Recording() for _ in range(4)]
    names = [f"w{index}a{j}" for j in range(4)]
    agents = [Agent(reg, AgentSpec(s, n, "/soak", n), env=env)
              for s, n in zip(sinks, names, strict=True)]
    for a in agents:
        await a.start()
    while len(reg.live()) < total:  # every worker's agents are up
        await asyncio.sleep(0.1)
    (out / f"ready-{index}").touch()
    while not (out / "go").exists():
        await asyncio.sleep(0.02)
    by_name = {d.name: d for d in reg.live()}
    everyone = sorted(by_name)
    sent: list[dict[str, Any]] = []
    deadline = time.monotonic() + seconds
    counter = itertools.count()

    async def sender(agent: Agent, me: str) -> None:
        peers = [n for n in everyone if n != me]
        rng = random.Random(f"{me}-{id(asyncio.current_task())}")
        while time.monotonic() < deadline:
            to = rng.choice(peers)
            n = next(counter)
            t = time.monotonic()
            try:
                if uds_every and n % uds_every == 0:
                    mid, state_, reason = await _uds_send(by_name, to, f"{me}#{n}")
                    path = "uds"
                else:
                    res = await agent.send(to, f"{me}#{n}")
                    mid, state_, reason, path = res.message_id, res.state, str(res.reason), "a2a"
            except Exception as exc:  # a sender's own failure is a spurious failure too
                mid, state_, reason, path = "", "error", type(exc).__name__, "?"
            sent.append({"id": mid, "to": to, "state": state_, "reason": reason, "path": path,
                         "t0": t, "t1": time.monotonic()})

    try:
        await asyncio.gather(*(sender(a, n) for a, n in zip(agents, names, strict=True)
                               for _ in range(in_flight)))
        (out / f"sent-{index}").touch()
        while len(list(out.glob("sent-*"))) < total // 4:
            await asyncio.sleep(0.1)
        await asyncio.sleep(SETTLE_SECONDS)  # let every lane drain
    finally:
        for a in agents:
            await a.stop()
    arrived = [(mid, t) for s in sinks for mid, t in s.arrived]
    (out / f"result-{index}.json").write_text(json.dumps({"sent": sent, "arrived": arrived}))


def worker_main(args: argparse.Namespace) -> None:
    if not args.profile:
        asyncio.run(_worker(args))
        return
    import cProfile  # only when asked: the profile is for bench/README.md's notes

    prof = cProfile.Profile()
    try:
        prof.runcall(asyncio.run, _worker(args))
    finally:
        prof.dump_stats(str(Path(args.profile) / f"worker-{args.worker}.prof"))


# -- the attacker ----------------------------------------------------------------------------


async def _slowloris(host: str, port: int, stats: Counter[str], stop: float) -> None:
    while time.monotonic() < stop:
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            stats["a2a_connect_refused"] += 1
            await asyncio.sleep(0.5)
            continue
        stats["a2a_opened"] += 1
        try:
            writer.write(b"POST / HTTP/1.1\r\nHost: x\r\n")
            await writer.drain()
            while time.monotonic() < stop:
                await asyncio.sleep(1.0)
                writer.write(b"X")
                await writer.drain()
                if reader.at_eof():
                    break
        except (OSError, ConnectionError):
            pass
        stats["a2a_closed_by_server"] += time.monotonic() < stop
        writer.close()


async def _silent(path: str, stats: Counter[str], stop: float) -> None:
    while time.monotonic() < stop:
        try:
            reader, writer = await asyncio.open_unix_connection(path)
        except OSError:
            stats["uds_connect_refused"] += 1
            await asyncio.sleep(0.5)
            continue
        stats["uds_opened"] += 1
        try:
            remaining = stop - time.monotonic()
            await asyncio.wait_for(reader.read(), max(remaining, 0.01))
            stats["uds_closed_by_server"] += 1
        except (TimeoutError, OSError):
            pass
        writer.close()


async def _attack(state: Path, slow: int, silent: int, seconds: float, out: Path) -> None:
    live = Registry(state).live()
    a2a = [(d.a2a_url or "").rsplit(":", 1) for d in live if d.a2a_url]
    uds = [d.uds_path for d in live if d.uds_path]
    stats: Counter[str] = Counter()
    stop = time.monotonic() + seconds
    tasks = [_slowloris(a2a[i % len(a2a)][0].removeprefix("http://"),
                        int(a2a[i % len(a2a)][1]), stats, stop) for i in range(slow)]
    tasks += [_silent(uds[i % len(uds)], stats, stop) for i in range(silent)]
    await asyncio.gather(*tasks)
    (out / "attack.json").write_text(json.dumps(stats))


def attacker_main(args: argparse.Namespace) -> None:
    asyncio.run(_attack(Path(args.state), args.slow, args.silent, args.seconds, Path(args.out)))


# -- the run ---------------------------------------------------------------------------------


def run(label: str, *, procs: int, seconds: float, slow: int, silent: int, in_flight: int,
        uds_every: int, profile: str | None = None) -> None:
    with tempfile.TemporaryDirectory(prefix="ct-soak-", dir="/tmp") as d:
        root = Path(d)
        state, rt, out = root / "state", root / "rt", root / "out"
        for p in (rt, out):
            p.mkdir(mode=0o700)
        common = ["--state", str(state), "--rt", str(rt), "--out", str(out),
                  "--agents", str(procs * 4), "--seconds", str(seconds),
                  "--in-flight", str(in_flight), "--uds-every", str(uds_every)]
        if profile:
            Path(profile).mkdir(parents=True, exist_ok=True)
            common += ["--profile", str(Path(profile) / label)]
            (Path(profile) / label).mkdir(exist_ok=True)
        workers = [subprocess.Popen([sys.executable, __file__, "--worker", str(i), *common])
                   for i in range(procs)]
        try:
            while len(list(out.glob("ready-*"))) < procs:
                if any(w.poll() is not None for w in workers):
                    raise SystemExit("a worker died before it was ready")
                time.sleep(0.1)
            attacker = None
            if slow or silent:
                attacker = subprocess.Popen([sys.executable, __file__, "--attacker",
                                             "--slow", str(slow), "--silent", str(silent),
                                             *common, "--seconds", str(seconds + 8)])
                time.sleep(3.0)  # the attack is in place before the first send
            (out / "go").touch()
            for w in workers:
                w.wait(timeout=seconds + 180)
            if attacker is not None:
                attacker.wait(timeout=60)
        finally:
            for w in workers:
                if w.poll() is None:
                    w.kill()
        report(label, out, procs, seconds, journalled(state / "journal"))


def journalled(journals: Path) -> set[str]:
    """Every message id some receiver's journal recorded as submitted (durable, R1)."""
    ids: set[str] = set()
    for path in journals.glob("*.jsonl"):
        ids.update(r["id"] for r in read_journal(path).records
                   if r.get("subject") == "message" and r.get("state") == "submitted")
    return ids


def report(label: str, out: Path, procs: int, seconds: float, in_journals: set[str]) -> None:
    sent: list[dict[str, Any]] = []
    arrived: dict[str, float] = {}
    copies: Counter[str] = Counter()
    for i in range(procs):
        got = json.loads((out / f"result-{i}.json").read_text())
        sent += got["sent"]
        for mid, t in got["arrived"]:
            copies[mid] += 1
            arrived.setdefault(mid, t)
    acked = [s for s in sent if s["state"] in OK]
    spurious = Counter(f"{s['path']}:{s['state']}:{s['reason']}" for s in sent
                       if s["state"] not in OK)
    lost = [s["id"] for s in acked if s["id"] not in arrived]
    journal_lost = [s["id"] for s in acked if s["id"] not in in_journals]
    dup = [m for m, c in copies.items() if c > 1]
    ack = [s["t1"] - s["t0"] for s in acked]
    inject = [arrived[s["id"]] - s["t0"] for s in acked if s["id"] in arrived]
    attack = json.loads((out / "attack.json").read_text()) if (out / "attack.json").exists() \
        else {}

    def q(xs: list[float], k: int) -> float:
        return round(percentile(xs, k) * 1e3, 2)

    emit(figure=f"soak_{label}", agents=procs * 4, seconds=seconds, sent=len(sent),
         acknowledged=len(acked), per_sec=round(len(acked) / seconds, 1), lost=len(lost),
         journal_lost=len(journal_lost),
         duplicated=len(dup), spurious=sum(spurious.values()),
         spurious_by_reason=dict(spurious.most_common(8)),
         ack_p50_ms=q(ack, 50), ack_p99_ms=q(ack, 99),
         inject_p50_ms=q(inject, 50), inject_p99_ms=q(inject, 99),
         by_path=dict(Counter(s["path"] for s in acked)), attack=attack)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--slow", type=int, default=400)
    ap.add_argument("--silent", type=int, default=64)
    ap.add_argument("--in-flight", type=int, default=2, help="concurrent sends per agent")
    ap.add_argument("--uds-every", type=int, default=4, help="one send in N goes over uds")
    ap.add_argument("--baseline-seconds", type=float, default=None,
                    help="the run without an attacker (default: --seconds; 0 skips it)")
    ap.add_argument("--no-attack", action="store_true",
                    help="only the plain all-to-all run (figure soak_all_to_all)")
    ap.add_argument("--profile", default=None,
                    help="directory for one cProfile dump per worker and run")
    ap.add_argument("--worker", type=int, default=None)
    ap.add_argument("--attacker", action="store_true")
    ap.add_argument("--state")
    ap.add_argument("--rt")
    ap.add_argument("--out")
    ap.add_argument("--agents", type=int, default=16)
    args = ap.parse_args()
    if args.worker is not None:
        worker_main(args)
        return
    if args.attacker:
        attacker_main(args)
        return
    kw = {"procs": args.procs, "in_flight": args.in_flight, "uds_every": args.uds_every,
          "profile": args.profile}
    with tempfile.TemporaryDirectory(prefix="ct-soak-raw-", dir="/tmp") as d:
        raw = raw_write_fsync_per_sec(Path(d))
    emit(figure="raw_write_fsync_per_sec", per_sec=round(raw, 1),
         note="one small write + fsync in a loop, same filesystem, same run")
    if args.no_attack:
        run("all_to_all", seconds=args.seconds, slow=0, silent=0, **kw)
        return
    base = args.seconds if args.baseline_seconds is None else args.baseline_seconds
    if base:
        run("no_attacker", seconds=base, slow=0, silent=0, **kw)
    run("under_attack", seconds=args.seconds, slow=args.slow, silent=args.silent, **kw)


if __name__ == "__main__":
    main()
