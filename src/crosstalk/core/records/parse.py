"""Reading stored records: :func:`parse_record` (typed, or :class:`Unreadable`) and
:func:`links` (the fields retention reads, the same way for every kind)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from crosstalk.core.records.agent import (
    ClaimRecord,
    NudgeRecord,
    ReceiptRecord,
    TaskDeleted,
    TaskRecord,
    _parse_native_send,
)
from crosstalk.core.records.base import (
    ASK,
    CLAIM,
    KEY,
    LEGACY_KEY,
    MESSAGE,
    NATIVE_SEND,
    NUDGE,
    RECEIPT,
    REPLY,
    TASK,
    TASK_DELETED,
    Json,
    Record,
    _Bad,
    _int,
)
from crosstalk.core.records.message import _parse_ask, _parse_message, _parse_reply

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

