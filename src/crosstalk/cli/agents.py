"""``crosstalk agents``: every session on this machine, as ``list_agents`` sees it, for people.

The same directory the tools use (descriptors merged with every harness's own sessions), plus,
for each session that cannot be reached, why not (as its harness explains it).

A descriptor that does not read is not silently dropped: its agent may be running, invisible
and unreachable. It is shown with a ``damaged`` field — its path, why it does not read, whether
a live process holds its agent lock, and the fix — on the session's row if a harness lists
that session, else on a row of its own. Rows without damage are exactly as before.

On a terminal the table is drawn with ``rich`` (colour for status and reachability); in a pipe
or a log it is the plain aligned text, and ``--json`` is the rows, byte for byte as before.
``rich`` is imported only when it draws, so the plain paths cost nothing more.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from crosstalk.directory import Directory, Entry
from crosstalk.harness.loader import by_name, discoveries
from crosstalk.store.files import in_the_way
from crosstalk.store.registry import Registry, Unreadable

COLUMNS = ("name", "harness", "status", "crosstalk", "reachable", "agent_id", "cwd")


def why_unreachable(entry: Entry) -> str | None:
    """A person-readable reason a session cannot be messaged now, or ``None`` if it can: a
    CrossTalk agent with no A2A listener, else what the session's harness says."""
    if entry.reachable:
        return None
    session, desc = entry.session, entry.descriptor
    if desc is not None and desc.a2a_url is None:
        return "its CrossTalk shim publishes no A2A listener"
    plugin = by_name(entry.harness) if session is not None else None
    reason = plugin.why_unreachable(session) if plugin is not None and session else None
    return reason or "unknown"


def damage(registry: Registry, bad: Unreadable) -> dict[str, Any]:
    """The ``damaged`` field of a descriptor that does not read, with what to do about it."""
    agent_id = bad.agent_id
    live = agent_id is not None and registry.agent_is_held(agent_id)
    if bad.path.is_dir():
        fix = in_the_way(bad.path, "a descriptor").fix
    elif agent_id is None:
        fix = f"rm {bad.path} (its file name is not an agent id: CrossTalk did not write it)"
    elif live:
        fix = ("its shim rewrites it within seconds; if it stays damaged, restart that "
               "session's crosstalk mcp")
    else:
        fix = "crosstalk doctor --fix"
    return {"path": str(bad.path), "reason": bad.reason, "live": live, "fix": fix}


def damaged_row(agent_id: str | None, damaged: Mapping[str, Any]) -> dict[str, Any]:
    """A row for a damaged descriptor no harness lists: nothing in it can be trusted but the
    agent id its file name gives, and nobody can reach it."""
    state = "running" if damaged["live"] else "not running"
    return {"name": None, "agent_id": agent_id, "harness": None, "cwd": None,
            "status": "unknown", "crosstalk": True, "reachable": False, "role": None,
            "owner": None, "damaged": dict(damaged),
            "unreachable_because": f"its descriptor does not read (its agent is {state})"}


def rows(home: Path, env: Mapping[str, str]) -> list[dict[str, Any]]:
    registry = Registry.reader(home)
    directory = Directory(registry, discoveries(env))
    out = []
    for entry in directory.snapshot():
        row = entry.row()
        why = why_unreachable(entry)
        if why is not None:
            row["unreachable_because"] = why
        out.append(row)
    by_id = {row["agent_id"]: row for row in out}
    unreadable = registry.scan()[1] if registry.agents_dir.is_dir() else []
    for bad in unreadable:
        damaged = damage(registry, bad)
        listed = by_id.get(bad.agent_id)
        if listed is not None:
            listed["damaged"] = damaged
        else:
            out.append(damaged_row(bad.agent_id, damaged))
    return out


def table(listed: Sequence[Mapping[str, Any]]) -> str:
    """A plain aligned table (no colour: it must read the same in a pipe and a log)."""
    def cell(row: Mapping[str, Any], key: str) -> str:
        value = row.get(key)
        if key == "status" and row.get("waiting_for"):
            return f"waiting for {row['waiting_for']}"
        if isinstance(value, bool):
            return "yes" if value else "no"
        return "-" if value is None else str(value)

    body = [[cell(r, k) for k in COLUMNS] for r in listed]
    widths = [max([len(k), *(len(b[i]) for b in body)]) for i, k in enumerate(COLUMNS)]
    lines = ["  ".join(k.upper().ljust(w) for k, w in zip(COLUMNS, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(b, widths, strict=True)).rstrip()
              for b in body]
    for r in listed:
        label = r["name"] or r["agent_id"] or "?"
        if r.get("damaged"):
            d = r["damaged"]
            lines.append(f"  {label}: damaged descriptor {d['path']}: {d['reason']}; "
                         f"fix: {d['fix']}")
        if r.get("unreachable_because"):
            lines.append(f"  {label}: unreachable: {r['unreachable_because']}")
    return "\n".join(lines)


#: The colour of each status and of reachability in the rich table.
STATUS_STYLE = {"idle": "green", "busy": "yellow", "waiting": "magenta", "shell": "cyan",
                "unknown": "dim"}


def rich_table(listed: Sequence[Mapping[str, Any]], out: IO[str]) -> None:
    """The same table and notes as :func:`table`, drawn for a terminal. Every cell is a
    ``Text``: a session's name is shown as named, never read as markup."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    grid = Table(box=None, header_style="bold", pad_edge=False)
    for key in COLUMNS:
        grid.add_column(key.upper(), overflow="fold")
    for r in listed:
        cells = []
        for key in COLUMNS:
            value = r.get(key)
            if key == "status" and r.get("waiting_for"):
                cells.append(Text(f"waiting for {r['waiting_for']}", style="magenta"))
            elif key == "status":
                cells.append(Text(str(value or "-"), style=STATUS_STYLE.get(str(value), "")))
            elif isinstance(value, bool):
                style = "green" if value else ("red" if key == "reachable" else "dim")
                cells.append(Text("yes" if value else "no", style=style))
            else:
                cells.append(Text("-" if value is None else str(value)))
        grid.add_row(*cells)
    # The table fits the terminal's width (its cells fold); a note is one line the terminal
    # wraps, so a path or a fix command can be copied whole.
    console = Console(file=out, force_terminal=True, highlight=False)
    console.print(grid)
    for r in listed:
        label = r["name"] or r["agent_id"] or "?"
        if r.get("damaged"):
            d = r["damaged"]
            console.print(Text.assemble(
                f"  {label}: ", ("damaged descriptor", "bold red"),
                f" {d['path']}: {d['reason']}; ", ("fix: ", "bold"), (d["fix"], "cyan")),
                soft_wrap=True)
        if r.get("unreachable_because"):
            console.print(Text.assemble(f"  {label}: ", ("unreachable", "red"),
                                        f": {r['unreachable_because']}"), soft_wrap=True)


def run_agents(home: Path, *, as_json: bool = False, env: Mapping[str, str] | None = None,
               out: IO[str] | None = None, terminal: bool | None = None) -> int:
    """``terminal``: draw with rich; by default when ``out`` is a terminal."""
    out = out or sys.stdout
    listed = rows(home, os.environ if env is None else env)
    if as_json:
        print(json.dumps(listed, sort_keys=True), file=out)
    elif not listed:
        print("no sessions found (no CrossTalk agents, Claude sessions or Codex threads)",
              file=out)
    elif out.isatty() if terminal is None else terminal:
        rich_table(listed, out)
    else:
        print(table(listed), file=out)
    return 0
