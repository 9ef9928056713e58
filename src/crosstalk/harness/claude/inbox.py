"""Writing into a Claude Code session's inbox socket (research ``claude-code.md`` §3-§6).

The inbox is Claude's own cross-session socket (``messagingSocketPath``). A sender connects,
optionally writes an auth line with the target's ``peerToken``, writes one ``type:"user"``
frame, half-closes and reads to EOF: the inbox never writes a byte back and closes its side
once it has read the frame. What that proves, and the state it maps to (seed §8):

* connect refused / no socket / first write fails → ``unreachable`` (nothing was sent);
* frame written, then EOF with no bytes back → ``accepted`` (the inbox read the whole frame;
  Claude may still drop or hold it, which it reports later by a receipt to our ``from``);
* anything else after writing (bytes back, reset, no EOF in time) → ``unknown``, never resent.

``session_id`` in the frame makes Claude drop a frame meant for a session that ``/clear``
replaced (same pid, same socket), instead of handing it to the new conversation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from dataclasses import dataclass
from typing import Any, Final

from crosstalk.core.states import MessageState

#: Claude destroys a connection whose buffered line exceeds this many characters.
MAX_LINE_CHARS: Final = 1_048_576
#: How long we wait for the inbox to close after our half-close (Claude's sender waits 5 s).
EOF_TIMEOUT: Final = 5.0
CONNECT_TIMEOUT: Final = 2.0
#: Largest line either side of the gate helper's socketpair carries (ADR 0020).
LINK_LIMIT: Final = 16 << 20


@dataclass(frozen=True)
class InboxResult:
    state: MessageState
    reason: str | None
    evidence: str | None = None


def msg_id_for(message_id: str) -> str:
    """Claude keeps ``msg_id`` only if it is a uuid; ours (uuidv7) are. Others get a fresh one."""
    try:
        return str(uuid.UUID(message_id))
    except ValueError:
        return str(uuid.uuid4())


def user_frame(content: str, *, msg_id: str, from_address: str | None, priority: str,
               session_id: str | None) -> dict[str, Any]:
    frame: dict[str, Any] = {"msgV": 1, "msg_id": msg_id, "type": "user",
                             "message": {"role": "user", "content": content},
                             "priority": priority}
    if from_address:
        frame["from"] = f"uds:{from_address}"
    if session_id:
        frame["session_id"] = session_id
    return frame


def encode(frame: dict[str, Any], token: str | None) -> bytes:
    """The bytes on the wire: optional auth line, then the frame; ``ValueError`` if too big."""
    body = json.dumps(frame, ensure_ascii=False, separators=(",", ":"))
    auth = json.dumps({"type": "auth", "token": token}) if token else None
    size = len(body) + 1 + (len(auth) + 1 if auth else 0)
    if size > MAX_LINE_CHARS:
        raise ValueError(f"frame of {size} characters exceeds Claude's {MAX_LINE_CHARS}")
    return ((auth + "\n") if auth else "").encode() + body.encode() + b"\n"


async def deliver(socket_path: str, frame: dict[str, Any], *, token: str | None = None,
                  eof_timeout: float = EOF_TIMEOUT) -> InboxResult:
    """Write one frame into the inbox at ``socket_path`` and report what the socket proved."""
    try:
        payload = encode(frame, token)
    except ValueError:
        return InboxResult(MessageState.UNREACHABLE, "frame_too_large")
    return await write_bytes(socket_path, payload, eof_timeout=eof_timeout)


async def write_bytes(socket_path: str, payload: bytes, *,
                      eof_timeout: float = EOF_TIMEOUT) -> InboxResult:
    """Write ``payload`` (auth line and frame, :func:`encode`) into the inbox and report what
    the socket proved. The inbound gate's helper process runs this too (ADR 0020): whichever
    process calls it is the frame's writer as Claude sees it."""
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_unix_connection(socket_path), CONNECT_TIMEOUT)
    except FileNotFoundError:
        return InboxResult(MessageState.UNREACHABLE, "inbox_missing")
    except (ConnectionRefusedError, TimeoutError):
        return InboxResult(MessageState.UNREACHABLE, "inbox_not_listening")
    except OSError as exc:
        return InboxResult(MessageState.UNREACHABLE, f"connect_failed:{exc.errno}")
    try:
        try:
            writer.write(payload)
            await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        except OSError:
            # Part of the frame may have reached the inbox: not a definite refusal.
            return InboxResult(MessageState.UNKNOWN, "write_failed")
        try:
            back = await asyncio.wait_for(reader.read(1), eof_timeout)
        except TimeoutError:
            return InboxResult(MessageState.UNKNOWN, "inbox_did_not_close")
        except OSError:
            return InboxResult(MessageState.UNKNOWN, "reset_after_write")
        if back:
            return InboxResult(MessageState.UNKNOWN, "inbox_wrote_back")
        return InboxResult(MessageState.ACCEPTED, None, "inbox read the frame and closed")
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
