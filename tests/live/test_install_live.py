"""``crosstalk install`` / ``uninstall`` against the real Claude Code and Codex (issue 7).

On one test's throw-away HOME, CLAUDE_CONFIG_DIR and CODEX_HOME, seeded by the rig but without
the rig's own CrossTalk registration: ``crosstalk install``; a Claude session started with no
``--mcp-config`` and a Codex thread on an app-server then run ``crosstalk mcp`` from the
entries install wrote, and their models message each other; after both stop, ``crosstalk
uninstall`` leaves ``config.toml`` byte-identical and ``.claude.json`` as it was, apart from
what Claude itself changed in it while it ran.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.live.conftest import Timings
from tests.live.support.claude import (
    World,
    cmdline,
    descendants,
    is_main,
    last_user_text,
    tool_results,
)
from tests.live.support.codex import (
    NAMESPACE,
    CodexWorld,
    call_output,
    function_calls,
    output_json,
    request_text,
)
from tests.live.support.extras import ENVELOPE
from tests.live.support.mock_api import message_text

pytestmark = pytest.mark.live

SCRIPT = Path(sys.executable).parent / "crosstalk"
#: From the installed skill's description (to see whether Claude offers it to the model).
SKILL_BLURB = "Message other AI coding-agent sessions on this machine"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def installed_shims(pids: list[int]) -> list[int]:
    """Those of ``pids`` running the installed entry's command (``<venv>/bin/crosstalk mcp``,
    through its ``#!python`` line), not the rig's ``python -m crosstalk mcp``."""
    return [p for p in pids if cmdline(p)[-2:] == [str(SCRIPT), "mcp"]]


