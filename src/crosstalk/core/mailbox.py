"""The mailbox: a pure view over journal records for the ``receive_message`` tool (design §5).

``receive_message(state?, after?, limit?)`` returns entries and a next cursor. This module
builds that answer from journal records and nothing else:

- :func:`build_entries` folds the ``message`` records of one id (the first carries sender, kind
  and text; later ones carry ``state`` and ``reason``) and the ``ask`` records of the same id
  into one :class:`MailboxEntry`. The latest state wins.
- :func:`page` orders entries by the ``seq`` of their latest change and pages through them
  with an opaque cursor (``"s:<seq>"``). The cursor runs over the **full journal**, and the
  state filter always applies, the default one included (seed R17): a cursor names a journal
  position, so an entry that changes after it shows up again with its new state.
- :func:`bounce_text` is what a session whose native reply was bounced is told (seed §5
  "Native replies through a shim", seed 000 ADR 0009, R7).

The default filter (:data:`DEFAULT_STATES`) is what a model should see: messages that reached,
or failed to reach, this session's model and may need an answer or a follow-up.

Shown by default:

- ``accepted``: injected; listed so the model can find the ids it may ``reply`` to.
- ``queued``: handed to the model's history (the Codex no-wake append).
- ``unknown``: may or may not have reached the model; never resent (R2).
- ``recovered``: passed the re-run checks after a crash but was never injected, so the mailbox
  is the only way the model learns of it (R2).
- ``unreachable``: could not be delivered (e.g. bound to another conversation); the seed has
  such records surface here (§5 journal, test 21).
- ``bounced``: the model's own native reply, which was not delivered (seed 000 ADR 0009).
- ``delivering`` (the journal's ``dispatching``): the dispatch lock is journaled and fsynced,
  the harness is putting it into the session, and its outcome is not known yet. A model may
  already have it: Claude shows a frame to its model ~100 ms after the inbox reads it, while
  the injector waits out its receipt grace, and a model that answers at once must find the
  message it was just shown (issue 13). It is listed without its text (``withheld:
  delivering``) until its outcome is known: the model that was shown it has the text, and
  one that was not must not read a message its session may still hold or drop. The journal
  keeps ``dispatching`` (the word for "never resent", R2); the mailbox says what it means to
  a model. ``reply`` to such a message waits
  for the outcome (ADR 0019).

Not shown by default:

- ``rejected``: a policy, auth, hop, admission or size failure "stays out of the mailbox" (R2).
- ``submitted``: still in flight, or a stranded A2A continuation that stays out (R2).
- ``canceled``: the sender canceled it before dispatch; it reached no one.
- a message Claude's own gate holds for the session's user, or that the user denied, let
  expire or refused (:data:`WITHHELD_REASONS`, in ``unknown`` or ``unreachable``): the model
  sees nothing of it, as natively. Named by its state, it is listed without its text.

An explicit ``state`` shows every entry in that state, the excluded ones too; ``delivering``
and ``dispatching`` name the same entries.

An ask's change (answered, expired, closed) is a change of its entry: it moves the entry's
latest ``seq``, so an expiry reaches a model that polls with a cursor.

Records are expected as the journal stores them: every record has an int ``seq``, strictly
increasing in journal order. Records without one, with no string ``id``, or with a state that
is not a message (or ask) state are skipped, as journal replay skips them.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from crosstalk.core.envelope import address_attr, escape_body
from crosstalk.core.message import Sender
from crosstalk.core.records import (
    AskEnded,
    AskOpened,
    MessageChange,
    MessageFinal,
    MessageRecord,
    MessageSubmitted,
    ReceiptRecord,
    Record,
    Unreadable,
    parse_record,
)
from crosstalk.core.states import DELIVERED, MessageState

UNVERIFIED = "unverified"

DEFAULT_LIMIT = 20
MIN_LIMIT = 1
MAX_LIMIT = 100

#: The entries ``receive_message`` shows when no ``state`` is given (see the module docstring).
DEFAULT_STATES: frozenset[str] = frozenset(s.value for s in (
    *DELIVERED, MessageState.DISPATCHING, MessageState.UNKNOWN, MessageState.RECOVERED,
    MessageState.UNREACHABLE, MessageState.BOUNCED,
))

MESSAGE_STATES: frozenset[str] = frozenset(s.value for s in MessageState)

#: Reasons that say the session's user has not let a message through Claude's own inbound
#: gate: held for approval, then denied, expired or refused (ADR 0020). Claude's model sees
#: nothing of such a message, so neither may the mailbox show it: not listed by default, and
#: asked for by state, listed without its text (or a model could read what its user is still
#: deciding on, or turned away).
WITHHELD_REASONS: frozenset[str] = frozenset({
    "held_for_approval", "receipt_denied", "receipt_expired", "receipt_refused"})

#: What the mailbox calls a journal state when the journal's word is not a model's.
DELIVERING = "delivering"
SHOWN_AS: Mapping[str, str] = {MessageState.DISPATCHING.value: DELIVERING}
_JOURNAL_STATE: Mapping[str, str] = {shown: state for state, shown in SHOWN_AS.items()}
#: Every ``state`` a ``receive_message`` caller may name (the journal's names are kept).
SHOWN_STATES: tuple[str, ...] = tuple(SHOWN_AS.get(s.value, s.value) for s in MessageState)

#: How much of a bounced native message's first line the bounce quotes.
BOUNCE_QUOTE_CHARS = 200
BOUNCE_MAX_LISTED = 10

_CURSOR_PREFIX = "s:"
# Canonical decimal only, and short enough that int() never meets Python's digit limit.
_CURSOR_RE = re.compile(r"s:(0|[1-9][0-9]{0,18})")


class CursorError(ValueError):
    """An ``after`` cursor that no ``receive_message`` call could have returned."""


@dataclass(frozen=True)
class MailboxEntry:
    """One inbound message as the mailbox shows it."""

    message_id: str
    state: str
    #: The sender's name, else its agent_id, else ``"unverified"``.
    sender: str
    sender_agent_id: str | None
    kind: str
    text: str
    in_reply_to: str | None
    #: ``seq`` of the first record of this message and of its latest change (message or ask).
    first_seq: int
    last_seq: int
    reason: str | None = None
    ask: str | None = None
    reply: str | None = None
    #: What the harness said after taking it (Claude's receipt: held, delivered, dropped:<why>,
    #: denied, expired; opencode's follow-up: unanswered:<why>), the latest one.
    receipt: str | None = None

    @property
    def withheld(self) -> bool:
        """Its session's user has not let it through (:data:`WITHHELD_REASONS`)."""
        return self.reason in WITHHELD_REASONS

    @property
    def text_withheld(self) -> str | None:
        """Why the entry is shown without its text, if it is: withheld by the session's user,
        or still being delivered. A model that was shown a message being delivered has its
        text already and needs only its id; one that was not must not act on a message
        whose outcome is open, and Claude's gate may still hold it for the user."""
        if self.withheld:
            return self.reason
        return DELIVERING if self.state == MessageState.DISPATCHING.value else None

    def to_tool_dict(self) -> dict[str, Any]:
        """JSON-ready, with stable keys; ``ask``, ``reply`` and ``receipt`` appear only when
        present, ``withheld`` (why the text is left out) only when it is
        (:attr:`text_withheld`)."""
        withheld = self.text_withheld
        out: dict[str, Any] = {
            "message_id": self.message_id,
            "from": self.sender,
            "from_agent_id": self.sender_agent_id,
            "kind": self.kind,
            "state": SHOWN_AS.get(self.state, self.state),
            "text": "" if withheld else self.text,
            "in_reply_to": self.in_reply_to,
            "reason": self.reason,
            "seq": self.last_seq,
        }
        if self.ask is not None:
            out["ask"] = self.ask
        if self.reply is not None:
            out["reply"] = self.reply
        if self.receipt is not None:
            out["receipt"] = self.receipt
        if withheld is not None:
            out["withheld"] = withheld
        return out


