"""A token bucket that keeps injections under a receiver's own rate limit (pure, no I/O).

Claude Code admits peer messages per sender address through a bucket of 30 tokens refilled at
0.5 per second, and silently drops the rest (research ``claude-code.md`` §5). Every message a
shim injects into one session carries the same sender address (the agent's uds ingress), so a
burst of 40 would lose 10. The shim keeps its own, slightly smaller bucket per address and
waits for a token instead of sending into a drop.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Claude's bucket is 30; a margin covers tokens spent by a previous run of the shim.
CLAUDE_CAPACITY = 27.0
CLAUDE_REFILL_PER_SECOND = 0.5


@dataclass
class TokenBucket:
    capacity: float = CLAUDE_CAPACITY
    rate: float = CLAUDE_REFILL_PER_SECOND
    tokens: float | None = None
    updated: float | None = None

    def __post_init__(self) -> None:
        if self.capacity < 1 or self.rate <= 0:
            raise ValueError("a bucket needs capacity >= 1 and a positive refill rate")

    def _refill(self, now: float) -> float:
        if self.tokens is None or self.updated is None:
            self.tokens, self.updated = self.capacity, now
        elapsed = max(0.0, now - self.updated)
        self.tokens = min(self.capacity, self.tokens + elapsed * self.rate)
        self.updated = now
        return self.tokens

    def wait_time(self, now: float) -> float:
        """Seconds until one token is available (0 if one is now)."""
        tokens = self._refill(now)
        return 0.0 if tokens >= 1 else (1 - tokens) / self.rate

    def take(self, now: float) -> float:
        """Take a token if one is available: returns 0. Otherwise take nothing and return
        the seconds to wait before asking again."""
        wait = self.wait_time(now)
        if wait == 0.0:
            assert self.tokens is not None
            self.tokens -= 1
        return wait

    def drain(self, now: float) -> None:
        """The receiver said it is rate-limited: assume the bucket is empty from now."""
        self._refill(now)
        self.tokens = 0.0
