"""Restart benchmark: how long an agent with a full 24 h journal takes to start, and its peak RSS.

The journal is built the way the product writes it. First a real agent pair exchanges a few
messages of each kind over real sockets (A2A informs, A2A asks the receiver answers with
``reply``, ``crosstalk send`` frames on the uds ingress); the receiver's journal lines for each
message are its template. The template's records are then written again, with fresh ids and
``seq``/``ts`` spread over the last 23.5 h, through the journal's own line codec (batch
markers kept) until the journal holds ``--messages`` messages. The default mix gives about
4.3 lines per message, like the red team's 20k-message journal (86k lines, 35 MB).

Each run then starts the receiving agent on that journal in a fresh subprocess (a copy of the
pristine journal each time: a start may settle records): ``Agent.start`` is journal replay,
the task store's load, receiver recovery, both listeners and the descriptor. The child
reports how long ``start()`` took; the parent reads the child's peak RSS from ``wait4``
(``ru_maxrss``) and times spawn-to-ready (which includes the interpreter and imports).

Three starts per run (ADR 0018): the usual restart, right after a clean stop
(``agent_restart``: from a fresh checkpoint); a restart after a SIGKILL
(``agent_restart_after_sigkill``: from a checkpoint about 5,000 lines behind the journal, as far
as the background advance lets one fall behind); and the first start of a journal that has no
checkpoint (``agent_start_no_checkpoint``: a full replay, as after an upgrade from a version
without checkpoints; its clean stop writes the checkpoint the restart reads). Each also reports
the first ``receive_message`` after the start and the stop.

Baseline, measured in the same run: a child with the same imports that reads the same file and
splits it into lines (no decoding, no CRC) — the floor for anything that looks at every line
at once — and its peak RSS.

Prints one JSON line per figure. Usage:
``python bench/restart.py [--messages 20000] [--runs 3] [--keep DIR]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _stats import median_of  # bench/_stats.py: shared by the benches
from crosstalk.agent import Agent, AgentSpec
from crosstalk.agent.checkpoints import advanced
from crosstalk.cli.send import frames
from crosstalk.config import journal_path
from crosstalk.core.ids import agent_id_for, new_message_id
from crosstalk.core.states import AskState, MessageState
from crosstalk.harness.fake import FakeHarness
from crosstalk.store import checkpoint
from crosstalk.store.journal_format import encode_line
from crosstalk.store.journal_read import ReadMark
from crosstalk.store.registry import Registry

HARNESS = "fake"
SESSION = "bench-restart-b"
#: Share of messages per kind; about 4.3 journal lines per message on average.
MIX = {"a2a_inform": 0.28, "a2a_ask": 0.05, "uds_inform": 0.67}
SPAN_SECONDS = 23.5 * 3600
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


@dataclass
class Unit:
    """One message's journal lines as the receiver wrote them."""

    kind: str
    #: (line continues a batch, record JSON without seq/ts, ts offset from the first line)
    lines: list[tuple[bool, str, float]]


# -- the template: real messages over real sockets -------------------------------------------


async def _settle(agent: Agent, message_id: str, *, ask: bool) -> None:
    """Wait (bounded) until the message and its task stop changing."""
    assert agent.receiver is not None
    assert agent.a2a is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        entry = agent.receiver.entries.get(message_id)
        done = entry is not None and entry.state not in (MessageState.SUBMITTED,
                                                          MessageState.DISPATCHING)
        if done and ask:
            done = entry is not None and entry.ask is AskState.OPEN
        task_id = agent.a2a.task_for_message(message_id)
        stored = agent.a2a.store.lookup(task_id) if task_id else None
        if done and (stored is None or ask or stored.state.value == "completed"):
            return
        await asyncio.sleep(0.01)
    raise SystemExit(f"template message {message_id} did not settle")


def _lines_since(path: Path, offset: int) -> tuple[list[bytes], int]:
    data = path.read_bytes()
    return data[offset:].splitlines(), len(data)


