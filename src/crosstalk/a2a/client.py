"""Sending to a peer agent's A2A endpoint, on the official a2a-sdk client.

What a shim calls to deliver ``send_message`` / ``ask`` / ``reply`` to a peer: resolve the
peer's Agent Card, get the SDK client (``ClientFactory``, JSON-RPC, no streaming) with the
sender's **own** bearer token through the SDK's ``AuthInterceptor``, send one message, and
map whatever happened onto the send states of seed §8:

===========================================  ===============================================
what happened                                state
===========================================  ===============================================
a task came back                             its ``crosstalk.state`` (accepted, queued, ...)
a JSON-RPC error (policy, admission, cap)    ``rejected`` with the server's reason
the peer could not store it (its journal)    ``unreachable`` / ``journal_unavailable``
HTTP 401/403                                 ``rejected`` (``unauthorized``)
nothing could be sent (refused, no card)     ``unreachable``
no response byte came back                   sent once more, on a fresh connection
timeout or partial answer after sending      ``unknown`` (never resent by us)
===========================================  ===============================================

The one repeat (for a pooled connection the server closed as it was reused) and when it is
safe: :func:`crosstalk.a2a.transport.at_most_twice`.

The card and the SDK client are kept per peer between sends, and where the token may go is
checked on every card: :mod:`crosstalk.a2a.peers`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import httpx
from a2a.client import (
    A2AClientError,
    A2AClientTimeoutError,
    AgentCardResolutionError,
    Client,
    ClientCallContext,
)
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import A2A_ERROR_REASONS, A2AError, InternalError
from google.protobuf.json_format import MessageToDict

from crosstalk.a2a import wire
from crosstalk.a2a.peers import PeerCards, Refused, connect, fresh_card_on_stale
from crosstalk.a2a.transport import Attempt, at_most_twice
from crosstalk.config import DELIVERY_TIMEOUT
from crosstalk.core.ids import new_message_id
from crosstalk.core.message import valid_unicode

DEFAULT_TIMEOUT = 30.0
#: An ask sent with the default wait blocks until it is answered; without a deadline the
#: server gives up after its own cap (15 min by default), so wait a little longer than that.
ASK_WITHOUT_DEADLINE_TIMEOUT = 960.0

_TASK_STATES = {
    pb.TASK_STATE_SUBMITTED: "submitted", pb.TASK_STATE_WORKING: "working",
    pb.TASK_STATE_INPUT_REQUIRED: "input_required", pb.TASK_STATE_COMPLETED: "completed",
    pb.TASK_STATE_FAILED: "failed", pb.TASK_STATE_CANCELED: "canceled",
    pb.TASK_STATE_REJECTED: "rejected", pb.TASK_STATE_AUTH_REQUIRED: "auth_required",
}
#: What a task state means for delivery when the peer says nothing CrossTalk-specific.
_PLAIN_TASK_STATE = {
    "submitted": "submitted", "working": "unknown", "input_required": "accepted",
    "completed": "accepted", "failed": "unreachable", "canceled": "canceled",
    "rejected": "rejected", "auth_required": "rejected",
}


@dataclass(frozen=True)
class SendResult:
    """The outcome of one send, in CrossTalk's terms (and the task behind it, if any)."""

    message_id: str
    #: accepted | queued | rejected | unreachable | unknown (send states, seed §8); also
    #: submitted/dispatching while the peer has not dispatched yet, and canceled.
    state: str
    reason: str | None = None
    task_id: str | None = None
    #: The A2A task state (submitted, working, completed, failed, canceled, rejected).
    task_state: str | None = None
    #: The answer of an ask, once the peer's session replied.
    reply: str | None = None
    #: ``delivered`` / ``answered`` when the task completed.
    completion: str | None = None


