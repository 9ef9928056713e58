"""The watch's filter line (parse + match) and what its cells say: pure, no terminal."""

from __future__ import annotations

from crosstalk.watch import render
from crosstalk.watch.filters import Filter, from_options, parse
from crosstalk.watch.model import Board, MessageView, SessionView, StateStep

HARNESS = {"A-alice": "claude", "B-bob": "codex"}


def harness_of(agent_id: str | None) -> str | None:
    return HARNESS.get(agent_id or "")


def message(mid: str = "m1", *, text: str = "is the build green?", kind: str = "ask",
            states: tuple[str, ...] = ("submitted", "accepted"), ask_state: str | None = None,
            receipt: str | None = None, in_reply_to: str | None = None,
            to: tuple[str, str] = ("B-bob", "bob")) -> MessageView:
    return MessageView(
        message_id=mid, to_agent=to[0], to_name=to[1], sender_label="alice",
        sender_agent="A-alice", verified=True, ingress="a2a", kind=kind, delivery="immediate",
        text=text, in_reply_to=in_reply_to, ask_state=ask_state, receipt=receipt,
        steps=[StateStep(100.0 + i, s) for i, s in enumerate(states)])


def test_terms_and_words_are_parsed_case_insensitively() -> None:
    f = parse('agent:Bob HARNESS:codex state:held kind:ask "build is" green')
    assert f == Filter(agents=("bob",), harnesses=("codex",), states=("held",),
                       kinds=("ask",), words=("build is", "green"))
    assert parse("").empty
    assert not parse("x").empty


def test_an_unknown_key_or_an_empty_value_is_a_word() -> None:
    assert parse("re:build agent:").words == ("re:build", "agent:")


def test_an_unbalanced_quote_does_not_raise() -> None:
    assert parse('"half typed').words == ('"half', "typed")


def test_same_key_is_any_different_keys_are_all() -> None:
    m = message()
    assert parse("agent:carol agent:bob").matches_message(m, harness_of)
    assert not parse("agent:bob harness:claude state:held").matches_message(m, harness_of)
    assert parse("agent:bob harness:claude state:accepted").matches_message(m, harness_of)
    assert not parse("agent:carol").matches_message(m, harness_of)


def test_agent_matches_either_side_by_name_or_id_prefix() -> None:
    m = message()
    assert parse("agent:alice").matches_message(m, harness_of)
    assert parse("agent:B-bo").matches_message(m, harness_of)
    assert not parse("agent:bo").matches_message(m, harness_of)  # a name is matched whole


def test_state_matches_the_ask_and_the_receipt_too() -> None:
    m = message(ask_state="expired", receipt="dropped:session gone")
    for state in ("accepted", "expired", "dropped"):
        assert parse(f"state:{state}").matches_message(m, harness_of)
    assert not parse("state:submitted").matches_message(m, harness_of)  # only the current


def test_words_search_text_ids_and_reply() -> None:
    m = message(text="Is the BUILD green?")
    m.reply_text = "yes, test_retry was flaky"
    assert parse("build flaky").matches_message(m, harness_of)
    assert parse("m1").matches_message(m, harness_of)
    assert not parse("build red").matches_message(m, harness_of)


def test_sessions_are_narrowed_by_agent_and_harness_only() -> None:
    s = SessionView("B-bob", "bob", "codex", "idle", crosstalk=True, reachable=True)
    assert parse("harness:codex state:held words").matches_session(s)
    assert not parse("harness:claude").matches_session(s)
    assert not parse("agent:alice").matches_session(s)


def test_options_become_the_line_the_input_shows() -> None:
    line = from_options(agent=["bob", "the reviewer"], harness="codex", state=None)
    assert line == "agent:bob agent:'the reviewer' harness:codex"
    assert parse(line).agents == ("bob", "the reviewer")


def test_ask_cell_counts_down_then_says_how_it_ended() -> None:
    m = message(ask_state="open")
    m.ask_deadline = 142.0
    assert render.ask_cell(m, 100.0) == "ask 42s"
    assert render.ask_cell(m, 141.5) == "ask 1s"
    assert render.ask_cell(m, 142.0) == "ask due"
    m.ask_state = "answered"
    assert render.ask_cell(m, 200.0) == "answered"
    assert render.ask_cell(message(kind="inform"), 100.0) == ""


def test_session_cells_say_waiting_damaged_and_why_unreachable() -> None:
    s = SessionView("k", None, None, "waiting", crosstalk=False, reachable=False,
                    waiting_for="permission", unreachable_because="no inbox", role="rev",
                    owner="ana")
    assert render.session_cells(s) == ("k", "-", "waiting for permission", "no",
                                       "no: no inbox", "rev/ana")
    damaged = SessionView("k", "x", None, "unknown", True, False, damaged="not JSON")
    assert render.session_cells(damaged)[2] == "DAMAGED: not JSON"


def test_detail_shows_states_in_order_and_the_thread() -> None:
    board = Board()
    ask = message("m1", states=("submitted", "dispatching", "accepted"), ask_state="answered")
    reply = message("m2", kind="reply", text="yes", in_reply_to="m1", to=("A-alice", "alice"))
    board.keep(ask)
    board.keep(reply)
    text = render.detail(ask, board, 200.0, harness_of)
    states = [line.split()[1] for line in text.splitlines()
              if line.startswith("  ") and line.split()[-1] in
              ("submitted", "dispatching", "accepted")]
    assert states == ["submitted", "dispatching", "accepted"]
    assert "thread (2)" in text
    assert "↳ alice → alice" in text
    assert render.depth_in(board, reply) == 1
