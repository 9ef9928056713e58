"""Process facts: start time (procStart), liveness, pid domain and SO_PEERCRED (research §2, §4)."""

from __future__ import annotations

import errno
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from crosstalk import proc

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")

SLEEPER = "import sys; sys.stdout.write('up\\n'); sys.stdout.flush(); sys.stdin.read()"


def _field22_independently(pid: int) -> str:
    """Field 22 of /proc/<pid>/stat, found by stripping the known "pid (comm) " prefix."""
    raw = Path(f"/proc/{pid}/stat").read_bytes()
    comm = Path(f"/proc/{pid}/comm").read_bytes().rstrip(b"\n")
    prefix = f"{pid} (".encode() + comm + b") "
    assert raw.startswith(prefix)
    fields = raw[len(prefix) :].split(b" ")
    # fields[0] is field 3 (state), so field 22 is fields[22 - 3].
    return fields[22 - 3].decode()


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[str]]:
    child = subprocess.Popen(
        [sys.executable, "-c", SLEEPER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "up\n"
        yield child
    finally:
        child.kill()
        child.wait(timeout=30)
        for stream in (child.stdin, child.stdout):
            if stream is not None:
                stream.close()


def _reaped_child_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    assert child.wait(timeout=30) == 0
    return child.pid


# -- process start time ------------------------------------------------------------------------


@linux_only
def test_own_start_time_is_field_22() -> None:
    got = proc.process_start_time(os.getpid())
    assert got is not None
    assert got == _field22_independently(os.getpid())
    assert got.isdigit()


@linux_only
def test_child_start_time_is_field_22_and_not_before_ours(
    sleeper: subprocess.Popen[str],
) -> None:
    got = proc.process_start_time(sleeper.pid)
    assert got == _field22_independently(sleeper.pid)
    ours = proc.process_start_time(os.getpid())
    assert got is not None
    assert ours is not None
    assert int(got) >= int(ours)  # clock ticks since boot; the child started after us


def test_start_time_of_missing_process_is_none() -> None:
    assert proc.process_start_time(_reaped_child_pid()) is None
    assert proc.process_start_time(0) is None
    assert proc.process_start_time(-5) is None


def _stat_line(comm: bytes, starttime: bytes = b"4242") -> bytes:
    # Fields 3..21 are filler, field 22 is the start time, then a few more.
    middle = b" ".join([b"S"] + [str(n).encode() for n in range(4, 22)])
    return b"123 (" + comm + b") " + middle + b" " + starttime + b" 99 100 101\n"


@pytest.mark.parametrize(
    "comm",
    [b"python3", b"a) b (c)", b"a b c", b")", b"(", b"x) S 1 2 3 4 5 6 7 8 9 10", b""],
)
def test_parse_finds_field_22_after_the_last_paren(comm: bytes) -> None:
    assert proc.parse_proc_stat_start_time(_stat_line(comm)) == "4242"


def test_parse_example_from_the_brief() -> None:
    rest = " ".join(str(n) for n in range(4, 22))
    line = f"123 (a) b (c)) S {rest} 777 0 0".encode()
    assert proc.parse_proc_stat_start_time(line) == "777"


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"123",
        b"123 (comm S 1 2 3",  # no closing paren at all
        b"123 (comm) S 1 2 3",  # too few fields
        _stat_line(b"c", b"12x"),  # field 22 not a number
        _stat_line(b"c", b"-1"),
        _stat_line(b"c", "\u0663".encode()),  # a non-ASCII digit
        _stat_line(b"c").replace(b"4242", b"\xff\xfe"),
        b"123 (a) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 (later) x",
    ],
)
def test_parse_malformed_is_none(raw: bytes) -> None:
    assert proc.parse_proc_stat_start_time(raw) is None


@given(st.binary(max_size=600))
@settings(deadline=None, max_examples=500)
@example(b")" * 50)
@example(b") " + b"1 " * 30)
@example(b"\xff)" + b" \xff" * 30)
def test_parse_never_raises(raw: bytes) -> None:
    got = proc.parse_proc_stat_start_time(raw)
    assert got is None or (got.isascii() and got.isdigit())


@given(comm=st.binary(max_size=40).filter(lambda b: b"\n" not in b), start=st.integers(0, 2**63))
@settings(deadline=None, max_examples=200)
def test_parse_any_comm(comm: bytes, start: int) -> None:
    assert proc.parse_proc_stat_start_time(_stat_line(comm, str(start).encode())) == str(start)


# -- liveness ----------------------------------------------------------------------------------


def test_pid_alive_self() -> None:
    assert proc.pid_alive(os.getpid())


def test_pid_alive_parent_and_init() -> None:
    assert proc.pid_alive(os.getppid())
    assert proc.pid_alive(1)  # exists even when it is not ours (EPERM counts as alive)


@pytest.mark.parametrize("pid", [0, -1, -os.getpid()])
def test_pid_alive_rejects_non_positive(pid: int) -> None:
    # kill(0, 0) and kill(-1, 0) would signal process groups and "succeed"; they must not.
    assert proc.pid_alive(pid) is False


def test_pid_alive_reaped_child_is_false() -> None:
    assert proc.pid_alive(_reaped_child_pid()) is False


@pytest.mark.parametrize("pid", [2**31 - 1, 2**31, 2**40, 2**63, 10**30])
def test_pid_alive_out_of_range_is_false_not_an_error(pid: int) -> None:
    # os.kill raises OverflowError for pids beyond a C int; uncaught, one descriptor with
    # "pid": 99999999999 would make every registry scan crash.
    assert proc.pid_alive(pid) is False
    assert proc.process_matches(pid, "1") is False


