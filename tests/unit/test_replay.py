"""Replay folds records through the one state table: an illegal sequence is reported, not
adopted (issue 11 acceptance), while what retention and damage legitimately leave replays."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from crosstalk.a2a.taskreplay import TaskReplay
from crosstalk.a2a.taskstore import JournalTaskStore
from crosstalk.agent.claims import claim_state
from crosstalk.agent.replies import reply_state
from crosstalk.core.message import Ingress, Kind, Message, Sender
from crosstalk.core.records import (
    AskOpened,
    MessageChange,
    MessageSubmitted,
    ReplyStaged,
    TaskDeleted,
    TaskRecord,
)
from crosstalk.core.replay import Folder, audit, fold
from crosstalk.core.states import AskState, MessageState, ReplyState, TaskState
from crosstalk.harness.base import Binding
from crosstalk.harness.fake import FakeHarness
from crosstalk.receiver import Receiver, message_record
from crosstalk.store.journal import Journal
from crosstalk.store.journal_read import audit_journal

M = MessageState
ALICE = Sender("a1" * 8, name="alice", ingress=Ingress.A2A)
BINDING = Binding(harness="fake", session_ref="session-1", endpoint="endpoint-1",
                  instance_id="instance-1")


def submitted(mid: str, seq: int, kind: Kind = Kind.INFORM) -> dict[str, Any]:
    rec = MessageSubmitted.of(Message(mid, ALICE, "hello", kind=kind), BINDING.as_record())
    return {**rec.to_dict(), "seq": seq, "ts": 1000.0 + seq}


def change(mid: str, state: MessageState, seq: int) -> dict[str, Any]:
    return {**MessageChange(id=mid, state=state).to_dict(), "seq": seq, "ts": 1000.0 + seq}


def opened(mid: str, seq: int) -> dict[str, Any]:
    return {**AskOpened(id=mid, sender_key=ALICE.key).to_dict(), "seq": seq}


def numbered(*records: dict[str, Any]) -> list[dict[str, Any]]:
    return [{**r, "seq": i} for i, r in enumerate(records, 1)]


# -- the fold -------------------------------------------------------------------------------


def test_a_legal_life_folds_without_report() -> None:
    records = [submitted("m1", 1, Kind.ASK), change("m1", M.DISPATCHING, 2),
               change("m1", M.ACCEPTED, 3), opened("m1", 4),
               {"subject": "ask", "id": "m1", "state": "answered", "reply": "noon", "seq": 5},
               {**ReplyStaged(id="m1", reply_id="r").to_dict(), "seq": 6},
               {"subject": "reply", "id": "m1", "state": "forwarded", "result": {}, "seq": 7},
               {"type": "nudge", "peer": "x", "count": 30, "seq": 8},
               {"type": "receipt", "id": "m1", "status": "held", "reason": None, "seq": 9}]
    folded = fold(records)
    assert folded.violations == []
    assert folded.state("message", "m1") == M.ACCEPTED
    assert folded.state("ask", "m1") == AskState.ANSWERED
    assert folded.state("reply", "m1") == ReplyState.FORWARDED


@pytest.mark.parametrize(("records", "kept", "claimed"), [
    # accepted -> submitted: a second first record for a delivered message
    ([submitted("m1", 1), change("m1", M.DISPATCHING, 2), change("m1", M.ACCEPTED, 3),
      submitted("m1", 4)], "accepted", "submitted"),
    # an outcome for a message never submitted (nothing is missing before it)
    ([submitted("other", 1), change("m1", M.ACCEPTED, 2)], None, "accepted"),
    # an outcome without the dispatch lock
    ([submitted("m1", 1), change("m1", M.ACCEPTED, 2)], "submitted", "accepted"),
    # an ambiguous dispatch resent
    ([submitted("m1", 1), change("m1", M.DISPATCHING, 2), change("m1", M.UNKNOWN, 3),
      change("m1", M.DISPATCHING, 4)], "unknown", "dispatching"),
])
def test_illegal_sequences_are_reported_not_adopted(records: list[dict[str, Any]],
                                                    kept: str | None, claimed: str) -> None:
    folded = fold(records)
    [v] = folded.violations
    assert (v.subject, v.id, v.kept, v.state, v.seq) == ("message", "m1", kept, claimed,
                                                         records[-1]["seq"])
    assert "not allowed" in v.reason or "cannot start" in v.reason
    assert folded.state("message", "m1") == kept, "the subject keeps its last legal state"
    assert str(v).startswith(f"seq {v.seq}: message m1: ")


def test_an_ask_opens_only_for_a_delivered_message() -> None:
    records = [submitted("m1", 1, Kind.ASK), change("m1", M.DISPATCHING, 2),
               change("m1", M.UNREACHABLE, 3), opened("m1", 4), opened("ghost", 5)]
    violations = audit(records)
    assert [(v.subject, v.id, v.kept) for v in violations] == [("ask", "m1", None),
                                                               ("ask", "ghost", None)]
    assert "opened while its message is 'unreachable'" in violations[0].reason


def test_retention_s_trimmed_heads_still_replay() -> None:
    """Retention drops the old head of a resolved subject; seq shows records are missing."""
    records = [change("m1", M.ACCEPTED, 41), submitted("m2", 42), change("m2", M.DISPATCHING, 43)]
    folded = fold(records)
    assert folded.violations == []
    assert folded.state("message", "m1") == M.ACCEPTED


def test_a_damaged_line_between_two_records_widens_the_check_only_to_reachable() -> None:
    # seq 2 (the dispatch lock) did not decode: accepted is still reachable from submitted
    assert audit([submitted("m1", 1), change("m1", M.ACCEPTED, 3)]) == []
    # ... but no lost record makes accepted -> submitted possible
    [v] = audit([submitted("m1", 1), change("m1", M.DISPATCHING, 2),
                 change("m1", M.ACCEPTED, 3), submitted("m1", 5)])
    assert (v.kept, v.state) == ("accepted", "submitted")
    # a gap before this subject's last record does not excuse its next move
    [v] = audit([submitted("x", 1), submitted("m1", 3), change("m1", M.ACCEPTED, 4)])
    assert (v.id, v.kept) == ("m1", "submitted")


def test_a_task_may_repeat_its_state_and_start_again_after_deletion() -> None:
    def task(state: TaskState) -> dict[str, Any]:
        return TaskRecord(id="t1", state=state, owner="o").to_dict()
    records = numbered(task(TaskState.SUBMITTED), task(TaskState.WORKING),
                       task(TaskState.WORKING), task(TaskState.COMPLETED),
                       TaskDeleted(id="t1").to_dict(), task(TaskState.SUBMITTED))
    assert audit(records) == []
    [v] = audit(numbered(task(TaskState.SUBMITTED), task(TaskState.COMPLETED),
                         task(TaskState.WORKING)))
    assert (v.subject, v.kept, v.state) == ("task", "completed", "working")


def test_foreign_and_unreadable_records() -> None:
    folded = fold(numbered({"type": "dedupe", "id": "m1", "refs": ["a"]},
                           {"subject": "message", "id": "m1", "state": "delivered"},
                           {"n": 1}))
    assert folded.violations == []
    assert [u.raw.get("state") for u in folded.unreadable] == ["delivered"]


def test_folder_steps_return_the_typed_record() -> None:
    folder = Folder()
    rec, violation = folder.step(submitted("m1", 1))
    assert isinstance(rec, MessageSubmitted)
    assert violation is None
    _, violation = folder.step(submitted("m1", 2))
    assert violation is not None


# -- the receiver's restore -----------------------------------------------------------------


def _receiver(path: Path) -> tuple[Journal, Receiver]:
    journal = Journal(path)
    return journal, Receiver("ab" * 8, journal, FakeHarness(), BINDING,
                             reply_address="/tmp/s/me.sock", clock=lambda: 2000.0)


@pytest.mark.damaged_journal  # written by hand to test what replay does with it
def test_restore_reports_an_illegal_sequence_and_does_not_adopt_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "agent.jsonl"
    with Journal(path) as j:
        msg = Message("m1", ALICE, "hello")
        j.append(message_record(msg, BINDING))
        j.append(MessageChange(id="m1", state=M.DISPATCHING).to_dict())
        j.append(MessageChange(id="m1", state=M.ACCEPTED).to_dict())
        j.append(message_record(msg, BINDING))  # accepted -> submitted: illegal
        j.append(MessageChange(id="m2", state=M.ACCEPTED).to_dict())  # never submitted
    journal, receiver = _receiver(path)
    with journal, caplog.at_level(logging.WARNING, logger="crosstalk.receiver"):
        assert receiver.restore(journal.replay().records) == []
        entry = receiver.entries["m1"]
        assert entry.state is M.ACCEPTED, "the illegal record is not adopted"
        assert entry.message is None, "so nothing is resumed or re-injected"
        assert "m2" not in receiver.entries
        assert [(v.id, v.kept, v.state) for v in receiver.replay_violations] == [
            ("m1", "accepted", "submitted"), ("m2", None, "accepted")]
        assert caplog.text.count("journal record not adopted") == 2
    assert [(v.id, v.seq) for v in audit_journal(path)] == [("m1", 4), ("m2", 5)]


async def test_a_journal_the_receiver_wrote_audits_clean(tmp_path: Path) -> None:
    path = tmp_path / "agent.jsonl"
    journal, receiver = _receiver(path)
    with journal:
        await receiver.receive(Message("m1", ALICE, "hello", kind=Kind.ASK,
                                       deadline_seconds=5))
        receiver.close_ask("m1", AskState.ANSWERED, "noon")
        await receiver.admit(Message("m2", ALICE, "later"))
        assert receiver.cancel("m2")
        await receiver.receive(Message("m3", ALICE, "x" * 10, hop_chain=(receiver.hop_token,)))
    assert audit_journal(path) == []
    journal, receiver = _receiver(path)
    with journal:
        receiver.restore(journal.replay().records)
        assert receiver.replay_violations == []
        assert receiver.entries["m1"].ask is AskState.ANSWERED
        assert receiver.entries["m3"].state is M.REJECTED


pytestmark = pytest.mark.anyio


def test_a_journal_in_the_shapes_older_writers_use_replays_clean(tmp_path: Path) -> None:
    """The dict literals agent.py, a2a/taskstore.py and mcp_tools.py wrote before every
    writer built its records through core/records (kinds named by ``type``, some by both)."""
    binding = BINDING.as_record()
    records = numbered(
        submitted("m1", 0, Kind.ASK), change("m1", M.DISPATCHING, 0),
        change("m1", M.ACCEPTED, 0),
        {"subject": "ask", "id": "m1", "state": "open", "deadline_at": None,
         "sender": ALICE.key, "refs": ["t1"]},
        {"type": "task", "subject": "task", "id": "t1", "state": "submitted", "owner": "o",
         "refs": ["m1"], "task": {"id": "t1"}},
        {"type": "task", "subject": "task", "id": "t1", "state": "working", "owner": "o",
         "refs": ["m1"], "task": {"id": "t1"}},
        {"type": "receipt", "id": "m1", "status": "delivered", "reason": None},
        {"subject": "reply", "id": "m1", "state": "pending", "reply_id": "r1", "text": "noon",
         "to": ALICE.agent_id, "refs": ["m1"]},
        {"subject": "ask", "id": "m1", "state": "answered", "reply": "noon"},
        {"subject": "reply", "id": "m1", "state": "forwarded",
         "result": {"message_id": "r1", "state": "accepted", "reason": None,
                    "in_reply_to": "m1"}},
        {"type": "task", "subject": "task", "id": "t1", "state": "completed", "owner": "o",
         "refs": ["m1"], "task": {"id": "t1"}},
        {"type": "claim", "subject": "claim", "id": "me", "state": "claimed", "owner": "o",
         "by": "o", "by_name": "owner", "op": "claim", "previous": None, "binding": binding},
        {"type": "claim", "subject": "claim", "id": "me", "state": "released", "owner": None,
         "by": "o", "by_name": "owner", "op": "release", "previous": "o", "binding": binding},
        {"type": "native_send", "id": "n1", "to": "claude:1", "to_name": "b",
         "state": "dispatching"},
        {"type": "native_send", "id": "n1", "to": "claude:1", "state": "queued",
         "reason": None},
        {"type": "nudge", "peer": "p", "count": 30},
        {"type": "task_deleted", "id": "t1", "refs": ["m1"]},
    )
    folded = fold(records)
    assert folded.violations == []
    assert folded.unreadable == []
    assert folded.state("claim", "me") == "released"
    assert folded.state("native_send", "n1") == "queued"
    assert folded.state("task", "t1") is None, "deleted"
    # ... and the agent's readers read those shapes as before
    assert claim_state(records, (BINDING.harness, BINDING.session_ref)).owner is None
    assert claim_state(records[:-5], (BINDING.harness, BINDING.session_ref)).owner == "o"
    progress = reply_state(records)["m1"]
    assert (progress.reply_id, progress.text, progress.to, progress.state) == (
        "r1", "noon", ALICE.agent_id, ReplyState.FORWARDED)
    assert progress.result["state"] == "accepted"
    legacy_task = {"type": "task", "subject": "task", "id": "t2", "state": "submitted",
                   "owner": "o", "refs": ["m9"], "seq": 1,
                   "task": {"id": "t2", "status": {"state": "TASK_STATE_SUBMITTED"}}}
    with Journal(tmp_path / "agent.jsonl") as journal:
        store = JournalTaskStore(journal, clock=lambda: 1000.0)
        (kept,) = store.load(TaskReplay.of([legacy_task]), now=1000.0)
        assert (kept.task.id, kept.owner, kept.refs) == ("t2", "o", ["m9"])
        deleted = {"type": "task_deleted", "id": "t2", "refs": ["m9"], "seq": 2}
        assert store.load(TaskReplay.of([legacy_task, deleted]), now=1000.0) == []


def test_the_task_store_reports_an_illegal_task_sequence_and_does_not_adopt_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    def task(state: TaskState) -> dict[str, Any]:
        return TaskRecord(id="t1", state=state, owner="o", refs=("m1",),
                          task={"id": "t1", "status": {"state": f"TASK_STATE_{state.name}"}}
                          ).to_dict()

    records = numbered(submitted("m1", 0), task(TaskState.SUBMITTED),
                       task(TaskState.COMPLETED), task(TaskState.WORKING))
    with (Journal(tmp_path / "agent.jsonl") as journal,
          caplog.at_level(logging.WARNING, logger="crosstalk.a2a.taskstore")):
        store = JournalTaskStore(journal, clock=lambda: 1000.0)
        (kept,) = store.load(TaskReplay.of(records), now=1000.0)
    assert kept.state is TaskState.COMPLETED, "completed -> working is not adopted"
    assert "not adopting task record" in caplog.text
    assert "'completed' -> 'working' is not allowed" in caplog.text
