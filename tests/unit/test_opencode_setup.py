"""opencode's part of ``crosstalk install`` / ``uninstall`` / ``doctor``, on throw-away dirs.

The config edit keeps the user's file byte for byte (add then remove gives the same bytes);
only CrossTalk's own tools are ever pre-allowed, and only where the user's rules withhold
them; doctor reads the files, a fake ``opencode`` on PATH, real records and a real socket.
"""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crosstalk.cli import install as install_cli
from crosstalk.harness.base import Session
from crosstalk.harness.opencode import jsonc, setup
from crosstalk.harness.plugin import ConfigEdit, ConfigError, Finding, HarnessPlugin, PlacedFile
from tests.unit.test_opencode_jsonc import GAPS, documents

COMMAND = ["/opt/venv/bin/crosstalk", "mcp"]
OTHER_TOOLS = ["bash", "edit", "read", "other_echo", "webfetch", "crosstalkish", "cross"]
ACTIONS = st.sampled_from(["allow", "ask", "deny"])
PERMISSION_KEYS = st.sampled_from(["*", "bash", "edit", "other_*", "cross*", "*_echo", "read",
                                   "c?osstalk_*", "webfetch"])


def with_(text: str | None) -> str:
    return setup.opencode_with(text, COMMAND)


# -- generated user configs ---------------------------------------------------------------------


permissions = st.one_of(
    ACTIONS,
    st.dictionaries(PERMISSION_KEYS, st.one_of(ACTIONS, st.dictionaries(
        st.sampled_from(["*", "ls *", "git *", "?"]), ACTIONS, min_size=1, max_size=3)),
        min_size=1, max_size=4))


@st.composite
def user_configs(draw: st.DrawFn) -> tuple[dict[str, Any], str]:
    """A user's config: their own keys (anything), maybe other MCP servers, maybe
    permissions, laid out with random gaps, comments and trailing commas."""
    members: list[tuple[str, Any, str]] = []
    for key in draw(st.lists(st.sampled_from(["model", "theme", "agent", "x", "$schema"]),
                             unique=True, max_size=3)):
        value, text = draw(documents)
        members.append((key, value, text))
    if draw(st.booleans()):
        servers = {n: {"type": "local", "command": [n]} for n in
                   draw(st.lists(st.sampled_from(["other", "git"]), min_size=1, unique=True))}
        members.append(("mcp", servers, json.dumps(servers, indent=draw(
            st.sampled_from([None, 2, 4])))))
    if draw(st.booleans()):
        permission = draw(permissions)
        if not (isinstance(permission, dict) and set(permission) == {"*"}):
            members.append(("permission", permission, json.dumps(permission, indent=draw(
                st.sampled_from([None, 2, "\t"])))))
    draw(st.randoms()).shuffle(members)
    parts = [f"{draw(st.sampled_from(GAPS))}{json.dumps(k)}: {text}" for k, _, text in members]
    trailing = "," if parts and draw(st.booleans()) else ""
    text = "{" + ",".join(parts) + trailing + draw(st.sampled_from(GAPS)) + "}\n"
    return {k: v for k, v, _ in members}, draw(st.sampled_from(["", "// mine\n"])) + text


@settings(max_examples=300)
@given(user_configs())
def test_install_then_uninstall_gives_back_the_users_bytes(config: tuple[dict[str, Any], str]
                                                           ) -> None:
    value, text = config
    added = with_(text)
    after = jsonc.parse(added).value
    assert after["mcp"]["crosstalk"] == setup.entry(COMMAND)
    assert {k: v for k, v in after["mcp"].items() if k != "crosstalk"} == value.get("mcp", {})
    assert {k: v for k, v in after.items() if k not in ("mcp", "permission")} == {
        k: v for k, v in value.items() if k not in ("mcp", "permission")}
    assert with_(added) == added  # a second install changes nothing
    assert setup.opencode_without(added) == text


@settings(max_examples=300)
@given(st.one_of(st.none(), permissions))
def test_only_crosstalks_tools_are_ever_allowed(permission: Any) -> None:
    text = json.dumps({"model": "m"} if permission is None else {"permission": permission},
                      indent=2)
    after = jsonc.parse(with_(text)).value.get("permission")
    for tool in OTHER_TOOLS:  # never weakened, never tightened
        assert setup.tool_action(after, tool) == setup.tool_action(permission, tool)
    for tool in setup.TOOLS:
        if setup.names_our_tools(permission):
            assert setup.tool_action(after, tool) == setup.tool_action(permission, tool)
        else:
            assert setup.tool_action(after, tool) == "allow"
    if not setup.withheld(permission):
        assert after == permission  # nothing to allow: the rules stay as they were


