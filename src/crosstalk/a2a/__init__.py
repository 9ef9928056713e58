"""CrossTalk's A2A layer: each agent is a first-class A2A 1.0 agent (seed §5 "A2A ingress").

- :mod:`crosstalk.a2a.server` — the per-agent endpoint on the official ``a2a-sdk`` JSON-RPC
  binding and uvicorn; it drives the one receiver chain. Its parts:
  :mod:`~crosstalk.a2a.asgi` (app, auth, body cap, listener), :mod:`~crosstalk.a2a.handler`
  (the A2A methods), :mod:`~crosstalk.a2a.control` (claim/release answers),
  :mod:`~crosstalk.a2a.errors` (refusals), :mod:`~crosstalk.a2a.tasks` (the task book).
- :mod:`crosstalk.a2a.taskstore` — the journal-backed task store (seed S12).
- :mod:`crosstalk.a2a.client` — how a shim sends to a peer, on the SDK's own client.
- :mod:`crosstalk.a2a.transport` — the pooled HTTP transport it sends on, and the one repeat
  on a fresh connection for a request that got no response.
- :mod:`crosstalk.a2a.wire` — the ``crosstalk.*`` metadata both sides speak.

The names below resolve on first access (ADR 0034): an agent serves with the server side
only, and the client side (httpx, the SDK's client and transports) loads with its first send.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from crosstalk._lazy import by_module, exports

if TYPE_CHECKING:
    from crosstalk.a2a.client import SendResult, cancel_task, get_task, send
    from crosstalk.a2a.errors import rejected_error
    from crosstalk.a2a.server import A2AServer
    from crosstalk.a2a.taskstore import JournalTaskStore, StoredTask

__getattr__ = exports(__name__, by_module({
    "crosstalk.a2a.client": ("SendResult", "cancel_task", "get_task", "send"),
    "crosstalk.a2a.errors": ("rejected_error",),
    "crosstalk.a2a.server": ("A2AServer",),
    "crosstalk.a2a.taskstore": ("JournalTaskStore", "StoredTask"),
}), globals())

__all__ = [
    "A2AServer",
    "JournalTaskStore",
    "SendResult",
    "StoredTask",
    "cancel_task",
    "get_task",
    "rejected_error",
    "send",
]
