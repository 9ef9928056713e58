"""What a restart costs, by structure (issue 12, item 6): the journal is read once, by every
reader of the restart together; no finished task is parsed until it is read; and nothing like
a copy of the journal is held while it is read. How long it takes is ``bench/restart.py``'s to
say: nothing here is timed.

The journals are the product's own: two real agents talk over A2A and the uds ingress, the
receiving agent stops, and a new one starts on its journal.
"""

from __future__ import annotations

import asyncio
import tracemalloc
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.json_format import MessageToDict

from crosstalk.a2a import client as a2a_client
from crosstalk.a2a import taskstore
from crosstalk.agent import Agent, AgentSpec
from crosstalk.cli.send import frames
from crosstalk.core.ids import new_message_id
from crosstalk.core.message import Ingress, Kind, Message, Sender
from crosstalk.core.records import MessageChange, MessageSubmitted, TaskRecord
from crosstalk.core.records import parse as record_parse
from crosstalk.core.states import MessageState, TaskState
from crosstalk.harness.fake import FakeHarness
from crosstalk.store.journal import Journal
from crosstalk.store.journal_read import read_journal
from crosstalk.store.registry import Registry
from tests.support.dirs import short_dir

pytestmark = pytest.mark.anyio

INFORMS = 12


@dataclass
class Talked:
    """A journal two agents wrote, and what the receiver's tasks said before it stopped."""

    registry: Registry
    env: dict[str, str]
    alice: Agent
    journal: Path
    task_ids: list[str]
    ask_task: str


def bob(registry: Registry, env: dict[str, str]) -> Agent:
    return Agent(registry, AgentSpec(FakeHarness(name="fake"), "sess-b", "/w/p", "bob"),
                 env=env)


@pytest.fixture
async def talked(tmp_path: Path) -> AsyncIterator[Talked]:
    """Alice sends bob informs and an ask he answers over A2A, and a uds message; bob stops."""
    with short_dir("ct-rt-") as rt:
        env = {"XDG_RUNTIME_DIR": str(rt)}
        registry = Registry(tmp_path / "state")
        alice = Agent(registry, AgentSpec(FakeHarness(name="fake"), "sess-a", "/w/p", "alice"),
                      env=env)
        first = bob(registry, env)
        await alice.start()
        await first.start()
        try:
            task_ids = []
            for i in range(INFORMS):
                sent = await alice.send("bob", f"inform {i}")
                assert (sent.state, sent.task_state) == ("accepted", "completed")
                assert sent.task_id is not None
                task_ids.append(sent.task_id)
            ask = await alice.send("bob", "which test is flaky?", kind="ask",
                                   until_delivered=True)
            assert ask.task_id is not None
            await first.reply(ask.message_id, "the restart one")
            assert first.uds is not None
            reader, writer = await asyncio.open_unix_connection(str(first.uds.path))
            writer.write(frames(first.uds.key_path.read_text().strip(), "over uds",
                                new_message_id()))
            await writer.drain()
            writer.write_eof()
            await reader.readline()
            writer.close()
            assert first.journal is not None
            journal = first.journal.path
        finally:
            await first.stop()
        try:
            yield Talked(registry, env, alice, journal, task_ids, ask.task_id)
        finally:
            await alice.stop()


@pytest.fixture
def parse_dict_calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts the task store's ``ParseDict`` calls (each still parses)."""
    calls: Counter[str] = Counter()
    real = taskstore.ParseDict

    def counting(js: Any, message: Any, **kwargs: Any) -> Any:
        calls["ParseDict"] += 1
        return real(js, message, **kwargs)

    monkeypatch.setattr(taskstore, "ParseDict", counting)
    return calls


def latest_task_records(journal: Path) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for rec in read_journal(journal).records:
        if rec.get("subject") == "task":
            out[rec["id"]] = rec["task"]
    return out


