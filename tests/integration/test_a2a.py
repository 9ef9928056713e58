"""The A2A server over real HTTP (uvicorn on 127.0.0.1) with the a2a-sdk's own client.

Seed §11 test 17 rows a-j, 22 (cancel race), 23 (continuations and authority), 6 and 7 over
A2A, the body cap (R10, WA1), admission (seed 25, A2A half) and the restart (seed 20, first
half). Every agent is really registered (flocks, 0600 token files, this process's pid and
start time); every journal is a real file.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from a2a.client import A2ACardResolver, A2AClientError
from a2a.client.transports.jsonrpc import JsonRpcTransport
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import (
    InvalidParamsError,
    InvalidRequestError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from a2a.utils.proto_utils import validate_proto_required_fields

from crosstalk import __version__
from crosstalk.a2a import client as ct_client
from crosstalk.a2a.server import A2AServer
from crosstalk.core.admission import Limits
from crosstalk.core.hops import hop_token
from crosstalk.core.ids import new_message_id
from crosstalk.core.message import Kind
from crosstalk.core.policy import TargetRole
from crosstalk.core.states import AskState, MessageState
from crosstalk.harness.fake import FakeHarness, Step
from crosstalk.store.journal import Journal
from crosstalk.store.registry import Registry
from tests.support.a2a import (
    SECRET_CWD,
    Agent,
    Node,
    agents,
    bob,
    make_node,
    meta,
    registered_agent,
    registry,
    sdk_client,
    send,
    serving,
    text_message,
)
from tests.support.waiting import eventually

pytestmark = pytest.mark.anyio
__all__ = ["agents", "bob", "registry"]  # fixtures

COMPLETED = pb.TASK_STATE_COMPLETED
WORKING = pb.TASK_STATE_WORKING
SUBMITTED = pb.TASK_STATE_SUBMITTED


# -- seed 17: the A2A conformance matrix ---------------------------------------------------


@pytest.mark.seed(17)
async def test_17a_agent_card_validates_with_the_sdk_resolver(bob: Node) -> None:
    async with httpx.AsyncClient() as http:
        card = await A2ACardResolver(http, bob.url).get_agent_card()
        raw = await http.get(f"{bob.url}/.well-known/agent-card.json",
                             headers={"Origin": "http://evil.example"})
    validate_proto_required_fields(card)  # raises on any missing REQUIRED field
    assert card.name == "bob"
    assert card.version == __version__
    [iface] = card.supported_interfaces
    assert (iface.protocol_binding, iface.protocol_version) == ("JSONRPC", "1.0")
    assert iface.url == bob.url  # the real bound URL, not a placeholder
    assert card.security_schemes["bearer"].http_auth_security_scheme.scheme == "bearer"
    assert [list(r.schemes) for r in card.security_requirements] == [["bearer"]]
    caps = card.capabilities
    assert not (caps.streaming)
    assert not (caps.push_notifications)
    assert not (caps.extended_agent_card)
    # R14: no cwd anywhere, no CORS header
    assert raw.status_code == 200
    assert "cwd" not in raw.text
    assert SECRET_CWD not in raw.text
    assert not any(h.lower().startswith("access-control-") for h in raw.headers)


@pytest.mark.seed(17)
async def test_17b_plain_text_completes_delivered_and_reaches_the_session(
        bob: Node, agents: dict[str, Agent]) -> None:
    alice = agents["alice"]
    async with sdk_client(bob.url, alice.token) as (client, ctx):
        task = await send(client, ctx, text_message("hello bob, from plain A2A"))
    assert task.status.state == COMPLETED
    m = meta(task)
    assert m["crosstalk.completion"] == "delivered"
    assert m["crosstalk.state"] == "accepted"
    assert bob.fake.texts() == ["hello bob, from plain A2A"]
    delivered = bob.fake.writes[0].delivery.message
    # identity comes from the bearer token, never from the message
    assert (delivered.sender.agent_id, delivered.sender.name) == (alice.agent_id, "alice")
    assert delivered.kind is Kind.INFORM
    assert delivered.delivery.value == "immediate"


@pytest.mark.seed(17)
async def test_17c_unknown_dispatch_is_never_reported_completed(
        bob: Node, agents: dict[str, Agent]) -> None:
    bob.fake.then(Step(state=MessageState.UNKNOWN, reason="socket_closed_early"),
                  Step(error=ConnectionResetError("peer reset after write")))
    async with sdk_client(bob.url, agents["alice"].token) as (client, ctx):
        first = await send(client, ctx, text_message("maybe delivered"))
        second = await send(client, ctx, text_message("also maybe"))
        for task in (first, second):
            assert task.status.state == WORKING  # default wait answers, but not "completed"
            assert meta(task)["crosstalk.state"] == "unknown"
            assert "crosstalk.completion" not in meta(task)
            again = await client.get_task(pb.GetTaskRequest(id=task.id), context=ctx)
            assert again.status.state == WORKING
        # A delivery outcome learned later (Server.Resolve) completes it.
        bob.server.resolve(meta(first)["crosstalk.message_id"], MessageState.ACCEPTED,
                           "receipt: delivered")
        done = await client.get_task(pb.GetTaskRequest(id=first.id), context=ctx)
    assert done.status.state == COMPLETED
    assert meta(done)["crosstalk.completion"] == "delivered"
    assert len(bob.fake.writes) == 2


@pytest.mark.seed(17)
async def test_17d_get_task_after_send_shows_completed(
        bob: Node, agents: dict[str, Agent]) -> None:
    async with sdk_client(bob.url, agents["alice"].token) as (client, ctx):
        msg = text_message("status please")
        sent = await send(client, ctx, msg)
        got = await client.get_task(pb.GetTaskRequest(id=sent.id), context=ctx)
    assert got.status.state == COMPLETED
    assert got.id == sent.id
    assert got.context_id == sent.context_id
    assert [h.message_id for h in got.history] == [msg.message_id]
    assert meta(got)["crosstalk.message_id"] == msg.message_id


@pytest.mark.seed(17)
async def test_17e_ask_return_immediately_then_completed_with_the_reply(
        bob: Node, agents: dict[str, Agent]) -> None:
    async with sdk_client(bob.url, agents["alice"].token) as (client, ctx):
        ask = text_message("which test is flaky?", kind="ask", deadline_seconds=600)
        task = await send(client, ctx, ask, return_immediately=True)
        assert task.status.state == SUBMITTED

        def ask_open() -> bool:
            entry = bob.receiver.entries.get(ask.message_id)
            return entry is not None and entry.ask is AskState.OPEN

        await eventually(ask_open, what="the ask reached the session")
        working = await client.get_task(pb.GetTaskRequest(id=task.id), context=ctx)
        assert working.status.state == WORKING
        assert meta(working)["crosstalk.ask"] == "open"

        bob.receiver.close_ask(ask.message_id, AskState.ANSWERED, "test_journal_crash, on CI")
        done = await client.get_task(pb.GetTaskRequest(id=task.id), context=ctx)
    assert done.status.state == COMPLETED
    assert meta(done)["crosstalk.completion"] == "answered"
    assert done.status.message.role == pb.ROLE_AGENT
    assert done.status.message.parts[0].text == "test_journal_crash, on CI"
    assert done.history[-1].parts[0].text == "test_journal_crash, on CI"
    assert bob.fake.writes[0].delivery.message.kind is Kind.ASK


@pytest.mark.seed(17)
async def test_17e_ask_with_default_wait_blocks_until_answered(
        bob: Node, agents: dict[str, Agent]) -> None:
    ask = text_message("ready to merge?", kind="ask")

    async def answer_when_open() -> None:
        await eventually(lambda: (e := bob.receiver.entries.get(ask.message_id)) is not None
                         and e.ask is AskState.OPEN, what="ask open")
        bob.receiver.close_ask(ask.message_id, AskState.ANSWERED, "yes")

    async with sdk_client(bob.url, agents["alice"].token) as (client, ctx):
        answerer = asyncio.ensure_future(answer_when_open())
        task = await send(client, ctx, ask)
        await answerer
    assert task.status.state == COMPLETED
    assert task.status.message.parts[0].text == "yes"


@pytest.mark.seed(17)
async def test_17e_ask_past_its_deadline_fails_expired(
        bob: Node, agents: dict[str, Agent]) -> None:
    async with sdk_client(bob.url, agents["alice"].token) as (client, ctx):
        ask = text_message("anyone?", kind="ask", deadline_seconds=1)
        task = await send(client, ctx, ask)  # nobody answers; the deadline timer fires
    assert task.status.state == pb.TASK_STATE_FAILED
    assert meta(task)["crosstalk.ask"] == "expired"
    assert meta(task)["crosstalk.reason"] == "ask_expired"


async def test_a_caller_that_hangs_up_frees_its_wait_slot(
        bob: Node, agents: dict[str, Agent]) -> None:
    adm = bob.receiver.admission
    result = await ct_client.send(bob.url, agents["alice"].token, "will you?", kind="ask",
                                  timeout=1.0)  # no deadline: the server would wait long
    assert (result.state, result.reason) == ("unknown", "timeout")  # ambiguous: it was sent
    await eventually(lambda: adm.waits == 0, what="the wait slot came back")
    assert bob.fake.texts() == ["will you?"]  # it was delivered all the same


@pytest.mark.seed(17)
async def test_17f_cancel_unclaimed_submitted_then_claimed_then_terminal(
        bob: Node, agents: dict[str, Agent]) -> None:
    gate = asyncio.Event()
    bob.fake.default = Step(gate=gate)
    async with sdk_client(bob.url, agents["alice"].token) as (client, ctx):
        blocker = await send(client, ctx, text_message("first, parks"), return_immediately=True)
        await eventually(bob.fake.parked.is_set, what="blocker parked in the harness")
        queued = await send(client, ctx, text_message("second, never written"),
                            return_immediately=True)
        assert queued.status.state == SUBMITTED

        canceled = await client.cancel_task(pb.CancelTaskRequest(id=queued.id), context=ctx)
        assert canceled.status.state == pb.TASK_STATE_CANCELED
        assert meta(canceled)["crosstalk.state"] == "canceled"

        with pytest.raises(TaskNotCancelableError):  # claimed: dispatching right now
            await client.cancel_task(pb.CancelTaskRequest(id=blocker.id), context=ctx)
        gate.set()
        await eventually(lambda: len(bob.fake.writes) == 1, what="blocker written")
        done = await client.get_task(pb.GetTaskRequest(id=blocker.id), context=ctx)
        assert done.status.state == COMPLETED
        with pytest.raises(TaskNotCancelableError):  # terminal
            await client.cancel_task(pb.CancelTaskRequest(id=blocker.id), context=ctx)
        with pytest.raises(TaskNotCancelableError):  # already canceled
            await client.cancel_task(pb.CancelTaskRequest(id=queued.id), context=ctx)
        after = await client.get_task(pb.GetTaskRequest(id=queued.id), context=ctx)
    assert after.status.state == pb.TASK_STATE_CANCELED
    assert bob.fake.texts() == ["first, parks"]


@pytest.mark.seed(17)
async def test_17g_continuation_of_terminal_or_unknown_task(
        bob: Node, agents: dict[str, Agent]) -> None:
    async with sdk_client(bob.url, agents["alice"].token) as (client, ctx):
        done = await send(client, ctx, text_message("one and done"))
        assert done.status.state == COMPLETED
        with pytest.raises(UnsupportedOperationError):
            await send(client, ctx, text_message("more", task_id=done.id))
        with pytest.raises(TaskNotFoundError):
            await send(client, ctx, text_message("to nowhere", task_id="no-such-task"))
    assert bob.fake.texts() == ["one and done"]


@pytest.mark.seed(17)
async def test_17h_list_tasks_returns_only_the_callers_tasks(
        bob: Node, agents: dict[str, Agent]) -> None:
    alice, carol = agents["alice"], agents["carol"]
    async with sdk_client(bob.url, alice.token) as (ca, cx_a), \
            sdk_client(bob.url, carol.token) as (cc, cx_c):
        mine = {(await send(ca, cx_a, text_message(f"alice {i}"))).id for i in range(3)}
        theirs = {(await send(cc, cx_c, text_message("carol 0"))).id}
        listed_a = await ca.list_tasks(pb.ListTasksRequest(), context=cx_a)
        listed_c = await cc.list_tasks(pb.ListTasksRequest(), context=cx_c)
        paged = await ca.list_tasks(pb.ListTasksRequest(page_size=2), context=cx_a)
        rest = await ca.list_tasks(pb.ListTasksRequest(page_size=2,
                                                       page_token=paged.next_page_token),
                                   context=cx_a)
        with pytest.raises(TaskNotFoundError):  # another principal's task does not exist
            await cc.get_task(pb.GetTaskRequest(id=next(iter(mine))), context=cx_c)
    assert {t.id for t in listed_a.tasks} == mine
    assert {t.id for t in listed_c.tasks} == theirs
    assert {t.id for t in paged.tasks} | {t.id for t in rest.tasks} == mine
    assert len(paged.tasks) == 2
    assert len(rest.tasks) == 1


@pytest.mark.seed(17)
async def test_17i_missing_or_wrong_bearer_is_refused(
        bob: Node, agents: dict[str, Agent], registry: Registry) -> None:
    gone = registered_agent(registry, "dave")
    gone_token = gone.token
    gone.registration.close()  # a token of an agent that is no longer registered
    for token in (None, "not-a-token", agents["bob"].token + "x", gone_token):
        async with sdk_client(bob.url, token) as (client, ctx):
            with pytest.raises(A2AClientError, match="401"):
                await send(client, ctx, text_message("let me in"))
            with pytest.raises(A2AClientError, match="401"):
                await client.list_tasks(pb.ListTasksRequest(), context=ctx)
    async with httpx.AsyncClient() as http:
        raw = await http.post(bob.url, json={"jsonrpc": "2.0", "id": 1, "method": "ListTasks",
                                             "params": {}},
                              headers={"A2A-Version": "1.0", "Authorization": "Basic eDp5"})
        card = await http.get(f"{bob.url}/.well-known/agent-card.json")
        # a big body with no valid token: still a clean 401, not a connection reset
        big = await http.post(bob.url, content=b"x" * (4 * 1024 * 1024),
                              headers={"Authorization": "Bearer nope"})
    assert big.status_code == 401
    assert raw.status_code == 401
    assert raw.headers["www-authenticate"].startswith("Bearer")
    assert card.status_code == 200  # the card stays public
    assert bob.fake.writes == []
    assert not any(r.get("subject") == "message" for r in bob.records())
    # our own client maps the refusal to rejected
    result = await ct_client.send(bob.url, "wrong", "hi")
    assert (result.state, result.reason) == ("rejected", "unauthorized")


@pytest.mark.seed(17)
async def test_17j_unimplemented_methods_return_the_spec_errors(
        bob: Node, agents: dict[str, Agent]) -> None:
    token = agents["alice"].token
    async with sdk_client(bob.url, token) as (client, ctx):
        config = pb.TaskPushNotificationConfig(task_id="x", url="http://127.0.0.1:9/hook")
        with pytest.raises(PushNotificationNotSupportedError):
            await client.create_task_push_notification_config(config, context=ctx)
        with pytest.raises(PushNotificationNotSupportedError):
            await client.get_task_push_notification_config(
                pb.GetTaskPushNotificationConfigRequest(task_id="x", id="y"), context=ctx)
        with pytest.raises(PushNotificationNotSupportedError):
            await client.list_task_push_notification_configs(
                pb.ListTaskPushNotificationConfigsRequest(task_id="x"), context=ctx)
        with pytest.raises(PushNotificationNotSupportedError):
            await client.delete_task_push_notification_config(
                pb.DeleteTaskPushNotificationConfigRequest(task_id="x", id="y"), context=ctx)
    # The SDK client never sends streaming calls or GetExtendedAgentCard to a card that does
    # not advertise them, so ask the SDK's JSON-RPC transport and the raw binding directly.
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(headers={**headers, "A2A-Version": "1.0"}) as http:
        card = await A2ACardResolver(http, bob.url).get_agent_card()
        transport = JsonRpcTransport(http, card, bob.url, is_shared_httpx=True)
        with pytest.raises(UnsupportedOperationError):
            async for _ in transport.send_message_streaming(pb.SendMessageRequest(
                    message=text_message("stream me"))):
                pass
        with pytest.raises(UnsupportedOperationError):
            async for _ in transport.subscribe(pb.SubscribeToTaskRequest(id="x")):
                pass
        resp = await http.post(bob.url, json={"jsonrpc": "2.0", "id": 7,
                                              "method": "GetExtendedAgentCard", "params": {}})
    assert resp.json()["error"]["code"] == -32004  # UnsupportedOperationError
    assert resp.json()["id"] == 7
    assert bob.fake.writes == []


# -- seed 22: the cancel race --------------------------------------------------------------


@pytest.mark.seed(22)
async def test_22_cancel_race_never_canceled_and_written(
        bob: Node, agents: dict[str, Agent]) -> None:
    rng = random.Random(22)
    outcomes = {"canceled": 0, "not_cancelable": 0}
    async with sdk_client(bob.url, agents["alice"].token) as (client, ctx):
        for round_no in range(40):
            gate = asyncio.Event()
            bob.fake.default = Step(gate=gate)
            mode = ("after_park", "immediate", "behind_blocker", "race")[round_no % 4]
            blocker = None
            if mode in ("behind_blocker", "race"):
                blocker = await send(client, ctx, text_message(f"blocker {round_no}"),
                                     return_immediately=True)
                await eventually(bob.fake.parked.is_set, what="blocker parked")
            msg = text_message(f"race {round_no}")
            task = await send(client, ctx, msg, return_immediately=True)
            release: asyncio.Future[None] | None = None
            if mode == "after_park":
                await eventually(bob.fake.parked.is_set, what="target parked")
            elif mode == "race":  # the blocker finishes while the cancel is on its way
                release = asyncio.ensure_future(_release_after(gate, rng.randrange(12)))
            try:
                await client.cancel_task(pb.CancelTaskRequest(id=task.id), context=ctx)
                canceled = True
            except TaskNotCancelableError:
                canceled = False
            if release is not None:
                await release
            gate.set()
            await eventually(lambda m=msg: bob.receiver.entries[m.message_id].state not in (
                MessageState.SUBMITTED, MessageState.DISPATCHING), what="target settled")
            if blocker is not None:
                await eventually(lambda b=blocker: bob.server.store.lookup(b.id) is not None
                                 and bob.server.store.lookup(b.id).state.value == "completed",
                                 what="blocker done")
            writes = [w for w in bob.fake.writes if w.delivery.message.message_id
                      == msg.message_id]
            final = await client.get_task(pb.GetTaskRequest(id=task.id), context=ctx)
            if canceled:
                assert writes == [], f"round {round_no} ({mode}): canceled AND written"
                assert final.status.state == pb.TASK_STATE_CANCELED
                outcomes["canceled"] += 1
            else:
                assert len(writes) == 1, f"round {round_no} ({mode}): not cancelable, not written"
                assert final.status.state == COMPLETED
                outcomes["not_cancelable"] += 1
            if mode == "after_park":
                assert not canceled  # claimed before the cancel: the harness holds it
            if mode == "behind_blocker":
                assert canceled  # unclaimed behind the blocker: the cancel must win
    assert outcomes["canceled"] >= 10
    assert outcomes["not_cancelable"] >= 10


async def _release_after(gate: asyncio.Event, turns: int) -> None:
    """Open the gate after some turns of the loop: the cancel is in flight meanwhile."""
    for _ in range(turns):
        await asyncio.sleep(0)
    gate.set()


# -- seed 23: continuations and authority --------------------------------------------------


@pytest.mark.seed(23)
async def test_23_continuation_by_another_principal_is_task_not_found(
        bob: Node, agents: dict[str, Agent]) -> None:
    async with sdk_client(bob.url, agents["alice"].token) as (ya, cya), \
            sdk_client(bob.url, agents["carol"].token) as (xc, cxc):
        task = await send(ya, cya, text_message("open question", kind="ask"),
                          return_immediately=True)
        await eventually(lambda: len(bob.fake.writes) == 1, what="ask delivered")
        with pytest.raises(TaskNotFoundError):
            await send(xc, cxc, text_message("hijack", task_id=task.id))
        with pytest.raises(TaskNotFoundError):
            await xc.cancel_task(pb.CancelTaskRequest(id=task.id), context=cxc)
    assert bob.fake.texts() == ["open question"]
    assert not any(r.get("text") == "hijack" for r in bob.records())


@pytest.mark.seed(23)
async def test_23_continuation_is_policy_checked_again(
        registry: Registry, agents: dict[str, Agent], tmp_path: Path) -> None:
    y, owner = agents["alice"], agents["carol"]
    node = make_node(registry, agents["bob"], tmp_path / "bob.jsonl",
                     target_role=lambda: TargetRole(role="subagent", owner=owner.agent_id))
    async with serving(node), sdk_client(node.url, y.token) as (client, ctx):
        # An ask from a non-owner to a subagent: accepted, as an ask (no command authority).
        task = await send(client, ctx, text_message("status?", kind="ask"),
                          return_immediately=True)
        await eventually(lambda: len(node.fake.writes) == 1, what="ask delivered")
        assert node.fake.writes[0].delivery.message.kind is Kind.ASK
        got = await client.get_task(pb.GetTaskRequest(id=task.id), context=ctx)
        assert got.status.state == WORKING
        assert meta(got)["crosstalk.state"] == "accepted"
        # Y's command continuation of its own task: re-checked, rejected, not injected.
        with pytest.raises(InvalidRequestError) as err:
            await send(client, ctx, text_message("rm -rf build/", task_id=task.id,
                                                 kind="command"))
        assert err.value.data is not None
        assert err.value.data["reason"] == "command_owner_only"
        # An inform continuation passes the same check.
        cont = await send(client, ctx, text_message("fyi: CI is green", task_id=task.id),
                          return_immediately=True)
        assert cont.id == task.id
        await eventually(lambda: len(node.fake.writes) == 2, what="inform continuation")
    assert node.fake.texts() == ["status?", "fyi: CI is green"]
    assert [w.delivery.message.continuation for w in node.fake.writes] == [False, True]
    assert node.server.task_for_message(cont.history[-1].message_id) == task.id  # R6
    node.journal.close()


@pytest.mark.seed(23)
async def test_23_command_between_primaries_is_accepted_as_a_command(
        bob: Node, agents: dict[str, Agent]) -> None:
    async with sdk_client(bob.url, agents["alice"].token) as (client, ctx):
        task = await send(client, ctx, text_message("run the linters", kind="command"))
    assert task.status.state == COMPLETED
    [write] = bob.fake.writes
    assert write.delivery.message.kind is Kind.COMMAND
    assert write.delivery.message.sender.role == "primary"


@pytest.mark.seed(23)
async def test_23_command_to_subagent_from_its_owner_is_accepted(
        registry: Registry, agents: dict[str, Agent], tmp_path: Path) -> None:
    owner = agents["carol"]
    node = make_node(registry, agents["bob"], tmp_path / "bob.jsonl",
                     target_role=lambda: TargetRole(role="subagent", owner=owner.agent_id))
    async with serving(node):
        mine = await ct_client.send(node.url, owner.token, "rebase please", kind="command")
        other = await ct_client.send(node.url, agents["alice"].token, "delete it",
                                     kind="command")
    assert (mine.state, mine.task_state) == ("accepted", "completed")
    assert (other.state, other.reason, other.task_state) == (
        "rejected", "command_owner_only", "rejected")
    assert node.fake.texts() == ["rebase please"]
    node.journal.close()


# -- seeds 6 and 7 over A2A ------------------------------------------------------------------


@pytest.mark.seed(6)
async def test_6_same_message_id_twice_returns_prior_state_one_injection(
        bob: Node, agents: dict[str, Agent]) -> None:
    async with sdk_client(bob.url, agents["alice"].token) as (client, ctx):
        msg = text_message("exactly once")
        first = await send(client, ctx, msg)
        second = await send(client, ctx, msg)
        # and concurrently, while the first of a new pair is still in flight
        gate = asyncio.Event()
        bob.fake.then(Step(gate=gate))
        twin = text_message("twins")
        a = asyncio.ensure_future(send(client, ctx, twin))
        b = asyncio.ensure_future(send(client, ctx, twin, return_immediately=True))
        await eventually(bob.fake.parked.is_set, what="first twin parked")
        early = await b
        gate.set()
        late = await a
    assert second.id == first.id
    assert second.status.state == COMPLETED
    assert early.id == late.id
    assert late.status.state == COMPLETED
    assert bob.fake.texts() == ["exactly once", "twins"]
    # our client sees the same prior state on a retry
    again = await ct_client.send(bob.url, agents["alice"].token, "exactly once",
                                 message_id=msg.message_id)
    assert (again.state, again.task_id) == ("accepted", first.id)
    assert len(bob.fake.writes) == 2


@pytest.mark.seed(6)
async def test_6_message_id_of_another_sender_is_refused(
        bob: Node, agents: dict[str, Agent]) -> None:
    mid = new_message_id()
    first = await ct_client.send(bob.url, agents["alice"].token, "mine", message_id=mid)
    stolen = await ct_client.send(bob.url, agents["carol"].token, "mine?", message_id=mid)
    assert first.state == "accepted"
    assert (stolen.state, stolen.reason) == ("rejected", "message_id_conflict")
    assert bob.fake.texts() == ["mine"]


@pytest.mark.seed(7)
async def test_7_hop_chain_loop_and_overflow_are_rejected(
        bob: Node, agents: dict[str, Agent]) -> None:
    own = hop_token(bob.agent.agent_id)
    other = hop_token(agents["alice"].agent_id)
    async with sdk_client(bob.url, agents["alice"].token) as (client, ctx):
        loop = await send(client, ctx, text_message("A→B→A", hop_chain=[other, own]))
        long = await send(client, ctx, text_message("runaway", hop_chain=[
            f"{i:024x}" for i in range(33)]))
        fine = await send(client, ctx, text_message("one hop", hop_chain=[other]))
    for task, reason in ((loop, "hop_chain_loop"), (long, "hop_chain_too_long")):
        assert task.status.state == pb.TASK_STATE_REJECTED
        assert meta(task)["crosstalk.reason"] == reason
    assert fine.status.state == COMPLETED
    assert bob.fake.texts() == ["one hop"]
    result = await ct_client.send(bob.url, agents["alice"].token, "again", hop_chain=[own])
    assert (result.state, result.reason) == ("rejected", "hop_chain_loop")


# -- metadata decoding -----------------------------------------------------------------------


async def test_metadata_is_decoded_and_bad_kinds_are_rejected_without_injection(
        bob: Node, agents: dict[str, Agent]) -> None:
    async with sdk_client(bob.url, agents["alice"].token) as (client, ctx):
        task = await send(client, ctx, text_message(
            "later is fine", delivery="next_turn", in_reply_to="01990000-0000-7000-8000-0000"))
        for bad in ({"kind": "control"}, {"kind": 3}, {"delivery": "now"},
                    {"deadline_seconds": -1}, {"deadline_seconds": 1.5},
                    {"hop_chain": "abc"}, {"in_reply_to": 12}):
            with pytest.raises(InvalidParamsError):
                await send(client, ctx, text_message("bad", **bad))
        multi = pb.Message(message_id=new_message_id(), role=pb.ROLE_USER,
                           parts=[pb.Part(text="two"), pb.Part(text="parts")])
        joined = await send(client, ctx, multi)
    delivered = bob.fake.writes[0].delivery.message
    assert task.status.state == COMPLETED
    assert delivered.delivery.value == "next_turn"
    assert delivered.in_reply_to == "01990000-0000-7000-8000-0000"
    assert joined.status.state == COMPLETED
    assert bob.fake.texts() == ["later is fine", "two\nparts"]
    result = await ct_client.send(bob.url, agents["alice"].token, "x", kind="control")
    assert (result.state, result.reason) == ("rejected", "unknown_kind")


# -- the body cap (R10, WA1) -----------------------------------------------------------------


async def test_body_cap_known_length_and_chunked_are_jsonrpc_rejections(
        bob: Node, agents: dict[str, Agent]) -> None:
    token = agents["alice"].token
    big = "x" * (300 * 1024)
    result = await ct_client.send(bob.url, token, big)  # Content-Length: over the cap
    assert (result.state, result.reason) == ("rejected", "body_too_large")
    async with sdk_client(bob.url, token) as (client, ctx):
        with pytest.raises(InvalidRequestError):
            await send(client, ctx, text_message(big))

    payload = json.dumps({"jsonrpc": "2.0", "id": "c1", "method": "SendMessage", "params": {
        "message": {"messageId": new_message_id(), "role": "ROLE_USER",
                    "parts": [{"text": big}]}}}).encode()

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(payload), 16 * 1024):
            yield payload[i:i + 16 * 1024]

    async with httpx.AsyncClient(timeout=30) as http:
        resp = await http.post(bob.url, content=chunks(), headers={
            "Authorization": f"Bearer {token}", "A2A-Version": "1.0",
            "Content-Type": "application/json"})
    assert "content-length" not in resp.request.headers  # really chunked
    assert resp.request.headers["transfer-encoding"] == "chunked"
    assert resp.status_code == 200
    body = resp.json()
    assert body["error"]["code"] == -32600
    assert body["error"]["data"][0]["metadata"]["reason"] == "body_too_large"
    # under the cap the text limit (64 KiB) applies: a task, rejected by the receiver
    mid_size = await ct_client.send(bob.url, token, "y" * (100 * 1024))
    assert (mid_size.state, mid_size.reason) == ("rejected", "message_too_large")
    assert bob.fake.writes == []
    # a body that is not UTF-8 is a parse error (not an internal error, i.e. not "unknown")
    async with httpx.AsyncClient() as http:
        bad = await http.post(bob.url, content=b'{"jsonrpc":"2.0","id":1,"method":"\xff"}',
                              headers={"Authorization": f"Bearer {token}",
                                       "A2A-Version": "1.0"})
    assert bad.json()["error"]["code"] == -32700
    # and the server still serves
    ok = await ct_client.send(bob.url, token, "small")
    assert ok.state == "accepted"


# -- admission (seed 25, A2A half) -------------------------------------------------------------


@pytest.mark.seed(25)
async def test_25_admission_limits_reject_before_any_task_and_keep_accepted_work(
        registry: Registry, agents: dict[str, Agent], tmp_path: Path) -> None:
    gate = asyncio.Event()
    node = make_node(registry, agents["bob"], tmp_path / "bob.jsonl",
                     fake=FakeHarness(default=Step(gate=gate)),
                     limits=Limits(max_waits=2, max_pending_tasks=5, max_open_asks=2))
    alice = agents["alice"]
    accepted: list[str] = []
    async with serving(node), sdk_client(node.url, alice.token) as (client, ctx):
        adm = node.receiver.admission
        # two default-wait calls occupy both wait slots (the first is stalled in the harness)
        w1, w2 = text_message("wait 1"), text_message("wait 2")
        t1 = asyncio.ensure_future(send(client, ctx, w1))
        await eventually(node.fake.parked.is_set, what="stalled")
        t2 = asyncio.ensure_future(send(client, ctx, w2))
        await eventually(lambda: adm.waits == 2, what="both waits held")
        accepted += [w1.message_id, w2.message_id]
        over = await ct_client.send(node.url, alice.token, "third wait")
        assert (over.state, over.reason) == ("rejected", "too_many_waits")
        # open asks: two fit, the third is refused before acceptance
        for i in range(2):
            ask = text_message(f"ask {i}", kind="ask")
            await send(client, ctx, ask, return_immediately=True)
            accepted.append(ask.message_id)
        ask3 = await ct_client.send(node.url, alice.token, "ask 3", kind="ask",
                                    return_immediately=True)
        assert (ask3.state, ask3.reason) == ("rejected", "too_many_open_asks")
        # pending tasks: 4 open so far, one more fits, the next is refused
        fifth = text_message("fifth")
        await send(client, ctx, fifth, return_immediately=True)
        accepted.append(fifth.message_id)
        sixth = await ct_client.send(node.url, alice.token, "sixth", return_immediately=True)
        assert (sixth.state, sixth.reason) == ("rejected", "too_many_pending_tasks")
        listed = await client.list_tasks(pb.ListTasksRequest(), context=ctx)
        assert len(listed.tasks) == 5  # no task was created for any refusal
        refused = {over.message_id, ask3.message_id, sixth.message_id}
        assert not any(r.get("id") in refused for r in node.records())
        # every accepted message is durable (journaled submitted) while the receiver stalls
        for mid in accepted:
            assert node.message_records(mid)[0]["state"] == "submitted"
        gate.set()
        done1, done2 = await t1, await t2
        assert done1.status.state == done2.status.state == COMPLETED
        await eventually(lambda: len(node.fake.writes) == len(accepted), what="all written")
        # the slots came back
        assert (await ct_client.send(node.url, alice.token, "after")).state == "accepted"
    assert sorted(w.delivery.message.message_id for w in node.fake.writes[:5]) == sorted(
        accepted)
    node.journal.close()


# -- restart (seed 20, first half; R2 resume) ---------------------------------------------------


@pytest.mark.seed(20)
async def test_20_restart_get_task_answers_and_a_retry_injects_nothing(
        registry: Registry, agents: dict[str, Agent], tmp_path: Path) -> None:
    path = tmp_path / "bob.jsonl"
    alice = agents["alice"]
    gate = asyncio.Event()
    first = make_node(registry, agents["bob"], path)
    msg = text_message("before the crash")
    stalled, behind = text_message("in the harness at stop"), text_message("still queued")
    async with serving(first), sdk_client(first.url, alice.token) as (client, ctx):
        done = await send(client, ctx, msg)
        first.fake.default = Step(gate=gate)
        t_stalled = await send(client, ctx, stalled, return_immediately=True)
        await eventually(first.fake.parked.is_set, what="stalled in the harness")
        t_behind = await send(client, ctx, behind, return_immediately=True)
        first.lane.grace_seconds = 0.05
    first.journal.close()  # server stopped: the stalled dispatch was cut off mid-way
    assert first.fake.texts() == ["before the crash"]

    second = make_node(registry, agents["bob"], path)
    resumed = second.server.restore()
    assert [e.message_id for e in resumed] == [behind.message_id]
    async with serving(second), sdk_client(second.url, alice.token) as (client, ctx):
        got = await client.get_task(pb.GetTaskRequest(id=done.id), context=ctx)
        assert got.status.state == COMPLETED
        assert got.history[0].parts[0].text == "before the crash"
        retry = await send(client, ctx, msg)
        assert (retry.id, retry.status.state) == (done.id, COMPLETED)
        # R2: the first message that never got a dispatch lock is re-run and delivered once
        await eventually(lambda: second.fake.texts() == ["still queued"], what="resumed")
        resumed_task = await client.get_task(pb.GetTaskRequest(id=t_behind.id), context=ctx)
        assert resumed_task.status.state == COMPLETED
        # the one cut off after its claim is unknown, never re-injected, never completed
        cut = await client.get_task(pb.GetTaskRequest(id=t_stalled.id), context=ctx)
        assert cut.status.state == WORKING
        assert meta(cut)["crosstalk.state"] == "unknown"
        again = await send(client, ctx, stalled)
        assert again.id == t_stalled.id
        assert again.status.state == WORKING
    assert second.fake.texts() == ["still queued"]
    second.journal.close()


async def test_r2_a_continuation_stranded_by_a_restart_runs_once_when_retried(
        registry: Registry, agents: dict[str, Agent], tmp_path: Path) -> None:
    path = tmp_path / "bob.jsonl"
    alice = agents["alice"]
    first = make_node(registry, agents["bob"], path, dispatch_grace_seconds=0.05)
    ask = text_message("first question", kind="ask")
    cont = text_message("and a follow-up")
    async with serving(first), sdk_client(first.url, alice.token) as (client, ctx):
        task = await send(client, ctx, ask, return_immediately=True)
        await eventually(lambda: len(first.fake.writes) == 1, what="ask delivered")
        first.fake.default = Step(gate=asyncio.Event())  # the harness hangs from now on
        await send(client, ctx, text_message("blocker"), return_immediately=True)
        await eventually(first.fake.parked.is_set, what="blocker parked")
        cont.task_id = task.id
        await send(client, ctx, cont, return_immediately=True)  # waits in the lane
    first.journal.close()

    second = make_node(registry, agents["bob"], path)
    assert second.server.restore() == []  # a continuation is never resumed on its own
    async with serving(second), sdk_client(second.url, alice.token) as (client, ctx):
        assert second.receiver.entries[cont.message_id].state is MessageState.SUBMITTED
        again = await send(client, ctx, cont, return_immediately=True)  # the sender retries
        assert again.id == task.id
        await eventually(lambda: second.fake.texts() == ["and a follow-up"], what="re-run")
        await send(client, ctx, cont, return_immediately=True)  # and once more: a no-op
        got = await client.get_task(pb.GetTaskRequest(id=task.id), context=ctx)
    assert got.status.state == WORKING  # the ask is still open
    assert meta(got)["crosstalk.message_id"] == cont.message_id
    assert second.fake.texts() == ["and a follow-up"]
    second.journal.close()


async def test_restore_drops_old_terminal_tasks_and_keeps_open_ones(
        registry: Registry, agents: dict[str, Agent], tmp_path: Path) -> None:
    path = tmp_path / "bob.jsonl"
    first = make_node(registry, agents["bob"], path)
    async with serving(first):
        old = await ct_client.send(first.url, agents["alice"].token, "old news")
        ask = await ct_client.send(first.url, agents["alice"].token, "still open?",
                                   kind="ask", deadline_seconds=3600, until_delivered=True)
    first.journal.close()
    assert (old.task_state, ask.task_state, ask.state) == ("completed", "working", "accepted")
    second = make_node(registry, agents["bob"], path)
    later = second.receiver.clock() + 2 * 24 * 3600
    second.receiver.clock = lambda: later
    second.server.restore()
    assert old.task_id is not None
    assert ask.task_id is not None
    assert second.server.store.lookup(old.task_id) is None  # terminal, past retention
    kept = second.server.store.lookup(ask.task_id)
    assert kept is not None
    assert kept.state.value == "working"
    # its deadline passed while we were down: it expires once the server runs
    async with serving(second):
        await eventually(lambda: (s := second.server.store.lookup(ask.task_id)) is not None
                         and s.state.value == "failed", what="expired on start")
        got = await ct_client.get_task(second.url, agents["alice"].token, ask.task_id)
    assert (got.task_state, got.reason) == ("failed", "ask_expired")
    second.journal.close()


# -- the task journal records ---------------------------------------------------------------


async def test_every_task_change_is_a_journal_record(
        bob: Node, agents: dict[str, Agent]) -> None:
    result = await ct_client.send(bob.url, agents["alice"].token, "journal me")
    records = [r for r in bob.records() if r.get("subject") == "task"]
    states = [r["state"] for r in records if r["id"] == result.task_id]
    assert states == ["submitted", "working", "completed"]
    last = records[-1]
    assert last["subject"] == "task"
    assert last["owner"] == agents["alice"].agent_id
    assert last["refs"] == [result.message_id]
    assert last["task"]["id"] == result.task_id
    assert last["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    assert "history" not in last["task"]  # texts live in the message records
    # a message record precedes the task's first record (acceptance journaled first)
    order = [(r.get("subject"), r.get("state")) for r in bob.records()
             if r.get("id") in (result.message_id, result.task_id)]
    assert order[0] == ("message", "submitted")


async def test_a_second_server_on_one_socket_is_independent(
        registry: Registry, agents: dict[str, Agent], tmp_path: Path) -> None:
    """Two agents' listeners in one process: separate ports, cards, journals and tasks."""
    b = make_node(registry, agents["bob"], tmp_path / "b.jsonl")
    c = make_node(registry, agents["carol"], tmp_path / "c.jsonl")
    async with serving(b), serving(c):
        assert b.url != c.url
        rb = await ct_client.send(b.url, agents["alice"].token, "to bob", expect_name="bob")
        rc = await ct_client.send(c.url, agents["alice"].token, "to carol")
        wrong = await ct_client.send(c.url, agents["alice"].token, "x", expect_name="bob")
    assert (rb.state, rc.state) == ("accepted", "accepted")
    assert (wrong.state, wrong.reason) == ("unreachable", "peer_changed")
    assert b.fake.texts() == ["to bob"]
    assert c.fake.texts() == ["to carol"]
    assert b.server.store.lookup(rc.task_id or "") is None
    b.journal.close()
    c.journal.close()


