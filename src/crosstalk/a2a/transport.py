"""The HTTP transport a shim sends to its peers with: pooled, and honest about what came back.

Two rules keep a reused keep-alive connection from failing a send (issue 12 measured 0.24% of
sends under load and 6% at a 5 s cadence, all reported ``unreachable``):

- **The client gives up an idle connection first.** The peer's listener (uvicorn) closes a
  connection idle for its keep-alive timeout, 5 s; a pool that keeps it as long reuses it just
  as the server closes it. :data:`KEEPALIVE_EXPIRY` is well below that, so a pooled connection
  is dropped by the client while the server still holds it open.
- **A failure before any response byte is told apart** (:class:`NoResponseError`), so the
  client (:mod:`crosstalk.a2a.client`) can repeat that one request once on a fresh connection.
  The line is the response's headers: a request whose headers never came back was, at most,
  processed and not answered (a SendMessage is then answered from the receiver's dedupe
  record); once they came, whatever follows is a partial answer and is never repeated.
"""

from __future__ import annotations

import functools
import logging
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import httpx

from crosstalk.a2a.pool import SlotPool

#: Seconds a pooled connection may sit idle before the client closes it instead of reusing it:
#: clearly below the A2A listener's keep-alive timeout (uvicorn's ``timeout_keep_alive``,
#: 5 s), so the client, never the server, ends an idle connection.
KEEPALIVE_EXPIRY = 2.0
#: What httpx's pool allows by default: connections, and idle ones kept, per client.
_MAX_CONNECTIONS = 100
_MAX_KEEPALIVE_CONNECTIONS = 20
CONNECT_TIMEOUT = 5.0

#: The least time a repeat on a fresh connection gets, even if the first try used the budget.
_RETRY_BUDGET = 5.0

log = logging.getLogger(__name__)
R = TypeVar("R")

_NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
#: How httpcore says the server closed the connection while no response had begun (h11 was
#: still waiting for the status line).
_DISCONNECTED = "Server disconnected without sending a response"


class NoResponseError(httpx.TransportError):
    """The connection failed before the response's headers arrived: connect succeeded, the
    request may have been written, and no answer to it came back."""


class _NoticesNoResponse(httpx.AsyncBaseTransport):
    """Re-raises a failure of ``inner`` that came before any response as :class:`NoResponseError`.

    ``handle_async_request`` returns once the response's headers are in; a body cut short
    fails later, while the body is read, and is left as it is.
    """

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return await self._inner.handle_async_request(request)
        except (httpx.ReadError, httpx.WriteError) as exc:
            raise NoResponseError(f"{type(exc).__name__} before the response: {exc}",
                                  request=request) from exc
        except httpx.RemoteProtocolError as exc:
            if not str(exc).startswith(_DISCONNECTED):
                raise  # a malformed response: bytes came back
            raise NoResponseError(str(exc), request=request) from exc

    async def aclose(self) -> None:
        await self._inner.aclose()


def unanswered(exc: BaseException) -> bool:
    """Whether a failed call got no byte of its response: the connect failed, or the connection
    broke before the response began (:class:`NoResponseError`)."""
    return isinstance(httpx_cause(exc), NoResponseError | httpx.ConnectError)


def never_sent(exc: BaseException) -> bool:
    """Whether the request of a failed call certainly never reached the peer (connect failed)."""
    return isinstance(httpx_cause(exc), httpx.ConnectError)


def httpx_cause(exc: BaseException) -> BaseException | None:
    """The httpx error behind ``exc``: the a2a-sdk's errors carry it as their cause."""
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, httpx.HTTPError):
        cause = cause.__cause__
    return cause


@dataclass(frozen=True)
class Attempt(Generic[R]):
    """One try of a call: its result, and if no answer came, why (``failure``) and whether the
    request itself, past the card, may have left (``sent``)."""

    result: R
    failure: BaseException | None = None
    sent: bool = False


async def at_most_twice(url: str,
                         attempt: Callable[[httpx.AsyncClient | None, float],
                                           Awaitable[Attempt[R]]], *,
                         httpx_client: httpx.AsyncClient | None, timeout: float,
                         repeatable: bool) -> tuple[Attempt[R], bool]:
    """``attempt`` on the caller's pooled client, and once more on a fresh connection if it got
    no byte of its response (a pooled connection the server closed as it was reused) and a
    repeat is safe: always before the request itself left (only the card was fetched); after,
    only if ``repeatable``. Returns the last attempt and whether an earlier one may have
    reached the peer."""
    started = time.monotonic()
    first = await attempt(httpx_client, timeout)
    failure = first.failure
    if failure is None or not unanswered(failure):
        return first, False
    maybe_arrived = first.sent and not never_sent(failure)
    if maybe_arrived and not repeatable:
        return first, False
    log.info("A2A request to %s got no response (%s); repeating it on a fresh connection",
             url, httpx_cause(failure))
    second = await attempt(None, max(_RETRY_BUDGET, timeout - (time.monotonic() - started)))
    return second, maybe_arrived


@functools.cache
def _tls_context() -> ssl.SSLContext:
    # Building a default context loads the CA bundle (~30 ms); do it once per process.
    return ssl.create_default_context()


def new_transport() -> httpx.AsyncBaseTransport:
    """An HTTP transport for peers: a pool whose cost per request is flat
    (:mod:`crosstalk.a2a.pool`), Nagle off (a POST goes out as headers then body, and with
    Nagle the body waits ~40 ms for the server's delayed ACK on loopback, measured), the TLS
    context built once, idle connections dropped before the server drops them, and failures
    before any response told apart."""
    return _NoticesNoResponse(SlotPool(_one_connection, max_connections=_MAX_CONNECTIONS,
                                       max_idle=_MAX_KEEPALIVE_CONNECTIONS))


def _one_connection() -> httpx.AsyncBaseTransport:
    """A slot of :class:`~crosstalk.a2a.pool.SlotPool`: httpx's transport over one connection."""
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1,
                          keepalive_expiry=KEEPALIVE_EXPIRY)
    return httpx.AsyncHTTPTransport(socket_options=_NODELAY, verify=_tls_context(),
                                    limits=limits)


def new_http_client(timeout: float = 30.0) -> httpx.AsyncClient:
    """A client to keep for many sends (connection reuse: ~5 ms a send instead of ~35)."""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(timeout, connect=min(timeout, CONNECT_TIMEOUT)),
        transport=new_transport())
