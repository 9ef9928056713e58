"""Senders' start times kept while they live (``ingress.peers.StartTimes``): a live process is
answered without reading ``/proc`` again, and one that has exited is never answered from the
kept value — its pid may belong to another process by then."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys

import pytest

from crosstalk import proc
from crosstalk.ingress import peers
from crosstalk.ingress.peers import StartTimes

pytestmark = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="Linux pidfds")


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    seen: list[int] = []
    real = proc.process_start_time

    def counting(pid: int) -> str | None:
        seen.append(pid)
        return real(pid)

    monkeypatch.setattr(peers.proc, "process_start_time", counting)
    return seen


def sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_live_process_is_read_once(reads: list[int]) -> None:
    times = StartTimes()
    child = sleeper()
    try:
        first = times.get(child.pid)
        assert first is not None
        assert times.get(child.pid) == first
        assert times.get(child.pid) == first
        assert reads == [child.pid]
        assert first == proc.process_start_time(child.pid)
    finally:
        child.kill()
        child.wait()
        times.close()


def test_an_exited_process_is_read_again(reads: list[int]) -> None:
    times = StartTimes()
    child = sleeper()
    first = times.get(child.pid)
    assert first is not None
    child.kill()
    child.wait()  # reaped: the pid is free for anyone
    assert times.get(child.pid) is None  # read again, and nobody has it now
    assert reads == [child.pid, child.pid]
    times.close()


def test_a_zombie_is_not_answered_from_the_kept_value(reads: list[int]) -> None:
    times = StartTimes()
    child = sleeper()
    try:
        times.get(child.pid)
        child.kill()
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not yet reaped
        times.get(child.pid)
        assert len(reads) == 2
    finally:
        child.wait()
        times.close()


def test_the_oldest_is_let_go_past_the_size_and_close_frees_every_pidfd(
        reads: list[int]) -> None:
    times = StartTimes(size=2)
    children = [sleeper() for _ in range(3)]
    fds_before = len(os.listdir("/proc/self/fd"))
    try:
        for child in children:
            times.get(child.pid)
        assert len(os.listdir("/proc/self/fd")) == fds_before + 2
        times.get(children[0].pid)  # let go: read again
        assert reads.count(children[0].pid) == 2
        times.close()
        assert len(os.listdir("/proc/self/fd")) == fds_before
    finally:
        for child in children:
            child.kill()
            child.wait()


def test_a_start_time_that_cannot_be_read_leaves_the_peer_unverified_and_no_pidfd(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def out_of_descriptors(pid: int) -> str | None:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(peers.proc, "process_start_time", out_of_descriptors)
    times = StartTimes()
    fds_before = len(os.listdir("/proc/self/fd"))
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        peer = peers.peer_of(left, times)
        assert peer is not None
        assert peer.pid == os.getpid()
        assert peer.start_time is None  # matched to no one: identify() needs a start time
        assert len(os.listdir("/proc/self/fd")) == fds_before + 2  # the pair, no pidfd
    finally:
        left.close()
        right.close()
        times.close()
