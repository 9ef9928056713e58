"""Claims without sockets: the control metadata, the journal's claim state and its retention."""

from __future__ import annotations

from typing import Any

import pytest

from crosstalk.a2a import wire
from crosstalk.agent.claims import claim_state
from crosstalk.core import retention
from crosstalk.core.policy import PRIMARY, SUBAGENT, ControlResult
from crosstalk.core.records import CLAIM
from crosstalk.core.states import ClaimStatus, check_transition, is_unresolved

TARGET = "aaaaaaaaaaaaaaaa"
OWNER = "bbbbbbbbbbbbbbbb"
OTHER = "cccccccccccccccc"
SESSION = ("codex", "thread-1")
DAY = 24 * 3600.0


def claim(owner: str | None, *, session: tuple[str, str] | None = SESSION,
          ts: float = 0.0) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "type": CLAIM, "subject": "claim", "id": TARGET, "owner": owner, "ts": ts,
        "state": (ClaimStatus.CLAIMED if owner else ClaimStatus.RELEASED).value}
    if session is not None:
        rec["binding"] = {"harness": session[0], "session_ref": session[1],
                          "endpoint": None, "instance_id": "i"}
    return rec


# -- wire ----------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["claim", "release"])
def test_control_round_trips_through_the_metadata(op: str) -> None:
    meta = wire.encode_request_metadata(control=op)
    assert meta == {wire.CONTROL: op}
    fields = wire.decode_request_metadata(meta)
    assert fields.control == op
    assert fields.kind.value == "inform"


def test_plain_messages_carry_no_control() -> None:
    assert wire.decode_request_metadata({}).control is None
    assert wire.CONTROL not in wire.encode_request_metadata(kind="command")


@pytest.mark.parametrize("meta", [
    {wire.CONTROL: "shutdown"},
    {wire.CONTROL: ""},
    {wire.CONTROL: 1},
    {wire.CONTROL: ["claim"]},
    {wire.CONTROL: "claim", wire.KIND: "command"},
    {wire.CONTROL: "claim", wire.KIND: "ask"},
    {wire.CONTROL: "release", wire.DELIVERY: "next_turn"},
    {wire.CONTROL: "claim", wire.DEADLINE: 3},
    {wire.CONTROL: "claim", wire.HOP_CHAIN: ["ab"]},
    {wire.CONTROL: "claim", wire.IN_REPLY_TO: "m-1"},
])
def test_malformed_control_is_refused(meta: dict[str, Any]) -> None:
    with pytest.raises(wire.MetadataError) as err:
        wire.decode_request_metadata(meta)
    assert err.value.reason == "bad_control"


def test_explicit_defaults_are_not_a_combination() -> None:
    fields = wire.decode_request_metadata({wire.CONTROL: "claim", wire.KIND: "inform",
                                           wire.DELIVERY: "immediate", wire.DEADLINE: 0})
    assert fields.control == "claim"


# -- the journal's claim state -------------------------------------------------------------


def test_latest_claim_record_of_this_session_wins() -> None:
    records = [claim(OWNER), {"subject": "message", "id": "m"}, claim(None), claim(OTHER)]
    assert claim_state(records, SESSION).owner == OTHER
    assert claim_state(records[:3], SESSION).owner is None
    assert claim_state(records[:2], SESSION).owner == OWNER
    assert claim_state([], SESSION).role == PRIMARY


def test_claims_of_another_binding_never_apply() -> None:
    foreign = [claim(OWNER, session=("codex", "thread-2")), claim(OTHER, session=None)]
    assert claim_state(foreign, SESSION).owner is None
    # ... and a later foreign record does not undo this session's claim either
    mine_then_foreign = [claim(OWNER), claim(None, session=("codex", "thread-2"))]
    assert claim_state(mine_then_foreign, SESSION).owner == OWNER
    # another harness with the same session_ref is another session
    assert claim_state([claim(OWNER, session=("claude", "thread-1"))], SESSION).owner is None


def test_garbage_owner_reads_as_unclaimed() -> None:
    bad = claim(OWNER)
    bad["owner"] = 42
    assert claim_state([claim(OWNER), bad], SESSION).owner is None


# -- results and states ---------------------------------------------------------------------


def test_control_result_dict() -> None:
    assert ControlResult(True, None, SUBAGENT, OWNER, notice="queued").to_dict() == {
        "ok": True, "reason": None, "role": SUBAGENT, "owner": OWNER, "notice": "queued"}
    assert ControlResult(False, "already_claimed", SUBAGENT, OTHER).to_dict() == {
        "ok": False, "reason": "already_claimed", "role": SUBAGENT, "owner": OTHER}


def test_claim_machine() -> None:
    check_transition("claim", None, "claimed")
    check_transition("claim", "claimed", "released")
    check_transition("claim", "released", "claimed")
    check_transition("claim", "claimed", "claimed")  # over an owner that is gone
    assert is_unresolved("claim", "claimed")
    assert not is_unresolved("claim", "released")


def test_retention_keeps_a_standing_claim_and_drops_a_released_one() -> None:
    now = 10 * DAY
    old_claim = claim(OWNER, ts=0.0)
    unrelated = {"subject": "message", "id": "m-old", "state": "accepted", "ts": 0.0}
    assert retention.plan([old_claim, unrelated], now, DAY) == [True, False]
    released = [claim(OWNER, ts=0.0), claim(None, ts=1.0)]
    assert retention.plan(released, now, DAY) == [False, False]
    # a standing claim keeps its whole history (the records share the agent's id)
    history = [claim(OWNER, ts=0.0), claim(None, ts=1.0), claim(OTHER, ts=2.0)]
    assert retention.plan(history, now, DAY) == [True, True, True]
    assert claim_state([r for r, k in zip(history, retention.plan(history, now, DAY),
                                           strict=True) if k], SESSION).owner == OTHER
