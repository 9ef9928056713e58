"""The descriptor: the public record of one registered agent, its schema and its liveness.

A descriptor is ``agents/<agent_id>.json`` under the state directory (the layout and its locks:
:mod:`crosstalk.store.registry`, which re-exports these names). It never contains a secret: the
A2A bearer token sits in a 0600 credential file the descriptor only points at (seed §3).
Readers judge a descriptor stale when its pid is dead or that pid's start time differs (pid
reuse); a descriptor from another pid namespace is ``foreign``, neither live nor dead.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from functools import lru_cache
from pathlib import Path
from typing import Any

from crosstalk import proc
from crosstalk.core.ids import is_agent_id
from crosstalk.core.naming import is_valid_name

PROTOCOL = 1
_MAX_DESCRIPTOR_BYTES = 64 * 1024


class RegistryError(Exception):
    """Base class for registry failures (a malformed descriptor is one)."""


class DescriptorError(RegistryError, ValueError):
    """A descriptor file does not have the shape the protocol requires."""


class DescriptorLiveness(StrEnum):
    """Whether the process a registry descriptor names is still the one that registered it."""

    LIVE = "live"
    STALE = "stale"
    FOREIGN = "foreign"  # another pid namespace: cannot be checked from here


@dataclass(frozen=True)
class Descriptor:
    """The public record of one registered agent (seed §3). Never contains a secret."""

    agent_id: str
    name: str
    harness: str
    session_ref: str
    cwd: str
    pid: int
    started_at: str
    instance_id: str
    credential_ref: str
    role: str = "primary"
    owner: str | None = None
    harness_pid: int | None = None
    harness_started_at: str | None = None
    a2a_url: str | None = None
    uds_path: str | None = None
    harness_endpoint: str | None = None
    harness_version: str | None = None
    pid_domain: str | None = None
    installed: bool = True
    protocol: int = PROTOCOL
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> bytes:
        # Unknown fields from a newer writer are carried through, but never over known ones.
        data = dict(self.extra)
        data.update({k: v for k, v in asdict(self).items() if k != "extra"})
        return json.dumps(data, indent=2, sort_keys=True).encode() + b"\n"

    @classmethod
    def from_json(cls, raw: bytes) -> Descriptor:
        if len(raw) > _MAX_DESCRIPTOR_BYTES:
            raise DescriptorError("descriptor too large")
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            # RecursionError: deeply nested input ("[[[[..." well under the size cap) makes
            # json.loads give up; uncaught, one such file would crash scan() and sweep_stale().
            raise DescriptorError(f"not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise DescriptorError("descriptor is not a JSON object")
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Descriptor:
        known = {f.name: f for f in fields(cls) if f.name != "extra"}
        kwargs: dict[str, Any] = {k: v for k, v in data.items() if k in known}
        missing = [n for n in _REQUIRED if n not in data]
        if missing:
            raise DescriptorError(f"missing fields: {', '.join(missing)}")
        for name, types in _TYPES.items():
            if name in kwargs and not _is(kwargs[name], types):
                raise DescriptorError(f"field {name!r} has the wrong type")
        if not is_agent_id(kwargs["agent_id"]):
            raise DescriptorError("agent_id is not 16 hex digits")
        if not is_valid_name(kwargs["name"]):
            raise DescriptorError("name is not a valid agent name")
        if kwargs["pid"] <= 0:
            raise DescriptorError("pid must be positive")
        extra = {k: v for k, v in data.items() if k not in known}
        return cls(**kwargs, extra=extra)


_REQUIRED = ("agent_id", "name", "harness", "session_ref", "cwd", "pid", "started_at",
             "instance_id", "credential_ref")
_STR = (str,)
_OPT_STR = (str, type(None))
_OPT_INT = (int, type(None))
_TYPES: dict[str, tuple[type, ...]] = {
    "agent_id": _STR, "name": _STR, "harness": _STR, "session_ref": _STR, "cwd": _STR,
    "pid": (int,), "started_at": _STR, "instance_id": _STR, "credential_ref": _STR,
    "role": _STR, "owner": _OPT_STR, "harness_pid": _OPT_INT, "harness_started_at": _OPT_STR,
    "a2a_url": _OPT_STR, "uds_path": _OPT_STR, "harness_endpoint": _OPT_STR,
    "harness_version": _OPT_STR, "pid_domain": _OPT_STR, "installed": (bool,),
    "protocol": (int,),
}


def _is(value: object, types: tuple[type, ...]) -> bool:
    # bool is an int subclass; a descriptor with "pid": true is malformed, not pid 1.
    if isinstance(value, bool) and bool not in types:
        return False
    return isinstance(value, types)


def liveness(desc: Descriptor) -> DescriptorLiveness:
    """Whether ``desc``'s owner still runs: its pid alive with the recorded start time."""
    if desc.pid_domain is not None and desc.pid_domain != proc.pid_domain():
        return DescriptorLiveness.FOREIGN
    if proc.process_matches(desc.pid, desc.started_at):
        return DescriptorLiveness.LIVE
    return DescriptorLiveness.STALE


def read_descriptor(path: Path) -> Descriptor:
    # O_NONBLOCK + S_ISREG: a FIFO or device planted as "<id>.json" must not hang a scan;
    # O_NOFOLLOW: a symlink is not a descriptor we wrote.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise DescriptorError("not a regular file")
        raw = os.read(fd, _MAX_DESCRIPTOR_BYTES + 1)
    finally:
        os.close(fd)
    return _parsed(raw)


@lru_cache(maxsize=4096)
def _parsed(raw: bytes) -> Descriptor:
    """A descriptor's bytes parsed once: a scan reads every file on each call (list_agents,
    a send's peer, a bearer check) and the schema checks cost ~75 us a file, the read ~10 us.
    Keyed by the exact bytes, so a rewritten file is parsed anew; a file that does not parse
    raises every time (exceptions are not cached). The returned descriptor is shared between
    callers: it is frozen, and nothing mutates its ``extra``."""
    return Descriptor.from_json(raw)


def own_process_identity() -> tuple[int, str]:
    """(pid, start time) of this process, as descriptors record them."""
    pid = os.getpid()
    started = proc.process_start_time(pid)
    if started is None:
        raise RegistryError("cannot read this process's start time")
    return pid, started
