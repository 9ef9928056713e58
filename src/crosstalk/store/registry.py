"""The registry: who is registered on this machine, under which name, and whether still alive.

Layout under the state directory (every directory 0700, every file 0600)::

    agents/<agent_id>.json    descriptor, replaced by temp + rename (never torn)
    agents/<agent_id>.lock    agent lock: one live registration per session
    names/<name>.lock         alias lock: one live holder per name
    credentials/<agent_id>.token   the A2A bearer token; descriptors only point at it

Why it is shaped like this (seed §3, F8, C7):

- A *held lock means a running owner*. Both locks are taken first and held for the
  registration's lifetime; a process that dies drops them, so "is the name free" is answered
  by the kernel, not by a pid check that can race.
- Descriptors are published, replaced and removed only by a holder of their agent lock, and a
  shim's exit path removes a descriptor only if its ``instance_id`` is the shim's own. A stale
  exit path can therefore never delete a newer registration's descriptor. The holder is
  :class:`~crosstalk.store.registration.Registration`, which also puts back a descriptor that
  was damaged under it; a damaged descriptor nobody holds the lock of is removed like a stale
  one (:meth:`Registry.remove_unreadable`).
- Lock files are never unlinked (see :class:`~crosstalk.store.files.FileLock`).
- Something that is not a lock file at a lock path (a directory at ``names/bob.lock``) is
  :class:`~crosstalk.store.files.StatePathError` naming the path and its fix. For an agent lock
  that ends the registration (the session has one agent id); for a name lock it only takes
  that name out of the running: the next candidate, as for a name held by a live agent.
- Readers judge a descriptor stale when its pid is dead or that pid's start time differs
  (pid reuse); a descriptor from another pid namespace is ``foreign``, neither live nor dead
  (the descriptor itself, its schema and that verdict: :mod:`crosstalk.store.descriptor`).
"""

from __future__ import annotations

import contextlib
import hmac
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from crosstalk.config import ensure_private_dir
from crosstalk.core.ids import is_agent_id
from crosstalk.core.naming import is_valid_name
from crosstalk.store.descriptor import (
    PROTOCOL,
    Descriptor,
    DescriptorError,
    DescriptorLiveness,
    RegistryError,
    liveness,
    own_process_identity,
    read_descriptor,
)
from crosstalk.store.files import (
    SETTLED_FINE_NS,
    SETTLED_NS,
    FileLock,
    StatePathError,
    is_locked,
    settled,
    signature,
    unlink_durable,
)
from crosstalk.store.registration import NameChoice, NoFreeName, Registration

#: The descriptor's and the registration's names are the registry's public face too: callers
#: import one module.
__all__ = [
    "PROTOCOL", "AgentBusy", "Descriptor", "DescriptorError", "DescriptorLiveness", "Listed",
    "NameChoice", "NoFreeName", "Registration", "Registry", "RegistryError", "StatePathError",
    "Unreadable", "liveness", "own_process_identity", "read_descriptor",
]

_TEMP_FILE_GRACE = 60.0


class AgentBusy(RegistryError):
    """Another live process holds this agent's lock: the session is already registered."""


@dataclass(frozen=True)
class Listed:
    """A descriptor as a reader sees it, with the verdict on whether its owner is alive."""

    descriptor: Descriptor
    liveness: DescriptorLiveness
    path: Path


@dataclass(frozen=True)
class Unreadable:
    """A descriptor file that could not be parsed: reported, never trusted."""

    path: Path
    reason: str

    @property
    def agent_id(self) -> str | None:
        """The agent its file name claims, if the name is an agent id (the content is not
        trusted): whose agent lock says whether its owner still runs."""
        return self.path.stem if is_agent_id(self.path.stem) else None


