"""The shim's roster: the agents of the sessions one ``crosstalk mcp`` process serves.

Identity is bound per request (seed §3): each ``tools/call`` is matched to a session by the
identifiers in trust order, and the agent for ``(harness, session_ref)`` is created lazily and
atomically — concurrent first calls for one session share a single creation, and a failed
creation is not cached. Closing the shim stops every agent it serves (descriptors, sockets and
keys removed under their locks; journals and lock files kept).

An *eager* identifier (Claude: the parent's record is evidence before any call) has its
session registered by :meth:`Shim.sync`, at start and then on every poll, which also follows
the harness: a session the harness replaced in the same process (``/clear``) is retired
without the shim exiting and the new one takes its name with no notice; a rename moves the
alias; a fallback name moves to the preferred one once that is free.

A harness with *live sessions* (opencode: several sessions per shim, each a full agent as
soon as its host shows it live) is followed by one task per harness, started by
:meth:`Shim.sync`: each set it yields registers the new sessions (up to ``max_live``) and
retires the ones an earlier set had that are gone. A session bound by a call that no set has
shown is never retired by a set that lacks it: a call is evidence too (ADR 0022).

A harness whose evidence is stamped into the call's arguments has its stamp removed from every
call here, before the tools validate the arguments, and shown to that harness only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from crosstalk.core.admission import Limits
from crosstalk.directory import Directory
from crosstalk.harness.base import Identifier, Identity, LoadedHarness
from crosstalk.store.registry import Registry, RegistryError

if TYPE_CHECKING:  # the agent stack (A2A, uvicorn) loads with the first agent, not at start
    from crosstalk.agent import Agent
    from crosstalk.core.nudge import NudgeCounter

log = logging.getLogger(__name__)

AgentKey = tuple[str, str]
#: How many agents live-session sets may register in one shim (each has a journal, a uds
#: socket and an A2A listener): an instance with more root sessions lists the rest as
#: sessions without CrossTalk until some go.
MAX_LIVE_AGENTS = 64


class Shim:
    def __init__(self, registry: Registry, identifiers: Sequence[Identifier], *,
                 env: dict[str, str] | None = None, limits: Limits | None = None,
                 max_live: int = MAX_LIVE_AGENTS) -> None:
        self.registry = registry
        #: In trust order, each with its optional capabilities checked once, here.
        self.harnesses = [LoadedHarness.of(i) for i in identifiers]
        self.env = env
        self.limits = limits or Limits()
        self.agents: dict[AgentKey, Agent] = {}
        self.nudges: dict[AgentKey, NudgeCounter] = {}
        self._creating: dict[AgentKey, asyncio.Task[Agent]] = {}
        self._notices: dict[AgentKey, str] = {}
        self._closed = False
        self.max_live = max_live
        #: Sessions registered from each live-session harness's last set, by harness name.
        self._live: dict[str, set[AgentKey]] = {}
        self._followers: dict[str, asyncio.Task[None]] = {}
        #: Every argument some harness stamps: removed from each call, whoever's it is.
        self._stamps = {h.arguments.stamp for h in self.harnesses if h.arguments is not None}
        # Given the shim's loop: async discoveries run there, not in a loop per listing.
        loop: asyncio.AbstractEventLoop | None = None
        with contextlib.suppress(RuntimeError):  # built outside a loop (no async discovery)
            loop = asyncio.get_running_loop()
        self.directory = Directory(registry, [h.discovery for h in self.harnesses
                                              if h.discovery is not None], loop=loop)
        #: Every harness that reads control frames (receipts) at an agent's uds ingress.
        self._control_sinks = [h.control.on_control for h in self.harnesses
                               if h.control is not None]

    async def identify(self, meta: Mapping[str, Any] | None
                       ) -> tuple[LoadedHarness, Identity] | None:
        """The first identifier (trust order) that recognises the request's evidence."""
        found, _ = await self.identify_call(meta, {})
        return found

    async def identify_call(self, meta: Mapping[str, Any] | None,
                            arguments: Mapping[str, Any]
                            ) -> tuple[tuple[LoadedHarness, Identity] | None, dict[str, Any]]:
        """The calling session (as :meth:`identify`) and the arguments with every harness's
        stamp removed: removed whether or not its identifier accepts it, before anyone
        validates them; each stamp is shown to the identifier that owns it only.

        In a worker thread: an identifier may read files (Claude's record, re-read after a
        torn write)."""
        args = dict(arguments)
        stamps = {key: args.pop(key) for key in self._stamps if key in args}
        return await asyncio.to_thread(self._identify, meta, stamps), args

    def _identify(self, meta: Mapping[str, Any] | None, stamps: Mapping[str, object]
                  ) -> tuple[LoadedHarness, Identity] | None:
        for harness in self.harnesses:
            if harness.arguments is not None:
                identity = harness.arguments.identify_stamped(
                    meta, stamps.get(harness.arguments.stamp))
            else:
                identity = harness.identifier.identify(meta)
            if identity is not None:
                return harness, identity
        return None

    async def agent_for(self, harness: LoadedHarness, identity: Identity) -> Agent:
        if self._closed:
            raise RuntimeError("shim is shutting down")
        key = (identity.harness, identity.session_ref)
        agent = self.agents.get(key)
        if agent is not None:
            return agent
        if harness.supersession:
            await self._retire_others(key)
        task = self._creating.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._create(key, harness, identity))
            self._creating[key] = task

            def forget(_: asyncio.Task[Agent], k: AgentKey = key) -> None:
                self._creating.pop(k, None)  # a failed creation is retried by the next call

            task.add_done_callback(forget)
        return await asyncio.shield(task)

    async def _create(self, key: AgentKey, harness: LoadedHarness,
                      identity: Identity) -> Agent:
        if harness.binder is not None:
            # Harness evidence gathered once, before registration (Codex: the thread's host
            # app-server and its name there). Identity by session_ref is unchanged.
            identity = await harness.binder.bind(identity)
        from crosstalk.agent import Agent, AgentSpec  # here: start-up
        spec = AgentSpec(harness=harness.identifier.harness_for(identity),
                         session_ref=identity.session_ref, cwd=identity.cwd,
                         session_name=identity.session_name, endpoint=identity.endpoint,
                         harness_pid=identity.harness_pid)
        agent = Agent(self.registry, spec, limits=self.limits, env=self.env,
                      control_sinks=self._control_sinks, reconciler=harness.reconciler)
        choice = await agent.start()
        self.agents[key] = agent
        from crosstalk.core.nudge import NudgeCounter  # with the first agent (ADR 0034)

        self.nudges[key] = NudgeCounter()
        if choice.is_fallback:
            holder = choice.preferred_holder
            live = " by a live session" if holder is not None else ""
            held = (f"cannot be used ({choice.preferred_blocked})"
                    if choice.preferred_blocked is not None else f"is held{live}")
            self._notices[key] = (
                f"The name '{choice.preferred}' {held}; this session is registered as "
                f"'{choice.name}'. It will take '{choice.preferred}' once that name is free.")
        return agent

    async def _retire_others(self, key: AgentKey) -> None:
        """Where a process holds one session at a time, any other session of that harness in
        this shim was superseded: stop it (its name goes free for the new session)."""
        for other, task in list(self._creating.items()):
            if other[0] == key[0] and other != key:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        for other in [k for k in self.agents if k[0] == key[0] and k != key]:
            agent = self.agents.pop(other)
            self.nudges.pop(other, None)
            self._notices.pop(other, None)
            log.info("session %s of %s superseded by %s; retiring agent %s", other[1],
                     other[0], key[1], agent.agent_id)
            await agent.stop()

    async def sync(self) -> None:
        """Register each eager identifier's current session; follow renames and fallbacks.

        No evidence (a missing or torn record) changes nothing: it is not proof of anything.
        Also (re)starts the follower of each live-session harness whose follower is not
        running.
        """
        self._follow_live()
        for harness in self.harnesses:
            if not harness.eager or self._closed:
                continue
            identity = await asyncio.to_thread(harness.identifier.identify, None)
            if identity is None:
                continue
            agent = await self.agent_for(harness, identity)
            try:
                choice = agent.follow_name(identity.session_name)
            except (OSError, RegistryError) as exc:
                log.warning("agent %s: rename not applied (%s)", agent.agent_id, exc)
                continue
            key = (identity.harness, identity.session_ref)
            if choice is not None and not choice.is_fallback:
                self._notices.pop(key, None)  # the "name is held" notice no longer holds

    # -- live sessions (harness.base.LiveSessions) ------------------------------------------

    def _follow_live(self) -> None:
        if self._closed:
            return
        for harness in self.harnesses:
            task = self._followers.get(harness.name)
            if harness.live is None or (task is not None and not task.done()):
                continue
            self._followers[harness.name] = asyncio.get_running_loop().create_task(
                self._follow(harness), name=f"live sessions of {harness.name}")

    async def _follow(self, harness: LoadedHarness) -> None:
        assert harness.live is not None
        try:
            async for identities in harness.live.live_sessions():
                await self.apply_live(harness, identities)
        except asyncio.CancelledError:
            raise
        except Exception:  # the next poll starts it again; one failure must not end the shim
            log.warning("following %s's live sessions failed", harness.name, exc_info=True)

    async def apply_live(self, harness: LoadedHarness, identities: Sequence[Identity]) -> None:
        """Make ``identities`` the harness's live set: register the new (within the cap),
        follow renames, retire the ones the previous set had that are gone."""
        wanted = {(i.harness, i.session_ref): i for i in identities}
        previous = self._live.setdefault(harness.name, set())
        for key in sorted(previous - wanted.keys()):
            previous.discard(key)
            agent = self.agents.pop(key, None)
            self.nudges.pop(key, None)
            self._notices.pop(key, None)
            if agent is not None:
                log.info("session %s of %s is no longer live; retiring agent %s", key[1],
                         key[0], agent.agent_id)
                await agent.stop()
        for key, identity in wanted.items():
            if self._closed:
                return
            agent = self.agents.get(key)
            if agent is None:
                if len(previous) >= self.max_live:
                    log.info("live session %s of %s not registered: %d is this shim's cap",
                             key[1], key[0], self.max_live)
                    continue
                try:
                    agent = await self.agent_for(harness, identity)
                except (OSError, RegistryError) as exc:
                    log.warning("live session %s of %s not registered (retried on the next "
                                "set): %s", key[1], key[0], exc)
                    continue
                previous.add(key)
                continue
            previous.add(key)
            if identity.session_name != agent.spec.session_name:
                try:
                    agent.follow_name(identity.session_name)
                except (OSError, RegistryError) as exc:
                    log.warning("agent %s: rename not applied (%s)", agent.agent_id, exc)

    def take_notice(self, identity: Identity) -> str | None:
        """A one-time notice for the session's model (e.g. it got a fallback name)."""
        return self._notices.pop((identity.harness, identity.session_ref), None)

    def nudge_counter(self, identity: Identity) -> NudgeCounter:
        from crosstalk.core.nudge import NudgeCounter  # with the first send (ADR 0034)

        return self.nudges.setdefault((identity.harness, identity.session_ref), NudgeCounter())

    async def close(self) -> None:
        self._closed = True
        for follower in list(self._followers.values()):
            follower.cancel()
            with contextlib.suppress(BaseException):
                await follower
        for task in list(self._creating.values()):
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        agents, self.agents = list(self.agents.values()), {}
        # Concurrently: Claude 2.1.328 follows SIGINT with SIGTERM 100 ms later and SIGKILL
        # 400 ms after that, and one agent's listener takes ~0.1 s to stop; one at a time, a
        # busy shim would be killed mid-cleanup. (Agent.stop unpublishes and unlinks first.)
        await asyncio.gather(*(agent.stop() for agent in agents), return_exceptions=True)