async def record_template(tmp: Path, per_kind: int) -> tuple[list[Unit], str]:
    """Run a real agent pair and cut the receiver's journal into one unit per message."""
    env = {"XDG_RUNTIME_DIR": str(tmp / "rt")}
    reg = Registry(tmp / "tpl-state")
    a = Agent(reg, AgentSpec(FakeHarness(name=HARNESS), "bench-restart-a", "/b", "sender"),
              env=env)
    b = Agent(reg, AgentSpec(FakeHarness(name=HARNESS), SESSION, "/b", "receiver"), env=env)
    await a.start()
    await b.start()
    units: list[Unit] = []
    try:
        assert b.journal is not None
        assert b.uds is not None
        assert b.receiver is not None
        assert b.receiver.binding is not None
        instance_id = b.receiver.binding.instance_id
        path = b.journal.path
        _, offset = _lines_since(path, 0)
        token = b.uds.key_path.read_text().strip()
        rnd = random.Random(7)
        for i in range(per_kind):
            for kind in MIX:
                text = f"{kind} {i} " + "x" * rnd.randrange(20, 200)
                if kind == "a2a_inform":
                    res = await a.send("receiver", text)
                    await _settle(b, res.message_id, ask=False)
                elif kind == "a2a_ask":
                    res = await a.send("receiver", text, kind="ask", return_immediately=True)
                    await _settle(b, res.message_id, ask=True)
                    await b.reply(res.message_id, "answer " + text)
                else:
                    mid = new_message_id()
                    reader, writer = await asyncio.open_unix_connection(str(b.uds.path))
                    writer.write(frames(token, text, mid))
                    await writer.drain()
                    writer.write_eof()
                    await reader.readline()
                    writer.close()
                    await _settle(b, mid, ask=False)
                raw, offset = _lines_since(path, offset)
                units.append(Unit(kind, _unit_lines(raw)))
    finally:
        await a.stop()
        await b.stop()
    return units, instance_id


def _unit_lines(raw: list[bytes]) -> list[tuple[bool, str, float]]:
    out: list[tuple[bool, str, float]] = []
    first_ts: float | None = None
    for line in raw:
        envelope = json.loads(line)
        more = "b" in envelope
        record = envelope["r"]
        ts = float(record.pop("ts"))
        record.pop("seq")
        first_ts = ts if first_ts is None else first_ts
        out.append((more, json.dumps(record, ensure_ascii=False), ts - first_ts))
    return out


# -- the journal: the template written again ---------------------------------------------------


def build_journal(path: Path, units: list[Unit], instance_id: str, messages: int,
                  seed: int = 11) -> dict[str, int]:
    """Write ``messages`` copies of template units (mixed per :data:`MIX`) to ``path``."""
    rnd = random.Random(seed)
    by_kind: dict[str, list[Unit]] = {}
    for unit in units:
        by_kind.setdefault(unit.kind, []).append(unit)
    kinds, weights = list(MIX), [MIX[k] for k in MIX]
    start = time.time() - SPAN_SECONDS
    seq = 0
    lines = 0
    with open(path, "wb") as f:
        for i in range(messages):
            unit = rnd.choice(by_kind[rnd.choices(kinds, weights)[0]])
            fresh: dict[str, str] = {instance_id: instance_id}

            def swap(m: re.Match[str], fresh: dict[str, str] = fresh) -> str:
                return fresh.setdefault(m.group(0), str(uuid.uuid4()))

            base = start + SPAN_SECONDS * i / messages
            chunk: list[bytes] = []
            for more, body, offset in unit.lines:
                seq += 1
                record: dict[str, Any] = json.loads(_UUID.sub(swap, body))
                record["seq"], record["ts"] = seq, base + offset
                chunk.append(encode_line(record, more=more))
            f.write(b"".join(chunk))
            lines += len(chunk)
        f.flush()
        os.fsync(f.fileno())
    return {"lines": lines, "bytes": path.stat().st_size}


# -- the timed child -----------------------------------------------------------------------------


