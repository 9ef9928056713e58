"""``crosstalk doctor``: what is installed where, what runs, and what is wrong — each problem
with the command that fixes it. Each harness reports on itself through its plugin; then
CrossTalk's own state. ``--fix`` applies the fixes that are CrossTalk's own (stale
descriptors, loose permissions); harness settings are only ever reported.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from crosstalk.harness.loader import plugins
from crosstalk.harness.plugin import Finding
from crosstalk.store.registry import DescriptorLiveness, Registry

__all__ = ["Finding", "diagnose", "run_doctor"]


def _state(home: Path, fix: bool) -> list[Finding]:
    found = []
    loose = []
    for path in [home, home / "agents", home / "journal", home / "credentials"]:
        if path.exists() and stat.S_IMODE(path.stat().st_mode) & 0o077:
            loose.append(path)
    for path in list((home / "credentials").glob("*.token")):
        if stat.S_IMODE(path.stat().st_mode) & 0o077:
            loose.append(path)
    if loose and fix:
        for path in loose:
            path.chmod(0o700 if path.is_dir() else 0o600)
        found.append(Finding(True, f"permissions tightened on {len(loose)} paths"))
    elif loose:
        found.append(Finding(False, "state readable by others: " + ", ".join(map(str, loose)),
                             "crosstalk doctor --fix"))
    else:
        found.append(Finding(True, f"state directory {home} is private"))
    registry = Registry(home) if fix else Registry.reader(home)
    listed, unreadable = registry.scan()
    stale = [i.descriptor for i in listed if i.liveness is DescriptorLiveness.STALE]
    if stale and fix:
        removed = registry.sweep_stale()
        found.append(Finding(True, f"removed {len(removed)} stale descriptors"))
    elif stale:
        names = ", ".join(f"{d.name} (pid {d.pid})" for d in stale)
        found.append(Finding(False, f"stale descriptors of agents whose shim is gone: {names}",
                             "crosstalk doctor --fix"))
    for bad in unreadable:
        found.append(Finding(False, f"unreadable descriptor {bad.path}: {bad.reason}",
                             f"rm {bad.path}"))
    live = [i.descriptor for i in listed if i.liveness is DescriptorLiveness.LIVE]
    found.append(Finding(True, f"{len(live)} live CrossTalk agents"))
    return found


def diagnose(home: Path, env: Mapping[str, str], *, fix: bool = False) -> list[Finding]:
    """What each harness reports about itself (in name order), then CrossTalk's own state."""
    findings: list[Finding] = []
    for plugin in sorted(plugins(), key=lambda p: p.name):
        findings += plugin.doctor(env)
    findings += _state(home, fix)
    return findings


def run_doctor(home: Path, *, fix: bool = False, env: Mapping[str, str] | None = None,
               out: IO[str] | None = None) -> int:
    out = out or sys.stdout
    findings = diagnose(home, os.environ if env is None else env, fix=fix)
    for finding in findings:
        print(finding.line(), file=out)
    problems = sum(not f.ok for f in findings)
    print(f"{problems} problem{'s' if problems != 1 else ''}", file=out)
    return 1 if problems else 0
