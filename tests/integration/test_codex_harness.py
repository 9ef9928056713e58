"""The Codex adapter against a fake app-server on a real unix socket (WebSocket framing).

Binding by loaded membership (CQ10), the two injection paths (turn/start wakes or joins;
inject_items never wakes, CQ3), failures mapped to states without resending, discovery rows.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from crosstalk.core.ids import new_message_id
from crosstalk.core.message import DeliveryMode, Ingress, Kind, Message, Sender
from crosstalk.core.states import MessageState
from crosstalk.directory import Directory
from crosstalk.harness.base import Binding, Delivery, Identity, Session
from crosstalk.harness.codex import CodexHarness, CodexIdentifier, control_socket
from crosstalk.store.registry import Registry
from tests.support.fakes.codex_app_server import FakeAppServer, fake_app_server, finish_turn

pytestmark = pytest.mark.anyio

ALICE = Sender(agent_id="a" * 16, name="alice", ingress=Ingress.A2A)
SCRIPT = Sender(agent_id=None, ingress=Ingress.UDS)


@pytest.fixture
def home() -> Path:
    return Path(tempfile.mkdtemp(prefix="ct-cx-", dir="/tmp"))


@pytest.fixture
async def server(home: Path) -> AsyncIterator[FakeAppServer]:
    async with fake_app_server(Path(control_socket({"CODEX_HOME": str(home)}))) as s:
        yield s


def delivery(text: str, *, sender: Sender = ALICE, kind: Kind = Kind.INFORM,
             mode: DeliveryMode = DeliveryMode.IMMEDIATE) -> Delivery:
    return Delivery(Message(message_id=new_message_id(), sender=sender, text=text, kind=kind,
                            delivery=mode))


def binding(thread: str) -> Binding:
    return Binding("codex", thread, None, "inst")


def harness(server: FakeAppServer, thread: str, *more: str) -> CodexHarness:
    return CodexHarness(thread, lambda: [str(server.path), *more], timeout=1.0)


async def test_a_verified_immediate_message_starts_a_turn(server: FakeAppServer) -> None:
    t = server.add("worker", cwd="/w")
    d = delivery("build is green", kind=Kind.ASK)
    out = await harness(server, t.id).inject(binding(t.id), d)
    assert out.state is MessageState.ACCEPTED
    assert out.evidence == f"turn {t.turn}"
    (got,) = server.inputs
    assert got.how == "turn/start"
    assert "<peer-message" in got.text
    assert f'message-id="{d.message.message_id}"' in got.text
    assert 'from="alice"' in got.text
    assert 'kind="ask"' in got.text
    assert "untrusted coordination input" in got.text
    assert "build is green" in got.text
    init = next(r for r in server.requests if r["method"] == "initialize")
    assert init["params"]["capabilities"]["experimentalApi"] is False
    assert "jsonrpc" not in init


async def test_a_running_turn_is_joined_not_restarted(server: FakeAppServer) -> None:
    t = server.add("worker")
    first = await harness(server, t.id).inject(binding(t.id), delivery("one"))
    second = await harness(server, t.id).inject(binding(t.id), delivery("two"))
    assert first.evidence == second.evidence  # the same turn id: joined
    finish_turn(server, t.id)
    third = await harness(server, t.id).inject(binding(t.id), delivery("three"))
    assert third.evidence != first.evidence


@pytest.mark.seed(3)
@pytest.mark.seed(9)
@pytest.mark.parametrize(("sender", "mode"), [(ALICE, DeliveryMode.NEXT_TURN),
                                              (SCRIPT, DeliveryMode.IMMEDIATE)])
async def test_deferred_or_unverified_is_appended_without_waking(
        server: FakeAppServer, sender: Sender, mode: DeliveryMode) -> None:
    t = server.add("worker")
    out = await harness(server, t.id).inject(binding(t.id), delivery("fyi", sender=sender,
                                                                     mode=mode))
    assert (out.state, out.evidence) == (MessageState.QUEUED, "inject_items")
    assert [i.how for i in server.inputs] == ["inject_items"]
    assert t.status == "idle"  # never woken
    assert not any(r["method"] == "turn/start" for r in server.requests)


@pytest.mark.seed(31)
async def test_binding_needs_exactly_one_live_host(server: FakeAppServer, home: Path) -> None:
    t = server.add("worker")
    stored = server.add("stored", status="notLoaded")  # history only: readable, not hosted
    out = await harness(server, stored.id).inject(binding(stored.id), delivery("x"))
    assert (out.state, out.reason) == (MessageState.UNREACHABLE, "codex_thread_not_loaded")
    missing = await harness(server, "no-such-thread").inject(binding("no-such-thread"),
                                                             delivery("x"))
    assert missing.reason == "codex_thread_not_loaded"
    async with fake_app_server(home / "other" / "other.sock") as other:
        other.threads[t.id] = type(t)(id=t.id, name="worker")  # the same thread loaded twice
        out = await harness(server, t.id, str(other.path)).inject(binding(t.id),
                                                                  delivery("x"))
        assert (out.state, out.reason) == (MessageState.UNREACHABLE, "ambiguous_endpoint")
        assert server.inputs == []
        assert other.inputs == []
    gone = await harness(server, t.id, str(home / "nothing.sock")).inject(binding(t.id),
                                                                        delivery("y"))
    assert gone.state is MessageState.ACCEPTED  # a missing endpoint is no host, not an error


async def test_failures_map_to_states_and_nothing_is_resent(server: FakeAppServer) -> None:
    t = server.add("worker")
    server.fail["turn/start"] = "thread not found: x"
    out = await harness(server, t.id).inject(binding(t.id), delivery("a"))
    assert (out.state, out.reason) == (MessageState.UNREACHABLE, "codex_thread_not_loaded")
    server.fail["turn/start"] = "review in progress"
    out = await harness(server, t.id).inject(binding(t.id), delivery("b"))
    assert (out.state, out.reason) == (MessageState.UNREACHABLE, "app_server_refused:-32600")
    server.hang.add("turn/start")
    out = await harness(server, t.id).inject(binding(t.id), delivery("c"))
    assert (out.state, out.reason) == (MessageState.UNKNOWN, "app_server_no_answer")
    assert sum(r["method"] == "turn/start" for r in server.requests) == 3  # once each


async def test_discovery_lists_loaded_user_threads_only(server: FakeAppServer,
                                                        home: Path) -> None:
    user = server.add("worker", cwd="/proj")
    busy = server.add(None, cwd="/proj", status="active")
    server.add("title helper", ephemeral=True, thread_source="thread_title")
    server.add("sub", parent=user.id)
    server.add("old", status="notLoaded")
    ident = CodexIdentifier(env={"CODEX_HOME": str(home)})
    rows = {r.session_ref: r for r in await ident.discover_async()}
    assert set(rows) == {user.id, busy.id}
    assert (rows[user.id].name, rows[user.id].cwd, rows[user.id].status) == (
        "worker", "/proj", "idle")
    assert rows[busy.id].status == "busy"
    assert rows[user.id].locator == str(server.path)
    assert all(r.reachable for r in rows.values())
    # Sent natively (a thread without CrossTalk), through the endpoint it was found on.
    out = await ident.send_native(rows[user.id], delivery("hello worker"))
    assert out.state is MessageState.ACCEPTED
    assert server.texts(user.id)
    assert "hello worker" in server.texts(user.id)[0]


async def test_a_listing_from_the_loop_runs_codex_discovery_on_that_loop(
        server: FakeAppServer, home: Path) -> None:
    """The shim lists sessions in a worker thread; Codex's discovery then runs on the shim's
    loop (awaited from the thread), never in an event loop of its own per listing."""
    user = server.add("worker", cwd="/proj")
    ident = CodexIdentifier(env={"CODEX_HOME": str(home)})
    loops: list[asyncio.AbstractEventLoop] = []
    listing = ident.discover_async

    async def recorded() -> list[Session]:
        loops.append(asyncio.get_running_loop())
        return await listing()

    def blocking() -> list[Session]:
        raise AssertionError("discover() starts a loop of its own")

    ident.discover_async = recorded  # type: ignore[method-assign]
    ident.discover = blocking  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as state:
        directory = Directory(Registry(Path(state)), [ident], loop=asyncio.get_running_loop())
        entries = await asyncio.to_thread(directory.snapshot)
    assert loops == [asyncio.get_running_loop()]
    assert [(e.name, e.crosstalk, e.session and e.session.session_ref) for e in entries] == [
        ("worker", False, user.id)]


@pytest.mark.seed(20)
async def test_an_ambiguous_turn_start_settles_only_on_evidence(server: FakeAppServer) -> None:
    """The answer to turn/start is lost: unknown, never resent; the thread's history then
    shows our message-id in a turn, which is positive evidence. A lost inject_items leaves
    nothing in that history, so it stays unknown."""
    t = server.add("worker")
    server.lose_answer.update({"turn/start", "thread/inject_items"})
    woke = delivery("did this arrive?")
    out = await harness(server, t.id).inject(binding(t.id), woke)
    assert (out.state, out.reason) == (MessageState.UNKNOWN, "app_server_no_answer")
    found = await harness(server, t.id).reconcile(binding(t.id), woke.message.message_id)
    assert found is not None
    assert found.state is MessageState.ACCEPTED
    assert found.evidence == f"turn {t.turn}"
    quiet = delivery("appended?", mode=DeliveryMode.NEXT_TURN)
    out = await harness(server, t.id).inject(binding(t.id), quiet)
    assert out.state is MessageState.UNKNOWN
    assert await harness(server, t.id).reconcile(binding(t.id), quiet.message.message_id) is None
    assert len(server.inputs) == 2  # nothing was sent twice


@pytest.mark.seed(20)
async def test_the_identifier_reconciles_through_the_threads_harness(
        server: FakeAppServer, home: Path) -> None:
    """The shim hands an agent its harness's Reconciler (harness.base): for Codex, the
    identifier, which asks the thread's own CodexHarness for the evidence."""
    t = server.add("worker")
    server.lose_answer.add("turn/start")
    identifier = CodexIdentifier(env={"CODEX_HOME": str(home)})
    identifier.harnesses[t.id] = harness(server, t.id)  # its short timeout
    woke = delivery("did this arrive?")
    thread = identifier.harness_for(Identity("codex", t.id, "/"))
    assert thread is identifier.harnesses[t.id]
    out = await thread.inject(binding(t.id), woke)
    assert out.state is MessageState.UNKNOWN
    found = await identifier.reconcile(binding(t.id), woke.message.message_id)
    assert found is not None
    assert found.state is MessageState.ACCEPTED
    assert len(server.inputs) == 1  # nothing was sent twice


