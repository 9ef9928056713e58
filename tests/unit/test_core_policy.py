"""The pure policy core: the seed §7 trust table, claims, the hop-chain guard, admission.

The trust table is checked exhaustively against a literal transcription of seed §7 (plus the
§5 rule that the uds ingress carries inform only), over every combination of kind, verified or
not, sender role, target role/owner and ingress.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence
from typing import cast

import pytest

from crosstalk.core.admission import Admission, Limits
from crosstalk.core.hops import MAX_HOPS, check_hop_chain, hop_token
from crosstalk.core.message import UNVERIFIED, Ingress, Sender
from crosstalk.core.policy import (
    PRIMARY,
    SUBAGENT,
    ClaimState,
    TargetRole,
    Verdict,
    authorize,
    check_claim,
    check_release,
)

SENDER_ID = "5e" * 8
OTHER_ID = "07" * 8
TARGET_ID = "7a" * 8

# -- the trust table, transcribed from seed §7 ------------------------------------------------
#
#   kind     to a subagent                                to a primary
#   inform   any registered agent; unverified allowed     any; unverified allowed
#   ask      verified senders only                        verified senders only
#   command  owner only                                   any registered primary
#   control  not in v1                                    not in v1
#   unknown  rejected                                     rejected
#
# and seed §5: "a [uds] frame that requests any other kind [than inform] is rejected without
# injection, whatever its sender".

ANY = "any"  # verified or not
VERIFIED = "verified"  # any registered (verified) sender
OWNER = "owner"  # the verified sender is the target's owner
REGISTERED_PRIMARY = "registered primary"  # a verified sender whose role is primary
NOBODY = "nobody"

TRUST_TABLE: dict[str, dict[str, str]] = {
    "inform": {SUBAGENT: ANY, PRIMARY: ANY},
    "ask": {SUBAGENT: VERIFIED, PRIMARY: VERIFIED},
    "command": {SUBAGENT: OWNER, PRIMARY: REGISTERED_PRIMARY},
    "control": {SUBAGENT: NOBODY, PRIMARY: NOBODY},
    "shutdown": {SUBAGENT: NOBODY, PRIMARY: NOBODY},  # any unknown kind
    "": {SUBAGENT: NOBODY, PRIMARY: NOBODY},
    "INFORM": {SUBAGENT: NOBODY, PRIMARY: NOBODY},  # kinds are exact, not case-folded
}
UDS_KINDS = {"inform"}  # the only kind the uds ingress carries


def expected_allowed(kind: str, sender: Sender, target: TargetRole) -> bool:
    if sender.ingress is Ingress.UDS and kind not in UDS_KINDS:
        return False
    rule = TRUST_TABLE[kind][SUBAGENT if target.role == SUBAGENT else PRIMARY]
    if rule == ANY:
        return True
    if rule == VERIFIED:
        return sender.agent_id is not None
    if rule == OWNER:
        return sender.agent_id is not None and sender.agent_id == target.owner
    if rule == REGISTERED_PRIMARY:
        return sender.agent_id is not None and sender.role == PRIMARY
    return False


SENDERS = [
    Sender(agent_id=agent_id, name=name, role=role, ingress=ingress)
    for agent_id, name in ((SENDER_ID, "alice"), (None, None))
    for role in (PRIMARY, SUBAGENT, None)
    for ingress in Ingress
]
TARGETS = [
    TargetRole(PRIMARY, None),
    TargetRole(SUBAGENT, SENDER_ID),  # owned by the sender
    TargetRole(SUBAGENT, OTHER_ID),  # owned by someone else
    TargetRole(SUBAGENT, None),  # subagent with no owner on record: nobody owns it
]
CASES = list(itertools.product(TRUST_TABLE, SENDERS, TARGETS))


def case_id(case: tuple[str, Sender, TargetRole]) -> str:
    kind, s, t = case
    owner = {SENDER_ID: "sender", OTHER_ID: "other", None: "none"}[t.owner]
    who = "verified" if s.agent_id else "unverified"
    return f"{kind or 'empty'}-{who}-{s.role}-{s.ingress.value}-to-{t.role}-owner:{owner}"


def test_table_covers_the_whole_matrix() -> None:
    # 7 kinds x (2 identities x 3 roles x 3 ingresses) x 4 targets
    assert len(CASES) == 7 * 18 * 4
    assert {s.ingress for s in SENDERS} == set(Ingress)


@pytest.mark.parametrize(("kind", "sender", "target"), CASES, ids=[case_id(c) for c in CASES])
def test_trust_table(kind: str, sender: Sender, target: TargetRole) -> None:
    verdict = authorize(kind, sender, target)
    assert verdict.ok is expected_allowed(kind, sender, target)
    if verdict.ok:
        assert verdict.reason is None
    else:
        assert verdict.reason, "every rejection names its reason"


@pytest.mark.parametrize(
    ("kind", "sender", "target", "reason"),
    [
        ("control", Sender(SENDER_ID, role=PRIMARY), TargetRole(), "unknown_kind"),
        ("ask", Sender(None, ingress=Ingress.A2A), TargetRole(), "sender_unverified"),
        ("command", Sender(None, role=PRIMARY), TargetRole(), "sender_unverified"),
        ("command", Sender(SENDER_ID, role=PRIMARY), TargetRole(SUBAGENT, OTHER_ID),
         "command_owner_only"),
        ("command", Sender(SENDER_ID, role=SUBAGENT), TargetRole(), "command_primary_only"),
        ("ask", Sender(SENDER_ID, role=PRIMARY, ingress=Ingress.UDS), TargetRole(),
         "uds_inform_only"),
        ("command", Sender(SENDER_ID, role=PRIMARY, ingress=Ingress.UDS), TargetRole(),
         "uds_inform_only"),
    ],
)
def test_rejection_reasons(kind: str, sender: Sender, target: TargetRole, reason: str) -> None:
    assert authorize(kind, sender, target) == Verdict.deny(reason)


def test_envelope_claims_never_grant_command() -> None:
    # Identity is the verified agent_id only: a name or role claimed by an unverified sender,
    # or an owner's *name*, is worth nothing.
    forged = Sender(agent_id=None, name="boss", role=PRIMARY, ingress=Ingress.A2A)
    assert not authorize("command", forged, TargetRole()).ok
    assert not authorize("command", forged, TargetRole(SUBAGENT, "boss")).ok
    # ... while an ask from a non-owner to a subagent is allowed with inform permissions only
    non_owner = Sender(agent_id=OTHER_ID, role=PRIMARY)
    assert authorize("ask", non_owner, TargetRole(SUBAGENT, SENDER_ID)).ok
    assert not authorize("command", non_owner, TargetRole(SUBAGENT, SENDER_ID)).ok


def test_sender_key_and_label() -> None:
    assert Sender(None).key == UNVERIFIED
    assert Sender(None, name="mallory").key == UNVERIFIED  # names never become identity
    assert Sender(SENDER_ID).key == SENDER_ID
    assert Sender(SENDER_ID, name="alice").label == "alice"
    assert Sender(SENDER_ID).label == SENDER_ID
    assert not Sender(None, name="x").verified


# -- claims (seed §7, test 28) ------------------------------------------------------------------

PRIMARY_A = Sender(agent_id=SENDER_ID, name="alice", role=PRIMARY)
PRIMARY_B = Sender(agent_id=OTHER_ID, name="bob", role=PRIMARY)
UNCLAIMED = ClaimState()
OWNED_BY_A = ClaimState(owner=SENDER_ID)


def test_claim_state_role() -> None:
    assert UNCLAIMED.role == PRIMARY
    assert OWNED_BY_A.role == SUBAGENT


def test_primary_claims_unclaimed_agent() -> None:
    assert check_claim(PRIMARY_A, TARGET_ID, UNCLAIMED) == Verdict.allow()
    assert check_claim(PRIMARY_B, TARGET_ID, UNCLAIMED) == Verdict.allow()


def test_claiming_an_already_claimed_agent_is_rejected() -> None:
    assert check_claim(PRIMARY_B, TARGET_ID, OWNED_BY_A) == Verdict.deny("already_claimed")
    # ... even by its current owner: a claim is not re-entrant
    assert check_claim(PRIMARY_A, TARGET_ID, OWNED_BY_A) == Verdict.deny("already_claimed")


@pytest.mark.parametrize("current", [UNCLAIMED, OWNED_BY_A, ClaimState(owner=OTHER_ID)])
def test_an_agent_never_claims_itself(current: ClaimState) -> None:
    assert check_claim(PRIMARY_A, SENDER_ID, current) == Verdict.deny("cannot_claim_self")


def test_only_registered_primaries_claim() -> None:
    unverified = Sender(agent_id=None, name="alice", role=PRIMARY)
    assert check_claim(unverified, TARGET_ID, UNCLAIMED) == Verdict.deny("sender_unverified")
    subagent = Sender(agent_id=SENDER_ID, role=SUBAGENT)
    assert check_claim(subagent, TARGET_ID, UNCLAIMED) == Verdict.deny("claimer_not_primary")
    no_role = Sender(agent_id=SENDER_ID, role=None)
    assert not check_claim(no_role, TARGET_ID, UNCLAIMED).ok


def test_owner_releases() -> None:
    assert check_release(PRIMARY_A, TARGET_ID, OWNED_BY_A) == Verdict.allow()
    # the owner's own later role does not matter: only ownership does
    owner_now_subagent = Sender(agent_id=SENDER_ID, role=SUBAGENT)
    assert check_release(owner_now_subagent, TARGET_ID, OWNED_BY_A).ok


def test_non_owner_release_is_rejected() -> None:
    assert check_release(PRIMARY_B, TARGET_ID, OWNED_BY_A) == Verdict.deny("not_owner")
    assert check_release(PRIMARY_B, TARGET_ID, UNCLAIMED) == Verdict.deny("not_claimed")
    unverified_owner_name = Sender(agent_id=None, name="alice", role=PRIMARY)
    assert check_release(unverified_owner_name, TARGET_ID, OWNED_BY_A) == Verdict.deny(
        "sender_unverified")


@pytest.mark.parametrize("current", [UNCLAIMED, OWNED_BY_A, ClaimState(owner=OTHER_ID)])
def test_an_agent_never_releases_itself(current: ClaimState) -> None:
    target = Sender(agent_id=TARGET_ID, role=SUBAGENT)
    assert check_release(target, TARGET_ID, current) == Verdict.deny("cannot_release_self")


# -- hop chain (seed §4, R15) -------------------------------------------------------------------


def tok(i: int) -> str:
    return hashlib.sha256(f"peer-{i}".encode()).hexdigest()[:24]


OWN = hop_token(TARGET_ID)


def test_hop_token_shape() -> None:
    assert len(OWN) == 24
    assert int(OWN, 16) >= 0
    assert not set(OWN) - set("0123456789abcdef")
    assert hop_token(TARGET_ID) == OWN, "stable"
    assert hop_token(SENDER_ID) != OWN


def test_empty_and_ordinary_chains_pass() -> None:
    assert check_hop_chain([], OWN) is None
    assert check_hop_chain([tok(1)], OWN) is None
    assert check_hop_chain((tok(1), tok(2), tok(3)), OWN) is None


@pytest.mark.parametrize("position", [0, 5, MAX_HOPS - 1])
def test_own_token_is_a_loop(position: int) -> None:
    chain = [tok(i) for i in range(MAX_HOPS)]
    chain[position] = OWN
    assert check_hop_chain(chain, OWN) == "hop_chain_loop"
    assert check_hop_chain([OWN], OWN) == "hop_chain_loop"


def test_repeat_inside_the_chain_is_a_loop() -> None:
    # A -> B -> A: the chain holds A twice even though the receiver is a third agent
    assert check_hop_chain([tok(1), tok(2), tok(1)], OWN) == "hop_chain_loop"
    assert check_hop_chain([tok(1), tok(1)], OWN) == "hop_chain_loop"


def test_max_hops_is_32() -> None:
    assert MAX_HOPS == 32
    assert check_hop_chain([tok(i) for i in range(32)], OWN) is None
    assert check_hop_chain([tok(i) for i in range(33)], OWN) == "hop_chain_too_long"
    assert check_hop_chain([tok(i) for i in range(1000)], OWN) == "hop_chain_too_long"


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "abc",
        tok(1)[:23],
        tok(1) + "0",
        tok(1).upper(),
        "g" * 24,
        " " + tok(1)[1:],
        tok(1)[:23] + "\n",
        OWN + "\n",  # a trailing newline must not sneak past a `$` anchor
    ],
)
def test_malformed_tokens(bad: str) -> None:
    assert check_hop_chain([tok(1), bad], OWN) == "hop_chain_malformed"


def test_non_string_tokens_are_malformed() -> None:
    chain = cast(Sequence[str], [tok(1), 12345, None])
    assert check_hop_chain(chain, OWN) == "hop_chain_malformed"
    as_bytes = cast(Sequence[str], [tok(1).encode()])
    assert check_hop_chain(as_bytes, OWN) == "hop_chain_malformed"


# -- admission bookkeeping (seed §5 C9, R9) ------------------------------------------------------


def test_size_limit_is_inclusive_and_in_bytes() -> None:
    adm = Admission(Limits(max_text_bytes=10))
    assert adm.check_size(0) is None
    assert adm.check_size(10) is None
    assert adm.check_size(11) == "message_too_large"


def test_defaults_match_the_seed() -> None:
    lim = Limits()
    assert lim.max_text_bytes == 64 * 1024
    assert lim.max_pending_tasks == 256
    assert lim.max_open_asks == 32
    assert lim.max_waits == 64
    assert lim.max_body_bytes == 256 * 1024


def test_ask_reservations() -> None:
    adm = Admission(Limits(max_open_asks=2))
    assert adm.reserve_ask("a") is None
    assert adm.reserve_ask("a") is None, "idempotent: the same ask twice holds one slot"
    assert adm.open_asks == {"a"}
    assert adm.reserve_ask("b") is None
    assert adm.reserve_ask("c") == "too_many_open_asks"
    assert adm.open_asks == {"a", "b"}, "a refused reservation takes nothing, evicts nothing"
    assert adm.reserve_ask("a") is None, "an existing reservation still fits at the limit"
    adm.release_ask("a")
    adm.release_ask("a")  # releasing twice is harmless
    adm.release_ask("never-reserved")
    assert adm.open_asks == {"b"}
    assert adm.reserve_ask("c") is None
    assert adm.open_asks == {"b", "c"}


def test_task_reservations() -> None:
    adm = Admission(Limits(max_pending_tasks=3))
    for t in ("t1", "t2", "t3"):
        assert adm.reserve_task(t) is None
    assert adm.reserve_task("t2") is None
    assert adm.reserve_task("t4") == "too_many_pending_tasks"
    assert adm.pending_tasks == {"t1", "t2", "t3"}
    adm.release_task("t1")
    assert adm.reserve_task("t4") is None
    assert adm.reserve_task("t5") == "too_many_pending_tasks"


def test_wait_reservations() -> None:
    adm = Admission(Limits(max_waits=2))
    assert adm.reserve_wait() is None
    assert adm.reserve_wait() is None
    assert adm.reserve_wait() == "too_many_waits"
    assert adm.waits == 2
    adm.release_wait()
    assert adm.reserve_wait() is None
    adm.release_wait()
    adm.release_wait()
    adm.release_wait()  # never below zero
    assert adm.waits == 0
    assert adm.reserve_wait() is None
    assert adm.waits == 1


def test_zero_limits_refuse_everything() -> None:
    adm = Admission(Limits(max_text_bytes=0, max_pending_tasks=0, max_open_asks=0,
                           max_waits=0))
    assert adm.check_size(1) == "message_too_large"
    assert adm.check_size(0) is None
    assert adm.reserve_task("t") == "too_many_pending_tasks"
    assert adm.reserve_ask("a") == "too_many_open_asks"
    assert adm.reserve_wait() == "too_many_waits"


def test_admissions_are_independent() -> None:
    one, two = Admission(Limits(max_open_asks=1)), Admission(Limits(max_open_asks=1))
    assert one.reserve_ask("a") is None
    assert two.reserve_ask("b") is None, "no shared default set between instances"
    assert one.open_asks == {"a"}
