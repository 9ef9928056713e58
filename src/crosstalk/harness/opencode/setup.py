"""What opencode contributes to ``crosstalk install`` and ``doctor``, and where its files are.

opencode's global config dir is ``$XDG_CONFIG_HOME/opencode`` (else ``~/.config/opencode``).
Install writes two things there:

* the MCP server, ``mcp.crosstalk`` in the global config file, which opencode reads as JSONC
  and merges from ``config.json``, ``opencode.json`` and ``opencode.jsonc``; we edit the file
  opencode itself writes to (the first of ``opencode.jsonc``, ``opencode.json``,
  ``config.json`` that exists, else a new ``opencode.jsonc``, as opencode would create), by
  splicing text (:mod:`.jsonc`) so every other key, comment and layout stays;
* the plugin, ``plugin/crosstalk.js`` (opencode loads every file there), which publishes each
  instance's record and socket and stamps the calling session into our tools' arguments.

Permissions: only CrossTalk's own tools may be pre-allowed, and only where the user's
``permission`` would ask or deny them (by opencode's rule: the last matching rule wins, over
a default of allow); then ``"crosstalk_*": "allow"`` goes at the end of it. A rule of the
user's that names our tools (a key starting ``crosstalk``) is their decision and stays in
force; nothing else in ``permission`` is touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from crosstalk.harness.base import Session
from crosstalk.harness.opencode import jsonc
from crosstalk.harness.opencode.discovery import DISCOVERY_TIMEOUT, instance_sessions
from crosstalk.harness.opencode.http import OpencodeError
from crosstalk.harness.opencode.records import InstanceRecord, scan
from crosstalk.harness.plugin import SERVER, ConfigEdit, ConfigError, Finding, PlacedFile

SCHEMA = "https://opencode.ai/config.json"
#: The plugin the package ships.
PLUGIN_SOURCE = Path(__file__).resolve().with_name("crosstalk.js")
#: The opencode release this adapter was built and tested against (research, live suite).
TESTED_VERSION = "1.18.33"
#: CrossTalk's tools (a contract, ARCHITECTURE §5), as opencode names them: ``crosstalk_<tool>``.
TOOLS = tuple(f"{SERVER}_{t}" for t in ("list_agents", "send_message", "ask", "reply",
                                        "receive_message", "claim", "release"))
ALLOW_KEY = f"{SERVER}_*"
#: MCP calls time out after the entry's ``timeout`` (ms; opencode's default is the MCP SDK's
#: 60 s); ``send_message`` may wait up to 150 s for a delivery outcome (config.DELIVERY_TIMEOUT).
TOOL_TIMEOUT_MS = 180_000


def config_dir(env: Mapping[str, str]) -> Path:
    base = env.get("XDG_CONFIG_HOME") or os.path.join(env.get("HOME") or str(Path.home()),
                                                      ".config")
    return Path(base) / "opencode"


def config_file(env: Mapping[str, str]) -> Path:
    """The global config file opencode writes to (and so install edits)."""
    directory = config_dir(env)
    for name in ("opencode.jsonc", "opencode.json", "config.json"):
        if (directory / name).is_file():
            return directory / name
    return directory / "opencode.jsonc"


def plugin_path(env: Mapping[str, str]) -> Path:
    return config_dir(env) / "plugin" / "crosstalk.js"


def entry(command: list[str]) -> dict[str, Any]:
    """The ``mcp.crosstalk`` entry: a local server started per opencode instance."""
    return {"type": "local", "command": command,
            "environment": {"CROSSTALK_HARNESS": "opencode"}, "enabled": True,
            "timeout": TOOL_TIMEOUT_MS}


# -- permissions (opencode's evaluation, for the tools' permission checks) ---------------------


def _wildcard(name: str, pattern: str) -> bool:
    """opencode's ``Wildcard.match``: ``*`` any text, ``?`` one character, anchored."""
    rx = re.escape(pattern).replace(r"\*", ".*").replace(r"\?", ".")
    return re.fullmatch(rx, name, re.S) is not None


def tool_action(permission: Any, tool: str) -> str:
    """What ``permission`` (a config's value) says for calling ``tool``: allow, ask or deny.

    An MCP tool asks with the tool's name and the pattern ``*``; rules are evaluated in
    order, the last match wins, and the default (the build agent's ``"*": "allow"``) allows."""
    if isinstance(permission, str):
        permission = {"*": permission}
    action = "allow"
    for key, rule in (permission.items() if isinstance(permission, dict) else ()):
        if not _wildcard(tool, key):
            continue
        if isinstance(rule, str):
            action = rule
        elif isinstance(rule, dict):
            for pattern, value in rule.items():
                if _wildcard("*", pattern) and isinstance(value, str):
                    action = value
    return action


