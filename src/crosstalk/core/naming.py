"""The naming rule (seed §3, CQ8): which names an agent tries, in order.

An agent takes its harness session name if that name is free, else
``<harness>-<cwd basename>-<first 8 hex of agent_id>``, extending the suffix two hex digits at a
time while the shorter one is taken. Which names are *taken* is decided by whoever holds the
name locks (``store.registry``); this module only produces the candidates, so it stays pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from crosstalk.core.ids import AGENT_ID_HEX, is_agent_id

MAX_NAME_LEN = 64
FALLBACK_MIN_HEX = 8
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_BAD_CHARS = re.compile(r"[^A-Za-z0-9._-]+")


def is_valid_name(name: str) -> bool:
    """Names become lock-file names, so they are restricted to a filename-safe alphabet.

    A name shaped like an agent id is refused too: ``to`` accepts both, and one string must
    never mean two agents.
    """
    return bool(_NAME_RE.fullmatch(name)) and not is_agent_id(name)


def normalize_name(raw: str | None) -> str | None:
    """Map a harness-supplied name onto the safe alphabet, or ``None`` if nothing usable is left.

    Harness names are user text ("my work / fixes"); they must never be able to escape the
    names directory or collide with an agent id.
    """
    if raw is None:
        return None
    name = _BAD_CHARS.sub("-", raw.strip()).strip("-._")
    name = name[:MAX_NAME_LEN].rstrip("-._")
    if not name or not is_valid_name(name):
        return None
    return name


def fallback_name(harness: str, cwd: str, agent_id: str, hex_digits: int = FALLBACK_MIN_HEX) -> str:
    """``<harness>-<cwd basename>-<hex_digits of agent_id>``, trimmed to fit ``MAX_NAME_LEN``."""
    if not is_agent_id(agent_id):
        raise ValueError(f"not an agent id: {agent_id!r}")
    if not FALLBACK_MIN_HEX <= hex_digits <= AGENT_ID_HEX:
        raise ValueError(f"hex_digits must be {FALLBACK_MIN_HEX}..{AGENT_ID_HEX}")
    base = cwd.rstrip("/").rsplit("/", 1)[-1]
    base = _BAD_CHARS.sub("-", base).strip("-._") or "root"
    head = _BAD_CHARS.sub("-", harness).strip("-._") or "agent"
    # Cap the harness part too (a fixed cap, so it is the same for every suffix length): with
    # only the cwd part trimmed, a long harness label produced names over MAX_NAME_LEN, which
    # is_valid_name rejects and the registry refuses as lock-file names.
    head = head[: MAX_NAME_LEN - AGENT_ID_HEX - 3].rstrip("-._") or "agent"
    suffix = agent_id[:hex_digits]
    room = MAX_NAME_LEN - len(head) - len(suffix) - 2
    base = base[: max(room, 1)].rstrip("-._") or "x"
    return f"{head}-{base}-{suffix}"


def name_candidates(
    harness: str, cwd: str, agent_id: str, session_name: str | None
) -> Iterator[str]:
    """Every name the agent may take, best first; the caller takes the first free one.

    The list is finite: once the whole 16-hex agent_id is the suffix, the name is unique to the
    session (two live registrations of one session are already excluded by the agent lock).
    """
    seen: set[str] = set()
    preferred = normalize_name(session_name)
    if preferred is not None:
        seen.add(preferred)
        yield preferred
    for digits in range(FALLBACK_MIN_HEX, AGENT_ID_HEX + 1, 2):
        name = fallback_name(harness, cwd, agent_id, digits)
        if name not in seen:
            seen.add(name)
            yield name
