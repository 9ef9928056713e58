"""What Claude Code contributes to ``crosstalk install`` and ``doctor``, and where its files are.

Install: a user-scope MCP server, the top-level ``mcpServers.crosstalk`` of Claude's global
config (``$CLAUDE_CONFIG_DIR/.claude.json``, else ``~/.claude.json``), plus the CrossTalk skill
under ``<config dir>/skills/crosstalk/``. Doctor: that entry and the skill, the
cross-session messaging gate, and every live session's inbox.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from crosstalk.harness.base import Session
from crosstalk.harness.plugin import SERVER, ConfigEdit, ConfigError, Finding, PlacedFile

#: The skill the package ships (``plugins/crosstalk`` carries the same file).
SKILL_SOURCE = Path(__file__).resolve().parents[2] / "skill" / "SKILL.md"


def _home(env: Mapping[str, str]) -> Path:
    return Path(env.get("HOME") or str(Path.home()))


def claude_config_file(env: Mapping[str, str]) -> Path:
    configured = env.get("CLAUDE_CONFIG_DIR")
    return Path(configured) / ".claude.json" if configured else _home(env) / ".claude.json"


def claude_config_dir(env: Mapping[str, str]) -> Path:
    configured = env.get("CLAUDE_CONFIG_DIR")
    return Path(configured) if configured else _home(env) / ".claude"


def skill_path(env: Mapping[str, str]) -> Path:
    return claude_config_dir(env) / "skills" / "crosstalk" / "SKILL.md"


def claude_socket_dir(env: Mapping[str, str] | None = None) -> Path:
    """The directory Claude Code binds its inboxes in: ``<runtime dir>/cc-socks``.

    Claude uses ``$XDG_RUNTIME_DIR``, else ``$CLAUDE_CODE_TMPDIR``, else the OS temp dir. An
    agent's uds ingress lives here when it can: Claude vets receipt and native-reply addresses
    as a basename of 1-16 hex digits in a default cc-socks directory (design doc §4.4).
    """
    env = os.environ if env is None else env
    base = env.get("XDG_RUNTIME_DIR") or env.get("CLAUDE_CODE_TMPDIR") or tempfile.gettempdir()
    return Path(base) / "cc-socks"


# -- the edits (pure: text in, text out) ---------------------------------------------------------


def claude_with(text: str | None, command: list[str]) -> str:
    data: dict[str, Any] = json.loads(text) if text and text.strip() else {}
    if not isinstance(data, dict):
        raise ConfigError("the Claude Code config is not a JSON object")
    servers = data.setdefault("mcpServers", {})
    if not isinstance(servers, dict):
        raise ConfigError("mcpServers in the Claude Code config is not an object")
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


def install_entries(env: Mapping[str, str]) -> list[ConfigEdit | PlacedFile]:
    return [ConfigEdit("claude", claude_config_file(env), claude_with, claude_without),
            PlacedFile(skill_path(env), lambda: SKILL_SOURCE.read_text(encoding="utf-8"))]


# -- doctor ----------------------------------------------------------------------------------------


def _installed(env: Mapping[str, str]) -> Finding:
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


def _skill(env: Mapping[str, str]) -> Finding:
    path = skill_path(env)
    if path.is_file():
        return Finding(True, f"skill: {path}")
    return Finding(False, f"skill: not installed at {path}", "crosstalk install")


def _gate(env: Mapping[str, str]) -> Finding:
    if env.get("CLAUDE_CODE_HARBOR_KITE", "").strip() in ("0", "false"):
        return Finding(False, "Claude Code: cross-session messaging is off "
                       "(CLAUDE_CODE_HARBOR_KITE=0): sessions have no inbox",
                       "unset CLAUDE_CODE_HARBOR_KITE")
    if env.get("CLAUDE_CODE_SIMPLE", "").strip() in ("1", "true"):
        return Finding(False, "Claude Code: CLAUDE_CODE_SIMPLE (--bare) sessions have no inbox",
                       "unset CLAUDE_CODE_SIMPLE")
    return Finding(True, "Claude Code: cross-session messaging gate is on (default)")


def _sessions(env: Mapping[str, str]) -> list[Finding]:
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


def doctor(env: Mapping[str, str]) -> list[Finding]:
    return [_installed(env), _skill(env), _gate(env), *_sessions(env)]


#: What Claude's own answers to a held or refused message mean, for the sending model
#: (its receipts; ADR 0007, 0018).
SEND_HINTS = {
    "receipt_denied": (
        "that session's user declined the message in Claude's hold dialog; it was not "
        "delivered"),
    "receipt_expired": (
        "that session held the message for its user, who did not decide in time; it was not "
        "delivered"),
    "receipt_refused": (
        "that Claude session refuses messages from other sessions (its crossSessionInbound "
        "setting is refuse); nothing was delivered"),
}


def why_unreachable(session: Session) -> str | None:
    return "its inbox socket is missing (the session runs without messaging?)"
