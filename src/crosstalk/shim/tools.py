"""The seven tools' implementation (the tool contract, design doc §5); their catalog and the
MCP server that serves them are in :mod:`.catalog`.

Names, arguments and result fields are a contract that tests outside the project rely on.
Every result is JSON text plus ``structuredContent``. A call whose request carries no
evidence of a session is *unbound*: it may list agents, and every other tool answers
``unbound`` (seed §8).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from mcp import types

from crosstalk.core.states import SEND_RESULTS, send_result_state
from crosstalk.directory import Entry, Unresolved
from crosstalk.harness.base import Identity
from crosstalk.harness.loader import by_name
from crosstalk.shim.catalog import MAX_TEXT, TOOL_NAMES, tool_result
from crosstalk.shim.roster import Shim
from crosstalk.store.registry import RegistryError, StatePathError

if TYPE_CHECKING:  # loaded with the first agent (ADR 0033): tools/list needs none of them
    from crosstalk.a2a.client import SendResult
    from crosstalk.agent import Agent

log = logging.getLogger(__name__)

class ToolError(Exception):
    """A tool call that fails with a stable reason (and optional hint) for the model."""

    def __init__(self, reason: str, hint: str | None = None, **extra: Any) -> None:
        super().__init__(reason)
        self.reason, self.hint, self.extra = reason, hint, extra


def _opt_str(args: Mapping[str, Any], key: str) -> str | None:
    value = args.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ToolError("invalid_arguments", f"'{key}' must be a non-empty string")
    return value


def _req_str(args: Mapping[str, Any], key: str) -> str:
    value = _opt_str(args, key)
    if value is None:
        raise ToolError("invalid_arguments", f"'{key}' is required")
    return value


def _choice(args: Mapping[str, Any], key: str, choices: set[str], default: str) -> str:
    value = _opt_str(args, key) or default
    if value not in choices:
        raise ToolError("invalid_arguments",
                        f"'{key}' must be one of {', '.join(sorted(choices))}")
    return value


def _int_arg(args: Mapping[str, Any], key: str, default: int, lo: int, hi: int) -> int:
    value = args.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ToolError("invalid_arguments", f"'{key}' must be an integer from {lo} to {hi}")
    return value


def _text_arg(args: Mapping[str, Any]) -> str:
    text = _req_str(args, "text")
    if len(text.encode()) > MAX_TEXT:
        raise ToolError("message_too_large", f"text is limited to {MAX_TEXT} bytes")
    return text


class Tools:
    """The tool implementations over one :class:`Shim`."""

    def __init__(self, shim: Shim) -> None:
        self.shim = shim
        self._handlers: dict[str, Callable[[Agent, Identity, Mapping[str, Any]],
                                           Awaitable[dict[str, Any]]]] = {
            "send_message": self.send_message, "ask": self.ask, "reply": self.reply,
            "receive_message": self.receive_message, "claim": self.claim,
            "release": self.release,
        }

    async def call(self, name: str, args: Mapping[str, Any] | None,
                   meta: Mapping[str, Any] | None) -> types.CallToolResult:
        args = args or {}
        try:
            if name not in TOOL_NAMES:  # only a direct caller: the MCP server refuses it first
                raise ToolError("unknown_tool", f"tools: {', '.join(sorted(TOOL_NAMES))}")
            # Harness stamps (opencode's ``_opencode``) leave the arguments here, first.
            found, args = await self.shim.identify_call(meta, args)
            if name == "list_agents":
                extra = _str_keys(args)
                if extra:
                    raise ToolError("invalid_arguments", "list_agents takes no arguments")
                return tool_result({"agents": await self.list_agents()})
            if found is None:
                raise ToolError("unbound", "this call carries no evidence of which session "
                                "made it; only list_agents is available")
            harness, identity = found
            try:
                agent = await self.shim.agent_for(harness, identity)
            except (RegistryError, StatePathError) as exc:  # each names its cause and fix
                raise ToolError("registration_failed", "this session could not be registered "
                                f"as a CrossTalk agent: {exc}") from None
            payload = await self._handlers[name](agent, identity, args)
            notice = self.shim.take_notice(identity)
            if notice:
                payload["notice"] = notice
            return tool_result(payload)
        except ToolError as exc:
            return tool_result({"error": exc.reason, "hint": exc.hint, **exc.extra}, error=True)
        except Exception as exc:
            # Imported here: the receiver loads with the first agent, never at start.
            from crosstalk.receiver import ReceiverUnavailable
            if not isinstance(exc, ReceiverUnavailable):
                raise
            log.exception("tool %s: journal unavailable", name)
            return tool_result({"error": "journal_unavailable",
                                "hint": "the message store refused a write; nothing was sent"},
                               error=True)

    # -- list_agents ---------------------------------------------------------------------

    async def list_agents(self) -> list[dict[str, Any]]:
        entries = await asyncio.to_thread(self.shim.directory.snapshot)
        return [e.row() for e in entries]

    # -- sending -------------------------------------------------------------------------

    def _send_payload(self, agent: Agent, identity: Identity, target: Entry | Unresolved,
                      res: SendResult, *, kind: str) -> dict[str, Any]:
        state = send_result_state(res.state)
        reason = res.reason if res.state in SEND_RESULTS else (res.reason or res.state)
        payload: dict[str, Any] = {"message_id": res.message_id or None, "state": state,
                                   "reason": reason}
        if isinstance(target, Unresolved):
            payload["hint"] = target.hint
            if target.candidates:
                payload["candidates"] = [e.agent_id for e in target.candidates]
            return payload  # it reached no peer: nothing to count (seed §4)
        if target.descriptor is None:
            payload["hint"] = _native_hint(target, refused=reason == "native_inform_only")
        elif (hint := _send_hint(target.harness, res.reason)) is not None:
            payload["hint"] = hint
        nudge = self.shim.nudge_counter(identity).record(
            target.peer_key, state, kind=kind, no_such_agent=res.reason == "no_such_agent")
        if nudge is not None:
            from crosstalk.core.nudge import combine_hint  # loaded with the agent's counter

            payload["hint"] = combine_hint(payload.get("hint"), nudge)
            agent.journal_event(nudge.record())
        return payload

    async def _deliver(self, agent: Agent, to: str, text: str, *, kind: str,
                       delivery: str = "immediate", deadline: int = 0
                       ) -> tuple[Entry | Unresolved, SendResult]:
        """Resolve ``to`` (agents and sessions without CrossTalk) and send to it."""
        from crosstalk.a2a.client import SendResult  # loaded with the agent, not at start
        target = await asyncio.to_thread(self.shim.directory.resolve, to)
        if isinstance(target, Unresolved):
            # Sent nowhere: a definite failure, never ``unknown`` ("may have been delivered").
            return target, SendResult(message_id="", state="rejected", reason=target.reason)
        if target.descriptor is not None:
            res = await agent.send(target.descriptor, text, kind=kind, delivery=delivery,
                                   deadline_seconds=deadline, until_delivered=kind == "ask")
            return target, res
        discovery = self.shim.directory.discovery_for(target.harness)
        if kind != "inform" or target.session is None or discovery is None:
            return target, SendResult(message_id="", state="rejected",
                                      reason="native_inform_only")
        return target, await agent.send_native(discovery, target.session, text,
                                               delivery=delivery)

    async def send_message(self, agent: Agent, identity: Identity,
                           args: Mapping[str, Any]) -> dict[str, Any]:
        to = _req_str(args, "to")
        text = _text_arg(args)
        kind = _choice(args, "kind", {"inform", "command"}, "inform")
        delivery = _choice(args, "delivery", {"immediate", "next_turn"}, "immediate")
        target, res = await self._deliver(agent, to, text, kind=kind, delivery=delivery)
        return self._send_payload(agent, identity, target, res, kind=kind)

    async def ask(self, agent: Agent, identity: Identity,
                  args: Mapping[str, Any]) -> dict[str, Any]:
        to = _req_str(args, "to")
        text = _text_arg(args)
        deadline = _int_arg(args, "deadline_seconds", 0, 0, 86400)
        target, res = await self._deliver(agent, to, text, kind="ask", deadline=deadline)
        return self._send_payload(agent, identity, target, res, kind="ask")

    async def reply(self, agent: Agent, identity: Identity,
                    args: Mapping[str, Any]) -> dict[str, Any]:
        mid = _req_str(args, "message_id")
        text = _text_arg(args)
        from crosstalk.agent import ReplyRefused  # loaded with the agent, not at start
        try:
            result = await agent.reply(mid, text)
        except ReplyRefused as exc:
            raise ToolError(exc.reason, exc.hint, message_id=mid) from None
        if (hint := _SEND_HINTS.get(result.get("reason") or "")) is not None:
            result = {**result, "hint": hint}
        return result

    # -- mailbox -------------------------------------------------------------------------

    async def receive_message(self, agent: Agent, identity: Identity,
                              args: Mapping[str, Any]) -> dict[str, Any]:
        state = _opt_str(args, "state")
        after = _opt_str(args, "after")
        limit = _int_arg(args, "limit", 20, 1, 100)
        from crosstalk.core.mailbox import CursorError, page  # ADR 0034: not at start

        try:
            got = page(agent.mailbox(), state=state, after=after, limit=limit)
        except CursorError as exc:
            raise ToolError("invalid_cursor", str(exc)) from None
        except ValueError as exc:
            raise ToolError("invalid_arguments", str(exc)) from None
        return {"entries": [e.to_tool_dict() for e in got.entries],
                "next_cursor": got.next_cursor}

    # -- claims --------------------------------------------------------------------------

    async def claim(self, agent: Agent, identity: Identity,
                    args: Mapping[str, Any]) -> dict[str, Any]:
        return await self._control(agent, _req_str(args, "name"), "claim")

    async def release(self, agent: Agent, identity: Identity,
                      args: Mapping[str, Any]) -> dict[str, Any]:
        return await self._control(agent, _req_str(args, "name"), "release")

    async def _control(self, agent: Agent, name: str, op: str) -> dict[str, Any]:
        """Ask the target's shim to apply the claim/release; only the target decides (§7)."""
        target, out = await agent.control_peer(name, op)
        where = {"name": target.name, "agent_id": target.agent_id} if target else {"name": name}
        if out.ok:
            return {"ok": True, **where, "role": out.role, "owner": out.owner}
        reason = out.reason or out.state
        if out.state in ("unreachable", "unknown") and reason not in _CONTROL_HINTS:
            # The transport's detail (connect_failed, timeout, ...) goes in the hint; the
            # reason a model branches on is the state.
            detail, reason = reason, out.state
        else:
            detail = None
        hint = _CONTROL_HINTS.get(reason, "")
        if detail:
            hint = f"{hint} ({detail})" if hint else detail
        raise ToolError(reason, hint or None, **where)


