"""The per-agent journal (``store/journal.py``) against the damage it must survive.

Torn tails at every byte offset, flipped bytes, injected write/fsync/ftruncate failures through
the ``FileOps`` seam, the record cap, retention by dependency set, file modes and the lock-free
reader. Everything runs on real files in ``tmp_path``.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

from crosstalk import config
from crosstalk.config import PRIVATE_FILE_MODE, RETENTION_SECONDS
from crosstalk.store import journal as journal_mod
from crosstalk.store.journal import Journal, JournalError, JournalWriteError, RecordTooLarge
from crosstalk.store.journal_format import decode_line, encode_line
from crosstalk.store.journal_read import Damage, read_journal
from tests.support.faulty_ops import FaultyOps

HOUR = 3600.0
DAY = 24 * HOUR
T0 = 1_700_000_000.0
CORRUPT = {"checksum", "framing", "json"}


# -- helpers -------------------------------------------------------------------------------


def strip(record: Mapping[str, Any]) -> dict[str, Any]:
    """A stored record without the fields the journal adds."""
    return {k: v for k, v in record.items() if k not in ("seq", "ts")}


def line_ends(data: bytes) -> list[int]:
    """The offset just past each newline: where each complete line ends."""
    return [i + 1 for i, byte in enumerate(data) if byte == ord("\n")]


def assert_clean_file(path: Path) -> list[dict[str, Any]]:
    """Every line in the file is a whole, valid journal line; return the records."""
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n"), "file must end on a line boundary"
    records: list[dict[str, Any]] = []
    for raw in data.split(b"\n")[:-1]:
        decoded = decode_line(raw)
        assert isinstance(decoded, dict), f"undecodable line ({decoded}): {raw[:80]!r}"
        records.append(decoded)
    return records


def assert_seqs_contiguous(records: Iterable[Mapping[str, Any]]) -> None:
    seqs = [r["seq"] for r in records]
    assert seqs == list(range(1, len(seqs) + 1))


class Clock:
    """A settable clock for the ``clock=`` seam."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def write_five(path: Path, clock: Callable[[], float] | None = None) -> list[dict[str, Any]]:
    """Five records of different lengths, with multi-byte UTF-8 so cuts split characters."""
    with Journal(path, clock=clock or Clock()) as j:
        return [j.append({"n": i, "text": "é☃" * i + "x" * (5 * i)}) for i in range(5)]


# -- 1. torn tail at every byte offset --------------------------------------------------------


@pytest.mark.parametrize("replay_first", [True, False], ids=["replay-then-append", "append"])
def test_torn_tail_at_every_offset(tmp_path: Path, replay_first: bool) -> None:
    src = tmp_path / "src.jsonl"
    stored = write_five(src)
    data = src.read_bytes()
    ends = line_ends(data)
    assert len(ends) == 5
    start_of_third = ends[1]
    for cut in range(start_of_third, len(data) + 1):
        path = tmp_path / f"cut-{cut}.jsonl"
        path.write_bytes(data[:cut])
        whole = sum(1 for e in ends if e <= cut)
        boundary = ends[whole - 1]
        with Journal(path) as j:
            if replay_first:
                rep = j.replay()
                assert rep.records == stored[:whole], f"cut at {cut}"
                assert rep.end == boundary
                if cut == boundary:
                    assert rep.damage == []
                else:
                    assert rep.damage == [Damage(boundary, cut - boundary, "torn_tail")]
                assert j.last_seq == whole
            new = j.append({"after": cut})
        assert new["seq"] == whole + 1, f"cut at {cut}: seq must continue from the valid prefix"
        after = read_journal(path)
        assert after.damage == [], f"cut at {cut}"
        assert after.records == [*stored[:whole], new]
        assert assert_clean_file(path) == after.records
        path.unlink()


