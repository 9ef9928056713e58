"""Following journals on real files: tails at start, growth, damage, replacement, vanishing."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from crosstalk.store.journal import Journal
from crosstalk.store.journal_format import encode_line
from crosstalk.watch.journals import TORN_GRACE, JournalFollower

A = "a" * 16
B = "b" * 16


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def journal_dir(tmp_path: Path) -> Path:
    d = tmp_path / "journal"
    d.mkdir()
    return d


def write(d: Path, agent: str, n: int, start: int = 1) -> None:
    with Journal(d / f"{agent}.jsonl") as j:
        for i in range(start, start + n):
            j.append({"subject": "nudge", "peer": f"p{i}", "count": i})


def seqs(batches: list[Any], agent: str | None = None) -> list[int]:
    return [r["seq"] for b in batches if agent in (None, b.agent_id) for r in b.records]


def follower(d: Path, tail: int = 1 << 20, clock: Clock | None = None) -> JournalFollower:
    return JournalFollower(d, tail, min_tail=0, clock=clock or Clock())


def test_reads_every_journal_then_only_what_was_appended(tmp_path: Path) -> None:
    d = journal_dir(tmp_path)
    write(d, A, 3)
    f = follower(d)
    batches, notices = f.poll()
    assert seqs(batches) == [1, 2, 3]
    assert not notices
    assert f.poll() == ([], [])
    write(d, A, 2, start=4)
    write(d, B, 1)
    batches, _ = f.poll()
    assert seqs(batches, A) == [4, 5]
    assert seqs(batches, B) == [1]
    assert all(b.whole for b in batches)


def test_a_first_look_reads_only_the_tail_from_a_whole_line(tmp_path: Path) -> None:
    d = journal_dir(tmp_path)
    write(d, A, 200)
    line = len((d / f"{A}.jsonl").read_bytes()) // 200
    batches, notices = follower(d, tail=line * 10 + 7).poll()
    got = seqs(batches)
    assert got == list(range(got[0], 201))
    assert 9 <= len(got) <= 11
    assert not notices
    assert not batches[0].whole


def test_a_damaged_line_is_one_notice_and_the_rest_is_read(tmp_path: Path) -> None:
    d = journal_dir(tmp_path)
    write(d, A, 2)
    with open(d / f"{A}.jsonl", "ab") as fh:
        fh.write(b'{"c":"00000000","r":{"subject":"nudge"}}\n')
        fh.write(encode_line({"subject": "nudge", "peer": "x", "count": 1, "seq": 3}))
    f = follower(d)
    batches, notices = f.poll()
    assert seqs(batches) == [1, 2, 3]
    assert len(notices) == 1
    assert "damaged line" in notices[0].what
    assert "checksum" in notices[0].what
    assert f.poll() == ([], [])


def test_a_torn_tail_waits_then_is_told_once_and_reading_goes_on(tmp_path: Path) -> None:
    d = journal_dir(tmp_path)
    write(d, A, 1)
    clock = Clock()
    f = follower(d, clock=clock)
    f.poll()
    with open(d / f"{A}.jsonl", "ab") as fh:
        fh.write(b'{"c":"1234')
    assert f.poll() == ([], [])  # a writer may be mid-write
    clock.now += TORN_GRACE
    _, notices = f.poll()
    assert len(notices) == 1
    assert "torn line" in notices[0].what
    clock.now += TORN_GRACE
    assert f.poll()[1] == []
    write(d, A, 1, start=2)  # the owner's next append cuts the fragment off
    batches, notices = f.poll()
    assert seqs(batches) == [2]
    assert not notices


def test_a_file_replaced_under_the_reader_is_read_anew_without_repeats(tmp_path: Path) -> None:
    d = journal_dir(tmp_path)
    write(d, A, 5)
    f = follower(d)
    assert seqs(f.poll()[0]) == [1, 2, 3, 4, 5]
    path = d / f"{A}.jsonl"
    kept = path.read_bytes().splitlines(keepends=True)[3:]  # retention keeps seq 4, 5
    new = tmp_path / "new.jsonl"
    new.write_bytes(b"".join(kept) + b"".join(
        encode_line({"subject": "nudge", "peer": "p", "count": 1, "seq": s}) for s in (6, 7)))
    os.replace(new, path)
    batches, notices = f.poll()
    assert seqs(batches) == [6, 7]
    assert not notices


def test_a_vanished_journal_is_a_notice_and_the_others_go_on(tmp_path: Path) -> None:
    d = journal_dir(tmp_path)
    write(d, A, 1)
    write(d, B, 1)
    f = follower(d)
    f.poll()
    (d / f"{A}.jsonl").unlink()
    write(d, B, 1, start=2)
    batches, notices = f.poll()
    assert seqs(batches) == [2]
    assert len(notices) == 1
    assert "vanished" in notices[0].what
    assert f.agents == [B]


def test_an_unreadable_journal_is_told_once_and_retried(tmp_path: Path) -> None:
    d = journal_dir(tmp_path)
    path = d / f"{A}.jsonl"
    path.mkdir()  # unreadable as a journal for every user, root too
    f = follower(d)
    _, notices = f.poll()
    assert len(notices) == 1
    assert "cannot read" in notices[0].what
    assert f.poll() == ([], [])
    path.rmdir()
    write(d, A, 1)
    assert seqs(f.poll()[0]) == [1]


def test_the_start_budget_is_shared_by_size(tmp_path: Path) -> None:
    d = journal_dir(tmp_path)
    write(d, A, 400)
    write(d, B, 100)
    line = len((d / f"{B}.jsonl").read_bytes()) // 100
    batches, _ = JournalFollower(d, 50 * line, min_tail=0, clock=Clock()).poll()
    a, b = len(seqs(batches, A)), len(seqs(batches, B))
    assert 36 <= a <= 41  # four fifths of 50 lines
    assert 8 <= b <= 11
