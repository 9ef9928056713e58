"""The scriptable fake harness: a real adapter for tests, benchmarks and the demo.

It behaves like a harness session that records what reached it. Each injection takes the
next scripted :class:`Step` (or the default), which can succeed, refuse, fail ambiguously,
raise, return a malformed result, or block between "dequeue" and "write" until released:
exactly the branches seed test 16 and the cancel race (test 22) need.

Its identifier also exercises the seam's two per-harness evidence shapes: a call may name its
session in a ``_fake`` *argument* (as opencode's plugin stamps ``_opencode``), and with
``CROSSTALK_FAKE_LIVE`` set its sessions are live before any call, read from a JSON file a test
rewrites (as opencode's event stream shows sessions).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crosstalk.core.states import MessageState
from crosstalk.harness.base import Binding, Delivery, Harness, Identifier, Identity, Outcome
from crosstalk.harness.plugin import HarnessPlugin, ShimContext

log = logging.getLogger(__name__)


@dataclass
class Step:
    """What the next injection does. ``write`` says whether the session received the text."""

    state: MessageState = MessageState.ACCEPTED
    reason: str | None = None
    evidence: str | None = "fake-ok"
    write: bool = True
    #: Raise this instead of returning (after writing, if ``write``): a disconnect.
    error: BaseException | None = None
    #: Return this object instead of an Outcome: a malformed success.
    malformed: object | None = None
    #: Wait for this event between dequeue and write (the cancel-race window).
    gate: asyncio.Event | None = None


@dataclass
class Written:
    binding: Binding
    delivery: Delivery
    text: str


@dataclass
class FakeHarness:
    name: str = "fake"
    default: Step = field(default_factory=Step)
    script: deque[Step] = field(default_factory=deque)
    writes: list[Written] = field(default_factory=list)
    #: Called for each delivery to render the text the session sees.
    render: Callable[[Delivery], str] = lambda d: d.message.text
    #: Set while an injection is parked at its gate (tests wait on it).
    parked: asyncio.Event = field(default_factory=asyncio.Event)
    dequeued: int = 0

    def then(self, *steps: Step) -> FakeHarness:
        self.script.extend(steps)
        return self

    async def inject(self, binding: Binding, delivery: Delivery) -> Outcome:
        step = self.script.popleft() if self.script else self.default
        self.dequeued += 1
        if step.gate is not None:
            self.parked.set()
            await step.gate.wait()
            self.parked.clear()
        if step.write:
            self.writes.append(Written(binding, delivery, self.render(delivery)))
        if step.error is not None:
            raise step.error
        if step.malformed is not None:
            return step.malformed  # type: ignore[return-value]  # deliberately wrong
        return Outcome(step.state, step.reason, step.evidence if step.write else None)

    def texts(self) -> list[str]:
        return [w.text for w in self.writes]


#: The ``_meta`` keys by which a test client says which fake session a call comes from.
FAKE_SESSION_META = "crosstalk.fake/session"
FAKE_NAME_META = "crosstalk.fake/name"
#: The argument by which a call may name its fake session instead: ``{"session", "name"?}``.
FAKE_STAMP = "_fake"
#: How often the live-sessions file is re-read.
LIVE_POLL_SECONDS = 0.1


@dataclass
class FileSinkHarness(FakeHarness):
    """A fake session whose "model context" is a JSONL file (for out-of-process tests).

    Each injection appends ``{"message_id", "from", "kind", "text", "wake"}`` to
    ``<inbox_dir>/<session_ref>.jsonl`` and fsyncs it, so a test driving a real
    ``crosstalk mcp`` process can read exactly what reached the session.
    """

    inbox_dir: str = ""

    async def inject(self, binding: Binding, delivery: Delivery) -> Outcome:
        outcome = await super().inject(binding, delivery)
        if self.writes and self.writes[-1].delivery is delivery:
            msg = delivery.message
            line = json.dumps({"message_id": msg.message_id, "from": msg.sender.label,
                               "from_agent_id": msg.sender.agent_id, "kind": msg.kind.value,
                               "in_reply_to": msg.in_reply_to, "text": self.writes[-1].text,
                               "wake": delivery.wake})
            path = os.path.join(self.inbox_dir, f"{binding.session_ref}.jsonl")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                os.write(fd, line.encode() + b"\n")
                os.fsync(fd)
            finally:
                os.close(fd)
        return outcome


@dataclass
class FakeIdentifier:
    """Identifies fake sessions by ``_meta["crosstalk.fake/session"]`` (like Codex's threadId)."""

    name: str = "fake"
    cwd: str = "/"
    inbox_dir: str | None = None
    harnesses: dict[str, FakeHarness] = field(default_factory=dict)

    #: harness.base.ArgumentEvidence: the argument the shim removes and shows only to us.
    stamp: str = FAKE_STAMP

    def identify(self, meta: Mapping[str, Any] | None) -> Identity | None:
        if not meta:
            return None
        return self._identity(meta.get(FAKE_SESSION_META), meta.get(FAKE_NAME_META))

    def identify_stamped(self, meta: Mapping[str, Any] | None,
                         stamp: object) -> Identity | None:
        """A stamp, when there is one, is the only evidence asked: a malformed one is
        refused, never passed over for ``_meta``."""
        if stamp is None:
            return self.identify(meta)
        if not isinstance(stamp, Mapping):
            return None
        return self._identity(stamp.get("session"), stamp.get("name"))

    def _identity(self, session: object, name: object) -> Identity | None:
        if not isinstance(session, str) or not session:
            return None
        return Identity(self.name, session, self.cwd,
                        session_name=name if isinstance(name, str) else None)

    def harness_for(self, identity: Identity) -> Harness:
        h = self.harnesses.get(identity.session_ref)
        if h is None:
            h = (FileSinkHarness(name=self.name, inbox_dir=self.inbox_dir) if self.inbox_dir
                 else FakeHarness(name=self.name))
            self.harnesses[identity.session_ref] = h
        return h


@dataclass
class LiveFakeIdentifier(FakeIdentifier):
    """A fake whose sessions are live before any call (harness.base.LiveSessions): the JSON
    list ``[{"session", "name"?}, ...]`` in ``live_file``. A missing or unreadable file is no
    evidence (nothing is yielded); ``[]`` is evidence that no session is live."""

    live_file: str = ""

    async def live_sessions(self) -> AsyncIterator[Sequence[Identity]]:
        last: list[Identity] | None = None
        while True:
            found = self._read_live()
            if found is not None and found != last:
                last = found
                yield found
            await asyncio.sleep(LIVE_POLL_SECONDS)

    def _read_live(self) -> list[Identity] | None:
        try:
            with open(self.live_file, encoding="utf-8") as f:
                rows = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:  # torn or bad: no evidence either way
            log.warning("fake live sessions %s unreadable: %s", self.live_file, exc)
            return None
        if not isinstance(rows, list):
            log.warning("fake live sessions %s: not a list", self.live_file)
            return None
        found = [self._identity(r.get("session"), r.get("name")) for r in rows
                 if isinstance(r, dict)]
        return [i for i in found if i is not None]


def _identifier(ctx: ShimContext) -> Identifier | None:
    """Only with ``CROSSTALK_HARNESS=fake`` (tests, the demo): fake sessions named in
    ``_meta`` or the ``_fake`` argument, whose injections go to
    ``$CROSSTALK_FAKE_INBOX/<session>.jsonl``; with ``CROSSTALK_FAKE_LIVE``, also sessions
    live before any call."""
    if ctx.env.get("CROSSTALK_HARNESS", "") != "fake":
        return None
    inbox = ctx.env.get("CROSSTALK_FAKE_INBOX") or None
    if inbox:
        from crosstalk.config import ensure_private_dir

        ensure_private_dir(Path(inbox))
    live = ctx.env.get("CROSSTALK_FAKE_LIVE") or None
    if live:
        return LiveFakeIdentifier(cwd=ctx.cwd, inbox_dir=inbox, live_file=live)
    return FakeIdentifier(cwd=ctx.cwd, inbox_dir=inbox)


#: Registered like any harness (``crosstalk.harness.fake:plugin``) so that tests and the demo
#: go through the one loading path; inert unless the environment asks for it. Last in trust
#: order: its evidence is a ``_meta`` key any client can set.
plugin = HarnessPlugin(name="fake", trust=90, identifier=_identifier)