async def test_a_thread_no_server_has_loaded_goes_to_codex_queue(
        server: FakeAppServer, home: Path) -> None:
    """Issue 6: ``codex queue`` is Codex's durable path for a thread held where no shared
    app-server can reach it; the result says so (queued, durable_queue)."""
    log = home / "queue-args.txt"
    fake = home / "codex"
    fake.write_text("#!/bin/sh\nprintf '%s\\n' \"$@\" > " + str(log) + "\n"
                    "echo \"Queued message q-1 for thread $3.\"\n")
    fake.chmod(0o755)
    stored = "01a22d23-0000-7000-8000-00000000abcd"
    h = CodexHarness(stored, lambda: [str(server.path)], timeout=1.0, codex=lambda: str(fake))
    d = delivery("for later")
    out = await h.inject(binding(stored), d)
    assert (out.state, out.reason) == (MessageState.QUEUED, "durable_queue")
    args = log.read_text().splitlines()
    assert args[:4] == ["queue", "--thread", stored, "--message"]
    assert d.message.message_id in "\n".join(args[4:])
    fake.write_text("#!/bin/sh\necho 'Error: No active session found' >&2\nexit 1\n")
    out = await h.inject(binding(stored), delivery("again"))
    assert (out.state, out.reason) == (MessageState.UNREACHABLE, "codex_thread_not_loaded")
