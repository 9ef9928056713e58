"""The task JSON a task record carries, recognised without protobuf (issue 12, item 6).

:meth:`~crosstalk.a2a.taskstore.JournalTaskStore.put` journals ``MessageToDict`` of the task
without its history. Loading a journal used to ``ParseDict`` every task record to learn
whether it reads (an unreadable record is skipped and the task keeps its previous one), and
that was most of a restart's time. :func:`plain_state` answers the same question for the
shape ``put`` writes, by looking at the dict: a dict it accepts is one ``ParseDict`` reads
without fail into a task with that id and state, so the parse can wait until the task is
first read. Anything else (other keys, numbers for enums, non-text metadata, a timestamp
written another way) gets ``None`` and is parsed at load as before.

The accepted shape, and why each check is there (what would make ``ParseDict`` fail):

- keys exactly among ``id``, ``contextId``, ``status``, ``metadata`` (an unknown key is
  ignored by the parse, but a second spelling of a known one, ``context_id``, is not);
- text everywhere is valid UTF-8 (protobuf refuses lone surrogates);
- ``status``: ``state`` one of the seven states CrossTalk journals (by name), ``timestamp``
  RFC 3339 in UTC that names a real instant, ``message`` the agent's status message as
  :mod:`crosstalk.a2a.tasks` writes it (text parts, text metadata);
- ``metadata`` maps text to text.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping
from typing import Any

from a2a.types import a2a_pb2 as pb

from crosstalk.core.states import TaskState

_STATE_NAMES: dict[str, TaskState] = {
    pb.TaskState.Name(pb.TASK_STATE_SUBMITTED): TaskState.SUBMITTED,
    pb.TaskState.Name(pb.TASK_STATE_WORKING): TaskState.WORKING,
    pb.TaskState.Name(pb.TASK_STATE_INPUT_REQUIRED): TaskState.INPUT_REQUIRED,
    pb.TaskState.Name(pb.TASK_STATE_COMPLETED): TaskState.COMPLETED,
    pb.TaskState.Name(pb.TASK_STATE_FAILED): TaskState.FAILED,
    pb.TaskState.Name(pb.TASK_STATE_CANCELED): TaskState.CANCELED,
    pb.TaskState.Name(pb.TASK_STATE_REJECTED): TaskState.REJECTED,
}
_ROLES = frozenset(pb.Role.Name(r) for r in (pb.ROLE_USER, pb.ROLE_AGENT))
_TASK_KEYS = frozenset({"id", "contextId", "status", "metadata"})
_STATUS_KEYS = frozenset({"state", "timestamp", "message"})
_MESSAGE_KEYS = frozenset({"messageId", "contextId", "taskId", "role", "parts", "metadata"})
#: What MessageToDict writes for a Timestamp (0, 3, 6 or 9 digits; the parse takes 0-9),
#: with each field in range; a day past the 28th is checked against its month.
_TIMESTAMP = re.compile(r"(\d{4})-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])"
                        r"T(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,9})?Z")


def plain_state(task: Mapping[str, Any], task_id: str) -> TaskState | None:
    """The state of ``task`` if it is a task of ``task_id`` in the shape the store writes
    (so it reads without fail); ``None`` when only a parse can tell."""
    if not _TASK_KEYS.issuperset(task) or task.get("id") != task_id or not _text(task_id):
        return None
    if "contextId" in task and not _text(task["contextId"]):
        return None
    if "metadata" in task and not _text_map(task["metadata"]):
        return None
    status = task.get("status")
    if not isinstance(status, dict) or not _STATUS_KEYS.issuperset(status):
        return None
    state = status.get("state")
    found = _STATE_NAMES.get(state) if isinstance(state, str) else None
    if found is None:
        return None
    if "timestamp" in status and not _timestamp(status["timestamp"]):
        return None
    if "message" in status and not _message(status["message"]):
        return None
    return found


def _text(value: object) -> bool:
    if not isinstance(value, str):
        return False
    if value.isascii():
        return True
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def _text_map(value: object) -> bool:
    return isinstance(value, dict) and all(_text(k) and _text(v) for k, v in value.items())


def _timestamp(value: object) -> bool:
    found = _TIMESTAMP.fullmatch(value) if isinstance(value, str) else None
    if found is None:
        return False
    year, month, day = found.groups()
    if year == "0000":
        return False
    if day <= "28":
        return True
    try:
        # The dates strptime("%Y-%m-%dT%H:%M:%S") refuses past the 28th are datetime's.
        datetime.date(int(year), int(month), int(day))
    except ValueError:
        return False
    return True


def _message(value: object) -> bool:
    if not isinstance(value, dict) or not _MESSAGE_KEYS.issuperset(value):
        return False
    if not all(_text(value[k]) for k in ("messageId", "contextId", "taskId") if k in value):
        return False
    role = value.get("role", pb.Role.Name(pb.ROLE_AGENT))
    if not (isinstance(role, str) and role in _ROLES):
        return False
    if "metadata" in value and not _text_map(value["metadata"]):
        return False
    parts = value.get("parts", [])
    return isinstance(parts, list) and all(
        isinstance(p, dict) and p.keys() == {"text"} and _text(p["text"]) for p in parts)
