"""One live registration: the agent lock, the alias lock, the credential and the descriptor.

:meth:`crosstalk.store.registry.Registry.acquire` makes one (the layout and the rules of the
registry are that module's); every mutation of the agent's descriptor goes through it, so every
mutation happens under the agent lock (seed §3 "Publish order and ownership").

Only the agent-lock holder publishes, so while the lock is held a descriptor file that is not
byte for byte what was published is damage (torn, removed, replaced by hand), never a newer
registration: :meth:`Registration.keep_published` puts it back.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import stat
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from crosstalk.config import PRIVATE_FILE_MODE
from crosstalk.store.descriptor import Descriptor, DescriptorError, RegistryError, read_descriptor
from crosstalk.store.files import FileLock, StatePathError, unlink_durable, write_atomic

if TYPE_CHECKING:
    from crosstalk.store.registry import Registry

log = logging.getLogger(__name__)


class NoFreeName(RegistryError):
    """Every candidate name is held by a live registration."""


@dataclass(frozen=True)
class NameChoice:
    """The name a registration got, and why it is not the first candidate if it is not."""

    name: str
    preferred: str
    #: The live registration holding ``preferred`` when we had to fall back, if one is listed.
    preferred_holder: Descriptor | None
    #: Why ``preferred`` could not be taken when something not ours sits at its lock path.
    preferred_blocked: StatePathError | None = None

    @property
    def is_fallback(self) -> bool:
        return self.name != self.preferred


class Registration:
    """One live registration: holds the agent lock and (once named) the alias lock.

    Created by :meth:`Registry.acquire`; every mutation of this agent's descriptor goes
    through it, so every mutation happens under the agent lock.
    """

    def __init__(self, registry: Registry, agent_id: str, agent_lock: FileLock) -> None:
        self.registry = registry
        self.agent_id = agent_id
        self._agent_lock = agent_lock
        self._name_lock: FileLock | None = None
        self.name: str | None = None
        self.descriptor: Descriptor | None = None
        self.token: str | None = None
        #: Lock paths found blocked, each logged once (a fallback retries its name every poll).
        self._blocked_logged: set[Path] = set()
        #: The bytes of our last publish: what the descriptor file must still hold.
        self._published: bytes | None = None

    @property
    def active(self) -> bool:
        return self._agent_lock.held

    def _require_active(self) -> None:
        if not self.active:
            raise RegistryError(f"registration of {self.agent_id} is closed")

    def take_name(self, candidates: Iterable[str]) -> NameChoice:
        """Take the first candidate whose alias lock is free, and keep holding it."""
        choice, old = self._take_name(candidates)
        if old is not None:
            old.release()
        return choice

    def _take_name(self, candidates: Iterable[str]) -> tuple[NameChoice, FileLock | None]:
        # Returns the previous alias lock still held; the caller releases it. rename() needs
        # that: seed §3 orders a rename as take new lock, rewrite descriptor, release old lock.
        # Releasing first would let another agent take the old name while our descriptor
        # still names it (two live descriptors with one name).
        self._require_active()
        ordered = list(dict.fromkeys(candidates))
        if not ordered:
            raise NoFreeName("no candidate names")
        blocked: StatePathError | None = None
        for name in ordered:
            if name == self.name:
                return NameChoice(name, ordered[0], None, blocked), None
            try:
                lock = FileLock.try_acquire(self.registry.name_lock_path(name),
                                            role=f"the lock file of the name {name!r}")
            except StatePathError as exc:
                self._log_blocked(exc)
                if name == ordered[0]:
                    blocked = exc
                continue
            if lock is None:
                continue
            try:
                holder = None if name == ordered[0] else self.registry.holder_of(ordered[0])
            except BaseException:
                lock.release()
                raise
            old = self._name_lock
            self._name_lock, self.name = lock, name
            return NameChoice(name, ordered[0], holder, blocked), old
        raise NoFreeName(f"every candidate name is held: {', '.join(ordered)}")

    def _log_blocked(self, exc: StatePathError) -> None:
        if exc.path not in self._blocked_logged:
            self._blocked_logged.add(exc.path)
            log.warning("agent %s: %s", self.agent_id, exc)

    def issue_credential(self) -> Path:
        """Write a fresh bearer token to a 0600 file; the descriptor only references it."""
        self._require_active()
        path = self.registry.credential_path(self.agent_id)
        self.token = secrets.token_hex(32)
        write_atomic(path, self.token.encode() + b"\n", PRIVATE_FILE_MODE,
                     role=f"the bearer token of agent {self.agent_id}")
        return path

    def publish(self, descriptor: Descriptor) -> None:
        """Write the descriptor (temp + rename) while holding both locks."""
        self._require_active()
        if descriptor.agent_id != self.agent_id:
            raise RegistryError("descriptor belongs to another agent")
        if self.name is None or descriptor.name != self.name:
            raise RegistryError("publish the name this registration holds the lock for")
        raw = descriptor.to_json()
        write_atomic(self.registry.descriptor_path(self.agent_id), raw,
                     role=f"the descriptor of agent {self.agent_id}")
        self.descriptor, self._published = descriptor, raw

    def keep_published(self) -> bool:
        """Rewrite our descriptor if its file no longer holds what we published (torn,
        truncated, removed, replaced); ``True`` if it was rewritten.

        While it is damaged the agent is invisible and unreachable, and nobody else may repair
        it: only the agent-lock holder publishes, which is also why a file that differs is
        damage, never a newer registration. ``OSError`` if the rewrite fails."""
        if not self.active or self.descriptor is None or self._published is None:
            return False
        path = self.registry.descriptor_path(self.agent_id)
        want = self._published
        current = None  # missing, a symlink or a directory: not what we wrote
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    current = os.read(fd, len(want) + 1)
            finally:
                os.close(fd)
        if current == want:
            return False
        self.publish(self.descriptor)
        return True

    def rename(self, candidates: Iterable[str]) -> NameChoice:
        """Move to a new alias: take the new lock, rewrite the descriptor, drop the old lock."""
        prev_name = self.name
        choice, old = self._take_name(candidates)
        try:
            if self.descriptor is not None and self.descriptor.name != choice.name:
                self.publish(replace(self.descriptor, name=choice.name))
        except BaseException:
            # The descriptor still shows the old name: keep holding it, give the new one back.
            if old is not None:
                new, self._name_lock, self.name = self._name_lock, old, prev_name
                if new is not None:
                    new.release()
            raise
        if old is not None:
            old.release()
        return choice

    def close(self) -> None:
        """The exit path: remove our own descriptor and credential, then drop both locks.

        Removal checks the file's ``instance_id``; a descriptor some later instance wrote is
        left alone. Lock files stay (see :class:`FileLock`).
        """
        if not self.active:
            return
        try:
            path = self.registry.descriptor_path(self.agent_id)
            if self.descriptor is not None:
                try:
                    current = read_descriptor(path)
                except (OSError, DescriptorError):
                    current = None
                if current is not None and current.instance_id == self.descriptor.instance_id:
                    unlink_durable(path)
            if self.token is not None:
                cred = self.registry.credential_path(self.agent_id)
                try:
                    with open(cred, encoding="ascii") as f:
                        ours = f.read().strip() == self.token
                except OSError:
                    ours = False
                if ours:
                    unlink_durable(cred)
        finally:
            if self._name_lock is not None:
                self._name_lock.release()
            self._agent_lock.release()
