"""The A2A layer's reader of a restart's journal replay (split from :mod:`crosstalk.a2a.taskstore`
for size): the latest readable record of each task, message bodies and open asks' deadlines,
which :meth:`~crosstalk.a2a.taskstore.JournalTaskStore.load` takes."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from a2a.types import a2a_pb2 as pb
from google.protobuf.json_format import ParseDict, ParseError

from crosstalk.a2a.taskjson import plain_state
from crosstalk.a2a.taskstore import Body, StoredTask, TaskStoreError, task_state
from crosstalk.core.records import (
    AskOpened,
    MessageSubmitted,
    Record,
    TaskDeleted,
    TaskRecord,
    Unreadable,
)
from crosstalk.core.replay import Violation, replay_into

log = logging.getLogger("crosstalk.a2a.taskstore")


class TaskReplay:
    """What the A2A layer reads from a journal on restart, as a replay streams by (a
    :class:`~crosstalk.core.replay.Reader`): the latest readable record of each task, the
    bodies of submitted messages (task histories are rebuilt from them) and open asks'
    deadlines. :meth:`JournalTaskStore.load` takes it in place of the records."""

    def __init__(self) -> None:
        self.latest: dict[str, StoredTask] = {}
        #: Tasks whose latest record has no ``ts``: dated by the load (older journals).
        self.undated: set[str] = set()
        #: The body of the last ``submitted`` record of each message id that has one.
        self.bodies: dict[str, Body] = {}
        self.ask_deadlines: dict[str, float] = {}

    @classmethod
    def of(cls, records: Iterable[Mapping[str, Any]]) -> TaskReplay:
        """What a replay of ``records`` (journal order) hands this reader."""
        replayed = cls()
        each = replay_into([replayed])
        for raw in records:
            each(raw)
        return replayed

    def step(self, raw: Mapping[str, Any], record: Record | Unreadable,
             violation: Violation | None) -> None:
        if isinstance(record, MessageSubmitted):
            body = Body.of(record)
            if body is not None:
                self.bodies[record.id] = body
        elif isinstance(record, AskOpened):
            if record.deadline_at is not None:
                self.ask_deadlines[record.id] = record.deadline_at
        elif isinstance(record, TaskDeleted):
            self.latest.pop(record.id, None)
            self.undated.discard(record.id)
        elif isinstance(record, TaskRecord) and record.id:
            if violation is not None:
                log.warning("not adopting task record: %s", violation)
                return
            stored = self._stored(record)
            if stored is not None:
                self.latest[record.id] = stored
                if record.ts is None:
                    self.undated.add(record.id)
                else:
                    self.undated.discard(record.id)

    def _stored(self, rec: TaskRecord) -> StoredTask | None:
        if rec.owner is None or rec.task is None:
            return None
        updated_at = rec.ts if rec.ts is not None else 0.0
        if plain_state(rec.task, rec.id) is rec.state:
            return StoredTask.unread(rec.id, rec.task, state=rec.state, owner=rec.owner,
                                     refs=list(rec.refs), updated_at=updated_at)
        try:
            task = ParseDict(dict(rec.task), pb.Task(), ignore_unknown_fields=True)
            task_state(task)
        except (ParseError, TaskStoreError, ValueError, TypeError) as exc:
            log.warning("skipping unreadable task record for %s: %s", rec.id, exc)
            return None
        if task.id != rec.id:
            return None
        return StoredTask(task, rec.owner, list(rec.refs), updated_at)
