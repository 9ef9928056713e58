"""Claude Code's entry in the ``crosstalk.harnesses`` group: ``claude.plugin:plugin``."""

from __future__ import annotations

from collections.abc import Mapping

from crosstalk.harness.base import Discovery, Identifier
from crosstalk.harness.claude import setup
from crosstalk.harness.claude.harness import HARNESS, ClaudeIdentifier
from crosstalk.harness.plugin import HarnessPlugin, ShimContext


def _identifier(ctx: ShimContext) -> Identifier:
    """The shim's parent's session, in any config root; it also lists Claude sessions."""
    return ClaudeIdentifier.for_parent(ctx.env, ctx.ppid, cwd=ctx.cwd,
                                       lookup=ctx.live_descriptor)


def _discovery(env: Mapping[str, str]) -> Discovery:
    return ClaudeIdentifier([], env=dict(env))


#: After Codex in trust order: its evidence is the process tree plus the record, so a call
#: from a Codex thread (which carries ``_meta.threadId``) is never taken for Claude's.
plugin = HarnessPlugin(
    name=HARNESS, trust=20, identifier=_identifier, discovery=_discovery,
    install=setup.install_entries, doctor=setup.doctor, why_unreachable=setup.why_unreachable,
    hints=setup.SEND_HINTS, socket_dir=setup.claude_socket_dir)