def test_torn_tail_left_by_another_writer_is_repaired_by_an_open_journal(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    with Journal(path) as j:
        first = j.append({"n": 1})
        # another process died half-way through its line, after we had caught up
        with path.open("ab") as f:
            f.write(encode_line({"n": 99, "seq": 2, "ts": 0.0})[:-9])
        rep = j.replay()
        assert rep.records == [first]
        assert [d.reason for d in rep.damage] == ["torn_tail"]
        with path.open("ab") as f:  # and again, this time found by append itself
            f.write(b'{"c":"0000')
        second = j.append({"n": 2})
    assert second["seq"] == 2
    assert read_journal(path).records == [first, second]
    assert_clean_file(path)


def test_last_line_missing_only_its_newline_is_torn(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    stored = write_five(path)
    data = path.read_bytes()
    path.write_bytes(data[:-1])  # every byte of record 5 except the newline: never acked
    with Journal(path) as j:
        rep = j.replay()
        assert rep.records == stored[:4]
        assert rep.damage == [Damage(line_ends(data)[3], len(data) - 1 - line_ends(data)[3],
                                     "torn_tail")]
        assert j.append({"n": "again"})["seq"] == 5


def test_torn_batch_at_every_offset_is_all_or_nothing(tmp_path: Path) -> None:
    """A writer killed inside one append_batch write leaves no part of the batch behind."""
    src = tmp_path / "src.jsonl"
    with Journal(src, clock=Clock()) as j:
        singles = [j.append({"n": 0}), j.append({"n": 1, "text": "é☃"})]
        batch = j.append_batch([{"b": k, "text": "ü" * (3 * k)} for k in range(4)])
    data = src.read_bytes()
    start = line_ends(data)[1]
    assert data[start : start + 6] == b'{"b":"', "non-final batch lines carry the marker"
    assert data.rsplit(b"\n", 2)[-2].startswith(b'{"c":"'), "the batch's last line does not"
    for cut in range(start, len(data) + 1):
        path = tmp_path / f"cut-{cut}.jsonl"
        path.write_bytes(data[:cut])
        expected = singles + batch if cut == len(data) else singles
        torn = [] if cut in (start, len(data)) else [Damage(start, cut - start, "torn_tail")]
        rep = read_journal(path)
        assert (rep.records, rep.damage) == (expected, torn), f"cut at {cut}"
        with Journal(path) as j:
            replayed = j.replay()
            assert (replayed.records, replayed.damage) == (expected, torn), f"cut at {cut}"
            new = j.append({"after": cut})
        assert new["seq"] == len(expected) + 1
        after = read_journal(path)
        assert (after.records, after.damage) == ([*expected, new], [])
        path.unlink()


def test_batch_lines_mid_file_are_records_even_if_their_end_is_damaged(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    with Journal(path, clock=Clock()) as j:
        batch = j.append_batch([{"k": 0}, {"k": 1}, {"k": 2}])
        later = j.append({"n": "later"})
    data = bytearray(path.read_bytes())
    data[line_ends(bytes(data))[2] - 3] ^= 0x01  # the batch's last line
    path.write_bytes(bytes(data))
    rep = read_journal(path)
    assert rep.records == [*batch[:2], later]
    assert [d.reason for d in rep.damage] == ["checksum"]


def test_damaged_last_line_is_not_mistaken_for_an_unfinished_batch(tmp_path: Path) -> None:
    """``c`` -> ``b`` in the last line's head is damage to report, not a torn write to cut."""
    path = tmp_path / "j.jsonl"
    stored = write_five(path)
    data = bytearray(path.read_bytes())
    last = line_ends(bytes(data))[3]
    assert data[last + 2] == ord("c")
    data[last + 2] = ord("b")
    path.write_bytes(bytes(data))
    with Journal(path) as j:
        rep = j.replay()
        assert rep.records == stored[:4]
        assert rep.damage == [Damage(last, len(data) - 1 - last, "checksum")]
        new = j.append({"n": "after"})
    assert path.read_bytes() == bytes(data) + encode_line(new), "the damaged line is kept"


# -- 2. a flipped byte mid-file ----------------------------------------------------------------


def _middle_record_with_awkward_checksum(path: Path, *, batch: bool) -> list[dict[str, Any]]:
    """Five records; the third one's CRC starts with ``0`` and has a hex letter in it.

    That makes the exhaustive flip test cover the checksum field's lenient spellings: a
    leading zero flipped to ``+``/space and a letter flipped to upper case. With ``batch``
    records 2-4 are one ``append_batch``, so the third line is a batch continuation line.
    """
    clock = Clock()
    for k in range(10_000):
        probe = {"n": 2, "text": f"middle-{k}", "seq": 3, "ts": clock()}
        crc = encode_line(probe, more=batch)[6:14]
        if crc.startswith(b"0") and any(c in b"abcdef" for c in crc):
            break
    else:  # pragma: no cover - 10 000 tries make this essentially impossible
        pytest.fail("no suitable record found")
    with Journal(path, clock=clock) as j:
        out = [j.append({"n": 0, "text": "first"})]
        rest = [{"n": 1, "text": "second é"}, {"n": 2, "text": f"middle-{k}"},
                {"n": 3, "text": "fourth"}]
        if batch:
            out += j.append_batch([rest[0]]) + j.append_batch([*rest[1:], {"n": 4}])
        else:
            out += [j.append(r) for r in rest] + [j.append({"n": 4})]
    assert encode_line(out[2], more=batch) == path.read_bytes().split(b"\n")[2] + b"\n"
    assert encode_line(out[2], more=batch)[6:7] == b"0"
    return out


def _flips(byte: int) -> set[int]:
    return {byte ^ m for m in (0x01, 0x02, 0x10, 0x20, 0x40, 0x80, 0xFF)} | {ord("\n"), 0}


@pytest.mark.parametrize("batch", [False, True], ids=["single", "batch-continuation-line"])
def test_flipped_byte_anywhere_in_a_middle_record_is_detected(
    tmp_path: Path, batch: bool
) -> None:
    src = tmp_path / "src.jsonl"
    stored = _middle_record_with_awkward_checksum(src, batch=batch)
    data = src.read_bytes()
    ends = line_ends(data)
    start, stop = ends[1], ends[2]  # the third line, its newline at stop - 1
    path = tmp_path / "flipped.jsonl"
    cases = 0
    for pos in range(start, stop):
        for new in sorted(_flips(data[pos]) - {data[pos]}):
            cases += 1
            bad = bytearray(data)
            bad[pos] = new
            path.write_bytes(bytes(bad))
            where = f"byte {pos - start} of the line set to {new:#04x}"
            rep = read_journal(path)
            # a flipped newline merges lines 3 and 4, and both are lost (ADR 0001)
            expected = stored[:2] + (stored[4:] if pos == stop - 1 else stored[3:])
            assert rep.records == expected, where
            assert rep.damage, where
            assert {d.reason for d in rep.damage} <= CORRUPT, where
            assert all(start <= d.offset < ends[3] for d in rep.damage), where
            if pos != stop - 1 and new != ord("\n"):
                assert rep.damage == [Damage(start, stop - 1 - start, rep.damage[0].reason)], where
            with Journal(path) as j:
                replayed = j.replay()
                assert replayed.records == expected, where
                assert replayed.damage == rep.damage, where
                assert j.append({"n": "after"})["seq"] == 6, where
            after = read_journal(path)
            assert [strip(r) for r in after.records[-1:]] == [{"n": "after"}], where
            assert after.records[:-1] == expected, where
            assert after.damage == rep.damage, where
    assert cases > 500


def test_flipped_byte_in_first_and_last_line(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    stored = write_five(path)
    data = bytearray(path.read_bytes())
    data[10] ^= 0x01  # first line, inside the checksum
    data[-3] ^= 0x01  # last line, inside the record body
    path.write_bytes(bytes(data))
    with Journal(path) as j:
        rep = j.replay()
        assert rep.records == stored[1:4]
        assert [d.reason for d in rep.damage] in (["framing", "checksum"], ["checksum"] * 2)
        # the damaged last line held the highest seq; its seq is not trusted
        assert j.append({"n": "x"})["seq"] == 5


# -- 3. fault injection through the FileOps seam ---------------------------------------------


SCRIPT: list[list[dict[str, Any]]] = [
    [{"step": s, "k": k, "pad": "p" * (40 + 13 * s)} for k in range(1 + s % 3)] for s in range(14)
]


def _run_script(j: Journal) -> tuple[list[dict[str, Any]], list[int]]:
    """Run SCRIPT; return the acknowledged records and the steps whose append failed."""
    acked: list[dict[str, Any]] = []
    failed: list[int] = []
    for step, batch in enumerate(SCRIPT):
        before = j.last_seq
        try:
            if len(batch) == 1:
                acked.append(j.append(batch[0]))
            else:
                acked.extend(j.append_batch(list(batch)))
        except JournalWriteError:
            failed.append(step)
            assert j.last_seq == before, "a failed append must not consume a seq"
    return acked, failed


def _assert_replays_to(path: Path, j: Journal, acked: list[dict[str, Any]]) -> None:
    rep = j.replay()
    assert rep.damage == []
    assert rep.records == acked
    assert_seqs_contiguous(rep.records)
    assert assert_clean_file(path) == acked
    with Journal(path) as fresh:
        again = fresh.replay()
    assert again.damage == []
    assert again.records == acked


@pytest.mark.parametrize("err", [errno.EIO, errno.ENOSPC], ids=["EIO", "ENOSPC"])
@pytest.mark.parametrize(
    ("kind", "max_chunk", "partial"),
    [
        ("fsync", None, False),
        ("write", None, False),
        ("write", None, True),
        ("write", 37, False),  # short writes: several write calls per append
        ("write", 37, True),
    ],
    ids=["fsync", "write", "write-partial", "short-write", "short-write-partial"],
)
@pytest.mark.parametrize("nth", range(1, 13))
def test_nth_call_fails(
    tmp_path: Path, nth: int, kind: str, max_chunk: int | None, partial: bool, *, err: int
) -> None:
    path = tmp_path / "j.jsonl"
    ops = FaultyOps(
        fail_write={nth} if kind == "write" else (),
        fail_fsync={nth} if kind == "fsync" else (),
        err=err,
        max_chunk=max_chunk,
        partial=partial,
    )
    with Journal(path, ops=ops) as j:
        acked, failed = _run_script(j)
        assert ops.raised == 1
        assert len(failed) == 1
        # the failed step's records are absent, every other step's present, in order
        expected = [dict(r) for s, b in enumerate(SCRIPT) if s not in failed for r in b]
        assert [strip(r) for r in acked] == expected
        _assert_replays_to(path, j, acked)


@pytest.mark.parametrize("err", [errno.EIO, errno.ENOSPC], ids=["EIO", "ENOSPC"])
@pytest.mark.parametrize("nth", [1, 4, 9])
def test_failure_persisting_over_several_appends(tmp_path: Path, nth: int, err: int) -> None:
    path = tmp_path / "j.jsonl"
    ops = FaultyOps(fail_write=range(nth, nth + 3), err=err, max_chunk=50, partial=True)
    with Journal(path, ops=ops) as j:
        acked, failed = _run_script(j)
        assert 1 <= len(failed) <= 3
        assert len(acked) + sum(len(SCRIPT[s]) for s in failed) == sum(map(len, SCRIPT))
        _assert_replays_to(path, j, acked)


def test_failed_append_error_carries_the_cause(tmp_path: Path) -> None:
    ops = FaultyOps(fail_fsync={1}, err=errno.ENOSPC)
    with Journal(tmp_path / "j.jsonl", ops=ops) as j:
        with pytest.raises(JournalWriteError) as exc:
            j.append({"n": 1})
        assert isinstance(exc.value.__cause__, OSError)
        assert exc.value.__cause__.errno == errno.ENOSPC
        assert (tmp_path / "j.jsonl").stat().st_size == 0


@pytest.mark.parametrize("failure", ["fsync", "write-partial"])
def test_wedged_journal_retries_truncate_then_refuses_then_recovers(
    tmp_path: Path, failure: str
) -> None:
    path = tmp_path / "j.jsonl"
    ops = FaultyOps()
    with Journal(path, ops=ops) as j:
        first = j.append({"n": 1, "text": "acknowledged"})
        clean_size = path.stat().st_size
        # the second append fails and so does the rollback's truncate
        if failure == "fsync":
            ops.fail_fsync = {ops.fsyncs + 1}
        else:
            ops.fail_write, ops.partial = {ops.writes + 1}, True
        ops.truncate_broken = True
        with pytest.raises(JournalWriteError):
            j.append({"n": 2, "text": "phantom " * 20})
        assert ops.truncates == 1
        assert path.stat().st_size > clean_size, "the failed bytes are still there (wedged)"

        # still wedged: the next append retries the truncate and refuses without writing
        writes = ops.writes
        with pytest.raises(JournalWriteError, match="wedged"):
            j.append({"n": 3})
        assert ops.truncates == 2
        assert ops.writes == writes
        with pytest.raises(JournalWriteError, match="wedged"):
            j.append_batch([{"n": 3}, {"n": 4}])
        assert ops.writes == writes

        # the disk comes back: the truncate succeeds first, then the append
        ops.truncate_broken = False
        third = j.append({"n": 3, "text": "after"})
        assert third["seq"] == 2
        assert path.stat().st_size == clean_size + len(encode_line(third))
        _assert_replays_to(path, j, [first, third])


def test_replay_of_a_wedged_journal_never_serves_the_phantom(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    ops = FaultyOps()
    with Journal(path, ops=ops) as j:
        first = j.append({"n": 1})
        ops.fail_fsync, ops.truncate_broken = {ops.fsyncs + 1}, True
        with pytest.raises(JournalWriteError):
            j.append({"n": 2, "phantom": True})
        rep = j.replay()  # reads up to the failed append; never raises for it
        assert rep.records == [first]
        assert rep.damage == []
        with pytest.raises(JournalWriteError, match="wedged"):
            j.append({"n": 3})
        ops.truncate_broken = False
        assert j.replay().records == [first]
        assert assert_clean_file(path) == [first]


@pytest.mark.parametrize("failure", ["write-partial", "fsync"])
def test_wedge_does_not_destroy_another_writers_records(tmp_path: Path, failure: str) -> None:
    """A wedged writer's retried truncate must not cut records another process acked since."""
    path = tmp_path / "j.jsonl"
    ops = FaultyOps()
    a = Journal(path, ops=ops)
    b = Journal(path)  # another process appending to the same journal
    try:
        first = a.append({"who": "a", "n": 1})
        if failure == "fsync":
            ops.fail_fsync = {ops.fsyncs + 1}  # a whole line is written, then fsync fails
        else:
            ops.fail_write, ops.partial = {ops.writes + 1}, True  # a fragment is left
        ops.truncate_broken = True
        with pytest.raises(JournalWriteError):
            a.append({"who": "a", "n": 2, "pad": "z" * 300})
        from_b = b.append({"who": "b", "n": 1})
        ops.truncate_broken = False
        from_a = a.append({"who": "a", "n": 3})
        rep = b.replay()
        assert rep.damage == []
        assert_seqs_contiguous(rep.records)
        assert rep.records[0] == first
        assert rep.records[-2:] == [from_b, from_a]
        if failure == "write-partial":
            # b dropped the fragment as a torn tail; nothing of the failed append survives
            assert rep.records == [first, from_b, from_a]
        else:
            # b saw a's complete (unsynced) line and appended after it; cutting it out now
            # would take b's acknowledged record with it, so it stays (a known residue)
            assert [strip(r) for r in rep.records[1:2]] == [{"who": "a", "n": 2, "pad": "z" * 300}]
    finally:
        a.close()
        b.close()


def test_torn_tail_repair_failure_is_a_write_error(tmp_path: Path) -> None:
    """If the torn-tail truncate fails, append refuses with JournalWriteError, not OSError."""
    path = tmp_path / "j.jsonl"
    first = write_five(path)[:1]
    path.write_bytes(encode_line(first[0]) + b'{"c":"12')
    ops = FaultyOps(truncate_broken=True)
    with Journal(path, ops=ops) as j:
        with pytest.raises(JournalWriteError):
            j.append({"n": "refused"})
        assert ops.writes == 0
        ops.truncate_broken = False
        second = j.append({"n": "accepted"})
        assert second["seq"] == 2
    assert read_journal(path).records == [first[0], second]
    assert_clean_file(path)


def test_replay_serves_the_prefix_when_the_torn_tail_cannot_be_cut(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    first = write_five(path)[:1]
    path.write_bytes(encode_line(first[0]) + b'{"c":"12')
    ops = FaultyOps(truncate_broken=True)
    with Journal(path, ops=ops) as j:
        rep = j.replay()
        assert rep.records == first
        assert [d.reason for d in rep.damage] == ["torn_tail"]
        with pytest.raises(JournalWriteError):
            j.append({"n": "refused"})  # it would glue onto the fragment
        assert ops.writes == 0
        ops.truncate_broken = False
        second = j.append({"n": "accepted"})
    assert read_journal(path).records == [first[0], second]
    assert_clean_file(path)


def test_unserialisable_record_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    with Journal(path) as j:
        j.append({"n": 1})
        size = path.stat().st_size
        with pytest.raises(JournalError):
            j.append({"bad": object()})
        with pytest.raises(JournalError):
            j.append_batch([{"ok": 1}, {"nan": float("nan")}])
        assert path.stat().st_size == size
        assert j.append({"n": 2})["seq"] == 2


def test_closed_journal_refuses(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.jsonl")
    j.close()
    j.close()  # idempotent
    with pytest.raises(JournalError):
        j.append({"n": 1})
    with pytest.raises(JournalError):
        j.replay()


# -- 4. record cap -----------------------------------------------------------------------------


SMALL = 256


def test_record_over_the_cap_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    ops = FaultyOps()
    with Journal(path, ops=ops, max_line=SMALL, clock=Clock()) as j:
        j.append({"n": 1})
        size, writes = path.stat().st_size, ops.writes
        with pytest.raises(RecordTooLarge):
            j.append({"n": 2, "text": "x" * SMALL})
        with pytest.raises(RecordTooLarge):  # one oversize record sinks the whole batch
            j.append_batch([{"n": 2}, {"n": 3, "text": "x" * SMALL}])
        assert path.stat().st_size == size
        assert ops.writes == writes
        second = j.append({"n": 2})
        assert second["seq"] == 2


def test_cap_boundary_is_exactly_the_readers_limit(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    clock = Clock()
    base = len(encode_line({"text": "", "seq": 1, "ts": clock()})) - 1
    with Journal(path, max_line=SMALL, clock=clock) as j:
        exact = j.append({"text": "x" * (SMALL - base)})
        assert len(encode_line(exact)) - 1 == SMALL
        with pytest.raises(RecordTooLarge):
            j.append({"text": "x" * (SMALL - base + 1)})
    rep = read_journal(path, max_line=SMALL)
    assert rep.records == [exact]
    assert rep.damage == []


def test_planted_oversize_line_is_damage_and_skipped(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    with Journal(path) as big:  # a writer with the default (larger) cap
        a = big.append({"n": 1})
        huge = big.append({"n": 2, "text": "y" * (3 * SMALL)})
        b = big.append({"n": 3})
    huge_at = len(encode_line(a))
    with Journal(path, max_line=SMALL) as j:
        rep = j.replay()
        assert rep.records == [a, b]
        assert rep.damage == [Damage(huge_at, len(encode_line(huge)) - 1, "oversize")]
        assert j.append({"n": 4})["seq"] == 4
    assert read_journal(path, max_line=SMALL).damage == rep.damage


def test_oversize_fragment_at_the_tail_is_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    with Journal(path, max_line=SMALL) as j:
        a = j.append({"n": 1})
    size = path.stat().st_size
    with path.open("ab") as f:
        f.write(b'{"c":"00000000","r":{"t":"' + b"z" * (4 * SMALL))
    with Journal(path, max_line=SMALL) as j:
        rep = j.replay()
        assert rep.records == [a]
        assert rep.damage == [Damage(size, 4 * SMALL + 26, "torn_tail")]
        j.append({"n": 2})
    assert [r["n"] for r in assert_clean_file(path)] == [1, 2]


# -- 5. retention ------------------------------------------------------------------------------


def _ask_scenario(j: Journal, clock: Clock) -> dict[str, list[dict[str, Any]]]:
    """Old records: one open ask with its whole dependency set, plus unrelated resolved ones."""
    clock.now = T0
    ask_set = [
        j.append({"type": "dedupe", "id": "m1", "refs": ["sender-a"], "state": "submitted"}),
        j.append({"subject": "message", "id": "m1", "state": "accepted", "text": "the body"}),
        j.append({"type": "task", "id": "t1", "refs": ["m1", "ctx-1"]}),
        j.append({"type": "route", "id": "r1", "refs": ["t1"]}),  # reaches m1 only via t1
        j.append({"subject": "ask", "id": "m1", "state": "open"}),
    ]
    other = [
        j.append({"subject": "message", "id": "m2", "state": "accepted", "text": "old news"}),
        j.append({"type": "dedupe", "id": "m2", "refs": ["sender-b"]}),
        j.append({"type": "nudge", "peer": "x", "count": 30}),  # no id at all
    ]
    return {"ask": ask_set, "other": other}


def test_retention_keeps_open_asks_dependency_set_and_drops_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    clock = Clock()
    with Journal(path, clock=clock) as j:
        recs = _ask_scenario(j, clock)
        clock.now = T0 + DAY - 1  # young: just inside the window at the time of retention
        young = j.append({"subject": "message", "id": "m3", "state": "accepted"})

        # inside the window nothing goes
        res = j.apply_retention(now=T0 + DAY - 10)
        assert (res.kept, res.dropped, res.quarantined) == (9, 0, 0)

        res = j.apply_retention(now=T0 + DAY + HOUR)
        assert (res.kept, res.dropped, res.quarantined) == (6, 3, 0)
        rep = j.replay()
        assert rep.damage == []
        assert rep.records == [*recs["ask"], young]
        assert "old news" not in path.read_text()

        # the ask is answered: its old dependency set is released at once ...
        clock.now = T0 + DAY + 2 * HOUR
        answered = j.append({"subject": "ask", "id": "m1", "state": "answered"})
        res = j.apply_retention(now=T0 + DAY + 3 * HOUR)
        assert (res.kept, res.dropped) == (2, 5)
        assert j.replay().records == [young, answered]
        assert "the body" not in path.read_text()
        # ... and once everything is old, everything goes except the newest record, which
        # carries the seq high-water mark (ADR 0001: seq is kept across retention)
        res = j.apply_retention(now=T0 + 3 * DAY)
        assert (res.kept, res.dropped) == (1, 1)
        rep = j.replay()
        assert rep.damage == []
        assert rep.records == [answered]
        # seq carries on after the newest records were dropped, here and after a replay
        nxt = j.append({"n": "next"})
        assert nxt["seq"] == answered["seq"] + 1
        j.replay()
        assert j.append({"n": "next2"})["seq"] == answered["seq"] + 2
    with Journal(path, clock=clock) as reopened:
        assert reopened.append({"n": "next3"})["seq"] == answered["seq"] + 3
    seqs = [r["seq"] for r in assert_clean_file(path)]
    assert seqs == sorted(seqs)
    assert len(set(seqs)) == len(seqs)


@pytest.mark.damaged_journal  # written by hand to test what replay does with it
def test_retention_keeps_unresolved_message_states(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    clock = Clock()
    with Journal(path, clock=clock) as j:
        keep = [
            j.append({"subject": "message", "id": f"m-{state}", "state": state})
            for state in ("submitted", "dispatching", "unknown", "recovered")
        ]
        keep.append(j.append({"subject": "reply", "id": "r1", "state": "pending"}))
        drop = [
            j.append({"subject": "message", "id": f"d-{state}", "state": state})
            for state in ("accepted", "queued", "rejected", "unreachable", "bounced")
        ]
        drop.append(j.append({"subject": "reply", "id": "r2", "state": "forwarded"}))
        clock.now = T0 + 2 * DAY
        young = j.append({"n": "young"})
        res = j.apply_retention(now=T0 + 2 * DAY)
        assert (res.kept, res.dropped) == (len(keep) + 1, len(drop))
        assert j.replay().records == [*keep, young]


def test_retention_window_defaults_to_the_configured_24h(tmp_path: Path) -> None:
    clock = Clock()
    with Journal(tmp_path / "j.jsonl", clock=clock) as j:
        j.append({"n": 1})
        j.append({"n": 2})
        clock.now = T0 + RETENTION_SECONDS - 1
        assert j.apply_retention().dropped == 0
        clock.now = T0 + RETENTION_SECONDS + 1
        j.append({"n": 3})
        assert j.apply_retention().dropped == 2


def test_retention_quarantines_damaged_lines(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    clock = Clock()
    with Journal(path, clock=clock) as j:
        stored = [j.append({"n": i, "text": "t" * i}) for i in range(6)]
    data = bytearray(path.read_bytes())
    ends = line_ends(bytes(data))
    bad_line = bytes(data[ends[1] : ends[2] - 1])
    data[ends[1] + 30] ^= 0x04  # corrupt record 3
    corrupted = bytes(data[ends[1] : ends[2] - 1])
    assert corrupted != bad_line
    planted_big = encode_line({"text": "q" * 600, "seq": 100, "ts": T0})
    path.write_bytes(bytes(data[: ends[3]]) + planted_big + bytes(data[ends[3] :]) + b'{"c":')
    with Journal(path, clock=clock, max_line=SMALL) as j:
        res = j.apply_retention(now=T0 + 60)  # nothing is old: only the damage moves
        assert (res.kept, res.dropped, res.quarantined) == (5, 0, 2)
        rep = j.replay()
        assert rep.damage == []
        assert rep.records == stored[:2] + stored[3:]
        quarantine = path.with_name(path.name + ".quarantine").read_bytes()
        assert corrupted in quarantine
        assert b"oversize" in quarantine
        assert b"q" * 600 not in quarantine
        assert stat.S_IMODE(path.with_name(path.name + ".quarantine").stat().st_mode) == 0o600
        assert j.append({"n": "after"})["seq"] == 7
        # nothing left to do the second time
        assert j.apply_retention(now=T0 + 60).quarantined == 0
    assert not path.with_name(path.name + ".compact").exists()
    assert len(assert_clean_file(path)) == 6


@pytest.mark.damaged_journal  # written by hand to test what replay does with it
def test_retention_keeps_a_batch_line_whose_batch_end_is_gone(tmp_path: Path) -> None:
    """A kept continuation line must not read as an unfinished write in the new file."""
    path = tmp_path / "j.jsonl"
    clock = Clock()
    with Journal(path, clock=clock) as j:
        ask, done = j.append_batch([
            {"subject": "ask", "id": "a1", "state": "open"},
            {"subject": "message", "id": "m9", "state": "accepted"},
        ])
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01  # damage the batch's last line: retention quarantines it
    path.write_bytes(bytes(data))
    with Journal(path, clock=clock) as j:
        res = j.apply_retention(now=T0 + 3 * DAY)
        assert (res.kept, res.dropped, res.quarantined) == (1, 0, 1)
    for _ in range(2):  # a fresh open must still see the open ask, and not "repair" it away
        with Journal(path, clock=clock) as j:
            rep = j.replay()
            assert (rep.records, rep.damage) == ([ask], [])
    assert path.read_bytes().startswith(b'{"c":"')
    assert done not in read_journal(path).records


@pytest.mark.damaged_journal  # written by hand to test what replay does with it
def test_retention_by_one_journal_object_is_seen_by_another(tmp_path: Path) -> None:
    """Two Journal objects on one path stand in for two processes; A's rename must not strand B."""
    path = tmp_path / "j.jsonl"
    clock = Clock()
    a = Journal(path, clock=clock)
    b = Journal(path, clock=clock)
    try:
        old = [a.append({"n": i, "subject": "message", "id": f"m{i}", "state": "accepted"})
               for i in range(3)]
        from_b = b.append({"n": 3, "subject": "ask", "id": "m0", "state": "open"})
        assert from_b["seq"] == 4
        clock.now = T0 + 2 * DAY
        young = a.append({"n": 4})
        res = a.apply_retention(now=clock.now)
        assert res.dropped == 2  # m1, m2; m0 is kept by b's open ask
        inode = path.stat().st_ino
        after_b = b.append({"n": 5})
        assert after_b["seq"] == 6
        assert path.stat().st_ino == inode, "b must append to the new file, not the unlinked one"
        after_a = a.append({"n": 6})
        assert after_a["seq"] == 7
        for j in (a, b):
            rep = j.replay()
            assert rep.damage == []
            assert rep.records == [old[0], from_b, young, after_b, after_a]
    finally:
        a.close()
        b.close()


def test_seq_never_reused_after_retention_drops_the_newest_records(tmp_path: Path) -> None:
    """``seq`` is monotonic per file and kept across retention (ADR 0001), for every process."""
    path = tmp_path / "j.jsonl"
    clock = Clock()
    a = Journal(path, clock=clock)
    b = Journal(path, clock=clock)
    try:
        b.append({"n": 0})
        issued = [a.append({"n": i})["seq"] for i in range(1, 6)]
        res = a.apply_retention(now=T0 + 2 * DAY)  # everything is old and resolved
        assert res.dropped >= 5
        from_b = b.append({"n": "b"})
        assert from_b["seq"] > max(issued), "another process must not reuse a dropped seq"
    finally:
        a.close()
        b.close()
    with Journal(path, clock=clock) as c:
        c.replay()
        assert c.append({"n": "c"})["seq"] == from_b["seq"] + 1


def test_retention_of_an_empty_journal(tmp_path: Path) -> None:
    with Journal(tmp_path / "j.jsonl") as j:
        res = j.apply_retention(now=T0)
        assert (res.kept, res.dropped, res.quarantined) == (0, 0, 0)
        assert j.append({"n": 1})["seq"] == 1


# -- 6. file modes and directory fsync ---------------------------------------------------------


def test_files_are_private(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    old_umask = os.umask(0)
    try:
        clock = Clock()
        with Journal(path, clock=clock) as j:
            j.append({"n": 1})
            clock.now += 2 * DAY
            j.append({"n": 2})
            assert j.apply_retention().dropped == 1  # rewritten via temp + rename
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(path.stat().st_mode) == PRIVATE_FILE_MODE == 0o600
    lock = path.with_name(path.name + ".lock")
    assert stat.S_IMODE(lock.stat().st_mode) == 0o600


def test_directory_fsynced_on_create_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []
    real = config.fsync_dir

    def spy(p: Path) -> None:
        calls.append(p)
        real(p)

    monkeypatch.setattr(journal_mod, "fsync_dir", spy)
    path = tmp_path / "j.jsonl"
    clock = Clock()
    with Journal(path, clock=clock) as j:
        assert calls == [tmp_path]
        j.append({"n": 1})
    assert calls == [tmp_path]
    with Journal(path, clock=clock) as j:
        j.append({"n": 2})
        j.replay()
    assert calls == [tmp_path], "reopening an existing journal is not a create"
    with Journal(path, clock=clock) as j:
        clock.now = T0 + 10 * DAY
        j.append({"n": 3})
        j.apply_retention()
    assert calls == [tmp_path, tmp_path], "the retention rename is fsynced too"


# -- 7. the lock-free reader -------------------------------------------------------------------


def test_read_journal_reports_a_fragment_but_leaves_the_file_alone(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    stored = write_five(path)
    fragment = encode_line({"n": 5, "seq": 6, "ts": T0})[:25]
    with path.open("ab") as f:
        f.write(fragment)
    before = path.read_bytes()
    before_stat = path.stat()
    rep = read_journal(path)
    assert rep.records == stored
    assert rep.damage == [Damage(len(before) - len(fragment), len(fragment), "torn_tail")]
    assert rep.end == len(before) - len(fragment)
    assert path.read_bytes() == before
    assert path.stat().st_mtime_ns == before_stat.st_mtime_ns


def test_read_journal_does_not_wait_for_the_writers_lock(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    stored = write_five(path)
    lock_fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR)
    fcntl.flock(lock_fd, fcntl.LOCK_EX)
    try:
        result: list[Any] = []
        reader = threading.Thread(target=lambda: result.append(read_journal(path)))
        reader.start()
        reader.join(timeout=10)
        assert not reader.is_alive()
        assert result[0].records == stored
    finally:
        os.close(lock_fd)


def test_read_journal_of_a_missing_file(tmp_path: Path) -> None:
    rep = read_journal(tmp_path / "absent.jsonl")
    assert (rep.records, rep.damage, rep.end) == ([], [], 0)
    assert not (tmp_path / "absent.jsonl").exists()
