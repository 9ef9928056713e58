"""Facts about processes and sockets, computed the way Claude Code computes them.

Claude Code decides whether a registry record is alive by *pid domain* + pid alive + process
start time (``procStart``), so a recycled pid never impersonates a dead session. CrossTalk uses
the same three facts for its own descriptors and for telling who is on the other end of a unix
socket (SO_PEERCRED), never what a frame claims about itself.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import subprocess
import sys
from dataclasses import dataclass
from functools import cache


@dataclass(frozen=True)
class PeerCredentials:
    pid: int
    uid: int
    gid: int | None


def pid_alive(pid: int) -> bool:
    """True if a process with this pid exists (zombies included; they still hold the pid)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    except OverflowError:
        # A pid beyond a C pid_t (e.g. "pid": 99999999999 in a hand-edited descriptor) cannot
        # exist; os.kill raises OverflowError for it, which would crash every registry scan.
        return False
    except OSError as exc:
        return exc.errno != errno.ESRCH
    return True


def process_start_time(pid: int) -> str | None:
    """The process start time as Claude writes ``procStart``, or ``None`` if there is no process.

    Linux: field 22 (``starttime``, clock ticks since boot) of ``/proc/<pid>/stat`` as a decimal
    string. The command name (field 2) may contain spaces and parentheses, so fields are counted
    after the *last* ``)``. macOS: ``LC_ALL=C TZ=UTC ps -o lstart= -p <pid>``.
    """
    if pid <= 0:
        return None
    if sys.platform.startswith("linux"):
        raw = _read_stat(pid)
        return None if raw is None else parse_proc_stat_start_time(raw)
    try:
        out = subprocess.run(
            ["ps", "-o", "lstart=", "-p", str(pid)],  # noqa: S607 - system ps (macOS)
            capture_output=True,
            text=True,
            timeout=5,
            env={**os.environ, "LC_ALL": "C", "TZ": "UTC"},
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = out.stdout.strip()
    return text or None


def parse_proc_stat_start_time(raw: bytes) -> str | None:
    """Field 22 of a ``/proc/<pid>/stat`` line, or ``None`` if the line is malformed."""
    close = raw.rfind(b")")
    if close < 0:
        return None
    rest = raw[close + 1 :].split()
    # rest[0] is field 3 (state); field 22 is therefore rest[19].
    if len(rest) < 20 or not rest[19].isdigit():
        return None
    return rest[19].decode("ascii")


def _read_stat(pid: int) -> bytes | None:
    """``/proc/<pid>/stat`` (Linux), or ``None`` if there is no such process to read.

    Read with ``os.open``/``os.read``: ``open()`` adds an ``fstat``, an ``ioctl`` (isatty) and
    an ``lseek`` to the three calls needed, and every uds frame reads its sender's (~1 KB at
    most: one read returns it whole)."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    try:
        chunks = [os.read(fd, 4096)]
        while len(chunks[-1]) == 4096:
            chunks.append(os.read(fd, 4096))
        return b"".join(chunks)
    except ProcessLookupError:  # it exited between the open and the read
        return None
    finally:
        os.close(fd)


def _exited(raw: bytes) -> bool:
    """Field 3 (state) is ``Z`` or ``X``: exited, waiting to be reaped."""
    state = raw[raw.rfind(b")") + 1 :].split()[:1]
    return state in ([b"Z"], [b"X"])


def parent_pid(pid: int) -> int | None:
    """Field 4 (ppid) of ``/proc/<pid>/stat``; ``None`` if there is no such process to read."""
    raw = _read_stat(pid)
    return None if raw is None else int(raw[raw.rfind(b")") + 1 :].split()[1])


def ancestors(pid: int) -> list[int]:
    """``pid``'s parent chain up to init, from ``/proc`` (stops at the first unreadable one).

    Claude skips its inbound gate for a writer it is an ancestor of; the gate helper checks it
    is not one before it writes (ADR 0020)."""
    chain: list[int] = []
    while pid > 1 and len(chain) < 512:
        parent = parent_pid(pid)
        if parent is None:
            break
        chain.append(parent)
        pid = parent
    return chain


def is_zombie(pid: int) -> bool:
    """The process has exited and waits to be reaped (Linux state ``Z``): it holds its pid but
    runs nothing, so it serves no socket. Codex SIGKILLs its MCP servers on shutdown and their
    parent may reap them seconds later (live, issue 6)."""
    if not sys.platform.startswith("linux") or pid <= 0:
        return False
    raw = _read_stat(pid)
    return raw is not None and _exited(raw)


def process_matches(pid: int, start_time: str | None) -> bool:
    """The pid is running *and* is the same process that was recorded (not a recycled pid,
    not a zombie)."""
    if start_time is None or not pid_alive(pid):
        return False
    if sys.platform.startswith("linux"):
        raw = _read_stat(pid)  # one read for both facts: scans call this per descriptor
        return raw is not None and parse_proc_stat_start_time(raw) == start_time and (
            not _exited(raw))
    return process_start_time(pid) == start_time


@cache
def pid_domain() -> str:
    """The pid namespace identity, as Claude Code computes ``pidDomain``.

    Linux: ``linux:<machine-id>:<readlink /proc/self/ns/pid>``; other platforms: ``linux`` (sic,
    as Claude Code does). Pids from different domains are not comparable, so a record from
    another domain can be neither confirmed alive nor declared dead.
    """
    if not sys.platform.startswith("linux"):
        return "linux"
    machine_id = ""
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            with open(path, encoding="ascii", errors="replace") as f:
                machine_id = f.read().strip()
            break
        except OSError:
            continue
    try:
        ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        ns = ""
    return f"linux:{machine_id}:{ns}"


# macOS <sys/un.h>: SOL_LOCAL = 0, LOCAL_PEERCRED = 0x001, LOCAL_PEERPID = 0x002.
_SOL_LOCAL = 0
_LOCAL_PEERCRED = 0x001
_LOCAL_PEERPID = 0x002


def peer_credentials(sock: socket.socket) -> PeerCredentials:
    """Who is on the other end of a connected unix socket, as the kernel says.

    Raises ``OSError`` if the platform cannot tell; callers treat that as an unverified peer.
    """
    if sys.platform.startswith("linux"):
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, gid = struct.unpack("3i", raw)
        if pid <= 0:
            raise OSError(errno.ENOTCONN, "peer pid unavailable")
        return PeerCredentials(pid=pid, uid=uid, gid=gid)
    if sys.platform == "darwin":
        pid = struct.unpack("i", sock.getsockopt(_SOL_LOCAL, _LOCAL_PEERPID, 4))[0]
        # struct xucred { u_int cr_version; uid_t cr_uid; short cr_ngroups; gid_t cr_groups[16]; }
        raw = sock.getsockopt(_SOL_LOCAL, _LOCAL_PEERCRED, 4 + 4 + 4 + 16 * 4)
        uid = struct.unpack_from("I", raw, 4)[0]
        return PeerCredentials(pid=pid, uid=uid, gid=None)
    raise OSError(errno.ENOTSUP, f"peer credentials are not supported on {sys.platform}")
