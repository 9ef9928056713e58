"""``receive_message`` follows the journal instead of re-reading it.

Each call used to replay the whole journal and fold every record again: on a 24 h journal
(20k messages) about a second and 200 MB per call, while a model polls. Now the agent's
mailbox folds each record once, as the journal grows, and gives the same answer.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crosstalk.core import mailbox
from crosstalk.core.mailbox import MailboxFold, build_entries
from crosstalk.core.records import parse_record
from crosstalk.harness.fake import FAKE_NAME_META, FAKE_SESSION_META, FakeIdentifier
from crosstalk.shim.roster import Shim
from crosstalk.shim.tools import Tools
from crosstalk.store.journal import Journal
from crosstalk.store.registry import Registry

pytestmark = pytest.mark.anyio

ALICE = {FAKE_SESSION_META: "a1", FAKE_NAME_META: "alice"}
BOB = {FAKE_SESSION_META: "b1", FAKE_NAME_META: "bob"}


@pytest.fixture
async def tools(tmp_path: Path) -> AsyncIterator[tuple[Tools, Shim]]:
    env = {"XDG_RUNTIME_DIR": tempfile.mkdtemp(prefix="ct-rt-", dir="/tmp")}
    shim = Shim(Registry(tmp_path / "state"), [FakeIdentifier(cwd="/m")], env=env)
    try:
        yield Tools(shim), shim
    finally:
        await shim.close()


async def call(tools: Tools, name: str, args: dict[str, Any],
               meta: dict[str, Any]) -> dict[str, Any]:
    result = await tools.call(name, args, meta)
    assert result.structured_content is not None
    assert not result.is_error, result.structured_content
    return dict(result.structured_content)


def counting_parses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many records the mailbox fold parses (one list element per parse)."""
    seen: list[int] = []

    def parse(raw: Any) -> Any:
        seen.append(1)
        return parse_record(raw)

    monkeypatch.setattr(mailbox, "parse_record", parse)
    return seen


async def test_polling_reads_each_record_once(
        tools: tuple[Tools, Shim], monkeypatch: pytest.MonkeyPatch) -> None:
    t, shim = tools
    await call(t, "receive_message", {}, BOB)
    for i in range(20):
        await call(t, "send_message", {"to": "bob", "text": f"m{i}"}, ALICE)
    seen = counting_parses(monkeypatch)
    first = await call(t, "receive_message", {"limit": 100}, BOB)
    assert [e["text"] for e in first["entries"]] == [f"m{i}" for i in range(20)]
    read_once = len(seen)
    assert read_once >= 20  # every record of the journal, once
    again = await call(t, "receive_message", {"limit": 100}, BOB)
    assert again == first
    assert len(seen) == read_once  # before: the whole journal again, every call
    await call(t, "send_message", {"to": "bob", "text": "one more"}, ALICE)
    later = await call(t, "receive_message", {"after": first["next_cursor"]}, BOB)
    assert [e["text"] for e in later["entries"]] == ["one more"]
    assert len(seen) - read_once < 10  # only what the last send wrote
    bob = next(a for a in shim.agents.values() if a.name == "bob")
    assert bob.mailbox() == build_entries(bob.journal_records())


async def test_the_mailbox_starts_over_when_retention_replaces_the_file(
        tools: tuple[Tools, Shim]) -> None:
    t, shim = tools
    await call(t, "receive_message", {}, BOB)
    for i in range(5):
        await call(t, "send_message", {"to": "bob", "text": f"m{i}"}, ALICE)
    bob = next(a for a in shim.agents.values() if a.name == "bob")
    assert bob.journal is not None
    before = bob.mailbox()
    ino = os.stat(bob.journal.path).st_ino
    bob.journal.apply_retention(max_age=0)  # rewrites the file by rename
    assert os.stat(bob.journal.path).st_ino != ino
    await call(t, "send_message", {"to": "bob", "text": "after"}, ALICE)
    assert bob.mailbox() == build_entries(bob.journal_records())
    assert len(bob.mailbox()) >= 1
    assert before  # the first view was not empty either


def test_a_torn_tail_is_not_read_past_and_what_replaces_it_is_read(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.jsonl")
    fold = MailboxFold()
    mark = None

    def follow() -> list[str]:
        nonlocal mark, fold

        def restart() -> None:
            nonlocal fold
            fold = MailboxFold()

        mark = j.read_since(mark, lambda r: fold.add(r), restart)
        return [e.text for e in fold.entries()]

    def submitted(mid: str, text: str) -> dict[str, Any]:
        return {"subject": "message", "id": mid, "state": "submitted", "text": text,
                "kind": "inform", "from": {"name": "a", "agent_id": "a", "ingress": "a2a"}}

    j.append(submitted("m1", "one"))
    assert follow() == ["one"]
    with open(j.path, "ab") as f:  # a writer that died mid-line
        f.write(b'{"c":"0","r":{"subj')
    assert follow() == ["one"]
    j.append(submitted("m2", "two"))  # the append cuts the fragment off first
    assert follow() == ["one", "two"]
    j.close()


@settings(max_examples=40, deadline=None)
@given(cuts=st.lists(st.integers(0, 30), max_size=5),
       states=st.lists(st.sampled_from(["dispatching", "accepted", "unknown", "rejected"]),
                       min_size=1, max_size=30))
def test_folding_in_pieces_equals_folding_at_once(cuts: list[int], states: list[str]) -> None:
    records: list[dict[str, Any]] = []
    for seq, state in enumerate(states, start=1):
        mid = f"m{seq % 4}"
        if not any(r["id"] == mid for r in records):
            records.append({"subject": "message", "id": mid, "state": "submitted",
                            "text": mid, "kind": "inform", "seq": seq * 10,
                            "from": {"name": "a", "agent_id": "a", "ingress": "a2a"}})
        records.append({"subject": "message", "id": mid, "state": state, "seq": seq * 10 + 1,
                        "reason": None})
    fold = MailboxFold()
    views = []
    start = 0
    for cut in sorted({min(c, len(records)) for c in cuts} | {len(records)}):
        for r in records[start:cut]:
            fold.add(r)
        start = cut
        views.append(fold.entries())
    assert views[-1] == build_entries(records)
    assert json.dumps([e.to_tool_dict() for e in views[-1]])  # still a tool answer
