"""``crosstalk capture``: the raw wire of a running agent, redacted (seed 000 §6).

:mod:`.tap` (the per-agent fan-out tap points hand frames to), :mod:`.redact` (every token
and key out), :mod:`.stream` (what a capture connection receives), :mod:`.asgi` (the A2A tap).
"""

from crosstalk.capture.tap import TAPS, CaptureRefused, Tap

__all__ = ["TAPS", "CaptureRefused", "Tap"]
