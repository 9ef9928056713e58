"""The optional async form of :class:`~crosstalk.harness.base.Discovery`.

A harness whose listing is network I/O (Codex asks each app-server over a socket) offers
``discover_async`` beside the blocking ``discover``. The directory runs it on the event loop
that owns the caller (the shim's), so listing sessions from that loop never starts a loop of
its own; ``crosstalk agents`` (no loop) keeps calling ``discover``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from crosstalk.harness.base import Discovery, Session


@runtime_checkable
class AsyncDiscovery(Discovery, Protocol):
    async def discover_async(self) -> list[Session]:
        """What :meth:`Discovery.discover` returns, awaited on the caller's event loop."""
        ...