class Registry:
    """The registry directory tree of one state directory."""

    def __init__(self, home: Path) -> None:
        self.home = ensure_private_dir(home)
        self.agents_dir = ensure_private_dir(home / "agents")
        self.names_dir = ensure_private_dir(home / "names")
        self.credentials_dir = ensure_private_dir(home / "credentials")
        self._seen: dict[str, _Seen] = {}
        self._listing: tuple[tuple[int, ...], list[str]] | None = None

    @classmethod
    def reader(cls, home: Path) -> Registry:
        """A registry for read-only callers (``crosstalk doctor``): it creates no directory
        and changes no permission, so a diagnosis never repairs what it reports."""
        reg = cls.__new__(cls)
        reg.home, reg.agents_dir = home, home / "agents"
        reg.names_dir, reg.credentials_dir = home / "names", home / "credentials"
        reg._seen, reg._listing = {}, None
        return reg

    # -- paths ---------------------------------------------------------------------------

    def descriptor_path(self, agent_id: str) -> Path:
        return self.agents_dir / f"{_checked_id(agent_id)}.json"

    def agent_lock_path(self, agent_id: str) -> Path:
        return self.agents_dir / f"{_checked_id(agent_id)}.lock"

    def name_lock_path(self, name: str) -> Path:
        if not is_valid_name(name):
            raise RegistryError(f"invalid agent name {name!r}")
        return self.names_dir / f"{name}.lock"

    def credential_path(self, agent_id: str) -> Path:
        return self.credentials_dir / f"{_checked_id(agent_id)}.token"

    # -- registering ---------------------------------------------------------------------

    def acquire(self, agent_id: str, *, patience: float = 0.25) -> Registration:
        """Take the agent lock: the first step of every registration (seed §3 order).

        A sweeper probes a stale agent's lock for a moment while it checks the descriptor, so
        a busy lock is retried for ``patience`` seconds before it counts as a live owner.
        """
        path = self.agent_lock_path(agent_id)
        deadline = time.monotonic() + patience
        delay = 0.005
        role = f"the lock file of agent {agent_id}"
        while (lock := FileLock.try_acquire(path, role=role)) is None:
            if time.monotonic() >= deadline:
                raise AgentBusy(f"agent {agent_id} is registered by another live process")
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        return Registration(self, agent_id, lock)

    def name_is_held(self, name: str) -> bool:
        return is_locked(self.name_lock_path(name))

    def agent_is_held(self, agent_id: str) -> bool:
        """Whether a live process holds ``agent_id``'s lock: the one liveness test that needs
        no descriptor, so it also judges a descriptor that no longer reads. Something that is
        not a lock file at the lock path is held by nobody."""
        try:
            return is_locked(self.agent_lock_path(agent_id))
        except StatePathError:
            return False

    def remove_unreadable(self, bad: Unreadable) -> bool:
        """Remove a damaged descriptor (and its agent's token) of an agent no process runs.

        Only under its agent lock, as :meth:`sweep_stale` does, and only while the file still
        does not read: a live owner (which rewrites its own descriptor) keeps the lock, so
        this never removes a descriptor anyone could still publish over."""
        agent_id = bad.agent_id
        if agent_id is None or bad.path.is_dir():  # a directory may be someone's
            return False
        try:
            lock = FileLock.try_acquire(self.agent_lock_path(agent_id))
        except StatePathError:
            return False  # no lock file to take: nothing is proven
        if lock is None:
            return False
        try:
            try:
                current = read_descriptor(bad.path)
            except (OSError, DescriptorError):
                current = None
            if current is not None and current.agent_id == agent_id:
                return False  # rewritten meanwhile: no longer damaged
            unlink_durable(bad.path)
            unlink_durable(self.credential_path(agent_id))
            return True
        finally:
            lock.release()

    # -- reading -------------------------------------------------------------------------

    def scan(self) -> tuple[list[Listed], list[Unreadable]]:
        """Every descriptor file, with its liveness; unparseable files are reported apart."""
        listed: list[Listed] = []
        bad: list[Unreadable] = []
        verdict = _LivenessMemo()
        for path, read in self._read_all():
            if isinstance(read, Unreadable):
                bad.append(read)
            else:
                listed.append(Listed(read, verdict(read), path))
        return listed, bad

    def _read_all(self) -> Iterator[tuple[Path, Descriptor | Unreadable]]:
        """Every descriptor file, parsed, with no liveness verdict yet: a lookup asks the
        (``/proc``-reading) liveness test only of the descriptors it matches, so resolving one
        name or token among many costs one test, not one per registered agent.

        A file whose ``lstat`` is what it was when it was last read, and was then already
        settled (:func:`~crosstalk.store.files.settled`: 50 ms old on a filesystem with
        sub-second times, else 2 s), is not read again (a send, a bearer check and a uds frame each
        scan: reading 16 files was ~330 us of every message between 16 agents). Any write
        since changes its times (or its inode, or its type), so a change is always seen; a file
        written within a timestamp tick of its read is read again until it is settled."""
        now = time.time_ns()
        seen = self._seen
        where = os.fspath(self.agents_dir) + os.sep
        for name in self._descriptor_names(now):
            try:
                st = os.lstat(where + name)
            except OSError:
                st = None
            sig = None if st is None else signature(st)
            known = seen.get(name)
            if known is not None and sig is not None and known.sig == sig:
                yield known.path, known.read
                continue
            path = self.agents_dir / name
            read = _read_at(path)
            if st is not None and sig is not None and settled(
                    st, now, coarse_ns=_SETTLED_NS, fine_ns=_SETTLED_FINE_NS):
                seen[name] = _Seen(sig, path, read)
            else:
                seen.pop(name, None)
            yield path, read

    def _descriptor_names(self, now: int) -> list[str]:
        """``agents/*.json`` in name order, as ``glob`` would list them (hidden names left
        out), sorted as strings: sorting 1,000 Paths cost a scan a third of its time.

        The listing is kept while the directory's own ``stat`` is what it was, once settled:
        a name added, removed or renamed in it changes its times (every descriptor write is
        a rename), where a file written in place is seen by its own ``lstat`` in
        :meth:`_read_all`. One ``stat`` then answers for the ``scandir`` a uds frame, a send
        and a bearer check each made. The ``stat`` is taken before the listing, so a change
        between the two is never kept under the older times."""
        try:
            st = os.stat(self.agents_dir)
        except (FileNotFoundError, NotADirectoryError):
            return []
        sig = signature(st)
        kept = self._listing
        if kept is not None and kept[0] == sig:
            return kept[1]
        try:
            with os.scandir(self.agents_dir) as entries:
                names = sorted(e.name for e in entries
                               if e.name.endswith(".json") and not e.name.startswith("."))
        except (FileNotFoundError, NotADirectoryError):
            return []
        self._listing = (sig, names) if settled(
            st, now, coarse_ns=_SETTLED_NS, fine_ns=_SETTLED_FINE_NS) else None
        return names

    def live_matching(self, match: Callable[[Descriptor], bool]) -> list[Descriptor]:
        """The live descriptors ``match`` accepts; liveness is tested only for those."""
        return list(self._live_where(match))

    def _live_where(self, match: Callable[[Descriptor], bool]) -> Iterator[Descriptor]:
        verdict = _LivenessMemo()
        for _, read in self._read_all():
            if (isinstance(read, Descriptor) and match(read)
                    and verdict(read) is DescriptorLiveness.LIVE):
                yield read

    def live(self) -> list[Descriptor]:
        return list(self._live_where(lambda _: True))

    def find(self, name_or_id: str) -> list[Descriptor]:
        """Live descriptors whose name or agent_id is ``name_or_id`` (several = ambiguous)."""
        return list(self._live_where(lambda d: name_or_id in (d.name, d.agent_id)))

    def agent_for_token(self, token: str, *, hint: str | None = None) -> Descriptor | None:
        """The live agent whose bearer token this is (A2A sender identity), else ``None``.

        Only credential files inside our own credentials directory count: a descriptor cannot
        point us at some other file and have its contents taken as a token. ``hint``: the
        agent_id the token named last time (a caller's cache), tried before the scan.
        """
        if not token:
            return None
        presented = token.encode()
        if hint is not None:
            # Tried first, and verified like any other: one descriptor and one credential
            # read, where a scan reads every agent's credential up to the match (~8 files a
            # request among 16 agents, profiled).
            desc = self.live_descriptor(hint)
            if desc is not None and self._holds_token(desc, presented):
                return desc
        return next(self._live_where(lambda d: self._holds_token(d, presented)), None)

    def _holds_token(self, d: Descriptor, presented: bytes) -> bool:
        path = self.credential_path(d.agent_id)
        if Path(d.credential_ref) != path:
            return False
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or stat.S_IMODE(st.st_mode) & 0o077:
                return False
            stored = os.read(fd, 256).strip()
        finally:
            os.close(fd)
        return bool(stored) and hmac.compare_digest(stored, presented)

    def live_descriptor(self, agent_id: str) -> Descriptor | None:
        """``agent_id``'s descriptor if its owner is live, else ``None`` (one file, no scan)."""
        if not is_agent_id(agent_id):
            return None
        try:
            desc = read_descriptor(self.descriptor_path(agent_id))
        except (OSError, DescriptorError):
            return None
        if desc.agent_id != agent_id or liveness(desc) is not DescriptorLiveness.LIVE:
            return None
        return desc

    def live_owner(self, owner: str | None) -> str | None:
        """A claim's owner as policy sees it: an owner no longer registered counts as absent.

        A claim ends with the *target's* session (seed §7); its owner can go away first (its
        session ended, or its shim is restarting). Until the owner is live again (same
        session, same agent_id) nobody holds the claim: the target is a primary to policy,
        and another primary may claim it.
        """
        if owner is None or self.live_descriptor(owner) is None:
            return None
        return owner

    def holder_of(self, name: str) -> Descriptor | None:
        """The live registration currently using ``name``, if any."""
        return next(self._live_where(lambda d: d.name == name), None)

    def sweep_stale(self, *, now: float | None = None) -> list[str]:
        """Remove descriptors (and bearer tokens) of dead owners; returns the agent ids removed.

        A descriptor is removed only while holding its agent lock, which a live owner never
        releases: a sweep racing a new registration's publication therefore skips it. Temp
        files that a crash left behind mid-write are removed once they are a minute old.
        """
        self._sweep_temp_files(time.time() if now is None else now)
        removed: list[str] = []
        listed, _ = self.scan()
        for item in listed:
            if item.liveness is not DescriptorLiveness.STALE:
                continue
            try:
                lock = FileLock.try_acquire(self.agent_lock_path(item.descriptor.agent_id))
            except StatePathError:
                continue  # something in the way of its lock: doctor reports it
            if lock is None:
                continue  # a live registration owns it (or is about to publish)
            try:
                try:
                    current = read_descriptor(item.path)
                except (OSError, DescriptorError):
                    continue
                if current.instance_id == item.descriptor.instance_id and (
                    liveness(current) is DescriptorLiveness.STALE
                ):
                    unlink_durable(item.path)
                    unlink_durable(self.credential_path(current.agent_id))
                    removed.append(current.agent_id)
            finally:
                lock.release()
        return removed

    def _sweep_temp_files(self, now: float) -> None:
        for directory in (self.agents_dir, self.credentials_dir):
            for tmp in directory.glob(".*.tmp"):
                with contextlib.suppress(OSError):
                    if now - tmp.lstat().st_mtime > _TEMP_FILE_GRACE:
                        tmp.unlink()