async def send(url: str, token: str, text: str, *, kind: str = "inform",
               delivery: str = "immediate", deadline_seconds: int = 0,
               message_id: str | None = None, in_reply_to: str | None = None,
               context_id: str | None = None, task_id: str | None = None,
               hop_chain: list[str] | None = None, return_immediately: bool = False,
               until_delivered: bool = False, timeout: float | None = None,
               expect_name: str | None = None,
               httpx_client: httpx.AsyncClient | None = None,
               cards: PeerCards | None = None) -> SendResult:
    """Send one message to the agent at ``url`` as the agent whose bearer ``token`` this is.

    ``message_id`` defaults to a fresh UUIDv7; pass the same one to retry (the peer dedupes on
    (sender, message_id) and answers with the prior state). ``task_id`` continues a task.

    Waiting: by default the call waits for the peer's terminal answer (an ask: until it is
    answered or expires). ``return_immediately`` returns at once (state ``submitted``);
    ``until_delivered`` returns once the delivery outcome is known, without waiting for an
    ask's answer (what the ``ask`` tool wants). ``expect_name`` refuses a peer whose card
    names someone else (a port reused by another agent). ``cards``, kept with the pooled
    ``httpx_client``, saves the card fetch and the SDK client's construction per send.
    """
    mid = message_id or new_message_id()
    if timeout is None:
        timeout = _default_timeout(kind, deadline_seconds,
                                   waits=not (return_immediately or until_delivered))
    # The A2A wire (protobuf strings) cannot carry a lone surrogate: repair, never fail.
    message = pb.Message(message_id=mid, role=pb.ROLE_USER,
                         parts=[pb.Part(text=valid_unicode(text))],
                         context_id=context_id or "", task_id=task_id or "")
    meta = wire.encode_request_metadata(kind=kind, delivery=delivery,
                                        deadline_seconds=deadline_seconds,
                                        in_reply_to=in_reply_to, hop_chain=hop_chain)
    if meta:
        message.metadata.update(meta)
    # history_length 0: the answer is read from the task's status and metadata alone
    # (result_from_task), so the peer need not write the message back nor we parse it again.
    request = pb.SendMessageRequest(
        message=message,
        configuration=pb.SendMessageConfiguration(
            return_immediately=return_immediately or until_delivered, history_length=0))

    async def attempt(http: httpx.AsyncClient | None, budget: float) -> Attempt[SendResult]:
        started = time.monotonic()
        sent = False
        try:
            async with connect(url, token, timeout=budget, httpx_client=http,
                                expect_name=expect_name, cards=cards) as (client, ctx):
                sent = True
                task: pb.Task | None = None
                async for event in client.send_message(request, context=ctx):
                    if event.HasField("task"):
                        task = event.task
                    elif event.HasField("message"):
                        return Attempt(SendResult(mid, "accepted",
                                                   "peer_answered_with_message"))
                if task is None:
                    return Attempt(SendResult(mid, "unknown", "no_task_in_response"))
                if until_delivered:
                    task = await _poll_delivery(client, ctx, task,
                                                budget - (time.monotonic() - started))
                    if _pending(task):
                        return Attempt(SendResult(
                            mid, "unknown", "delivery_pending", task.id,
                            _TASK_STATES.get(task.status.state, "unknown")))
                return Attempt(result_from_task(task, mid))
        except Refused as exc:
            return Attempt(SendResult(mid, exc.state, exc.reason), exc, sent)
        except (A2AError, httpx.HTTPError) as exc:
            state, reason = classify_error(exc, sent=sent)
            return Attempt(SendResult(mid, state, reason), exc, sent)

    # Repeatable: the peer dedupes on (sender, message_id) and answers a repeat with the
    # state the first copy reached, so even a request it processed is safe to send again.
    last, earlier_may_have_arrived = await at_most_twice(
        url, fresh_card_on_stale(url, cards, attempt), httpx_client=httpx_client,
        timeout=timeout, repeatable=True)
    if earlier_may_have_arrived and last.failure is not None and (
            last.result.state == "unreachable"):
        # The repeat found nobody, but the first copy may have been delivered.
        return replace(last.result, state="unknown")
    return last.result


@dataclass(frozen=True)
class ControlOutcome:
    """The answer to a claim/release request (``crosstalk.control_result``), or why none came.

    ``state`` is ``accepted`` when the target answered (whatever it decided: read ``ok``),
    else the send state of the failure (``rejected``, ``unreachable`` or ``unknown``: the
    request may have been applied, check the target's descriptor).
    """

    ok: bool
    state: str
    reason: str | None = None
    role: str | None = None
    owner: str | None = None
    notice: str | None = None


