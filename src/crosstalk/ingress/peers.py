"""Who is on the other end of a uds connection: the kernel's peer credentials, matched to the
one live registered agent they belong to. Identity comes only from the transport, never from
what a frame says about itself.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from crosstalk import proc
from crosstalk.core.message import Ingress, Sender
from crosstalk.store.registry import Descriptor, Registry

log = logging.getLogger(__name__)


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


def peer_of(transport: asyncio.BaseTransport) -> Peer | None:
    """The kernel's word on who connected, with the pid's start time read right now."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return None
    try:
        creds = proc.peer_credentials(sock)
    except OSError:
        return None
    return Peer(creds.pid, creds.uid, proc.process_start_time(creds.pid))


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
