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

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
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


class LineBuffer:
    """Claude's NDJSON lines out of the bytes a connection delivers, with its limits: a line
    over ``max_line`` characters closes the connection, blank lines are skipped, a final
    fragment without ``\\n`` is a line at EOF (Claude parses it). Pure: bytes in, lines out;
    the clock (its idle timeout) and the socket are the connection's.

    The bytes buffered without a ``\\n`` are bounded too (4 bytes a character), so a sender
    that never ends its line is cut off as it passes the bound, not when memory runs out."""

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self.max_line = max_line
        self.max_bytes = 4 * max_line + 8
        self.eof = False
        self._buf = bytearray()
        self._start = 0

    def feed(self, data: bytes) -> None:
        """Bytes as they arrived; raises :class:`Close` once an unended line is over the bound."""
        self._buf += data
        if len(self._buf) - self._start > self.max_bytes and (
                self._buf.find(b"\n", self._start) < 0):
            raise Close("line_too_long")

    def end(self) -> None:
        """The peer has sent all it will (EOF)."""
        self.eof = True

    def rest(self) -> bytes:
        """What arrived after the last line :meth:`next` returned (for whoever reads on)."""
        return bytes(self._buf[self._start:])

    def next(self) -> str | None:
        """The next non-blank line, ``None`` until one is whole (or, at EOF, none is left).

        Raises :class:`Close` (a line over the limit) or :class:`BadFrame` (not UTF-8)."""
        while True:
            end = self._buf.find(b"\n", self._start)
            if end >= 0:
                raw = bytes(self._buf[self._start:end + 1])
                self._start = end + 1
                if self._start > 65536 and self._start * 2 > len(self._buf):
                    del self._buf[:self._start]
                    self._start = 0
            elif self.eof and self._start < len(self._buf):
                raw = bytes(self._buf[self._start:])
                self._start = len(self._buf)
            else:
                return None
            if len(raw) > self.max_bytes:
                raise Close("line_too_long")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise BadFrame("not UTF-8") from None
            if len(line.rstrip("\n")) > self.max_line:
                raise Close("line_too_long")
            if line.strip():
                return line
