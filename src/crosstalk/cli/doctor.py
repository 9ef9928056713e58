"""``crosstalk doctor``: what is installed where, what runs, and what is wrong — each problem
with the command that fixes it. ``--fix`` applies the fixes that are CrossTalk's own (stale
descriptors, loose permissions); harness settings are only ever reported.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import tomlkit

from crosstalk.cli.install import (
    SERVER,
    claude_config_dir,
    claude_config_file,
    codex_config_file,
)
from crosstalk.store.registry import Liveness, Registry


@dataclass(frozen=True)
class Finding:
    ok: bool
    what: str
    fix: str | None = None

    def line(self) -> str:
        head = "ok      " if self.ok else "PROBLEM "
        return head + self.what + (f"\n        fix: {self.fix}" if self.fix else "")


def _installed_claude(env: Mapping[str, str]) -> Finding:
    path = claude_config_file(env)
    try:
        data = json.loads(path.read_text())
        entry = data.get("mcpServers", {}).get(SERVER)
    except (OSError, ValueError, AttributeError):
        entry = None
    if not isinstance(entry, dict):
        return Finding(False, f"Claude Code: no '{SERVER}' MCP server in {path}",
                       "crosstalk install")
    command = entry.get("command")
    if not isinstance(command, str) or not os.access(command, os.X_OK):
        return Finding(False, f"Claude Code: the registered command {command!r} is not "
                       "executable", "crosstalk install")
    return Finding(True, f"Claude Code: registered in {path} ({command})")


def _installed_codex(env: Mapping[str, str]) -> Finding:
    path = codex_config_file(env)
    try:
        doc = tomlkit.parse(path.read_text())
        entry = doc.get("mcp_servers", {}).get(SERVER)
    except (OSError, tomlkit.exceptions.TOMLKitError, AttributeError):
        entry = None
    if entry is None:
        return Finding(False, f"Codex: no [mcp_servers.{SERVER}] in {path}", "crosstalk install")
    forwarded = entry.get("env_vars") or []
    if "CROSSTALK_HOME" not in forwarded or "CODEX_HOME" not in forwarded:
        return Finding(False, "Codex: the entry does not forward CODEX_HOME and CROSSTALK_HOME "
                       "(env_vars): Codex filters the MCP server's environment",
                       "crosstalk install")
    return Finding(True, f"Codex: registered in {path} ({entry.get('command')})")


def _skill(env: Mapping[str, str]) -> Finding:
    path = claude_config_dir(env) / "skills" / "crosstalk" / "SKILL.md"
    if path.is_file():
        return Finding(True, f"skill: {path}")
    return Finding(False, f"skill: not installed at {path}", "crosstalk install")


def _claude_gate(env: Mapping[str, str]) -> Finding:
    if env.get("CLAUDE_CODE_HARBOR_KITE", "").strip() in ("0", "false"):
        return Finding(False, "Claude Code: cross-session messaging is off "
                       "(CLAUDE_CODE_HARBOR_KITE=0): sessions have no inbox",
                       "unset CLAUDE_CODE_HARBOR_KITE")
    if env.get("CLAUDE_CODE_SIMPLE", "").strip() in ("1", "true"):
        return Finding(False, "Claude Code: CLAUDE_CODE_SIMPLE (--bare) sessions have no inbox",
                       "unset CLAUDE_CODE_SIMPLE")
    return Finding(True, "Claude Code: cross-session messaging gate is on (default)")


def _claude_sessions(env: Mapping[str, str]) -> list[Finding]:
    from crosstalk.harness.claude.registry import discover

    found = []
    for s in discover(env):
        version = s.version or "?"
        if s.messaging_socket_path is None:
            found.append(Finding(False, f"Claude session {s.name or s.pid} ({version}) has no "
                                 "inbox socket", "start it without --bare / CLAUDE_CODE_SIMPLE"))
        else:
            found.append(Finding(True, f"Claude session {s.name or s.pid}: version {version}, "
                                 f"status {s.status}"))
    return found


def _codex_server(env: Mapping[str, str]) -> Finding:
    from crosstalk.harness.codex import control_socket
    from crosstalk.harness.codex.appserver import AppServer, AppServerError

    path = control_socket(env)
    if not os.path.exists(path):
        return Finding(False, f"Codex: no shared app-server at {path}: threads of `codex exec` "
                       "or `--no-daemon` sessions cannot be reached live",
                       "start Codex normally (its TUI starts the server), or "
                       "`codex app-server --listen unix://`")

    async def probe() -> str:
        async with AppServer(path, timeout=3.0) as server:
            return str(server.info.get("userAgent", "?"))

    try:
        agent = asyncio.run(probe())
    except AppServerError as exc:
        return Finding(False, f"Codex: the app-server at {path} does not answer ({exc})",
                       "restart Codex")
    return Finding(True, f"Codex: shared app-server running ({agent})")


def _state(home: Path, fix: bool) -> list[Finding]:
    found = []
    loose = []
    for path in [home, home / "agents", home / "journal", home / "credentials"]:
        if path.exists() and stat.S_IMODE(path.stat().st_mode) & 0o077:
            loose.append(path)
    for path in list((home / "credentials").glob("*.token")):
        if stat.S_IMODE(path.stat().st_mode) & 0o077:
            loose.append(path)
    if loose and fix:
        for path in loose:
            path.chmod(0o700 if path.is_dir() else 0o600)
        found.append(Finding(True, f"permissions tightened on {len(loose)} paths"))
    elif loose:
        found.append(Finding(False, "state readable by others: " + ", ".join(map(str, loose)),
                             "crosstalk doctor --fix"))
    else:
        found.append(Finding(True, f"state directory {home} is private"))
    registry = Registry(home) if fix else Registry.reader(home)
    listed, unreadable = registry.scan()
    stale = [i.descriptor for i in listed if i.liveness is Liveness.STALE]
    if stale and fix:
        removed = registry.sweep_stale()
        found.append(Finding(True, f"removed {len(removed)} stale descriptors"))
    elif stale:
        names = ", ".join(f"{d.name} (pid {d.pid})" for d in stale)
        found.append(Finding(False, f"stale descriptors of agents whose shim is gone: {names}",
                             "crosstalk doctor --fix"))
    for bad in unreadable:
        found.append(Finding(False, f"unreadable descriptor {bad.path}: {bad.reason}",
                             f"rm {bad.path}"))
    live = [i.descriptor for i in listed if i.liveness is Liveness.LIVE]
    found.append(Finding(True, f"{len(live)} live CrossTalk agents"))
    return found


def diagnose(home: Path, env: Mapping[str, str], *, fix: bool = False) -> list[Finding]:
    findings = [_installed_claude(env), _installed_codex(env), _skill(env), _claude_gate(env)]
    findings += _claude_sessions(env)
    findings.append(_codex_server(env))
    findings += _state(home, fix)
    return findings


def run_doctor(home: Path, *, fix: bool = False, env: Mapping[str, str] | None = None,
               out: IO[str] | None = None) -> int:
    out = out or sys.stdout
    findings = diagnose(home, os.environ if env is None else env, fix=fix)
    for finding in findings:
        print(finding.line(), file=out)
    problems = sum(not f.ok for f in findings)
    print(f"{problems} problem{'s' if problems != 1 else ''}", file=out)
    return 1 if problems else 0
