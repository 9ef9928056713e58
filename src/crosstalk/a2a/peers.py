"""What a sender keeps per peer between sends: its Agent Card and the SDK client built from it.

Fetching the card and building the SDK client on every send cost more than the send itself
(profile in ADR 0029). The card is kept for as long as the peer's ``Cache-Control: max-age``
allows (a CrossTalk listener says 5 s) and then revalidated against its ``ETag`` (a 304 keeps
it); a peer that sends no ``max-age`` is asked every time, as before. A card kept past the
peer's restart is caught on use:

- the request names the agent it is for (:data:`ADDRESSED_TO`); a CrossTalk listener whose
  card names someone else answers 421 before reading the message
  (:class:`crosstalk.a2a.addressed.AddressedTo`), so a port taken over by another agent
  never delivers it;
- an answer that says "not here" (401, 404, 421) to a request made on a kept card drops the
  card, and the request is made once more on a fresh one (:func:`fresh_card_on_stale`);
  those answers come before the message is read, so the repeat cannot deliver it twice.

The token goes only to the JSON-RPC interface a card names, and only if that interface is on
the same origin as the URL we were given: checked on every card, kept or fetched.
"""

from __future__ import annotations

import re
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TypeVar
from urllib.parse import quote, urlsplit

import httpx
from a2a.client import (
    AgentCardResolutionError,
    AuthInterceptor,
    Client,
    ClientCallContext,
    ClientConfig,
    ClientFactory,
    InMemoryContextCredentialStore,
)
from a2a.client.card_resolver import parse_agent_card
from a2a.types import a2a_pb2 as pb
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
from google.protobuf.json_format import ParseError

from crosstalk.a2a.transport import CONNECT_TIMEOUT, Attempt, httpx_cause, new_http_client

#: The header naming the agent a request is for (its card's name, percent-encoded).
ADDRESSED_TO = "X-CrossTalk-To"
#: Answers to a request that say the card we used no longer describes who is at the URL,
#: all given before the message is read: unauthenticated, no such route, misdirected.
STALE_CARD_STATUSES = frozenset({401, 404, 421})
_MAX_PEERS = 256
_MAX_AGE = re.compile(r"(?:^|[,\s])max-age\s*=\s*(\d+)", re.IGNORECASE)
R = TypeVar("R")


class Refused(Exception):
    """A card that rules the request out before it is sent (wrong agent, no such feature)."""

    def __init__(self, state: str, reason: str) -> None:
        super().__init__(reason)
        self.state, self.reason = state, reason


@dataclass
class _Peer:
    card: pb.AgentCard
    etag: str | None
    fresh_until: float
    #: SDK clients built on this card, per pooled HTTP client and sender token.
    clients: weakref.WeakKeyDictionary[httpx.AsyncClient, dict[str, tuple[Client, str]]] = (
        field(default_factory=weakref.WeakKeyDictionary))


class PeerCards:
    """The cards (and SDK clients) one sender keeps, by peer URL: what a caller passes to
    :mod:`crosstalk.a2a.client` with its pooled HTTP client to skip the per-send fetch."""

    def __init__(self) -> None:
        self._peers: dict[str, _Peer] = {}

    def forget(self, url: str) -> None:
        """Drop what is kept for ``url``: its next request fetches the card again."""
        self._peers.pop(url, None)

    def kept(self, url: str) -> bool:
        """Whether a card for ``url`` is kept (fresh or due for revalidation)."""
        return url in self._peers

    async def card(self, http: httpx.AsyncClient, url: str, timeout: float,
                   *, revalidate: bool) -> tuple[_Peer, bool]:
        """The kept card while fresh, else the peer's answer (a 304 keeps the kept one), and
        whether the peer was asked."""
        known = self._peers.get(url)
        if known is not None and not revalidate and known.fresh_until > time.monotonic():
            return known, False
        target = f"{url.rstrip('/')}/{AGENT_CARD_WELL_KNOWN_PATH.lstrip('/')}"
        headers = {"If-None-Match": known.etag} if known is not None and known.etag else {}
        try:
            response = await http.get(target, headers=headers,
                                      timeout=min(timeout, CONNECT_TIMEOUT * 2))
            if known is not None and response.status_code == 304:
                known.fresh_until = _fresh_until(response)
                return known, True
            response.raise_for_status()
            card = parse_agent_card(response.json())
        except httpx.HTTPStatusError as exc:
            self.forget(url)
            raise AgentCardResolutionError(
                f"agent card from {target}: HTTP {exc.response.status_code}",
                status_code=exc.response.status_code) from exc
        except (ValueError, httpx.RequestError, ParseError) as exc:  # JSONDecodeError too
            self.forget(url)
            raise AgentCardResolutionError(f"agent card from {target}: {exc}") from exc
        peer = _Peer(card, response.headers.get("etag"), _fresh_until(response))
        if len(self._peers) >= _MAX_PEERS:
            self._peers.clear()
        self._peers[url] = peer
        return peer, True


