"""The records of an inbound message's life: the message, its ask's obligation, its reply."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from crosstalk.core.message import DeliveryMode, Kind, Message, Sender
from crosstalk.core.records.base import (
    ASK,
    KEY,
    MESSAGE,
    REPLY,
    Json,
    StateRecord,
    _asserted,
    _id,
    _map,
    _number,
    _opt,
    _state,
    _str,
    _strs,
    sender_from_dict,
    sender_to_dict,
)
from crosstalk.core.states import AskState, MessageState, ReplyState

# message ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class MessageSubmitted(StateRecord):
    """A message admitted by the receiver: its first record, with everything it carried."""

    subject: ClassVar[str] = MESSAGE
    state: MessageState = MessageState.SUBMITTED
    sender: Sender
    kind: str = Kind.INFORM.value
    delivery: str = DeliveryMode.IMMEDIATE.value
    #: ``None`` only in a damaged record: the message cannot be rebuilt (restore rejects it).
    text: str | None = None
    in_reply_to: str | None = None
    context_id: str | None = None
    task_id: str | None = None
    continuation: bool = False
    deadline_seconds: int = 0
    hop_chain: tuple[str, ...] = ()
    native: bool = False
    #: What the wire asserted, untrusted (``Message.asserted``; stored as ``claimed``).
    asserted: Mapping[str, str] = field(default_factory=dict)
    #: The fields whose lone surrogates were replaced on arrival (``Message.repaired``).
    repaired: tuple[str, ...] = ()
    sent_at: float | None = None
    #: The harness binding the receiver had (``harness.base.Binding.as_record``), as written.
    binding: Json | None = None
    refs: tuple[str, ...] = ()

    @classmethod
    def of(cls, msg: Message, binding: Json | None) -> MessageSubmitted:
        return cls(id=msg.message_id, sender=msg.sender, kind=msg.kind.value,
                   delivery=msg.delivery.value, text=msg.text, in_reply_to=msg.in_reply_to,
                   context_id=msg.context_id, task_id=msg.task_id,
                   continuation=msg.continuation, deadline_seconds=msg.deadline_seconds,
                   hop_chain=msg.hop_chain, native=msg.native, asserted=dict(msg.asserted),
                   repaired=msg.repaired, sent_at=msg.sent_at, binding=binding,
                   refs=tuple(r for r in (msg.task_id, msg.in_reply_to) if r))

    @staticmethod
    def record_of(msg: Message, binding: Json | None) -> dict[str, Any]:
        """``of(msg, binding).to_dict()``, without the frozen record in between: its
        ``__init__`` (an ``object.__setattr__`` per field) was ~4 % of the loop's time for
        each uds frame. ``tests/unit/test_records.py`` holds the two to the same output."""
        out: dict[str, Any] = {
            KEY: MESSAGE, "id": msg.message_id, "state": MessageState.SUBMITTED.value,
            "sender": sender_to_dict(msg.sender), "kind": msg.kind.value,
            "delivery": msg.delivery.value, "text": msg.text, "in_reply_to": msg.in_reply_to,
            "context_id": msg.context_id, "task_id": msg.task_id,
            "continuation": msg.continuation, "deadline_seconds": msg.deadline_seconds,
            "hop_chain": list(msg.hop_chain), "native": msg.native,
            "claimed": dict(msg.asserted), "sent_at": msg.sent_at,
            "binding": dict(binding) if binding is not None else None,
            "refs": [r for r in (msg.task_id, msg.in_reply_to) if r],
        }
        if msg.repaired:
            out["repaired"] = list(msg.repaired)
        return out

    def message(self) -> Message | None:
        """The message this record holds, or ``None`` if it cannot be rebuilt."""
        if self.text is None:
            return None
        try:
            kind, delivery = Kind(self.kind), DeliveryMode(self.delivery)
        except ValueError:
            return None
        return Message(message_id=self.id, sender=self.sender, text=self.text, kind=kind,
                       delivery=delivery, in_reply_to=self.in_reply_to,
                       context_id=self.context_id, task_id=self.task_id,
                       continuation=self.continuation, deadline_seconds=self.deadline_seconds,
                       hop_chain=self.hop_chain, native=self.native, sent_at=self.sent_at,
                       repaired=self.repaired)

    def _fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id, "state": self.state.value, "sender": sender_to_dict(self.sender),
            "kind": self.kind, "delivery": self.delivery, "text": self.text,
            "in_reply_to": self.in_reply_to, "context_id": self.context_id,
            "task_id": self.task_id, "continuation": self.continuation,
            "deadline_seconds": self.deadline_seconds, "hop_chain": list(self.hop_chain),
            "native": self.native, "claimed": dict(self.asserted), "sent_at": self.sent_at,
            "binding": dict(self.binding) if self.binding is not None else None,
            "refs": list(self.refs),
        }
        if self.repaired:
            out["repaired"] = list(self.repaired)
        return out

    @classmethod
    def parse(cls, raw: Json) -> MessageSubmitted:
        deadline = raw.get("deadline_seconds")
        return cls(
            id=_id(raw), sender=sender_from_dict(raw.get("sender")),
            kind=_str(raw, "kind") or Kind.INFORM.value,
            delivery=_str(raw, "delivery") or DeliveryMode.IMMEDIATE.value,
            text=_str(raw, "text"), in_reply_to=_str(raw, "in_reply_to"),
            context_id=_str(raw, "context_id"), task_id=_str(raw, "task_id"),
            continuation=bool(raw.get("continuation")),
            deadline_seconds=int(deadline) if isinstance(deadline, int | float) else 0,
            hop_chain=_strs(raw, "hop_chain"), native=bool(raw.get("native")),
            asserted=_asserted(raw), repaired=_strs(raw, "repaired"),
            sent_at=_number(raw, "sent_at"), binding=_map(raw, "binding"),
            refs=_strs(raw, "refs"))


@dataclass(frozen=True, kw_only=True, slots=True)
class MessageFinal(StateRecord):
    """A message that ends on arrival (``rejected`` by a check, or ``bounced``): its first
    and last record, with who sent it."""

    subject: ClassVar[str] = MESSAGE
    state: MessageState
    reason: str | None
    sender: Sender
    kind: str = Kind.INFORM.value
    native: bool = False
    binding: Json | None = None
    task_id: str | None = None
    #: Kept for a bounce, so the mailbox can show what was not forwarded.
    text: str | None = None
    in_reply_to: str | None = None

    def _fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id, "state": self.state.value, "reason": self.reason,
            "sender": sender_to_dict(self.sender), "kind": self.kind, "native": self.native,
            "binding": dict(self.binding) if self.binding is not None else None}
        _opt(out, "task_id", self.task_id)
        _opt(out, "text", self.text)
        _opt(out, "in_reply_to", self.in_reply_to)
        return out

    @classmethod
    def parse(cls, raw: Json) -> MessageFinal:
        return cls(id=_id(raw), state=_state(raw, MessageState), reason=_str(raw, "reason"),
                   sender=sender_from_dict(raw.get("sender")),
                   kind=_str(raw, "kind") or Kind.INFORM.value, native=bool(raw.get("native")),
                   binding=_map(raw, "binding"), task_id=_str(raw, "task_id"),
                   text=_str(raw, "text"), in_reply_to=_str(raw, "in_reply_to"))


@dataclass(frozen=True, kw_only=True, slots=True)
class MessageChange(StateRecord):
    """A later state of a message: the new state, why, and the harness's evidence."""

    subject: ClassVar[str] = MESSAGE
    state: MessageState
    reason: str | None = None
    evidence: str | None = None

    def _fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "state": self.state.value, "reason": self.reason}
        if self.evidence:
            out["evidence"] = self.evidence
        return out

    @classmethod
    def parse(cls, raw: Json) -> MessageChange:
        return cls(id=_id(raw), state=_state(raw, MessageState), reason=_str(raw, "reason"),
                   evidence=_str(raw, "evidence"))


