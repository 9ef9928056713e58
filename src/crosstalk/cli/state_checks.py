"""The files of CrossTalk's state that ``crosstalk doctor`` checks beyond the registry: modes,
things in the way, journals, name locks and uds keys. Each check returns findings; with
``fix`` it applies the repairs that lose nothing and says so, and says why for the rest.

What each check protects, and why its repair is safe:

- **Modes.** Every directory 0700, every file 0600 (the state holds bearer tokens and keys).
  ``chmod`` loses nothing.
- **Things in the way.** A directory, FIFO or symlink where a lock, a descriptor, a token or a
  journal belongs stops that agent from starting (:class:`~crosstalk.store.files.StatePathError`).
  An empty directory is removed (nothing is lost); anything else may be someone's, so it is
  only reported, with the command that moves it aside.
- **Journals.** Damaged lines mid-file (a failed checksum, bad framing) are skipped on replay;
  the repair moves them to ``<journal>.quarantine`` under the journal's lock, the way
  retention does, keeping every record that reads. A torn last line is a write a crash cut
  short, never acknowledged, dropped at the agent's next start: not a problem. Records that
  read but cannot have happened (:func:`crosstalk.core.replay.audit`) are reported; replay
  already keeps each subject's last legal state, so there is nothing to repair.
- **Name locks.** A live agent must hold the lock of its name, or a second agent can take the
  same name; only a restart of its shim takes the lock again.
- **uds keys.** The ingress accepts a key only from a regular 0600 file of its own user
  (:mod:`crosstalk.ingress.uds`), so a key whose mode was loosened makes every
  ``crosstalk send`` fail with ``auth_failed``. The repair is ``fchmod`` 0600 on the file
  itself (no symlink followed); a key of another user is not ours to change.
"""

from __future__ import annotations

import contextlib
import math
import os
import stat
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from crosstalk.config import PRIVATE_DIR_MODE, PRIVATE_FILE_MODE, uds_key_path
from crosstalk.core.ids import is_agent_id
from crosstalk.core.replay import audit
from crosstalk.harness.plugin import Finding
from crosstalk.store.files import StatePathError, in_the_way
from crosstalk.store.journal import Journal, JournalError
from crosstalk.store.journal_read import Damage, read_journal
from crosstalk.store.registry import Descriptor, DescriptorLiveness, Listed, Registry

#: The state's subdirectories (``sock/`` holds sockets and keys when no harness names a place).
SUBDIRS = ("agents", "names", "journal", "credentials", "sock")


def _mode(st: os.stat_result) -> str:
    return f"{stat.S_IMODE(st.st_mode):04o}"


def permissions(home: Path, fix: bool) -> list[Finding]:
    """Directories 0700 and regular files 0600 (symlinks and the like: :func:`obstacles`)."""
    loose: list[Path] = []
    for path in [home, *(home / d for d in SUBDIRS)]:
        if _loose(path, stat.S_ISDIR):
            loose.append(path)
        if path != home and path.name != "sock":  # sock/: sockets, and keys (see keys())
            loose += [f for f in _entries(path) if _loose(f, stat.S_ISREG)]
    if loose and fix:
        for path in loose:
            path.chmod(PRIVATE_DIR_MODE if path.is_dir() else PRIVATE_FILE_MODE)
        return [Finding(True, f"permissions tightened on {len(loose)} paths")]
    if loose:
        return [Finding(False, "state readable by others: " + ", ".join(map(str, loose)),
                        "crosstalk doctor --fix")]
    return [Finding(True, f"state directory {home} is private")]


def _loose(path: Path, is_kind: Callable[[int], bool]) -> bool:
    try:
        st = path.lstat()
    except OSError:
        return False
    return is_kind(st.st_mode) and bool(stat.S_IMODE(st.st_mode) & 0o077)


def _entries(directory: Path) -> list[Path]:
    try:
        return sorted(directory.iterdir())
    except OSError:
        return []