def names_our_tools(permission: Any) -> bool:
    return isinstance(permission, dict) and any(k.startswith(SERVER) for k in permission)


def withheld(permission: Any) -> list[str]:
    """Our tools that ``permission`` asks for or denies."""
    return [t for t in TOOLS if tool_action(permission, t) != "allow"]


# -- the edits (pure: text in, text out) ----------------------------------------------------


def snippet(command: list[str]) -> str:
    return json.dumps({"mcp": {SERVER: entry(command)}}, indent=2)


def opencode_with(text: str | None, command: list[str], *, path: Path | None = None) -> str:
    """``text`` (a config file, ``None`` if there is none) with CrossTalk registered."""
    if text is None or not text.strip():
        return json.dumps({"$schema": SCHEMA, "mcp": {SERVER: entry(command)}}, indent=2) + "\n"

    def refuse(why: str) -> ConfigError:
        where = str(path) if path else "the opencode config"
        return ConfigError(f"{where} cannot be edited safely ({why}); add CrossTalk to it by "
                           f"hand:\n{snippet(command)}")

    try:
        root = jsonc.parse(text)
        if not isinstance(root, jsonc.Obj):
            raise refuse("its top level is not an object")
        unit = jsonc.indent_unit(text, root)
        mcp = root.get("mcp")
        if mcp is None:
            text = jsonc.insert_member(text, root, "mcp", {SERVER: entry(command)}, unit)
        elif not isinstance(mcp.value, jsonc.Obj):
            raise refuse('its "mcp" is not an object')
        else:
            ours = mcp.value.get(SERVER)
            if ours is None:
                text = jsonc.insert_member(text, mcp.value, SERVER, entry(command), unit)
            else:
                indent, _ = jsonc.member_indent(text, mcp.value, unit)
                text = jsonc.replace_value(text, ours.value, entry(command), indent, unit)
        return _allowed(text)
    except jsonc.JsoncError as exc:
        raise refuse(str(exc)) from None


def _allowed(text: str) -> str:
    """``text`` with ``crosstalk_*`` allowed if its ``permission`` would withhold our tools."""
    root = jsonc.parse(text)
    assert isinstance(root, jsonc.Obj)
    member = root.get("permission")
    if member is None:  # no rules: everything is allowed
        return text
    permission = member.value.value
    if not isinstance(permission, str | dict):
        raise jsonc.JsoncError('its "permission" is neither a string nor an object')
    if names_our_tools(permission) or not withheld(permission):
        return text
    unit = jsonc.indent_unit(text, root)
    if isinstance(member.value, jsonc.Obj):
        return jsonc.insert_member(text, member.value, ALLOW_KEY, "allow", unit)
    # A string: "ask" means {"*": "ask"}; the same rule, and ours after it.
    indent, _ = jsonc.member_indent(text, root, unit)
    return jsonc.replace_value(text, member.value, _expanded(str(permission)), indent, unit)


def _expanded(action: str) -> dict[str, str]:
    return {"*": action, ALLOW_KEY: "allow"}


def opencode_without(text: str) -> str:
    """``text`` without what :func:`opencode_with` added (an ``mcp`` that holds nothing but
    our entry, laid out as install writes it, goes as a whole)."""
    try:
        root = jsonc.parse(text)
        if not isinstance(root, jsonc.Obj):
            return text
        unit = jsonc.indent_unit(text, root)
        indent, _ = jsonc.member_indent(text, root, unit)
        permission = root.get("permission")
        if permission is not None:
            text = _without_allow(text, root, permission, indent, unit)
            root = jsonc.parse(text)
            assert isinstance(root, jsonc.Obj)
        mcp = root.get("mcp")
        if mcp is None or not isinstance(mcp.value, jsonc.Obj):
            return text
        ours = mcp.value.get(SERVER)
        if ours is None:
            return text
        alone = jsonc.render({SERVER: ours.value.value}, indent, unit, jsonc.newline_of(text))
        if text[mcp.value.start:mcp.value.end] == alone:
            return jsonc.remove_member(text, root, "mcp")
        return jsonc.remove_member(text, mcp.value, SERVER)
    except jsonc.JsoncError as exc:
        raise ConfigError(f"the opencode config cannot be edited safely ({exc}); remove "
                          f'"{SERVER}" from its "mcp" by hand') from None


