"""The errors a CrossTalk A2A server refuses a request with (no task created).

Each carries the reason in the error's ``google.rpc.ErrorInfo`` metadata
(:data:`crosstalk.a2a.wire.ERROR_REASON`), so any client maps it to ``rejected``.
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
