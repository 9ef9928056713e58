"""The errors a CrossTalk A2A server refuses a request with (no task created).

Each carries the reason in the error's ``google.rpc.ErrorInfo`` metadata
(:data:`crosstalk.a2a.wire.ERROR_REASON`) and the send state it means
(:data:`crosstalk.a2a.wire.ERROR_STATE`): ``rejected``, or ``unreachable`` for a receiver
that could not store the message. Either is definite: nothing was accepted.
"""

from __future__ import annotations

from a2a.server.context import ServerCallContext
from a2a.utils.errors import InvalidParamsError, InvalidRequestError

from crosstalk.a2a import wire
from crosstalk.a2a.taskstore import sender_of
from crosstalk.core.message import Sender
from crosstalk.core.states import MessageState

M = MessageState


def rejected_error(reason: str, detail: str | None = None) -> InvalidRequestError:
    """A request CrossTalk refused with no task created (admission, policy on a continuation).

    JSON-RPC ``-32600`` like the body cap (seed WA1), with the reason in the error's
    ``google.rpc.ErrorInfo`` metadata, so any client maps it to ``rejected``.
    """
    return InvalidRequestError(
        message=f"rejected: {reason}" + (f" ({detail})" if detail else ""),
        data={wire.ERROR_REASON: reason, wire.ERROR_STATE: M.REJECTED.value})


def journal_unavailable_error() -> InvalidRequestError:
    """The receiver could not journal the message (a full disk), so it accepted nothing.

    A definite refusal, not ``InternalError`` (-32603), which a client must read as "maybe
    delivered": nothing was journaled or dispatched, and the same request may succeed later.
    ``-32600`` like every refusal before a task; the state is ``unreachable`` (a system
    failure at the receiver, not a verdict on the message). The OS error stays in the
    receiver's log: it names local paths.
    """
    return InvalidRequestError(
        message="unavailable: journal_unavailable (the receiver could not store the message; "
                "nothing was accepted; retry later)",
        data={wire.ERROR_REASON: "journal_unavailable", wire.ERROR_STATE: M.UNREACHABLE.value})


def invalid_params(reason: str, detail: str) -> InvalidParamsError:
    """Malformed params (ids, metadata, control): rejected, with the reason."""
    return InvalidParamsError(message=f"{detail}",
                              data={wire.ERROR_REASON: reason, wire.ERROR_STATE: M.REJECTED.value})


def require_sender(context: ServerCallContext) -> Sender:
    """The sender the bearer guard verified; a request without one is refused."""
    sender = sender_of(context)
    if sender is None:
        raise InvalidRequestError(message="unauthorized",
                                  data={wire.ERROR_REASON: "unauthorized"})
    return sender
