"""Watch benchmark: how fast ``crosstalk watch`` shows the start state of a busy machine, and
its peak memory.

The machine: ``--agents`` registered agents (live registrations held by this process: agent
lock, name, credential, descriptor, as a shim publishes them) and a journal each, holding
``--records`` journal records in all. The journals are written as bench/restart.py writes
its: a real agent pair exchanges A2A informs, A2A asks answered with ``reply`` and
``crosstalk send`` frames over real sockets, and the receiver's lines for each message are
written again with fresh ids and ``seq``/``ts`` spread over the last 23.5 h, through the
journal's own line codec.

Figures, each the median of ``--runs`` fresh children:

- ``feed_first_poll``: ``Feed(home).poll()`` in a child: the sessions (``crosstalk agents``'
  rows: 200 descriptors read and checked) and every journal's tail folded into the board;
  its peak RSS (``VmHWM``) after the poll.
- ``watch_json_start``: ``crosstalk watch --json`` as a process, spawn until the last line of
  its start state is read (interpreter and imports included), and its peak RSS.
- ``baseline_raw_read``: a child that reads every journal whole and splits it into lines (no
  CRC, no JSON): the floor for anything that reads the journals at start;
  ``baseline_whole_decode``: the same files through the store's reader
  (``read_journal``), what a feed that read whole journals would pay before folding.

Prints one JSON line per figure. Usage:
``python bench/watch.py [--agents 200] [--records 100000] [--runs 3]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _stats import median_of  # bench/_stats.py: shared by the benches
from crosstalk import proc as ct_proc
from crosstalk.config import journal_path
from crosstalk.core.ids import agent_id_for, new_instance_id
from crosstalk.store.registry import Descriptor, Registration, Registry, own_process_identity

LINES_PER_MESSAGE = 4.3  # bench/restart.py's mix


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def hwm_mb(pid: int | str = "self") -> float:
    """Peak RSS of one process image (``VmHWM``: unlike ``ru_maxrss``, not inherited across
    the fork that started it)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return -1.0


# -- the machine ---------------------------------------------------------------------------


def register(reg: Registry, i: int, runtime: Path) -> Registration:
    session = f"bench-watch-{i}"
    agent_id = agent_id_for("fake", session)
    registration = reg.acquire(agent_id)
    choice = registration.take_name([f"agent-{i:03d}"])
    cred = registration.issue_credential()
    pid, started = own_process_identity()
    registration.publish(Descriptor(
        agent_id=agent_id, name=choice.name, harness="fake", session_ref=session, cwd="/b",
        instance_id=new_instance_id(), credential_ref=str(cred), pid=pid, started_at=started,
        pid_domain=ct_proc.pid_domain(), uds_path=str(runtime / f"{agent_id}.sock"),
        a2a_url="http://127.0.0.1:9/"))
    return registration


def build(tmp: Path, agents: int, records: int) -> tuple[Path, list[Registration], dict[str,
                                                                                      int]]:
    from restart import build_journal, record_template  # not in the children: its imports

    units, instance_id = asyncio.run(record_template(tmp, 4))
    home = tmp / "state"
    reg = Registry(home)
    held = [register(reg, i, tmp / "rt") for i in range(agents)]
    per_journal = max(1, round(records / agents / LINES_PER_MESSAGE))
    lines = size = 0
    for i, r in enumerate(held):
        path = journal_path(home, r.agent_id)
        path.parent.mkdir(mode=0o700, exist_ok=True)
        got = build_journal(path, units, instance_id, per_journal, seed=i)
        lines += got["lines"]
        size += got["bytes"]
    return home, held, {"journals": agents, "lines": lines, "bytes": size}


# -- the children ------------------------------------------------------------------------------


def child_feed(home: Path) -> None:
    t = time.perf_counter()
    from crosstalk.watch.feed import Feed

    imported = time.perf_counter() - t
    feed = Feed(home, {"XDG_RUNTIME_DIR": str(home.parent / "rt")})
    t = time.perf_counter()
    changes = feed.poll()
    took = time.perf_counter() - t
    t = time.perf_counter()
    feed.poll_sessions(force=True)
    feed.poll_journals()
    steady = time.perf_counter() - t
    print(json.dumps({"first_poll_seconds": took, "import_seconds": imported,
                      "next_poll_seconds": steady, "changes": len(changes),
                      "sessions": len(feed.board.sessions),
                      "messages": len(feed.board.messages),
                      "peak_rss_mb": hwm_mb()}), flush=True)


