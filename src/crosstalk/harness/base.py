"""The one seam between CrossTalk and a harness (like httpx's transports).

Everything harness-specific — how a session is bound, how text gets into it, how a message is
rendered for its model — sits behind :class:`Harness` and :class:`Identifier`. The receiver,
the shim and the A2A layer see only this module. :mod:`crosstalk.harness.fake` is a
first-class implementation used by tests, benchmarks and the demo.

What only some harnesses can do is declared here too, one Protocol per capability
(:class:`Binder`, :class:`ControlReceiver`, :class:`EagerRegistration`, :class:`Supersession`,
:class:`Reconciler`, :class:`Discovery`, :class:`ArgumentEvidence`, :class:`LiveSessions`).
They are checked once, when an identifier is loaded (:meth:`LoadedHarness.of`); the shim and
the agent use the typed fields of that record and never probe an object for a method.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from crosstalk.core.message import DeliveryMode, Message
from crosstalk.core.states import INJECTION_OUTCOMES, MessageState


@dataclass(frozen=True)
class Binding:
    """Which conversation on which server an agent is bound to (seed §3, F2)."""

    harness: str
    session_ref: str
    endpoint: str | None
    instance_id: str

    def same_conversation(self, other: Binding | dict[str, Any] | None) -> bool:
        if other is None:
            return False
        if isinstance(other, Binding):
            return (other.endpoint, other.session_ref) == (self.endpoint, self.session_ref)
        return (other.get("endpoint"), other.get("session_ref")) == (
            self.endpoint, self.session_ref)

    def as_record(self) -> dict[str, Any]:
        return {"harness": self.harness, "session_ref": self.session_ref,
                "endpoint": self.endpoint, "instance_id": self.instance_id}


@dataclass(frozen=True)
class Delivery:
    """One message to put into the bound session."""

    message: Message
    #: Where a native reply from the session would go (Claude: the injecting agent's uds path).
    reply_address: str | None = None

    @property
    def wake(self) -> bool:
        """Whether the delivery may start a turn: never for unverified senders (CQ3)."""
        return self.message.sender.verified and self.message.delivery is DeliveryMode.IMMEDIATE


@dataclass(frozen=True)
class Outcome:
    state: MessageState
    reason: str | None = None
    #: Harness evidence for the state (a Codex turn id, "socket open past grace", ...).
    evidence: str | None = None
    #: What the harness keeps watching after it answered (opencode: the turn a message joined,
    #: until the model takes it or the turn ends without it). The agent runs it in its task
    #: group once the outcome is back and applies the receipt it returns as it applies a late
    #: Claude receipt (:mod:`crosstalk.agent.followups`); a caller that does not run it loses
    #: only that later evidence, so it must hold nothing open until it is called.
    follow_up: FollowUp | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.state not in INJECTION_OUTCOMES:
            raise ValueError(f"an injection cannot end in {self.state!r}")


@runtime_checkable
class Harness(Protocol):
    """What every harness adapter provides."""

    name: str

    async def inject(self, binding: Binding, delivery: Delivery) -> Outcome:
        """Put the message into the session and report what the harness proved.

        ``accepted``/``queued`` need harness evidence; a definite refusal or a failure before
        anything was sent is ``unreachable``; anything ambiguous after sending is ``unknown``
        (never retried by the caller). Raising counts as ``unknown``.
        """
        ...


@dataclass(frozen=True)
class Identity:
    """Which session a tool call comes from, as one harness proves it (seed §3).

    Identity is per request, never per process: one shim may serve several sessions (Codex
    pools threads), so every ``tools/call`` is routed by its own evidence.
    """

    harness: str
    session_ref: str
    cwd: str
    session_name: str | None = None
    endpoint: str | None = None
    harness_pid: int | None = None


@runtime_checkable
class Identifier(Protocol):
    """The part of a harness that recognises its sessions in a request (trust order matters)."""

    name: str

    def identify(self, meta: Mapping[str, Any] | None) -> Identity | None:
        """The calling session if this request carries this harness's evidence, else ``None``."""
        ...

    def harness_for(self, identity: Identity) -> Harness:
        """The injector for that session."""
        ...


@dataclass(frozen=True)
class Session:
    """A harness session as the harness's own registry shows it, CrossTalk or not (seed §3).

    ``locator`` is the harness's own handle on it (Claude: the record path), opaque here.
    """

    harness: str
    session_ref: str
    name: str | None
    cwd: str | None
    #: idle | busy | shell | waiting | unknown (never guessed: no status is ``unknown``).
    status: str
    #: Whether a message can be put into it now (Claude: its inbox socket exists).
    reachable: bool
    pid: int | None = None
    locator: str | None = None
    #: Where the session receives (Claude: its inbox socket), for ``uds:<path>`` addresses.
    address: str | None = None
    #: Extra detail for people (Claude's ``waitingFor``).
    detail: str | None = None


@runtime_checkable
class Discovery(Protocol):
    """A harness whose sessions can be listed and messaged without CrossTalk in them.

    Such a session is listed and receives informs, put in natively by the *sender's* shim;
    it cannot send, and it cannot answer an ask (seed §3 "Discovery", test 26).
    """

    name: str
    #: True when one process holds one session at a time (Claude): a live process whose
    #: record names another session proves the old one superseded (``/clear``). Codex serves
    #: several threads per process, so for it this is no evidence (seed §3).
    supersession: bool

    def discover(self) -> list[Session]:
        """Every live session this harness knows of on this machine (blocking file reads)."""
        ...

    async def send_native(self, session: Session, delivery: Delivery) -> Outcome:
        """Put an inform into a session that has no CrossTalk, from ``delivery.reply_address``."""
        ...


