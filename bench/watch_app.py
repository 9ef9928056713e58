"""Watch UI benchmark: how fast the full-screen ``crosstalk watch`` is on screen with a busy
machine's start state drawn, in a real terminal, and its peak memory.

The machine is bench/watch.py's (``--agents`` live registrations, ``--records`` journal
records written through the journal's codec). ``crosstalk watch`` runs in tmux (a real pty,
160x50); ``capture-pane`` is read every 20 ms until the summary line shows every session and
no longer says "reading journals" (the first poll applied and drawn).

Figures, each the median of ``--runs`` fresh processes:

- ``ui_empty``: the same on an empty state dir: the UI's own cost (interpreter, textual, the
  first frame), the floor for ``ui_full``.
- ``ui_full``: spawn until the start state is on screen, and the process's peak RSS (VmHWM)
  after a few more polls.
- ``json_full``: ``crosstalk watch --json`` until its start state is printed (bench/watch.py's
  figure), the same feed without a terminal UI.

Prints one JSON line per figure. Usage:
``python bench/watch_app.py [--agents 200] [--records 100000] [--runs 3]``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _stats import median_of  # bench/_stats.py: shared by the benches
from watch import build, emit, hwm_mb, run_child, run_watch  # bench/watch.py: its machine

RUNS = itertools.count()


def tmux(sock: str, *args: str) -> str:
    return subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True,
                          check=True).stdout


def run_ui(home: Path, sessions: int, timeout: float = 30.0) -> dict[str, Any]:
    """``crosstalk watch`` in a fresh tmux server until its start state is on screen."""
    sock = f"ct-bench-{os.getpid()}-{next(RUNS)}"  # a fresh server each run
    crosstalk = Path(sys.executable).with_name("crosstalk")
    command = (f"exec env CROSSTALK_HOME={shlex.quote(str(home))} "
               f"XDG_RUNTIME_DIR={shlex.quote(str(home.parent / 'rt'))} "
               f"TERM=xterm-256color {shlex.quote(str(crosstalk))} watch")
    want = f"{sessions} sessions"
    t = time.perf_counter()
    tmux(sock, "new-session", "-d", "-x", "160", "-y", "50", command)
    try:
        pid = int(tmux(sock, "display", "-p", "-t", "0", "#{pane_pid}").strip())
        while True:
            first = tmux(sock, "capture-pane", "-p", "-t", "0").split("\n", 1)[0]
            if want in first and "reading journals" not in first:
                took = time.perf_counter() - t
                break
            if time.perf_counter() - t > timeout:
                raise SystemExit(f"not on screen in {timeout} s: {first!r}")
            time.sleep(0.02)
        time.sleep(1.5)  # a few follow polls and a session re-read inside the peak
        rss = hwm_mb(pid)
        tmux(sock, "send-keys", "-t", "0", "q")
    finally:
        subprocess.run(["tmux", "-L", sock, "kill-server"], capture_output=True, check=False)
    return {"seconds": took, "peak_rss_mb": rss, "screen": first.strip()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=200)
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    if shutil.which("tmux") is None:
        raise SystemExit("bench/watch_app.py needs tmux (a real terminal)")
    with tempfile.TemporaryDirectory(prefix="ct-watchui-", dir="/tmp") as d:
        tmp = Path(d)
        empty = tmp / "empty" / "state"
        empty.mkdir(parents=True, mode=0o700)
        t = time.perf_counter()
        home, held, size = build(tmp, args.agents, args.records)
        emit(figure="machine_built", agents=args.agents, **size,
             seconds=round(time.perf_counter() - t, 1))
        try:
            start = run_child(["--child", "feed", "--home", str(home)])["changes"]
            empties, fulls, jsons = [], [], []
            for _ in range(args.runs):
                empties.append(run_ui(empty, 0))
                fulls.append(run_ui(home, args.agents))
                jsons.append(run_watch(home, start))
        finally:
            for r in held:
                r.close()
    emit(figure="ui_empty", runs=args.runs, seconds_median=median_of(empties, "seconds"),
         peak_rss_mb_median=median_of(empties, "peak_rss_mb"))
    emit(figure="ui_full", runs=args.runs, agents=args.agents, records=size["lines"],
         seconds_median=median_of(fulls, "seconds"),
         peak_rss_mb_median=median_of(fulls, "peak_rss_mb"), screen=fulls[-1]["screen"])
    emit(figure="json_full", runs=args.runs,
         seconds_median=median_of(jsons, "spawn_to_start_state_seconds"),
         peak_rss_mb_median=median_of(jsons, "peak_rss_mb"))
    print(json.dumps({"note": "ui_full - ui_empty is what the board costs the UI; "
                      "ui_full - json_full is what drawing it costs"}))


if __name__ == "__main__":
    main()