MessageRecord = MessageSubmitted | MessageFinal | MessageChange


def _parse_message(raw: Json) -> MessageRecord:
    state = _state(raw, MessageState)
    if state is MessageState.SUBMITTED:
        return MessageSubmitted.parse(raw)
    if "sender" in raw:
        return MessageFinal.parse(raw)
    return MessageChange.parse(raw)


# ask ---------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class AskOpened(StateRecord):
    """The reply obligation a delivered ask opens (journaled in its message's outcome write)."""

    subject: ClassVar[str] = ASK
    state: AskState = AskState.OPEN
    deadline_at: float | None = None
    #: The asker's dedupe key (``Sender.key``; stored as ``sender``).
    sender_key: str | None = None
    refs: tuple[str, ...] = ()

    def _fields(self) -> dict[str, Any]:
        return {"id": self.id, "state": self.state.value, "deadline_at": self.deadline_at,
                "sender": self.sender_key, "refs": list(self.refs)}

    @classmethod
    def parse(cls, raw: Json) -> AskOpened:
        return cls(id=_id(raw), deadline_at=_number(raw, "deadline_at"),
                   sender_key=_str(raw, "sender"), refs=_strs(raw, "refs"))


@dataclass(frozen=True, kw_only=True, slots=True)
class AskEnded(StateRecord):
    """An obligation answered (with the reply's text), expired or closed."""

    subject: ClassVar[str] = ASK
    state: AskState
    reply: str | None = None

    def _fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "state": self.state.value}
        _opt(out, "reply", self.reply)
        return out

    @classmethod
    def parse(cls, raw: Json) -> AskEnded:
        return cls(id=_id(raw), state=_state(raw, AskState), reply=_str(raw, "reply"))