def _roles(home: Path) -> Iterable[tuple[Path, str, str]]:
    """(path, role, what it blocks) for every path of ours that exists as something."""
    for path in _entries(home / "agents"):
        aid = path.name.split(".", 1)[0]
        if is_agent_id(aid) and path.name in (f"{aid}.lock", f"{aid}.json"):
            kind = "lock file" if path.suffix == ".lock" else "descriptor"
            yield path, f"the {kind} of agent {aid}", "that agent cannot register"
    for path in _entries(home / "names"):
        if path.suffix == ".lock":
            yield (path, f"the lock file of the name {path.stem!r}",
                   f"no agent can take the name {path.stem!r}")
    for path in _entries(home / "credentials"):
        if path.suffix == ".token":
            yield path, f"the bearer token of agent {path.stem}", "that agent cannot register"
    for path in _entries(home / "journal"):
        if path.name.endswith((".jsonl", ".jsonl.lock")):
            role = "a journal's lock file" if path.suffix == ".lock" else "a journal"
            yield path, role, "its agent cannot start"


def obstacles(home: Path, fix: bool) -> list[Finding]:
    """Something that is not a regular file where one of ours belongs."""
    found = []
    for path, role, blocks in _roles(home):
        try:
            st = path.lstat()
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            continue
        err = in_the_way(path, role, st)
        if fix and err.fix.startswith("rmdir "):
            with contextlib.suppress(OSError):
                path.rmdir()
                found.append(Finding(True, f"removed the empty directory {path} where "
                                     f"{role} belongs"))
                continue
        found.append(Finding(False, f"{path} is {err.kind} where {role} belongs: {blocks}",
                             err.fix))
    return found


def _label(desc: Descriptor | None, agent_id: str) -> str:
    return f"agent '{desc.name}'" if desc is not None else f"agent {agent_id}"


def journals(home: Path, listed: Sequence[Listed], fix: bool) -> list[Finding]:
    """Damage, a torn tail and illegal record sequences in each journal."""
    by_id = {i.descriptor.agent_id: i for i in listed}
    found: list[Finding] = []
    intact = 0
    for path in _entries(home / "journal"):
        if path.suffix != ".jsonl" or not stat.S_ISREG(path.lstat().st_mode):
            continue
        item = by_id.get(path.stem)
        whose = _label(item.descriptor if item else None, path.stem)
        live = item is not None and item.liveness is DescriptorLiveness.LIVE
        try:
            replay = read_journal(path)
        except OSError as exc:
            found.append(Finding(False, f"cannot read journal {path} ({whose}): {exc}"))
            continue
        damaged = [d for d in replay.damage if d.reason != "torn_tail"]
        torn = [d for d in replay.damage if d.reason == "torn_tail"]
        violations = audit(replay.records)
        if damaged:
            found.append(_damaged(path, whose, damaged, fix))
        if torn and not live:  # a live writer may be mid-append
            found.append(Finding(True, f"journal {path} ({whose}) ends in a torn line of "
                                 f"{torn[0].length} bytes: a write a crash cut short, never "
                                 "acknowledged; its agent drops it at its next start"))
        if violations:
            found.append(Finding(
                False, f"journal {path} ({whose}) holds {len(violations)} record(s) that "
                f"cannot have happened, first {violations[0]}",
                "nothing to repair: replay keeps each subject's last legal state and skips "
                "them; keep the journal if you report this"))
        if not (damaged or torn or violations):
            intact += 1
    if intact:
        found.append(Finding(True, f"{intact} journal{'s' if intact != 1 else ''} intact"))
    return found


