"""The agent rig: register an agent on a real registry the way a shim does (seed §3).

Agent lock, name lock, credential, then the descriptor, with this process's identity unless a
test publishes another process's (a child's pid and start time, a harness pid).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

from crosstalk import proc
from crosstalk.agent import Agent, AgentSpec
from crosstalk.core.ids import agent_id_for, new_instance_id
from crosstalk.core.naming import name_candidates
from crosstalk.harness.fake import FakeHarness
from crosstalk.store.registry import Descriptor, Registration, Registry, own_process_identity

#: The working directory registered agents report unless a test names one.
CWD = "/work"


def register_agent(
    registry: Registry,
    session: str,
    name: str | None = None,
    *,
    harness: str = "claude",
    cwd: str = CWD,
    exact_name: bool = False,
    into: list[Registration] | None = None,
    uds_path: Path | str | None = None,
    **fields: Any,
) -> Registration:
    """Register ``harness``'s ``session``; the registration holds its locks until closed.

    The name is the shim's choice (``name`` if free, else a fallback); with ``exact_name`` it is
    ``name`` or :class:`~crosstalk.store.registry.NoFreeName`. ``into`` receives the
    registration as soon as it holds the agent lock, so a fixture closes it even when a later
    step fails. ``fields`` are further descriptor fields (``pid``, ``started_at``,
    ``harness_pid``, ``role``, ``owner``, …); ``pid``/``started_at`` default to this process
    and ``pid_domain`` to this machine's.
    """
    agent_id = agent_id_for(harness, session)
    registration = registry.acquire(agent_id)
    if into is not None:
        into.append(registration)
    candidates: Iterable[str]
    if exact_name:
        assert name is not None, "exact_name needs a name"
        candidates = [name]
    else:
        candidates = name_candidates(harness, cwd, agent_id, name)
    choice = registration.take_name(candidates)
    cred = registration.issue_credential()
    pid, started = own_process_identity()
    described: dict[str, Any] = {
        "pid": pid, "started_at": started, "pid_domain": proc.pid_domain(),
        "uds_path": str(uds_path) if uds_path else None, **fields}
    registration.publish(Descriptor(
        agent_id=agent_id, name=choice.name, harness=harness, session_ref=session, cwd=cwd,
        instance_id=new_instance_id(), credential_ref=str(cred), **described))
    return registration


def plant_dead_agent(registry: Registry) -> Descriptor:
    """The descriptor a crashed agent left behind ("ghost", pid 999999, no lock held), written
    straight to the registry as the dead process left it; a sweep or doctor must remove it."""
    stale = Descriptor(agent_id="0" * 16, name="ghost", harness="fake", session_ref="g",
                       cwd="/", pid=999999, started_at="1", instance_id="i",
                       credential_ref="/nowhere")
    registry.descriptor_path(stale.agent_id).write_bytes(stale.to_json())
    return stale


def fake_agent(home: Path, env: dict[str, str], session: str, name: str, *,
               cwd: str = "/w") -> Agent:
    """A real agent whose session is the fake harness (``harness.fake``), not started."""
    return Agent(Registry(home), AgentSpec(FakeHarness(name="fake"), session, cwd, name),
                 env=env)


@contextlib.asynccontextmanager
async def running(*agents: Agent) -> AsyncIterator[tuple[Agent, ...]]:
    """Start ``agents`` in order; stop every one that started, whatever happens."""
    started: list[Agent] = []
    try:
        for agent in agents:
            await agent.start()
            started.append(agent)
        yield agents
    finally:
        for agent in started:
            await agent.stop()
