"""The readers of an agent's start pass, and their state as a restart checkpoint's sections.

An agent's start reads its journal once for every reader (ADR 0017): the fold
(:class:`~crosstalk.core.replay.Folder`), the claims and replies it keeps
(:class:`~crosstalk.core.replay.Kept`), the receiver's :class:`~crosstalk.recovery.Restore`,
the A2A layer's :class:`~crosstalk.a2a.taskstore.TaskReplay` and the mailbox's
:class:`~crosstalk.core.mailbox.MailboxFold` (so the first ``receive_message`` after a start
reads only what came after it). :class:`StartPass` holds them together.

:meth:`StartPass.sections` is what they hold after a prefix of the journal, **before**
``Restore.finish()`` settles anything, as JSON; :meth:`StartPass.load` builds readers that hold
exactly that again, so (sections of a prefix) + the tail is the same as the whole journal
(the property test keeps it so). Only readers fed by journal records are ever written out:
the receiver's live entries and tasks change after the pass (settling, serving) and differ
from what a replay builds. Bump :data:`crosstalk.store.checkpoint.VERSION` whenever a section
changes shape.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from a2a.types import a2a_pb2 as pb
from google.protobuf.json_format import MessageToDict, ParseDict

from crosstalk.a2a.taskreplay import TaskReplay
from crosstalk.a2a.taskstore import Body, StoredTask
from crosstalk.core.mailbox import MailboxEntry, MailboxFold
from crosstalk.core.message import DeliveryMode, Ingress, Kind, Sender
from crosstalk.core.records import (
    ClaimRecord,
    MessageSubmitted,
    ReplyEnded,
    ReplyStaged,
    Unreadable,
    parse_record,
)
from crosstalk.core.replay import Folder, Kept, Violation, replay_into
from crosstalk.core.states import AskState, MessageState, TaskState
from crosstalk.inbound import Inbound
from crosstalk.receiver import Receiver
from crosstalk.recovery import Restore
from crosstalk.store.checkpoint import encode
from crosstalk.store.journal_read import RecordSink

Row = list[Any]
_SECTIONS = ("folder", "claims", "replies", "restore", "tasks", "mailbox")


class StartPass:
    """Every reader of one start pass. With ``receiver``, the receiver's entries are the
    ones its :class:`~crosstalk.recovery.Restore` rebuilds (an agent's start); without, the
    readers only rebuild (a checkpoint being advanced off the event loop)."""

    def __init__(self, receiver: Receiver | None, agent_id: str) -> None:
        self.folder = Folder()
        self.claims = Kept((ClaimRecord,))
        self.replies = Kept((ReplyStaged, ReplyEnded))
        self.agent_id = agent_id
        self.restore = Restore(receiver, agent_id=agent_id)
        self.tasks = TaskReplay()
        self.mailbox = MailboxFold()
        #: Records handed to :meth:`each` (what a start read, for its log line and tests).
        self.records = 0
        self._senders: list[Sender] = []
        self._bindings_list: list[dict[str, Any]] = []
        # A load shares equal ids, states, kinds and names across rows and sections:
        # ``json.loads`` makes a new string for every value, and a 20k-message checkpoint
        # holds ~400k of them, ~25 MB (issue 12 asks a restart to peak at 120 MB).
        self._share: Callable[[Any, Any], Any] = {}.setdefault

    def each(self) -> RecordSink:
        """What ``Journal.replay(each=...)`` hands each record to."""
        step = replay_into([self.claims, self.replies, self.restore, self.tasks, self.mailbox],
                           self.folder)

        def each(raw: dict[str, Any]) -> None:
            self.records += 1
            step(raw)

        return each

    # -- out --------------------------------------------------------------------------------

    def frozen(self) -> StartPass:
        """Readers holding what these hold now, that later changes to these do not reach.

        An agent's start keeps its readers' state for a checkpoint before ``finish()``
        settles anything, but encoding it takes a few tenths of a second on a 24 h journal:
        a copy lets :meth:`sections` run in a thread while the agent serves. Everything the
        agent goes on changing is copied (the receiver's entries, the tasks, the mailbox's
        maps, the lists); records, senders and binding dicts are never written to, and
        are shared.
        """
        out = StartPass(None, self.agent_id)
        f, g = self.folder, out.folder
        g.result.states = dict(f.result.states)
        g.result.violations = list(f.result.violations)
        g.result.unreadable = list(f.result.unreadable)
        g._seen_at, g._gaps, g._last_seq = dict(f._seen_at), f._gaps, f._last_seq
        out.claims.records = list(self.claims.records)
        out.replies.records = list(self.replies.records)
        r, q = self.restore, out.restore
        q.entries = {mid: copy.copy(e) for mid, e in r.entries.items()}
        q.violations = list(r.violations)
        q._bodies = dict(r._bodies)
        t, u = self.tasks, out.tasks
        u.latest = {tid: s.copy() for tid, s in t.latest.items()}
        u.undated, u.bodies = set(t.undated), dict(t.bodies)
        u.ask_deadlines = dict(t.ask_deadlines)
        m, n = self.mailbox, out.mailbox
        n._entries, n._asks, n._receipts = dict(m._entries), dict(m._asks), dict(m._receipts)
        out.records = self.records
        return out

    def sections(self) -> list[tuple[str, bytes]]:
        """The readers' state as the checkpoint's parts, encoded now (it changes once
        ``finish`` settles). Long lists are cut into parts of :data:`CHUNK` rows, so a load
        never holds more than one part's JSON besides what it built."""
        dumps: dict[str, Callable[[], dict[str, Any]]] = {
            "folder": self._folder, "claims": lambda: {"records": self.claims.records},
            "replies": lambda: {"records": self.replies.records}, "restore": self._restore,
            "tasks": self._tasks, "mailbox": self._mailbox}
        return [(name, encode(part)) for name in _SECTIONS for part in _parts(dumps[name]())]

    def _folder(self) -> dict[str, Any]:
        f = self.folder
        return {"states": [[s, i, v] for (s, i), v in f.result.states.items()],
                "seen": [[s, i, n] for (s, i), n in f._seen_at.items() if n],
                "gaps": f._gaps, "last_seq": f._last_seq,
                "violations": [_violation(v) for v in f.result.violations],
                "unreadable": [u.raw for u in f.result.unreadable]}

    def _restore(self) -> dict[str, Any]:
        r = self.restore
        senders: dict[Sender, int] = {}
        bindings: dict[int, tuple[int, dict[str, Any]]] = {}
        rows = []
        for e in r.entries.values():
            if e.message is not None or e.stalled:
                raise ValueError(f"entry {e.message_id} is past replay (settled or served)")
            si = senders.setdefault(e.sender, len(senders))
            bi = -1
            if e.binding is not None:
                bi = bindings.setdefault(id(e.binding), (len(bindings), e.binding))[0]
            rows.append([e.message_id, si, e.kind, e.state.value, e.ingress, e.reason,
                         e.task_id, e.continuation, bi,
                         e.ask.value if e.ask is not None else None, e.reply_text,
                         e.evidence, e.deadline_seconds, e.arrived_at])
        return {"senders": [[s.agent_id, s.name, s.role, s.ingress.value, s.peer_pid,
                             s.reply_address] for s in senders],
                "bindings": [b for _, b in bindings.values()], "entries": rows,
                "violations": [_violation(v) for v in r.violations],
                "bodies": [raw for raw, _ in r._bodies.values()]}

    def _tasks(self) -> dict[str, Any]:
        t = self.tasks
        latest: list[Row] = []
        for tid, s in t.latest.items():
            if s.history is not None:
                raise ValueError(f"task {tid} is past replay (its history was rebuilt)")
            if s.parsed:
                latest.append([tid, None, s.owner, s.refs, s.updated_at,
                               MessageToDict(s.task)])
            else:
                latest.append([tid, s.state.value, s.owner, s.refs, s.updated_at, s._raw])
        return {"latest": latest, "undated": sorted(t.undated),
                "bodies": [[b.message_id, b.text, b.kind.value, b.delivery.value,
                            b.deadline_seconds, b.in_reply_to, b.hop_chain, b.task_id,
                            b.context_id] for b in t.bodies.values()],
                "ask_deadlines": t.ask_deadlines}

    def _mailbox(self) -> dict[str, Any]:
        m, bodies = self.mailbox, self.tasks.bodies
        rows = []
        for e in m._entries.values():
            body = bodies.get(e.message_id)
            # The text is nearly always the body's: 0 says so (half the file, and one
            # string in memory for both after a load).
            text: str | int = 0 if body is not None and body.text == e.text else e.text
            rows.append([e.message_id, e.state, e.sender, e.sender_agent_id, e.kind, text,
                         e.in_reply_to, e.first_seq, e.last_seq, e.reason, e.ask, e.reply,
                         e.receipt])
        return {"entries": rows, "asks": m._asks, "receipts": m._receipts}

    # -- in ---------------------------------------------------------------------------------

    @classmethod
    def load(cls, parts: Iterable[tuple[str, Any]], receiver: Receiver | None,
             agent_id: str) -> StartPass:
        """Readers holding what :meth:`sections` wrote. Raises ``KeyError``, ``TypeError``,
        ``ValueError`` or ``IndexError`` on anything that is not what it wrote (the caller
        then replays the whole journal)."""
        out = cls(receiver, agent_id)
        got: list[str] = []
        loaders: dict[str, Callable[[Mapping[str, Any]], None]] = {
            "folder": out._load_folder, "claims": lambda d: out.claims.records.extend(
                d["records"]), "replies": lambda d: out.replies.records.extend(d["records"]),
            "restore": out._load_restore, "tasks": out._load_tasks,
            "mailbox": out._load_mailbox}
        for name, part in parts:
            loaders[name](part)
            if not got or got[-1] != name:
                got.append(name)
        if tuple(got) != _SECTIONS:
            raise ValueError(f"sections {got} are not {list(_SECTIONS)}")
        return out

    def _load_folder(self, d: Mapping[str, Any]) -> None:
        f = self.folder
        share = self._share
        for s, i, v in d.get("states", ()):
            key = (share(s, s), share(i, i))
            f.result.states[key] = share(v, v)
            f._seen_at.setdefault(key, 0)
        f._seen_at.update({(s, i): n for s, i, n in d.get("seen", ())})
        if "gaps" in d:
            f._gaps, f._last_seq = int(d["gaps"]), int(d["last_seq"])
        f.result.violations.extend(Violation(*v) for v in d.get("violations", ()))
        f.result.unreadable.extend(_unreadable(raw) for raw in d.get("unreadable", ()))

    def _load_restore(self, d: Mapping[str, Any]) -> None:
        r = self.restore
        if "senders" in d:
            self._senders = [Sender(a, n, role, Ingress(i), pid, addr)
                             for a, n, role, i, pid, addr in d["senders"]]
            r._senders = {s: s for s in self._senders}
            self._bindings_list = d["bindings"]
            for b in self._bindings_list:
                with contextlib.suppress(TypeError):  # a value that does not hash: not shared
                    r._bindings.setdefault(tuple(b.items()), b)
        senders, bindings, entries = self._senders, self._bindings_list, r.entries
        share = self._share
        for row in d.get("entries", ()):
            (mid, si, kind, state, ingress, reason, task_id, cont, bi, ask, reply, evidence,
             deadline, arrived) = _shared(row, (0, 2, 4, 5, 6), share)
            entries[mid] = Inbound(
                mid, senders[si], kind, _MESSAGE_STATES[state], ingress, reason=reason,
                task_id=task_id, continuation=cont, binding=bindings[bi] if bi >= 0 else None,
                ask=_ASK_STATES[ask] if ask is not None else None, reply_text=reply,
                evidence=evidence, deadline_seconds=deadline, arrived_at=arrived)
        r.violations.extend(Violation(*v) for v in d.get("violations", ()))
        for raw in d.get("bodies", ()):
            record = parse_record(raw)
            if not isinstance(record, MessageSubmitted):
                raise ValueError("a pending body that is not a submitted record")
            r._bodies[record.id] = (raw, record)

    def _load_tasks(self, d: Mapping[str, Any]) -> None:
        t, share = self.tasks, self._share
        for row in d.get("latest", ()):
            tid, state, owner, refs, updated_at, task = _shared(row, (0, 2), share)
            refs[:] = [share(r, r) for r in refs]
            if state is None:
                stored = StoredTask(ParseDict(task, pb.Task(), ignore_unknown_fields=True),
                                    owner, refs, updated_at)
            else:
                stored = StoredTask.unread(tid, task, state=_TASK_STATES[state], owner=owner,
                                           refs=refs, updated_at=updated_at)
            t.latest[tid] = stored
        t.undated.update(d.get("undated", ()))
        for row in d.get("bodies", ()):
            mid, text, kind, delivery, deadline, in_reply_to, hops, task_id, context_id = (
                _shared(row, (0, 5, 7, 8), share))
            t.bodies[mid] = Body(mid, text, _KINDS[kind], _DELIVERIES[delivery], deadline,
                                 in_reply_to, tuple(hops), task_id, context_id)
        t.ask_deadlines.update(d.get("ask_deadlines", {}))

    def _load_mailbox(self, d: Mapping[str, Any]) -> None:
        m, bodies, share = self.mailbox, self.tasks.bodies, self._share
        for row in d.get("entries", ()):
            _shared(row, _MAILBOX_SHARED, share)  # id, state, sender, kind, ... receipt
            if row[5] == 0 and not isinstance(row[5], str):
                row[5] = bodies[row[0]].text
            m._entries[row[0]] = MailboxEntry(*row)
        m._asks.update({share(k, k): (share(s, s), reply, seq)
                        for k, (s, reply, seq) in d.get("asks", {}).items()})
        m._receipts.update({share(k, k): (share(label, label), seq) for k, (label, seq) in
                            d.get("receipts", {}).items()})


#: The mailbox row's columns a load shares (not its text or reply).
_MAILBOX_SHARED = (0, 1, 2, 3, 4, 6, 9, 10, 12)
#: Rows per part of a long list (a load holds one part's JSON at a time).
CHUNK = 2000
_MESSAGE_STATES = {s.value: s for s in MessageState}
_ASK_STATES = {a.value: a for a in AskState}
_TASK_STATES = {s.value: s for s in TaskState}
_KINDS = {k.value: k for k in Kind}
_DELIVERIES = {m.value: m for m in DeliveryMode}


def _parts(section: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A section as parts: its short values first, then each long list in chunks."""
    long = {k for k, v in section.items() if isinstance(v, list) and len(v) > CHUNK}
    yield {k: v for k, v in section.items() if k not in long}
    for k in long:
        rows = section[k]
        for i in range(0, len(rows), CHUNK):
            yield {k: rows[i:i + CHUNK]}


def _shared(row: Row, columns: tuple[int, ...], share: Callable[[Any, Any], Any]) -> Row:
    """``row`` with the values in ``columns`` replaced by the first equal one the load saw."""
    for i in columns:
        row[i] = share(row[i], row[i])
    return row


def _violation(v: Violation) -> Row:
    return [v.subject, v.id, v.kept, v.state, v.seq, v.reason]


def _unreadable(raw: Mapping[str, Any]) -> Unreadable:
    record = parse_record(raw)
    if not isinstance(record, Unreadable):
        raise ValueError("a record listed unreadable reads now")
    return record

