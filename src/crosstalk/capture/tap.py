"""The tap: every frame an agent's ingresses read and its injector writes, handed to whoever
captures (``crosstalk capture <agent>``, seed 000 §6), without changing delivery.

Rules, and why:

- **Free when nobody listens.** :meth:`Tap.emit` first checks one attribute (are there
  subscribers?) and returns; a tap point costs a call and that check. Nothing is copied,
  parsed or redacted on the delivery path: a frame is handed over as the text or bytes that
  crossed the wire (immutable), and the subscriber's own task redacts and prints it.
- **Never slows delivery.** Each subscriber has a bounded queue (:data:`QUEUE_FRAMES` frames,
  :data:`QUEUE_BYTES` bytes); a frame that does not fit is dropped for that subscriber only,
  counted, and the count is given to it as a frame of its own (:class:`Lost`) once there is
  room again. Emitting never awaits.
- **Bounded.** At most :data:`MAX_CAPTURES` subscribers per agent; one more is
  :class:`CaptureRefused`.
- **Per agent, found per process.** Each agent owns a :class:`Tap`; :data:`TAPS` finds it by
  agent_id or by the agent's uds address, so a harness module that knows only the delivery's
  reply address (the Claude injector) or a thread id (the Codex client) reaches the right one.

Single event loop: every method runs in the loop's thread without awaiting, except
:meth:`Subscription.get`.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

#: Subscribers per agent; one more is refused (a capture is a diagnostic, not a feed).
MAX_CAPTURES: Final = 4
#: How many frames, and how many bytes of frames, one subscriber may have waiting.
QUEUE_FRAMES: Final = 2048
QUEUE_BYTES: Final = 16 << 20
#: What a frame that is not text or bytes is counted as, in bytes.
_OBJECT_SIZE: Final = 1024

#: Where a frame was seen (``source``), as the capture prints it.
UDS: Final = "uds"
A2A: Final = "a2a"
CLAUDE_INBOX: Final = "claude_inbox"
CLAUDE_RECEIPT: Final = "claude_receipt"
CODEX_RPC: Final = "codex_rpc"
#: What the opencode injector sends its host instance and the events it reads back.
OPENCODE_HTTP: Final = "opencode_http"
#: Which way it went, seen from the agent.
IN: Final = "in"
OUT: Final = "out"


class CaptureRefused(Exception):
    """The agent already has :data:`MAX_CAPTURES` captures."""


@dataclass(eq=False)
class Frame:
    """One frame as it crossed the wire, unredacted: it never leaves the process like this.
    Immutable but for :attr:`rendered`, which the first subscriber to print it fills in, so
    that several captures redact and encode a frame once between them."""

    ts: float
    agent: str
    source: str
    direction: str
    #: The text or bytes that crossed the wire, or a value (an A2A request's parts).
    raw: Any
    extra: dict[str, Any] | None = None
    #: The tap's count of frames: a gap a capture sees is frames it lost.
    seq: int = 0
    rendered: bytes | None = None

    @property
    def size(self) -> int:
        return len(self.raw) if isinstance(self.raw, str | bytes) else _OBJECT_SIZE


@dataclass(frozen=True)
class Lost:
    """``count`` frames this subscriber did not get: its queue was full."""

    count: int


@dataclass
class Subscription:
    """One capture's queue. :meth:`get` waits for what came; :attr:`ended` once the tap is
    gone (the agent stops)."""

    max_frames: int = QUEUE_FRAMES
    max_bytes: int = QUEUE_BYTES
    ended: bool = False
    #: Frames dropped since the last :class:`Lost` was queued.
    lost: int = 0
    #: Frames dropped in all.
    lost_total: int = 0
    _queue: deque[Frame | Lost] = field(default_factory=deque, init=False)
    _bytes: int = field(default=0, init=False)
    _ready: asyncio.Event = field(default_factory=asyncio.Event, init=False)

    def offer(self, frame: Frame) -> None:
        size = frame.size
        if len(self._queue) >= self.max_frames or self._bytes + size > self.max_bytes:
            self.lost += 1
            self.lost_total += 1
            return
        if self.lost:
            self._queue.append(Lost(self.lost))
            self.lost = 0
        self._queue.append(frame)
        self._bytes += size
        self._ready.set()

    def end(self) -> None:
        self.ended = True
        self._ready.set()

    async def get(self) -> list[Frame | Lost]:
        """Everything waiting (at least one item), oldest first; ``[]`` once ended and empty."""
        while not self._queue:
            if self.ended:
                return [Lost(self.lost)] if self.lost else []
            if self.lost:  # dropped while empty (one frame larger than the byte bound)
                lost, self.lost = self.lost, 0
                return [Lost(lost)]
            self._ready.clear()
            await self._ready.wait()
        items = list(self._queue)
        self._queue.clear()
        self._bytes = 0
        return items


class Tap:
    """One agent's tap. ``emit`` from any tap point; ``subscribe`` from a capture."""

    def __init__(self, agent_id: str, *, max_captures: int = MAX_CAPTURES,
                 clock: Any = time.time) -> None:
        self.agent_id = agent_id
        self.max_captures = max_captures
        self.clock = clock
        #: The agent's own secret values (its uds key, its bearer credential): redacted
        #: wherever they appear (:mod:`crosstalk.capture.redact`).
        self.secrets: set[str] = set()
        self.subscribers: list[Subscription] = []
        self.seq = 0
        #: The process's :class:`Taps` once registered (it counts who captures).
        self.taps: Taps | None = None

    def emit(self, source: str, direction: str, raw: Any, **extra: Any) -> None:
        """Hand one frame to every subscriber; nothing at all when there is none."""
        if not self.subscribers:
            return
        self.seq += 1
        frame = Frame(self.clock(), self.agent_id, source, direction, raw, extra or None,
                      self.seq)
        for sub in self.subscribers:
            sub.offer(frame)

    def subscribe(self, max_frames: int = QUEUE_FRAMES,
                  max_bytes: int = QUEUE_BYTES) -> Subscription:
        if len(self.subscribers) >= self.max_captures:
            raise CaptureRefused(f"agent {self.agent_id} already has {self.max_captures} "
                                 "captures")
        sub = Subscription(max_frames, max_bytes)
        self.subscribers.append(sub)
        if self.taps is not None:
            self.taps.capturing += 1
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        if sub in self.subscribers:
            self.subscribers.remove(sub)
            if self.taps is not None:
                self.taps.capturing -= 1
        sub.end()

    def end_all(self) -> None:
        """End every capture (the agent is stopping): each sees :attr:`Subscription.ended`."""
        for sub in list(self.subscribers):
            self.unsubscribe(sub)