async def child_start(home: Path, runtime: Path) -> dict[str, float]:
    reg = Registry(home)
    agent = Agent(reg, AgentSpec(FakeHarness(name=HARNESS), SESSION, "/b", "receiver"),
                  env={"XDG_RUNTIME_DIR": str(runtime)})
    t, cpu = time.perf_counter(), time.process_time()
    await agent.start()
    took, cpu = time.perf_counter() - t, time.process_time() - cpu
    # The peak so far is the start's own; the child's whole peak (wait4) includes the stop,
    # whose checkpoint advance may hold a second copy of the readers' state.
    start_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"ready": True, "start_seconds": took, "start_cpu_seconds": cpu,
                      "start_peak_rss_mb": start_rss}), flush=True)
    t = time.perf_counter()
    mailbox = agent.mailbox()  # what the first receive_message reads
    first_receive = time.perf_counter() - t
    entries = len(agent.receiver.entries) if agent.receiver else 0
    tasks = len(agent.a2a.store.all()) if agent.a2a else 0
    read = agent.started.records if agent.started else -1
    t = time.perf_counter()
    await agent.stop()
    print(json.dumps({"entries": entries, "tasks": tasks, "mailbox": len(mailbox),
                      "start_read_records": read,
                      "first_receive_seconds": first_receive,
                      "stop_seconds": time.perf_counter() - t}), flush=True)
    return {"start_seconds": took}


def stale_checkpoint(jpath: Path, agent_id: str, behind_bytes: int) -> int:
    """Write the checkpoint of the journal's prefix that ends ``behind_bytes`` before its end
    (at a whole write), as a background advance would have; the records it is behind."""
    data = jpath.read_bytes()
    cut = data.rfind(b"\n", 0, max(0, len(data) - behind_bytes)) + 1
    while cut > 0 and data[data.rfind(b"\n", 0, cut - 1) + 1:].startswith(b'{"b":'):
        cut = data.rfind(b"\n", 0, cut - 1) + 1  # not inside a batch
    fd = os.open(jpath, os.O_RDONLY)
    try:
        made = advanced(fd, ReadMark(os.fstat(fd).st_ino, cut),
                        checkpoint.path_for(jpath), agent_id, threading.Event())
    finally:
        os.close(fd)
    assert made is not None
    checkpoint.write(checkpoint.path_for(jpath), agent_id, *made)
    return data[cut:].count(b"\n")


def child_raw(path: Path) -> None:
    t = time.perf_counter()
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    took = time.perf_counter() - t
    print(json.dumps({"ready": True, "start_seconds": took, "lines": len(lines) - 1}),
          flush=True)


