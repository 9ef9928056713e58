"""Claude's delivery receipts for frames we injected (research ``claude-code.md`` §5).

After reading a peer frame, Claude may send the frame's ``from`` address one control line:
``{"type":"control","action":"peer_message_status","status":S,"orig_msg_id":M,...}`` with
``S`` one of ``dropped`` (rate limit, duplicate, relay loop, full queue: never delivered),
``held`` (waiting for its user's approval, permission-mode parity), ``delivered`` (a held
message released), ``denied`` and ``expired``. It sends it only to a listener that is the
process which sent the frame, so the shim that injects is the one that hears back.

A receipt counts only if it names a frame this process sent and comes from the process it
was sent to (pid and start time by ``SO_PEERCRED``); anything else is ignored. The injector
waits a short grace after each frame for an immediate receipt (held, or a first drop); later
receipts (Claude batches drops after 5 s, a held message is approved or denied later) go to
whoever registered for them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from crosstalk.harness.base import Receipt

STATUSES: Final = frozenset({"dropped", "held", "delivered", "denied", "expired"})
#: How long a sent frame's receipts are still taken (a held message may wait for its user).
KEEP_SECONDS: Final = 3600.0
MAX_TRACKED: Final = 10_000


@dataclass
class _Expected:
    message_id: str
    pid: int
    start: str | None
    at: float
    waiter: asyncio.Future[Receipt] | None = None
    seen: list[str] = field(default_factory=list)


class Tracker:
    """The frames this process sent, by ``msg_id``, and the receipts that came back."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._sent: dict[str, _Expected] = {}

    def expect(self, msg_id: str, message_id: str, pid: int, start: str | None) -> None:
        """Register a frame before it is written (an immediate receipt must find it). Its
        first receipt is held for :meth:`wait` until that gives up."""
        self._prune()
        expected = _Expected(message_id, pid, start, self.clock())
        expected.waiter = asyncio.get_running_loop().create_future()
        self._sent.pop(msg_id, None)  # a resend goes to the back: oldest first stays true
        self._sent[msg_id] = expected

    async def wait(self, msg_id: str, grace: float) -> Receipt | None:
        """The receipt that arrived, or arrives within ``grace`` seconds, if any; later ones
        are handed to :meth:`on_control`'s caller instead."""
        expected = self._sent.get(msg_id)
        if expected is None or expected.waiter is None:
            return None
        waiter = expected.waiter
        try:
            if waiter.done():
                return waiter.result()
            if grace <= 0:
                return None
            return await asyncio.wait_for(asyncio.shield(waiter), grace)
        except TimeoutError:
            return None
        finally:
            expected.waiter = None
            if not waiter.done():
                waiter.cancel()

    def on_control(self, frame: Mapping[str, Any], peer_pid: int | None,
                   peer_start: str | None) -> list[Receipt]:
        """Receipts in ``frame`` nobody is waiting for (the caller applies them)."""
        if frame.get("action") != "peer_message_status":
            return []
        status = frame.get("status")
        if not isinstance(status, str) or status not in STATUSES:
            return []
        detail = frame.get("drop_reason") or frame.get("status_detail")
        reason = detail[:64] if isinstance(detail, str) else None
        ids = [frame.get("orig_msg_id")]
        extra = frame.get("dropped_msg_ids")
        if status == "dropped" and isinstance(extra, list):
            ids.extend(extra[:100])
        late: list[Receipt] = []
        for msg_id in dict.fromkeys(i for i in ids if isinstance(i, str)):
            expected = self._sent.get(msg_id)
            if expected is None or peer_pid != expected.pid or (
                    expected.start is not None and peer_start != expected.start):
                continue  # not ours, or not from the session we sent it to
            if status in expected.seen and status != "dropped":
                continue
            expected.seen.append(status)
            receipt = Receipt(expected.message_id, status, reason, msg_id)
            if expected.waiter is not None and not expected.waiter.done():
                expected.waiter.set_result(receipt)
            else:
                late.append(receipt)
        return late

    def forget(self, msg_id: str) -> None:
        self._sent.pop(msg_id, None)

    def _prune(self) -> None:
        """Drop the oldest frames (insertion order is time order) past the keep time or the
        count: a look at the front, not a walk over every frame on each injection."""
        cutoff = self.clock() - KEEP_SECONDS
        while self._sent:
            oldest = next(iter(self._sent))
            if self._sent[oldest].at >= cutoff and len(self._sent) < MAX_TRACKED:
                break
            del self._sent[oldest]


#: One per process: the injector registers frames, every agent's uds ingress reports back.
TRACKER = Tracker()