class Taps:
    """This process's taps, by agent_id and by each agent's other keys (its uds address)."""

    def __init__(self) -> None:
        self._by_key: dict[str, Tap] = {}
        #: Captures running in this process: a tap point that must work out which agent a
        #: frame concerns (a hash, a lookup) checks this first.
        self.capturing = 0
        #: What :meth:`tap_for` gives for a key no agent has: never subscribed, so free.
        self.idle = Tap("")

    def register(self, tap: Tap, keys: Iterable[str] = ()) -> None:
        tap.taps = self
        self.capturing += len(tap.subscribers)
        for key in (tap.agent_id, *keys):
            self._by_key[key] = tap

    def unregister(self, tap: Tap) -> None:
        for key in [k for k, t in self._by_key.items() if t is tap]:
            del self._by_key[key]
        if tap.taps is self:
            self.capturing -= len(tap.subscribers)
            tap.taps = None

    def get(self, key: str | None) -> Tap | None:
        return self._by_key.get(key) if key is not None else None

    def tap_for(self, key: str | None) -> Tap:
        """The tap ``key`` names (agent_id or uds address), else :attr:`idle`."""
        return self._by_key.get(key, self.idle) if key is not None else self.idle

    def emit(self, key: str | None, source: str, direction: str, raw: Any,
             **extra: Any) -> None:
        """:meth:`Tap.emit` on the tap ``key`` names (agent_id or uds address), if any."""
        if not self.capturing:
            return
        tap = self._by_key.get(key) if key is not None else None
        if tap is not None and tap.subscribers:
            tap.emit(source, direction, raw, **extra)


#: One per process: harness code that knows an agent only by an address or id finds it here.
TAPS = Taps()
