"""Journal replay as a fold through the one state table: illegal sequences are reported.

:class:`Folder` reads records in journal order and keeps each subject's state (per
``(subject, id)``). A record whose state the table does not reach from the subject's current
state is **not adopted**: the subject keeps its last legal state, the record is listed as a
:class:`Violation`, and whoever replays logs it (the receiver does). It is the state-level
twin of the journal's damage report (``store.journal.Damage``): damage is a line that does
not decode, a violation is a record that decodes but cannot have happened.

What counts as legal, and why:

- **One event apart.** Normally each record is one move of the table (a task may also repeat
  its state: a save that changes only metadata). A subject's first record must be a state the
  subject can start in.
- **Missing records widen the check.** ``seq`` is contiguous in a journal, so a gap proves
  records are missing: retention drops the old head of a resolved subject (ADR 0002), and
  a damaged line is skipped. Across a gap a record only has to be *reachable* from the
  subject's state (a head trimmed by retention starts anywhere); a move no sequence of events
  makes, such as ``accepted`` → ``submitted``, is reported with or without a gap.
- **Couplings hold too.** An ask's obligation opens only once its message was delivered
  (:func:`crosstalk.core.states.opens_obligation`); an open record for a message that is
  not delivered is reported, unless records are missing since the message's last one.
- A ``task_deleted`` record ends its task: its id may start again.
- Records of kinds that are not ours are ignored; records of our kinds that do not read
  (:class:`~crosstalk.core.records.Unreadable`) are listed apart, in :attr:`Folded.unreadable`.

:func:`audit` is the one-call form for the test suite and diagnostics.

**One pass for every reader.** A restart has several readers of the same journal (the
receiver, the task store, claims, replies). They share one :class:`Folder` through
:func:`replay_into`: each record is decoded and parsed once and handed, with the fold's
verdict, to every :class:`Reader` in turn, so nobody needs the journal as a list. Parsing the
journal once per reader, with every record held in memory, made a 20k-message restart take
5-8 s and 300 MB (issue 12, item 6).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from crosstalk.core.records import (
    AskOpened,
    Record,
    StateRecord,
    TaskDeleted,
    Unreadable,
    parse_record,
)
from crosstalk.core.states import (
    DELIVERED,
    IllegalTransition,
    Subject,
    check_transition,
    machine,
)

Key = tuple[str, str]
_TASK, _MESSAGE = Subject.TASK.value, Subject.MESSAGE.value


@dataclass(frozen=True)
class Violation:
    """A record replay did not adopt: ``subject``/``id`` stayed in ``kept``."""

    subject: str
    id: str
    kept: str | None
    state: str
    seq: int | None
    reason: str

    def __str__(self) -> str:
        at = f"seq {self.seq}" if self.seq is not None else "a record without seq"
        return f"{at}: {self.subject} {self.id}: {self.reason} (kept {self.kept!r})"


@dataclass
class Folded:
    """Every subject's state after replay, and what was not adopted."""

    states: dict[Key, str] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)
    unreadable: list[Unreadable] = field(default_factory=list)

    def state(self, subject: str, rid: str) -> str | None:
        return self.states.get((subject, rid))


class Folder:
    """Fold records one at a time (the receiver's restore reads each record it adopts)."""

    def __init__(self) -> None:
        self.result = Folded()
        self._last_seq = 0
        self._gaps = 0
        #: The gap count when each subject's state was last adopted.
        self._seen_at: dict[Key, int] = {}

    def step(self, raw: Mapping[str, Any]) -> tuple[Record | Unreadable, Violation | None]:
        """Read one stored record: its typed form, and the violation if it is not adopted."""
        record = parse_record(raw)
        if isinstance(record, Unreadable):
            self._count(record.raw.get("seq"))
            if record.ours:
                self.result.unreadable.append(record)
            return record, None
        self._count(record.seq)
        if isinstance(record, StateRecord):
            key = (record.subject, record.id)
            new = str(record.state)  # plain values: the report reads like the journal
            violation = self._check(record, key, new)
            if violation is None:
                self.result.states[key] = new
                self._seen_at[key] = self._gaps
            else:
                self.result.violations.append(violation)
            return record, violation
        if isinstance(record, TaskDeleted):
            self.result.states.pop((_TASK, record.id), None)
            self._seen_at.pop((_TASK, record.id), None)
        return record, None

    def _count(self, seq: object) -> None:
        if isinstance(seq, int) and not isinstance(seq, bool):
            if seq != self._last_seq + 1:
                self._gaps += 1
            self._last_seq = seq

    def _gap_since(self, key: Key) -> bool:
        return self._gaps > self._seen_at.get(key, 0)

    def _check(self, record: StateRecord, key: Key, new: str) -> Violation | None:
        m = machine(record.subject)
        prev = self.result.states.get(key)
        if not (prev == new and m.repeatable):
            try:
                check_transition(record.subject, prev, new)
            except IllegalTransition as exc:
                if not (self._gap_since(key) and m.reachable(prev, new)):
                    return Violation(record.subject, record.id, prev, new, record.seq,
                                     str(exc))
        if isinstance(record, AskOpened):
            mkey = (_MESSAGE, record.id)
            shown = self.result.states.get(mkey)
            if shown not in DELIVERED and not self._gap_since(mkey):
                return Violation(record.subject, record.id, prev, new, record.seq,
                                 f"ask: opened while its message is {shown!r}, not "
                                 f"{' or '.join(sorted(s.value for s in DELIVERED))}")
        return None


def fold(records: Iterable[Mapping[str, Any]]) -> Folded:
    """Replay ``records`` (journal order) through the table."""
    folder = Folder()
    for raw in records:
        folder.step(raw)
    return folder.result


def audit(records: Iterable[Mapping[str, Any]]) -> list[Violation]:
    """The illegal sequences in ``records``: empty for a journal the product wrote."""
    return fold(records).violations


class Reader(Protocol):
    """One reader of a shared replay: sees every record once, in journal order."""

    def step(self, raw: Mapping[str, Any], record: Record | Unreadable,
             violation: Violation | None) -> None:
        """``raw`` as stored, its typed form, and the fold's violation if it was not adopted."""


@dataclass
class Kept:
    """A reader that keeps the stored records of a few kinds (e.g. claims and replies, a
    handful per journal) for readers that fold a list of their own."""

    kinds: tuple[type[Record], ...]
    records: list[Mapping[str, Any]] = field(default_factory=list)

    def step(self, raw: Mapping[str, Any], record: Record | Unreadable,
             violation: Violation | None) -> None:
        if isinstance(record, self.kinds):
            self.records.append(raw)


def replay_into(readers: Sequence[Reader],
                folder: Folder | None = None) -> Callable[[Mapping[str, Any]], None]:
    """What a replay hands each stored record to (``Journal.replay(each=...)``): one fold,
    then every reader in order."""
    fold_step = (folder or Folder()).step
    steps = tuple(reader.step for reader in readers)

    def each(raw: Mapping[str, Any]) -> None:
        record, violation = fold_step(raw)
        for step in steps:
            step(raw, record, violation)

    return each
