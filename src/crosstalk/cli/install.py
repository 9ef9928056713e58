"""``crosstalk install`` / ``uninstall``: register ``crosstalk mcp`` with Claude Code and Codex.

Claude Code: a user-scope MCP server, the top-level ``mcpServers.crosstalk`` of its global
config (``$CLAUDE_CONFIG_DIR/.claude.json``, else ``~/.claude.json``), plus the CrossTalk skill
under ``<config dir>/skills/crosstalk/``. Codex: ``[mcp_servers.crosstalk]`` in
``$CODEX_HOME/config.toml`` (else ``~/.codex/config.toml``), edited with ``tomlkit`` so the
user's comments and order stay; Codex starts MCP servers with a filtered environment, so the
entry forwards what CrossTalk needs to find both harnesses and its state (``env_vars``).

Exactness: the bytes of each file before the first install are kept in the state directory,
with a digest of what install wrote. ``uninstall`` restores those bytes when the file is still
exactly what install wrote; if something else changed it since (Claude rewrites its config all
the time), only our entry is removed and everything else is left as it is now.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import tomlkit

from crosstalk.config import ensure_private_dir
from crosstalk.store.files import write_atomic

SERVER = "crosstalk"
CODEX_ENV_VARS = ["CODEX_HOME", "CLAUDE_CONFIG_DIR", "XDG_RUNTIME_DIR", "XDG_STATE_HOME",
                  "CROSSTALK_HOME"]
SKILL_SOURCE = Path(__file__).resolve().parents[1] / "skill" / "SKILL.md"


class InstallError(Exception):
    pass


def _home(env: Mapping[str, str]) -> Path:
    return Path(env.get("HOME") or str(Path.home()))


def claude_config_file(env: Mapping[str, str]) -> Path:
    configured = env.get("CLAUDE_CONFIG_DIR")
    return Path(configured) / ".claude.json" if configured else _home(env) / ".claude.json"


def claude_config_dir(env: Mapping[str, str]) -> Path:
    configured = env.get("CLAUDE_CONFIG_DIR")
    return Path(configured) if configured else _home(env) / ".claude"


def codex_config_file(env: Mapping[str, str]) -> Path:
    configured = env.get("CODEX_HOME")
    return (Path(configured) if configured else _home(env) / ".codex") / "config.toml"


def server_command() -> list[str]:
    """The absolute command a harness runs: our console script next to this interpreter, else
    this interpreter with ``-m crosstalk``."""
    script = Path(sys.executable).parent / "crosstalk"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script), "mcp"]
    return [sys.executable, "-m", "crosstalk", "mcp"]


# -- the edits (pure: text in, text out) ---------------------------------------------------------


def claude_with(text: str | None, command: list[str]) -> str:
    data: dict[str, Any] = json.loads(text) if text and text.strip() else {}
    if not isinstance(data, dict):
        raise InstallError("the Claude Code config is not a JSON object")
    servers = data.setdefault("mcpServers", {})
    if not isinstance(servers, dict):
        raise InstallError("mcpServers in the Claude Code config is not an object")
    servers[SERVER] = {"type": "stdio", "command": command[0], "args": command[1:], "env": {}}
    return _dump_json(data, text)


def claude_without(text: str) -> str:
    data = json.loads(text)
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if isinstance(servers, dict) and SERVER in servers:
        del servers[SERVER]
        if not servers:
            del data["mcpServers"]
    return _dump_json(data, text)


def _dump_json(data: Any, original: str | None) -> str:
    # JSON.stringify(obj, null, 2), as Claude writes it; keep the original's final newline.
    out = json.dumps(data, indent=2, ensure_ascii=False)
    return out + "\n" if original is None or original.endswith("\n") else out


def codex_with(text: str | None, command: list[str]) -> str:
    doc = tomlkit.parse(text or "")
    servers = doc.get("mcp_servers")
    if servers is None:
        servers = tomlkit.table(is_super_table=True)
        doc["mcp_servers"] = servers
    entry = tomlkit.table()
    entry["command"] = command[0]
    entry["args"] = command[1:]
    entry["env_vars"] = CODEX_ENV_VARS
    servers[SERVER] = entry
    return tomlkit.dumps(doc)


def codex_without(text: str) -> str:
    doc = tomlkit.parse(text)
    servers = doc.get("mcp_servers")
    if servers is not None and SERVER in servers:
        del servers[SERVER]
        if not servers:
            del doc["mcp_servers"]
    return tomlkit.dumps(doc)


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


def _digest(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode()).hexdigest()


class Installer:
    def __init__(self, state: Path, env: Mapping[str, str] | None = None) -> None:
        self.env = dict(os.environ) if env is None else dict(env)
        self.saved = state / "install"

    def targets(self) -> dict[str, Path]:
        return {"claude": claude_config_file(self.env), "codex": codex_config_file(self.env)}

    def skill_path(self) -> Path:
        return claude_config_dir(self.env) / "skills" / "crosstalk" / "SKILL.md"

    def plan_install(self, command: list[str] | None = None) -> list[Change]:
        command = command or server_command()
        changes = []
        for harness, path in self.targets().items():
            before = _read(path)
            try:
                after = (claude_with(before, command) if harness == "claude"
                         else codex_with(before, command))
            except (ValueError, tomlkit.exceptions.TOMLKitError) as exc:
                raise InstallError(f"cannot read {path}: {exc}") from None
            changes.append(Change(path, before, after))
        skill = self.skill_path()
        changes.append(Change(skill, _read(skill), SKILL_SOURCE.read_text(encoding="utf-8")))
        return changes

    def plan_uninstall(self) -> list[Change]:
        changes = []
        for harness, path in self.targets().items():
            now = _read(path)
            record = self._record(harness)
            if now is None:
                continue
            if record is not None and record.get("wrote") == _digest(now):
                after = record.get("before")  # untouched since install: the exact old bytes
            else:
                try:
                    after = claude_without(now) if harness == "claude" else codex_without(now)
                except (ValueError, tomlkit.exceptions.TOMLKitError) as exc:
                    raise InstallError(f"cannot read {path}: {exc}") from None
            changes.append(Change(path, now, after))
        skill = self.skill_path()
        if skill.exists():
            changes.append(Change(skill, _read(skill), None))
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
            print("CrossTalk is registered; new Claude Code sessions and Codex threads start "
                  "it (restart running ones).", file=out)
    return 0
