"""Journal records folded into the board's messages, each fold step a :class:`Change`.

Pure: records in, :class:`~crosstalk.watch.model.MessageView` and changes out, no file. The
records are the ones :class:`crosstalk.core.mailbox.MailboxFold` folds for ``receive_message``
(a journal holds the messages its agent *received*, so ``to`` is the journal's agent), read
through :func:`crosstalk.core.records.parse_record` like every other reader; native sends (an
inform this agent put into a session without CrossTalk) are the one outbound kind a journal
holds, and are shown too.

A record for a message the board does not hold is the tail of an older message: at start
(the feed reads only each journal's tail) it is dropped, since its message is older than the
window; while following it is shown as a partial message (an ask answered long after its
message left the board must still show).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from crosstalk.core.records import (
    AskEnded,
    AskOpened,
    MessageChange,
    MessageFinal,
    MessageSubmitted,
    NativeSendAttempted,
    NativeSendEnded,
    ReceiptRecord,
    Unreadable,
    parse_record,
)
from crosstalk.core.states import AskState
from crosstalk.watch.model import (
    MAX_RECORDS_PER_MESSAGE,
    Board,
    Change,
    ChangeKind,
    MessageView,
    StateStep,
)

#: How much of a text a line quotes.
QUOTE_CHARS = 60
#: Field names whose values the watch never shows, whatever record carries them. Journals and
#: descriptors hold no token today; this is the guard should one ever be journaled.
_SECRET = re.compile(r"token|secret|passw|authori[sz]|credential|api_?key|bearer", re.I)
#: Byte fragments of those names, case aside: a record's line that holds none of them has no
#: such field, so only the rare line that does is walked (``in`` on bytes costs about 2 µs a
#: line where the regular expression costs 40).
SECRET_FRAGMENTS = (b"oken", b"ecret", b"assw", b"uthori", b"redential", b"pi_key", b"pikey",
                    b"earer")
REDACTED = "<redacted>"

#: ``agent_id -> name`` (the board's sessions, else what the feed remembers).
NameOf = Callable[[str], str | None]


def redact(value: Any) -> Any:
    """``value`` with every secret-named field's value replaced (a copy; the input is kept)."""
    if isinstance(value, Mapping):
        return {k: (REDACTED if isinstance(k, str) and _SECRET.search(k) else redact(v))
                for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


def may_hold_secret(line: bytes) -> bool:
    """Whether a journal line may have a secret-named field (then :func:`redact` it)."""
    return any(fragment in line for fragment in SECRET_FRAGMENTS)


def clock(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))


def quote(text: str | None, width: int = QUOTE_CHARS) -> str:
    """``«the first words…»``: one line, at most ``width`` characters of it."""
    if not text:
        return ""
    flat = " ".join(text.split())
    return "«" + (flat if len(flat) <= width else flat[: width - 1] + "…") + "»"


def message_data(view: MessageView, *, text: bool) -> dict[str, Any]:
    """A message as ``--json`` prints it (stable keys; ``text`` only where asked for)."""
    out: dict[str, Any] = {
        "message_id": view.message_id, "from": view.sender_label,
        "from_agent_id": view.sender_agent, "verified": view.verified,
        "ingress": view.ingress, "to": view.to_name or view.to_agent,
        "to_agent_id": view.to_agent, "kind": view.kind, "delivery": view.delivery,
        "state": view.state, "reason": view.reason, "in_reply_to": view.in_reply_to,
        "task_id": view.task_id, "ask": view.ask_state, "ask_deadline": view.ask_deadline,
        "receipt": view.receipt,
    }
    if text:
        out["text"] = view.text
        out["steps"] = [{"ts": s.ts, "state": s.state, "reason": s.reason, "seq": s.seq}
                        for s in view.steps]
    if view.reply_text is not None:
        out["reply"] = view.reply_text
    return out


def message_line(view: MessageView, ts: float, what: str) -> str:
    """``14:03:07 alice → bob ask accepted (reason) «text…»``."""
    return (f"{clock(ts)} {view.sender_label} → {view.to_name or view.to_agent} "
            f"{view.shown_kind} {what}").rstrip()


def message_change(kind: ChangeKind, view: MessageView, ts: float, what: str,
                   **extra: Any) -> Change:
    data: dict[str, Any] = {"event": kind, "ts": ts,
                            **message_data(view, text=kind == "message"), **extra}
    return Change(kind, ts, view.message_id, message_line(view, ts, what), data)


def _state_words(view: MessageView) -> str:
    reason = f" ({view.reason})" if view.reason else ""
    return f"{view.state}{reason}"