def run_child(args: list[str]) -> dict[str, Any]:
    """Run this file as a child; its report lines, spawn-to-ready time and peak RSS."""
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    report: dict[str, Any] = {}
    for line in proc.stdout:
        got = json.loads(line)
        if got.get("ready"):
            report["spawn_to_ready_seconds"] = time.perf_counter() - t
        report.update(got)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"child {args[:2]} exited {proc.returncode}")
    report["peak_rss_mb"] = usage.ru_maxrss / 1024  # kilobytes on Linux
    return report


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--per-kind", type=int, default=8, help="template messages per kind")
    ap.add_argument("--keep", default=None, help="keep the built journal in this directory")
    ap.add_argument("--stale-bytes", type=int, default=2_070_000,
                    help="how far behind the stale checkpoint is (about 5,000 lines, the "
                         "background advance's threshold)")
    ap.add_argument("--child", choices=["start", "raw", "stale"], help=argparse.SUPPRESS)
    ap.add_argument("--home", help=argparse.SUPPRESS)
    ap.add_argument("--runtime", help=argparse.SUPPRESS)
    ap.add_argument("--journal", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child == "start":
        asyncio.run(child_start(Path(args.home), Path(args.runtime)))
        return
    if args.child == "raw":
        child_raw(Path(args.journal))
        return
    if args.child == "stale":
        behind = stale_checkpoint(Path(args.journal), agent_id_for(HARNESS, SESSION),
                                  args.stale_bytes)
        print(json.dumps({"behind": behind}), flush=True)
        return

    with tempfile.TemporaryDirectory(prefix="ct-rst-", dir="/tmp") as d:
        tmp = Path(d)
        units, instance_id = asyncio.run(record_template(tmp, args.per_kind))
        pristine = tmp / "pristine.jsonl"
        t = time.perf_counter()
        size = build_journal(pristine, units, instance_id, args.messages)
        emit(figure="journal_built", messages=args.messages, **size,
             seconds=round(time.perf_counter() - t, 2),
             lines_per_kind={k: len(next(u for u in units if u.kind == k).lines)
                             for k in MIX})
        if args.keep:
            Path(args.keep).mkdir(parents=True, exist_ok=True)
            shutil.copy(pristine, Path(args.keep) / "restart-journal.jsonl")
        agent_id = agent_id_for(HARNESS, SESSION)
        starts, fresh, stale, raws = [], [], [], []
        behind = 0
        for run in range(args.runs):
            raws.append(run_child(["--child", "raw", "--journal", str(pristine)]))
            home, stale_home = tmp / f"run-{run}", tmp / f"stale-{run}"
            for h in (home, stale_home):
                Registry(h)  # the private directory tree, as a first start leaves it
                jpath = journal_path(h, agent_id)
                jpath.parent.mkdir(mode=0o700, exist_ok=True)
                shutil.copy(pristine, jpath)
            # No checkpoint: a full replay; its clean stop leaves a fresh checkpoint.
            starts.append(run_child(["--child", "start", "--home", str(home),
                                     "--runtime", str(tmp / f"rt-{run}")]))
            fresh.append(run_child(["--child", "start", "--home", str(home),
                                    "--runtime", str(tmp / f"rt-{run}")]))
            # Built in a child: a parent that had held the state would inflate the children's
            # ru_maxrss (a forked child counts its parent's pages until it execs).
            behind = run_child(["--child", "stale", "--journal",
                                str(journal_path(stale_home, agent_id)),
                                "--stale-bytes", str(args.stale_bytes)])["behind"]
            stale.append(run_child(["--child", "start", "--home", str(stale_home),
                                    "--runtime", str(tmp / f"rt-s-{run}")]))
        emit(figure="baseline_raw_read_split", runs=args.runs,
             seconds_median=median_of(raws, "start_seconds"),
             spawn_to_ready_median=median_of(raws, "spawn_to_ready_seconds"),
             peak_rss_mb_max=round(max(r["peak_rss_mb"] for r in raws), 1))
        emit(figure="agent_start_no_checkpoint", runs=args.runs, messages=args.messages, **size,
             entries=starts[-1].get("entries"), tasks=starts[-1].get("tasks"),
             start_seconds_median=median_of(starts, "start_seconds"),
             start_seconds_max=round(max(s["start_seconds"] for s in starts), 3),
             spawn_to_ready_median=median_of(starts, "spawn_to_ready_seconds"),
             peak_rss_mb_max=round(max(s["peak_rss_mb"] for s in starts), 1),
             baseline="baseline_raw_read_split", **_more(starts))
        emit(figure="agent_restart", runs=args.runs, messages=args.messages,
             baseline="baseline_raw_read_split",
             start_seconds_median=median_of(fresh, "start_seconds"),
             start_seconds_max=round(max(s["start_seconds"] for s in fresh), 3),
             spawn_to_ready_median=median_of(fresh, "spawn_to_ready_seconds"),
             peak_rss_mb_max=round(max(s["peak_rss_mb"] for s in fresh), 1), **_more(fresh))
        emit(figure="agent_restart_after_sigkill", runs=args.runs, behind_lines=behind,
             start_seconds_median=median_of(stale, "start_seconds"),
             start_seconds_max=round(max(s["start_seconds"] for s in stale), 3),
             spawn_to_ready_median=median_of(stale, "spawn_to_ready_seconds"),
             peak_rss_mb_max=round(max(s["peak_rss_mb"] for s in stale), 1), **_more(stale))


def _more(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """What every start figure adds: the first receive_message, the stop, what was read."""
    return {"start_cpu_seconds_median": median_of(reports, "start_cpu_seconds"),
            "start_peak_rss_mb_max": round(max(r["start_peak_rss_mb"] for r in reports), 1),
            "first_receive_seconds_median": median_of(reports, "first_receive_seconds"),
            "stop_seconds_median": median_of(reports, "stop_seconds"),
            "start_read_records": reports[-1]["start_read_records"],
            "mailbox_entries": reports[-1]["mailbox"]}


if __name__ == "__main__":
    main()
