"""What ``crosstalk watch`` shows, as plain data: the sessions, the messages and what went wrong.

:class:`Board` is the whole picture; :class:`Change` is one thing that changed in it, as the
feed (:mod:`crosstalk.watch.feed`) reports it after each poll. The terminal UI
(:mod:`crosstalk.watch.app`) redraws from the board, ``--plain`` prints ``Change.line`` and
``--json`` prints ``Change.data``. Nothing here reads a file or knows about a terminal (h11's
habit: the state in one place, the I/O elsewhere).

The watch is read-only: these views are built from the registry and the journals, never from
an agent's memory, and hold no token (journals and descriptors carry none; a credential is a
path to a 0600 file, which the watch never opens).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Final, Literal

#: How many messages the board keeps (the oldest go first); the journals keep the rest.
MAX_MESSAGES: Final = 5000
#: How many problems the board keeps.
MAX_NOTICES: Final = 200
#: How many raw journal records a message keeps for the detail view.
MAX_RECORDS_PER_MESSAGE: Final = 32


@dataclass(frozen=True)
class SessionView:
    """One row of the Sessions pane: what ``list_agents`` / ``crosstalk agents`` shows."""

    #: agent_id for an agent, ``<harness>:<session_ref>`` for a session without CrossTalk.
    key: str
    name: str | None
    harness: str | None
    #: idle | busy | shell | waiting | unknown
    status: str
    crosstalk: bool
    reachable: bool
    cwd: str | None = None
    #: What a waiting session waits for (a permission, Claude's ``waitingFor``).
    waiting_for: str | None = None
    unreachable_because: str | None = None
    role: str | None = None
    owner: str | None = None
    #: Why its descriptor does not read (``crosstalk agents``' ``damaged`` field), if it does not.
    damaged: str | None = None


@dataclass(frozen=True)
class StateStep:
    """One journaled state of a message, in order."""

    ts: float
    state: str
    reason: str | None = None
    #: The journal's sequence number of the record (``None`` if it had none).
    seq: int | None = None


@dataclass
class MessageView:
    """One message as it moves: who to whom, each state, the ask it opened, its receipt."""

    message_id: str
    #: The receiving agent (whose journal holds it) and its name when known.
    to_agent: str
    to_name: str | None
    #: ``Sender.label``: the verified agent's name, else ``unverified``/the ingress.
    sender_label: str
    sender_agent: str | None
    verified: bool
    ingress: str
    kind: str
    delivery: str
    text: str
    in_reply_to: str | None = None
    task_id: str | None = None
    steps: list[StateStep] = field(default_factory=list)
    #: open | answered | expired | closed, once the message opened an ask.
    ask_state: str | None = None
    #: When the ask expires (unix seconds), if it is open.
    ask_deadline: float | None = None
    reply_text: str | None = None
    #: The harness's late word (``held``, ``delivered``, ``dropped:<why>``, ``unanswered:<why>``).
    receipt: str | None = None
    #: The journal records behind it, as written (at most :data:`MAX_RECORDS_PER_MESSAGE`).
    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def state(self) -> str:
        return self.steps[-1].state if self.steps else "unknown"

    @property
    def reason(self) -> str | None:
        return self.steps[-1].reason if self.steps else None

    @property
    def shown_kind(self) -> str:
        """The kind as people read it: an inform that answers a message is a ``reply`` (the
        reply tool sends one; its record says ``inform`` with ``in_reply_to``)."""
        return "reply" if self.in_reply_to and self.kind == "inform" else self.kind

    @property
    def first_ts(self) -> float:
        return self.steps[0].ts if self.steps else 0.0


@dataclass(frozen=True)
class Notice:
    """Something the watch could not read, shown as such (the watch keeps running)."""

    ts: float
    #: The file or agent it concerns.
    where: str
    what: str


ChangeKind = Literal["session_added", "session_changed", "session_left", "message",
                     "state", "ask", "receipt", "notice"]


@dataclass(frozen=True)
class Change:
    """One thing a poll found: ``line`` for ``--plain``, ``data`` (JSON-ready) for ``--json``."""

    kind: ChangeKind
    ts: float
    #: The session's key or the message's id (for a notice: its ``where``).
    key: str
    line: str
    data: dict[str, Any]


@dataclass
class Board:
    """The whole picture the feed keeps up to date."""

    sessions: dict[str, SessionView] = field(default_factory=dict)
    #: Oldest first; at most :data:`MAX_MESSAGES` (the oldest are forgotten first).
    messages: OrderedDict[str, MessageView] = field(default_factory=OrderedDict)
    notices: deque[Notice] = field(default_factory=lambda: deque(maxlen=MAX_NOTICES))
    max_messages: int = MAX_MESSAGES

    def keep(self, view: MessageView) -> None:
        """Add or refresh a message, forgetting the oldest past the bound."""
        self.messages[view.message_id] = view
        while len(self.messages) > self.max_messages:
            self.messages.popitem(last=False)

    def replies_to(self, message_id: str) -> list[MessageView]:
        return [m for m in self.messages.values() if m.in_reply_to == message_id]

    def thread(self, message_id: str) -> list[MessageView]:
        """The message's thread: up its ``in_reply_to`` chain to the first, then every reply
        under that, oldest first."""
        root = self.messages.get(message_id)
        seen: set[str] = set()
        while root is not None and root.in_reply_to and root.in_reply_to not in seen:
            seen.add(root.message_id)
            parent = self.messages.get(root.in_reply_to)
            if parent is None:
                break
            root = parent
        if root is None:
            return []
        out: list[MessageView] = []
        todo = [root]
        while todo:
            m = todo.pop(0)
            if m.message_id in {o.message_id for o in out}:
                continue
            out.append(m)
            todo.extend(self.replies_to(m.message_id))
        return sorted(out, key=lambda m: m.first_ts)