def _without_allow(text: str, root: jsonc.Obj, member: jsonc.Member, indent: str | None,
                   unit: str) -> str:
    node = member.value
    if not isinstance(node, jsonc.Obj) or node.value.get(ALLOW_KEY) != "allow":
        return text
    action = node.value.get("*")
    if isinstance(action, str) and text[node.start:node.end] == jsonc.render(
            _expanded(action), indent, unit, jsonc.newline_of(text)):
        return jsonc.replace_value(text, node, action, None, unit)
    return jsonc.remove_member(text, node, ALLOW_KEY)


def install_entries(env: Mapping[str, str]) -> list[ConfigEdit | PlacedFile]:
    path = config_file(env)

    def add(text: str | None, command: list[str]) -> str:
        return opencode_with(text, command, path=path)

    return [ConfigEdit("opencode", path, add, opencode_without),
            PlacedFile(plugin_path(env), lambda: PLUGIN_SOURCE.read_text(encoding="utf-8"))]


# -- doctor ------------------------------------------------------------------------------------


def _read_config(path: Path) -> tuple[Any, str | None]:
    """(the parsed config, or ``None``; why it could not be read)."""
    try:
        return jsonc.parse(path.read_text(encoding="utf-8")).value, None
    except FileNotFoundError:
        return None, f"no opencode config at {path}"
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return None, f"cannot read {path}: {exc}"


def _installed(env: Mapping[str, str]) -> list[Finding]:
    path = config_file(env)
    config, why = _read_config(path)
    if why is not None:
        fix = "crosstalk install" if config is None and not path.exists() else (
            f"repair {path} (UTF-8 JSONC), then crosstalk install")
        return [Finding(False, f"opencode: {why}", fix)]
    mcp = config.get("mcp") if isinstance(config, dict) else None
    ours = mcp.get(SERVER) if isinstance(mcp, dict) else None
    if not isinstance(ours, dict):
        return [Finding(False, f"opencode: no mcp.{SERVER} in {path}", "crosstalk install")]
    command = ours.get("command")
    program = command[0] if isinstance(command, list) and command else None
    if ours.get("type") != "local" or not isinstance(program, str) or not (
            shutil.which(program, path=env.get("PATH")) or os.access(program, os.X_OK)):
        return [Finding(False, f"opencode: the mcp.{SERVER} command {command!r} is not an "
                        "executable local server", "crosstalk install")]
    if ours.get("enabled") is False:
        return [Finding(False, f"opencode: mcp.{SERVER} is disabled in {path}",
                        'set "enabled": true, or crosstalk install')]
    shown = " ".join(str(part) for part in command or [])
    found = [Finding(True, f"opencode: registered in {path} ({shown})")]
    permission = config.get("permission")
    asked = withheld(permission)
    if asked and names_our_tools(permission):
        found.append(Finding(True, f"opencode: your permission rules withhold {', '.join(asked)}"
                             " (kept: they name CrossTalk's tools)"))
    elif asked:
        found.append(Finding(False, f"opencode: permission withholds {', '.join(asked)}",
                             "crosstalk install (allows crosstalk_* only)"))
    return found


def _plugin(env: Mapping[str, str]) -> Finding:
    path = plugin_path(env)
    try:
        current = path.read_bytes() == PLUGIN_SOURCE.read_bytes()
    except OSError:
        return Finding(False, f"opencode: the CrossTalk plugin is not at {path}",
                       "crosstalk install")
    if not current:
        return Finding(False, f"opencode: {path} is not this CrossTalk's plugin",
                       "crosstalk install (then restart opencode)")
    return Finding(True, f"opencode: plugin {path}")


def _version(env: Mapping[str, str]) -> Finding:
    binary = shutil.which("opencode", path=env.get("PATH"))
    if binary is None:
        return Finding(True, "opencode: not on PATH (nothing to run)")
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True,
                              timeout=20, env=dict(env), check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Finding(False, f"opencode: `{binary} --version` failed ({exc})",
                       "reinstall opencode")
    version = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "?"
    note = "" if version == TESTED_VERSION else f" (CrossTalk was tested with {TESTED_VERSION})"
    return Finding(True, f"opencode: version {version}{note}")


