"""What a shim serves, built from its environment: the registry, the harnesses' identifiers
(the ``crosstalk.harnesses`` entry points, in trust order), the roster and the tools.

:mod:`.serve` imports this module only once the first ``tools/list`` is answered (ADR 0043):
the registry, the directory and every harness plugin load here, and none of them is needed
to list the tools.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from crosstalk.harness.loader import identifiers
from crosstalk.harness.plugin import ShimContext
from crosstalk.shim.roster import Shim
from crosstalk.shim.tools import Tools
from crosstalk.store.registry import Registry


def shim_context(env: dict[str, str], ppid: int, registry: Registry) -> ShimContext:
    """What the harnesses' identifiers are built from in this process."""
    return ShimContext(env=env, ppid=ppid, cwd=os.getcwd(),
                       live_descriptor=registry.live_descriptor,
                       recorded_endpoints=_RecordedEndpoints(registry))


@dataclass
class _RecordedEndpoints:
    """Harness endpoints that live agents were bound to (Codex's app-servers, seed CQ10), by
    harness. Cached for a moment: every list_agents and delivery asks, and each answer is a
    registry scan."""

    registry: Registry
    ttl: float = 2.0
    _at: float = float("-inf")
    _found: dict[str, list[str]] = field(default_factory=dict)

    def __call__(self, harness: str) -> list[str]:
        now = time.monotonic()
        if now - self._at > self.ttl:
            found: dict[str, list[str]] = {}
            for d in self.registry.live():
                if d.harness_endpoint:
                    found.setdefault(d.harness, []).append(d.harness_endpoint)
            self._at, self._found = now, found
        return list(self._found.get(harness, ()))


def build_shim(env: dict[str, str], ppid: int, home: Path) -> tuple[Shim, Tools]:
    """The roster of the sessions this process serves, and the tools that act for them;
    ``home`` is the state directory, already made private."""
    registry = Registry(home)
    shim = Shim(registry, identifiers(shim_context(env, ppid, registry)), env=env)
    return shim, Tools(shim)