async def test_a_restart_parses_no_finished_task_until_it_is_read(
        talked: Talked, parse_dict_calls: Counter[str]) -> None:
    journaled = latest_task_records(talked.journal)
    assert len(journaled) == INFORMS + 1
    again = bob(talked.registry, talked.env)
    await again.start()
    try:
        assert again.a2a is not None
        store = again.a2a.store
        assert parse_dict_calls["ParseDict"] == 0, "finished tasks are parsed at restart"
        assert {s.id for s in store.all()} == set(journaled)
        assert all(s.state is TaskState.COMPLETED for s in store.all())

        got = await a2a_client.get_task(again.a2a.url, talked.alice.token, talked.task_ids[3])
        assert (got.task_state, got.completion, got.state) == ("completed", "delivered",
                                                                "accepted")
        assert parse_dict_calls["ParseDict"] == 1, "only the task that was read"
        read = store.lookup(talked.task_ids[3])
        assert read is not None
        assert [m.parts[0].text for m in read.task.history] == ["inform 3"]
        assert parse_dict_calls["ParseDict"] == 1, "a task is parsed once"

        # Every task, once read, is its journaled record plus the history the journal implies.
        for stored in store.all():
            tid, task = stored.id, taskstore.copy_task(stored.task)
            history = [(m.role, m.parts[0].text) for m in task.history]
            del task.history[:]
            assert MessageToDict(task) == journaled[tid]
            if tid == talked.ask_task:
                assert [text for _, text in history] == ["which test is flaky?",
                                                         "the restart one"]
            else:
                assert len(history) == 1
                assert history[0][1].startswith("inform ")
        answered = await a2a_client.get_task(again.a2a.url, talked.alice.token,
                                             talked.ask_task)
        assert (answered.task_state, answered.reply) == ("completed", "the restart one")
    finally:
        await again.stop()


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts every typed read of a stored record, by kind, wherever it is called from."""
    calls: Counter[str] = Counter()

    def counted(kind: str, parser: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def parse(raw: Any) -> Any:
            calls[kind] += 1
            return parser(raw)
        return parse

    parsers = {kind: counted(kind, p) for kind, p in record_parse._PARSERS.items()}
    monkeypatch.setattr(record_parse, "_PARSERS", parsers)
    return calls


async def test_a_restart_reads_each_journal_record_once(talked: Talked,
                                                        parses: Counter[str]) -> None:
    on_disk = Counter(r["subject"] for r in read_journal(talked.journal).records)
    parses.clear()
    again = bob(talked.registry, talked.env)
    await again.start()
    try:
        assert again.receiver is not None
        assert len(again.receiver.entries) == INFORMS + 2  # the informs, the ask, uds
        # Claims and replies are folded from the few records of their kinds, read again.
        assert parses["message"] == on_disk["message"]
        assert parses["task"] == on_disk["task"]
        assert parses["ask"] == on_disk["ask"]
        assert parses["reply"] <= 2 * on_disk["reply"]
        entry = again.receiver.entries[next(iter(again.receiver.entries))]
        assert entry.state is MessageState.ACCEPTED
    finally:
        await again.stop()


# -- memory: a journal written the way the receiver and the task store write it -----------------


def write_history(path: Path, messages: int) -> None:
    """``messages`` A2A informs, each with the six records its delivery journals."""
    sender = Sender("a1" * 8, name="alice", role="primary", ingress=Ingress.A2A)
    binding = {"harness": "fake", "session_ref": "sess-b", "endpoint": None,
               "instance_id": "01a233e5-5e96-70ff-a745-0e779bcc9220"}
    with Journal(path) as journal:
        for start in range(0, messages, 250):
            batch: list[dict[str, Any]] = []
            for i in range(start, min(start + 250, messages)):
                mid, tid = f"m-{i:06d}", f"t-{i:06d}"
                msg = Message(mid, sender, f"message {i} " + "x" * 120, kind=Kind.INFORM,
                              task_id=tid, context_id=f"c-{i:06d}")
                batch.append(MessageSubmitted.of(msg, binding).to_dict())
                for state, task_state, meta_state in (
                        (MessageState.DISPATCHING, TaskState.SUBMITTED, "submitted"),
                        (MessageState.ACCEPTED, TaskState.WORKING, "dispatching"),
                        (None, TaskState.COMPLETED, "accepted")):
                    wire = f"TASK_STATE_{task_state.name}"
                    batch.append(TaskRecord(
                        id=tid, state=task_state, owner=sender.agent_id, refs=(mid,),
                        task={"id": tid, "contextId": f"c-{i:06d}",
                              "status": {"state": wire,
                                         "timestamp": "2026-12-01T23:16:39.803814912Z"},
                              "metadata": {"crosstalk.message_id": mid,
                                           "crosstalk.kind": "inform",
                                           "crosstalk.state": meta_state}}).to_dict())
                    if state is not None:
                        batch.append(MessageChange(id=mid, state=state).to_dict())
            journal.append_batch(batch)


def as_a_list_of_records(path: Path) -> int:
    """Bytes a replay that returns the records as a list holds at its peak."""
    tracemalloc.start()
    try:
        records = read_journal(path).records
        assert records
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


async def test_a_restart_holds_no_copy_of_its_journal(tmp_path: Path) -> None:
    with short_dir("ct-rt-") as rt:
        registry = Registry(tmp_path / "state")
        agent = bob(registry, {"XDG_RUNTIME_DIR": str(rt)})
        path = registry.home / "journal" / f"{agent.agent_id}.jsonl"
        path.parent.mkdir(mode=0o700)
        write_history(path, 1500)
        listed = as_a_list_of_records(path)
        tracemalloc.start()
        try:
            await agent.start()
            held, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        try:
            assert agent.receiver is not None
            assert len(agent.receiver.entries) == 1500
            entry = agent.receiver.entries["m-000007"]
            assert (entry.state, entry.ask) == (MessageState.ACCEPTED, None)
            assert agent.a2a is not None
            assert agent.a2a.store.lookup("t-000007") is not None
        finally:
            await agent.stop()
    # What the start keeps (entries, tasks) is the agent's; what it needed only while reading
    # must be a small part of what the journal is as a list of records.
    assert peak - held < listed / 3, (peak - held, listed)