async def control(url: str, token: str, op: str, *, text: str,
                  timeout: float = DEFAULT_TIMEOUT, expect_name: str | None = None,
                  httpx_client: httpx.AsyncClient | None = None,
                  cards: PeerCards | None = None) -> ControlOutcome:
    """Send a claim/release control request to the agent at ``url`` as ``token``'s agent.

    Only to a peer whose card lists :data:`wire.CONTROL_EXTENSION`: any other peer would take
    the request for a plain message and put ``text`` into its session.
    """
    if op not in wire.CONTROL_OPS:
        raise ValueError(f"unknown control operation {op!r}")
    message = pb.Message(message_id=new_message_id(), role=pb.ROLE_USER,
                         parts=[pb.Part(text=text)])
    message.metadata.update(wire.encode_request_metadata(control=op))
    request = pb.SendMessageRequest(message=message,
                                    configuration=pb.SendMessageConfiguration())

    async def attempt(http: httpx.AsyncClient | None, budget: float) -> Attempt[ControlOutcome]:
        sent = False
        try:
            async with connect(url, token, timeout=budget, httpx_client=http,
                                expect_name=expect_name,
                                require_extension=wire.CONTROL_EXTENSION,
                                cards=cards) as (client, ctx):
                sent = True
                async for event in client.send_message(request, context=ctx):
                    if event.HasField("task"):
                        return Attempt(_control_outcome(event.task))
                return Attempt(ControlOutcome(False, "unknown", "no_task_in_response"))
        except Refused as exc:
            return Attempt(ControlOutcome(False, exc.state, exc.reason), exc, sent)
        except (A2AError, httpx.HTTPError) as exc:
            state, reason = classify_error(exc, sent=sent)
            return Attempt(ControlOutcome(False, state, reason), exc, sent)

    # Not repeatable once sent: the target does not dedupe control requests.
    last, _ = await at_most_twice(url, fresh_card_on_stale(url, cards, attempt),
                                  httpx_client=httpx_client, timeout=timeout,
                                   repeatable=False)
    return last.result


def _control_outcome(task: pb.Task) -> ControlOutcome:
    meta = MessageToDict(task.metadata) if task.HasField("metadata") else {}
    result = meta.get(wire.CONTROL_RESULT)
    if not isinstance(result, dict) or not isinstance(result.get("ok"), bool):
        return ControlOutcome(False, "unknown", "no_control_result")

    def opt(key: str) -> str | None:
        value = result.get(key)
        return value if isinstance(value, str) else None

    return ControlOutcome(result["ok"], "accepted", opt("reason"), opt("role"), opt("owner"),
                          opt("notice"))


async def get_task(url: str, token: str, task_id: str, *, timeout: float = DEFAULT_TIMEOUT,
                   history_length: int | None = None,
                   httpx_client: httpx.AsyncClient | None = None) -> SendResult:
    """The current state of a task this sender created (``rejected``/task_not_found else)."""
    req = pb.GetTaskRequest(id=task_id)
    if history_length is not None:
        req.history_length = history_length
    return await _task_call(url, token, task_id, timeout=timeout, httpx_client=httpx_client,
                            repeatable=True,  # a read
                            call=lambda client, ctx: client.get_task(req, context=ctx))


async def cancel_task(url: str, token: str, task_id: str, *,
                      timeout: float = DEFAULT_TIMEOUT,
                      httpx_client: httpx.AsyncClient | None = None) -> SendResult:
    """Cancel a task that no dispatch has claimed yet; else ``rejected``/task_not_cancelable."""
    req = pb.CancelTaskRequest(id=task_id)
    # Not repeatable once sent: a repeat of a cancel that was applied says not cancelable.
    return await _task_call(url, token, task_id, timeout=timeout, httpx_client=httpx_client,
                            repeatable=False,
                            call=lambda client, ctx: client.cancel_task(req, context=ctx))


async def _task_call(url: str, token: str, task_id: str, *, timeout: float,
                     httpx_client: httpx.AsyncClient | None, repeatable: bool,
                     call: Callable[[Client, ClientCallContext], Awaitable[pb.Task]],
                     cards: PeerCards | None = None) -> SendResult:
    async def attempt(http: httpx.AsyncClient | None, budget: float) -> Attempt[SendResult]:
        sent = False
        try:
            async with connect(url, token, timeout=budget, httpx_client=http,
                               cards=cards) as (
                    client, ctx):
                sent = True
                return Attempt(result_from_task(await call(client, ctx), None))
        except Refused as exc:
            return Attempt(SendResult("", exc.state, exc.reason, task_id), exc, sent)
        except (A2AError, httpx.HTTPError) as exc:
            state, reason = classify_error(exc, sent=True)
            return Attempt(SendResult("", state, reason, task_id), exc, sent)

    last, _ = await at_most_twice(url, fresh_card_on_stale(url, cards, attempt),
                                  httpx_client=httpx_client, timeout=timeout,
                                  repeatable=repeatable)
    return last.result


def _default_timeout(kind: str, deadline_seconds: int, *, waits: bool) -> float:
    if kind == "ask" and waits:
        return (deadline_seconds + DELIVERY_TIMEOUT if deadline_seconds
                else ASK_WITHOUT_DEADLINE_TIMEOUT)
    return DELIVERY_TIMEOUT


