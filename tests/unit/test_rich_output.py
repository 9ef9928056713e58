"""``crosstalk agents`` and ``doctor`` draw with rich on a terminal, and only there: in a pipe
they print exactly the plain text, ``--json`` is untouched, and rich/textual stay out of the
commands that do not draw (``crosstalk mcp``'s start-up is measured)."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from crosstalk.cli import agents, doctor
from crosstalk.harness.plugin import Finding

ANSI = re.compile(r"\x1b\[[0-9;]*m")

ROWS: list[dict[str, Any]] = [
    {"name": "alice", "agent_id": "A-1", "harness": "fake", "cwd": "/w", "status": "idle",
     "crosstalk": True, "reachable": True, "role": None, "owner": None},
    {"name": "[red]bob", "agent_id": "B-2", "harness": "claude", "cwd": None,
     "status": "waiting", "waiting_for": "permission", "crosstalk": False, "reachable": False,
     "role": None, "owner": None, "unreachable_because": "no inbox socket"},
    {"name": None, "agent_id": "C-3", "harness": None, "cwd": None, "status": "unknown",
     "crosstalk": True, "reachable": False, "role": None, "owner": None,
     "damaged": {"path": "/s/agents/C-3.json", "reason": "not JSON", "live": False,
                 "fix": "crosstalk doctor --fix"},
     "unreachable_because": "its descriptor does not read (its agent is not running)"},
]


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def plain(text: str) -> str:
    return ANSI.sub("", text)


def test_agents_on_a_terminal_is_a_coloured_table_with_every_note() -> None:
    out = io.StringIO()
    agents.rich_table(ROWS, out)
    drawn = out.getvalue()
    assert ANSI.search(drawn), "no colour on a terminal"
    text = plain(drawn)
    header = text.splitlines()[0].split()
    assert header == [c.upper() for c in agents.COLUMNS]
    assert "[red]bob" in text  # a name is shown as named, never read as markup
    assert "waiting for permission" in text
    assert "bob: unreachable: no inbox socket" in text
    assert "C-3: damaged descriptor /s/agents/C-3.json: not JSON; fix: crosstalk doctor --fix" \
        in text
    alice = next(line for line in text.splitlines() if line.startswith("alice"))
    assert alice.split()[:5] == ["alice", "fake", "idle", "yes", "yes"]


def test_doctor_on_a_terminal_colours_ok_and_problem() -> None:
    findings = [Finding(True, "claude: installed"),
                Finding(False, "stale descriptors: x (pid 1)", "crosstalk doctor --fix")]
    out = io.StringIO()
    doctor.rich_findings(findings, out)
    drawn = out.getvalue()
    assert "\x1b[32mok" in drawn  # green
    assert "\x1b[1;31mPROBLEM" in drawn  # bold red
    lines = [line for f in findings for line in f.line().splitlines()]
    assert plain(drawn).splitlines() == [*lines, "1 problem"]


@pytest.mark.parametrize("command", ["agents", "doctor"])
def test_a_terminal_is_detected_and_a_pipe_stays_plain(
        command: str, tmp_path: Path, machine_env: dict[str, str]) -> None:
    home = tmp_path / "state"
    env = {**machine_env}
    run = agents.run_agents if command == "agents" else doctor.run_doctor
    tty, pipe = Tty(), io.StringIO()
    run(home, env=env, out=tty)
    run(home, env=env, out=pipe)
    assert ANSI.search(tty.getvalue()) or command == "agents"  # an empty machine: one line
    assert not ANSI.search(pipe.getvalue())
    assert plain(tty.getvalue()).split() == pipe.getvalue().split()


def test_agents_json_is_the_rows_byte_for_byte_even_on_a_terminal(
        tmp_path: Path, machine_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agents, "rows", lambda home, env: ROWS)
    out = Tty()
    agents.run_agents(tmp_path, as_json=True, env=machine_env, out=out)
    assert out.getvalue() == json.dumps(ROWS, sort_keys=True) + "\n"
    piped = io.StringIO()
    agents.run_agents(tmp_path, env=machine_env, out=piped)
    assert piped.getvalue() == agents.table(ROWS) + "\n"


def test_rich_and_textual_are_imported_only_by_the_commands_that_draw() -> None:
    probe = ("import sys, crosstalk.cli, crosstalk.cli.agents, crosstalk.cli.doctor, "
             "crosstalk.shim.serve, crosstalk.watch.model, crosstalk.watch.filters, "
             "crosstalk.watch.render; print(sorted(m for m in ('textual', 'crosstalk.watch.app')"
             " if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True, timeout=60)
    assert done.stdout.strip() == "[]"
