"""The internal message record (seed §4, F12): what the receiver chain and the mailbox hold.

It is not a wire format. Each ingress decodes its own wire shape into a :class:`Message`
whose :class:`Sender` it has *verified* (A2A bearer token, uds peer credentials); nothing a
frame says about itself ever becomes identity (seed §7).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

#: What a lone surrogate becomes (seed §5 "bad input"): the Unicode replacement character.
REPLACEMENT = "\ufffd"


class Kind(StrEnum):
    INFORM = "inform"
    COMMAND = "command"
    ASK = "ask"


class DeliveryMode(StrEnum):
    IMMEDIATE = "immediate"
    NEXT_TURN = "next_turn"


class Ingress(StrEnum):
    A2A = "a2a"
    UDS = "uds"  # Claude-compatible socket: native frames and `crosstalk send`
    LOCAL = "local"  # the shim itself (claim notices, bounces)


UNVERIFIED = "unverified"


@dataclass(frozen=True)
class Sender:
    """Who a message is from, as far as the transport proves it.

    ``agent_id`` is set only for a registered agent the transport verified; ``name`` and
    ``role`` are then read from that agent's registration, never from the message.
    """

    agent_id: str | None
    name: str | None = None
    role: str | None = None  # "primary" | "subagent" for registered agents
    ingress: Ingress = Ingress.A2A
    peer_pid: int | None = None
    #: The address a native reply would go to (display and routing hints only).
    reply_address: str | None = None

    @property
    def verified(self) -> bool:
        return self.agent_id is not None

    @property
    def key(self) -> str:
        """The dedupe namespace of this sender: its agent_id, or one bucket for the unverified."""
        return self.agent_id or UNVERIFIED

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        return self.agent_id or UNVERIFIED


@dataclass(frozen=True)
class Message:
    message_id: str
    sender: Sender
    text: str
    kind: Kind = Kind.INFORM
    delivery: DeliveryMode = DeliveryMode.IMMEDIATE
    in_reply_to: str | None = None
    context_id: str | None = None
    task_id: str | None = None
    deadline_seconds: int = 0
    hop_chain: tuple[str, ...] = ()
    sent_at: float | None = None
    #: An A2A request that named an existing taskId (seed R2 treats these differently).
    continuation: bool = False
    #: True for a uds frame without our metadata: it got a fresh message_id on arrival and is
    #: exempt from dedupe (identical repeated text is legal, seed F6).
    native: bool = False
    #: Anything the wire carried that we keep for display (e.g. Claude's from-name), untrusted.
    asserted: dict[str, str] = field(default_factory=dict)
    #: The fields whose lone surrogates were replaced on arrival (:func:`with_valid_unicode`).
    repaired: tuple[str, ...] = ()

    @property
    def text_bytes(self) -> int:
        return len(self.text.encode())


def valid_unicode(text: str) -> str:
    """``text`` as valid Unicode: a surrogate pair becomes its character, a lone surrogate
    U+FFFD.

    JSON (and so a JavaScript sender, or Claude's native SendMessage) can carry a lone
    surrogate escape such as ``"\\ud83d"`` (a truncated emoji); UTF-8 cannot encode it, so it
    could not be journaled, injected or measured. The rule on every ingress is the same:
    repair and deliver, with the repair journaled (``Message.repaired``), never drop.
    """
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def valid_unicode_json(node: Any, path: tuple[Any, ...] = (),
                       found: list[tuple[Any, ...]] | None = None) -> Any:
    """Parsed JSON with every string, keys included, made valid Unicode (:func:`valid_unicode`).

    Each place a string was repaired is appended to ``found`` as its path from ``node``. The
    walk recurses, so the caller bounds the depth (or catches ``RecursionError``).
    """
    if isinstance(node, str):
        good = valid_unicode(node)
        if good != node and found is not None:
            found.append(path)
        return good
    if isinstance(node, list):
        return [valid_unicode_json(item, (*path, i), found) for i, item in enumerate(node)]
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            good = valid_unicode(key)
            if good != key and found is not None:
                found.append((*path, key))
            out[good] = valid_unicode_json(value, (*path, key), found)
        return out
    return node


def with_valid_unicode(msg: Message) -> Message:
    """``msg`` with every text field it carries made valid Unicode; ``repaired`` names them."""
    fixed: dict[str, object] = {}
    fields = {"text": msg.text, "in_reply_to": msg.in_reply_to, "context_id": msg.context_id,
              "task_id": msg.task_id}
    for name, value in fields.items():
        if value is not None and (good := valid_unicode(value)) != value:
            fixed[name] = good
    hops = tuple(valid_unicode(h) for h in msg.hop_chain)
    if hops != msg.hop_chain:
        fixed["hop_chain"] = hops
    asserted = {valid_unicode(k): valid_unicode(v) for k, v in msg.asserted.items()}
    if asserted != msg.asserted:
        fixed["asserted"] = asserted
    if not fixed:
        return msg
    return replace(msg, repaired=(*msg.repaired, *sorted(fixed)), **fixed)  # type: ignore[arg-type]