def result_from_task(task: pb.Task, message_id: str | None) -> SendResult:
    """Read a task the CrossTalk way (``crosstalk.*`` metadata), or plainly for other peers."""
    meta = MessageToDict(task.metadata) if task.HasField("metadata") else {}
    task_state = _TASK_STATES.get(task.status.state, "unknown")
    state = meta.get(wire.STATE)
    if not isinstance(state, str):
        state = _PLAIN_TASK_STATE.get(task_state, "unknown")
    reason = meta.get(wire.REASON)
    completion = meta.get(wire.COMPLETION)
    reply = None
    if completion == wire.COMPLETION_ANSWERED and task.status.HasField("message"):
        reply = "\n".join(p.text for p in task.status.message.parts
                          if p.WhichOneof("content") == "text")
    mid = meta.get(wire.MESSAGE_ID)
    return SendResult(
        message_id=message_id or (mid if isinstance(mid, str) else ""),
        state=state, reason=reason if isinstance(reason, str) else None, task_id=task.id,
        task_state=task_state, reply=reply,
        completion=completion if isinstance(completion, str) else None)


def classify_error(exc: BaseException, *, sent: bool) -> tuple[str, str]:
    """(state, reason) for a failed call; ``sent`` = the request may have left this process."""
    if isinstance(exc, AgentCardResolutionError):
        if exc.status_code in (401, 403):
            return "rejected", "unauthorized"
        return "unreachable", _card_reason(exc)
    if isinstance(exc, A2AClientTimeoutError):
        return ("unknown", "timeout") if sent else ("unreachable", "timeout")
    if isinstance(exc, A2AClientError):
        return _transport_error(exc.__cause__, sent=sent)
    if isinstance(exc, httpx.HTTPError):
        return _transport_error(exc, sent=sent)
    if isinstance(exc, InternalError):
        # The peer failed while handling it: accepted or not, nobody can say.
        return "unknown", _reason_of(exc)
    if isinstance(exc, A2AError):
        return _refusal_state(exc), _reason_of(exc)
    return "unknown", type(exc).__name__


def _refusal_state(exc: A2AError) -> str:
    """``unreachable`` where the peer says it could not take the message (its journal
    refused it), else ``rejected``: a refusal can never claim delivery."""
    data = exc.data if isinstance(exc.data, dict) else {}
    return "unreachable" if data.get(wire.ERROR_STATE) == "unreachable" else "rejected"


def _reason_of(exc: A2AError) -> str:
    data = exc.data if isinstance(exc.data, dict) else {}
    reason = data.get(wire.ERROR_REASON)
    if isinstance(reason, str) and reason:
        return reason
    return A2A_ERROR_REASONS.get(type(exc), type(exc).__name__).lower()


def _card_reason(exc: AgentCardResolutionError) -> str:
    cause = exc.__cause__
    if isinstance(cause, httpx.HTTPError):
        _, reason = _transport_error(cause, sent=False)
        return reason
    if exc.status_code is not None:
        return f"agent_card_http_{exc.status_code}"
    return "bad_agent_card"


def _transport_error(cause: BaseException | None, *, sent: bool) -> tuple[str, str]:
    if isinstance(cause, httpx.HTTPStatusError):
        code = cause.response.status_code
        if code in (401, 403):
            return "rejected", "unauthorized"
        if code in (404, 405, 421):
            return "unreachable", f"http_{code}"
        if code >= 500:
            return "unknown", f"http_{code}"
        return "rejected", f"http_{code}"
    if isinstance(cause, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
        return "unreachable", "connect_failed"
    if isinstance(cause, httpx.TimeoutException):
        return ("unknown", "timeout") if sent else ("unreachable", "timeout")
    if isinstance(cause, httpx.RequestError):
        return ("unknown", "transport_error") if sent else ("unreachable", "transport_error")
    return ("unknown", "invalid_response") if sent else ("unreachable", "invalid_response")


async def _poll_delivery(client: Client, ctx: ClientCallContext, task: pb.Task,
                         budget: float) -> pb.Task:
    """GetTask until the message's delivery outcome is known (or the budget is spent)."""
    deadline = time.monotonic() + max(0.0, budget)
    delay = 0.02
    while _pending(task) and time.monotonic() < deadline:
        await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 0.25)
        task = await client.get_task(pb.GetTaskRequest(id=task.id, history_length=0),
                                     context=ctx)
    return task


def _pending(task: pb.Task) -> bool:
    meta: dict[str, Any] = MessageToDict(task.metadata) if task.HasField("metadata") else {}
    return meta.get(wire.STATE) in ("submitted", "dispatching")