def test_a_fresh_config_is_what_opencode_would_write_plus_our_entry() -> None:
    data = json.loads(with_(None))
    assert data == {"$schema": setup.SCHEMA, "mcp": {"crosstalk": {
        "type": "local", "command": COMMAND, "environment": {"CROSSTALK_HARNESS": "opencode"},
        "enabled": True, "timeout": 180_000}}}
    assert with_("  \n") == with_(None)


def test_a_crlf_file_stays_crlf() -> None:
    text = '{\r\n  "theme": "dark",\r\n  "permission": "deny"\r\n}\r\n'
    added = with_(text)
    assert "\n" not in added.replace("\r\n", "")
    assert setup.opencode_without(added) == text


def test_the_users_rule_on_our_tools_is_kept() -> None:
    text = '{\n  "permission": {"*": "ask", "crosstalk_send_message": "deny"}\n}\n'
    after = jsonc.parse(with_(text)).value
    assert after["permission"] == {"*": "ask", "crosstalk_send_message": "deny"}


def test_a_restrictive_string_permission_becomes_the_same_rules_plus_ours() -> None:
    text = '{\n  "permission": "ask", // everything\n  "model": "m"\n}\n'
    added = with_(text)
    assert jsonc.parse(added).value["permission"] == {"*": "ask", "crosstalk_*": "allow"}
    assert "// everything" in added
    assert setup.opencode_without(added) == text


def test_uninstall_after_the_user_edited_removes_only_ours() -> None:
    added = with_('{\n  "mcp": {"other": {"type": "local", "command": ["o"]}}\n}\n')
    edited = added.replace('"command": ["o"]', '"command": ["o2"]  /* moved */')
    assert setup.opencode_without(edited) == (
        '{\n  "mcp": {"other": {"type": "local", "command": ["o2"]  /* moved */}}\n}\n')
    user_emptied = '{"mcp": {}}'
    assert setup.opencode_without(with_(user_emptied)) == user_emptied
    assert setup.opencode_without('{"a": 1}') == '{"a": 1}'


@pytest.mark.parametrize(("text", "why"), [
    ("[1, 2]", "top level is not an object"),
    ('{"mcp": "none"}', '"mcp" is not an object'),
    ('{"mcp": {"crosstalk": 1, "crosstalk": 2}}', "appears 2 times"),
    ('{"mcp": {}, "mcp": {}}', "appears 2 times"),
    ('{"model": "m",,}', "line 1, column 15"),
    ('{"permission": 3}', '"permission" is neither'),
    ('{"a": 1} // fine\n}', "text after"),
])
def test_a_file_that_cannot_be_edited_safely_says_why_and_gives_the_snippet(
        text: str, why: str) -> None:
    with pytest.raises(ConfigError) as info:
        setup.opencode_with(text, COMMAND, path=Path("/h/.config/opencode/opencode.json"))
    message = str(info.value)
    assert why in message
    assert message.startswith("/h/.config/opencode/opencode.json cannot be edited safely")
    assert json.loads(message.split("by hand:\n", 1)[1]) == {
        "mcp": {"crosstalk": setup.entry(COMMAND)}}
    with pytest.raises(ConfigError):
        setup.opencode_without("[")


# -- where the files are -----------------------------------------------------------------------


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin", **extra}


@pytest.mark.parametrize(("existing", "chosen"), [
    ((), "opencode.jsonc"), (("opencode.json",), "opencode.json"),
    (("config.json", "opencode.json"), "opencode.json"),
    (("opencode.json", "opencode.jsonc"), "opencode.jsonc"), (("config.json",), "config.json"),
])
def test_install_edits_the_file_opencode_writes(tmp_path: Path, existing: tuple[str, ...],
                                               chosen: str) -> None:
    env = env_for(tmp_path, XDG_CONFIG_HOME=str(tmp_path / "xdg"))
    directory = tmp_path / "xdg" / "opencode"
    directory.mkdir(parents=True)
    for name in existing:
        (directory / name).write_text("{}")
    edit, placed = setup.install_entries(env)
    assert isinstance(edit, ConfigEdit)
    assert edit.path == directory / chosen
    assert isinstance(placed, PlacedFile)
    assert placed.path == directory / "plugin" / "crosstalk.js"
    assert placed.content() == setup.PLUGIN_SOURCE.read_text()
    assert setup.config_dir(env_for(tmp_path)) == tmp_path / "home" / ".config" / "opencode"


