"""Reading a Claude sender's permission mode for the envelope's ``from-mode`` (ADR 0020)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from crosstalk.harness.claude.mode import (
    cmdline_mode,
    process_argv,
    session_mode,
    settings_mode,
)


@pytest.mark.parametrize(("argv", "mode"), [
    (["claude"], None),
    (["claude", "--dangerously-skip-permissions"], "bypass"),
    (["claude", "--permission-mode", "bypassPermissions"], "bypass"),
    (["claude", "--permission-mode=bypassPermissions"], "bypass"),
    (["claude", "--permission-mode", "acceptEdits"], "prompting"),
    (["claude", "--permission-mode", "plan", "--name", "x"], "prompting"),
    (["claude", "--permission-mode"], None),  # no value: names nothing
])
def test_command_line(argv: list[str], mode: str | None) -> None:
    assert cmdline_mode(argv) == mode


def write(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_settings_later_files_win(tmp_path: Path) -> None:
    config, cwd = tmp_path / "config", tmp_path / "proj"
    assert settings_mode(config, str(cwd)) is None
    write(config / "settings.json", {"permissions": {"defaultMode": "bypassPermissions"}})
    assert settings_mode(config, str(cwd)) == "bypass"
    write(cwd / ".claude" / "settings.local.json", {"permissions": {"defaultMode": "default"}})
    assert settings_mode(config, str(cwd)) == "prompting"
    (cwd / ".claude" / "settings.local.json").write_text("{torn")
    assert settings_mode(config, str(cwd)) == "bypass"  # a broken file says nothing


def test_a_live_process_without_flags_falls_back_to_settings(tmp_path: Path) -> None:
    argv = process_argv(os.getpid())
    assert argv is not None
    assert argv
    assert cmdline_mode(argv) is None
    assert session_mode(os.getpid(), tmp_path, None) == "prompting"
    write(tmp_path / "settings.json", {"permissions": {"defaultMode": "bypassPermissions"}})
    assert session_mode(os.getpid(), tmp_path, None) == "bypass"
    assert process_argv(2**22 + 12345) is None
