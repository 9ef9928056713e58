"""Listing opencode sessions on this machine, and informing those without CrossTalk (issue 14
item 6; research §3).

Every live instance record (pid + start time + socket, :mod:`.records`) whose socket answers
as opencode (``/global/health``) is asked, read-only, for its root sessions
(``GET /session?roots=true``), which are busy (``GET /session/status``) and which wait for a
permission (``GET /permission``: listed only, never answered). opencode lists every *stored*
session of the project; a session is shown only if it is busy, waiting, or was updated after
the instance's record was written (used by this process). A session that has a CrossTalk
agent is matched to it by the directory (``crosstalk: true``); the rest are listed
``crosstalk: false`` and receive informs through the sender's shim (:meth:`send_native`,
injected exactly as an agent's own inbound).

Listing is network I/O: :meth:`OpencodeDiscovery.discover_async` runs on the caller's loop,
and each instance is asked with short timeouts so a hung one cannot stall ``list_agents``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from crosstalk.core.states import MessageState
from crosstalk.harness.base import Delivery, Outcome, Session
from crosstalk.harness.opencode.harness import HARNESS, inject_at
from crosstalk.harness.opencode.http import Instance, OpencodeError
from crosstalk.harness.opencode.records import (
    InstanceRecord,
    RecordError,
    check_live,
    live_records,
    read_record,
)
from crosstalk.harness.opencode.sessions import SESSION_ID, session_name

log = logging.getLogger(__name__)

#: Per instance, for the whole listing: list_agents must not wait on a hung instance.
DISCOVERY_TIMEOUT: Final = 3.0
MAX_SESSIONS: Final = 200


def _status(kind: object, waiting: bool) -> str:
    """idle (absent from ``/session/status``), busy (busy or retry), waiting (a pending
    permission; opencode keeps such a session ``busy``, research §5)."""
    if waiting:
        return "waiting"
    if kind is None:
        return "idle"
    return "busy" if kind in ("busy", "retry") else "unknown"


def session_rows(record: InstanceRecord, sessions: Any, status: Any,
                 permissions: Any) -> list[Session]:
    """The instance's live root sessions as directory rows (pure: the three answers in)."""
    busy = status if isinstance(status, dict) else {}
    waiting: dict[str, str] = {}
    for perm in permissions if isinstance(permissions, list) else []:
        if isinstance(perm, dict) and isinstance(perm.get("sessionID"), str):
            waiting[perm["sessionID"]] = str(perm.get("permission") or "permission")[:64]
    since_ms = record.written_ms
    rows: list[Session] = []
    for info in sessions if isinstance(sessions, list) else []:
        if not isinstance(info, dict) or info.get("parentID"):
            continue
        sid = info.get("id")
        if not isinstance(sid, str) or not SESSION_ID.fullmatch(sid):
            continue
        times = info.get("time")
        updated = times.get("updated") if isinstance(times, dict) else None
        used = isinstance(updated, (int, float)) and updated >= since_ms
        state = busy.get(sid)
        kind = state.get("type") if isinstance(state, dict) else None
        if not (used or kind is not None or sid in waiting):
            continue  # stored, not run by this process
        directory = info.get("directory")
        if isinstance(directory, str) and directory != record.directory:
            continue  # the same project opened elsewhere: that instance hosts it
        rows.append(Session(
            HARNESS, sid, session_name(info),
            record.directory,
            _status(kind, sid in waiting), reachable=True, pid=record.pid,
            locator=record.path, detail=waiting.get(sid)))
        if len(rows) >= MAX_SESSIONS:
            break
    return rows


async def instance_sessions(record: InstanceRecord,
                            env: Mapping[str, str] | None = None) -> list[Session]:
    """One instance's rows; an instance that does not answer as opencode gives none."""
    async with Instance(record.socket, env=env, timeout=DISCOVERY_TIMEOUT) as api:
        await api.health()
        params = {"roots": "true", "limit": str(MAX_SESSIONS)}
        sessions, status, permissions = await asyncio.gather(
            api.get("/session", params), api.get("/session/status"),
            api.get("/permission"))
    return session_rows(record, sessions, status, permissions)


@dataclass
class OpencodeDiscovery:
    env: Mapping[str, str] = field(default_factory=dict)
    name: str = HARNESS
    #: One process hosts many sessions: a session is never evidence against another.
    supersession: bool = False

    def discover(self) -> list[Session]:
        """For a caller without an event loop (``crosstalk agents``)."""
        return asyncio.run(self.discover_async())

    async def discover_async(self) -> list[Session]:
        records = await asyncio.to_thread(live_records, self.env)
        found = await asyncio.gather(*(self._one(r) for r in records))
        return [row for rows in found for row in rows]

    async def _one(self, record: InstanceRecord) -> list[Session]:
        try:
            return await asyncio.wait_for(instance_sessions(record, self.env),
                                          DISCOVERY_TIMEOUT)
        except (OpencodeError, TimeoutError) as exc:
            log.info("opencode instance %s: not listed (%s)", record.path,
                     getattr(exc, "reason", "timeout"))
            return []

    async def send_native(self, session: Session, delivery: Delivery) -> Outcome:
        """Inject into a session without CrossTalk, through the instance that listed it."""
        if session.locator is None:
            return Outcome(MessageState.UNREACHABLE, "opencode_instance_gone:no_record")
        try:
            record = await asyncio.to_thread(_live, session.locator)
        except RecordError as exc:
            return Outcome(MessageState.UNREACHABLE, f"opencode_instance_gone:{exc.reason}")
        return await inject_at(record.socket, session.session_ref, delivery, env=self.env)


def _live(path: str) -> InstanceRecord:
    record = read_record(Path(path))
    check_live(record)
    return record