@pytest.fixture
def opencode_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """``crosstalk install`` with opencode as its one harness (the real installer)."""
    plugin = HarnessPlugin(name="opencode", trust=15, identifier=lambda _ctx: None,
                           install=setup.install_entries, doctor=setup.doctor)
    monkeypatch.setattr(install_cli, "plugins", lambda: (plugin,))


def installer_run(tmp_path: Path, env: dict[str, str], *, uninstall: bool = False) -> int:
    return install_cli.run_install(tmp_path / "state", uninstall=uninstall, env=env,
                                   out=io.StringIO())


@pytest.mark.usefixtures("opencode_only")
def test_crosstalk_install_and_uninstall_through_the_installer(tmp_path: Path) -> None:
    env = env_for(tmp_path)
    directory = tmp_path / "home" / ".config" / "opencode"
    directory.mkdir(parents=True)
    user = '{\n  // keep me\n  "theme": "dark",\n  "permission": {"*": "ask"},\n}\n'
    (directory / "opencode.jsonc").write_text(user)
    assert installer_run(tmp_path, env) == 0
    config = jsonc.parse((directory / "opencode.jsonc").read_text()).value
    assert config["mcp"]["crosstalk"]["command"][-1] == "mcp"
    assert config["permission"] == {"*": "ask", "crosstalk_*": "allow"}
    assert (directory / "plugin" / "crosstalk.js").read_bytes() == \
        setup.PLUGIN_SOURCE.read_bytes()
    # opencode adds "$schema" to a file without one when it loads it: not untouched any more
    text = (directory / "opencode.jsonc").read_text()
    (directory / "opencode.jsonc").write_text(
        text.replace("{", '{\n  "$schema": "https://opencode.ai/config.json",', 1))
    assert installer_run(tmp_path, env, uninstall=True) == 0
    assert (directory / "opencode.jsonc").read_text() == user.replace(
        "{", '{\n  "$schema": "https://opencode.ai/config.json",', 1)
    assert not (directory / "plugin").exists()  # install made it, uninstall takes it


@pytest.mark.usefixtures("opencode_only")
def test_an_unreadable_config_fails_install_and_writes_nothing(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]
                                                               ) -> None:
    env = env_for(tmp_path)
    directory = tmp_path / "home" / ".config" / "opencode"
    directory.mkdir(parents=True)
    (directory / "opencode.json").write_text('{"mcp": [1]}')
    assert installer_run(tmp_path, env) == 1
    err = capsys.readouterr().err
    assert '"mcp" is not an object' in err
    assert '"crosstalk": {' in err
    assert (directory / "opencode.json").read_text() == '{"mcp": [1]}'
    assert not (directory / "plugin").exists()


