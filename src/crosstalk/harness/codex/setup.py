"""What Codex contributes to ``crosstalk install`` and ``doctor``, and where its files are.

``$CODEX_HOME`` (else ``~/.codex``) holds ``config.toml`` and the shared app-server's control
socket. Install adds ``[mcp_servers.crosstalk]`` to ``config.toml``, edited with ``tomlkit`` so
the user's comments and order stay; Codex starts MCP servers with a filtered environment, so
the entry forwards what CrossTalk needs to find both harnesses and its state (``env_vars``).
``tomlkit`` is imported by the functions that need it: a shim never edits a config.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from pathlib import Path

from crosstalk.harness.base import Session
from crosstalk.harness.plugin import SERVER, ConfigEdit, Finding, PlacedFile

CODEX_ENV_VARS = ["CODEX_HOME", "CLAUDE_CONFIG_DIR", "XDG_RUNTIME_DIR", "XDG_STATE_HOME",
                  "CROSSTALK_HOME"]


def _codex_home(env: Mapping[str, str]) -> Path:
    configured = env.get("CODEX_HOME")
    return Path(configured) if configured else Path(env.get("HOME") or str(Path.home())) / ".codex"


def control_socket(env: Mapping[str, str]) -> str:
    """``$CODEX_HOME/app-server-control/app-server-control.sock`` (CODEX_HOME: ``~/.codex``)."""
    home = env.get("CODEX_HOME") or os.path.join(env.get("HOME") or str(Path.home()),
                                                 ".codex")
    return os.path.join(home, "app-server-control", "app-server-control.sock")


def codex_config_file(env: Mapping[str, str]) -> Path:
    return _codex_home(env) / "config.toml"


# -- the edits (pure: text in, text out; a TOML error is a ValueError) ---------------------------


def codex_with(text: str | None, command: list[str]) -> str:
    import tomlkit

    try:
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
    except tomlkit.exceptions.TOMLKitError as exc:
        raise ValueError(str(exc)) from exc


def codex_without(text: str) -> str:
    import tomlkit

    try:
        doc = tomlkit.parse(text)
        servers = doc.get("mcp_servers")
        if servers is not None and SERVER in servers:
            del servers[SERVER]
            if not servers:
                del doc["mcp_servers"]
        return tomlkit.dumps(doc)
    except tomlkit.exceptions.TOMLKitError as exc:
        raise ValueError(str(exc)) from exc


def install_entries(env: Mapping[str, str]) -> list[ConfigEdit | PlacedFile]:
    return [ConfigEdit("codex", codex_config_file(env), codex_with, codex_without)]


# -- doctor ----------------------------------------------------------------------------------------


def _installed(env: Mapping[str, str]) -> Finding:
    import tomlkit

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


def _server(env: Mapping[str, str]) -> Finding:
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


def doctor(env: Mapping[str, str]) -> list[Finding]:
    return [_installed(env), _server(env)]


def why_unreachable(session: Session) -> str | None:
    if session.detail == "ambiguous_endpoint":
        return "loaded on several Codex app-servers: no single host to deliver to"
    if session.status == "error":
        return "its Codex thread is in a system error"
    return None
