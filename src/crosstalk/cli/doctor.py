"""``crosstalk doctor``: what is installed where, what runs, and what is wrong — each problem
with the command that fixes it. Each harness reports on itself through its plugin; then
CrossTalk's own state: modes, things in the way, descriptors, name locks, journals and uds
keys (:mod:`crosstalk.cli.state_checks`). ``--fix`` applies the fixes that are CrossTalk's own
and lose nothing (stale and damaged descriptors of agents that no longer run, loose
permissions, damaged journal lines moved aside, empty directories in the way); harness
settings are only ever reported.

On a terminal each finding is drawn with ``rich`` (``ok`` green, ``PROBLEM`` red, the fix
beside it); in a pipe or a log the lines are exactly :meth:`Finding.line`'s.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from crosstalk.cli import state_checks
from crosstalk.harness.loader import plugins
from crosstalk.harness.plugin import Finding
from crosstalk.store.registry import DescriptorLiveness, Listed, Registry, Unreadable

__all__ = ["Finding", "diagnose", "run_doctor"]


def _state(home: Path, fix: bool) -> list[Finding]:
    found = state_checks.permissions(home, fix)
    found += state_checks.obstacles(home, fix)
    registry = Registry(home) if fix else Registry.reader(home)
    listed, unreadable = registry.scan()
    found += _descriptors(registry, listed, unreadable, fix)
    found += state_checks.names(registry, listed)
    found += state_checks.journals(home, listed, fix)
    found += state_checks.keys(home, listed, fix)
    live = [i.descriptor for i in listed if i.liveness is DescriptorLiveness.LIVE]
    found.append(Finding(True, f"{len(live)} live CrossTalk agents"))
    return found


def _descriptors(registry: Registry, listed: list[Listed], unreadable: list[Unreadable],
                 fix: bool) -> list[Finding]:
    found = []
    stale = [i.descriptor for i in listed if i.liveness is DescriptorLiveness.STALE]
    if stale and fix:
        removed = registry.sweep_stale()
        found.append(Finding(True, f"removed {len(removed)} stale descriptors"))
    elif stale:
        names = ", ".join(f"{d.name} (pid {d.pid})" for d in stale)
        found.append(Finding(False, f"stale descriptors of agents whose shim is gone: {names}",
                             "crosstalk doctor --fix"))
    for bad in unreadable:
        found += _unreadable(registry, bad, fix)
    return found


def _unreadable(registry: Registry, bad: Unreadable, fix: bool) -> list[Finding]:
    """A descriptor that does not read: its agent may run (invisible, unreachable) or not."""
    try:
        if not stat.S_ISREG(bad.path.lstat().st_mode):
            return []  # a directory or the like: state_checks.obstacles reports it
    except OSError:
        return []  # gone meanwhile
    what = f"unreadable descriptor {bad.path}: {bad.reason}"
    if bad.agent_id is None:
        return [Finding(False, f"{what} (its file name is not an agent id: CrossTalk did not "
                        "write it)", f"rm {bad.path}")]
    if registry.agent_is_held(bad.agent_id):
        return [Finding(False, f"{what}; its agent is live (a process holds its agent lock), "
                        "invisible and unreachable until its shim rewrites it",
                        "wait a few seconds (a shim rewrites its own descriptor); if it stays, "
                        "restart that session's crosstalk mcp")]
    if fix and registry.remove_unreadable(bad):
        return [Finding(True, f"removed {what} (no process holds its agent lock)")]
    return [Finding(False, f"{what}; no process holds its agent lock, so its agent is not "
                    "running", "crosstalk doctor --fix")]


def diagnose(home: Path, env: Mapping[str, str], *, fix: bool = False) -> list[Finding]:
    """What each harness reports about itself (in name order), then CrossTalk's own state."""
    findings: list[Finding] = []
    for plugin in sorted(plugins(), key=lambda p: p.name):
        findings += plugin.doctor(env)
    findings += _state(home, fix)
    return findings


def rich_findings(findings: list[Finding], out: IO[str]) -> None:
    """The findings for a terminal: the same words as the plain lines, in colour. Each is a
    ``Text`` (a path or a name is shown as it is, never read as markup)."""
    from rich.console import Console
    from rich.text import Text

    console = Console(file=out, force_terminal=True, highlight=False, soft_wrap=True)
    for f in findings:
        head = ("ok      ", "green") if f.ok else ("PROBLEM ", "bold red")
        console.print(Text.assemble(head, f.what))
        if f.fix:
            console.print(Text.assemble("        ", ("fix: ", "bold"), (f.fix, "cyan")))
    problems = sum(not f.ok for f in findings)
    console.print(Text(_count(problems), style="bold red" if problems else "bold green"))


def _count(problems: int) -> str:
    return f"{problems} problem{'s' if problems != 1 else ''}"


def run_doctor(home: Path, *, fix: bool = False, env: Mapping[str, str] | None = None,
               out: IO[str] | None = None, terminal: bool | None = None) -> int:
    """``terminal``: draw with rich; by default when ``out`` is a terminal."""
    out = out or sys.stdout
    findings = diagnose(home, os.environ if env is None else env, fix=fix)
    problems = sum(not f.ok for f in findings)
    if out.isatty() if terminal is None else terminal:
        rich_findings(findings, out)
    else:
        for finding in findings:
            print(finding.line(), file=out)
        print(_count(problems), file=out)
    return 1 if problems else 0
