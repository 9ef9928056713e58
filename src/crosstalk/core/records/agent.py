"""What the agent layer journals beside messages: claims, A2A tasks, receipts, native sends,
nudges."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from crosstalk.core.records.base import (
    CLAIM,
    NATIVE_SEND,
    NUDGE,
    RECEIPT,
    TASK,
    TASK_DELETED,
    Json,
    Record,
    StateRecord,
    _Bad,
    _id,
    _int,
    _map,
    _state,
    _str,
    _strs,
)
from crosstalk.core.states import ClaimStatus, MessageState, TaskState

# claim, task --------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class ClaimRecord(StateRecord):
    """A claim or release of this agent (seed §7); ``id`` is the agent's own id."""

    subject: ClassVar[str] = CLAIM
    state: ClaimStatus
    owner: str | None = None
    by: str | None = None
    by_name: str | None = None
    op: str | None = None
    previous: str | None = None
    binding: Json | None = None

    def _fields(self) -> dict[str, Any]:
        return {"id": self.id, "state": self.state.value, "owner": self.owner, "by": self.by,
                "by_name": self.by_name, "op": self.op, "previous": self.previous,
                "binding": dict(self.binding) if self.binding is not None else None}

    @classmethod
    def parse(cls, raw: Json) -> ClaimRecord:
        return cls(id=_id(raw), state=_state(raw, ClaimStatus), owner=_str(raw, "owner"),
                   by=_str(raw, "by"), by_name=_str(raw, "by_name"), op=_str(raw, "op"),
                   previous=_str(raw, "previous"), binding=_map(raw, "binding"))


@dataclass(frozen=True, kw_only=True, slots=True)
class TaskRecord(StateRecord):
    """An A2A task save (ADR 0004): ``task`` is the task as ``MessageToDict`` without history."""

    subject: ClassVar[str] = TASK
    state: TaskState
    owner: str | None = None
    refs: tuple[str, ...] = ()
    task: Json | None = None

    def _fields(self) -> dict[str, Any]:
        return {"id": self.id, "state": self.state.value, "owner": self.owner,
                "refs": list(self.refs),
                "task": dict(self.task) if self.task is not None else None}

    @classmethod
    def parse(cls, raw: Json) -> TaskRecord:
        return cls(id=_id(raw), state=_state(raw, TaskState), owner=_str(raw, "owner"),
                   refs=_strs(raw, "refs"), task=_map(raw, "task"))


@dataclass(frozen=True, kw_only=True, slots=True)
class TaskDeleted(Record):
    """A task removed (written by the SDK ``TaskStore`` interface the store had before ADR
    0044; still read, so such a journal replays as it did)."""

    subject: ClassVar[str] = TASK_DELETED
    id: str
    refs: tuple[str, ...] = ()

    def _fields(self) -> dict[str, Any]:
        return {"id": self.id, "refs": list(self.refs)}

    @classmethod
    def parse(cls, raw: Json) -> TaskDeleted:
        return cls(id=_id(raw), refs=_strs(raw, "refs"))


# receipt, native send, nudge ----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class ReceiptRecord(Record):
    """What a harness said after taking message ``id`` (Claude's peer_message_status)."""

    subject: ClassVar[str] = RECEIPT
    id: str
    status: str
    reason: str | None = None

    @property
    def label(self) -> str:
        """``status`` or ``status:reason``, as the mailbox shows it."""
        return f"{self.status}:{self.reason}" if self.reason else self.status

    def _fields(self) -> dict[str, Any]:
        return {"id": self.id, "status": self.status, "reason": self.reason}

    @classmethod
    def parse(cls, raw: Json) -> ReceiptRecord:
        status = _str(raw, "status")
        if status is None:
            raise _Bad("a receipt without a status")
        return cls(id=_id(raw), status=status, reason=_str(raw, "reason"))


@dataclass(frozen=True, kw_only=True, slots=True)
class NativeSendAttempted(StateRecord):
    """An inform this agent is about to put into a session without CrossTalk."""

    subject: ClassVar[str] = NATIVE_SEND
    state: MessageState = MessageState.DISPATCHING
    #: ``<harness>:<session_ref>`` of the target session.
    to: str | None = None
    to_name: str | None = None

    def _fields(self) -> dict[str, Any]:
        return {"id": self.id, "to": self.to, "to_name": self.to_name,
                "state": self.state.value}


@dataclass(frozen=True, kw_only=True, slots=True)
class NativeSendEnded(StateRecord):
    """The outcome of a native send."""

    subject: ClassVar[str] = NATIVE_SEND
    state: MessageState
    to: str | None = None
    reason: str | None = None

    def _fields(self) -> dict[str, Any]:
        return {"id": self.id, "to": self.to, "state": self.state.value, "reason": self.reason}


def _parse_native_send(raw: Json) -> NativeSendAttempted | NativeSendEnded:
    state = _state(raw, MessageState)
    if state is MessageState.DISPATCHING:
        return NativeSendAttempted(id=_id(raw), to=_str(raw, "to"),
                                   to_name=_str(raw, "to_name"))
    return NativeSendEnded(id=_id(raw), state=state, to=_str(raw, "to"),
                           reason=_str(raw, "reason"))


@dataclass(frozen=True, kw_only=True, slots=True)
class NudgeRecord(Record):
    """A nudge fired: ``count`` sends to ``peer`` so far (:mod:`crosstalk.core.nudge`)."""

    subject: ClassVar[str] = NUDGE
    peer: str
    count: int

    def _fields(self) -> dict[str, Any]:
        return {"peer": self.peer, "count": self.count}

    @classmethod
    def parse(cls, raw: Json) -> NudgeRecord:
        peer, count = _str(raw, "peer"), _int(raw, "count")
        if peer is None or count is None:
            raise _Bad("a nudge needs a peer and a count")
        return cls(peer=peer, count=count)


