"""The journal's vocabulary: one frozen class per record kind (after h11's ``_events.py``).

Writers build a record here and journal ``record.to_dict()``; readers call
:func:`parse_record` and get a record or an :class:`Unreadable`. Nobody else spells a
record's keys.

Rules, and why:

- **One discriminator: ``subject``.** Every record names its kind in ``subject``; for a
  record that reports a state it is also the state machine of :mod:`crosstalk.core.states`
  the state belongs to, which is what retention reads (ADR 0002). Older journals name some
  kinds in ``type`` only (receipt, native_send, nudge, task_deleted) or in both (claim, task):
  :func:`parse_record` reads ``subject`` and falls back to ``type``.
- **Writers stay compatible while readers move.** Kinds that some reader outside ``core``
  still selects by ``type`` are written with ``type`` too (:data:`ALSO_TYPE`); once every
  reader parses here the set is emptied and nothing else changes.
- **Reading is tolerant, writing is exact.** Journals on disk outlive the code that wrote
  them. A field of the wrong type reads as absent where the record stays meaningful without
  it (a body without ``text`` is still a submitted message; restore re-checks it and rejects
  it); a record without a usable ``id`` or with a state its machine does not have is
  :class:`Unreadable`.
- ``seq`` and ``ts`` are the journal's (``Journal.append`` stamps them); records read back
  carry them, records being written leave them ``None`` and ``to_dict`` omits them.

The message's own shape (sender, binding, content) is here because the first record of a
message is that message: :meth:`MessageSubmitted.message` rebuilds what the receiver holds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple, TypeVar

from crosstalk.core.message import DeliveryMode, Ingress, Kind, Message, Sender
from crosstalk.core.states import (
    AskState,
    ClaimStatus,
    MessageState,
    ReplyState,
    Subject,
    TaskState,
)

#: The legacy discriminator, still read and (for :data:`ALSO_TYPE`) still written.
LEGACY_KEY = "type"
KEY = "subject"

MESSAGE = Subject.MESSAGE.value
ASK = Subject.ASK.value
REPLY = Subject.REPLY.value
CLAIM = Subject.CLAIM.value
TASK = Subject.TASK.value
NATIVE_SEND = Subject.NATIVE_SEND.value
TASK_DELETED = "task_deleted"
RECEIPT = "receipt"
NUDGE = "nudge"

#: Kinds written with ``type`` as well as ``subject``: readers outside ``core`` select them
#: by ``type`` today (``agent._claim_state``, ``a2a.taskstore.load``, tests).
ALSO_TYPE = frozenset({CLAIM, TASK, TASK_DELETED, RECEIPT, NATIVE_SEND, NUDGE})

Json = Mapping[str, Any]


# -- tolerant field readers -------------------------------------------------------------------


def _str(raw: Json, key: str) -> str | None:
    v = raw.get(key)
    return v if isinstance(v, str) else None


def _int(raw: Json, key: str) -> int | None:
    v = raw.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _number(raw: Json, key: str) -> float | None:
    v = raw.get(key)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _map(raw: Json, key: str) -> Json | None:
    v = raw.get(key)
    return v if isinstance(v, Mapping) else None


def _strs(raw: Json, key: str) -> tuple[str, ...]:
    v = raw.get(key)
    if not v or not isinstance(v, list | tuple):
        return ()
    return tuple([r for r in v if isinstance(r, str)])


def _opt(out: dict[str, Any], key: str, value: object) -> None:
    if value is not None:
        out[key] = value


class _Bad(ValueError):
    """A record that names a kind of ours but cannot be read as one."""


def _id(raw: Json) -> str:
    rid = raw.get("id")
    if not isinstance(rid, str):
        raise _Bad("no string id")
    return rid


_S = TypeVar("_S", MessageState, AskState, ReplyState, ClaimStatus, TaskState)


_BY_VALUE: dict[type, Mapping[str, Any]] = {
    e: {m.value: m for m in e} for e in (MessageState, AskState, ReplyState, ClaimStatus,
                                         TaskState)}


def _state(raw: Json, states: type[_S]) -> _S:
    state = raw.get("state")
    found: _S | None = _BY_VALUE[states].get(state) if isinstance(state, str) else None
    if found is None:
        raise _Bad(f"state {state!r} is not a {states.__name__}")
    return found


def _claimed(raw: Json) -> dict[str, str]:
    claimed = _map(raw, "claimed")
    if not claimed:
        return {}
    return {k: v for k, v in claimed.items() if isinstance(k, str) and isinstance(v, str)}


# -- the sender, as records carry it ---------------------------------------------------------


def sender_to_dict(sender: Sender) -> dict[str, Any]:
    return {"key": sender.key, "agent_id": sender.agent_id, "name": sender.name,
            "role": sender.role, "ingress": sender.ingress.value, "peer_pid": sender.peer_pid,
            "reply_address": sender.reply_address}


_INGRESSES = frozenset(i.value for i in Ingress)


def sender_from_dict(raw: object) -> Sender:
    """The sender a record names; anything unreadable in it reads as absent (unverified)."""
    data: Json = raw if isinstance(raw, Mapping) else {}
    ingress = data.get("ingress")
    return Sender(agent_id=_str(data, "agent_id"), name=_str(data, "name"),
                  role=_str(data, "role"),
                  ingress=Ingress(ingress) if ingress in _INGRESSES else Ingress.A2A,
                  peer_pid=_int(data, "peer_pid"), reply_address=_str(data, "reply_address"))


# -- the records ------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Record:
    """One journal record. ``seq``/``ts`` are set on records read back from the journal."""

    subject: ClassVar[str]
    seq: int | None = field(default=None, compare=False)
    ts: float | None = field(default=None, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """The record as the journal stores it (without ``seq``/``ts``)."""
        out: dict[str, Any] = {KEY: self.subject}
        if self.subject in ALSO_TYPE:
            out = {LEGACY_KEY: self.subject, **out}
        out.update(self._fields())
        return out

    def _fields(self) -> dict[str, Any]:
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True, slots=True)
class StateRecord(Record):
    """A record that reports the state of one subject (``subject``, ``id``) of a machine."""

    id: str
    state: str


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
    claimed: Mapping[str, str] = field(default_factory=dict)
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
                   hop_chain=msg.hop_chain, native=msg.native, claimed=dict(msg.claimed),
                   sent_at=msg.sent_at, binding=binding,
                   refs=tuple(r for r in (msg.task_id, msg.in_reply_to) if r))

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
                       hop_chain=self.hop_chain, native=self.native, sent_at=self.sent_at)

    def _fields(self) -> dict[str, Any]:
        return {
            "id": self.id, "state": self.state.value, "sender": sender_to_dict(self.sender),
            "kind": self.kind, "delivery": self.delivery, "text": self.text,
            "in_reply_to": self.in_reply_to, "context_id": self.context_id,
            "task_id": self.task_id, "continuation": self.continuation,
            "deadline_seconds": self.deadline_seconds, "hop_chain": list(self.hop_chain),
            "native": self.native, "claimed": dict(self.claimed), "sent_at": self.sent_at,
            "binding": dict(self.binding) if self.binding is not None else None,
            "refs": list(self.refs),
        }

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
            claimed=_claimed(raw),
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
    """A task removed through the SDK's ``TaskStore.delete``."""

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


