"""bench/_stats.py: the one definition of a bench's median and percentile."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from _stats import median_of, percentile


def test_percentile_matches_the_exclusive_quantiles_and_handles_tiny_samples() -> None:
    xs = [float(i) for i in range(1, 101)]
    assert percentile(xs, 50) == 50.5
    assert percentile(xs, 99) == 99.99
    assert percentile([], 50) == 0.0
    assert percentile([7.0], 99) == 7.0


def test_median_of_reads_one_field_of_each_report() -> None:
    reports = [{"s": 0.3}, {"s": 0.1}, {"s": 0.2, "other": 9}]
    assert median_of(reports, "s") == 0.2
