"""Interleaved A/B of one bench between two source trees, medians per figure.

The machine is small (2 cores) and shared, so two runs minutes apart measure the load as much
as the code. Running A, B, A, B, ... in one sitting and comparing medians is the fairest
before/after it allows. A side is a checkout's ``src`` directory, put first on PYTHONPATH for
the bench and every child it starts; the bench script itself is always this tree's, so both
sides are measured the same way.

Usage: ``python bench/ab.py --a /work/wt/before/src --b src --runs 3 -- throughput.py
--messages 2000``. Prints one JSON line per figure and side (``side``: a | b), each numeric
field the median over the runs, and the raw lines of every run to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from _stats import median_of

BENCH = Path(__file__).resolve().parent


def one_run(src: str, script: str, args: list[str]) -> list[dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": str(Path(src).resolve())}
    done = subprocess.run([sys.executable, str(BENCH / script), *args], env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{script} failed on {src}: {done.stderr[-2000:]}")
    print(done.stdout, end="", file=sys.stderr, flush=True)
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def medians(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    by_figure: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        for line in run:
            by_figure[str(line.get("figure"))].append(line)
    out = []
    for figure, lines in by_figure.items():
        numeric = [k for k, v in lines[0].items()
                   if isinstance(v, int | float) and not isinstance(v, bool)
                   and all(k in line for line in lines)]
        out.append({"figure": figure, "runs": len(lines),  # a setting (same in every run) as is
                    **{k: lines[0][k] if len({line[k] for line in lines}) == 1
                       else median_of(lines, k) for k in numeric}})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--a", required=True, help="side a: a checkout's src directory")
    ap.add_argument("--b", default=str(BENCH.parent / "src"), help="side b (default: this tree)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("bench", nargs=argparse.REMAINDER, help="-- script.py [its arguments]")
    args = ap.parse_args()
    bench = args.bench[1:] if args.bench[:1] == ["--"] else args.bench
    if not bench:
        ap.error("name the bench script after --")
    runs: dict[str, list[list[dict[str, Any]]]] = {"a": [], "b": []}
    for _ in range(args.runs):
        for side in ("a", "b"):
            runs[side].append(one_run(getattr(args, side), bench[0], bench[1:]))
    for side in ("a", "b"):
        for line in medians(runs[side]):
            print(json.dumps({"side": side, "src": getattr(args, side), **line}), flush=True)


if __name__ == "__main__":
    main()
