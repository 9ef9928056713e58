"""The peer's Agent Card kept between sends (crosstalk.a2a.peers), against real listeners.

Real receiving agents (journal, receiver, fake harness, uvicorn) reached through a raw-socket
relay (:mod:`tests.support.relay`) on one fixed address, so "the peer at this address" can
change under a kept card: the same agent restarted, or another agent on the port. The relay
counts connections and requests, which is how the reuse is seen.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from crosstalk.a2a import client as ct_client
from crosstalk.a2a.peers import PeerCards
from crosstalk.a2a.transport import new_http_client
from crosstalk.store.registry import Registry
from tests.support.a2a import Agent, Node, agents, make_node, registry
from tests.support.relay import Relay

pytestmark = pytest.mark.anyio
__all__ = ["agents", "registry"]  # fixtures


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


@pytest.fixture
async def relay() -> AsyncIterator[Relay]:
    relay = Relay(0)  # upstream set by each test
    await relay.start()
    try:
        yield relay
    finally:
        await relay.close()


async def _behind(relay: Relay, node: Node) -> Node:
    """Serve ``node`` and send the relay's connections to it; its card names the relay."""
    await node.start()
    node.server.url = relay.url
    relay.upstream_port = _port(node.url)
    return node


async def test_one_card_fetch_and_one_connection_for_many_sends(
        relay: Relay, registry: Registry, agents: dict[str, Agent], tmp_path: Path) -> None:
    bob = await _behind(relay, make_node(registry, agents["bob"], tmp_path / "bob.jsonl"))
    http, cards = new_http_client(), PeerCards()
    try:
        for i in range(3):
            res = await ct_client.send(relay.url, agents["alice"].token, f"m{i}",
                                       httpx_client=http, cards=cards, expect_name="bob")
            assert (res.state, res.reason) == ("accepted", None), res
    finally:
        await http.aclose()
        await bob.stop()
    assert bob.fake.texts() == ["m0", "m1", "m2"]
    assert len(relay.requests(b"GET")) == 1  # the card, once
    assert len(relay.requests(b"POST")) == 3
    assert len(relay.connections) == 1  # every request on the one kept-alive connection


async def test_without_kept_cards_each_send_fetches_the_card(
        relay: Relay, registry: Registry, agents: dict[str, Agent], tmp_path: Path) -> None:
    """The plain call (no ``cards``) is what it was: a card fetch per send."""
    bob = await _behind(relay, make_node(registry, agents["bob"], tmp_path / "bob.jsonl"))
    http = new_http_client()
    try:
        for i in range(2):
            res = await ct_client.send(relay.url, agents["alice"].token, f"m{i}",
                                       httpx_client=http)
            assert res.state == "accepted", res
    finally:
        await http.aclose()
        await bob.stop()
    assert len(relay.requests(b"GET")) == 2


async def test_a_restarted_peer_is_reached_on_the_kept_card(
        relay: Relay, registry: Registry, agents: dict[str, Agent], tmp_path: Path) -> None:
    first = await _behind(relay, make_node(registry, agents["bob"], tmp_path / "bob.jsonl"))
    http, cards = new_http_client(), PeerCards()
    try:
        res = await ct_client.send(relay.url, agents["alice"].token, "before",
                                   httpx_client=http, cards=cards, expect_name="bob")
        assert res.state == "accepted", res
        await first.stop()
        first.journal.close()
        again = await _behind(relay, make_node(registry, agents["bob"], tmp_path / "bob2.jsonl"))
        # The relay keeps the old connection open with nobody behind it: a new one.
        await http.aclose()
        http = new_http_client()
        try:
            res = await ct_client.send(relay.url, agents["alice"].token, "after",
                                       httpx_client=http, cards=cards, expect_name="bob")
        finally:
            await again.stop()
    finally:
        await http.aclose()
    assert (res.state, res.reason) == ("accepted", None), res
    assert first.fake.texts() == ["before"]
    assert again.fake.texts() == ["after"]


