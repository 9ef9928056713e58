"""What each cell and the detail pane of ``crosstalk watch`` say, as plain strings.

Kept apart from the textual app (:mod:`crosstalk.watch.app`) so that what a person reads is
testable without a terminal, and so the app is only layout and events. The strings are text,
never markup: a message that contains ``[red]`` shows ``[red]`` (the app wraps each in a
``rich.text.Text``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence

from crosstalk.watch.model import Board, MessageView, Notice, SessionView

SESSION_COLUMNS: tuple[tuple[str, str], ...] = (
    ("name", "name"), ("harness", "harness"), ("status", "status"),
    ("crosstalk", "CrossTalk"), ("reachable", "reachable"), ("role", "role/owner"))
MESSAGE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("time", "time"), ("route", "from → to"), ("kind", "kind"), ("state", "state"),
    ("ask", "ask"), ("receipt", "receipt"), ("text", "text"))

#: How much of a message's text, and of a state's reason, its row shows (the detail pane
#: shows all of it).
ROW_TEXT = 60
ROW_REASON = 24
#: An ask's states once it is no longer open: the ask column shows the word itself.
ENDED_ASK = frozenset({"answered", "expired", "closed"})


def clock(ts: float, *, millis: bool = False) -> str:
    if ts <= 0:
        return "--:--:--"
    text = time.strftime("%H:%M:%S", time.localtime(ts))
    return f"{text}.{int(ts * 1000) % 1000:03d}" if millis else text


def short_id(value: str | None) -> str:
    """Agent and message ids are UUIDs; a row shows their last 8 characters (the random part
    of a UUIDv7, the part that tells two apart)."""
    if not value:
        return "-"
    return value if len(value) <= 12 else "…" + value[-8:]


def session_cells(session: SessionView) -> tuple[str, ...]:
    status = session.status
    if session.waiting_for:
        status = f"waiting for {session.waiting_for}"
    if session.damaged:
        status = f"DAMAGED: {session.damaged}"
    if session.reachable:
        reachable = "yes"
    else:
        reachable = f"no: {session.unreachable_because}" if session.unreachable_because else "no"
    who = "/".join(v for v in (session.role, session.owner) if v) or "-"
    return (session.name or short_id(session.key), session.harness or "-", status,
            "yes" if session.crosstalk else "no", reachable, who)


def ask_cell(message: MessageView, now: float) -> str:
    """An open ask counts down to its deadline (``ask 42s``); ended, it says how. Past its
    deadline but not yet journaled as expired, it says ``ask due``: the watch shows what the
    journal says, and the agent's timer has not written it yet."""
    state = message.ask_state
    if state is None:
        return ""
    if state in ENDED_ASK:
        return state
    if message.ask_deadline is None:
        return "ask open"
    left = message.ask_deadline - now
    return f"ask {int(left + 0.999)}s" if left > 0 else "ask due"


def route(message: MessageView, depth: int = 0) -> str:
    to = message.to_name or short_id(message.to_agent)
    lead = "  " * depth + "↳ " if depth else ""
    return f"{lead}{message.sender_label} → {to}"


def message_cells(message: MessageView, now: float, depth: int = 0) -> tuple[str, ...]:
    state = message.state
    if message.reason:
        state = f"{state} ({clip(message.reason, ROW_REASON)})"
    text = clip(" ".join(message.text.split()), ROW_TEXT)
    return (clock(message.first_ts), route(message, depth), message.shown_kind, state,
            ask_cell(message, now), message.receipt or "", text)


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def depth_in(board: Board, message: MessageView, limit: int = 16) -> int:
    """How many replies deep a message is on the board (its parents may have left it)."""
    depth, seen, parent = 0, {message.message_id}, message.in_reply_to
    while parent and parent not in seen and depth < limit:
        up = board.messages.get(parent)
        if up is None:
            break
        seen.add(parent)
        depth, parent = depth + 1, up.in_reply_to
    return depth


def notice_line(notice: Notice) -> str:
    return f"! {clock(notice.ts)} {notice.where}: {notice.what}"


def detail(message: MessageView, board: Board, now: float,
           harness_of: Callable[[str | None], str | None]) -> str:
    """Everything the board knows of one message: text, ids, sender as verified, its thread,
    each state in order and the journal records behind it."""
    sender = "verified" if message.verified else "unverified"
    lines = [
        f"message   {message.message_id}",
        f"kind      {message.kind} ({message.delivery})",
        f"from      {message.sender_label} ({sender}, via {message.ingress})"
        + (f"  agent {message.sender_agent}" if message.sender_agent else ""),
        f"to        {message.to_name or '-'}  agent {message.to_agent}"
        + (f"  [{harness_of(message.to_agent)}]" if harness_of(message.to_agent) else ""),
        f"in reply  {message.in_reply_to or '-'}",
    ]
    if message.task_id:
        lines.append(f"task      {message.task_id}")
    if message.ask_state is not None:
        lines.append(f"ask       {ask_cell(message, now)}"
                     + (f", deadline {clock(message.ask_deadline)}"
                        if message.ask_deadline else ""))
    if message.reply_text is not None:
        lines.append(f"reply     {message.reply_text}")
    if message.receipt:
        lines.append(f"receipt   {message.receipt}")
    lines += ["", "text", *("  " + line for line in message.text.splitlines() or [""]), ""]
    lines.append("states")
    for step in message.steps:
        seq = f"  #{step.seq}" if step.seq is not None else ""
        why = f" ({step.reason})" if step.reason else ""
        lines.append(f"  {clock(step.ts, millis=True)}  {step.state}{why}{seq}")
    lines += ["", *thread_lines(board.thread(message.message_id), message, board, now)]
    lines += ["", f"records ({len(message.records)})"]
    lines += ["  " + json.dumps(r, sort_keys=True, ensure_ascii=False) for r in message.records]
    return "\n".join(lines)


def thread_lines(thread: Sequence[MessageView], selected: MessageView, board: Board,
                 now: float) -> list[str]:
    if len(thread) <= 1:
        return ["thread    (no replies)"]
    out = [f"thread ({len(thread)})"]
    for m in thread:
        mark = "▸" if m.message_id == selected.message_id else " "
        text = " ".join(m.text.split())[:40]
        out.append(f" {mark}{clock(m.first_ts)} {route(m, depth_in(board, m))}  {m.shown_kind} "
                   f"{m.state} {ask_cell(m, now)} «{text}»".rstrip())
    return out
