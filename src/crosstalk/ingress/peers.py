"""Who is on the other end of a uds connection: the kernel's peer credentials, matched to the
one live registered agent they belong to. Identity comes only from the transport, never from
what a frame says about itself.
"""

from __future__ import annotations

import logging
import os
import select
import socket
from collections import OrderedDict
from dataclasses import dataclass

from crosstalk import proc
from crosstalk.core.message import Ingress, Sender
from crosstalk.ingress.accept import Throttled
from crosstalk.store.registry import Descriptor, Registry

log = logging.getLogger(__name__)
#: One line a minute at most: a shortage of descriptors fails every peer at once.
_unreadable = Throttled(log)


@dataclass(frozen=True)
class Peer:
    pid: int
    uid: int
    #: The pid's start time, read at accept (before the pid could be reused).
    start_time: str | None


def matches_peer(desc: Descriptor, pid: int, start_time: str) -> bool:
    """The descriptor's shim (``pid``) or harness session (``harness_pid``) is this process."""
    return (desc.pid == pid and desc.started_at == start_time) or (
        desc.harness_pid == pid and desc.harness_started_at == start_time)


def verified(desc: Descriptor, peer: Peer | None) -> Sender:
    """Identity from the registration, never from the frame."""
    return Sender(agent_id=desc.agent_id, name=desc.name, role=desc.role, ingress=Ingress.UDS,
                  peer_pid=peer.pid if peer else None, reply_address=desc.uds_path)


def peer_of(sock: socket.socket | None, start_times: StartTimes) -> Peer | None:
    """The kernel's word on who connected, with the pid's start time as of now."""
    if sock is None:
        return None
    try:
        creds = proc.peer_credentials(sock)
    except OSError:
        return None
    try:
        start = start_times.get(creds.pid)
    except OSError as exc:
        # Out of descriptors, say: without its start time the peer cannot be told from a
        # later process given the same pid, so it is matched to no one (unverified).
        _unreadable.warning("cannot read the start time of peer pid %d (%s); it is treated "
                            "as unverified", creds.pid, exc)
        start = None
    return Peer(creds.pid, creds.uid, start)


def _exited(pidfd: int) -> bool:
    poll = select.poll()
    poll.register(pidfd, select.POLLIN)  # readable once the process has exited
    return bool(poll.poll(0))


class StartTimes:
    """Peer processes' start times, kept while those processes live.

    A start time is what tells a process from a later one given the same pid, and reading it
    is a ``/proc`` read (~12 us of every uds frame). A process keeps its pid for as long as it
    lives, so a start time read once holds while a pidfd opened *before* the read says the
    process has not exited (a ``poll``, ~1 us). Linux only: elsewhere, or when no pidfd can be
    had (an old kernel, no descriptors left), every call reads."""

    def __init__(self, size: int = 64) -> None:
        self.size = size
        self._kept: OrderedDict[int, tuple[int, str]] = OrderedDict()

    def get(self, pid: int) -> str | None:
        kept = self._kept.get(pid)
        if kept is not None:
            if not _exited(kept[0]):
                self._kept.move_to_end(pid)
                return kept[1]
            del self._kept[pid]
            os.close(kept[0])
        pidfd_open = getattr(os, "pidfd_open", None)
        if pidfd_open is None or pid <= 0:
            return proc.process_start_time(pid)
        try:
            pidfd = pidfd_open(pid)
        except OSError:
            return proc.process_start_time(pid)
        try:
            start = proc.process_start_time(pid)
        except BaseException:
            os.close(pidfd)
            raise
        if start is None or _exited(pidfd):
            os.close(pidfd)  # gone (or going): what was read is not kept
            return start
        self._kept[pid] = (pidfd, start)
        if len(self._kept) > self.size:
            oldest = self._kept.popitem(last=False)[1][0]
            os.close(oldest)
        return start

    def close(self) -> None:
        """Close every pidfd kept (the ingress stops)."""
        while self._kept:
            os.close(self._kept.popitem()[1][0])


def identify(registry: Registry, peer: Peer | None, where: str) -> Descriptor | None:
    """The one live descriptor this peer process is, else ``None`` (never the first of
    several: a pooled pid stays unverified)."""
    if peer is None or peer.start_time is None:
        return None
    pid, start_time = peer.pid, peer.start_time
    try:
        found = registry.live_matching(lambda d: matches_peer(d, pid, start_time))
    except OSError as exc:
        log.warning("uds ingress %s: cannot read the registry: %s", where, exc)
        return None
    return found[0] if len(found) == 1 else None
