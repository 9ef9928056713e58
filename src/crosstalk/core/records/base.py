"""The journal's vocabulary: one frozen class per record kind (after h11's ``_events.py``).

Writers build a record from :mod:`crosstalk.core.records` and journal ``record.to_dict()``;
readers call :func:`~crosstalk.core.records.parse_record` and get a record or an
``Unreadable``. Nobody else spells a record's keys. This module holds what every kind shares:
the discriminator, the tolerant field readers, the sender's shape and the base classes;
``message`` has the records of an inbound message's life, ``agent`` the agent layer's own,
``parse`` the reading.

Rules, and why:

- **One discriminator: ``subject``.** Every record names its kind in ``subject``; for a
  record that reports a state it is also the state machine of :mod:`crosstalk.core.states`
  the state belongs to, which is what retention reads (ADR 0002). Older journals name some
  kinds in ``type`` only (receipt, native_send, nudge, task_deleted) or in both (claim, task):
  :func:`parse_record` reads ``subject`` and falls back to ``type``.
- **Writers write ``subject`` only.** Every reader parses here, so no written record needs
  ``type``; journals that carry it are still read.
- **Reading is tolerant, writing is exact.** Journals on disk outlive the code that wrote
  them. A field of the wrong type reads as absent where the record stays meaningful without
  it (a body without ``text`` is still a submitted message; restore re-checks it and rejects
  it); a record without a usable ``id`` or with a state its machine does not have is
  ``Unreadable``.
- ``seq`` and ``ts`` are the journal's (``Journal.append`` stamps them); records read back
  carry them, records being written leave them ``None`` and ``to_dict`` omits them.

The message's own shape (sender, binding, content) is part of the vocabulary because the
first record of a message is that message: ``MessageSubmitted.message()`` rebuilds what the
receiver holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from crosstalk.core.message import Ingress, Sender
from crosstalk.core.states import (
    AskState,
    ClaimStatus,
    MessageState,
    ReplyState,
    Subject,
    TaskState,
)

#: The legacy discriminator: read (when ``subject`` is absent), never written.
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


def _asserted(raw: Json) -> dict[str, str]:
    """What the wire asserted about a message (stored as ``claimed``), strings only."""
    asserted = _map(raw, "claimed")
    if not asserted:
        return {}
    return {k: v for k, v in asserted.items() if isinstance(k, str) and isinstance(v, str)}


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
        out.update(self._fields())
        return out

    def _fields(self) -> dict[str, Any]:
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True, slots=True)
class StateRecord(Record):
    """A record that reports the state of one subject (``subject``, ``id``) of a machine."""

    id: str
    state: str
