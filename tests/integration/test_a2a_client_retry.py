"""A pooled connection the server closes just as the client reuses it (issue 12, item 4).

A real receiving agent (journal, receiver, fake harness, uvicorn) behind a raw-socket relay
(:mod:`tests.support.relay`) that forces the keep-alive race: a connection idle in the
client's pool is closed at the moment its next request arrives. The sender is CrossTalk's own
client on one pooled HTTP client, as an agent sends.

A request that failed before any response byte is retried once on a fresh connection (the
receiver dedupes by message id, so even one the server processed is safe to repeat); one that
got part of an answer is not, and stays ``unknown``. The client drops idle connections well
before the server would.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from crosstalk.a2a import client as ct_client
from crosstalk.a2a.transport import KEEPALIVE_EXPIRY, new_http_client
from crosstalk.core.message import Sender
from crosstalk.core.policy import ControlResult
from crosstalk.store.registry import Registry
from tests.support.a2a import (
    Agent,
    Node,
    agents,
    make_node,
    registry,
    serving,
)
from tests.support.relay import Action, Relay

pytestmark = pytest.mark.anyio
__all__ = ["agents", "registry"]  # fixtures


async def _refuse_claims(sender: Sender, op: str) -> ControlResult:
    return ControlResult(False, "not_today", "primary", None)


@pytest.fixture
async def bob(registry: Registry, agents: dict[str, Agent],
              tmp_path: Path) -> AsyncIterator[Node]:
    node = make_node(registry, agents["bob"], tmp_path / "bob.jsonl",
                     claim_handler=_refuse_claims)
    async with serving(node):
        yield node
    node.journal.close()


@pytest.fixture
async def relay(bob: Node) -> AsyncIterator[Relay]:
    """Bob reached through the relay: his card names the relay's address, as if it were his."""
    port = int(bob.url.rsplit(":", 1)[1])
    relay = Relay(port)
    bob.server.url = await relay.start()
    try:
        yield relay
    finally:
        await relay.close()


async def _pooled_then_trapped(relay: Relay, alice: Agent, action: Action, method: bytes,
                               **trap: int) -> ct_client.SendResult:
    """One send that leaves a connection idle in the pool, then a send that reuses it and
    meets the trap."""
    http = new_http_client()
    try:
        first = await ct_client.send(relay.url, alice.token, "first", httpx_client=http)
        assert first.state == "accepted", first
        assert relay.trap(action, method=method, **trap) == 1  # the one pooled connection
        return await ct_client.send(relay.url, alice.token, "second", httpx_client=http)
    finally:
        await http.aclose()


@pytest.mark.parametrize("action", ["drop", "reset"])
async def test_a_card_fetch_on_a_connection_closed_at_reuse_is_retried(
        relay: Relay, bob: Node, agents: dict[str, Agent], action: Action) -> None:
    """Before: ``unreachable`` (transport_error), and nothing was ever retried."""
    second = await _pooled_then_trapped(relay, agents["alice"], action, b"GET")
    assert (second.state, second.reason) == ("accepted", None), second
    assert relay.sprung == 1
    assert len(relay.connections) == 2  # the retry went out on a fresh connection
    assert bob.fake.texts() == ["first", "second"]


@pytest.mark.parametrize("action", ["drop", "reset"])
async def test_a_send_on_a_connection_closed_at_reuse_is_retried(
        relay: Relay, bob: Node, agents: dict[str, Agent], action: Action) -> None:
    """The card came back on the pooled connection; the SendMessage after it meets the close."""
    second = await _pooled_then_trapped(relay, agents["alice"], action, b"POST")
    assert (second.state, second.reason) == ("accepted", None), second
    assert relay.sprung == 1
    assert bob.fake.texts() == ["first", "second"]  # exactly once


async def test_a_send_the_server_processed_but_never_answered_is_deduped_on_retry(
        relay: Relay, bob: Node, agents: dict[str, Agent]) -> None:
    """No response byte came back, though the server delivered it: the retry (same message
    id) is answered from the receiver's dedupe record, never injected twice."""
    second = await _pooled_then_trapped(relay, agents["alice"], "swallow", b"POST")
    assert (second.state, second.reason) == ("accepted", None), second
    assert bob.fake.texts() == ["first", "second"]
    assert len(relay.requests(b"POST")) == 3  # first, the swallowed one, its retry


async def test_a_repeat_that_finds_nobody_never_denies_the_first_copy(
        relay: Relay, bob: Node, agents: dict[str, Agent]) -> None:
    """The first copy was delivered but not answered; the repeat cannot connect: the result
    is ``unknown`` (it may have arrived), never ``unreachable``."""
    http = new_http_client()
    try:
        first = await ct_client.send(relay.url, agents["alice"].token, "first", httpx_client=http)
        assert first.state == "accepted"
        relay.trap("swallow", method=b"POST")
        relay.refuse_new()
        second = await ct_client.send(relay.url, agents["alice"].token, "second",
                                      httpx_client=http)
    finally:
        await http.aclose()
    assert (second.state, second.reason) == ("unknown", "connect_failed"), second
    assert bob.fake.texts() == ["first", "second"]


async def test_a_partial_answer_is_never_retried(relay: Relay, bob: Node,
                                                 agents: dict[str, Agent]) -> None:
    second = await _pooled_then_trapped(relay, agents["alice"], "partial", b"POST",
                                        partial_bytes=5)
    assert second.state == "unknown", second
    assert len(relay.requests(b"POST")) == 2  # first, and the one cut short: no retry
    assert bob.fake.texts() == ["first", "second"]


async def test_a_control_request_the_server_may_have_applied_is_not_repeated(
        relay: Relay, agents: dict[str, Agent]) -> None:
    """A claim is not deduped by the target: only a failure before it left is retried."""
    http = new_http_client()
    try:
        out = await ct_client.control(relay.url, agents["alice"].token, "claim", text="claim",
                                      httpx_client=http)
        assert (out.state, out.reason) == ("accepted", "not_today")
        relay.trap("swallow", method=b"POST")
        lost = await ct_client.control(relay.url, agents["alice"].token, "claim",
                                       text="claim", httpx_client=http)
        assert lost.state == "unknown", lost
        assert len(relay.requests(b"POST")) == 2
        relay.trap("drop", method=b"GET")
        retried = await ct_client.control(relay.url, agents["alice"].token, "claim",
                                          text="claim", httpx_client=http)
        assert (retried.state, retried.reason) == ("accepted", "not_today"), retried
    finally:
        await http.aclose()


async def test_the_client_drops_idle_connections_before_the_server_does(
        relay: Relay, bob: Node, agents: dict[str, Agent]) -> None:
    """The pool's keep-alive expiry is clearly below the listener's idle timeout, so the
    client gives up an idle connection before the server closes it: a connection idle longer
    than the client's expiry is never reused (the wait is a lower bound, not a measurement)."""
    assert bob.server.listener.bounds.idle / 2 >= KEEPALIVE_EXPIRY
    http = new_http_client()
    try:
        first = await ct_client.send(relay.url, agents["alice"].token, "one", httpx_client=http)
        assert len(relay.connections) == 1
        await asyncio.sleep(KEEPALIVE_EXPIRY + 0.5)
        second = await ct_client.send(relay.url, agents["alice"].token, "two",
                                      httpx_client=http)
    finally:
        await http.aclose()
    assert (first.state, second.state) == ("accepted", "accepted")
    assert len(relay.connections) == 2  # a new connection, not the idle one
    assert [len(c.requests) for c in relay.connections] == [2, 2]  # card + send on each