async def test_another_agent_on_the_port_never_gets_a_message_sent_on_a_stale_card(
        relay: Relay, registry: Registry, agents: dict[str, Agent], tmp_path: Path) -> None:
    """Bob's card is kept; carol now answers at bob's address. Her listener refuses the
    request addressed to bob (421) before reading it; the card is fetched again and names
    carol: ``peer_changed``, as a fresh fetch would have said."""
    bob = await _behind(relay, make_node(registry, agents["bob"], tmp_path / "bob.jsonl"))
    http, cards = new_http_client(), PeerCards()
    carol = make_node(registry, agents["carol"], tmp_path / "carol.jsonl")
    try:
        res = await ct_client.send(relay.url, agents["alice"].token, "for bob",
                                   httpx_client=http, cards=cards, expect_name="bob")
        assert res.state == "accepted", res
        await bob.stop()
        await _behind(relay, carol)
        # A new connection (the relay keeps the old one open to nobody), the kept card.
        await http.aclose()
        http = new_http_client()
        res = await ct_client.send(relay.url, agents["alice"].token, "also for bob",
                                   httpx_client=http, cards=cards, expect_name="bob")
    finally:
        await http.aclose()
        await carol.stop()
    assert (res.state, res.reason) == ("unreachable", "peer_changed"), res
    assert carol.fake.texts() == []
    assert bob.fake.texts() == ["for bob"]
    assert len(relay.requests(b"GET")) == 2  # the kept card, then the refetch
    assert len(relay.requests(b"POST")) == 2  # the second one carol refused (421), unread


async def test_a_refetched_card_naming_another_origin_never_gets_the_token(
        relay: Relay, registry: Registry, agents: dict[str, Agent], tmp_path: Path) -> None:
    """After the 421, the new card points elsewhere: nothing is sent there."""
    seen: list[bytes] = []

    async def elsewhere(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.read(65536))
        writer.close()

    other = await asyncio.start_server(elsewhere, "127.0.0.1", 0)
    other_url = f"http://127.0.0.1:{other.sockets[0].getsockname()[1]}"
    bob = await _behind(relay, make_node(registry, agents["bob"], tmp_path / "bob.jsonl"))
    carol = make_node(registry, agents["carol"], tmp_path / "carol.jsonl")
    http, cards = new_http_client(), PeerCards()
    try:
        res = await ct_client.send(relay.url, agents["alice"].token, "for bob",
                                   httpx_client=http, cards=cards)
        assert res.state == "accepted", res
        await bob.stop()
        await _behind(relay, carol)
        carol.server.url = other_url
        await http.aclose()
        http = new_http_client()
        res = await ct_client.send(relay.url, agents["alice"].token, "for bob again",
                                   httpx_client=http, cards=cards)
    finally:
        await http.aclose()
        await carol.stop()
        other.close()
        await other.wait_closed()
    assert (res.state, res.reason) == ("unreachable", "card_url_mismatch"), res
    assert seen == []
    assert carol.fake.texts() == []


async def test_a_card_from_another_origin_is_refused_before_any_request(
        relay: Relay, registry: Registry, agents: dict[str, Agent], tmp_path: Path) -> None:
    bob = await _behind(relay, make_node(registry, agents["bob"], tmp_path / "bob.jsonl"))
    bob.server.url = "http://127.0.0.2:9"
    http, cards = new_http_client(), PeerCards()
    try:
        for _ in range(2):  # the refused card is checked again, never trusted
            res = await ct_client.send(relay.url, agents["alice"].token, "x",
                                       httpx_client=http, cards=cards)
            assert (res.state, res.reason) == ("unreachable", "card_url_mismatch"), res
    finally:
        await http.aclose()
        await bob.stop()
    assert relay.requests(b"POST") == []
    assert bob.fake.texts() == []
