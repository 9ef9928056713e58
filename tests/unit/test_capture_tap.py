"""The tap's fan-out: free when idle, bounded per subscriber, losses counted and told."""

from __future__ import annotations

import asyncio
import json

import pytest

from crosstalk.capture.redact import Redactor
from crosstalk.capture.stream import lines, render
from crosstalk.capture.tap import (
    MAX_CAPTURES,
    CaptureRefused,
    Frame,
    Lost,
    Tap,
    Taps,
)

pytestmark = pytest.mark.anyio


def test_an_idle_tap_keeps_nothing() -> None:
    tap = Tap("a" * 16)
    big = "x" * 10_000_000
    for _ in range(1000):
        tap.emit("uds", "in", big)
    sub = tap.subscribe()
    assert sub.lost_total == 0
    tap.emit("uds", "in", "after")
    assert [f.raw for f in sub._queue if isinstance(f, Frame)] == ["after"]


async def test_every_subscriber_gets_every_frame_in_order() -> None:
    tap = Tap("agent")
    one, two = tap.subscribe(), tap.subscribe()
    for i in range(10):
        tap.emit("uds", "in", f"line {i}")
    for sub in (one, two):
        got = await sub.get()
        assert [f.raw for f in got if isinstance(f, Frame)] == [f"line {i}" for i in range(10)]


async def test_a_slow_subscriber_loses_frames_and_is_told_how_many() -> None:
    tap = Tap("agent")
    slow = tap.subscribe(max_frames=3)
    fast = tap.subscribe()
    for i in range(10):
        tap.emit("uds", "in", str(i))
    assert [f.raw for f in await slow.get() if isinstance(f, Frame)] == ["0", "1", "2"]
    assert len(await fast.get()) == 10  # the other subscriber lost nothing
    tap.emit("uds", "in", "10")
    got = await slow.get()
    assert got[0] == Lost(7)
    assert isinstance(got[1], Frame)
    assert got[1].raw == "10"
    assert slow.lost_total == 7


async def test_the_byte_bound_drops_a_frame_too_big_and_says_so() -> None:
    tap = Tap("agent")
    sub = tap.subscribe(max_bytes=100)
    tap.emit("a2a", "in", "y" * 101)
    assert await asyncio.wait_for(sub.get(), 1) == [Lost(1)]
    tap.emit("a2a", "in", "small")
    got = await sub.get()
    assert [f.raw for f in got if isinstance(f, Frame)] == ["small"]


async def test_get_waits_and_an_ended_subscription_returns_nothing() -> None:
    tap = Tap("agent")
    sub = tap.subscribe()
    waiting = asyncio.ensure_future(sub.get())
    await asyncio.sleep(0.01)
    assert not waiting.done()
    tap.emit("uds", "out", "ack")
    assert len(await asyncio.wait_for(waiting, 1)) == 1
    tap.end_all()
    assert sub.ended
    assert await sub.get() == []
    assert not tap.subscribers


def test_captures_are_capped_and_a_freed_place_is_taken_again() -> None:
    tap = Tap("agent")
    subs = [tap.subscribe() for _ in range(MAX_CAPTURES)]
    with pytest.raises(CaptureRefused):
        tap.subscribe()
    tap.unsubscribe(subs[0])
    tap.subscribe()


def test_the_process_registry_finds_a_tap_by_agent_or_address_and_counts() -> None:
    taps = Taps()
    tap = Tap("agent")
    taps.register(tap, ["/run/cc-socks/agent.sock"])
    assert taps.tap_for("/run/cc-socks/agent.sock") is tap
    assert taps.tap_for("nobody") is taps.idle
    assert taps.tap_for(None) is taps.idle
    taps.emit("agent", "uds", "in", "nobody listens")  # nothing to do, nothing kept
    sub = tap.subscribe()
    assert taps.capturing == 1
    taps.emit("/run/cc-socks/agent.sock", "claude_inbox", "out", b"frame")
    taps.emit("other", "uds", "in", "not ours")
    assert [f.raw for f in sub._queue if isinstance(f, Frame)] == [b"frame"]
    tap.unsubscribe(sub)
    assert taps.capturing == 0
    taps.unregister(tap)
    assert taps.get("agent") is None
    assert taps.get("/run/cc-socks/agent.sock") is None


def test_queued_frames_print_redacted_with_their_extras() -> None:
    frame = Frame(1.5, "agent", "claude_inbox", "out",
                  b'{"type":"auth","token":"t0k"}\n{"type":"user"}\n',
                  {"inbox": "/tmp/x.sock", "attempt": 1}, seq=7)
    out = list(lines(frame, "agent", Redactor(), 2.0))
    assert [o["frame"] for o in out] == [{"type": "auth", "token": "[redacted]"},
                                         {"type": "user"}]
    assert all(o["seq"] == 7 and o["inbox"] == "/tmp/x.sock" and o["attempt"] == 1
               and o["ts"].startswith("1970-01-01T00:00:01.5") for o in out)
    lost = list(lines(Lost(3), "agent", Redactor(), 2.0))
    assert lost == [{"ts": "1970-01-01T00:00:02.000000+00:00", "agent": "agent",
                     "source": "capture", "event": "dropped", "dropped": 3}]
    json.dumps(out + lost)



def test_a_frame_is_rendered_once_for_every_capture_and_numbered_by_the_tap() -> None:
    tap = Tap("agent")
    one, two = tap.subscribe(), tap.subscribe()
    tap.emit("uds", "in", '{"type":"user"}\n')
    tap.emit("uds", "out", '{"type":"ack"}\n')
    first, second = (f for f in one._queue if isinstance(f, Frame))
    assert (first.seq, second.seq) == (1, 2)
    assert next(iter(two._queue)) is first  # one frame object, shared
    rendered = render(first, "agent", Redactor(), 0.0)
    assert first.rendered is rendered
    assert render(first, "agent", Redactor(["never-used-now"]), 0.0) is rendered
    assert json.loads(rendered)["seq"] == 1