def _parse_ask(raw: Json) -> AskOpened | AskEnded:
    if _state(raw, AskState) is AskState.OPEN:
        return AskOpened.parse(raw)
    return AskEnded.parse(raw)


# reply --------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplyStaged(StateRecord):
    """A reply to inbound message ``id``, journaled before it is forwarded (seed R4-R8)."""

    subject: ClassVar[str] = REPLY
    state: ReplyState = ReplyState.PENDING
    reply_id: str | None = None
    text: str | None = None
    #: The asker's agent_id.
    to: str | None = None
    refs: tuple[str, ...] = ()

    def _fields(self) -> dict[str, Any]:
        return {"id": self.id, "state": self.state.value, "reply_id": self.reply_id,
                "text": self.text, "to": self.to, "refs": list(self.refs)}

    @classmethod
    def parse(cls, raw: Json) -> ReplyStaged:
        return cls(id=_id(raw), reply_id=_str(raw, "reply_id"), text=_str(raw, "text"),
                   to=_str(raw, "to"), refs=_strs(raw, "refs"))


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplyEnded(StateRecord):
    """A staged reply forwarded, or definitely unreachable; ``result`` is what the reply tool
    returned (message_id, state, reason, in_reply_to)."""

    subject: ClassVar[str] = REPLY
    state: ReplyState
    result: Json = field(default_factory=dict)

    def _fields(self) -> dict[str, Any]:
        return {"id": self.id, "state": self.state.value, "result": dict(self.result)}

    @classmethod
    def parse(cls, raw: Json) -> ReplyEnded:
        return cls(id=_id(raw), state=_state(raw, ReplyState),
                   result=_map(raw, "result") or {})


def _parse_reply(raw: Json) -> ReplyStaged | ReplyEnded:
    if _state(raw, ReplyState) is ReplyState.PENDING:
        return ReplyStaged.parse(raw)
    return ReplyEnded.parse(raw)


