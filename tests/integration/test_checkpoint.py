"""The restart checkpoint is a cache of the replay (ADR 0018): (checkpoint of a prefix) + the
tail is exactly a full replay, and any checkpoint that does not hold is a full replay.

The journal is the product's own: two real agents talk over A2A (informs, an answered ask,
an ask left open) and the uds ingress. Its prefixes are the states a crash leaves (messages
``submitted`` or ``dispatching``, tasks half-derived), so a random crash point and a random
checkpoint point below it cover what ``finish()`` settles and resumes too.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.json_format import MessageToDict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crosstalk.agent import Agent, AgentSpec
from crosstalk.agent.checkpoints import CheckpointPolicy, Started, advanced, start_pass
from crosstalk.agent.start_pass import StartPass
from crosstalk.cli.send import frames
from crosstalk.cli.state_checks import journals, permissions
from crosstalk.core.ids import new_message_id
from crosstalk.harness.base import Binding
from crosstalk.harness.fake import FakeHarness
from crosstalk.receiver import Receiver
from crosstalk.store import checkpoint
from crosstalk.store.journal import Journal
from crosstalk.store.journal_read import ReadMark, read_journal
from crosstalk.store.registry import Registry
from tests.support.dirs import short_dir

AGENT = "b0b0b0b0b0b0b0b0"
CLOCK = 1.9e9


async def _talk(home: Path, rt: Path) -> Path:
    env = {"XDG_RUNTIME_DIR": str(rt)}
    registry = Registry(home)
    alice = Agent(registry, AgentSpec(FakeHarness(name="fake"), "sess-a", "/w/p", "alice"),
                  env=env)
    bob = Agent(registry, AgentSpec(FakeHarness(name="fake"), "sess-b", "/w/p", "bob"),
                env=env)
    await alice.start()
    await bob.start()
    try:
        for i in range(4):
            await alice.send("bob", f"inform {i}")
        ask = await alice.send("bob", "answered?", kind="ask", until_delivered=True)
        await bob.reply(ask.message_id, "yes")
        await alice.send("bob", "left open", kind="ask", until_delivered=True,
                         deadline_seconds=3600)
        assert bob.uds is not None
        for text in ("over uds", "again"):
            reader, writer = await asyncio.open_unix_connection(str(bob.uds.path))
            writer.write(frames(bob.uds.key_path.read_text().strip(), text, new_message_id()))
            await writer.drain()
            writer.write_eof()
            await reader.readline()
            writer.close()
        assert bob.journal is not None
        return bob.journal.path
    finally:
        await bob.stop()
        await alice.stop()


@pytest.fixture(scope="module")
def product_journal(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    with short_dir("ct-ck-") as rt:
        path = asyncio.run(_talk(tmp_path_factory.mktemp("talk") / "state", rt))
        return path.read_bytes()


def boundaries(data: bytes) -> list[int]:
    """Offsets just past each whole write (a crash or a checkpoint can fall there)."""
    out, pos = [0], 0
    for line in data.splitlines(keepends=True):
        pos += len(line)
        if not line.startswith(b'{"b":'):
            out.append(pos)
    return out


def receiver(path: Path) -> Receiver:
    return Receiver(agent_id=AGENT, journal=Journal(path, clock=lambda: CLOCK),
                    harness=FakeHarness(name="fake"),
                    binding=Binding("fake", "sess-b", None, "instance-after"),
                    clock=lambda: CLOCK)


def checkpoint_at(path: Path, offset: int) -> bool:
    """Write the checkpoint of ``path``'s first ``offset`` bytes (a background advance)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        made = advanced(fd, ReadMark(os.fstat(fd).st_ino, offset), checkpoint.path_for(path),
                        AGENT, threading.Event())
    finally:
        os.close(fd)
    if made is None:
        return False
    checkpoint.write(checkpoint.path_for(path), AGENT, *made)
    return True


def observed(readers: StartPass, rcv: Receiver) -> dict[str, Any]:
    """Everything the start pass's readers hold (nothing here parses a task)."""
    f, t, m = readers.folder, readers.tasks, readers.mailbox
    return {
        "entries": list(rcv.entries.items()), "violations": rcv.replay_violations,
        "states": f.result.states, "fold_violations": f.result.violations,
        "unreadable": [u.raw for u in f.result.unreadable], "gaps": f._gaps,
        "last_seq": f._last_seq, "seen_at": f._seen_at,
        "claims": readers.claims.records, "replies": readers.replies.records,
        "bodies": {k: raw for k, (raw, _) in readers.restore._bodies.items()},
        "tasks": {tid: (s.id, s.owner, s.refs, s.updated_at, s.state, s._raw,
                        MessageToDict(s._task) if s._task is not None else None)
                  for tid, s in t.latest.items()},
        "undated": t.undated, "task_bodies": t.bodies, "ask_deadlines": t.ask_deadlines,
        "mailbox": m.entries(), "asks": m._asks, "receipts": m._receipts,
    }