@dataclass(frozen=True)
class Page:
    entries: list[MailboxEntry]
    #: Pass as ``after`` to continue; always set, so a model can poll for what comes next.
    next_cursor: str
    #: More matching entries follow ``next_cursor`` right now.
    more: bool = False


# -- folding ------------------------------------------------------------------------------


def _sender(sender: Sender) -> tuple[str, str | None]:
    agent_id = sender.agent_id or None
    return sender.name or agent_id or UNVERIFIED, agent_id


class MailboxFold:
    """The fold behind :func:`build_entries`, fed one record at a time.

    A shim answers ``receive_message`` from a fold it keeps and feeds only the records
    written since its last answer: re-reading a 24 h journal per call cost about a second and
    200 MB on 20k messages (issue 12).
    """

    def __init__(self) -> None:
        self._entries: dict[str, MailboxEntry] = {}
        self._asks: dict[str, tuple[str, str | None, int]] = {}
        self._receipts: dict[str, tuple[str, int]] = {}

    def add(self, raw: Mapping[str, Any]) -> None:
        self.take(parse_record(raw))

    def step(self, raw: Mapping[str, Any], record: Record | Unreadable,
             violation: object) -> None:
        """As a reader of an agent's start pass (:class:`~crosstalk.core.replay.Reader`):
        the record the pass already parsed, so the first ``receive_message`` after a start
        reads only what came after it."""
        self.take(record)

    def take(self, rec: Record | Unreadable) -> None:
        """One record, already parsed."""
        if isinstance(rec, Unreadable) or rec.seq is None:
            return
        seq = rec.seq
        if isinstance(rec, ReceiptRecord) and rec.id:
            self._receipts[rec.id] = (rec.label, seq)
        elif isinstance(rec, AskOpened | AskEnded) and rec.id:
            prior = self._asks.get(rec.id)
            prior_reply = prior[1] if prior is not None else None
            reply = rec.reply if isinstance(rec, AskEnded) else None
            self._asks[rec.id] = (rec.state.value,
                                  reply if reply is not None else prior_reply, seq)
        elif isinstance(rec, MessageSubmitted | MessageFinal | MessageChange) and rec.id:
            self._entries[rec.id] = _fold(self._entries.get(rec.id), rec, seq)

    def entries(self) -> list[MailboxEntry]:
        """One entry per message id, ordered by latest change."""
        entries = dict(self._entries)
        for rid, (ask_state, reply, ask_seq) in self._asks.items():
            if rid in entries:  # an ask with no message record has nothing to show
                entry = entries[rid]
                entries[rid] = replace(entry, ask=ask_state, reply=reply,
                                       last_seq=max(entry.last_seq, ask_seq))
        for rid, (receipt, receipt_seq) in self._receipts.items():
            if rid in entries:
                entry = entries[rid]
                entries[rid] = replace(entry, receipt=receipt,
                                       last_seq=max(entry.last_seq, receipt_seq))
        return sorted(entries.values(), key=lambda e: e.last_seq)


