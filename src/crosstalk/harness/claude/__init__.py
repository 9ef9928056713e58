"""Claude Code: sessions bound by the shim's parent pid, messages put into its inbox socket.

:mod:`.harness` (the session and its identifier), :mod:`.injector` (frame, pacing,
receipts), :mod:`.registry` (its session records), :mod:`.inbox`, :mod:`.receipts`,
:mod:`.mode` (permission modes), :mod:`.gate` and :mod:`.helper` (the detached
writer that lets Claude's own inbound gate decide, ADR 0020).
"""

from crosstalk.harness.claude.harness import (
    HARNESS,
    ClaudeHarness,
    ClaudeIdentifier,
    SenderMode,
    identity_of,
    on_control,
    session_row,
)
from crosstalk.harness.claude.injector import (
    MAX_ATTEMPTS,
    RECEIPT_GRACE,
    RETRY_AFTER_DROP,
    Injector,
    deliver_to_session,
    priority_for,
    render,
)

__all__ = [
    "HARNESS",
    "MAX_ATTEMPTS",
    "RECEIPT_GRACE",
    "RETRY_AFTER_DROP",
    "ClaudeHarness",
    "ClaudeIdentifier",
    "Injector",
    "SenderMode",
    "deliver_to_session",
    "identity_of",
    "on_control",
    "priority_for",
    "render",
    "session_row",
]