def json_diff(old: Any, new: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The paths (object keys, outermost first) where ``old`` and ``new`` differ: a key added,
    removed, or with a different non-object value."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[tuple[str, ...]] = []
        for key in sorted(set(old) | set(new)):
            if key not in old or key not in new:
                out.append((*path, key))
            else:
                out.extend(json_diff(old[key], new[key], (*path, key)))
        return out
    return [] if old == new else [path]


def covered(path: tuple[str, ...], by: list[tuple[str, ...]]) -> bool:
    """``path`` is one of ``by``, or inside or around one of them."""
    return any(path[:len(p)] == p or p[:len(path)] == path for p in by)


def crosstalk(cw: CodexWorld, *args: str) -> str:
    done = cw.crosstalk(*args)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def test_install_then_uninstall_with_real_harnesses(world: World, codex_with_claude: CodexWorld,
                                                     timings: Timings) -> None:
    cw = codex_with_claude
    assert SCRIPT.is_file(), f"no console script {SCRIPT}"
    # The rig's seeds, minus its own CrossTalk registration (no app-server runs yet).
    cw.write_config(crosstalk=False)
    claude_json = world.config_dir / ".claude.json"
    toml = cw.codex_home / "config.toml"
    skill = world.config_dir / "skills" / "crosstalk" / "SKILL.md"
    before_json, before_toml = claude_json.read_bytes(), toml.read_bytes()
    assert b"crosstalk" not in before_json
    assert b"mcp_servers" not in before_toml
    skills_existed = skill.parent.parent.exists()
    settings = world.config_dir / "settings.json"
    before_settings = json.loads(settings.read_bytes())

    # Install, with the world's environment (HOME, CLAUDE_CONFIG_DIR, CODEX_HOME, ...).
    assert {"HOME", "CLAUDE_CONFIG_DIR", "CODEX_HOME", "CROSSTALK_HOME",
            "XDG_RUNTIME_DIR"} <= set(cw.env)
    t0 = time.monotonic()
    out = crosstalk(cw, "install")
    timings.add("crosstalk install", time.monotonic() - t0)
    print(f"[install] {out.strip()}")
    installed_json = claude_json.read_bytes()
    entry = json.loads(installed_json)["mcpServers"]["crosstalk"]
    assert entry == {"type": "stdio", "command": str(SCRIPT), "args": ["mcp"], "env": {}}
    installed_toml = toml.read_text()
    assert "[mcp_servers.crosstalk]" in installed_toml
    assert installed_toml.startswith(before_toml.decode())  # appended, the rest kept as is
    assert skill.is_file()

    # A Claude session with no --mcp-config (only the user-scope entry), and a Codex thread.
    t0 = time.monotonic()
    alpha = world.session("alpha", crosstalk=False,
                          extra_env={"CROSSTALK_HOME": str(world.state),
                                     "CODEX_HOME": str(cw.codex_home)}).start()
    assert "--mcp-config" not in cmdline(alpha.pid or 0)
    cx = cw.thread("cx")  # waits for the app-server's "crosstalk" MCP server to be ready
    alpha.wait_named()
    alpha.wait_mcp_connected()
    a_desc = alpha.wait_descriptor()  # registered at start-up
    alpha.wait_idle()
    timings.add("claude session + codex thread ready (installed entries)",
                time.monotonic() - t0)
    assert alpha.pid is not None
    claude_shims = installed_shims(descendants(alpha.pid))
    assert claude_shims == [a_desc["pid"]], (claude_shims, a_desc)
    codex_shims = installed_shims(cw.server.children())
    assert len(codex_shims) == 1, [cmdline(p) for p in cw.server.children()]
    assert cx.descriptor() is None  # a Codex thread registers on its first tool call

    # Codex model -> send_message -> Claude's model.
    text, trigger = unique("INSTALLED-CODEX-TO-CLAUDE"), unique("GO")
    cw.mock.add_rules({"id": "cx-sends", "match": trigger, "thread": cx.id,
                       "function_call": {"namespace": NAMESPACE, "name": "send_message",
                                         "arguments": {"to": a_desc["name"], "text": text}},
                       "then": {"text": "called send_message"}})
    after = cw.last_seq()
    turn = cx.run_turn(f"{trigger}: message alpha", timeout=90)
    assert turn["status"] == "completed", turn
    asked = cx.wait_for_request(lambda e: e.get("rule") == "cx-sends", after=after)
    (fc,) = function_calls(asked)
    answered = cx.wait_for_request(lambda e: call_output(e, fc["call_id"]) is not None,
                                   after=asked["seq"])
    output = call_output(answered, fc["call_id"])
    assert output is not None
    result = output_json(output)
    assert result.get("state") == "accepted", result
    cx_desc = cx.wait_descriptor()
    assert cx_desc["pid"] in codex_shims, (cx_desc, codex_shims)
    got = alpha.wait_for_request(lambda e: is_main(e) and text in last_user_text(e), timeout=30)
    timings.add("codex function_call -> claude model request", got["t"] - asked["t"])
    envelope = ENVELOPE.search(last_user_text(got))
    assert envelope is not None, last_user_text(got)[:600]
    assert (envelope["name"], envelope["id"], envelope["body"]) == \
        (cx_desc["name"], result["message_id"], text)

    # Claude model -> send_message -> the Codex thread's model.
    back, trigger = unique("INSTALLED-CLAUDE-TO-CODEX"), unique("GO-BACK")
    world.mock.add_rules({"id": "a-sends", "match": trigger, "session": alpha.session_id,
                          "tool_use": {"name": "mcp__crosstalk__send_message",
                                       "input": {"to": cx_desc["name"], "text": back}},
                          "then": {"text": "sent back"}})
    after = alpha.last_seq()
    alpha.send_keys(f"{trigger} answer cx")
    res_entry = alpha.wait_for_request(lambda e: bool(tool_results(e)), timeout=60,
                                       after=after)
    (block,) = tool_results(res_entry)
    back_result = json.loads(message_text({"content": block.get("content")}))
    assert back_result.get("state") == "accepted", back_result
    seen = cx.wait_for_request(lambda e: e.get("kind") == "main" and back in request_text(e),
                               timeout=30)
    sent = alpha.wait_for_request(lambda e: e.get("rule") == "a-sends", after=after)
    timings.add("claude tool_use -> codex model request", seen["t"] - sent["t"])
    alpha.wait_idle()
    wait_turns_done(cw, cx)
    offered = any(SKILL_BLURB in json.dumps(e.get("body")) for e in alpha.main_requests())
    print(f"[install] the installed skill is offered to Claude's model: {offered}")

    # Stop both, then uninstall.
    assert alpha.stop() == []
    assert cw.stop_server() == []
    stopped_json = claude_json.read_bytes()
    assert toml.read_bytes() == installed_toml.encode(), "Codex rewrote config.toml"
    t0 = time.monotonic()
    out = crosstalk(cw, "uninstall")
    timings.add("crosstalk uninstall", time.monotonic() - t0)
    print(f"[uninstall] {out.strip()}")

    assert toml.read_bytes() == before_toml
    assert not skill.exists()
    assert not skill.parent.exists()
    left = sorted(p.name for p in skill.parent.parent.iterdir()) \
        if skill.parent.parent.exists() else None
    print(f"[install] skills/ existed before install: {skills_existed}; after uninstall: "
          f"{left}")
    now_settings = json.loads(settings.read_bytes())
    print("[install] settings.json changed by Claude: " + ", ".join(
        f"{'.'.join(p)}: {_short(_at(before_settings, p))} -> {_short(_at(now_settings, p))}"
        for p in json_diff(before_settings, now_settings)))
    after_json = claude_json.read_bytes()
    old, installed, stopped, now = (json.loads(b) for b in
                                    (before_json, installed_json, stopped_json, after_json))
    # Install added only our entry; uninstall removed only it from what Claude left.
    assert json_diff(old, installed) == [("mcpServers",)]
    assert json_diff(stopped, now) == [("mcpServers",)], json_diff(stopped, now)
    assert "mcpServers" not in now
    assert list(now) == [k for k in stopped if k != "mcpServers"]  # Claude's key order kept
    by_claude = json_diff(installed, stopped)
    changed = json_diff(old, now)
    print(f"[install] .claude.json byte-identical after uninstall: {after_json == before_json}"
          f"; Claude's bytes minus our entry: "
          f"{after_json == _without_entry(stopped_json)}")
    print(f"[install] keys Claude changed while it ran: {['.'.join(p) for p in by_claude]}")
    for p in changed:
        print(f"[install]   {'.'.join(p)}: {_short(_at(old, p))} -> {_short(_at(now, p))}")
    assert all(covered(p, by_claude) for p in changed), \
        [p for p in changed if not covered(p, by_claude)]
    # What the seed had and Claude did not touch is exactly as before.
    for key in old:
        if not covered((key,), by_claude):
            assert now[key] == old[key], key


def _without_entry(raw: bytes) -> bytes:
    """``raw`` with ``mcpServers`` dropped, in Claude's own format (JSON.stringify(…, 2))."""
    data = json.loads(raw)
    data.pop("mcpServers", None)
    text = json.dumps(data, indent=2, ensure_ascii=False)
    return (text + "\n" if raw.endswith(b"\n") else text).encode()


def _short(value: Any) -> str:
    text = json.dumps(value) if value != "<absent>" else value
    return text if len(text) <= 70 else text[:67] + "..."


def _at(data: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return "<absent>"
        data = data[key]
    return data


def wait_turns_done(cw: CodexWorld, thread: Any, timeout: float = 30.0) -> None:
    """Until the thread is idle (the turn CrossTalk started for the message has ended)."""
    deadline = time.monotonic() + timeout
    while thread.read()["status"]["type"] != "idle":
        if time.monotonic() > deadline:
            raise AssertionError(f"thread not idle: {thread.read()['status']}\n"
                                 f"{cw.diagnostics()}")
        time.sleep(0.2)
