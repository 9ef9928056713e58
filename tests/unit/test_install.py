"""``crosstalk install`` / ``uninstall`` on a throw-away HOME: both harness configs edited,
the user's own content kept, uninstall byte-identical when nothing else changed."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import tomlkit

from crosstalk.cli.install import Installer, run_install
from crosstalk.harness.codex.setup import CODEX_ENV_VARS

USER_TOML = """# my codex config
model = "o4"  # keep this comment

[mcp_servers.other]
command = "other-server"
"""
USER_JSON = json.dumps({"numStartups": 3, "mcpServers": {"other": {"command": "x"}},
                        "projects": {"/w": {"hasTrustDialogAccepted": True}}}, indent=2)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"HOME": str(tmp_path / "home"), "PATH": "/usr/bin"}


def run(tmp_path: Path, env: dict[str, str], *args: str) -> str:
    out = io.StringIO()
    code = run_install(tmp_path / "state", uninstall="uninstall" in args,
                       dry_run="--dry-run" in args, env=env, out=out)
    assert code == 0
    return out.getvalue()


def test_fresh_install_then_uninstall_leaves_nothing(tmp_path: Path,
                                                     env: dict[str, str]) -> None:
    home = Path(env["HOME"])
    out = run(tmp_path, env)
    # Claude's entry and skill, Codex's entry, opencode's entry and plugin.
    assert out.count("create: ") == 5
    assert "registered with claude, codex, opencode;" in out
    claude = json.loads((home / ".claude.json").read_text())
    entry = claude["mcpServers"]["crosstalk"]
    assert entry["type"] == "stdio"
    assert Path(entry["command"]).is_absolute()
    assert entry["args"][-1] == "mcp"
    codex = tomlkit.parse((home / ".codex" / "config.toml").read_text())
    assert codex["mcp_servers"]["crosstalk"]["env_vars"] == CODEX_ENV_VARS
    assert codex["mcp_servers"]["crosstalk"]["command"] == entry["command"]
    skill = home / ".claude" / "skills" / "crosstalk" / "SKILL.md"
    assert "reply" in skill.read_text()
    assert len(skill.read_text().splitlines()) < 60
    assert run(tmp_path, env).count("unchanged: ") == 5  # idempotent
    run(tmp_path, env, "uninstall")
    assert not (home / ".claude.json").exists()
    assert not (home / ".codex" / "config.toml").exists()
    assert not skill.exists()
    assert not (home / ".claude").exists()  # the directories install made go too
    assert not (home / ".codex").exists()
    assert not home.exists()


def test_user_files_come_back_byte_identical(tmp_path: Path, env: dict[str, str]) -> None:
    home = Path(env["HOME"])
    (home / ".codex").mkdir(parents=True)
    (home / ".codex" / "config.toml").write_text(USER_TOML)
    (home / ".claude.json").write_text(USER_JSON)
    run(tmp_path, env)
    toml_text = (home / ".codex" / "config.toml").read_text()
    assert toml_text.startswith(USER_TOML)  # comments and order kept, our table appended
    assert "[mcp_servers.crosstalk]" in toml_text
    assert json.loads((home / ".claude.json").read_text())["mcpServers"]["other"] == {
        "command": "x"}
    run(tmp_path, env)  # twice: still the one entry, the first "before" kept
    run(tmp_path, env, "uninstall")
    assert (home / ".codex" / "config.toml").read_text() == USER_TOML
    assert (home / ".claude.json").read_text() == USER_JSON


def test_uninstall_after_the_harness_changed_its_file_removes_only_ours(
        tmp_path: Path, env: dict[str, str]) -> None:
    home = Path(env["HOME"])
    (home).mkdir(parents=True)
    (home / ".claude.json").write_text(USER_JSON)
    run(tmp_path, env)
    data = json.loads((home / ".claude.json").read_text())
    data["numStartups"] = 4  # Claude rewrote its config meanwhile
    (home / ".claude.json").write_text(json.dumps(data, indent=2))
    run(tmp_path, env, "uninstall")
    after = json.loads((home / ".claude.json").read_text())
    assert after["numStartups"] == 4
    assert after["mcpServers"] == {"other": {"command": "x"}}


def test_dry_run_shows_the_diff_and_writes_nothing(tmp_path: Path,
                                                   env: dict[str, str]) -> None:
    out = run(tmp_path, env, "--dry-run")
    assert "+[mcp_servers.crosstalk]" in out
    assert '+    "crosstalk": {' in out
    assert not Path(env["HOME"]).exists()
    assert not (tmp_path / "state" / "install").exists()


def test_config_dirs_from_the_environment_are_honoured(tmp_path: Path,
                                                       env: dict[str, str]) -> None:
    env = {**env, "CLAUDE_CONFIG_DIR": str(tmp_path / "cc"), "CODEX_HOME": str(tmp_path / "cx")}
    run(tmp_path, env)
    assert (tmp_path / "cc" / ".claude.json").exists()
    assert (tmp_path / "cc" / "skills" / "crosstalk" / "SKILL.md").exists()
    assert (tmp_path / "cx" / "config.toml").exists()
    assert not (Path(env["HOME"]) / ".claude.json").exists()
    targets = Installer(tmp_path / "state", env).targets()
    assert targets["codex"] == tmp_path / "cx" / "config.toml"


def test_the_plugin_skill_is_the_packaged_skill() -> None:
    """``plugins/crosstalk`` (the Claude plugin) and the package install the same skill."""
    from crosstalk.harness.claude.setup import SKILL_SOURCE

    repo = Path(__file__).resolve().parents[2]
    plugin = repo / "plugins" / "crosstalk"
    assert (plugin / "skills" / "crosstalk" / "SKILL.md").read_text() == SKILL_SOURCE.read_text()
    manifest = json.loads((plugin / ".claude-plugin" / "plugin.json").read_text())
    assert manifest["name"] == "crosstalk"
    text = SKILL_SOURCE.read_text()
    assert text.startswith("---\nname: crosstalk\n")
    for tool in ("list_agents", "send_message", "ask", "reply", "receive_message", "claim",
                 "release"):
        assert f"`{tool}`" in text


@pytest.mark.parametrize(("name", "content"), [
    (".claude.json", "{torn"),
    (".claude.json", "[1, 2]"),
    (".codex/config.toml", "[mcp_servers\nbroken = "),
])
def test_a_config_we_cannot_read_is_an_error_and_nothing_is_written(
        tmp_path: Path, env: dict[str, str], name: str, content: str) -> None:
    home = Path(env["HOME"])
    (home / ".codex").mkdir(parents=True)
    (home / name).write_text(content)
    err = io.StringIO()
    import contextlib

    with contextlib.redirect_stderr(err):
        code = run_install(tmp_path / "state", env=env, out=io.StringIO())
    assert code == 1
    assert "cannot read" in err.getvalue() or "not a JSON object" in err.getvalue()
    assert (home / name).read_text() == content
    assert not (home / ".claude" / "skills").exists()
    assert not (tmp_path / "state" / "install").exists()