def _damaged(path: Path, whose: str, damaged: Sequence[Damage], fix: bool) -> Finding:
    n = len(damaged)
    lines = f"{n} damaged line{'s' if n != 1 else ''}"
    where = ", ".join(f"{d.reason} at byte {d.offset}"
                      for d in damaged[:3]) + (", ..." if n > 3 else "")
    quarantine = path.with_name(path.name + ".quarantine")
    if fix:
        try:
            with Journal(path) as journal:
                moved = journal.apply_retention(max_age=math.inf).quarantined
        except (OSError, JournalError) as exc:
            return Finding(False, f"journal {path} ({whose}): {lines} ({where}) could not be "
                           f"moved aside: {exc}")
        return Finding(True, f"journal {path} ({whose}): moved {moved} damaged line"
                       f"{'s' if moved != 1 else ''} to {quarantine}; every record that "
                       "reads is kept")
    return Finding(False, f"journal {path} ({whose}): {lines} ({where}), skipped on replay",
                   f"crosstalk doctor --fix (moves them to {quarantine})")


def names(registry: Registry, listed: Sequence[Listed]) -> list[Finding]:
    """Every live agent holds the lock of its name."""
    found = []
    for item in listed:
        desc = item.descriptor
        if item.liveness is not DescriptorLiveness.LIVE:
            continue
        try:
            held = registry.name_is_held(desc.name)
        except StatePathError:
            held = False  # reported by obstacles()
        if not held:
            found.append(Finding(
                False, f"the name '{desc.name}' of live agent {desc.agent_id} is not locked: "
                f"{registry.name_lock_path(desc.name)} was removed or replaced, so another "
                "agent can take the same name",
                "restart that session's crosstalk mcp (it takes its name's lock again)"))
    return found


def keys(home: Path, listed: Sequence[Listed], fix: bool) -> list[Finding]:
    """Each agent's uds key is a regular 0600 file of ours (else every send fails)."""
    owners: dict[Path, Listed | None] = {}
    for item in listed:
        if item.descriptor.uds_path:
            owners[uds_key_path(Path(item.descriptor.uds_path))] = item
    for path in _entries(home / "sock"):
        if path.suffix == ".key":
            owners.setdefault(path, None)
    found = []
    for path, owner in sorted(owners.items()):
        live = owner is not None and owner.liveness is DescriptorLiveness.LIVE
        whose = (_label(owner.descriptor, owner.descriptor.agent_id) if owner is not None
                 else "no registered agent")
        finding = _key(path, whose, live, fix)
        if finding is not None:
            found.append(finding)
    return found


def _key(path: Path, whose: str, live: bool, fix: bool) -> Finding | None:
    refused = "so the agent refuses every crosstalk send (auth_failed)"
    try:
        st = path.lstat()
    except FileNotFoundError:
        if not live:
            return None
        return Finding(False, f"uds key {path} of {whose} is missing: crosstalk send cannot "
                       "authenticate to it", "restart that session's crosstalk mcp")
    except OSError as exc:
        return Finding(False, f"cannot read uds key {path} of {whose}: {exc}")
    if not stat.S_ISREG(st.st_mode):
        return Finding(False, f"uds key {path} of {whose} is not a regular file, {refused}",
                       "restart that session's crosstalk mcp (it writes a fresh key)")
    if st.st_uid != os.getuid():
        return Finding(False, f"uds key {path} of {whose} is owned by uid {st.st_uid}, not "
                       f"by us, {refused}; doctor --fix does not change another user's file",
                       "restart that session's crosstalk mcp (it writes a fresh key)")
    if stat.S_IMODE(st.st_mode) == PRIVATE_FILE_MODE:
        return None
    if not fix:
        return Finding(False, f"uds key {path} of {whose} is mode {_mode(st)}, not 0600, "
                       f"{refused}", "crosstalk doctor --fix")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            os.fchmod(fd, PRIVATE_FILE_MODE)
        finally:
            os.close(fd)
    except OSError as exc:
        return Finding(False, f"uds key {path} of {whose} is mode {_mode(st)} and could not "
                       f"be made 0600: {exc}", "restart that session's crosstalk mcp")
    return Finding(True, f"uds key {path} of {whose}: mode {_mode(st)} set to 0600 "
                   "(crosstalk send can authenticate again)")
