"""Refuses a request meant for another agent, before its body is read.

A sender keeps a peer's Agent Card between sends (:mod:`crosstalk.a2a.peers`); if that peer
stopped and another agent took its port, the kept card is wrong, and the request would reach
the newcomer, which accepts any registered sender's bearer. The sender names the agent its
card described (``X-CrossTalk-To``); a listener whose card names someone else answers
421 Misdirected Request, which tells the sender to fetch the card again. A request without
the header (another A2A client) is served as before.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import unquote

from starlette.types import ASGIApp, Receive, Scope, Send

_HEADER = b"x-crosstalk-to"
_BODY = b'{"error":"misdirected: this listener serves another agent"}'


class AddressedTo:
    """ASGI middleware: 421 for a request whose ``X-CrossTalk-To`` is not ``name()``."""

    def __init__(self, app: ASGIApp, *, name: Callable[[], str]) -> None:
        self.app, self.name = app, name

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            wanted = [v for k, v in scope["headers"] if k == _HEADER]
            if wanted and (len(wanted) != 1
                           or unquote(wanted[0].decode("latin-1")) != self.name()):
                await send({"type": "http.response.start", "status": 421,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(_BODY)).encode()),
                                        (b"connection", b"close")]})
                await send({"type": "http.response.body", "body": _BODY})
                return
        await self.app(scope, receive, send)
