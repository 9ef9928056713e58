"""How CrossTalk fields ride on A2A 1.0 messages and tasks (seed §4): the ``crosstalk.*``
metadata namespace, shared by the server and the client.

On a request every key is optional: a plain text ``SendMessage`` with no metadata is an
``inform`` delivered ``immediate``. ``crosstalk.control`` (``claim`` | ``release``) turns the
request into a control request (seed §7 claims): it never reaches the session as a message;
the server answers it with a task whose ``crosstalk.control_result`` says what happened, and
a server that handles it advertises :data:`CONTROL_EXTENSION` on its Agent Card.

On a task the server reports, per the message the task
is currently about, its receiver state (``crosstalk.state``), the reason, and on completion
what completed it (``crosstalk.completion``: ``delivered`` or ``answered``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from crosstalk.core.message import DeliveryMode, Kind

# request metadata (Message.metadata)
KIND = "crosstalk.kind"
DELIVERY = "crosstalk.delivery"
DEADLINE = "crosstalk.deadline_seconds"
HOP_CHAIN = "crosstalk.hop_chain"
IN_REPLY_TO = "crosstalk.in_reply_to"
CONTROL = "crosstalk.control"

# task metadata (Task.metadata), written by the server
MESSAGE_ID = "crosstalk.message_id"
STATE = "crosstalk.state"
REASON = "crosstalk.reason"
COMPLETION = "crosstalk.completion"
ASK = "crosstalk.ask"
TASK_KIND = "crosstalk.kind"
#: On a control request's task: {"ok": bool, "reason": str|None, "role": str, "owner": str|None}
CONTROL_RESULT = "crosstalk.control_result"

#: The control operations (claim/release, seed §7) and the Agent Card extension that says a
#: server handles them. A client sends a control request only to a card that lists it: a peer
#: that does not know ``crosstalk.control`` would deliver the request's text as an inform.
CONTROL_OPS = ("claim", "release")
CONTROL_EXTENSION = "urn:crosstalk:a2a:control:1"

#: JSON-RPC error data key carrying CrossTalk's reason (inside google.rpc.ErrorInfo metadata).
ERROR_REASON = "reason"
ERROR_STATE = "crosstalk.state"

COMPLETION_DELIVERED = "delivered"
COMPLETION_ANSWERED = "answered"

MAX_ID_LEN = 128
#: An ask deadline longer than this is refused (a timer a month out is a typo, not a plan).
MAX_DEADLINE_SECONDS = 30 * 24 * 3600
_ID_RE = re.compile(r"^[\x21-\x7e]{1,128}$")


class MetadataError(ValueError):
    """The request's ``crosstalk.*`` metadata is malformed; ``reason`` is machine-readable."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


@dataclass(frozen=True)
class RequestFields:
    kind: Kind = Kind.INFORM
    delivery: DeliveryMode = DeliveryMode.IMMEDIATE
    deadline_seconds: int = 0
    hop_chain: tuple[str, ...] = ()
    in_reply_to: str | None = None
    #: ``claim`` | ``release`` on a control request, else ``None``.
    control: str | None = None


def valid_id(value: str) -> bool:
    """A message, task or context id we accept: 1-128 printable ASCII, no spaces."""
    return bool(_ID_RE.fullmatch(value))


def decode_request_metadata(meta: Mapping[str, Any]) -> RequestFields:
    """Read the ``crosstalk.*`` keys of a request message; raise :class:`MetadataError`."""
    kind_raw = meta.get(KIND)
    if kind_raw is None:
        kind = Kind.INFORM
    elif isinstance(kind_raw, str) and kind_raw in {k.value for k in Kind}:
        kind = Kind(kind_raw)
    else:
        raise MetadataError("unknown_kind", f"{KIND} must be inform, command or ask")

    delivery_raw = meta.get(DELIVERY)
    if delivery_raw is None:
        delivery = DeliveryMode.IMMEDIATE
    elif isinstance(delivery_raw, str) and delivery_raw in {d.value for d in DeliveryMode}:
        delivery = DeliveryMode(delivery_raw)
    else:
        raise MetadataError("bad_delivery", f"{DELIVERY} must be immediate or next_turn")

    deadline_raw = meta.get(DEADLINE)
    deadline = 0
    if deadline_raw is not None:
        if (isinstance(deadline_raw, bool) or not isinstance(deadline_raw, int | float)
                or not math.isfinite(deadline_raw) or deadline_raw < 0
                or deadline_raw != int(deadline_raw) or deadline_raw > MAX_DEADLINE_SECONDS):
            raise MetadataError("bad_deadline",
                                f"{DEADLINE} must be a whole number of seconds, "
                                f"0..{MAX_DEADLINE_SECONDS}")
        deadline = int(deadline_raw)

    hops_raw = meta.get(HOP_CHAIN)
    hops: tuple[str, ...] = ()
    if hops_raw is not None:
        if not isinstance(hops_raw, list) or not all(isinstance(h, str) for h in hops_raw):
            raise MetadataError("hop_chain_malformed", f"{HOP_CHAIN} must be a list of strings")
        hops = tuple(hops_raw)

    reply_raw = meta.get(IN_REPLY_TO)
    in_reply_to: str | None = None
    if reply_raw is not None:
        if not isinstance(reply_raw, str) or not valid_id(reply_raw):
            raise MetadataError("bad_in_reply_to", f"{IN_REPLY_TO} must be a message id")
        in_reply_to = reply_raw
    fields = RequestFields(kind, delivery, deadline, hops, in_reply_to)
    control = _decode_control(meta.get(CONTROL), fields)
    return fields if control is None else replace(fields, control=control)


def _decode_control(raw: Any, fields: RequestFields) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, str) or raw not in CONTROL_OPS:
        raise MetadataError("bad_control", f"{CONTROL} must be claim or release")
    if fields != RequestFields():
        # A control request is not a message: nothing about delivery applies to it, and a
        # combination is a confused (or probing) client, refused rather than guessed at.
        raise MetadataError("bad_control", f"{CONTROL} cannot be combined with message metadata")
    return raw


def encode_request_metadata(*, kind: str = "inform", delivery: str = "immediate",
                            deadline_seconds: int = 0, in_reply_to: str | None = None,
                            hop_chain: list[str] | None = None,
                            control: str | None = None) -> dict[str, Any]:
    """The metadata a CrossTalk client puts on a message (defaults are left out)."""
    meta: dict[str, Any] = {}
    if control is not None:
        meta[CONTROL] = control
    if kind != Kind.INFORM.value:
        meta[KIND] = kind
    if delivery != DeliveryMode.IMMEDIATE.value:
        meta[DELIVERY] = delivery
    if deadline_seconds:
        meta[DEADLINE] = deadline_seconds
    if in_reply_to:
        meta[IN_REPLY_TO] = in_reply_to
    if hop_chain:
        meta[HOP_CHAIN] = list(hop_chain)
    return meta
