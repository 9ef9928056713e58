"""The shim's stdin, as the MCP SDK's stdio transport reads it: every request line answered.

The SDK's reader parses each line with pydantic-core and, when that fails, hands the server an
exception that nothing answers: the harness waits for a reply that never comes. Three kinds of
line did that:

- a lone surrogate escape in a string (``"\\ud83d"``, a truncated emoji; ``JSON.stringify``
  writes one for a JavaScript string that holds it). Python's ``json`` reads it, pydantic-core
  does not. The line is **repaired** by the project's one rule (``core.message.valid_unicode``:
  U+FFFD, a valid pair its character) and passed on, so the call is served like any other;
- a line that is not JSON (or nested too deeply to read): answered ``-32700`` with id null,
  as JSON-RPC 2.0 says;
- JSON that is not a JSON-RPC message: answered ``-32600``, with the request's id when it has
  one, so the caller's pending request ends.

Each costs one log line, never the line's content (a tool argument may be private). A line the
SDK accepts is passed on untouched; the check is the SDK's own parse, so nothing it would serve
is turned away here.

Passing our own stdin skips the SDK's claim of fd 0, so :func:`claimed_stdin` does that part
itself: fd 0 points at the null device while serving (a child or a stray read sees EOF, not the
harness's requests) and the wire is read from a private duplicate.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import logging
import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import mcp_types as types
from anyio.abc import ObjectSendStream
from mcp.shared.message import SessionMessage

from crosstalk.core.message import valid_unicode_json

log = logging.getLogger(__name__)


def _error(request_id: int | str | None, code: int, message: str) -> SessionMessage:
    return SessionMessage(types.JSONRPCError(
        jsonrpc="2.0", id=request_id, error=types.ErrorData(code=code, message=message)))


def _request_id(value: Any) -> int | str | None:
    if isinstance(value, dict):
        rid = value.get("id")
        if isinstance(rid, str) or (isinstance(rid, int) and not isinstance(rid, bool)):
            return rid
    return None


def vet(line: str) -> str | SessionMessage | None:
    """What to do with one request line: pass it (possibly repaired), answer it, or skip it.

    Returns the line for the SDK, an error answer for the caller, or ``None`` for a blank line
    (a separator, not a message).
    """
    if not line.strip():
        return None
    try:
        types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValueError:
        pass
    else:
        return line
    try:
        parsed = json.loads(line)
    except (ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else "not valid JSON"
        log.warning("answered a request line (%d bytes) that is %s", len(line), reason)
        return _error(None, types.PARSE_ERROR, f"Parse error: the line is {reason}")
    try:
        fixed = valid_unicode_json(parsed)
    except RecursionError:  # json read it, but the walk sits deeper in the stack
        log.warning("answered a request line (%d bytes) that is nested too deeply", len(line))
        return _error(None, types.PARSE_ERROR, "Parse error: the line is nested too deeply")
    if fixed != parsed:
        text = json.dumps(fixed, ensure_ascii=False)
        try:
            types.jsonrpc_message_adapter.validate_json(text, by_name=False)
        except ValueError:
            pass
        else:
            log.warning("repaired text that is not valid Unicode in a request line (lone "
                        "surrogates became U+FFFD)")
            return text
    log.warning("answered a request line that is JSON but not a JSON-RPC message")
    return _error(_request_id(fixed), types.INVALID_REQUEST,
                  "Invalid Request: not a JSON-RPC 2.0 message this server accepts")


class RequestLines:
    """An async iterator of the lines the SDK may parse; the others are answered here.

    The SDK's transport iterates it in place of stdin. Answers go to the transport's write
    stream, which exists only once the transport is running: :meth:`answer_to` hands it over,
    and a bad line that arrives first waits for it.
    """

    def __init__(self, source: AsyncIterator[str]) -> None:
        self._source = source
        self._answers: ObjectSendStream[SessionMessage] | None = None
        self._ready = anyio.Event()

    def answer_to(self, stream: ObjectSendStream[SessionMessage]) -> None:
        self._answers = stream
        self._ready.set()

    def __aiter__(self) -> RequestLines:
        return self

    async def __anext__(self) -> str:
        while True:
            line = await self._source.__anext__()
            verdict = vet(line)
            if verdict is None:
                continue
            if isinstance(verdict, str):
                return verdict
            await self._ready.wait()
            assert self._answers is not None
            await self._answers.send(verdict)


@contextlib.contextmanager
def claimed_stdin() -> Iterator[AsyncIterator[str]]:
    """The wire's lines from a private duplicate of fd 0, with fd 0 on the null device.

    The duplicate is never closed: the reader thread may still block on it after the
    transport exits, and a recycled descriptor would be read under it (the SDK does the same).
    """
    wire = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
    finally:
        os.close(null)
    text = io.TextIOWrapper(os.fdopen(wire, "rb", closefd=False), encoding="utf-8",
                            errors="replace")
    try:
        yield anyio.wrap_file(text).__aiter__()
    finally:
        with contextlib.suppress(OSError):
            os.dup2(wire, 0)
