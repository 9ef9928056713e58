"""CrossTalk: any AI coding-agent session on this machine can message any other by name.

The package is layered the way h11 and hypercorn are: ``crosstalk.core`` is pure logic (no I/O),
``crosstalk.store`` is the durable state on disk (journal, registry), ``crosstalk.proc`` answers
questions about processes and sockets, and everything that speaks a wire protocol sits on top.

The names below are resolved on first access (PEP 562), not at import: every ``crosstalk.*``
import runs this file, and a shim's start must not pay for the journal (ADR 0033).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from crosstalk._lazy import exports
from crosstalk._version import __version__

# The a2a-sdk wraps its client and server methods in OpenTelemetry spans whenever the API is
# importable (the MCP SDK brings it), recorded by nobody here: ~5 % of the calls an A2A message
# costs its two ends. Off unless the user asks for it (ADR 0047); read once, at its import.
os.environ.setdefault("OTEL_INSTRUMENTATION_A2A_SDK_ENABLED", "false")

if TYPE_CHECKING:
    from crosstalk.core.ids import agent_id_for, new_message_id
    from crosstalk.core.naming import fallback_name, name_candidates
    from crosstalk.store.journal import Journal, JournalError
    from crosstalk.store.journal_read import Replay
    from crosstalk.store.registry import Descriptor, Registration, Registry

_WHERE = {
    "agent_id_for": "crosstalk.core.ids", "new_message_id": "crosstalk.core.ids",
    "fallback_name": "crosstalk.core.naming", "name_candidates": "crosstalk.core.naming",
    "Journal": "crosstalk.store.journal", "JournalError": "crosstalk.store.journal",
    "Replay": "crosstalk.store.journal_read",
    "Descriptor": "crosstalk.store.registry", "Registration": "crosstalk.store.registry",
    "Registry": "crosstalk.store.registry",
}


__getattr__ = exports(__name__, _WHERE, globals())

__all__ = [
    "Descriptor",
    "Journal",
    "JournalError",
    "Registration",
    "Registry",
    "Replay",
    "__version__",
    "agent_id_for",
    "fallback_name",
    "name_candidates",
    "new_message_id",
]