def build_entries(records: Iterable[Mapping[str, Any]]) -> list[MailboxEntry]:
    """Fold journal records into one entry per message id, ordered by latest change."""
    fold = MailboxFold()
    for raw in records:
        fold.add(raw)
    return fold.entries()


def _fold(prior: MailboxEntry | None, rec: MessageRecord, seq: int) -> MailboxEntry:
    reason = None if isinstance(rec, MessageSubmitted) else rec.reason
    content = None if isinstance(rec, MessageChange) else rec
    if prior is None:
        sender, agent_id = _sender(content.sender) if content else (UNVERIFIED, None)
        return MailboxEntry(message_id=rec.id, state=rec.state.value, sender=sender,
                            sender_agent_id=agent_id,
                            kind=(content.kind if content else None) or "inform",
                            text=(content.text if content else None) or "",
                            in_reply_to=content.in_reply_to if content else None,
                            first_seq=seq, last_seq=seq, reason=reason)
    # A later state record: the state and its reason replace the old ones. Content fields come
    # from the first record that carried them (a state record normally carries none).
    # (Built directly, not with dataclasses.replace: a restart folds ~40k of these.)
    text, in_reply_to = prior.text, prior.in_reply_to
    sender, agent_id = prior.sender, prior.sender_agent_id
    if content is not None:
        if not text and content.text is not None:
            text = content.text
        if in_reply_to is None and content.in_reply_to is not None:
            in_reply_to = content.in_reply_to
        if sender == UNVERIFIED and agent_id is None:
            sender, agent_id = _sender(content.sender)
    return MailboxEntry(prior.message_id, rec.state.value, sender, agent_id, prior.kind, text,
                        in_reply_to, prior.first_seq, max(prior.last_seq, seq), reason,
                        prior.ask, prior.reply, prior.receipt)


# -- paging -------------------------------------------------------------------------------


def encode_cursor(seq: int) -> str:
    if seq < 0:
        raise ValueError(f"a cursor seq is never negative, got {seq}")
    return f"{_CURSOR_PREFIX}{seq}"