class MessageFold:
    """Folds one record at a time into ``board`` and says what changed."""

    def __init__(self, board: Board, name_of: NameOf,
                 learn: Callable[[str, str], None] | None = None) -> None:
        """``learn(agent_id, name)`` hears each verified sender's name: a journal whose agent
        is gone is still shown by name when that agent sent a message."""
        self.board = board
        self.name_of = name_of
        self._learn = learn
        self._report = True

    def take(self, agent_id: str, raw: Mapping[str, Any], *, live: bool,
             report: bool = True) -> list[Change]:
        """Fold one raw journal record of ``agent_id``'s journal. ``live``: it was written
        while the watch followed (an orphan record then makes a partial message).
        ``report=False`` folds without building the changes (the start read, which reports
        the board instead)."""
        self._report = report
        rec = parse_record(raw)
        if isinstance(rec, Unreadable):
            return []
        ts = rec.ts if rec.ts is not None else time.time()
        if isinstance(rec, MessageSubmitted | MessageFinal):
            return self._arrived(agent_id, rec, raw, ts)
        if isinstance(rec, NativeSendAttempted | NativeSendEnded):
            return self._native(agent_id, rec, raw, ts, live=live)
        rid = getattr(rec, "id", None)
        if not isinstance(rid, str):
            return []
        view = self.board.messages.get(rid)
        if view is None:
            if not live or not isinstance(rec, MessageChange | AskOpened | AskEnded
                                          | ReceiptRecord):
                return []
            view = self._partial(agent_id, rid, ts)
        _keep_raw(view, raw)
        if isinstance(rec, MessageChange):
            view.steps.append(StateStep(ts, rec.state.value, rec.reason, rec.seq))
            return self._change("state", view, ts, _state_words(view) + " "
                                + quote(view.text))
        if isinstance(rec, AskOpened | AskEnded):
            return self._ask(view, rec, ts)
        if isinstance(rec, ReceiptRecord):
            view.receipt = rec.label
            return self._change("receipt", view, ts, f"receipt {rec.label}")
        return []

    def _arrived(self, agent_id: str, rec: MessageSubmitted | MessageFinal,
                 raw: Mapping[str, Any], ts: float) -> list[Change]:
        sender = rec.sender
        if self._learn is not None and sender.agent_id and sender.name:
            self._learn(sender.agent_id, sender.name)
        view = self.board.messages.get(rec.id)
        if view is None:
            view = MessageView(
                message_id=rec.id, to_agent=agent_id, to_name=self.name_of(agent_id),
                sender_label=sender.name or sender.agent_id
                or f"unverified ({sender.ingress.value})",
                sender_agent=sender.agent_id, verified=sender.verified,
                ingress=sender.ingress.value, kind=rec.kind,
                delivery=getattr(rec, "delivery", "immediate"), text=rec.text or "",
                in_reply_to=rec.in_reply_to, task_id=rec.task_id)
            self.board.keep(view)
        view.steps.append(StateStep(ts, rec.state.value, getattr(rec, "reason", None),
                                    rec.seq))
        _keep_raw(view, raw)
        return self._change("message", view, ts, _state_words(view) + " "
                            + quote(view.text))

    def _native(self, agent_id: str, rec: NativeSendAttempted | NativeSendEnded,
                raw: Mapping[str, Any], ts: float, *, live: bool) -> list[Change]:
        view = self.board.messages.get(rec.id)
        reason = rec.reason if isinstance(rec, NativeSendEnded) else None
        if view is None:
            if isinstance(rec, NativeSendEnded) and not live:
                return []
            to = rec.to or "?"
            to_name = rec.to_name if isinstance(rec, NativeSendAttempted) else None
            view = MessageView(
                message_id=rec.id, to_agent=to, to_name=to_name,
                sender_label=self.name_of(agent_id) or agent_id, sender_agent=agent_id,
                verified=True, ingress="native", kind="inform", delivery="immediate", text="")
            self.board.keep(view)
            view.steps.append(StateStep(ts, rec.state.value, reason, rec.seq))
            _keep_raw(view, raw)
            return self._change("message", view, ts, _state_words(view))
        view.steps.append(StateStep(ts, rec.state.value, reason, rec.seq))
        _keep_raw(view, raw)
        return self._change("state", view, ts, _state_words(view))

    def _change(self, kind: ChangeKind, view: MessageView, ts: float,
                what: str) -> list[Change]:
        return [message_change(kind, view, ts, what)] if self._report else []

    def _ask(self, view: MessageView, rec: AskOpened | AskEnded, ts: float) -> list[Change]:
        view.ask_state = rec.state.value
        if isinstance(rec, AskOpened):
            view.ask_deadline = rec.deadline_at
            due = (f", due {clock(rec.deadline_at)}" if rec.deadline_at is not None else "")
            return self._change("ask", view, ts, f"ask open{due} " + quote(view.text))
        view.ask_deadline = None
        if rec.reply is not None:
            view.reply_text = rec.reply
        words = f"ask {rec.state.value}"
        if rec.state is AskState.ANSWERED:
            words += " " + quote(rec.reply)
        return self._change("ask", view, ts, words)

    def _partial(self, agent_id: str, rid: str, ts: float) -> MessageView:
        """A message whose first record is older than what the watch read."""
        view = MessageView(message_id=rid, to_agent=agent_id, to_name=self.name_of(agent_id),
                           sender_label="(earlier)", sender_agent=None, verified=False,
                           ingress="?", kind="?", delivery="?", text="")
        self.board.keep(view)
        return view


def _keep_raw(view: MessageView, raw: Mapping[str, Any]) -> None:
    """Keep the record as read: the journal reader redacted it already if it may hold a
    secret-named field (:func:`may_hold_secret`), so the rest is kept without a copy."""
    if len(view.records) < MAX_RECORDS_PER_MESSAGE:
        view.records.append(dict(raw) if not isinstance(raw, dict) else raw)
