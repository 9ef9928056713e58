"""The journal with real processes: SIGKILL mid-append, concurrent writers, retention races.

Children are forked (no interpreter start-up), append through the real ``Journal`` and
acknowledge over a pipe only after ``append`` returned, exactly as a receiver may only ack a
message after its journal write. The parent kills them at random moments and checks that every
acknowledged record is on disk exactly once, in order, with ``seq`` strictly increasing.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import struct
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from crosstalk.store.journal import Journal
from crosstalk.store.journal_format import decode_line
from crosstalk.store.journal_read import read_journal

ACK = struct.Struct("<qqq")  # 24 bytes: well under PIPE_BUF, so a pipe write is atomic
READY = ACK.pack(-1, -1, -1)  # the child has opened and replayed the journal
DAY = 24 * 3600.0


# -- process plumbing --------------------------------------------------------------------------


def fork(body: Callable[[], None]) -> int:
    """Run ``body`` in a forked child that never returns into pytest."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            body()
            code = 0
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            os._exit(code)
    return pid


def kill_and_reap(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status), f"child exited by itself ({status:#x}): it crashed"
    assert os.WTERMSIG(status) == signal.SIGKILL


def wait_ok(pids: list[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    pending = set(pids)
    while pending:
        for pid in list(pending):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                pending.discard(pid)
                assert os.WIFEXITED(status), f"child {pid} died: {status:#x}"
                assert os.WEXITSTATUS(status) == 0, f"child {pid} failed (see stderr)"
        if pending and time.monotonic() > deadline:
            for pid in pending:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            pytest.fail(f"children {sorted(pending)} did not finish in {timeout} s")
        time.sleep(0.01)


def drain(fd: int) -> list[tuple[int, int, int]]:
    """Every acknowledgement in the pipe, once all its writers are gone."""
    data = b""
    while chunk := os.read(fd, 65536):
        data += chunk
    os.close(fd)
    assert len(data) % ACK.size == 0, "a pipe write of 24 bytes cannot be torn"
    acks = [ACK.unpack_from(data, i) for i in range(0, len(data), ACK.size)]
    return [ack for ack in acks if ack != (-1, -1, -1)]


def start_and_kill(body: Callable[[], None], ack_r: int, rng: random.Random) -> None:
    """Fork, let it run for a random 0-15 ms, SIGKILL it.

    Every other time the clock starts only once the child has opened and replayed the journal,
    so kills land among the appends rather than in fork start-up and the replay of a growing
    file; the rest also hit start-up, open, replay and the torn-tail repair.
    """
    pid = fork(body)
    if rng.random() < 0.5:
        assert os.read(ack_r, ACK.size) == READY, "the child failed to open the journal"
    time.sleep(rng.uniform(0, 0.015))
    kill_and_reap(pid)


def pad(rng: random.Random) -> str:
    """Mostly small records, sometimes large ones whose write spans many pages."""
    n = rng.randrange(8_000, 32_000) if rng.random() < 0.1 else rng.randrange(300)
    return rng.choice("abcdefgh") * n


class Tail:
    """Checks the journal incrementally: whole writes never change once written.

    Lines of an ``append_batch`` write other than its last start with ``{"b":`` and count only
    once the write's last line is there; unended at the end of the file they are part of the
    torn tail, exactly as the journal's own reader treats them.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.end = 0  # verified up to here: the end of a whole write
        self.records: list[dict[str, Any]] = []
        self.torn = 0

    def check(self) -> None:
        with self.path.open("rb") as f:
            f.seek(self.end)
            data = f.read()
        *lines, fragment = data.split(b"\n")
        pending: list[dict[str, Any]] = []
        pending_bytes = 0
        for raw in lines:
            rec = decode_line(raw)
            assert isinstance(rec, dict), f"damage mid-file near {self.end}: {rec}"
            assert rec["seq"] == len(self.records) + len(pending) + 1, "seq must be contiguous"
            assert len(rec["pad"]) == rec["len"]
            pending.append(rec)
            pending_bytes += len(raw) + 1
            if not raw.startswith(b'{"b":"'):
                self.records += pending
                self.end += pending_bytes
                pending, pending_bytes = [], 0
        if fragment or pending:
            self.torn += 1  # one interrupted write, at the very end

    def check_against_full_read(self) -> None:
        rep = read_journal(self.path)
        assert [d.reason for d in rep.damage] in ([], ["torn_tail"])
        assert rep.records == self.records


# -- 1. SIGKILL loop ---------------------------------------------------------------------------


def _append_forever(path: Path, ack_fd: int, it: int, seed: int) -> None:
    rng = random.Random(seed)
    with Journal(path) as j:
        j.replay()  # as a writer does at registration; it also repairs a torn tail
        os.write(ack_fd, READY)
        for i in itertools.count():
            text = pad(rng)
            stored = j.append({"it": it, "i": i, "len": len(text), "pad": text})
            os.write(ack_fd, ACK.pack(it, i, stored["seq"]))


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sigkill_loop_never_loses_an_acknowledged_record(tmp_path: Path) -> None:
    path = tmp_path / "agent.jsonl"
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    print(f"seed {seed}")
    tail = Tail(path)
    acked: dict[tuple[int, int], int] = {}
    kills = 0
    for it in range(250):
        r, w = os.pipe()
        child_seed = rng.randrange(2**32)
        start_and_kill(partial(_append_forever, path, w, it, child_seed), r, rng)
        os.close(w)
        kills += 1
        acks = drain(r)
        for ack_it, i, seq in acks:
            assert ack_it == it
            acked[(it, i)] = seq

        if path.exists():
            tail.check()
        # this iteration's records: 0..n-1, every ack among them, at most one unacked
        mine = [rec for rec in tail.records if rec["it"] == it]
        assert [rec["i"] for rec in mine] == list(range(len(mine)))
        assert len(acks) <= len(mine) <= len(acks) + 1, f"iteration {it}"
        assert all(acked[(it, rec["i"])] == rec["seq"] for rec in mine[: len(acks)])
        if it % 25 == 0 and path.exists():
            tail.check_against_full_read()

    assert kills >= 200
    assert len(acked) > 100, "the children must have had time to append"
    keys = [(rec["it"], rec["i"]) for rec in tail.records]
    assert len(set(keys)) == len(keys), "no record twice"
    on_disk = {(rec["it"], rec["i"]): rec["seq"] for rec in tail.records}
    assert all(on_disk.get(key) == seq for key, seq in acked.items())

    # a fresh open repairs whatever torn tail the last kill left and carries seq on
    with Journal(path) as j:
        rep = j.replay()
        assert rep.records == tail.records
        assert [d.reason for d in rep.damage] in ([], ["torn_tail"])
        last = j.append({"it": -1, "i": 0, "len": 0, "pad": ""})
    assert last["seq"] == len(tail.records) + 1
    final = read_journal(path)
    assert final.damage == []
    assert final.records == [*tail.records, last]
    print(f"{kills} kills, {len(acked)} acked, {len(tail.records)} on disk, "
          f"{tail.torn} torn tails seen")


# -- 2. two writers, one journal ---------------------------------------------------------------


def _append_n(path: Path, go_fd: int, writer: int, n: int, size: int) -> None:
    os.read(go_fd, 1)  # start together
    with Journal(path) as j:
        for i in range(n):
            text = chr(ord("A") + writer) * size
            j.append({"w": writer, "i": i, "len": size, "pad": text})


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_two_writer_processes_never_interleave(tmp_path: Path) -> None:
    path = tmp_path / "agent.jsonl"
    per_writer, size = 1500, 8192  # each line is larger than PIPE_BUF
    go_r, go_w = os.pipe()
    pids = [fork(partial(_append_n, path, go_r, w, per_writer, size)) for w in (0, 1)]
    os.close(go_r)
    os.write(go_w, b"go")
    os.close(go_w)
    wait_ok(pids, timeout=150)

    rep = read_journal(path)
    assert rep.damage == []
    assert len(rep.records) == 2 * per_writer
    assert [r["seq"] for r in rep.records] == list(range(1, 2 * per_writer + 1))
    for writer in (0, 1):
        mine = [r for r in rep.records if r["w"] == writer]
        assert [r["i"] for r in mine] == list(range(per_writer))
        assert all(r["pad"] == chr(ord("A") + writer) * size for r in mine)
    switches = sum(1 for a, b in itertools.pairwise(rep.records) if a["w"] != b["w"])
    print(f"{switches} switches between writers")


# -- 3. SIGKILL mid-append_batch ---------------------------------------------------------------


def _append_batches_forever(path: Path, ack_fd: int, it: int, seed: int) -> None:
    rng = random.Random(seed)
    with Journal(path) as j:
        j.replay()  # as a writer does at registration; it also repairs a torn tail
        os.write(ack_fd, READY)
        for b in itertools.count():
            size = rng.randint(1, 6)
            batch: list[Mapping[str, Any]] = []
            for k in range(size):
                text = pad(rng)
                batch.append({"it": it, "b": b, "k": k, "of": size, "len": len(text),
                              "pad": text})
            stored = j.append_batch(batch)
            os.write(ack_fd, ACK.pack(it, b, stored[0]["seq"]))


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sigkill_mid_batch_leaves_whole_batches(tmp_path: Path) -> None:
    path = tmp_path / "agent.jsonl"
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    print(f"seed {seed}")
    tail = Tail(path)
    acked_batches = 0
    for it in range(150):
        r, w = os.pipe()
        child_seed = rng.randrange(2**32)
        start_and_kill(partial(_append_batches_forever, path, w, it, child_seed), r, rng)
        os.close(w)
        acks = drain(r)
        acked_batches += len(acks)
        if path.exists():
            tail.check()
        mine = [rec for rec in tail.records if rec["it"] == it]
        batches = [list(g) for _, g in itertools.groupby(mine, key=lambda rec: rec["b"])]
        assert [g[0]["b"] for g in batches] == list(range(len(batches)))
        for ack_it, b, first_seq in acks:  # acknowledged: whole, in place
            assert ack_it == it
            group = batches[b]
            assert group[0]["seq"] == first_seq
            assert [rec["k"] for rec in group] == list(range(group[0]["of"]))
        # a prefix of whole batches: even the unacknowledged one the kill interrupted (a
        # SIGKILL inside a multi-page write() does leave its first lines complete on disk)
        for group in batches:
            assert [rec["k"] for rec in group] == list(range(group[0]["of"])), f"iteration {it}"
        assert len(acks) <= len(batches) <= len(acks) + 1
    assert acked_batches > 20
    with Journal(path) as j:
        rep = j.replay()
        assert rep.records == tail.records
        j.append({"it": -1, "b": 0, "k": 0, "of": 1, "len": 0, "pad": ""})
    assert read_journal(path).damage == []
    print(f"{acked_batches} batches acked, {tail.torn} torn tails seen")


# -- 4. retention in one process while another appends -----------------------------------------


def _retain_and_append(path: Path, go_fd: int, ack_fd: int, writer: int, n: int) -> None:
    """Append n records, acking each; writer 0 also runs retention every few appends."""
    os.read(go_fd, 1)
    with Journal(path) as j:
        for i in range(n):
            stored = j.append({"w": writer, "i": i, "len": 100, "pad": "r" * 100})
            os.write(ack_fd, ACK.pack(writer, i, stored["seq"]))
            if writer == 0 and i % 7 == 3:
                # everything is "old": drops all but the newest record, rewriting by rename
                j.apply_retention(now=time.time() + 2 * DAY)
                os.write(ack_fd, ACK.pack(-1, i, j.last_seq))


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_retention_racing_another_writer_process(tmp_path: Path) -> None:
    path = tmp_path / "agent.jsonl"
    n = 400
    go_r, go_w = os.pipe()
    ack_r, ack_w = os.pipe()
    pids = [fork(partial(_retain_and_append, path, go_r, ack_w, w, n)) for w in (0, 1)]
    os.close(go_r)
    os.close(ack_w)
    os.write(go_w, b"go")
    os.close(go_w)
    acks = drain(ack_r)  # returns once both children closed their ends
    wait_ok(pids, timeout=150)

    appends = [(w, i, seq) for w, i, seq in acks if w >= 0]
    retentions = [seq for w, _, seq in acks if w < 0]
    assert len(appends) == 2 * n
    assert retentions
    seqs = sorted(seq for _, _, seq in appends)
    assert seqs == list(range(1, 2 * n + 1)), "no seq issued twice, none skipped"

    rep = read_journal(path)
    assert rep.damage == []
    on_disk = {(r["w"], r["i"]): r["seq"] for r in rep.records}
    file_seqs = [r["seq"] for r in rep.records]
    assert file_seqs == sorted(set(file_seqs))
    # everything acknowledged after the last retention's high-water mark is still there:
    # an append to the replaced (unlinked) file would be missing here
    last_mark = max(retentions)
    for w, i, seq in appends:
        if seq >= last_mark:
            assert on_disk.get((w, i)) == seq, (w, i, seq)
