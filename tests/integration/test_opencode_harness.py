"""The opencode harness against a fake opencode instance: a real HTTP server on a real unix
socket, with a real instance record (``tests/support/fakes/opencode_instance.py``).

Injection outcomes (accepted only on the event stream's evidence, queued with ``noReply``,
unknown without evidence, unreachable with why), live sessions from the event stream,
discovery statuses, and the stamp rules of the shim-side identifier.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from crosstalk.agent import Agent, AgentSpec
from crosstalk.core.ids import new_message_id
from crosstalk.core.message import DeliveryMode, Ingress, Kind, Message, Sender
from crosstalk.core.states import MessageState
from crosstalk.harness.base import (
    Binding,
    Delivery,
    Identity,
    LoadedHarness,
    Outcome,
    Receipt,
)
from crosstalk.harness.fake import FakeHarness
from crosstalk.harness.opencode import (
    HostedOpencodeIdentifier,
    OpencodeDiscovery,
    OpencodeHarness,
    OpencodeIdentifier,
    host_record,
    inject_at,
    parent_is_opencode,
)
from crosstalk.store.registry import Registry
from tests.support.fakes.opencode_instance import FakeOpencode
from tests.support.waiting import eventually

pytestmark = pytest.mark.anyio

ALICE = Sender(agent_id="a" * 16, name="alice", ingress=Ingress.A2A)
SCRIPT = Sender(agent_id=None, ingress=Ingress.UDS)
BINDING = Binding("opencode", "ses_x", None, "i")


def delivery(text: str, *, sender: Sender = ALICE, kind: Kind = Kind.INFORM,
             mode: DeliveryMode = DeliveryMode.IMMEDIATE) -> Delivery:
    return Delivery(Message(message_id=new_message_id(), sender=sender, text=text, kind=kind,
                            delivery=mode))


@pytest.fixture
async def fake(tmp_path: Path) -> AsyncIterator[FakeOpencode]:
    folder = tempfile.mkdtemp(prefix="ct-oc-", dir="/tmp")
    project = tmp_path / "project"
    project.mkdir()
    instance = await FakeOpencode(os.path.join(folder, "i.sock"), str(project),
                                  str(tmp_path / "state")).start()
    yield instance
    await instance.stop()
    shutil.rmtree(folder, ignore_errors=True)


def env_of(fake: FakeOpencode) -> dict[str, str]:
    return {"CROSSTALK_HOME": fake.state}


# -- injection -------------------------------------------------------------------------------


async def test_a_verified_immediate_message_is_accepted_on_evidence(fake: FakeOpencode) -> None:
    sid = fake.add_session("work")
    d = delivery("hello opencode", kind=Kind.ASK)
    out = await inject_at(fake.socket_path, sid, d)
    assert out.state is MessageState.ACCEPTED, out
    assert out.evidence is not None
    assert out.evidence.startswith("stored msg_")
    [prompt] = fake.prompts
    assert "noReply" not in prompt.body
    assert "tools" not in prompt.body  # it would rewrite the session's permissions
    visible, hint = prompt.body["parts"]
    assert "hello opencode" in visible["text"]
    assert visible["metadata"] == {"crosstalk": {"msg_id": d.message.message_id,
                                                 "from": "alice"}}
    assert hint["synthetic"] is True
    assert "crosstalk_reply" in hint["text"]
    assert d.message.message_id in hint["text"]


@pytest.mark.parametrize("d", [delivery("later", mode=DeliveryMode.NEXT_TURN),
                               delivery("from a script", sender=SCRIPT)],
                         ids=["next_turn", "unverified"])
async def test_next_turn_and_unverified_are_stored_without_waking(fake: FakeOpencode,
                                                                  d: Delivery) -> None:
    sid = fake.add_session("work")
    out = await inject_at(fake.socket_path, sid, d)
    assert out.state is MessageState.QUEUED, out
    assert fake.prompts[0].body["noReply"] is True
    assert sid not in fake.busy


async def test_a_204_without_evidence_is_unknown(fake: FakeOpencode) -> None:
    sid = fake.add_session("work")
    fake.behaviour.evidence = False
    out = await inject_at(fake.socket_path, sid, delivery("lost?"), evidence_timeout=0.5)
    assert out.state is MessageState.UNKNOWN
    assert out.reason == "opencode_no_evidence"


async def test_a_session_the_instance_lacks_is_unreachable(fake: FakeOpencode) -> None:
    out = await inject_at(fake.socket_path, "ses_gone", delivery("hi"))
    assert out.state is MessageState.UNREACHABLE
    assert out.reason == "opencode_session_not_found"


async def test_a_version_whose_routes_404_is_unreachable(fake: FakeOpencode) -> None:
    sid = fake.add_session("work")
    fake.behaviour.routes_missing = True
    out = await inject_at(fake.socket_path, sid, delivery("hi"))
    assert out.state is MessageState.UNREACHABLE
    assert out.reason == "opencode_route_missing"
    assert fake.prompts == []


async def test_an_instance_vanishing_mid_delivery_is_unknown(fake: FakeOpencode) -> None:
    sid = fake.add_session("work")
    fake.behaviour.vanish_on_prompt = True
    out = await inject_at(fake.socket_path, sid, delivery("hi"), evidence_timeout=2)
    assert out.state is MessageState.UNKNOWN  # it was sent: never taken for refused
    assert out.reason == "opencode_no_answer"


async def test_an_instance_gone_after_the_204_is_unknown(fake: FakeOpencode) -> None:
    sid = fake.add_session("work")
    fake.behaviour.vanish_after_prompt = True
    out = await inject_at(fake.socket_path, sid, delivery("hi"))
    assert out.state is MessageState.UNKNOWN
    assert out.reason == "opencode_instance_gone"


async def test_a_version_without_prompt_async_is_unreachable(fake: FakeOpencode) -> None:
    sid = fake.add_session("work")
    fake.behaviour.prompt_route_missing = True
    out = await inject_at(fake.socket_path, sid, delivery("hi"))
    assert out.state is MessageState.UNREACHABLE
    assert out.reason == "opencode_route_missing"


async def test_an_instance_gone_before_sending_is_unreachable(fake: FakeOpencode) -> None:
    sid = fake.add_session("work")
    harness = OpencodeHarness(sid, lambda: host_record(env_of(fake), fake.pid, fake.directory))
    ok = await harness.inject(BINDING, delivery("first"))
    assert ok.state is MessageState.ACCEPTED
    await fake.stop()
    out = await harness.inject(BINDING, delivery("second"))
    assert out.state is MessageState.UNREACHABLE
    assert out.reason == "opencode_instance_gone:no_record"
    direct = await inject_at(fake.socket_path, sid, delivery("third"))
    assert direct.state is MessageState.UNREACHABLE
    assert direct.reason == "opencode_unreachable"


async def test_a_turn_aborted_before_an_answer_is_reported(fake: FakeOpencode) -> None:
    sid = fake.add_session("work")
    fake.behaviour.abort_next = True
    out = await inject_at(fake.socket_path, sid, delivery("stop me"))
    assert out.state is MessageState.ACCEPTED
    assert out.reason == "opencode_aborted_before_answer"


# -- after the grace: the follow-up watches the turn -----------------------------------------


async def _held(fake: FakeOpencode, text: str) -> tuple[str, Delivery, Outcome]:
    """A message injected into a session whose tool loop is still running."""
    fake.behaviour.hold_turns = True
    sid = fake.add_session("looping")
    fake.start_step(sid)
    d = delivery(text)
    out = await inject_at(fake.socket_path, sid, d, answer_grace=0.1)
    assert (out.state, out.reason) == (MessageState.ACCEPTED, None), out
    assert out.follow_up is not None  # the loop has not taken it yet
    return sid, d, out


async def test_a_loop_aborted_after_the_grace_is_reported_by_the_follow_up(
        fake: FakeOpencode) -> None:
    sid, d, out = await _held(fake, "read me at your next step")
    assert out.follow_up is not None
    watch = asyncio.ensure_future(out.follow_up())
    await asyncio.sleep(0.3)
    assert not watch.done()  # still watching: the loop may take it
    fake.abort(sid)
    receipt = await asyncio.wait_for(watch, 10)
    assert receipt == Receipt(d.message.message_id, "unanswered",
                              "opencode_aborted_before_answer", frame_id=receipt.frame_id)
    assert receipt.frame_id is not None
    assert receipt.frame_id.startswith("msg_")


async def test_a_loop_that_takes_the_message_later_reports_nothing(fake: FakeOpencode) -> None:
    sid, _, out = await _held(fake, "read me at your next step")
    assert out.follow_up is not None
    watch = asyncio.ensure_future(out.follow_up())
    await asyncio.sleep(0.2)
    fake.finish_step(sid)  # one more step, which reads it
    assert await asyncio.wait_for(watch, 10) is None


async def test_the_follow_up_reads_what_happened_before_it_started(fake: FakeOpencode) -> None:
    # The agent starts the follow-up after the injector's watch closed its stream: an abort
    # in between is read from the session as stored, not missed.
    sid, _, out = await _held(fake, "aborted in the gap")
    fake.abort(sid)
    assert out.follow_up is not None
    receipt = await asyncio.wait_for(out.follow_up(), 10)
    assert receipt is not None
    assert (receipt.status, receipt.reason) == ("unanswered", "opencode_aborted_before_answer")
    sid2, _, out2 = await _held(fake, "taken in the gap")
    fake.finish_step(sid2)
    assert out2.follow_up is not None
    assert await asyncio.wait_for(out2.follow_up(), 10) is None
    sid3, _, out3 = await _held(fake, "the loop ended without it")
    fake.set_busy(sid3, False)  # opencode's [?] window: the loop exited without a new step
    assert out3.follow_up is not None
    receipt3 = await asyncio.wait_for(out3.follow_up(), 10)
    assert receipt3 is not None
    assert receipt3.reason == "opencode_turn_ended_unanswered"


async def test_an_abort_between_the_follow_ups_two_reads_is_an_abort(
        fake: FakeOpencode) -> None:
    # The messages are read, then the user aborts, then the status would show idle: read in
    # that order, the abort looked like a loop that ended without the message (CI saw it).
    _, d, out = await _held(fake, "aborted while the follow-up reads")
    fake.behaviour.abort_after_messages_read = True
    assert out.follow_up is not None
    receipt = await asyncio.wait_for(out.follow_up(), 10)
    assert receipt is not None
    assert (receipt.message_id, receipt.reason) == (d.message.message_id,
                                                    "opencode_aborted_before_answer")


async def test_a_follow_up_whose_instance_goes_away_says_nothing(fake: FakeOpencode) -> None:
    _, _, out = await _held(fake, "then opencode quits")
    assert out.follow_up is not None
    watch = asyncio.ensure_future(out.follow_up())
    await asyncio.sleep(0.2)
    await fake.stop()
    assert await asyncio.wait_for(watch, 10) is None
    assert await asyncio.wait_for(out.follow_up(), 10) is None  # nothing to connect to


async def test_no_follow_up_when_the_grace_settled_it(fake: FakeOpencode) -> None:
    sid = fake.add_session("idle")
    woke = await inject_at(fake.socket_path, sid, delivery("wake up"))
    assert woke.follow_up is None  # answered within the grace
    queued = await inject_at(fake.socket_path, sid,
                             delivery("later", mode=DeliveryMode.NEXT_TURN))
    assert queued.state is MessageState.QUEUED
    assert queued.follow_up is None  # no turn to watch


async def test_an_agent_journals_the_late_abort_as_a_receipt(fake: FakeOpencode,
                                                             tmp_path: Path) -> None:
    """End to end in one agent: the injector answers ``accepted`` at once; the abort a
    second later is journaled and shown in the mailbox, the state unchanged."""
    fake.behaviour.hold_turns = True
    sid = fake.add_session("looping")
    fake.start_step(sid)
    env = {**env_of(fake), "XDG_RUNTIME_DIR": tempfile.mkdtemp(prefix="ct-rt-", dir="/tmp")}
    reg = Registry(tmp_path / "agents")
    harness = OpencodeHarness(sid, lambda: host_record(env_of(fake), fake.pid, fake.directory))
    bob = Agent(reg, AgentSpec(harness, sid, fake.directory, "bob"), env=env)
    alice = Agent(reg, AgentSpec(FakeHarness(name="fake"), "sess-a", "/w", "alice"), env=env)
    await bob.start()
    await alice.start()
    try:
        sent = await alice.send("bob", "read me at your next step", until_delivered=True)
        assert sent.state == "accepted"
        await eventually(lambda: any(e.message_id == sent.message_id and e.receipt is None
                                     for e in bob.mailbox()), what="the message in the mailbox")
        fake.abort(sid)

        def receipt() -> str | None:
            return next((e.receipt for e in bob.mailbox()
                         if e.message_id == sent.message_id), None)

        await eventually(lambda: receipt() is not None, what="the receipt")
        assert receipt() == "unanswered:opencode_aborted_before_answer"
        assert bob.receiver is not None
        assert bob.receiver.entries[sent.message_id].state is MessageState.ACCEPTED
    finally:
        await alice.stop()
        await bob.stop()
    assert not [t for t in asyncio.all_tasks() if "follow-up" in t.get_name()]


async def test_reconcile_finds_the_stored_message(fake: FakeOpencode) -> None:
    sid = fake.add_session("work")
    harness = OpencodeHarness(sid, lambda: host_record(env_of(fake), fake.pid, fake.directory))
    fake.behaviour.evidence = True
    d = delivery("find me")
    await inject_at(fake.socket_path, sid, d)
    found = await harness.reconcile(BINDING, d.message.message_id)
    assert found is not None
    assert found.state is MessageState.ACCEPTED
    assert await harness.reconcile(BINDING, new_message_id()) is None


# -- discovery -------------------------------------------------------------------------------


async def test_discovery_lists_live_root_sessions_with_status(fake: FakeOpencode) -> None:
    idle = fake.add_session("idle-one")
    busy = fake.add_session("busy-one")
    waiting = fake.add_session("waiting-one")
    fake.add_session("sub (@general subagent)", parent=busy)
    old = fake.add_session("stored-long-ago")
    fake.sessions[old]["time"]["updated"] = 1000  # before this process published
    fake.set_busy(busy, True)
    fake.set_busy(waiting, True)
    fake.ask_permission(waiting)
    rows = {s.name: s for s in await OpencodeDiscovery(env_of(fake)).discover_async()}
    assert set(rows) == {"idle-one", "busy-one", "waiting-one"}
    assert rows["idle-one"].status == "idle"
    assert rows["busy-one"].status == "busy"
    assert rows["waiting-one"].status == "waiting"
    assert rows["waiting-one"].detail == "bash"
    assert rows["idle-one"].session_ref == idle
    assert rows["idle-one"].pid == fake.pid
    out = await OpencodeDiscovery(env_of(fake)).send_native(rows["idle-one"],
                                                            delivery("native inform"))
    assert out.state is MessageState.ACCEPTED
    assert fake.texts(idle)[0].endswith("</peer-message>")


async def test_a_socket_that_is_not_opencodes_lists_nothing(fake: FakeOpencode) -> None:
    fake.add_session("work")
    fake.behaviour.not_opencode = True
    assert await OpencodeDiscovery(env_of(fake)).discover_async() == []


# -- the shim side ---------------------------------------------------------------------------


def test_the_parent_must_be_opencode() -> None:
    assert parent_is_opencode({"OPENCODE": "1", "OPENCODE_PID": "42"}, 42)
    assert not parent_is_opencode({"OPENCODE": "1", "OPENCODE_PID": "42"}, 43)
    assert not parent_is_opencode({"OPENCODE_PID": "42"}, 42)
    assert not parent_is_opencode({"OPENCODE": "1", "OPENCODE_PID": "1"}, 1)


def test_stamps_bind_only_under_opencode() -> None:
    stamp = {"sessionID": "ses_abc123", "callID": "call_1"}
    outside = LoadedHarness.of(OpencodeIdentifier())
    assert outside.arguments is not None
    assert outside.live is None
    assert outside.arguments.identify_stamped(None, stamp) is None
    hosted = HostedOpencodeIdentifier(cwd="/p", ppid=42)
    loaded = LoadedHarness.of(hosted)
    assert loaded.live is not None
    got = hosted.identify_stamped(None, stamp)
    assert got == Identity("opencode", "ses_abc123", "/p", harness_pid=42)
    for bad in (None, "ses_abc123", {"sessionID": "abc"}, {"sessionID": 7},
                {"sessionID": "ses_" + "x" * 100}, {"sessionID": "ses_a/../b"}):
        assert hosted.identify_stamped(None, bad) is None, bad
    hosted.sessions.children["ses_child1"] = "ses_abc123"
    sub = hosted.identify_stamped(None, {"sessionID": "ses_child1"})
    assert sub is not None
    assert sub.session_ref == "ses_abc123"  # a sub-agent's call is its root session's


async def test_a_sub_agent_the_stream_has_not_shown_is_bound_to_its_root(
        fake: FakeOpencode) -> None:
    root = fake.add_session("root", emit=False)
    child = fake.add_session(parent=root, emit=False)
    grandchild = fake.add_session(parent=child, emit=False)
    ident = HostedOpencodeIdentifier(env=env_of(fake), cwd=fake.directory, ppid=fake.pid)
    # in a worker thread, as the roster asks it; nothing learned from the stream yet
    got = await asyncio.to_thread(ident.identify_stamped, None, {"sessionID": grandchild})
    assert got is not None
    assert got.session_ref == root
    assert ident.sessions.children == {grandchild: child, child: root}
    alone = fake.add_session("alone", emit=False)
    got = await asyncio.to_thread(ident.identify_stamped, None, {"sessionID": alone})
    assert got is not None
    assert got.session_ref == alone  # the host says it has no parent: its own
    for bad in ("../ses_x", 7, "", "ses_" + "x" * 100):  # a parent that is not a session id
        odd = fake.add_session("odd", emit=False)
        fake.sessions[odd]["parentID"] = bad
        got = await asyncio.to_thread(ident.identify_stamped, None, {"sessionID": odd})
        assert got is not None
        assert got.session_ref == odd, bad
        assert odd not in ident.sessions.children
    await fake.stop(unpublish=False)  # the host cannot answer: the call is still bound
    got = await asyncio.to_thread(ident.identify_stamped, None, {"sessionID": "ses_unseen1"})
    assert got is not None
    assert got.session_ref == "ses_unseen1"


async def test_live_sessions_follow_the_event_stream(fake: FakeOpencode) -> None:
    stored = fake.add_session("stored before", emit=False)
    fake.sessions[stored]["time"]["updated"] = 1000  # before this process published
    busy = fake.add_session("busy at start", emit=False)
    fake.sessions[busy]["time"]["updated"] = 1000
    fake.busy.add(busy)
    used = fake.add_session("used before the shim", emit=False)  # updated after publishing
    ident = HostedOpencodeIdentifier(env=env_of(fake), cwd=fake.directory, ppid=fake.pid)
    sets: list[Sequence[Identity]] = []

    async def follow() -> None:
        async for found in ident.live_sessions():
            sets.append(found)

    def names() -> set[str | None]:
        return {i.session_name for i in sets[-1]} if sets else {"<none yet>"}

    task = asyncio.ensure_future(follow())
    try:
        await eventually(lambda: names() == {"busy at start", "used before the shim"},
                         what="the busy session and the one used since the record")
        fresh = fake.add_session()  # a placeholder title: named by its slug
        await eventually(lambda: len(names()) == 3, what="a created session")
        assert fake.sessions[fresh]["slug"] in names()
        fake.add_session("helper", parent=fresh)
        fake.set_busy(stored, True)  # a stored session used here becomes live
        await eventually(lambda: names() == {"busy at start", fake.sessions[fresh]["slug"],
                                             "stored before", "used before the shim"},
                         what="a used session")
        fake.rename(fresh, "named now")
        await eventually(lambda: "named now" in names(), what="a rename")
        fake.delete(busy)
        await eventually(lambda: "busy at start" not in names(), what="a deletion")
        assert all(i.harness_pid == fake.pid for i in sets[-1])
        assert used in {i.session_ref for i in sets[-1]}
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_password_is_used_and_never_shown(fake: FakeOpencode) -> None:
    sid = fake.add_session("work")
    fake.behaviour.password = "s3cret-pw"
    out = await inject_at(fake.socket_path, sid, delivery("no password"))
    assert out.state is MessageState.UNREACHABLE
    assert out.reason == "opencode_auth_required"
    env = {**env_of(fake), "OPENCODE_SERVER_PASSWORD": "s3cret-pw"}
    ok = await inject_at(fake.socket_path, sid, delivery("with password"), env=env)
    assert ok.state is MessageState.ACCEPTED
    wrong = {**env_of(fake), "OPENCODE_SERVER_PASSWORD": "wrong-pw"}
    rows = await OpencodeDiscovery(wrong).discover_async()
    assert rows == []
    for outcome in (out, ok):
        assert "s3cret" not in f"{outcome}"