#: How old a descriptor file's last change must be before its parse is kept
#: (:func:`crosstalk.store.files.settled`): past the filesystem's timestamp granularity, so a
#: later write changes it; the second for a filesystem with sub-second times.
_SETTLED_NS = SETTLED_NS
_SETTLED_FINE_NS = SETTLED_FINE_NS


class _Seen(NamedTuple):
    sig: tuple[int, ...]
    path: Path
    read: Descriptor | Unreadable


def _read_at(path: Path) -> Descriptor | Unreadable:
    try:
        desc = read_descriptor(path)
    except (OSError, DescriptorError) as exc:
        return Unreadable(path, str(exc))
    if path.stem != desc.agent_id:
        return Unreadable(path, "file name does not match agent_id")
    return desc


class _LivenessMemo:
    """One scan's liveness verdicts by process: a shim serving several agents (a session and
    its subagents, or a bench's 50 sessions) publishes one descriptor each with the same pid
    and start time, and each test reads ``/proc``. Kept for one scan only, so a process that
    exits is seen dead by the next scan."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str | None, int, str], DescriptorLiveness] = {}

    def __call__(self, desc: Descriptor) -> DescriptorLiveness:
        key = (desc.pid_domain, desc.pid, desc.started_at)
        known = self._seen.get(key)
        if known is None:
            known = self._seen[key] = liveness(desc)
        return known


def _checked_id(agent_id: str) -> str:
    if not is_agent_id(agent_id):
        raise RegistryError(f"not an agent id: {agent_id!r}")
    return agent_id
