"""A capture on the wire: the JSON lines one capture connection receives, and serving them.

A ``crosstalk capture`` client authenticates on the agent's uds ingress as ``crosstalk send``
does, then writes ``{"type":"capture"}`` and keeps its side open. The ingress hands the
connection to :func:`serve`, which answers one line, then streams until the client closes or
the agent stops:

- ``{"type":"capture_started","agent":<agent_id>,"max_captures":4}``, then one line per frame:
  ``{"ts","seq","agent","source","direction","frame",...}`` (``frame`` the frame as JSON, or
  its text; an NDJSON payload of several lines is one line each, with the same ``seq``);
- ``{"ts","agent","source":"capture","event":"dropped","dropped":N}`` where this capture
  lost ``N`` frames because it read too slowly (``seq`` counts the agent's frames, so the
  gap says where);
- or, instead of ``capture_started``, the ingress's usual ack line ``{"type":"ack",
  "state":"rejected","reason":"too_many_captures"}`` and the connection closes.

Everything printed has been redacted (:mod:`crosstalk.capture.redact`) here, in the agent,
before it is written: the capture client redacts again, with every secret it can read.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
from collections.abc import Iterator
from typing import Any, Final

from crosstalk.capture.redact import Redactor
from crosstalk.capture.tap import CaptureRefused, Frame, Lost, Subscription, Tap

#: The control frame that asks for a capture (after the auth line).
CAPTURE_TYPE: Final = "capture"
STARTED_TYPE: Final = "capture_started"
REFUSED_REASON: Final = "too_many_captures"
#: A write the client does not take within this long ends the capture (it is gone or stuck;
#: frames meanwhile are dropped and counted, never waited for).
WRITE_TIMEOUT: Final = 30.0
#: A capture wakes at most this often: what came meanwhile is written in one go, so a
#: message's several frames cost the agent's loop one wake-up per capture, not one each.
FLUSH_INTERVAL: Final = 0.02


def iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="microseconds")


def lines(item: Frame | Lost, agent: str, redactor: Redactor,
          now: float) -> Iterator[dict[str, Any]]:
    """What one queued item prints as, redacted."""
    if isinstance(item, Lost):
        yield {"ts": iso(now), "agent": agent, "source": "capture", "event": "dropped",
               "dropped": item.count}
        return
    for frame in redactor.frames(item.raw):
        line: dict[str, Any] = {"ts": iso(item.ts), "seq": item.seq, "agent": item.agent,
                                "source": item.source, "direction": item.direction,
                                "frame": frame}
        if item.extra:
            line.update(redactor.value({k: v for k, v in item.extra.items()
                                        if k not in line}))
        yield line


def encode(line: dict[str, Any]) -> bytes:
    return json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def render(item: Frame | Lost, agent: str, redactor: Redactor, now: float) -> bytes:
    """The bytes one queued item prints as; a frame's are made once for every capture."""
    if isinstance(item, Lost):
        return b"".join(encode(line) for line in lines(item, agent, redactor, now))
    if item.rendered is None:
        item.rendered = b"".join(encode(line) for line in lines(item, agent, redactor, now))
    return item.rendered


async def serve(tap: Tap, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                refused: bytes) -> None:
    """Stream ``tap``'s frames on this connection until the client closes or the tap ends;
    ``refused`` is written instead when the agent has all the captures it takes."""
    try:
        sub = tap.subscribe()
    except CaptureRefused:
        writer.write(refused)
        with contextlib.suppress(OSError, TimeoutError):
            async with asyncio.timeout(WRITE_TIMEOUT):
                await writer.drain()
        return
    gone = asyncio.ensure_future(reader.read(1))  # the client writes nothing more: EOF = gone
    try:
        writer.write(encode({"type": STARTED_TYPE, "agent": tap.agent_id,
                             "max_captures": tap.max_captures}))
        await _pump(tap, sub, writer, gone)
    finally:
        tap.unsubscribe(sub)
        gone.cancel()
        with contextlib.suppress(BaseException):
            await gone


async def _pump(tap: Tap, sub: Subscription, writer: asyncio.StreamWriter,
                gone: asyncio.Future[bytes]) -> None:
    while True:
        got = asyncio.ensure_future(sub.get())
        either: set[asyncio.Future[Any]] = {got, gone}
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if not got.done():
            got.cancel()
            return  # the client closed
        items = got.result()
        if not items:
            return  # the agent stops
        # The secrets are read now: the credential is issued after the ingress starts.
        redactor = Redactor(tap.secrets)
        now = tap.clock()
        writer.write(b"".join(render(item, tap.agent_id, redactor, now) for item in items))
        try:
            async with asyncio.timeout(WRITE_TIMEOUT):
                await writer.drain()
        except (OSError, TimeoutError):
            return
        await asyncio.sleep(FLUSH_INTERVAL)