#: Top-level commands that exit when done (the plugin publishes nothing for them).
ONE_SHOT = frozenset({"agent", "auth", "config", "console", "db", "debug", "export", "generate",
                      "github", "import", "mcp", "models", "plugin", "pr", "providers",
                      "session", "stats", "uninstall", "upgrade", "v2", "completion", "help"})


def _opencode_processes(state: Path) -> dict[int, list[str]]:
    """Our user's running opencode processes (by their executable) whose plugin would publish
    into ``state`` (by their environment: another CROSSTALK_HOME is another setup), with their
    argv."""
    from crosstalk.config import state_dir

    found: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError):
            if os.path.basename(os.readlink(entry / "exe")) not in ("opencode", "opencode.exe"):
                continue
            environ = dict(item.split("=", 1) for item in (entry / "environ").read_bytes()
                           .decode(errors="replace").split("\0") if "=" in item)
            if state_dir(environ) != state:
                continue
            raw = (entry / "cmdline").read_bytes()
            found[int(entry.name)] = [p.decode(errors="replace") for p in raw.split(b"\0") if p]
    return found


def _instance(record: InstanceRecord, env: Mapping[str, str]) -> Finding:
    """What discovery sees of one live instance (the harness's own reader, so doctor says
    exactly what ``crosstalk agents`` and a sender would find)."""
    where = f"opencode {record.pid} in {record.directory}"
    try:
        rows = asyncio.run(asyncio.wait_for(instance_sessions(record, env),
                                            DISCOVERY_TIMEOUT))
    except (OpencodeError, TimeoutError) as exc:
        why = getattr(exc, "reason", None) or "no answer in time"
        return Finding(False, f"{where}: its socket {record.socket} does not answer as opencode "
                       f"({why})", f"restart that opencode (pid {record.pid})")
    busy = sum(1 for r in rows if r.status in ("busy", "waiting"))
    return Finding(True, f"{where}: reachable, {len(rows)} sessions live, {busy} busy "
                   f"(opencode {record.opencode_version or '?'})")


#: Why a record is not live that means its process is gone: stale, and ignored.
_STALE = frozenset({"pid_gone", "process_start_mismatch"})
#: ... that means the process lives but its socket does not serve: restart it.
_DEAF = frozenset({"socket_missing", "socket_refused"})


def _running(env: Mapping[str, str]) -> list[Finding]:
    from crosstalk.config import state_dir

    state = state_dir(dict(env))
    found: list[Finding] = []
    published: set[int] = set()
    for seen in scan(env):
        why = f"{seen.reason}: {seen.detail}" if seen.detail else str(seen.reason)
        if seen.record is not None:
            published.add(seen.record.pid)
            found.append(_instance(seen.record, env))
        elif seen.reason in _STALE:
            found.append(Finding(True, f"opencode record {seen.path}: its process is gone "
                                 "(a stale record, ignored)"))
        elif seen.reason in _DEAF and seen.parsed is not None:
            published.add(seen.parsed.pid)
            found.append(Finding(False, f"opencode {seen.parsed.pid} in "
                                 f"{seen.parsed.directory}: its socket {seen.parsed.socket} "
                                 f"does not answer ({why})",
                                 f"restart that opencode (pid {seen.parsed.pid})"))
        else:  # torn, forged, not ours: nothing will ever read it
            found.append(Finding(False, f"opencode record {seen.path}: {why}",
                                 f"rm {seen.path}"))
    for pid, argv in sorted(_opencode_processes(state).items()):
        command = next((a for a in argv[1:] if not a.startswith("-")), "")
        if pid in published or command in ONE_SHOT:
            continue
        found.append(Finding(False, f"opencode {pid} (`{' '.join(argv[1:]) or 'opencode'}`) "
                             "publishes no CrossTalk instance: it started before `crosstalk "
                             "install`, or its plugin did not load (a `serve` publishes once a "
                             "client opens a directory)", f"restart that opencode (pid {pid})"))
    return found


def doctor(env: Mapping[str, str]) -> list[Finding]:
    return [*_installed(env), _plugin(env), _version(env), *_running(env)]


def why_unreachable(session: Session) -> str | None:
    if session.detail:
        return f"its opencode instance cannot be reached: {session.detail}"
    return ("its opencode process publishes no CrossTalk socket (started before `crosstalk "
            "install`, or the plugin did not load): restart it")

