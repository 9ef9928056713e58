"""Codex: threads identified by ``_meta.threadId`` on every ``tools/call`` (design doc §4.6).

:mod:`.identifier` (which thread a call is from, its host, discovery), :mod:`.harness`
(injection through the app-server that has the thread loaded, ``codex queue`` otherwise),
:mod:`.appserver` (the app-server's WebSocket JSON-RPC), :mod:`.setup` (paths, install).

The names below resolve on first access (ADR 0034): a shim loads this package for its
entry point, which needs none of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from crosstalk._lazy import by_module, exports

if TYPE_CHECKING:
    from crosstalk.harness.codex.harness import (
        DISCOVERY_TIMEOUT,
        HARNESS,
        MAX_THREADS,
        QUEUE_TIMEOUT,
        CodexHarness,
        durable_queue,
        find_codex,
        hosts,
        inject_into,
        inject_on,
        loaded_threads,
        render,
        thread_id_from_meta,
    )
    from crosstalk.harness.codex.identifier import CodexIdentifier
    from crosstalk.harness.codex.setup import control_socket

__getattr__ = exports(__name__, by_module({
    "crosstalk.harness.codex.harness": (
        "DISCOVERY_TIMEOUT", "HARNESS", "MAX_THREADS", "QUEUE_TIMEOUT", "CodexHarness",
        "durable_queue", "find_codex", "hosts", "inject_into", "inject_on", "loaded_threads",
        "render", "thread_id_from_meta",
    ),
    "crosstalk.harness.codex.identifier": ("CodexIdentifier",),
    "crosstalk.harness.codex.setup": ("control_socket",),
}), globals())

__all__ = [
    "DISCOVERY_TIMEOUT",
    "HARNESS",
    "MAX_THREADS",
    "QUEUE_TIMEOUT",
    "CodexHarness",
    "CodexIdentifier",
    "control_socket",
    "durable_queue",
    "find_codex",
    "hosts",
    "inject_into",
    "inject_on",
    "loaded_threads",
    "render",
    "thread_id_from_meta",
]
