"""Who a bearer token belongs to: the one live registered agent holding it (seed §5).

Apart from the ASGI app (:mod:`crosstalk.a2a.asgi`), which loads the SDK's server stack
with an agent's first A2A connection (ADR 0044); an agent verifies tokens from its start.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from typing import Final

from crosstalk.core.message import Ingress, Sender
from crosstalk.core.policy import PRIMARY, SUBAGENT
from crosstalk.store.registry import Descriptor, Registry

_TOKEN_CACHE_SECONDS: Final = 1.0
_MAX_TOKEN_LEN: Final = 512


class BearerTokens:
    """Maps a bearer token to the one live registered agent it belongs to (seed §5).

    A verified token is cached for a second (the registry lookup reads descriptors from disk),
    then verified again, its agent first; the cache is keyed by the token's hash, never the
    token.
    """

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._cache: dict[str, tuple[float, Descriptor]] = {}

    def authenticate(self, authorization: Sequence[str]) -> Sender | None:
        """The verified sender for an ``Authorization`` header, or ``None``."""
        if len(authorization) != 1:
            return None
        scheme, _, token = authorization[0].strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token or len(token) > _MAX_TOKEN_LEN:
            return None
        key = hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()
        now = time.monotonic()
        cached = self._cache.get(key)
        if cached is not None and cached[0] > now:
            desc: Descriptor | None = cached[1]
        else:
            # An expired entry still names the agent to verify first (Registry.agent_for_token).
            hint = cached[1].agent_id if cached is not None else None
            try:
                desc = self.registry.agent_for_token(token, hint=hint)
            except (OSError, ValueError):
                desc = None
            if desc is None:
                self._cache.pop(key, None)
            else:
                if len(self._cache) > 64:
                    self._cache.clear()
                self._cache[key] = (now + _TOKEN_CACHE_SECONDS, desc)
        if desc is None:
            return None
        role = desc.role
        if role == SUBAGENT and self.registry.live_owner(desc.owner) is None:
            role = PRIMARY  # its owner is gone: nobody holds the claim (Registry.live_owner)
        return Sender(agent_id=desc.agent_id, name=desc.name, role=role, ingress=Ingress.A2A)