# -- reading ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Unreadable:
    """A journal record none of the classes here reads: an unknown kind, or a kind of ours
    with a field it cannot do without. Readers skip it; :mod:`crosstalk.core.replay` lists
    the ones of our kinds."""

    raw: Json
    reason: str
    #: The kind it names, if any (``subject``, else ``type``).
    kind: str | None = None

    @property
    def ours(self) -> bool:
        """It names one of the kinds here (so it is damage, not a foreign record)."""
        return self.kind in _PARSERS


_PARSERS: Mapping[str, Callable[[Json], Record]] = {
    MESSAGE: _parse_message, ASK: _parse_ask, REPLY: _parse_reply, CLAIM: ClaimRecord.parse,
    TASK: TaskRecord.parse, TASK_DELETED: TaskDeleted.parse, RECEIPT: ReceiptRecord.parse,
    NATIVE_SEND: _parse_native_send, NUDGE: NudgeRecord.parse,
}


def kind_of(raw: Json) -> str | None:
    """The kind a stored record names: ``subject``, else the legacy ``type``."""
    kind = raw.get(KEY)
    if not isinstance(kind, str):
        kind = raw.get(LEGACY_KEY)
    return kind if isinstance(kind, str) else None


def parse_record(raw: Json) -> Record | Unreadable:
    """The typed record a stored dict holds, with its ``seq`` and ``ts``."""
    kind = kind_of(raw)
    parser = _PARSERS.get(kind) if kind is not None else None
    if parser is None:
        return Unreadable(raw, "unknown kind" if kind is not None else "no kind", kind)
    try:
        record = parser(raw)
    except _Bad as exc:
        return Unreadable(raw, str(exc), kind)
    _stamp(record, raw)
    return record


def _stamp(record: Record, raw: Json) -> None:
    """Give a record just parsed its journal ``seq`` and ``ts`` (set in place: it is not
    shared yet, and ``dataclasses.replace`` would build every record twice on replay).
    ``ts`` is read as retention reads it (any JSON number), so both agree on its age."""
    ts = raw.get("ts")
    object.__setattr__(record, "seq", _int(raw, "seq"))
    object.__setattr__(record, "ts", float(ts) if isinstance(ts, int | float) else None)


class Links(NamedTuple):
    """What every record may carry for retention, read the same way for every kind: the
    state report (``subject``, ``id``, ``state``), the ids it names, its age (ADR 0002).
    A tuple: retention builds one per record of the whole journal."""

    subject: str | None
    id: str | None
    state: str | None
    refs: tuple[str, ...]
    ts: float | None

    def ids(self) -> list[str]:
        """Every correlation id the record names (``id``, then ``refs``), non-empty."""
        return [i for i in (self.id, *self.refs) if i]


def links(raw: Json) -> Links:
    kind, rid, state, refs, ts = (raw.get(KEY), raw.get("id"), raw.get("state"),
                                  raw.get("refs"), raw.get("ts"))
    if not isinstance(kind, str):
        kind = raw.get(LEGACY_KEY)
    return Links(subject=kind if isinstance(kind, str) else None,
                 id=rid if isinstance(rid, str) else None,
                 state=state if isinstance(state, str) else None,
                 refs=tuple([r for r in refs if isinstance(r, str)])
                 if refs and isinstance(refs, list) else (),
                 ts=float(ts) if isinstance(ts, int | float) else None)
