"""A Claude session's permission mode class, as far as we can read it: for ``from-mode``.

Claude Code delivers a peer message only if the sender's mode class (``bypass`` for
bypassPermissions, else ``prompting``), as the envelope's ``from-mode`` says, equals the
receiver's; else it holds it for its user (research ``claude-code.md`` §5). Claude decides
that itself for every CrossTalk injection (ADR 0020); we only say, truthfully, what a verified
Claude *sender's* mode is, so a bypass sender is not held by a bypass receiver.

What we can read: the sender's process command line (``--dangerously-skip-permissions``,
``--permission-mode X``) and its settings files (``permissions.defaultMode``). A mode the
sender switched at run time (Shift+Tab) is invisible; the command line wins over settings, as
in Claude.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final, Literal

Mode = Literal["bypass", "prompting"]

BYPASS_MODE: Final = "bypassPermissions"
MAX_SETTINGS_BYTES: Final = 1 << 20


def cmdline_mode(argv: list[str]) -> Mode | None:
    """The mode a Claude command line asks for, or ``None`` if it names none."""
    found: Mode | None = None
    for i, arg in enumerate(argv):
        if arg == "--dangerously-skip-permissions":
            return "bypass"
        value: str | None = None
        if arg == "--permission-mode" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--permission-mode="):
            value = arg.split("=", 1)[1]
        if value is not None:
            found = "bypass" if value == BYPASS_MODE else "prompting"
    return found


def process_argv(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]


def _settings(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_SETTINGS_BYTES + 1)
        data = json.loads(raw) if len(raw) <= MAX_SETTINGS_BYTES else None
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def settings_files(config_dir: Path, cwd: str | None) -> list[Path]:
    """User settings, then the project's shared and local settings (later ones win)."""
    files = [config_dir / "settings.json"]
    if cwd:
        files += [Path(cwd) / ".claude" / "settings.json",
                  Path(cwd) / ".claude" / "settings.local.json"]
    return files


def settings_mode(config_dir: Path, cwd: str | None) -> Mode | None:
    mode: Mode | None = None
    for path in settings_files(config_dir, cwd):
        perms = _settings(path).get("permissions")
        value = perms.get("defaultMode") if isinstance(perms, dict) else None
        if isinstance(value, str):
            mode = "bypass" if value == BYPASS_MODE else "prompting"
    return mode


def session_mode(pid: int, config_dir: Path, cwd: str | None) -> Mode:
    """The session's mode class: its command line, else its settings, else prompting."""
    argv = process_argv(pid)
    return (cmdline_mode(argv) if argv else None) or settings_mode(config_dir, cwd) or (
        "prompting")