def decode_cursor(cursor: str) -> int:
    """The journal ``seq`` a cursor names; :class:`CursorError` if it is not one of ours."""
    m = _CURSOR_RE.fullmatch(cursor) if isinstance(cursor, str) else None
    if m is None:
        shown = cursor[:40] + "..." if isinstance(cursor, str) and len(cursor) > 40 else cursor
        raise CursorError(
            f"invalid cursor {shown!r}: pass after= the next_cursor a previous receive_message "
            "call returned (it looks like 's:<number>'), or omit after to start from the "
            "oldest entry")
    return int(m.group(1))


def clamp_limit(limit: int | None) -> int:
    if limit is None:
        return DEFAULT_LIMIT
    return max(MIN_LIMIT, min(MAX_LIMIT, int(limit)))


def check_state(state: str) -> str:
    """The journal state a ``state`` filter names (a shown name, or the journal's own)."""
    state = _JOURNAL_STATE.get(state, state)
    if state not in MESSAGE_STATES:
        raise ValueError(f"unknown state {state!r}; valid states: {', '.join(SHOWN_STATES)}")
    return state


def page(entries: Iterable[MailboxEntry], *, state: str | None = None,
         after: str | None = None, limit: int | None = DEFAULT_LIMIT,
         default_states: Collection[str] = DEFAULT_STATES) -> Page:
    """One page of entries changed after ``after``, oldest change first.

    ``state`` filters to one message state; without it ``default_states`` applies, and a
    withheld message (:data:`WITHHELD_REASONS`) is left out. ``limit``
    is clamped to 1..100. ``next_cursor`` is the ``seq`` of the last returned entry when more
    follow, else the newest change seen (or ``after``), so polling with it returns only what
    changes later.
    """
    wanted: Collection[str] = {check_state(state)} if state is not None else default_states
    start = decode_cursor(after) if after is not None else 0
    n = clamp_limit(limit)
    ordered = sorted(entries, key=lambda e: e.last_seq)
    newer = [e for e in ordered if e.last_seq > start]
    matching = [e for e in newer if e.state in wanted and (state is not None or not e.withheld)]
    chosen = matching[:n]
    more = len(matching) > n
    # Nothing matching is left: skip past what does not match too. Safe, since any later
    # change to a skipped entry gets a higher seq and so comes after the cursor.
    end = chosen[-1].last_seq if more else max([start, *(e.last_seq for e in newer)])
    return Page(entries=chosen, next_cursor=encode_cursor(end), more=more)


# -- bounce -------------------------------------------------------------------------------


def _one_line(text: str) -> str:
    """``text`` up to its first line break (any break ``str.splitlines`` knows)."""
    lines = text.splitlines()
    return lines[0] if lines else ""


def _inline(text: str) -> str:
    """A field shown inside a line: every line break becomes a space, tags are escaped."""
    return escape_body(" ".join(text.splitlines()))


def bounce_text(frame_first_line: str, open_inbound: Sequence[MailboxEntry], *,
                max_listed: int = BOUNCE_MAX_LISTED) -> str:
    """What the shim injects back into a session whose native message it bounced.

    Lists the ``max_listed`` newest (by arrival) of ``open_inbound``, the messages the session
    may still answer with ``reply``; the caller decides which are open (asks with an open
    obligation, informs within their route's hour). Anything the first line or an entry says
    is escaped: it can neither close nor forge an envelope or a metadata line.
    """
    if max_listed < 0:
        raise ValueError(f"max_listed must not be negative, got {max_listed}")
    first = _one_line(frame_first_line)
    if len(first) > BOUNCE_QUOTE_CHARS:
        first = first[:BOUNCE_QUOTE_CHARS] + "…"
    quoted = escape_body(first) if first else "(empty)"
    lines = [
        "CrossTalk: your native message was not delivered. A native reply to a CrossTalk "
        "address is never forwarded.",
        f'Its first line was: "{quoted}"',
    ]
    newest = sorted(open_inbound, key=lambda e: e.first_seq, reverse=True)
    listed = newest[:max_listed]
    if listed:
        lines.append("To answer one of these open messages, call the reply tool with its "
                     "message_id (newest first):")
        lines.extend(f"- message_id={address_attr(e.message_id)} from={_inline(e.sender)} "
                     f"kind={_inline(e.kind)}" for e in listed)
        lines.append("To write to anyone else, use send_message.")
    else:
        lines.append("There is no open message to answer with reply; use send_message to "
                     "write to a session.")
    rest = len(newest) - len(listed)
    if rest > 0:
        lines.append(f"{rest} more open message{'s are' if rest != 1 else ' is'} not listed; "
                     "call receive_message to see them.")
    return "\n".join(lines)
