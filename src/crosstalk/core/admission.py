"""Admission limits (seed §5, C9, R9): reject before acceptance, never evict accepted work.

Pure bookkeeping: the receiver reserves a slot *before* it creates a task or opens an ask and
releases it when the work resolves; a reservation that does not fit is a deterministic
rejection with the limit's name as the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Limits:
    max_text_bytes: int = 64 * 1024
    max_pending_tasks: int = 256
    max_open_asks: int = 32
    max_waits: int = 64
    max_body_bytes: int = 256 * 1024  # A2A request body, checked before decoding (R10)


@dataclass
class Admission:
    limits: Limits = field(default_factory=Limits)
    pending_tasks: set[str] = field(default_factory=set)
    open_asks: set[str] = field(default_factory=set)
    waits: int = 0

    def check_size(self, text_bytes: int) -> str | None:
        if text_bytes > self.limits.max_text_bytes:
            return "message_too_large"
        return None

    def reserve_task(self, task_id: str) -> str | None:
        if task_id in self.pending_tasks:
            return None
        if len(self.pending_tasks) >= self.limits.max_pending_tasks:
            return "too_many_pending_tasks"
        self.pending_tasks.add(task_id)
        return None

    def release_task(self, task_id: str) -> None:
        self.pending_tasks.discard(task_id)

    def reserve_ask(self, message_id: str) -> str | None:
        if message_id in self.open_asks:
            return None
        if len(self.open_asks) >= self.limits.max_open_asks:
            return "too_many_open_asks"
        self.open_asks.add(message_id)
        return None

    def release_ask(self, message_id: str) -> None:
        self.open_asks.discard(message_id)

    def reserve_wait(self) -> str | None:
        if self.waits >= self.limits.max_waits:
            return "too_many_waits"
        self.waits += 1
        return None

    def release_wait(self) -> None:
        self.waits = max(0, self.waits - 1)