@pytest.mark.usefixtures("opencode_only")
def test_a_config_that_is_not_utf8_fails_install_with_a_reason(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = env_for(tmp_path)
    directory = tmp_path / "home" / ".config" / "opencode"
    directory.mkdir(parents=True)
    (directory / "opencode.json").write_bytes(b'{"theme": "\xff"}')
    assert installer_run(tmp_path, env) == 1
    assert "is not UTF-8 (invalid start byte at byte 11)" in capsys.readouterr().err
    assert (directory / "opencode.json").read_bytes() == b'{"theme": "\xff"}'
    found = setup.doctor({**env, "CROSSTALK_HOME": str(tmp_path / "state")})
    assert found[0].fix == f"repair {directory / 'opencode.json'} (UTF-8 JSONC), then " \
        "crosstalk install"


# -- doctor ------------------------------------------------------------------------------------


def problems(found: list[Finding]) -> list[str]:
    return [f.what for f in found if not f.ok]


def installed(tmp_path: Path, env: dict[str, str], text: str | None = None) -> Path:
    directory = setup.config_dir(env)
    directory.mkdir(parents=True, exist_ok=True)
    path = setup.config_file(env)
    path.write_text(setup.opencode_with(text, [sys.executable, "-m", "crosstalk", "mcp"]))
    setup.plugin_path(env).parent.mkdir(exist_ok=True)
    shutil.copy(setup.PLUGIN_SOURCE, setup.plugin_path(env))
    return path


def test_doctor_on_a_machine_without_opencode_says_how_to_install(tmp_path: Path) -> None:
    env = env_for(tmp_path, CROSSTALK_HOME=str(tmp_path / "state"))
    found = setup.doctor(env)
    assert any("no opencode config" in p for p in problems(found))
    assert any("plugin is not at" in p for p in problems(found))
    assert all(f.fix for f in found if not f.ok)


def test_doctor_after_install_is_clean_and_names_the_version(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "opencode"
    fake.write_text("#!/bin/sh\necho 1.18.33\n")
    fake.chmod(0o755)
    env = env_for(tmp_path, PATH=f"{bindir}:/usr/bin:/bin",
                  CROSSTALK_HOME=str(tmp_path / "state"))
    installed(tmp_path, env)
    found = setup.doctor(env)
    assert problems(found) == []
    assert any(f.what == "opencode: version 1.18.33" for f in found)
    fake.write_text("#!/bin/sh\necho 1.19.0\n")
    assert any("1.19.0 (CrossTalk was tested with 1.18.33)" in f.what
               for f in setup.doctor(env))


def test_doctor_finds_an_outdated_plugin_a_disabled_entry_and_withheld_tools(
        tmp_path: Path) -> None:
    env = env_for(tmp_path, CROSSTALK_HOME=str(tmp_path / "state"))
    path = installed(tmp_path, env)
    setup.plugin_path(env).write_text("// an older CrossTalk\n")
    config = json.loads(path.read_text())
    config["permission"] = {"*": "deny"}
    path.write_text(json.dumps(config))
    found = problems(setup.doctor(env))
    assert any("is not this CrossTalk's plugin" in p for p in found)
    assert any("permission withholds crosstalk_list_agents" in p for p in found)
    config["mcp"]["crosstalk"]["enabled"] = False
    path.write_text(json.dumps(config))
    assert any("is disabled" in p for p in problems(setup.doctor(env)))
    path.write_text('{"mcp": {"crosstalk": {"type": "local", "command": ["/no/such"]}}}')
    assert any("is not an executable local server" in p for p in problems(setup.doctor(env)))
    path.write_text("{ not json")
    assert any("cannot read" in p for p in problems(setup.doctor(env)))


def test_doctor_names_a_running_opencode_that_publishes_nothing(tmp_path: Path) -> None:
    env = env_for(tmp_path, CROSSTALK_HOME=str(tmp_path / "state"))
    installed(tmp_path, env)
    fake = tmp_path / "opencode"  # real processes whose executable is called opencode
    shutil.copy(shutil.which("tail") or "/usr/bin/tail", fake)
    # `tail -F <name>` waits for a file of that name: argv[1:] is what an opencode would get
    child_env = {**env, "CROSSTALK_HOME": str(tmp_path / "state")}
    proc = subprocess.Popen([str(fake), "-F", str(tmp_path / "tui")], stderr=subprocess.DEVNULL,
                            env=child_env)
    one_shot = subprocess.Popen([str(fake), "-F", "session"], cwd=tmp_path,
                                stderr=subprocess.DEVNULL, env=child_env)
    elsewhere = subprocess.Popen([str(fake), "-F", str(tmp_path / "tui2")],
                                 stderr=subprocess.DEVNULL,
                                 env={**env, "CROSSTALK_HOME": str(tmp_path / "other")})
    try:
        found = setup.doctor(env)
    finally:
        for p in (proc, one_shot, elsewhere):
            p.kill()
            p.wait()
    lines = [f for f in found if str(proc.pid) in f.what]
    assert len(lines) == 1
    assert not lines[0].ok
    assert "publishes no CrossTalk instance" in lines[0].what
    assert lines[0].fix == f"restart that opencode (pid {proc.pid})"
    assert not any(str(one_shot.pid) in f.what for f in found)
    assert not any(str(elsewhere.pid) in f.what for f in found)  # another CrossTalk setup


def test_why_unreachable_says_why() -> None:
    session = Session(harness="opencode", session_ref="ses_1", name="a", cwd="/w",
                      status="unknown", reachable=False)
    assert "publishes no CrossTalk socket" in (setup.why_unreachable(session) or "")
    detailed = dataclasses.replace(session, detail="socket refused")
    assert setup.why_unreachable(detailed) == (
        "its opencode instance cannot be reached: socket refused")
