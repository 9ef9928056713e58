"""The benches issue 16 reads its figures from still run and still say what they claim.

Each script runs for real (child processes, sockets, fsynced journals) at a tiny size. What is
checked is the shape of the figures, never their speed: every acknowledged message was counted
as accepted, nothing acknowledged is missing from the receivers' journals, and a baseline from
the same run is printed beside the figure.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[2] / "bench"


def figures(script: str, *args: str) -> dict[str, dict[str, Any]]:
    done = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True,
                          text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {line["figure"]: line for line in lines}


def test_throughput_counts_every_durable_answer_on_both_paths() -> None:
    got = figures("throughput.py", "--messages", "40", "--concurrency", "8")
    assert got["raw_write_fsync_per_sec"]["per_sec"] > 0
    for path in ("uds", "a2a"):
        fig = got[f"{path}_sustained_into_one_agent"]
        assert fig["accepted"] == 40, fig
        assert "not_accepted" not in fig
        assert fig["baseline"] == "raw_write_fsync_per_sec"
        assert fig["baseline_per_sec"] == got["raw_write_fsync_per_sec"]["per_sec"]
        assert fig["receiver_cpu_us_per_msg"] > 0
        assert fig["sender_cpu_us_per_msg"] > 0
    assert got["bare_uds_server"]["accepted"] == 40  # the floor, from the same senders


def test_the_a2a_floor_counts_completed_tasks_from_the_bare_sdk_stack() -> None:
    got = figures("a2a_floor.py", "--messages", "40", "--concurrency", "8", "--warmup", "5")
    fig = got["a2a_sdk_floor_msgs_per_sec"]
    assert fig["accepted"] == fig["messages"] == 40
    assert fig["failed"] == 0
    assert fig["value"] > 0
    assert fig["server_cpu_us_per_msg"] > 0
    assert fig["client_cpu_us_per_msg"] > 0


def test_all_to_all_reads_its_losses_back_from_the_journals() -> None:
    got = figures("soak.py", "--no-attack", "--procs", "1", "--seconds", "2")
    assert set(got) == {"raw_write_fsync_per_sec", "soak_all_to_all"}
    fig = got["soak_all_to_all"]
    assert fig["agents"] == 4
    assert fig["acknowledged"] > 0
    assert fig["lost"] == fig["journal_lost"] == fig["duplicated"] == fig["spurious"] == 0, fig
    assert fig["by_path"].keys() == {"a2a", "uds"}


def test_ab_runs_both_sides_and_reports_each_figure_per_side() -> None:
    src = str(BENCH.parent / "src")
    done = subprocess.run([sys.executable, str(BENCH / "ab.py"), "--a", src, "--b", src,
                           "--runs", "2", "--", "throughput.py", "--path", "uds",
                           "--messages", "10"], capture_output=True, text=True, timeout=240,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert {(x["side"], x["figure"]) for x in lines} == {
        (side, fig) for side in "ab"
        for fig in ("raw_write_fsync_per_sec", "bare_uds_server",
                    "uds_sustained_into_one_agent")}
    assert all(x["runs"] == 2 for x in lines)
    assert all(x["accepted"] == 10 for x in lines if x["figure"].startswith("uds"))
    assert done.stderr.count('"figure": "uds_sustained_into_one_agent"') == 4  # every run's
