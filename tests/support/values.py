"""Comparing decoded JSON values in tests: equal with their types, and NaN equal to NaN."""

from __future__ import annotations

import math
from typing import Any


def same(a: Any, b: Any) -> bool:
    """Equal, with types (1 is not 1.0 or True) and NaN equal to NaN."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(a == b)
