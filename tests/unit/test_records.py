"""The journal vocabulary: every kind round-trips, old shapes still read, junk is Unreadable."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from crosstalk.core.message import DeliveryMode, Ingress, Kind, Message, Sender
from crosstalk.core.records import (
    AskEnded,
    AskOpened,
    ClaimRecord,
    MessageChange,
    MessageFinal,
    MessageSubmitted,
    NativeSendAttempted,
    NativeSendEnded,
    NudgeRecord,
    ReceiptRecord,
    Record,
    ReplyEnded,
    ReplyStaged,
    TaskDeleted,
    TaskRecord,
    Unreadable,
    kind_of,
    links,
    parse_record,
)
from crosstalk.core.states import (
    AskState,
    ClaimStatus,
    MessageState,
    ReplyState,
    TaskState,
)

ALICE = Sender("a1a1a1a1a1a1a1a1", name="alice", role="primary", ingress=Ingress.A2A)
BINDING = {"harness": "fake", "session_ref": "s", "endpoint": None, "instance_id": "i"}

EVERY_KIND: list[Record] = [
    MessageSubmitted.of(Message("m1", ALICE, "hi", kind=Kind.ASK, task_id="t1",
                                in_reply_to="m0", deadline_seconds=5, hop_chain=("h",),
                                asserted={"from-name": "x"}, sent_at=12.5), BINDING),
    MessageFinal(id="m2", state=MessageState.REJECTED, reason="policy", sender=ALICE,
                 kind="command", binding=BINDING, task_id="t2"),
    MessageFinal(id="m3", state=MessageState.BOUNCED, reason="native_reply_not_forwarded",
                 sender=ALICE, native=True, text="the native reply"),
    MessageChange(id="m1", state=MessageState.ACCEPTED, reason=None, evidence="turn-7"),
    AskOpened(id="m1", deadline_at=1005.0, sender_key=ALICE.key, refs=("t1",)),
    AskEnded(id="m1", state=AskState.ANSWERED, reply="noon"),
    AskEnded(id="m4", state=AskState.EXPIRED),
    ReplyStaged(id="m1", reply_id="r1", text="noon", to=ALICE.agent_id, refs=("m1",)),
    ReplyEnded(id="m1", state=ReplyState.FORWARDED,
               result={"message_id": "r1", "state": "accepted", "reason": None,
                       "in_reply_to": "m1"}),
    ClaimRecord(id="agent", state=ClaimStatus.CLAIMED, owner="o", by="o", by_name="owner",
                op="claim", binding=BINDING),
    TaskRecord(id="t1", state=TaskState.WORKING, owner="o", refs=("m1",),
               task={"id": "t1", "status": {"state": "TASK_STATE_WORKING"}}),
    TaskDeleted(id="t1", refs=("m1",)),
    ReceiptRecord(id="m1", status="dropped", reason="rate_limited"),
    NativeSendAttempted(id="n1", to="claude:123", to_name="beta"),
    NativeSendEnded(id="n1", state=MessageState.QUEUED, to="claude:123", reason=None),
    NudgeRecord(peer="p", count=60),
]


@pytest.mark.parametrize("record", EVERY_KIND, ids=lambda r: type(r).__name__)
def test_every_kind_round_trips_with_one_discriminator(record: Record) -> None:
    stored = {**record.to_dict(), "seq": 7, "ts": 99.0}
    assert stored["subject"] == record.subject
    back = parse_record(stored)
    assert back == record
    assert (back.seq, back.ts) == (7, 99.0)
    # new records name their kind in ``subject`` only (``type`` is read, never written)
    assert "type" not in stored


def test_writers_keep_todays_shapes() -> None:
    """Readers outside core still read these keys; the written dicts keep them."""
    sub = EVERY_KIND[0].to_dict()
    assert sub["state"] == "submitted"
    assert sub["sender"] == {"key": ALICE.agent_id, "agent_id": ALICE.agent_id,
                             "name": "alice", "role": "primary", "ingress": "a2a",
                             "peer_pid": None, "reply_address": None}
    assert sub["refs"] == ["t1", "m0"]
    assert sub["hop_chain"] == ["h"]
    assert MessageChange(id="m", state=MessageState.UNKNOWN, reason="x").to_dict() == {
        "subject": "message", "id": "m", "state": "unknown", "reason": "x"}
    assert AskOpened(id="m", deadline_at=None, sender_key="k").to_dict() == {
        "subject": "ask", "id": "m", "state": "open", "deadline_at": None, "sender": "k",
        "refs": []}
    assert ClaimRecord(id="a", state=ClaimStatus.RELEASED).to_dict() == {
        "subject": "claim", "id": "a", "state": "released", "owner": None,
        "by": None, "by_name": None, "op": None, "previous": None, "binding": None}
    assert ReceiptRecord(id="m", status="held").to_dict() == {
        "subject": "receipt", "id": "m", "status": "held", "reason": None}


def test_legacy_type_only_records_still_read() -> None:
    assert parse_record({"type": "receipt", "id": "m", "status": "held", "reason": None,
                         "seq": 3}) == ReceiptRecord(id="m", status="held")
    assert parse_record({"type": "nudge", "peer": "x", "count": 30}) == NudgeRecord(
        peer="x", count=30)
    assert parse_record({"type": "task_deleted", "id": "t", "refs": ["m"]}) == TaskDeleted(
        id="t", refs=("m",))
    assert parse_record({"type": "native_send", "id": "n", "to": "c:1", "to_name": "b",
                         "state": "dispatching"}) == NativeSendAttempted(id="n", to="c:1",
                                                                         to_name="b")
    assert parse_record({"type": "claim", "subject": "claim", "id": "a", "state": "claimed",
                         "owner": "o"}) == ClaimRecord(id="a", state=ClaimStatus.CLAIMED,
                                                       owner="o")


def test_a_damaged_submitted_record_is_still_a_submitted_message() -> None:
    raw = EVERY_KIND[0].to_dict()
    del raw["text"]
    rec = parse_record(raw)
    assert isinstance(rec, MessageSubmitted)
    assert rec.message() is None  # restore re-checks it and rejects it
    raw = {**EVERY_KIND[0].to_dict(), "kind": "teleport"}
    rec = parse_record(raw)
    assert isinstance(rec, MessageSubmitted)
    assert rec.message() is None


def test_submitted_record_rebuilds_the_message() -> None:
    rec = parse_record(EVERY_KIND[0].to_dict())
    assert isinstance(rec, MessageSubmitted)
    msg = rec.message()
    assert msg == Message("m1", ALICE, "hi", kind=Kind.ASK, delivery=DeliveryMode.IMMEDIATE,
                          task_id="t1", in_reply_to="m0", deadline_seconds=5, hop_chain=("h",),
                          sent_at=12.5)


@pytest.mark.parametrize(("raw", "ours"), [
    ({"subject": "message", "id": "m", "state": "delivered"}, True),
    ({"subject": "message", "id": 7, "state": "accepted"}, True),
    ({"subject": "ask", "state": "open"}, True),
    ({"type": "receipt", "id": "m"}, True),
    ({"type": "nudge", "peer": "x"}, True),
    ({"type": "dedupe", "id": "m1", "refs": ["sender-a"]}, False),
    ({"n": 3}, False),
])
def test_unreadable_records(raw: dict[str, Any], ours: bool) -> None:
    rec = parse_record(raw)
    assert isinstance(rec, Unreadable)
    assert rec.ours is ours
    assert rec.raw is raw


def test_kind_reads_subject_then_type() -> None:
    assert kind_of({"subject": "task", "type": "task"}) == "task"
    assert kind_of({"type": "receipt"}) == "receipt"
    assert kind_of({"subject": 3, "type": "nudge"}) == "nudge"
    assert kind_of({}) is None


def test_links_read_what_retention_reads() -> None:
    link = links({"subject": "ask", "id": "m1", "state": "open", "refs": ["t1", "", 4],
                  "ts": 5})
    assert (link.subject, link.id, link.state, link.ts) == ("ask", "m1", "open", 5.0)
    assert link.ids() == ["m1", "t1"]
    assert links({"type": "route", "id": "", "refs": "t1"}).ids() == []


json_scalar = st.none() | st.booleans() | st.integers() | st.text(max_size=8)


@given(st.dictionaries(st.sampled_from(["subject", "type", "id", "state", "sender", "text",
                                        "kind", "refs", "seq", "ts", "reason", "status",
                                        "peer", "count", "reply", "result", "task"]),
                       json_scalar | st.sampled_from(["message", "ask", "reply", "claim",
                                                      "task", "receipt", "nudge",
                                                      "native_send", "task_deleted",
                                                      "submitted", "open", "pending"]),
                       max_size=8))
def test_parse_never_raises(raw: dict[str, Any]) -> None:
    rec = parse_record(raw)
    if not isinstance(rec, Unreadable):
        assert parse_record({**rec.to_dict(), "seq": rec.seq, "ts": rec.ts}) == rec


_texts = st.text(max_size=20)
_opt_texts = st.none() | st.text(max_size=12)


@given(st.builds(
    Message, message_id=st.text(min_size=1, max_size=12),
    sender=st.builds(Sender, agent_id=_opt_texts, name=_opt_texts, role=_opt_texts,
                     ingress=st.sampled_from(list(Ingress)),
                     peer_pid=st.none() | st.integers(1, 2 ** 22), reply_address=_opt_texts),
    text=_texts, kind=st.sampled_from(list(Kind)), delivery=st.sampled_from(list(DeliveryMode)),
    in_reply_to=_opt_texts, context_id=_opt_texts, task_id=_opt_texts,
    deadline_seconds=st.integers(0, 10 ** 6), hop_chain=st.lists(_texts, max_size=3).map(tuple),
    sent_at=st.none() | st.floats(allow_nan=False), continuation=st.booleans(),
    native=st.booleans(), asserted=st.dictionaries(_texts, _texts, max_size=3),
    repaired=st.lists(st.sampled_from(["text", "in_reply_to"]), max_size=2).map(tuple)),
    st.none() | st.dictionaries(_texts, _opt_texts, max_size=3))
def test_the_submitted_record_built_directly_is_the_record_of_the_dataclass(
        msg: Message, binding: dict[str, str | None] | None) -> None:
    assert MessageSubmitted.record_of(msg, binding) == MessageSubmitted.of(msg, binding).to_dict()
    assert list(MessageSubmitted.record_of(msg, binding)) == list(
        MessageSubmitted.of(msg, binding).to_dict())  # the same keys, in the journal's order
