"""Codex: threads identified by ``_meta.threadId`` on every ``tools/call`` (design doc §4.6).

One Codex MCP process may serve several threads (connection pooling), so the thread comes from
each request's own ``_meta``, never from the process. Injection needs the thread's app-server
endpoint (``$CODEX_HOME/app-server-control/app-server-control.sock`` or a recorded one); until
a thread is bound to exactly one endpoint, sending works and inbound is ``unreachable`` with a
reason that says so (seed §3, R11: missing evidence is unreachable).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from crosstalk.core.states import MessageState
from crosstalk.harness.base import Binding, Delivery, Harness, Identity, Outcome

HARNESS = "codex"
_THREAD_ID = re.compile(r"^[0-9A-Za-z][0-9A-Za-z._:-]{0,127}$")


def thread_id_from_meta(meta: Mapping[str, Any] | None) -> str | None:
    """``_meta.threadId``, else ``_meta["x-codex-turn-metadata"].thread_id``; validated."""
    if not meta:
        return None
    candidates: list[object] = [meta.get("threadId")]
    turn = meta.get("x-codex-turn-metadata")
    if isinstance(turn, Mapping):
        candidates.append(turn.get("thread_id"))
    for value in candidates:
        if isinstance(value, str) and _THREAD_ID.fullmatch(value):
            return value
    return None


@dataclass
class UnboundCodexHarness:
    """A thread with no app-server endpoint bound: every injection is a definite refusal."""

    name: str = HARNESS
    reason: str = "codex_thread_not_bound"

    async def inject(self, binding: Binding, delivery: Delivery) -> Outcome:
        return Outcome(MessageState.UNREACHABLE, self.reason)


@dataclass
class CodexIdentifier:
    name: str = HARNESS
    cwd: str = field(default_factory=os.getcwd)
    harnesses: dict[str, Harness] = field(default_factory=dict)

    def identify(self, meta: Mapping[str, Any] | None) -> Identity | None:
        thread = thread_id_from_meta(meta)
        if thread is None:
            return None
        return Identity(HARNESS, thread, self.cwd)

    def harness_for(self, identity: Identity) -> Harness:
        harness = self.harnesses.get(identity.session_ref)
        if harness is None:
            harness = UnboundCodexHarness()
            self.harnesses[identity.session_ref] = harness
        return harness
