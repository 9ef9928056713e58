"""The watch's fold, pure: journal records in, the board's messages and changes out."""

from __future__ import annotations

from typing import Any

from crosstalk.core.message import Ingress, Sender
from crosstalk.core.records import (
    AskEnded,
    AskOpened,
    MessageChange,
    MessageFinal,
    MessageSubmitted,
    NativeSendAttempted,
    NativeSendEnded,
    ReceiptRecord,
    Record,
)
from crosstalk.core.states import AskState, MessageState
from crosstalk.watch.fold import REDACTED, MessageFold, redact
from crosstalk.watch.model import Board

BOB = "b0b0b0b0b0b0b0b0"
ALICE = Sender(agent_id="a11ce0a11ce0a11c", name="alice", ingress=Ingress.A2A)


class Stamp:
    """Gives records the ``seq``/``ts`` the journal would."""

    def __init__(self) -> None:
        self.seq = 0

    def __call__(self, rec: Record, ts: float = 1000.0) -> dict[str, Any]:
        self.seq += 1
        return {**rec.to_dict(), "seq": self.seq, "ts": ts + self.seq}


def fold(names: dict[str, str] | None = None) -> tuple[Board, MessageFold]:
    board = Board()
    return board, MessageFold(board, (names or {"b0b0b0b0b0b0b0b0": "bob"}).get)


def test_a_message_s_states_fold_in_order_each_a_change() -> None:
    board, f = fold()
    s = Stamp()
    changes = [c for r in (MessageSubmitted(id="m1", sender=ALICE, kind="ask", text="which?"),
                           MessageChange(id="m1", state=MessageState.DISPATCHING),
                           MessageChange(id="m1", state=MessageState.ACCEPTED,
                                         reason="injected"))
               for c in f.take(BOB, s(r), live=True)]
    assert [c.kind for c in changes] == ["message", "state", "state"]
    assert [c.data["state"] for c in changes] == ["submitted", "dispatching", "accepted"]
    view = board.messages["m1"]
    assert [st.state for st in view.steps] == ["submitted", "dispatching", "accepted"]
    assert [st.seq for st in view.steps] == [1, 2, 3]
    assert (view.sender_label, view.to_name, view.verified) == ("alice", "bob", True)
    assert changes[-1].line.endswith("alice → bob ask accepted (injected) «which?»")
    assert changes[0].data["text"] == "which?"
    assert "text" not in changes[1].data
    assert len(view.records) == 3


def test_an_ask_opens_with_its_deadline_then_is_answered() -> None:
    board, f = fold()
    s = Stamp()
    f.take(BOB, s(MessageSubmitted(id="m1", sender=ALICE, kind="ask", text="q")), live=True)
    opened = f.take(BOB, s(AskOpened(id="m1", deadline_at=5000.0)), live=True)
    assert board.messages["m1"].ask_deadline == 5000.0
    assert opened[0].kind == "ask"
    assert opened[0].data["ask"] == "open"
    answered = f.take(BOB, s(AskEnded(id="m1", state=AskState.ANSWERED, reply="42")),
                      live=True)
    view = board.messages["m1"]
    assert (view.ask_state, view.ask_deadline, view.reply_text) == ("answered", None, "42")
    assert answered[0].data["reply"] == "42"
    assert "«42»" in answered[0].line


def test_unverified_sender_final_arrivals_and_receipts() -> None:
    board, f = fold()
    s = Stamp()
    anon = Sender(agent_id=None, ingress=Ingress.UDS)
    f.take(BOB, s(MessageSubmitted(id="m1", sender=anon, text="from a script")), live=True)
    assert board.messages["m1"].sender_label == "unverified (uds)"
    assert not board.messages["m1"].verified
    f.take(BOB, s(MessageFinal(id="m2", state=MessageState.REJECTED, reason="policy",
                               sender=ALICE)), live=True)
    assert (board.messages["m2"].state, board.messages["m2"].reason) == ("rejected", "policy")
    got = f.take(BOB, s(ReceiptRecord(id="m1", status="dropped", reason="busy")), live=True)
    assert board.messages["m1"].receipt == "dropped:busy"
    assert got[0].kind == "receipt"


def test_a_record_of_an_unseen_message_is_dropped_at_start_and_shown_when_live() -> None:
    board, f = fold()
    s = Stamp()
    assert f.take(BOB, s(MessageChange(id="old", state=MessageState.ACCEPTED)),
                  live=False) == []
    assert "old" not in board.messages
    late = f.take(BOB, s(AskEnded(id="old2", state=AskState.EXPIRED)), live=True)
    assert late[0].data["ask"] == "expired"
    assert board.messages["old2"].sender_label == "(earlier)"


def test_native_sends_are_outbound_from_the_journal_s_agent() -> None:
    board, f = fold()
    s = Stamp()
    f.take(BOB, s(NativeSendAttempted(id="n1", to="claude:123", to_name="carol")), live=True)
    f.take(BOB, s(NativeSendEnded(id="n1", state=MessageState.ACCEPTED, to="claude:123")),
           live=True)
    view = board.messages["n1"]
    assert (view.sender_label, view.to_name, view.state) == ("bob", "carol", "accepted")


def test_unreadable_and_foreign_records_change_nothing() -> None:
    board, f = fold()
    assert f.take(BOB, {"subject": "message", "state": "flying", "id": "x"}, live=True) == []
    assert f.take(BOB, {"subject": "someone_else"}, live=True) == []
    assert not board.messages


def test_the_board_keeps_its_bound() -> None:
    board = Board(max_messages=3)
    f = MessageFold(board, {}.get)
    s = Stamp()
    for i in range(5):
        f.take(BOB, s(MessageSubmitted(id=f"m{i}", sender=ALICE, text="t")), live=True)
    assert list(board.messages) == ["m2", "m3", "m4"]


def test_secret_named_fields_are_redacted_in_what_is_kept() -> None:
    raw: dict[str, Any] = {"subject": "message",
                           "binding": {"auth_token": "s3cr3t", "endpoint": "/x"},
                           "list": [{"Authorization": "Bearer x"}]}
    out = redact(raw)
    assert out["binding"] == {"auth_token": REDACTED, "endpoint": "/x"}
    assert out["list"] == [{"Authorization": REDACTED}]
    assert raw["binding"]["auth_token"] == "s3cr3t"