#: Hints for delivery reasons any harness may give; a harness's own reasons are explained by
#: its plugin (``HarnessPlugin.hints``).
_SEND_HINTS = {
    "held_for_approval": (
        "that session is holding the message for its user's approval: not delivered yet, "
        "and not lost"),
    "journal_unavailable": (
        "the receiver could not store it; nothing was delivered; retry later"),
}

_CONTROL_HINTS = {
    "no_such_agent": "no live agent has that name or id; call list_agents",
    "ambiguous_name": "several agents match; use an agent_id from list_agents",
    "cannot_claim_self": "an agent can never claim itself",
    "cannot_release_self": "an agent can never release itself; only its owner can",
    "already_claimed": "another agent owns it; only its owner can release it",
    "claimer_not_primary": "only a primary may claim; this session is itself a subagent",
    "not_owner": "only the agent that claimed it may release it",
    "not_claimed": "it is not claimed (or its owner is gone): nothing to release",
    "sender_unverified": "the target could not verify this session's registration",
    "journal_unavailable": "the target could not record the change; nothing changed",
    "control_not_supported": "that agent's CrossTalk does not support claims",
    "no_a2a_listener": "that agent has no A2A listener to receive the request",
    "unreachable": "the request could not be delivered; nothing changed",
    "unknown": "the request was sent but no answer came; check list_agents",
}


def _send_hint(harness: str, reason: str | None) -> str | None:
    """What a delivery's reason means for the sending model, if anyone explains it."""
    if reason is None:
        return None
    plugin = by_name(harness)
    return (plugin.hints.get(reason) if plugin is not None else None) or _SEND_HINTS.get(reason)


def _native_hint(target: Entry, *, refused: bool) -> str:
    """True whether or not the session is reachable now (seed test 33)."""
    what = (f"'{target.name}' is a {target.harness} session without CrossTalk: it receives "
            "send_message with kind=inform only, and cannot answer an ask, take a command "
            "or send")
    if not target.reachable:
        return what + "; it is not reachable right now, so an inform would not arrive either"
    if refused:
        return what + "; send it an inform instead"
    return what


def _str_keys(args: Mapping[str, Any]) -> list[str]:
    return [k for k in args if isinstance(k, str)]
