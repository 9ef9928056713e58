"""Codex: threads identified by ``_meta.threadId`` on every ``tools/call`` (design doc §4.6).

:mod:`.identifier` (which thread a call is from, its host, discovery), :mod:`.harness`
(injection through the app-server that has the thread loaded, ``codex queue`` otherwise),
:mod:`.appserver` (the app-server's WebSocket JSON-RPC), :mod:`.setup` (paths, install).
"""

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
