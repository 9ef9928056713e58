"""Group commit (crosstalk.store.commit): staged appends share one write and one fsync, each
caller answered only after its own records are durable; a failed batch fails every caller in
it and leaves the file replayable."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import pytest

from crosstalk.store.journal import Journal, JournalError, JournalWriteError, RecordTooLarge
from tests.support.faulty_ops import FaultyOps

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def rec(i: int, text: str = "x") -> dict[str, object]:
    return {"subject": "test", "id": f"r{i}", "text": text}


def ids(journal: Journal) -> list[str]:
    return [r["id"] for r in journal.replay().records]


async def test_concurrent_stages_share_one_write_and_fsync(tmp_path: Path) -> None:
    ops = FaultyOps()
    with Journal(tmp_path / "j.jsonl", ops=ops) as journal:
        groups = [journal.commit.stage([rec(i), rec(i + 100)]) for i in range(40)]
        stored = await asyncio.gather(*(g.future for g in groups if g.future is not None))
        assert ops.fsyncs == 1, "forty callers, one fsync"
        assert ops.writes == 1
        seqs = [r["seq"] for pair in stored for r in pair]
        assert seqs == list(range(1, 81)), "each caller's records as stored, in staging order"
        assert ids(journal) == [f"r{j}" for i in range(40) for j in (i, i + 100)]


async def test_each_caller_answered_only_after_its_fsync(tmp_path: Path) -> None:
    seen: list[int] = []

    class Watching(FaultyOps):
        def fsync(self, fd: int) -> None:
            super().fsync(fd)
            seen.append(self.fsyncs)

    with Journal(tmp_path / "j.jsonl", ops=Watching()) as journal:
        group = journal.commit.stage([rec(1)])
        assert group.future is not None
        assert not group.future.done(), "nothing is answered before the loop writes it"
        await group.future
        assert seen == [1]
        assert group.written is True


async def test_a_failed_fsync_fails_every_caller_and_leaves_the_file_replayable(
        tmp_path: Path) -> None:
    ops = FaultyOps(fail_fsync={2})
    path = tmp_path / "j.jsonl"
    with Journal(path, ops=ops) as journal:
        journal.append(rec(0))
        groups = [journal.commit.stage([rec(i)]) for i in range(1, 6)]
        results = await asyncio.gather(*(g.future for g in groups if g.future is not None),
                                       return_exceptions=True)
        assert all(isinstance(r, JournalWriteError) for r in results)
        assert all(g.written is False for g in groups)
        assert ids(journal) == ["r0"], "the failed batch was rolled back"
        later = journal.commit.stage([rec(9)])
        assert later.future is not None
        assert (await later.future)[0]["seq"] == 2, "seq resumes after the last durable record"
    with Journal(path) as reopened:
        assert ids(reopened) == ["r0", "r9"]
        assert reopened.replay().damage == []


async def test_a_record_too_large_fails_alone(tmp_path: Path) -> None:
    with Journal(tmp_path / "j.jsonl", max_line=400) as journal:
        ok1 = journal.commit.stage([rec(1)])
        big = journal.commit.stage([rec(2, "y" * 1000)])
        ok2 = journal.commit.stage([rec(3)])
        results = await asyncio.gather(ok1.future, big.future, ok2.future,  # type: ignore[arg-type]
                                       return_exceptions=True)
        assert isinstance(results[1], RecordTooLarge)
        assert [r[0]["seq"] for r in (results[0], results[2])] == [1, 2]  # type: ignore[index]
        assert ids(journal) == ["r1", "r3"]


async def test_a_group_after_a_failed_one_is_not_written(tmp_path: Path) -> None:
    with Journal(tmp_path / "j.jsonl", max_line=400) as journal:
        first = journal.commit.stage([rec(1, "y" * 1000)])  # fails to encode
        second = journal.commit.stage([rec(2)], after=first)
        third = journal.commit.stage([rec(3)])
        results = await asyncio.gather(first.future, second.future, third.future,  # type: ignore[arg-type]
                                       return_exceptions=True)
        assert isinstance(results[0], RecordTooLarge)
        assert isinstance(results[1], JournalWriteError), "what it follows was not written"
        assert ids(journal) == ["r3"]


async def test_a_group_after_an_earlier_written_batch_is_written(tmp_path: Path) -> None:
    with Journal(tmp_path / "j.jsonl") as journal:
        first = journal.commit.stage([rec(1)])
        assert first.future is not None
        await first.future
        second = journal.commit.stage([rec(2)], after=first)
        assert second.future is not None
        await second.future
        assert ids(journal) == ["r1", "r2"]


async def test_a_synchronous_append_takes_what_is_staged_ahead_of_it(tmp_path: Path) -> None:
    ops = FaultyOps()
    with Journal(tmp_path / "j.jsonl", ops=ops) as journal:
        staged = journal.commit.stage([rec(1)])
        stored = journal.append(rec(2))
        assert ops.fsyncs == 1, "one write for the staged record and the append"
        assert stored["seq"] == 2
        assert staged.future is not None
        assert (await staged.future)[0]["seq"] == 1
        assert ids(journal) == ["r1", "r2"]


async def test_a_synchronous_append_fails_with_the_batch_it_joined(tmp_path: Path) -> None:
    ops = FaultyOps(fail_write={1})
    with Journal(tmp_path / "j.jsonl", ops=ops) as journal:
        staged = journal.commit.stage([rec(1)])
        with pytest.raises(JournalWriteError):
            journal.append(rec(2))
        assert staged.future is not None
        with pytest.raises(JournalWriteError):
            await staged.future
        assert ids(journal) == []


async def test_a_closed_journal_fails_what_is_staged(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.jsonl")
    group = journal.commit.stage([rec(1)])
    journal.close()
    assert group.future is not None
    with pytest.raises(JournalError, match="closed"):
        await group.future
    await journal.commit.idle()


async def test_writes_in_a_thread_overlap_new_stages(tmp_path: Path) -> None:
    """Arrivals while a write is in flight are all taken by the next write."""
    ops = FaultyOps()
    with Journal(tmp_path / "j.jsonl", ops=ops) as journal:
        first = [journal.commit.stage([rec(i)]) for i in range(8)]  # a threaded write
        await asyncio.sleep(0)  # the write starts
        second = [journal.commit.stage([rec(i)]) for i in range(8, 16)]
        await asyncio.gather(*(g.future for g in first + second if g.future is not None))
        assert ops.fsyncs <= 3, "sixteen callers in at most a few writes"
        assert ids(journal) == [f"r{i}" for i in range(16)]
        await journal.commit.idle()


async def test_a_failure_read_only_through_then_is_not_logged_as_never_retrieved(
        tmp_path: Path) -> None:
    # A caller that hooks ``then`` and reads ``written`` (as the receiver's state changes do)
    # never awaits the future: its failure must not reach the loop's exception handler as
    # "Future exception was never retrieved" once the group is collected.
    loop = asyncio.get_running_loop()
    reported: list[dict[str, object]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        with Journal(tmp_path / "j.jsonl", ops=FaultyOps(fail_write={1})) as journal:
            seen: list[bool | None] = []

            def stage() -> None:  # the group is the caller's only: gone when this returns
                group = journal.commit.stage([rec(1)])
                group.then(lambda: seen.append(group.written))

            stage()
            await journal.commit.idle()
            assert seen == [False]
            gc.collect()
        assert reported == []
    finally:
        loop.set_exception_handler(previous)


async def test_a_lazy_group_rides_with_the_next_write(tmp_path: Path) -> None:
    # An admission staged while the lane injects: it starts no write; the lane's next stage
    # (eager) takes it into its own write and fsync.
    ops = FaultyOps()
    with Journal(tmp_path / "j.jsonl", ops=ops) as journal:
        lazy = journal.commit.stage([rec(1)], lazy=True)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert ops.fsyncs == 0, "a lazy group waits for company"
        assert lazy.written is None
        eager = journal.commit.stage([rec(2)])
        await asyncio.gather(lazy.settled(), eager.settled())
        assert lazy.written
        assert eager.written
        assert ops.fsyncs == 1, "one write carried both"
        assert ids(journal) == ["r1", "r2"]


async def test_a_lazy_group_alone_is_written_anyway(tmp_path: Path) -> None:
    # Nothing else comes (the lane's inject is slow): the group is written after its wait,
    # and idle() waits for it like any staged group.
    ops = FaultyOps()
    with Journal(tmp_path / "j.jsonl", ops=ops) as journal:
        lazy = journal.commit.stage([rec(1)], lazy=True)
        await journal.commit.idle()
        assert lazy.written is True
        assert ops.fsyncs == 1
        again = journal.commit.stage([rec(2)], lazy=True)
        assert again.future is not None
        stored = await again.future
        assert [(r["id"], r["seq"]) for r in stored] == [("r2", 2)]
        assert ids(journal) == ["r1", "r2"]


async def test_lazy_groups_left_after_a_write_wait_for_company_again(tmp_path: Path) -> None:
    # Staged while a write is in flight, lazy groups are not written the moment it ends: the
    # next eager stage takes them (or their wait ends); file order is staging order.
    ops = FaultyOps()
    with Journal(tmp_path / "j.jsonl", ops=ops) as journal:
        first = journal.commit.stage([rec(1)])
        await asyncio.sleep(0)  # the write of r1 is under way (inline: already done)
        lazies = [journal.commit.stage([rec(i)], lazy=True) for i in (2, 3)]
        last = journal.commit.stage([rec(4)])
        await asyncio.gather(*(g.settled() for g in (first, *lazies, last)))
        assert all(g.written for g in (first, *lazies, last))
        assert ids(journal) == ["r1", "r2", "r3", "r4"]
        assert ops.fsyncs == 2, "r2-r4 in one write"