async def test_stop_leaves_nothing_running(registry: Registry, agents: dict[str, Agent],
                                           tmp_path: Path) -> None:
    node = make_node(registry, agents["bob"], tmp_path / "b.jsonl")
    before = asyncio.all_tasks()
    url = await node.start()
    assert (await ct_client.send(url, agents["alice"].token, "hi")).state == "accepted"
    ask = await ct_client.send(url, agents["alice"].token, "q", kind="ask",
                               deadline_seconds=60, until_delivered=True)
    assert ask.state == "accepted"
    await node.stop()
    assert asyncio.all_tasks() - before == set()
    assert node.server.lane.armed == {}
    assert node.server.book.on_entry not in node.receiver.listeners
    result = await ct_client.send(url, agents["alice"].token, "anyone?")
    assert (result.state, result.reason) == ("unreachable", "connect_failed")
    node.journal.close()


def test_server_rejects_a_receiver_of_another_agent(registry: Registry,
                                                     agents: dict[str, Agent],
                                                     tmp_path: Path) -> None:
    node = make_node(registry, agents["bob"], tmp_path / "b.jsonl")
    with pytest.raises(ValueError, match="one agent"):
        A2AServer(receiver=node.receiver, registry=registry, agent_id=agents["alice"].agent_id,
                  name="alice", lane=node.lane)
    node.journal.close()


def test_journal_file_is_shared_with_the_receiver(registry: Registry, agents: dict[str, Agent],
                                                  tmp_path: Path) -> None:
    node = make_node(registry, agents["bob"], tmp_path / "b.jsonl")
    assert node.server.store.journal is node.receiver.journal
    assert isinstance(node.server.store.journal, Journal)
    node.journal.close()
