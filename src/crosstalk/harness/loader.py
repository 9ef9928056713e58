"""The one list of harnesses: the ``crosstalk.harnesses`` entry-point group.

Claude, Codex and the fake harness register there exactly as a third party would (see
``pyproject.toml``); nothing else in CrossTalk lists harnesses. The list is read once per
process (installed distributions do not change under a running command) and sorted by trust
order, then name. An entry that does not load, or names no :class:`HarnessPlugin`, is logged
and skipped: one broken harness must not take the others down.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from pathlib import Path

from crosstalk.harness.base import Discovery, Identifier
from crosstalk.harness.plugin import HarnessPlugin, ShimContext

log = logging.getLogger(__name__)

GROUP = "crosstalk.harnesses"


@functools.cache
def plugins() -> tuple[HarnessPlugin, ...]:
    """Every registered harness, in trust order (the order identifiers are asked in)."""
    from importlib.metadata import entry_points

    found: dict[str, HarnessPlugin] = {}
    for point in entry_points(group=GROUP):
        try:
            plugin = point.load()
        except Exception:
            log.exception("harness %s (%s) did not load", point.name, point.value)
            continue
        if not isinstance(plugin, HarnessPlugin):
            log.warning("harness %s (%s) is not a HarnessPlugin", point.name, point.value)
            continue
        found.setdefault(plugin.name, plugin)
    return tuple(sorted(found.values(), key=lambda p: (p.trust, p.name)))


def identifiers(ctx: ShimContext) -> list[Identifier]:
    """The identifiers a shim in ``ctx`` asks, in trust order."""
    return [i for p in plugins() if (i := p.identifier(ctx)) is not None]


def discoveries(env: Mapping[str, str]) -> list[Discovery]:
    """Every harness whose sessions can be listed without a shim."""
    return [p.discovery(env) for p in plugins() if p.discovery is not None]


def by_name(name: str) -> HarnessPlugin | None:
    return next((p for p in plugins() if p.name == name), None)


def socket_dir(env: Mapping[str, str]) -> Path | None:
    """Where agents' uds ingresses should live for the harnesses to accept their addresses
    (the first harness, in trust order, that requires a directory), else ``None``."""
    return next((p.socket_dir(env) for p in plugins() if p.socket_dir is not None), None)