def child_raw(home: Path, decode: bool) -> None:
    from crosstalk.store.journal_read import read_journal

    t = time.perf_counter()
    n = 0
    for path in sorted((home / "journal").glob("*.jsonl")):
        if decode:
            n += len(read_journal(path).records)
        else:
            n += len(path.read_bytes().split(b"\n")) - 1
    print(json.dumps({"seconds": time.perf_counter() - t, "lines": n,
                      "peak_rss_mb": hwm_mb()}), flush=True)


def run_child(args: list[str]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                         check=True)
    return dict(json.loads(out.stdout.splitlines()[-1]))


def run_watch(home: Path, expect: int) -> dict[str, Any]:
    """``crosstalk watch --json`` until ``expect`` lines (its start state) are read."""
    env = {**os.environ, "CROSSTALK_HOME": str(home), "XDG_RUNTIME_DIR": str(home.parent / "rt")}
    t = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "crosstalk", "watch", "--json"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None
    for _ in range(expect):
        if not p.stdout.readline():
            err = p.stderr.read().decode(errors="replace") if p.stderr else ""
            raise SystemExit(f"watch ended early: {err}")
    took = time.perf_counter() - t
    time.sleep(1.5)  # a few follow polls, and a session re-read, inside the peak
    rss = hwm_mb(p.pid)
    p.send_signal(signal.SIGINT)
    code = p.wait(20)
    if code != 0:
        raise SystemExit(f"watch exited {code}")
    return {"spawn_to_start_state_seconds": took, "peak_rss_mb": rss}




def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=200)
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--child", choices=["feed", "raw", "decode"], help=argparse.SUPPRESS)
    ap.add_argument("--home", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child == "feed":
        child_feed(Path(args.home))
        return
    if args.child in ("raw", "decode"):
        child_raw(Path(args.home), decode=args.child == "decode")
        return

    with tempfile.TemporaryDirectory(prefix="ct-watch-", dir="/tmp") as d:
        tmp = Path(d)
        t = time.perf_counter()
        home, held, size = build(tmp, args.agents, args.records)
        emit(figure="machine_built", agents=args.agents, **size,
             seconds=round(time.perf_counter() - t, 1))
        try:
            raws, decodes, feeds, watches = [], [], [], []
            for _ in range(args.runs):
                raws.append(run_child(["--child", "raw", "--home", str(home)]))
                decodes.append(run_child(["--child", "decode", "--home", str(home)]))
                feeds.append(run_child(["--child", "feed", "--home", str(home)]))
                watches.append(run_watch(home, feeds[-1]["changes"]))
        finally:
            for r in held:
                r.close()
        emit(figure="baseline_raw_read", runs=args.runs, **size,
             seconds_median=median_of(raws, "seconds"),
             peak_rss_mb_max=round(max(r["peak_rss_mb"] for r in raws), 1))
        emit(figure="baseline_whole_decode", runs=args.runs,
             seconds_median=median_of(decodes, "seconds"),
             peak_rss_mb_max=round(max(r["peak_rss_mb"] for r in decodes), 1))
        last = feeds[-1]
        emit(figure="feed_first_poll", runs=args.runs, baseline="baseline_raw_read",
             sessions=last["sessions"], messages=last["messages"], changes=last["changes"],
             first_poll_seconds_median=median_of(feeds, "first_poll_seconds"),
             first_poll_seconds_max=round(max(f["first_poll_seconds"] for f in feeds), 3),
             import_seconds_median=median_of(feeds, "import_seconds"),
             next_poll_seconds_median=median_of(feeds, "next_poll_seconds"),
             peak_rss_mb_max=round(max(f["peak_rss_mb"] for f in feeds), 1))
        emit(figure="watch_json_start", runs=args.runs, baseline="baseline_raw_read",
             spawn_to_start_state_seconds_median=median_of(
                 watches, "spawn_to_start_state_seconds"),
             spawn_to_start_state_seconds_max=round(
                 max(w["spawn_to_start_state_seconds"] for w in watches), 3),
             peak_rss_mb_max=round(max(w["peak_rss_mb"] for w in watches), 1))


if __name__ == "__main__":
    main()
