"""The errors a CrossTalk A2A server refuses a request with (no task created).

Each carries the reason in the error's ``google.rpc.ErrorInfo`` metadata
(:data:`crosstalk.a2a.wire.ERROR_REASON`) and the send state it means
(:data:`crosstalk.a2a.wire.ERROR_STATE`): ``rejected``, or ``unreachable`` for a receiver
that could not store the message. Either is definite: nothing was accepted.
"""

from __future__ import annotations

from a2a.server.context import ServerCallContext
from a2a.server.jsonrpc_models import JSONRPCError
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


#: JSON-RPC code of a request refused for its credentials. The A2A spec names none (§7.4:
#: "binding-specific"; its JSON-RPC table, §5.4, has no authentication error) and claims
#: -32001..-32099 for its own errors; -32000 is the one server-error code (JSON-RPC 2.0
#: reserves -32000..-32099) it leaves free. Not -32600: clients read that as a malformed
#: request (``@a2a-js/sdk`` maps it to ``RequestMalformedError``) and give up on a request a
#: fresh token would let through.
UNAUTHENTICATED = -32000


def unauthenticated_error() -> JSONRPCError:
    """The JSON-RPC error a ``401`` carries: no registered agent's bearer token came with it.

    ``google.rpc.ErrorInfo`` like every other refusal, with the reason a client branches on
    (``UNAUTHENTICATED``, gRPC's name for it) and CrossTalk's reason and state (``rejected``:
    nothing was journaled or delivered). Never the presented token.
    """
    return JSONRPCError(
        code=UNAUTHENTICATED,
        message="unauthorized: a registered agent's bearer token is required",
        data=[{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
               "reason": "UNAUTHENTICATED", "domain": "crosstalk",
               "metadata": {wire.ERROR_REASON: "unauthorized",
                            wire.ERROR_STATE: M.REJECTED.value}}])


def require_sender(context: ServerCallContext) -> Sender:
    """The sender the bearer guard verified; a request without one is refused."""
    sender = sender_of(context)
    if sender is None:
        raise InvalidRequestError(message="unauthorized",
                                  data={wire.ERROR_REASON: "unauthorized"})
    return sender
