"""The receipt tracker: only the target process may report, and old frames are forgotten."""

from __future__ import annotations

import asyncio

import pytest

from crosstalk.harness.claude import receipts
from crosstalk.harness.claude.receipts import Tracker


def frame(msg_id: str, status: str = "dropped") -> dict[str, object]:
    return {"type": "control", "action": "peer_message_status", "status": status,
            "orig_msg_id": msg_id, "drop_reason": "rate-limited"}


def test_frames_are_forgotten_oldest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    tracker = Tracker(clock=lambda: now[0])
    monkeypatch.setattr(receipts, "MAX_TRACKED", 3)

    async def run() -> None:
        for i in range(3):
            tracker.expect(f"m{i}", f"id{i}", 10, "s")
            now[0] += 1
        tracker.expect("m0", "id0", 10, "s")  # a resend moves m0 to the back
        tracker.expect("m3", "id3", 10, "s")  # over the count: the oldest (m1) goes
        for m in ("m0", "m1", "m2", "m3"):
            assert await tracker.wait(m, 0) is None  # nobody waits: receipts come back late
        assert [r.message_id for m in ("m0", "m1", "m2", "m3")
                for r in tracker.on_control(frame(m), 10, "s")] == ["id0", "id2", "id3"]
        now[0] += receipts.KEEP_SECONDS + 10
        tracker.expect("m4", "id4", 10, "s")  # everything older than the keep time goes
        assert await tracker.wait("m4", 0) is None
        assert tracker.on_control(frame("m3"), 10, "s") == []
        assert [r.message_id for r in tracker.on_control(frame("m4"), 10, "s")] == ["id4"]
        # Only the process the frame went to may report on it.
        assert tracker.on_control(frame("m4"), 11, "s") == []
        assert tracker.on_control(frame("m4"), 10, "other-start") == []

    asyncio.run(run())


@pytest.mark.parametrize("bad", [
    {},
    {"action": "peer_message_status"},
    {"action": "peer_message_status", "status": 7, "orig_msg_id": "m"},
    {"action": "peer_message_status", "status": "exploded", "orig_msg_id": "m"},
    {"action": "peer_message_status", "status": "dropped", "orig_msg_id": ["m"]},
    {"action": "peer_message_status", "status": "dropped", "dropped_msg_ids": "m"},
    {"action": "peer_message_status", "status": "dropped", "dropped_msg_ids": [None, 3, {}]},
    {"action": "rename", "name": "x", "orig_msg_id": "m"},
])
def test_malformed_control_frames_are_ignored(bad: dict[str, object]) -> None:
    """Bad input from the socket: ignored, and the frame's expectation is still there."""
    tracker = Tracker()

    async def run() -> None:
        tracker.expect("m", "id-m", 10, "s")
        assert await tracker.wait("m", 0) is None
        assert tracker.on_control(bad, 10, "s") == []
        got = tracker.on_control(frame("m", "held"), 10, "s")
        assert [(r.message_id, r.status) for r in got] == [("id-m", "held")]

    asyncio.run(run())
