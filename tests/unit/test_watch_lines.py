"""``--plain``/``--json`` lines and the filters, over a real (empty-registry) feed's board."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path
from typing import Any

from crosstalk.core.message import Ingress, Sender
from crosstalk.core.records import MessageChange, MessageSubmitted
from crosstalk.core.states import MessageState
from crosstalk.store.journal import Journal
from crosstalk.watch.feed import Feed
from crosstalk.watch.lines import Filters, as_json, plain, run_lines

BOB = "b0b0b0b0b0b0b0b0"
ALICE = Sender(agent_id="a11ce0a11ce0a11c", name="alice", ingress=Ingress.A2A)


def rows() -> list[dict[str, Any]]:
    return [{"name": "bob", "agent_id": BOB, "harness": "fake", "status": "idle",
             "crosstalk": True, "reachable": True, "cwd": "/w", "role": "primary",
             "owner": None}]


def home_with_a_message(tmp_path: Path) -> Path:
    home = tmp_path / "state"
    (home / "journal").mkdir(parents=True)
    with Journal(home / "journal" / f"{BOB}.jsonl") as j:
        j.append(MessageSubmitted(id="m1", sender=ALICE, text="hello bob").to_dict())
        j.append(MessageChange(id="m1", state=MessageState.ACCEPTED).to_dict())
    return home


def test_run_lines_prints_the_start_state_then_stops(tmp_path: Path) -> None:
    feed = Feed(home_with_a_message(tmp_path), sessions=rows)
    out = io.StringIO()
    stop = threading.Event()
    stop.set()
    assert run_lines(feed, out, as_json=True, stop=stop) == 0
    got = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [g["event"] for g in got] == ["session_added", "message"]
    assert got[1]["state"] == "accepted"
    assert got[1]["to"] == "bob"
    assert got[1]["text"] == "hello bob"
    assert [s["state"] for s in got[1]["steps"]] == ["submitted", "accepted"]


def test_plain_lines_read_as_who_to_whom_what(tmp_path: Path) -> None:
    feed = Feed(home_with_a_message(tmp_path), sessions=rows)
    lines = [plain(c) for c in feed.poll()]
    assert lines[0].endswith("+ bob (fake) idle crosstalk reachable")
    assert lines[1].endswith("alice → bob inform accepted «hello bob»")


def test_filters_keep_what_they_name_and_every_notice(tmp_path: Path) -> None:
    feed = Feed(home_with_a_message(tmp_path), sessions=rows)
    changes = feed.poll()
    board = feed.board

    def kept(f: Filters) -> list[str]:
        return [c.kind for c in changes if f.admits(c, board)]

    assert kept(Filters(agent="alice")) == ["message"]
    assert kept(Filters(agent="bob")) == ["session_added", "message"]
    assert kept(Filters(agent="carol")) == []
    assert kept(Filters(harness="fake")) == ["session_added", "message"]
    assert kept(Filters(harness="codex")) == []
    assert kept(Filters(state="accepted")) == ["session_added", "message"]
    assert kept(Filters(state="rejected")) == ["session_added"]
    (tmp_path / "state" / "journal" / f"{BOB}.jsonl").unlink()
    notice = [c for c in feed.poll() if c.kind == "notice"]
    assert notice
    assert Filters(agent="carol").admits(notice[0], board)
    assert json.loads(as_json(notice[0]))["what"].startswith("journal vanished")


def test_a_sessions_source_that_fails_is_a_notice_not_an_end(tmp_path: Path) -> None:
    def broken() -> list[dict[str, Any]]:
        raise OSError("discovery fell over")

    feed = Feed(home_with_a_message(tmp_path), sessions=broken)
    changes = feed.poll()
    assert changes[0].kind == "notice"
    assert "discovery fell over" in changes[0].line
    assert [c.kind for c in changes[1:]] == ["message"]


def test_a_gone_agent_is_named_by_what_it_sent(tmp_path: Path) -> None:
    home = home_with_a_message(tmp_path)
    bob = Sender(agent_id=BOB, name="bob", ingress=Ingress.A2A)
    assert ALICE.agent_id is not None
    with Journal(home / "journal" / f"{ALICE.agent_id}.jsonl") as j:
        j.append(MessageSubmitted(id="m2", sender=bob, text="hi alice").to_dict())
    feed = Feed(home, sessions=list)
    lines = [plain(c) for c in feed.poll()]
    assert any(line.endswith("alice → bob inform accepted «hello bob»") for line in lines)
    assert any(line.endswith("bob → alice inform submitted «hi alice»") for line in lines)
