"""``crosstalk install`` / ``uninstall``: register ``crosstalk mcp`` with every harness.

Each harness says what to write through its plugin (:mod:`crosstalk.harness.plugin`): config
files to register the server in (an edit and its inverse, both pure) and files to place whole
(Claude's skill). Every registered harness is planned, in name order, configs first; a config
that cannot be read fails the whole plan and nothing is written.

Exactness: the bytes of each config before the first install are kept in the state
directory, with a digest of what install wrote. ``uninstall`` restores those bytes when the
file is still exactly what install wrote; if something else changed it since (Claude rewrites
its config all the time), only our entry is removed and everything else is left as it is now.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from crosstalk.config import ensure_private_dir
from crosstalk.harness.loader import plugins
from crosstalk.harness.plugin import ConfigEdit, ConfigError, PlacedFile
from crosstalk.store.files import write_atomic


class InstallError(Exception):
    pass


def server_command() -> list[str]:
    """The absolute command a harness runs: our console script next to this interpreter, else
    this interpreter with ``-m crosstalk``."""
    script = Path(sys.executable).parent / "crosstalk"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script), "mcp"]
    return [sys.executable, "-m", "crosstalk", "mcp"]


# -- applying them -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    path: Path
    before: str | None
    after: str | None  # None: remove the file

    @property
    def changed(self) -> bool:
        return self.before != self.after

    def diff(self) -> str:
        return "".join(difflib.unified_diff(
            (self.before or "").splitlines(keepends=True),
            (self.after or "").splitlines(keepends=True),
            fromfile=f"{self.path} (now)", tofile=f"{self.path} (after)"))


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as exc:  # not ours to repair: say so, write nothing
        raise InstallError(f"cannot read {path}: it is not UTF-8 ({exc.reason} at byte "
                           f"{exc.start})") from None


def _digest(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode()).hexdigest()


class Installer:
    def __init__(self, state: Path, env: Mapping[str, str] | None = None) -> None:
        self.env = dict(os.environ) if env is None else dict(env)
        self.saved = state / "install"
        by_harness = {p.name: list(p.install(self.env))
                      for p in sorted(plugins(), key=lambda p: p.name)}
        #: The harnesses install registers CrossTalk with (those whose plugin writes anything).
        self.harnesses = [name for name, found in by_harness.items() if found]
        entries = [e for found in by_harness.values() for e in found]
        self.configs = [e for e in entries if isinstance(e, ConfigEdit)]
        self.files = [e for e in entries if isinstance(e, PlacedFile)]

    def targets(self) -> dict[str, Path]:
        """Each harness config install edits, by its record's name."""
        return {edit.key: edit.path for edit in self.configs}

    def plan_install(self, command: list[str] | None = None) -> list[Change]:
        command = command or server_command()
        changes = []
        for edit in self.configs:
            before = _read(edit.path)
            after = _edited(edit.path, edit.add, before, command)
            changes.append(Change(edit.path, before, after))
        for placed in self.files:
            changes.append(Change(placed.path, _read(placed.path), placed.content()))
        return changes

    def plan_uninstall(self) -> list[Change]:
        changes = []
        for edit in self.configs:
            now = _read(edit.path)
            record = self._record(edit.key)
            if now is None:
                continue
            if record is not None and record.get("wrote") == _digest(now):
                after = record.get("before")  # untouched since install: the exact old bytes
            else:
                after = _edited(edit.path, edit.remove, now)
            changes.append(Change(edit.path, now, after))
        for placed in self.files:
            if placed.path.exists():
                changes.append(Change(placed.path, _read(placed.path), None))
        return changes

    def apply(self, changes: list[Change], *, installing: bool) -> None:
        if installing and self._record("dirs") is None:
            # Directories install creates (the skill's, a first ~/.codex) go with uninstall.
            self._save("dirs", {"created": sorted({str(d) for c in changes
                                                    for d in _missing_parents(c.path)})})
        for change in changes:
            harness = next((h for h, p in self.targets().items() if p == change.path), None)
            if installing and harness is not None and self._record(harness) is None:
                self._save(harness, {"before": change.before, "wrote": _digest(change.after)})
            elif installing and harness is not None:
                record = self._record(harness) or {}
                self._save(harness, {**record, "wrote": _digest(change.after)})
            if change.changed:
                self._write(change)
            if not installing and harness is not None:
                (self.saved / f"{harness}.json").unlink(missing_ok=True)
        if not installing:
            created = (self._record("dirs") or {}).get("created", [])
            for directory in sorted(map(Path, created), key=lambda p: len(p.parts),
                                    reverse=True):
                if directory.is_dir() and not any(directory.iterdir()):
                    directory.rmdir()
            (self.saved / "dirs.json").unlink(missing_ok=True)

    def _write(self, change: Change) -> None:
        if change.after is None:
            change.path.unlink(missing_ok=True)
            return
        change.path.parent.mkdir(parents=True, exist_ok=True)
        mode = change.path.stat().st_mode & 0o777 if change.path.exists() else 0o600
        write_atomic(change.path, change.after.encode("utf-8"), mode)

    def _record(self, harness: str) -> dict[str, Any] | None:
        try:
            data = json.loads((self.saved / f"{harness}.json").read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def _save(self, harness: str, record: dict[str, Any]) -> None:
        ensure_private_dir(self.saved)
        write_atomic(self.saved / f"{harness}.json", json.dumps(record).encode(), 0o600)


def _edited(path: Path, edit: Callable[..., str], *args: Any) -> str:
    """``edit(*args)``; a config it cannot read is an :class:`InstallError` (nothing written)."""
    try:
        return edit(*args)
    except ConfigError as exc:
        raise InstallError(str(exc)) from None
    except ValueError as exc:
        raise InstallError(f"cannot read {path}: {exc}") from None


def _missing_parents(path: Path) -> list[Path]:
    missing = []
    for parent in path.parents:
        if parent.exists():
            break
        missing.append(parent)
    return missing


def run_install(state: Path, *, uninstall: bool = False, dry_run: bool = False,
                env: Mapping[str, str] | None = None, out: IO[str] | None = None) -> int:
    out = out or sys.stdout
    installer = Installer(state, env)
    try:
        changes = installer.plan_uninstall() if uninstall else installer.plan_install()
    except InstallError as exc:
        print(f"crosstalk {'uninstall' if uninstall else 'install'}: {exc}", file=sys.stderr)
        return 1
    for change in changes:
        verb = ("unchanged" if not change.changed else "remove" if change.after is None
                else "create" if change.before is None else "update")
        print(f"{verb}: {change.path}", file=out)
        if dry_run and change.changed:
            print(change.diff(), file=out, end="")
    if not dry_run:
        installer.apply(changes, installing=not uninstall)
        if not uninstall:
            print(f"CrossTalk is registered with {', '.join(installer.harnesses)}; their "
                  "sessions started from now on run it (restart running ones).", file=out)
    return 0