@runtime_checkable
class AsyncDiscovery(Discovery, Protocol):
    """A discovery whose listing is network I/O (Codex asks each app-server over a socket):
    ``discover_async`` runs on the event loop that owns the caller (the shim's), so listing
    from that loop never starts a loop of its own; ``crosstalk agents`` (no loop) keeps
    calling ``discover``."""

    async def discover_async(self) -> list[Session]:
        """What :meth:`Discovery.discover` returns, awaited on the caller's event loop."""
        ...


@dataclass(frozen=True)
class Receipt:
    """What a harness said about a message after it took it (Claude's peer_message_status):
    ``held``, ``dropped``, ``delivered``, ``denied`` or ``expired``."""

    message_id: str
    status: str
    reason: str | None = None
    #: The harness's own id of the frame (Claude's ``msg_id``).
    frame_id: str | None = None


#: A harness's later look at a message it answered for (:attr:`Outcome.follow_up`): the
#: receipt it ends with, or ``None`` when it learned nothing worth journaling.
FollowUp = Callable[[], Awaitable[Receipt | None]]

#: A control frame that reached an agent's uds ingress, with the peer's pid and start time:
#: returns the receipts in it that nobody was waiting for (the agent applies them).
ControlSink = Callable[[Mapping[str, Any], int | None, str | None], list[Receipt]]


# -- optional capabilities of an identifier (checked once, by LoadedHarness.of) ---------------


@runtime_checkable
class Binder(Protocol):
    """Gathers harness evidence once, before a session's agent registers (Codex: the thread's
    host app-server and its name there). Identity by ``session_ref`` is unchanged."""

    async def bind(self, identity: Identity) -> Identity:
        ...


@runtime_checkable
class ControlReceiver(Protocol):
    """Reads control frames that reach an agent's uds ingress (Claude's receipts)."""

    def on_control(self, frame: Mapping[str, Any], peer_pid: int | None,
                   peer_start: str | None) -> list[Receipt]:
        """The receipts in ``frame`` that nobody was waiting for (the agent applies them)."""
        ...


@runtime_checkable
class EagerRegistration(Protocol):
    """A session evidenced before any call (Claude: the parent's record): when ``eager`` is
    true the shim registers it at start and on every poll, not on its first call."""

    eager: bool


@runtime_checkable
class Supersession(Protocol):
    """When ``supersession`` is true one process holds one session at a time (Claude): a new
    session of that harness in a shim retires the others (``/clear``)."""

    supersession: bool


@runtime_checkable
class Reconciler(Protocol):
    """Finds positive evidence that an ambiguous injection reached its session (Codex: a turn
    carrying the message-id, seed test 20); ``None`` is no evidence either way."""

    async def reconcile(self, binding: Binding, message_id: str) -> Outcome | None:
        ...


@runtime_checkable
class ArgumentEvidence(Protocol):
    """A harness whose evidence travels in the call's *arguments* (opencode's plugin stamps
    ``_opencode: {sessionID, callID}`` there: its ``_meta`` holds only a progress token).

    The shim removes the argument named ``stamp`` from every call before the tools see the
    arguments (they refuse what they do not know), whoever's the call turns out to be and
    even when this identifier refuses it; only this identifier is shown the stamp's value.
    Trust order still decides which identifier is asked first (ADR 0022)."""

    #: The argument this harness's host stamps into calls of CrossTalk's tools.
    stamp: str

    def identify_stamped(self, meta: Mapping[str, Any] | None,
                         stamp: object) -> Identity | None:
        """The calling session from ``meta`` and the stamp's value (``None``: no stamp), or
        ``None`` when this evidence does not hold (never raises for a malformed stamp)."""
        ...


@runtime_checkable
class LiveSessions(Protocol):
    """Sessions that are full agents before any call, several per shim (opencode: every root
    session its host instance shows live, pooled in the one shim of that instance).

    ``live_sessions`` yields, each time the harness's evidence changes, the *whole* set of
    this harness's sessions live now (not a delta); the shim registers new ones (up to its
    cap) and retires those it registered from an earlier set that are gone from this one.
    The iterator may end (its host went away); the shim starts it again on its next poll.
    A harness must yield only sessions it has positive evidence for: the set is taken as the
    truth, and a session missing from it is retired (ADR 0022)."""

    def live_sessions(self) -> AsyncIterator[Sequence[Identity]]:
        ...


@dataclass(frozen=True)
class LoadedHarness:
    """An identifier with each optional capability checked once, as the shim and agent use it.

    A capability the identifier lacks is ``None`` (or ``False``); nobody probes the identifier
    afterwards."""

    identifier: Identifier
    binder: Binder | None = None
    control: ControlReceiver | None = None
    reconciler: Reconciler | None = None
    discovery: Discovery | None = None
    arguments: ArgumentEvidence | None = None
    live: LiveSessions | None = None
    eager: bool = False
    supersession: bool = False

    @property
    def name(self) -> str:
        return self.identifier.name

    @classmethod
    def of(cls, identifier: Identifier) -> LoadedHarness:
        return cls(
            identifier,
            binder=identifier if isinstance(identifier, Binder) else None,
            control=identifier if isinstance(identifier, ControlReceiver) else None,
            reconciler=identifier if isinstance(identifier, Reconciler) else None,
            discovery=identifier if isinstance(identifier, Discovery) else None,
            arguments=identifier if isinstance(identifier, ArgumentEvidence) else None,
            live=identifier if isinstance(identifier, LiveSessions) else None,
            eager=isinstance(identifier, EagerRegistration) and bool(identifier.eager),
            supersession=(isinstance(identifier, Supersession)
                          and bool(identifier.supersession)))
