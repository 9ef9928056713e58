"""The hop-chain guard (seed §4, R15): A2A only, since native frames are never forwarded.

Chains use Claude's convention: 24-hex sha256 prefixes, at most 32 entries. A chain that
already holds the receiver's own token is a loop; a longer one is runaway.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

MAX_HOPS = 32
_TOKEN_RE = re.compile(r"^[0-9a-f]{24}$")


def hop_token(agent_id: str) -> str:
    """This agent's entry in a hop chain."""
    return hashlib.sha256(f"crosstalk-hop:{agent_id}".encode()).hexdigest()[:24]


def check_hop_chain(chain: Sequence[str], receiver_token: str) -> str | None:
    """``None`` if the chain may be accepted, else the rejection reason."""
    if len(chain) > MAX_HOPS:
        return "hop_chain_too_long"
    if any(not isinstance(t, str) or not _TOKEN_RE.fullmatch(t) for t in chain):
        return "hop_chain_malformed"
    if receiver_token in chain or len(set(chain)) != len(chain):
        return "hop_chain_loop"
    return None
