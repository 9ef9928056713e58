"""Codex's entry in the ``crosstalk.harnesses`` group: ``codex.plugin:plugin``."""

from __future__ import annotations

from collections.abc import Mapping

from crosstalk.harness.base import Discovery, Identifier
from crosstalk.harness.codex import setup
from crosstalk.harness.codex.harness import HARNESS
from crosstalk.harness.codex.identifier import CodexIdentifier
from crosstalk.harness.plugin import HarnessPlugin, ShimContext


def _identifier(ctx: ShimContext) -> Identifier:
    return CodexIdentifier(cwd=ctx.cwd, env=dict(ctx.env),
                           recorded_endpoints=lambda: ctx.recorded_endpoints(HARNESS))


def _discovery(env: Mapping[str, str]) -> Discovery:
    return CodexIdentifier(env=dict(env))


#: First in trust order: every call from a Codex thread names its thread in ``_meta``.
plugin = HarnessPlugin(
    name=HARNESS, trust=10, identifier=_identifier, discovery=_discovery,
    install=setup.install_entries, doctor=setup.doctor, why_unreachable=setup.why_unreachable)