def settled(readers: StartPass, rcv: Receiver, path: Path, before: int) -> dict[str, Any]:
    """What ``finish()`` settles and resumes, and the records it wrote."""
    resumed = [e.message_id for e in readers.restore.finish()]
    return {"resumed": resumed, "entries": list(rcv.entries.items()),
            "open_asks": rcv.admission.open_asks,
            "written": read_journal(path).records[before:]}


def full(path: Path) -> tuple[StartPass, Receiver]:
    rcv = receiver(path)
    readers = StartPass(rcv, AGENT)
    rcv.journal.replay(readers.each())
    return readers, rcv


def started(path: Path) -> tuple[Started, Receiver]:
    rcv = receiver(path)
    return start_pass(rcv.journal, rcv, CheckpointPolicy()), rcv


@st.composite
def cuts(draw: st.DrawFn, data: bytes) -> tuple[int, int, int | None]:
    ends = boundaries(data)
    crash = draw(st.integers(1, len(ends) - 1))
    at = draw(st.integers(1, crash))
    flip = draw(st.none() | st.integers(0, ends[crash] - 1))
    return ends[crash], ends[at], flip


def test_a_checkpoint_and_its_tail_are_a_full_replay(product_journal: bytes,
                                                     tmp_path: Path) -> None:
    @settings(max_examples=40, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(cuts(product_journal))
    def check(cut: tuple[int, int, int | None]) -> None:
        crash, at, flip = cut
        data = bytearray(product_journal[:crash])
        if flip is not None and data[flip] != 0x0A:  # damage (a newline would move lines)
            data[flip] ^= 0x20
        shutil.rmtree(tmp_path / "a", ignore_errors=True)
        shutil.rmtree(tmp_path / "b", ignore_errors=True)
        (tmp_path / "a").mkdir(mode=0o700)
        (tmp_path / "b").mkdir(mode=0o700)
        a, b = tmp_path / "a" / f"{AGENT}.jsonl", tmp_path / "b" / f"{AGENT}.jsonl"
        a.write_bytes(data)
        b.write_bytes(data[:at])
        b.chmod(0o600)
        assert checkpoint_at(b, at)
        with b.open("ab") as f:  # the journal grew after the checkpoint
            f.write(data[at:])
        whole, rcv_a = full(a)
        tail, rcv_b = started(b)
        try:
            assert tail.resumed is not None, tail.why
            assert tail.records == len(read_journal(b).records) - _records_before(b, at)
            assert observed(tail.readers, rcv_b) == observed(whole, rcv_a)
            n = len(read_journal(a).records)
            assert settled(tail.readers, rcv_b, b, n) == settled(whole, rcv_a, a, n)
        finally:
            rcv_a.journal.close()
            rcv_b.journal.close()

    check()


def _records_before(path: Path, offset: int) -> int:
    with path.open("rb") as f:
        head = f.read(offset)
    tmp = path.with_name("head.jsonl")
    tmp.write_bytes(head)
    try:
        return len(read_journal(tmp).records)
    finally:
        tmp.unlink()


# -- a checkpoint that does not hold is a full replay -------------------------------------------


@pytest.fixture
def with_checkpoint(product_journal: bytes, tmp_path: Path) -> Path:
    (tmp_path / "j").mkdir(mode=0o700)
    path = tmp_path / "j" / f"{AGENT}.jsonl"
    path.write_bytes(product_journal)
    path.chmod(0o600)
    at = boundaries(product_journal)[-4]
    assert checkpoint_at(path, at)
    return path


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(data)


def _retention(path: Path) -> None:
    with Journal(path) as j:  # replaces the file (a new inode), as doctor --fix does
        assert j.apply_retention(now=CLOCK + 10 ** 6, max_age=1).dropped


SPOIL = {
    "a flipped byte in a section": lambda p: _flip(checkpoint.path_for(p), -100),
    "a torn file": lambda p: checkpoint.path_for(p).write_bytes(
        checkpoint.path_for(p).read_bytes()[:-5000]),
    "a loose mode": lambda p: checkpoint.path_for(p).chmod(0o644),
    "a header that is not JSON": lambda p: _flip(checkpoint.path_for(p), 3),
    "a journal cut below it": lambda p: os.truncate(p, boundaries(p.read_bytes())[-8]),
    "the line at its offset rewritten": lambda p: _flip(p, boundaries(p.read_bytes())[-4] - 30),
    "the journal replaced by retention": _retention,
    "a directory in its place": lambda p: (checkpoint.path_for(p).unlink(),
                                           checkpoint.path_for(p).mkdir()),
}


@pytest.mark.parametrize("spoil", list(SPOIL))
def test_a_checkpoint_that_does_not_hold_is_a_full_replay(with_checkpoint: Path,
                                                          spoil: str) -> None:
    path = with_checkpoint
    SPOIL[spoil](path)
    copy = path.with_name("copy.jsonl")
    shutil.copy(path, copy)
    got, rcv = started(path)
    whole, rcv_full = full(copy)
    try:
        assert got.resumed is None
        assert "not used" in got.why
        assert got.records == len(read_journal(copy).records)
        assert observed(got.readers, rcv) == observed(whole, rcv_full)
    finally:
        rcv.journal.close()
        rcv_full.journal.close()


def test_a_checkpoint_of_another_agent_or_format_is_refused(
        with_checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(checkpoint.CheckpointRefused, match="another agent"):
        checkpoint.read(checkpoint.path_for(with_checkpoint), "another0another0")
    monkeypatch.setattr(checkpoint, "VERSION", checkpoint.VERSION + 1)
    with pytest.raises(checkpoint.CheckpointRefused, match="format version"):
        checkpoint.read(checkpoint.path_for(with_checkpoint), AGENT)
    got, rcv = started(with_checkpoint)
    try:
        assert got.resumed is None
        assert "format version" in got.why
    finally:
        rcv.journal.close()


def test_doctor_takes_a_checkpoint_for_state_not_damage(with_checkpoint: Path) -> None:
    home = with_checkpoint.parent.parent
    (home / "journal").mkdir(mode=0o700)
    for p in (with_checkpoint, checkpoint.path_for(with_checkpoint)):
        p.rename(home / "journal" / p.name)
    assert all(f.ok for f in journals(home, [], fix=False))
    assert all(f.ok for f in permissions(home, fix=False))
    (home / "journal" / f"{AGENT}.ckpt").chmod(0o644)
    assert not all(f.ok for f in permissions(home, fix=False))


# -- an agent: stop, start again ----------------------------------------------------------------


async def _answers(agent: Agent) -> tuple[Any, ...]:
    assert agent.a2a is not None
    tasks = sorted((s.id, s.state, s.owner) for s in agent.a2a.store.all())
    return [e.to_tool_dict() for e in agent.mailbox()], tasks


def test_an_agent_restarts_from_its_checkpoint_reading_only_the_tail(tmp_path: Path) -> None:
    async def run() -> None:
        with short_dir("ct-ck-") as rt:
            env = {"XDG_RUNTIME_DIR": str(rt)}
            registry = Registry(tmp_path / "state")
            policy = CheckpointPolicy(write_after=1)

            def bob() -> Agent:
                return Agent(registry, AgentSpec(FakeHarness(name="fake"), "sess-b", "/w/p",
                                                 "bob"), env=env, checkpoint_policy=policy)

            alice = Agent(registry, AgentSpec(FakeHarness(name="fake"), "sess-a", "/w/p",
                                              "alice"), env=env)
            first = bob()
            await alice.start()
            await first.start()
            try:
                for i in range(5):
                    await alice.send("bob", f"inform {i}")
                await alice.send("bob", "open ask", kind="ask", until_delivered=True)
                before = await _answers(first)
                assert first.journal is not None
                path = first.journal.path
            finally:
                await first.stop()  # a clean stop advances the checkpoint to the end
            assert checkpoint.path_for(path).exists()
            on_disk = len(read_journal(path).records)
            second = bob()
            await second.start()
            try:
                assert second.started is not None
                assert second.started.resumed is not None, second.started.why
                assert second.started.records == 0  # nothing was written after the stop
                assert await _answers(second) == before
            finally:
                await second.stop()
            assert len(read_journal(path).records) >= on_disk
            third = Agent(registry, AgentSpec(FakeHarness(name="fake"), "sess-b", "/w/p",
                                              "bob"), env=env,
                          checkpoint_policy=CheckpointPolicy(enabled=False))
            await third.start()
            try:
                assert third.started is not None
                assert third.started.resumed is None
                assert third.started.records == len(read_journal(path).records)
                assert await _answers(third) == before
            finally:
                await third.stop()
                await alice.stop()

    asyncio.run(run())


def test_a_start_keeps_the_state_before_finish_while_the_agent_goes_on(
        product_journal: bytes, tmp_path: Path) -> None:
    """The start's checkpoint is encoded in a thread after ``finish()`` settled and the agent
    served (:meth:`StartPass.frozen`): for every crash point, what the copy encodes is what
    the readers held before finish, whatever finish and serving changed since."""
    changed = 0
    for n, end in enumerate(boundaries(product_journal)[1:]):
        path = tmp_path / f"j{n}.jsonl"
        path.write_bytes(product_journal[:end])
        readers, _ = full(path)
        before = readers.sections()
        frozen = readers.frozen()
        readers.restore.finish()  # settles: entries change state, asks close
        for stored in readers.tasks.latest.values():
            stored.refs.append("later")  # what a continuation does to a live task
            assert stored.task is not None  # a read parses it and drops its JSON
        for raw in read_journal(path).records:
            readers.mailbox.add(raw)  # the live mailbox goes on folding
        try:
            changed += readers.sections() != before
        except ValueError:  # the live readers are past replay: sections() refuses them
            changed += 1
        assert frozen.sections() == before, f"crash point {n}"
    assert changed, "no crash point where the start's state changed after the pass"