@linux_only
def test_unreaped_zombie_still_holds_its_pid() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        # Poll until it has exited but is not yet reaped (state Z), without wait()ing.
        for _ in range(3000):
            stat = Path(f"/proc/{child.pid}/stat").read_bytes()
            if stat[stat.rfind(b")") + 2 :].startswith(b"Z"):
                break
            time.sleep(0.01)  # polling, not synchronisation by sleep
        else:
            pytest.fail("child never became a zombie")
        assert proc.pid_alive(child.pid) is True
    finally:
        child.wait(timeout=30)
    assert proc.pid_alive(child.pid) is False


def test_process_matches() -> None:
    pid = os.getpid()
    started = proc.process_start_time(pid)
    assert started is not None
    assert proc.process_matches(pid, started) is True
    assert proc.process_matches(pid, str(int(started) + 1)) is False
    assert proc.process_matches(pid, "") is False
    assert proc.process_matches(pid, None) is False
    assert proc.process_matches(_reaped_child_pid(), started) is False


def test_process_matches_other_live_process(sleeper: subprocess.Popen[str]) -> None:
    started = proc.process_start_time(sleeper.pid)
    assert proc.process_matches(sleeper.pid, started) is True
    ours = proc.process_start_time(os.getpid())
    if ours != started:  # same clock tick is possible on a fast machine
        assert proc.process_matches(sleeper.pid, ours) is False


# -- pid domain --------------------------------------------------------------------------------


@linux_only
def test_pid_domain_format() -> None:
    domain = proc.pid_domain()
    assert re.fullmatch(r"linux:[^:\s]*:pid:\[\d+\]", domain), domain
    machine_id = ""
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            machine_id = Path(path).read_text().strip()
            break
        except OSError:
            continue
    assert domain == f"linux:{machine_id}:{os.readlink('/proc/self/ns/pid')}"


@linux_only
def test_pid_domain_is_the_same_in_a_child() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "from crosstalk import proc; print(proc.pid_domain())"],
        capture_output=True, text=True, timeout=60, check=True,
    )
    assert out.stdout.strip() == proc.pid_domain()


# -- peer credentials --------------------------------------------------------------------------


@linux_only
def test_peer_credentials_socketpair() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        for sock in (a, b):
            cred = proc.peer_credentials(sock)
            assert cred.pid == os.getpid()
            assert cred.uid == os.getuid()
            assert cred.gid == os.getgid()


@linux_only
def test_peer_credentials_unconnected_socket_is_an_error() -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        with pytest.raises(OSError, match="peer pid unavailable") as exc:
            proc.peer_credentials(s)
        assert exc.value.errno == errno.ENOTCONN


def _socket_path(tmp_path: Path) -> tuple[Path, Path | None]:
    path = tmp_path / "peer.sock"
    if len(os.fsencode(path)) < 100:
        return path, None
    short = Path(tempfile.mkdtemp(prefix="ct-"))  # sun_path is 108 bytes
    return short / "peer.sock", short


CONNECTOR = """
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
s.sendall(str(os.getpid()).encode() + b"\\n")
sys.stdout.write("connected\\n"); sys.stdout.flush()
sys.stdin.read()
"""


@linux_only
def test_peer_credentials_across_a_real_child_process(tmp_path: Path) -> None:
    path, extra_dir = _socket_path(tmp_path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    child: subprocess.Popen[str] | None = None
    try:
        server.bind(str(path))
        server.listen(1)
        server.settimeout(60)
        child = subprocess.Popen(
            [sys.executable, "-c", CONNECTOR, str(path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        conn, _ = server.accept()
        with conn:
            conn.settimeout(60)
            cred = proc.peer_credentials(conn)
            said = conn.makefile("rb").readline().strip()
            assert cred.pid == child.pid
            assert said == str(child.pid).encode()
            assert cred.pid != os.getpid()
            assert cred.uid == os.getuid()
            assert cred.gid == os.getgid()
            # The kernel's pid + /proc start time identify the peer the way Claude does it.
            assert proc.process_matches(cred.pid, proc.process_start_time(child.pid))
    finally:
        server.close()
        if child is not None:
            child.kill()
            child.wait(timeout=30)
            for stream in (child.stdin, child.stdout):
                if stream is not None:
                    stream.close()
        if extra_dir is not None:
            path.unlink(missing_ok=True)
            extra_dir.rmdir()


def test_a_zombie_does_not_match_its_record() -> None:
    """An exited, unreaped child holds its pid and start time but serves nothing."""
    import subprocess
    import time

    from crosstalk.proc import is_zombie, process_matches, process_start_time

    child = subprocess.Popen(["sleep", "30"])
    try:
        started = process_start_time(child.pid)
        assert process_matches(child.pid, started)
        assert not is_zombie(child.pid)
        child.kill()
        for _ in range(200):
            if is_zombie(child.pid):
                break
            time.sleep(0.01)
        assert is_zombie(child.pid)
        assert process_start_time(child.pid) == started  # still the same process record
        assert not process_matches(child.pid, started)
    finally:
        child.kill()
        child.wait()
    assert not is_zombie(child.pid)


@linux_only
def test_parent_chain_of_a_child_runs_through_us_to_init() -> None:
    """A child's chain starts at its parent (this process) and runs through ours; a process
    that is gone has no parent and no chain."""
    child = subprocess.Popen([sys.executable, "-c", SLEEPER], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == b"up\n"
        assert proc.parent_pid(child.pid) == os.getpid()
        chain = proc.ancestors(child.pid)
        assert chain[0] == os.getpid()
        assert chain[1:] == proc.ancestors(os.getpid())
        assert chain[-1] in (0, 1)
    finally:
        child.kill()
        child.wait()
    assert proc.parent_pid(child.pid) is None
    assert proc.ancestors(child.pid) == []
