"""The processes of a bench run, read from /proc: its children, their status and CPU time.

Shared by ``bench/shim.py``'s figures; run from ``bench/`` as a sibling module.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

REAP_GRACE_SECONDS = 3.0



def _stat_fields(pid: int) -> list[bytes] | None:
    """The /proc/<pid>/stat fields after the command name (state first), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def child_pids() -> set[int]:
    """Live (non-zombie) direct children of this process."""
    me, found = os.getpid(), set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields and int(fields[1]) == me and fields[0] not in (b"Z", b"X"):
            found.add(int(entry.name))
    return found


def _gone(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is None or fields[0] in (b"Z", b"X")


def reap_children() -> None:
    """Terminate, then kill, every child of ours still running (by pid, nothing broader)."""
    pids = child_pids()
    if not pids:
        return
    print(f"bench: stopping leftover processes {sorted(pids)}", file=sys.stderr, flush=True)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + REAP_GRACE_SECONDS
        while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = {p for p in pids if not _gone(p)}
        if not pids:
            break
    for pid in child_pids() | pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM in kB and the thread count, from /proc/<pid>/status."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "Threads"):
                out[key] = int(value.split()[0])
    out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used (clock-tick resolution, usually 10 ms)."""
    fields = _stat_fields(pid)
    if fields is None:
        raise RuntimeError(f"process {pid} is gone")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
