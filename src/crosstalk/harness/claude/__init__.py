"""Claude Code: sessions bound by the shim's parent pid, messages put into its inbox socket.

:mod:`.harness` (the session and its identifier), :mod:`.injector` (frame, pacing,
receipts), :mod:`.registry` (its session records), :mod:`.inbox`, :mod:`.receipts`,
:mod:`.mode` (permission modes), :mod:`.gate` and :mod:`.helper` (the detached
writer that lets Claude's own inbound gate decide, ADR 0020).

The names below resolve on first access (ADR 0034): a shim loads this package for its
entry point, which needs none of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from crosstalk._lazy import by_module, exports

if TYPE_CHECKING:
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

__getattr__ = exports(__name__, by_module({
    "crosstalk.harness.claude.harness": (
        "HARNESS", "ClaudeHarness", "ClaudeIdentifier", "SenderMode", "identity_of", "on_control",
        "session_row",
    ),
    "crosstalk.harness.claude.injector": (
        "MAX_ATTEMPTS", "RECEIPT_GRACE", "RETRY_AFTER_DROP", "Injector", "deliver_to_session",
        "priority_for", "render",
    ),
}), globals())

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
