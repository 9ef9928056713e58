"""Group commit under SIGKILL: the writer dies in the middle of a shared write.

A forked child stages records from many concurrent tasks (so they share writes) and
acknowledges each over a pipe only after its future resolved, as a receiver answers a sender
only after its record is durable. The parent kills it in the middle of a write — once at a
chosen point (the write half on disk), and at random moments in a loop — and checks: every
acknowledged record is on disk exactly once, nothing of a write the kill cut short replays,
seq stays contiguous, and the journal takes appends again.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import struct
import time
from functools import partial
from pathlib import Path

from crosstalk.store.files import OsFileOps
from crosstalk.store.journal import Journal
from tests.integration.test_journal_crash import fork, kill_and_reap

ACK = struct.Struct("<q")


def _stage_forever(path: Path, ack_w: int, mid_w: int | None, stall_at: int | None,
                   start: int = 1) -> None:
    """The child: 16 tasks stage records in rounds; acks after each durable future."""

    class Stalling(OsFileOps):
        """Writes half of the ``stall_at``-th write, tells the parent, and waits for SIGKILL."""

        writes = 0

        def write(self, fd: int, data: bytes) -> int:
            Stalling.writes += 1
            if stall_at is not None and Stalling.writes == stall_at and len(data) > 1:
                at = os.fstat(fd).st_size
                os.write(fd, data[: len(data) // 2])
                assert mid_w is not None
                os.write(mid_w, ACK.pack(at))
                time.sleep(60)
            return os.write(fd, data)

    async def main() -> None:
        journal = Journal(path, ops=Stalling())
        counter = iter(range(start, 10**12))

        async def stager() -> None:
            while True:
                n = next(counter)
                group = journal.commit.stage([{"subject": "test", "id": f"r{n}", "n": n,
                                               "pad": "p" * (n % 700)}])
                assert group.future is not None
                await group.future
                os.write(ack_w, ACK.pack(n))

        await asyncio.gather(*(stager() for _ in range(16)))

    asyncio.run(main())


def _check(path: Path, acked: list[int]) -> list[int]:
    with Journal(path) as journal:
        replay = journal.replay()
        on_disk = [r["n"] for r in replay.records if r["n"] >= 0]  # -1: _check's own
        seqs = [r["seq"] for r in replay.records]
        assert seqs == list(range(1, len(seqs) + 1)), "seq contiguous after the kill"
        assert len(on_disk) == len(set(on_disk)), "no record twice"
        missing = set(acked) - set(on_disk)
        assert not missing, f"acknowledged but lost: {sorted(missing)[:5]}"
        for damage in replay.damage:
            assert damage.reason == "torn_tail", f"only the cut write may be damaged: {damage}"
        journal.append({"subject": "test", "id": "after", "n": -1})
        assert journal.replay().records[-1]["n"] == -1, "the journal takes appends again"
    return on_disk


def test_sigkill_in_the_middle_of_a_shared_write_drops_the_whole_write(
        tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    ack_r, ack_w = os.pipe()
    mid_r, mid_w = os.pipe()
    pid = fork(lambda: _stage_forever(path, ack_w, mid_w, stall_at=5))
    os.close(ack_w)
    os.close(mid_w)
    (at,) = ACK.unpack(os.read(mid_r, ACK.size))  # the child is inside its fifth write
    kill_and_reap(pid)
    os.close(mid_r)
    acked = [ACK.unpack_from(b, 0)[0] for b in _acks(ack_r)]
    cut = path.read_bytes()[at:]
    assert cut, "the kill left half a write on disk"
    assert cut.count(b'{"b":"') >= 1, "the cut write held several callers' records"
    on_disk = _check(path, acked)
    # None of the cut write's callers was acknowledged, and none of its records replays: the
    # batch marker makes a shared write all or nothing.
    assert sorted(on_disk) == sorted(acked), "exactly the acknowledged records survive"


def test_sigkill_at_random_moments_loses_no_acknowledged_record(tmp_path: Path) -> None:
    """Twelve lives on one file: each killed at a random moment, the next replays and goes
    on; every record any of them acknowledged is there at the end."""
    rng = random.Random(36)
    path = tmp_path / "j.jsonl"
    acked: list[int] = []
    for life in range(12):
        ack_r, ack_w = os.pipe()
        pid = fork(partial(_stage_forever, path, ack_w, None, None, start=life * 10**6 + 1))
        os.close(ack_w)
        time.sleep(rng.uniform(0.05, 0.25))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        acked += [ACK.unpack_from(b, 0)[0] for b in _acks(ack_r)]
        _check(path, acked)
    assert len(acked) > 100, "the lives got far enough to share writes"


def _acks(fd: int) -> list[bytes]:
    data = b""
    while chunk := os.read(fd, 65536):
        data += chunk
    os.close(fd)
    assert len(data) % ACK.size == 0
    return [data[i:i + ACK.size] for i in range(0, len(data), ACK.size)]