def _fresh_until(response: httpx.Response) -> float:
    found = _MAX_AGE.search(response.headers.get("cache-control", ""))
    return time.monotonic() + (int(found.group(1)) if found else 0)


def _refusal(card: pb.AgentCard, url: str, expect_name: str | None,
             require_extension: str | None) -> Refused | None:
    if expect_name is not None and card.name != expect_name:
        return Refused("unreachable", "peer_changed")
    if require_extension is not None and not any(
            e.uri == require_extension for e in card.capabilities.extensions):
        return Refused("rejected", "control_not_supported")
    interfaces = [i for i in card.supported_interfaces if i.protocol_binding == "JSONRPC"]
    if not interfaces or not all(_same_origin(i.url, url) for i in interfaces):
        return Refused("unreachable", "card_url_mismatch")
    return None


async def _new_client(http: httpx.AsyncClient, card: pb.AgentCard,
                      token: str) -> tuple[Client, str]:
    session = uuid.uuid4().hex
    store = InMemoryContextCredentialStore()
    for scheme_name, scheme in card.security_schemes.items():
        if scheme.HasField("http_auth_security_scheme") and (
                scheme.http_auth_security_scheme.scheme.lower() == "bearer"):
            await store.set_credentials(session, scheme_name, token)
    client = ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create(
        card, interceptors=[AuthInterceptor(store)])
    return client, session


@asynccontextmanager
async def connect(url: str, token: str, *, timeout: float,
                  httpx_client: httpx.AsyncClient | None = None,
                  expect_name: str | None = None,
                  require_extension: str | None = None,
                  cards: PeerCards | None = None) -> AsyncIterator[
                      tuple[Client, ClientCallContext]]:
    """The SDK client that presents ``token`` as a bearer to the agent at ``url``, on its card.

    With ``cards`` and the caller's pooled ``httpx_client``, the card and the SDK client are
    kept for the next request; without ``cards``, or on a connection of its own (``None``: a
    repeat), the card is fetched afresh.
    """
    own = httpx_client is None
    http = httpx_client or new_http_client(timeout)
    keep = cards is not None and not own
    if cards is None:
        cards = PeerCards()
    try:
        if own:
            cards.forget(url)
        peer, asked = await cards.card(http, url, timeout, revalidate=False)
        refused = _refusal(peer.card, url, expect_name, require_extension)
        if refused is not None and not asked:  # the kept card may be the stale one
            peer, _ = await cards.card(http, url, timeout, revalidate=True)
            refused = _refusal(peer.card, url, expect_name, require_extension)
        if refused is not None:
            raise refused
        by_token = peer.clients.setdefault(http, {}) if keep else None
        made = by_token.get(token) if by_token is not None else None
        if made is None:
            made = await _new_client(http, peer.card, token)
            if by_token is not None:
                by_token[token] = made
        client, session = made
        params = {ADDRESSED_TO: quote(peer.card.name, safe="")}
        try:
            yield client, ClientCallContext(state={"sessionId": session}, timeout=timeout,
                                            service_parameters=params)
        finally:
            if not keep:
                await client.close()
    finally:
        if own:
            await http.aclose()


def _same_origin(a: str, b: str) -> bool:
    pa, pb_ = urlsplit(a), urlsplit(b)
    return (pa.scheme, pa.hostname, pa.port) == (pb_.scheme, pb_.hostname, pb_.port)


def fresh_card_on_stale(url: str, cards: PeerCards | None,
                        attempt: Callable[[httpx.AsyncClient | None, float],
                                          Awaitable[Attempt[R]]]
                        ) -> Callable[[httpx.AsyncClient | None, float], Awaitable[Attempt[R]]]:
    """``attempt``, made once more on a freshly fetched card if it was made on a kept one and
    the peer answered that the card is stale (:data:`STALE_CARD_STATUSES`, all answered
    before the message is read); any other failure that got no answer drops the card too, so
    a repeat (:func:`crosstalk.a2a.transport.at_most_twice`) starts from a fresh one."""

    async def run(http: httpx.AsyncClient | None, budget: float) -> Attempt[R]:
        if cards is None:
            return await attempt(http, budget)
        was_kept = http is not None and cards.kept(url)
        first = await attempt(http, budget)
        if first.failure is None:
            return first
        cause = httpx_cause(first.failure)
        stale = isinstance(cause, httpx.HTTPStatusError) and (
            cause.response.status_code in STALE_CARD_STATUSES)
        if stale or isinstance(cause, httpx.TransportError):
            cards.forget(url)
        if not (stale and was_kept):
            return first
        return await attempt(http, budget)

    return run
