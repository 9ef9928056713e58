"""Which root sessions of one opencode instance are live, from its event stream (issue 14
item 4; research §5).

opencode keeps every session it ever had (``GET /session`` lists the stored ones, newest
first), so being stored proves nothing about being *run* here. A session is live once this
instance shows it created or used: ``session.created``, ``session.status``,
``message.updated`` or ``message.part.updated`` for it, or, when the stream opens, busy
(``GET /session/status``) or updated since the instance's record was written. It stops
being live on ``session.deleted``, or when it is gone from the instance (404) after the
stream reconnects. Sub-agent sessions (the task tool's, ``parentID`` set) are never agents;
a call from one is bound to its root session.

Names follow the seed's naming rule from the session's ``title``, or its ``slug`` while the
title is still opencode's placeholder (``New session - <date>``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from crosstalk.harness.opencode.http import HTTPStatus, Instance

log = logging.getLogger(__name__)

SESSION_ID: Final = re.compile(r"^ses_[0-9A-Za-z]{1,64}$")
_PLACEHOLDER: Final = re.compile(r"^(New session|Child session) - \d{4}-")
#: The events that show a session used in this instance.
_USE: Final = frozenset({"session.created", "session.status", "session.idle",
                         "message.updated", "message.part.updated", "permission.asked"})
#: An instance with more root sessions than this live at once is not one we can serve.
MAX_TRACKED: Final = 1024


def session_name(info: Mapping[str, Any]) -> str | None:
    """The title, unless it is opencode's placeholder; then the slug."""
    title, slug = info.get("title"), info.get("slug")
    if isinstance(title, str) and title.strip() and not _PLACEHOLDER.match(title):
        return title
    return slug if isinstance(slug, str) and slug else None


def _session_of(event: Mapping[str, Any]) -> str | None:
    props = event.get("properties")
    if not isinstance(props, dict):
        return None
    sid = props.get("sessionID")
    if sid is None:
        info, part = props.get("info"), props.get("part")
        sid = (info.get("sessionID") or info.get("id") if isinstance(info, dict)
               else part.get("sessionID") if isinstance(part, dict) else None)
    return sid if isinstance(sid, str) and SESSION_ID.fullmatch(sid) else None


@dataclass
class LiveSet:
    """The live root sessions of one instance, and what is known of the others seen."""

    #: session id -> its name (``None``: no usable title or slug yet).
    live: dict[str, str | None] = field(default_factory=dict)
    #: sub-agent session id -> its parent.
    children: dict[str, str] = field(default_factory=dict)
    #: The instance's directory, once known. opencode lists and reports sessions per
    #: *project*, and every directory of one repository is one project (its root commit):
    #: a session of another directory is another instance's, hosted by whichever process
    #: opened that directory, and must never be served (or injected) through this one.
    directory: str | None = None

    def root_of(self, session_id: str) -> str:
        seen = {session_id}
        while session_id in self.children:
            session_id = self.children[session_id]
            if session_id in seen:  # a cycle is not opencode's; stop at the repeat
                break
            seen.add(session_id)
        return session_id

    def knows(self, session_id: str) -> bool:
        """Whether the session is known here: live, or a sub-agent whose parent is known."""
        return session_id in self.live or session_id in self.children

    def learn(self, info: Mapping[str, Any]) -> bool:
        """Take a session's info (from an event or ``GET /session/{id}``); True if the set
        changed."""
        sid = info.get("id")
        if not isinstance(sid, str) or not SESSION_ID.fullmatch(sid):
            return False
        if not self.ours(info):
            return False
        parent = info.get("parentID")
        if isinstance(parent, str) and parent:
            self.children[sid] = parent
            return self.live.pop(sid, None) is not None
        name = session_name(info)
        if sid in self.live and self.live[sid] == name:
            return False
        if sid not in self.live and len(self.live) >= MAX_TRACKED:
            log.warning("opencode instance has over %d live sessions; %s not tracked",
                        MAX_TRACKED, sid)
            return False
        self.live[sid] = name
        return True

    def ours(self, info: Mapping[str, Any]) -> bool:
        """Whether a session's info names this instance's directory (or no directory)."""
        where = info.get("directory")
        return self.directory is None or not isinstance(where, str) or where == self.directory

    def forget(self, session_id: str) -> bool:
        self.children.pop(session_id, None)
        return self.live.pop(session_id, None) is not None

    async def apply(self, api: Instance, event: Mapping[str, Any]) -> bool:
        """Follow one event; True if the live set changed. A session not yet known is read
        (``GET /session/{id}``) to learn its parent and title."""
        kind = event.get("type")
        props = event.get("properties")
        if kind == "session.deleted":
            sid = _session_of(event)
            return sid is not None and self.forget(sid)
        if kind in ("session.created", "session.updated") and isinstance(props, dict):
            info = props.get("info")
            if isinstance(info, dict):
                if kind == "session.updated" and info.get("id") not in self.live:
                    return False  # a stored session edited elsewhere is not used here
                return self.learn(info)
        if kind not in _USE:
            return False
        sid = _session_of(event)
        if sid is None or self.knows(sid):
            return False
        return await self.read(api, sid)

    async def read(self, api: Instance, session_id: str) -> bool:
        try:
            info = await api.get(f"/session/{session_id}")
        except HTTPStatus as exc:
            if exc.status == 404:
                return self.forget(session_id)
            raise
        return isinstance(info, dict) and self.learn(info)

    async def recheck(self, api: Instance, since_ms: int | None = None) -> bool:
        """After (re)connecting: drop sessions the instance no longer has; add the busy ones,
        and those updated at or after ``since_ms`` (unix ms: when the instance's record
        was written, so used by this process; ``serve`` starts its MCP server only at a
        session's first prompt, after that session was created)."""
        changed = False
        if since_ms is not None:
            stored = await api.get("/session", {"roots": "true", "limit": "200"})
            for info in stored if isinstance(stored, list) else []:
                times = info.get("time") if isinstance(info, dict) else None
                updated = times.get("updated") if isinstance(times, dict) else None
                if isinstance(updated, (int, float)) and updated >= since_ms:
                    changed = self.learn(info) or changed
        for sid in list(self.live):
            try:
                await api.get(f"/session/{sid}")
            except HTTPStatus as exc:
                if exc.status == 404:
                    changed = self.forget(sid) or changed
        status = await api.get("/session/status")
        for sid in status if isinstance(status, dict) else {}:
            if isinstance(sid, str) and SESSION_ID.fullmatch(sid) and not self.knows(sid):
                changed = await self.read(api, sid) or changed
        return changed
