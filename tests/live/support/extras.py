"""Helpers for the limits scenarios (``test_claude_live_limits.py``): reading every peer
message a session's model was shown, chaining many tool calls in one mock rule, and driving
Claude's ``/mcp`` menu the way a user reconnects a server.

Built on :mod:`tests.live.support.claude` and :mod:`tests.live.support.mock_api` without
changing them.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.live.support.claude import Entry, LiveClaude, World, is_main, wait_for
from tests.live.support.mock_api import message_text

#: Claude's envelope around a peer message CrossTalk injected, with CrossTalk's first body
#: line (``[crosstalk message-id=… kind=… in-reply-to=… reply-with=…]``).
ENVELOPE = re.compile(
    r'<cross-session-message from="uds:(?P<from>[^"]+)" from-name="(?P<name>[^"]+)"'
    r'(?: from-mode="(?P<mode>[^"]+)")?>\n'
    r"\[crosstalk message-id=(?P<id>\S+) kind=(?P<kind>\w+)(?P<meta>[^\]\n]*)\]\n"
    r"(?P<body>.*?)\n</cross-session-message>", re.S)
IN_REPLY_TO = re.compile(r"in-reply-to=(\S+)")


@dataclass(frozen=True)
class Seen:
    """One CrossTalk envelope in one message of a request the model was sent."""

    message_id: str
    kind: str
    from_name: str
    from_address: str
    mode: str
    body: str
    in_reply_to: str | None
    #: The rest of CrossTalk's first body line (``in-reply-to=…``, ``reply-with=reply``…).
    meta: str
    #: The role of the message carrying it (``user`` for a new turn, ``system`` mid-turn).
    role: str
    #: Index of that message in the request's ``messages``.
    index: int


def peer_messages(entry: Entry) -> list[Seen]:
    """Every CrossTalk envelope in the request, in conversation order (the whole history: a
    request repeats the earlier turns)."""
    body = entry.get("body")
    messages = body.get("messages") if isinstance(body, dict) else None
    out: list[Seen] = []
    for index, message in enumerate(messages or []):
        if not isinstance(message, dict):
            continue
        for m in ENVELOPE.finditer(message_text(message)):
            reply = IN_REPLY_TO.search(m["meta"])
            out.append(Seen(m["id"], m["kind"], m["name"], m["from"], m["mode"] or "", m["body"],
                            reply.group(1) if reply else None, m["meta"].strip(),
                            str(message.get("role")),
                            index))
    return out


def tool_uses(entries: Sequence[Entry]) -> dict[str, dict[str, Any]]:
    """The tool_use blocks the mock answered with, by id."""
    out: dict[str, dict[str, Any]] = {}
    for entry in entries:
        for block in entry.get("response") or []:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                out[str(block["id"])] = block
    return out


def tool_result_blocks(entries: Sequence[Entry]) -> dict[str, dict[str, Any]]:
    """Every tool_result block in any message of the requests, by tool_use id (a later
    request repeats earlier results; the content is the same)."""
    out: dict[str, dict[str, Any]] = {}
    for entry in entries:
        body = entry.get("body")
        for message in (body.get("messages") or []) if isinstance(body, dict) else []:
            content = message.get("content") if isinstance(message, dict) else None
            if not isinstance(content, list):
                continue
            for block in content:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    out.setdefault(str(block.get("tool_use_id")), block)
    return out


def result_json(block: dict[str, Any]) -> dict[str, Any]:
    """The JSON object a CrossTalk tool returned, as the model saw it in a tool_result."""
    text = message_text({"content": block.get("content")})
    data = json.loads(text)
    assert isinstance(data, dict), text
    return data


def chain_rule(*, rule_id: str, trigger: str, session: str,
               calls: Sequence[dict[str, Any]], final_text: str) -> dict[str, Any]:
    """One mock rule whose answer is ``calls[0]``; each tool_result is answered with the next
    call (nested ``then``), the last one with ``final_text``: a model that makes N tool calls
    in a row, one per response."""
    rule: dict[str, Any] = {"text": final_text}
    for call in reversed(calls):
        rule = {"tool_use": call, "then": rule}
    return {"id": rule_id, "match": trigger, "session": session, **rule}


def agent_id_for(session_id: str) -> str:
    """CrossTalk's agent_id of a Claude session: first 16 hex of sha256("claude:<id>")."""
    return hashlib.sha256(f"claude:{session_id}".encode()).hexdigest()[:16]


