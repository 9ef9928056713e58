"""Medians and percentiles shared by the benches, so every figure is summarised the same way.

Percentiles are ``statistics.quantiles(n=100)`` (the "exclusive" method): the figures in
issue 16 and in bench/README.md were computed that way, and a second definition in another
bench would make two p99s of the same samples disagree.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def percentile(samples: Sequence[float], k: int) -> float:
    """The k-th percentile (1..99); one sample is its own percentile, none is 0.0."""
    if not samples:
        return 0.0
    if len(samples) == 1:
        return float(samples[0])
    return statistics.quantiles(samples, n=100)[k - 1]


def median_of(reports: Iterable[Mapping[str, Any]], key: str) -> float:
    """The median of one field over several runs' reports, rounded for a JSON line."""
    return round(float(statistics.median(r[key] for r in reports)), 3)
