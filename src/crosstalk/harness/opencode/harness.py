"""Injecting into one opencode session, through the instance that hosts it (research §4-§5).

Only the host's own socket is used (the instance whose record the session came from): a
second opencode process on the same data directory would run the session's loop unseen by
its TUI (research §0). The route is ``POST /session/{id}/prompt_async``:

- a verified immediate message is a prompt (wakes an idle session; joins a busy loop at its
  next step); a next_turn or unverified one carries ``"noReply": true`` (stored, no model
  call: the next turn carries it) and ends ``queued``, never waking (seed CQ3);
- the visible part is the envelope, with ``metadata.crosstalk = {msg_id, from}`` (stored and
  echoed in events, never sent to the model); a ``synthetic`` part (sent to the model, hidden
  in the TUI) says how to answer;
- never ``tools`` in the body (opencode stores it as the session's permissions), never
  ``/permission/*`` or ``/tui/*``.

A 204 only means "taken". The state is ``accepted`` (or ``queued``) only on the instance's
event stream's evidence: a ``message.part.updated`` in that session whose part metadata
carries our message id. The stream is opened, and ``server.connected`` read, before the
prompt is sent, so the evidence cannot be missed. 204 without evidence in time is ``unknown``;
a refusal or a failure before sending is ``unreachable`` with why.

The model has taken a stored message once an assistant message newer than it exists in the
session (every step re-reads the session, research §4; the step may be parented to a later
user message). A turn that ends first leaves the message stored but unread until the next
turn: within :data:`ANSWER_GRACE` that is the outcome's reason
(``opencode_aborted_before_answer``); later, :func:`follow_turn` (the outcome's follow-up,
run by the agent) reports it as an ``unanswered`` receipt.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from crosstalk.capture.tap import IN, OPENCODE_HTTP, OUT, TAPS, Tap
from crosstalk.core.envelope import render_peer
from crosstalk.core.message import Ingress, Kind
from crosstalk.core.states import MessageState
from crosstalk.harness.base import Binding, Delivery, Outcome, Receipt
from crosstalk.harness.opencode.http import HTTPStatus, Instance, NoAnswer, NotSent
from crosstalk.harness.opencode.records import InstanceRecord, RecordError

log = logging.getLogger(__name__)

HARNESS: Final = "opencode"
#: How long the stream may take to show the stored message after the 204 (opencode stores it
#: in a forked fiber at once; seconds mean something is wrong).
EVIDENCE_TIMEOUT: Final = 5.0
#: After a waking message is stored, how long to watch for an abort before any answer. The
#: sender waits this long when the session is busy (its answer comes at the loop's next step),
#: so it is short: later news comes from the follow-up (:func:`follow_turn`).
ANSWER_GRACE: Final = 0.5
#: How long a follow-up watches a turn that has not taken its message (a tool loop may run
#: for long; past this the message stays ``accepted``, stored in the session).
FOLLOW_LIMIT: Final = 3600.0
#: How a turn that ended without taking the message is told, as a receipt's reason.
_UNANSWERED: Final = {"aborted": "opencode_aborted_before_answer",
                      "idle": "opencode_turn_ended_unanswered",
                      "error": "opencode_turn_failed"}


def render(delivery: Delivery) -> str:
    """The visible envelope (as for Codex: opencode has no native peer envelope)."""
    msg = delivery.message
    return render_peer(body=msg.text, from_name=msg.sender.label, message_id=msg.message_id,
                       kind=msg.kind.value, in_reply_to=msg.in_reply_to,
                       verified=msg.sender.verified or msg.sender.ingress is Ingress.LOCAL)


def reply_hint(delivery: Delivery) -> str:
    msg = delivery.message
    if msg.kind is Kind.ASK:
        return (f"CrossTalk: this is a question from {msg.sender.label}. Answer it with the "
                f'crosstalk_reply tool, message_id="{msg.message_id}"; a plain answer here '
                "does not reach the asker.")
    return (f"CrossTalk: a message from {msg.sender.label} (message_id "
            f'"{msg.message_id}"). No answer is expected; to answer anyway, use '
            "crosstalk_reply with that message_id.")


def prompt_body(delivery: Delivery) -> dict[str, Any]:
    msg = delivery.message
    body: dict[str, Any] = {"parts": [
        {"type": "text", "text": render(delivery),
         "metadata": {"crosstalk": {"msg_id": msg.message_id, "from": msg.sender.label}}},
        {"type": "text", "text": reply_hint(delivery), "synthetic": True}]}
    if not delivery.wake:
        body["noReply"] = True
    return body


def _stored_in(event: Mapping[str, Any], session_id: str, message_id: str) -> str | None:
    """The user message id if ``event`` shows our message stored in ``session_id``."""
    if event.get("type") != "message.part.updated":
        return None
    props = event.get("properties")
    part = props.get("part") if isinstance(props, dict) else None
    if not isinstance(part, dict) or part.get("sessionID") != session_id:
        return None
    meta = part.get("metadata")
    ours = meta.get("crosstalk") if isinstance(meta, dict) else None
    if not isinstance(ours, dict) or ours.get("msg_id") != message_id:
        return None
    owner = part.get("messageID")
    return owner if isinstance(owner, str) else ""


def _turn_end(event: Mapping[str, Any], session_id: str, user_id: str) -> str | None:
    """``answered`` / ``aborted`` when ``event`` settles the turn of our stored message."""
    props = event.get("properties")
    if not isinstance(props, dict) or props.get("sessionID") != session_id:
        return None
    kind = event.get("type")
    if kind == "message.updated":
        info = props.get("info")
        if isinstance(info, dict) and _answers(info, user_id):
            return "answered"
    if kind == "session.error":
        error = props.get("error")
        name = error.get("name") if isinstance(error, dict) else None
        return "aborted" if name == "MessageAbortedError" else "error"
    if kind == "session.idle":
        return "idle"
    return None


def _answers(info: Mapping[str, Any], user_id: str) -> bool:
    """Whether the message ``info`` is a step that read ``user_id``: an assistant message
    parented to it or newer than it (opencode's ids are time-ordered, research §4)."""
    if info.get("role") != "assistant":
        return False
    own = info.get("id")
    return info.get("parentID") == user_id or (
        isinstance(own, str) and own[:4] == user_id[:4] and own > user_id)


def _refusal(exc: HTTPStatus) -> Outcome:
    """What an error answer to ``prompt_async`` proves (nothing was stored, except a 5xx)."""
    if exc.status == 404:
        missing = "Session not found" in exc.body or "NotFoundError" in exc.body
        return Outcome(MessageState.UNREACHABLE, "opencode_session_not_found" if missing
                       else "opencode_route_missing")
    if exc.status == 401:
        return Outcome(MessageState.UNREACHABLE, "opencode_auth_required")
    if exc.status >= 500:
        return Outcome(MessageState.UNKNOWN, f"opencode_error:{exc.status}")
    return Outcome(MessageState.UNREACHABLE, f"opencode_refused:{exc.status}")


async def inject_at(socket_path: str, session_id: str, delivery: Delivery, *,
                    env: Mapping[str, str] | None = None,
                    evidence_timeout: float = EVIDENCE_TIMEOUT,
                    answer_grace: float = ANSWER_GRACE) -> Outcome:
    """Prompt ``session_id`` on the instance at ``socket_path`` and report the evidence."""
    message_id = delivery.message.message_id
    tap = TAPS.tap_for(delivery.reply_address)  # the agent whose frames these are (capture)
    async with Instance(socket_path, env=env) as api:
        events = api.events()
        try:
            first = await asyncio.wait_for(anext(events), evidence_timeout)
        except NotSent as exc:
            return Outcome(MessageState.UNREACHABLE, exc.reason)
        except HTTPStatus as exc:  # nothing was sent: even a 5xx here is a refusal
            refused = _refusal(exc)
            return Outcome(MessageState.UNREACHABLE, "opencode_route_missing"
                           if exc.status == 404 else refused.reason)
        except (NoAnswer, TimeoutError, StopAsyncIteration):
            return Outcome(MessageState.UNREACHABLE, "opencode_no_event_stream")
        if first.get("type") != "server.connected":
            return Outcome(MessageState.UNREACHABLE, "opencode_no_event_stream")
        # A noReply message starts no turn: there is nothing to watch after it is stored.
        grace = answer_grace if delivery.wake else 0.0
        watcher = asyncio.ensure_future(
            _watch(events, session_id, message_id, evidence_timeout, grace, tap=tap))
        try:
            try:
                route, body = f"/session/{session_id}/prompt_async", prompt_body(delivery)
                tap.emit(OPENCODE_HTTP, OUT, {"method": "POST", "path": route, "body": body})
                status, _ = await api.post(route, body)
                tap.emit(OPENCODE_HTTP, IN, {"status": status})
            except NotSent as exc:
                return Outcome(MessageState.UNREACHABLE, exc.reason)
            except HTTPStatus as exc:
                return _refusal(exc)
            except NoAnswer as exc:
                return Outcome(MessageState.UNKNOWN, exc.reason)
            if status not in (200, 204):
                return Outcome(MessageState.UNKNOWN, f"opencode_status:{status}")
            stored, end = await watcher
        finally:
            watcher.cancel()
            with contextlib.suppress(BaseException):
                await watcher
            await events.aclose()
    if stored is None:
        return Outcome(MessageState.UNKNOWN, end or "opencode_no_evidence")
    state = MessageState.ACCEPTED if delivery.wake else MessageState.QUEUED
    if end == "aborted":
        return Outcome(state, "opencode_aborted_before_answer", f"stored {stored}")
    follow_up = None
    if delivery.wake and end is None and stored:  # the turn has not taken it yet
        follow_up = functools.partial(follow_turn, socket_path, session_id, message_id,
                                      stored, env=env)
    return Outcome(state, None, f"stored {stored}" + (f"; {end}" if end else ""),
                   follow_up=follow_up)


async def follow_turn(socket_path: str, session_id: str, message_id: str, user_id: str, *,
                      env: Mapping[str, str] | None = None,
                      limit: float = FOLLOW_LIMIT) -> Receipt | None:
    """Watch the turn that stored message ``user_id`` until the model takes it (``None``: no
    news) or the turn ends first (an ``unanswered`` receipt with how it ended). The stream is
    opened before the session is read, so nothing between the injector's watch and this one
    is missed; an instance that goes away, or a limit reached, says nothing either way."""
    try:
        async with Instance(socket_path, env=env) as api:
            events = api.events()
            try:
                first = await asyncio.wait_for(anext(events), EVIDENCE_TIMEOUT)
                if first.get("type") != "server.connected":
                    return None
                end = await _settled_now(api, session_id, user_id)
                if end is None:
                    end = await asyncio.wait_for(
                        _turn_settles(events, session_id, user_id), limit)
            finally:
                await events.aclose()
    except (NotSent, NoAnswer, HTTPStatus, TimeoutError, StopAsyncIteration) as exc:
        log.info("opencode follow-up of %s: %s", message_id, getattr(exc, "reason", exc))
        return None
    if end not in _UNANSWERED:
        return None
    return Receipt(message_id, "unanswered", _UNANSWERED[end], frame_id=user_id)


async def _settled_now(api: Instance, session_id: str, user_id: str) -> str | None:
    """How the turn stands in the session as stored now: ``answered``, how it ended without
    the message (the session not busy and no step after it), or ``None`` (still running).

    The status is read *before* the messages: a loop that ends stores its last step (with an
    abort's error) before it goes idle, so messages read after an idle status are final. Read
    the other way round, an abort between the two reads looked like a plain end (CI saw it).
    """
    status = await api.get("/session/status")  # active sessions only (research §3)
    rows = await api.get(f"/session/{session_id}/message", {"limit": "50"})
    infos = [row["info"] for row in rows if isinstance(row, dict)
             and isinstance(row.get("info"), dict)] if isinstance(rows, list) else []
    if any(_answers(info, user_id) for info in infos):
        return "answered"
    state = status.get(session_id) if isinstance(status, dict) else None
    if isinstance(state, dict) and state.get("type") != "idle":
        return None  # busy (or retrying): the loop may still take it (the stream will say)
    last = next((i for i in reversed(infos) if i.get("role") == "assistant"), None)
    error = last.get("error") if last is not None else None
    aborted = isinstance(error, dict) and error.get("name") == "MessageAbortedError"
    return "aborted" if aborted else "idle"


async def _turn_settles(events: AsyncIterator[dict[str, Any]], session_id: str,
                        user_id: str) -> str | None:
    async for event in events:
        if event.get("type") == "server.instance.disposed":
            return None
        end = _turn_end(event, session_id, user_id)
        if end is not None:
            return end
    return None


async def _watch(events: AsyncIterator[dict[str, Any]], session_id: str, message_id: str,
                 evidence_timeout: float, answer_grace: float, *,
                 tap: Tap | None = None) -> tuple[str | None, str | None]:
    """(the stored user message id or ``None``, how the watch ended)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + evidence_timeout
    stored: str | None = None
    try:
        while True:
            left = deadline - loop.time()
            if left <= 0:
                return stored, None if stored else "opencode_no_evidence"
            event = await asyncio.wait_for(anext(events), left)
            if tap is not None:
                tap.emit(OPENCODE_HTTP, IN, event)
            if event.get("type") == "server.instance.disposed":
                return stored, "opencode_instance_gone"
            if stored is None:
                stored = _stored_in(event, session_id, message_id)
                if stored is not None:
                    if answer_grace <= 0:
                        return stored, None
                    deadline = loop.time() + answer_grace
                continue
            end = _turn_end(event, session_id, stored)
            if end is not None:
                return stored, end
    except TimeoutError:
        return stored, None if stored else "opencode_no_evidence"
    except (StopAsyncIteration, NoAnswer, NotSent, HTTPStatus):
        return stored, None if stored else "opencode_stream_lost"


async def find_stored(socket_path: str, session_id: str, message_id: str, *,
                      env: Mapping[str, str] | None = None) -> Outcome | None:
    """Positive evidence after the fact (``GET /session/{id}/message``): our message among
    the session's messages; ``None`` when it is not there or the instance cannot say."""
    try:
        async with Instance(socket_path, env=env) as api:
            rows = await api.get(f"/session/{session_id}/message", {"limit": "200"})
    except (NotSent, NoAnswer, HTTPStatus) as exc:
        log.info("opencode reconcile %s: %s", message_id, exc.reason)
        return None
    for row in rows if isinstance(rows, list) else []:
        info = row.get("info") if isinstance(row, dict) else None
        parts = row.get("parts") if isinstance(row, dict) else None
        for part in parts if isinstance(parts, list) else []:
            if isinstance(part, dict) and isinstance(info, dict) and _stored_in(
                    {"type": "message.part.updated", "properties": {"part": part}},
                    session_id, message_id) is not None:
                return Outcome(MessageState.ACCEPTED, None, f"stored {info.get('id')}")
    return None


@dataclass
class OpencodeHarness:
    """Injects into one session through its host instance, looked up again at each delivery
    (a record gone or stale is ``unreachable``: the host went away)."""

    session_id: str
    host: Callable[[], InstanceRecord]
    env: Mapping[str, str] = field(default_factory=dict)
    name: str = HARNESS
    evidence_timeout: float = EVIDENCE_TIMEOUT

    async def inject(self, binding: Binding, delivery: Delivery) -> Outcome:
        try:
            record = await asyncio.to_thread(self.host)
        except RecordError as exc:
            return Outcome(MessageState.UNREACHABLE, f"opencode_instance_gone:{exc.reason}")
        return await inject_at(record.socket, self.session_id, delivery, env=self.env,
                               evidence_timeout=self.evidence_timeout)

    async def reconcile(self, binding: Binding, message_id: str) -> Outcome | None:
        try:
            record = await asyncio.to_thread(self.host)
        except RecordError:
            return None
        return await find_stored(record.socket, self.session_id, message_id, env=self.env)
