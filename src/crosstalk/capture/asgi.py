"""The A2A tap: each HTTP request an agent's A2A listener serves, and its answer.

An ASGI middleware outside every other (so it sees the request as the client sent it, bearer
header and all, and the answer as the client gets it, the guard's 401s too). When nobody
captures it passes the request straight on after one check. When someone does, it watches
``receive`` and ``send`` without holding anything back: the request frame (method, path,
headers, body) is handed to the tap as soon as its body is complete, the answer (status,
headers, body) once its last body chunk has gone to the server. At most :data:`MAX_BODY`
bytes of either body are kept (the A2A body cap is 256 KiB; an oversize request is drained
up to 64 times that, which the capture need not hold).
"""

from __future__ import annotations

from typing import Any, Final

from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.types import Message as AsgiMessage

from crosstalk.capture.tap import A2A, IN, OUT, Tap

MAX_BODY: Final = 512 * 1024


class CaptureMiddleware:
    """Hands each request and answer to ``tap`` (:mod:`crosstalk.capture.tap`)."""

    def __init__(self, app: ASGIApp, *, tap: Tap) -> None:
        self.app = app
        self.tap = tap

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.tap.subscribers:
            await self.app(scope, receive, send)
            return
        request = _Body()
        answer = _Body()
        status: list[int] = []
        headers: list[Any] = []

        async def watched_receive() -> AsgiMessage:
            message = await receive()
            if message["type"] == "http.request" and not request.done:
                request.add(message.get("body", b""))
                if not message.get("more_body", False):
                    request.done = True
                    self.tap.emit(A2A, IN, _request(scope, request))
            return message

        async def watched_send(message: AsgiMessage) -> None:
            await send(message)
            if message["type"] == "http.response.start":
                status.append(int(message.get("status", 0)))
                headers.extend(message.get("headers", []))
            elif message["type"] == "http.response.body" and not answer.done:
                answer.add(message.get("body", b""))
                if not message.get("more_body", False):
                    answer.done = True
                    self.tap.emit(A2A, OUT, {"status": status[0] if status else None,
                                             "headers": _headers(headers),
                                             "body": answer.text()})

        await self.app(scope, watched_receive, watched_send)


class _Body:
    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.size = 0
        self.truncated = False
        self.done = False

    def add(self, chunk: bytes) -> None:
        room = MAX_BODY - self.size
        if len(chunk) > room:
            chunk, self.truncated = chunk[:max(room, 0)], True
        if chunk:
            self.chunks.append(chunk)
            self.size += len(chunk)

    def text(self) -> Any:
        """The body as bytes: the capture's own task decodes (and parses JSON) later, off
        the request's path (:meth:`crosstalk.capture.redact.Redactor.value`)."""
        body = b"".join(self.chunks)
        return {"bytes": body, "truncated": True} if self.truncated else body


def _headers(raw: list[Any]) -> dict[str, str]:
    """Headers by name (repeated ones joined), so the redactor finds ``authorization``."""
    out: dict[str, str] = {}
    for name, value in raw:
        key = bytes(name).decode("latin-1").lower()
        text = bytes(value).decode("latin-1")
        out[key] = f"{out[key]}, {text}" if key in out else text
    return out


def _request(scope: Scope, body: _Body) -> dict[str, Any]:
    query = scope.get("query_string", b"")
    return {"method": scope.get("method"), "path": scope.get("path"),
            "query": query.decode("latin-1") if query else None,
            "headers": _headers(list(scope.get("headers", []))), "body": body.text()}
