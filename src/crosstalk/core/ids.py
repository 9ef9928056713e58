"""Identifiers: agent ids derived from the session, message ids that sort by time."""

from __future__ import annotations

import hashlib
import re

import uuid_utils

AGENT_ID_HEX = 16
AGENT_ID_RE = re.compile(r"^[0-9a-f]{16}$")


def agent_id_for(harness: str, session_ref: str) -> str:
    """First 16 hex of sha256(``<harness>:<session_ref>``).

    Hashing the *whole* session_ref keeps ids distinct even when session ids share long
    prefixes (Codex thread ids minted in the same millisecond do), and makes the id stable for
    the session's lifetime, whatever the session is named.
    """
    if not harness or ":" in harness:
        raise ValueError(f"invalid harness name {harness!r}")
    if not session_ref:
        raise ValueError("session_ref must not be empty")
    digest = hashlib.sha256(f"{harness}:{session_ref}".encode()).hexdigest()
    return digest[:AGENT_ID_HEX]


def is_agent_id(value: str) -> bool:
    return bool(AGENT_ID_RE.fullmatch(value))


def new_message_id() -> str:
    """A UUIDv7 string: unique, and ordered by creation time (useful in journals and cursors)."""
    return str(uuid_utils.uuid7())


def new_instance_id() -> str:
    """A fresh id for one registration of an agent (seed §3 ``instance_id``)."""
    return str(uuid_utils.uuid7())