def journal(world: World, agent_id: str) -> list[dict[str, Any]]:
    """The records of an agent's journal ``<CROSSTALK_HOME>/journal/<agent_id>.jsonl`` (each
    line is ``{"c": <checksum>, "r": <record>}``; the records are returned)."""
    path = world.state / "journal" / f"{agent_id}.jsonl"
    try:
        raw = path.read_text()
    except FileNotFoundError:
        return []
    out = []
    for line in raw.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line being written
        if isinstance(rec, dict) and isinstance(rec.get("r"), dict):
            out.append(rec["r"])
    return out


def transcript(world: World, claude: LiveClaude) -> list[dict[str, Any]]:
    """The records of the session's transcript(s) ``<config>/projects/*/<sessionId>.jsonl``
    (user records of peer messages carry their ``origin``: ``selfSent``, ``fromMode``, …)."""
    record = claude.record()
    if record is None:
        return []
    out: list[dict[str, Any]] = []
    for path in (world.config_dir / "projects").glob(f"*/{record['sessionId']}.jsonl"):
        for line in path.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
    return out


def latest_main(claude: LiveClaude) -> Entry | None:
    """The session's last main-loop request (the longest history the model was shown)."""
    mains = [e for e in claude.requests() if is_main(e)]
    return mains[-1] if mains else None


def wait_screen(claude: LiveClaude, *needles: str, timeout: float = 15.0) -> str:
    """Until the pane shows every one of ``needles``; returns the screen."""
    def check() -> str | None:
        screen = claude.screen()
        return screen if all(n in screen for n in needles) else None
    try:
        result: str = wait_for(check, timeout, step=0.1,
                               what=f"{claude.name}: screen showing {needles!r}")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{claude.diagnostics()}") from None
    return result


def key(claude: LiveClaude, *keys: str) -> None:
    claude.tmux("send-keys", "-t", "cc", *keys)


def reconnect_mcp(claude: LiveClaude, server: str = "crosstalk", timeout: float = 30.0) -> None:
    """Reconnect an MCP server as a user does: ``/mcp``, pick the server, "Reconnect".

    2.1.328: typing ``/mcp`` and Enter opens "MCP servers" with the cursor (U+276F) on the
    first server (ours is the only one, marked U+2718 once it died); Enter shows its page
    with "Reconnect" selected; Enter reconnects, closes the menu and prints "Reconnected to
    <server>." (Escape twice at the prompt would open "Rewind": not used.)
    """
    try:
        claude.send_keys("/mcp", enter=False)
        wait_screen(claude, "Manage MCP servers")  # the command list under the prompt
        key(claude, "Enter")
        try:
            screen = wait_screen(claude, "MCP servers", "Enter to view", timeout=3)
        except AssertionError:  # the Enter reached the TUI before its list: once more
            if "Manage MCP servers" not in claude.screen():
                raise
            key(claude, "Enter")
            screen = wait_screen(claude, "MCP servers", "Enter to view")
        if f"\u276f \u2718 {server}" not in screen and f"\u276f {server}" not in screen:
            raise AssertionError(f"/mcp menu: the cursor is not on {server!r}:\n{screen}")
        key(claude, "Enter")
        wait_screen(claude, "\u276f Reconnect")
        key(claude, "Enter")
        wait_screen(claude, f"Reconnected to {server}.", timeout=timeout)
    except BaseException:
        # Leave the prompt empty, so that LiveClaude.stop's "/exit" still works.
        for _ in range(3):
            key(claude, "Escape")
            time.sleep(0.3)
        key(claude, "C-u")
        raise


def shim_log_lines(claude: LiveClaude, needle: str = "crosstalk") -> list[str]:
    """Lines of Claude's debug log about the MCP server (it copies the shim's stderr)."""
    try:
        log = Path(claude.debug_log).read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [line for line in log if needle in line]


class Stopwatch:
    """Wall-clock marks comparable with the mock log's ``t`` (``time.time()``)."""

    def __init__(self) -> None:
        self.t0 = time.time()

    def since(self, t: float | None = None) -> float:
        return (time.time() if t is None else t) - self.t0
