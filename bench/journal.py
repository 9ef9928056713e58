"""Journal benchmark: durable append throughput and replay time, against raw write+fsync.

Prints one JSON line per figure. The baseline is measured in the same run on the same disk:
``os.write`` of an identical line followed by ``os.fsync``, which is the floor any durable
append pays. Usage: ``python bench/journal.py [--appends N] [--sizes 10000,100000] [--replays 3]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from crosstalk.store.journal import Journal
from crosstalk.store.journal_format import encode_line

RECORD = {
    "subject": "message",
    "id": "019a0000-0000-7000-8000-000000000000",
    "state": "accepted",
    "from": "claude-work-1a2b3c4d",
    "text": "x" * 200,
}


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def bench_raw(path: Path, n: int) -> list[float]:
    line = encode_line({**RECORD, "seq": 1, "ts": 0.0})
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    lat = []
    try:
        for _ in range(n):
            t = time.perf_counter()
            os.write(fd, line)
            os.fsync(fd)
            lat.append(time.perf_counter() - t)
    finally:
        os.close(fd)
    return lat


def bench_append(path: Path, n: int) -> list[float]:
    lat = []
    with Journal(path) as j:
        for _ in range(n):
            t = time.perf_counter()
            j.append(RECORD)
            lat.append(time.perf_counter() - t)
    return lat


def summarize(name: str, lat: list[float], baseline: str | None = None) -> dict[str, object]:
    total = sum(lat)
    q = statistics.quantiles(lat, n=100)
    out: dict[str, object] = {
        "figure": name,
        "n": len(lat),
        "per_sec": round(len(lat) / total, 1),
        "p50_us": round(q[49] * 1e6, 1),
        "p99_us": round(q[98] * 1e6, 1),
    }
    if baseline:
        out["baseline"] = baseline
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--appends", type=int, default=2000)
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--replays", type=int, default=3, help="replays per size (median printed)")
    ap.add_argument("--dir", default=None, help="directory on the disk to measure (default: tmp)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        base = Path(d)
        raw_lat = bench_raw(base / "raw.jsonl", args.appends)
        emit(**summarize("raw_write_fsync", raw_lat))
        app_lat = bench_append(base / "a.jsonl", args.appends)
        emit(**summarize("journal_append_durable", app_lat, baseline="raw_write_fsync"),
             vs_baseline=round(sum(raw_lat) / sum(app_lat), 3))

        for size in (int(s) for s in args.sizes.split(",") if s):
            path = base / f"replay-{size}.jsonl"
            with Journal(path) as j:
                for start in range(0, size, 1000):
                    j.append_batch([RECORD] * min(1000, size - start))
            nbytes = path.stat().st_size
            # Baseline: read the same bytes and split lines, no decoding or checks. Each is
            # timed --replays times, alternating, and the medians are compared (a shared
            # machine's noise hits both alike).
            raw_times, replay_times = [], []
            for _ in range(args.replays):
                t = time.perf_counter()
                with open(path, "rb") as f:
                    lines = f.read().split(b"\n")
                raw_times.append(time.perf_counter() - t)
                del lines
                t = time.perf_counter()
                with Journal(path) as j:
                    replay = j.replay()
                replay_times.append(time.perf_counter() - t)
                if len(replay.records) != size or replay.damage:
                    raise SystemExit(f"replay of {size} records returned {len(replay.records)}")
                del replay
            took, raw_read = statistics.median(replay_times), statistics.median(raw_times)
            emit(figure="journal_replay", records=size, bytes=nbytes, runs=args.replays,
                 seconds=round(took, 4), min_seconds=round(min(replay_times), 4),
                 records_per_sec=round(size / took),
                 baseline="raw_read_split", baseline_seconds=round(raw_read, 4),
                 vs_baseline=round(took / raw_read, 2))

if __name__ == "__main__":
    main()
