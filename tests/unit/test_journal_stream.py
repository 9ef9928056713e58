"""``Journal.replay(each=...)``: the streaming replay a restart folds its journal with.

It must hand over exactly what ``replay()`` returns, keep none of it, refuse to be written to
from inside, and leave the journal (its ``seq`` count, the garbage collector) as it found it
even when a reader fails halfway.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest

from crosstalk.store.journal import Journal, JournalError
from crosstalk.store.journal_format import encode_line
from crosstalk.store.journal_read import Damage


def write(path: Path, n: int) -> list[dict[str, Any]]:
    with Journal(path) as j:
        stored = [j.append({"n": i, "text": "é☃" * i}) for i in range(n)]
        stored += j.append_batch([{"n": n + i} for i in range(3)])
    return stored


def test_it_hands_over_what_replay_returns_and_keeps_none(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    stored = write(path, 6)
    with path.open("ab") as f:  # a line that does not decode, then a torn tail
        f.write(b'{"c":"00000000","r":{"n":99}}\n' + encode_line({"n": 100})[:-5])
    with Journal(path) as j:
        seen: list[dict[str, Any]] = []
        streamed = j.replay(seen.append)
        assert streamed.records == []
        assert seen == stored
        listed = Journal(path).replay()
        assert listed.records == stored
        assert streamed.end == listed.end
        assert [d.reason for d in streamed.damage] == ["checksum", "torn_tail"]
        assert isinstance(streamed.damage[0], Damage)


def test_a_reader_cannot_write_to_the_journal_it_is_reading(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    write(path, 2)
    with Journal(path) as j:
        def append_from_inside(raw: dict[str, Any]) -> None:
            j.append({"inside": True})

        with pytest.raises(JournalError, match="streaming replay"):
            j.replay(append_from_inside)
        assert [r["n"] for r in j.replay().records] == [0, 1, 2, 3, 4]


def test_a_reader_that_fails_halfway_leaves_seq_and_the_collector_as_they_were(
        tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    stored = write(path, 4)
    with Journal(path) as j:
        j.replay()  # the journal has counted every seq

        def fail_at_third(raw: dict[str, Any]) -> None:
            if raw["n"] == 2:
                raise RuntimeError("reader failed")

        assert gc.isenabled()
        with pytest.raises(RuntimeError):
            j.replay(fail_at_third)
        assert gc.isenabled()
        after = j.append({"n": "after"})
        assert after["seq"] == stored[-1]["seq"] + 1
