"""Claude Code's uds wire, inbound: NDJSON lines and the frames this ingress accepts (pure
decoding; the socket server is :mod:`crosstalk.ingress.uds`).

Wire format, as Claude Code 2.1.328 speaks it (``research/claude-code.md`` §5-§6): UTF-8
NDJSON on a stream socket, one JSON object per ``\\n``-terminated line, blank lines skipped, a
final fragment without ``\\n`` parsed at EOF, a line over 1,048,576 characters or 30 s without
a complete line closes the connection, and connect-and-close probes are normal (Claude's
ListAgents makes two before it sends). Our ingress keeps Claude's limits except one: a
connection's first line must come within :data:`FIRST_LINE_TIMEOUT`.

A frame carrying our metadata (``"crosstalk": {"message_id": <uuid>}``) is an identified
message the receiver dedupes; any other frame is native and gets a fresh id. A uds frame is
``inform``: a frame that asks for another kind (``crosstalk.kind``, a top-level ``kind``, or a
``kind`` attribute on the envelope) is handed to the receiver *with* that kind so its policy
rejects and journals it; a kind outside the protocol is refused by the ingress.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from crosstalk.core.envelope import parse_claude
from crosstalk.core.ids import new_message_id
from crosstalk.core.message import Kind, Message, Sender

#: Claude Code's inbox limit: a buffered line longer than this many characters kills the
#: connection (``Line exceeded 1048576 chars``).
MAX_LINE = 1_048_576
#: Claude Code closes a connection that sends no complete line within 30 s.
IDLE_TIMEOUT = 30.0
#: Our ingress wants a connection's first line sooner: every sender it serves (Claude's
#: SendMessage, ``crosstalk send``) writes its whole frame right after connect, so a connection
#: still silent after a few seconds is a stuck client or an attacker holding a place.
FIRST_LINE_TIMEOUT = 3.0
_UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_ASSERTED_FIELDS = ("msg_id", "from", "priority", "session_id")
_MAX_ASSERTED_CHARS = 300


class BadFrame(ValueError):
    """A line that is not a frame this ingress accepts (bad JSON, wrong types, bad metadata)."""


class Close(Exception):
    """Close the connection now, writing nothing (oversize line, idle timeout)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class UserFrame:
    """A decoded ``type:"user"`` line. Nothing in it is identity."""

    text: str
    #: Our metadata's message id (an identified message), or ``None`` for a native frame.
    message_id: str | None
    #: The kind the frame asks for; ``None`` when it names a kind outside the protocol.
    kind: Kind | None
    asserted: dict[str, str]


def parse_line(line: str) -> dict[str, Any]:
    """One NDJSON line as a JSON object, or :class:`BadFrame`."""
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise BadFrame(f"not JSON: {type(exc).__name__}") from None
    if not isinstance(obj, dict):
        raise BadFrame("not a JSON object")
    return obj


def _asserted_value(value: object) -> str | None:
    return value[:_MAX_ASSERTED_CHARS] if isinstance(value, str) else None


def _requested_kind(values: list[object]) -> Kind | None:
    """The kind a frame asks for: any non-inform request wins; a value outside the protocol
    (not one of our kinds) is ``None``; no request at all is inform."""
    unknown = False
    for value in values:
        if value is None:
            continue
        try:
            kind = Kind(value) if isinstance(value, str) else None
        except ValueError:
            kind = None
        if kind is None:
            unknown = True
        elif kind is not Kind.INFORM:
            return kind
    return None if unknown else Kind.INFORM


def user_frame(obj: Mapping[str, Any]) -> UserFrame:
    """Decode a ``type:"user"`` object (seed §5 normalisation), or raise :class:`BadFrame`."""
    message = obj.get("message")
    if not isinstance(message, dict):
        raise BadFrame("message is not an object")
    content = message.get("content")
    if not isinstance(content, str) or not content:
        raise BadFrame("message.content is not a non-empty string")
    meta = obj.get("crosstalk")
    if meta is not None and not isinstance(meta, dict):
        raise BadFrame("crosstalk metadata is not an object")
    message_id: str | None = None
    meta_kind: object = None
    if meta is not None:
        mid = meta.get("message_id")
        if mid is not None:
            if not isinstance(mid, str) or not _UUID_RE.fullmatch(mid.lower()):
                raise BadFrame("crosstalk.message_id is not a uuid")
            message_id = mid.lower()
        meta_kind = meta.get("kind")
    asserted = {k: v for k in _ASSERTED_FIELDS if (v := _asserted_value(obj.get(k))) is not None}
    text = content
    envelope_kind: str | None = None
    envelope = parse_claude(content)
    if envelope is not None:
        # The body is the message; every attribute is an untrusted assertion (display only),
        # and a nested envelope inside the body stays body text (parse_claude parses the
        # outermost only).
        text = envelope.body
        for name, value in (*envelope.attrs.items(), *envelope.foreign.items()):
            asserted[f"envelope.{name}"] = value[:_MAX_ASSERTED_CHARS]
        envelope_kind = envelope.foreign.get("kind")
    kind = _requested_kind([meta_kind, obj.get("kind"), envelope_kind])
    return UserFrame(text=text, message_id=message_id, kind=kind, asserted=asserted)


def message_of(frame: UserFrame, sender: Sender) -> Message:
    """The message a decoded frame carries, as ``sender`` (identity is the caller's)."""
    assert frame.kind is not None
    return Message(
        message_id=frame.message_id or new_message_id(), sender=sender, text=frame.text,
        kind=frame.kind, native=frame.message_id is None, asserted=frame.asserted,
    )


def ack_line(message_id: str | None, state: str, reason: str | None) -> bytes:
    ack = {"type": "ack", "message_id": message_id, "state": state, "reason": reason}
    return json.dumps(ack, separators=(",", ":")).encode() + b"\n"


@dataclass
class Lines:
    """Reads NDJSON lines with Claude's limits: ``max_line`` characters, and a complete
    (non-blank) line within ``idle_timeout`` or the connection is closed. The first line has
    its own, shorter bound when ``first_line_timeout`` is given (counted from when the reader
    was made, i.e. from accept)."""

    reader: asyncio.StreamReader
    max_line: int
    idle_timeout: float
    first_line_timeout: float | None = None
    #: Sees every line read, as it came (``crosstalk capture``'s tap).
    heard: Callable[[str], None] | None = None
    eof: bool = field(default=False, init=False)
    _started: bool = field(default=False, init=False)

    async def next(self) -> str | None:
        """The next non-blank line, ``None`` at EOF; raises :class:`Close` or :class:`BadFrame`."""
        first = not self._started and self.first_line_timeout is not None
        self._started = True
        bound = self.first_line_timeout if first else self.idle_timeout
        try:
            async with asyncio.timeout(bound):
                while not self.eof:
                    line = await self._read()
                    if line is not None and line.strip():
                        if self.heard is not None:
                            self.heard(line)
                        return line
        except TimeoutError:
            raise Close("first_line_timeout" if first else "idle_timeout") from None
        return None

    async def _read(self) -> str | None:
        try:
            raw = await self.reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:
            self.eof = True
            raw = exc.partial  # a final fragment without "\n" is parsed at EOF (Claude does)
        except asyncio.LimitOverrunError:
            raise Close("line_too_long") from None
        if not raw:
            return None
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise BadFrame("not UTF-8") from None
        if len(line.rstrip("\n")) > self.max_line:
            raise Close("line_too_long")
        return line
