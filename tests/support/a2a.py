"""Real parts for the A2A tests: registered agents, a receiver on a real journal, the server
on uvicorn (or in-process ASGI), and the a2a-sdk's own client holding a bearer token."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import (
    AuthInterceptor,
    Client,
    ClientCallContext,
    ClientConfig,
    InMemoryContextCredentialStore,
    create_client,
)
from a2a.types import a2a_pb2 as pb
from google.protobuf.json_format import MessageToDict

from crosstalk.a2a.server import A2AServer
from crosstalk.agent.lane import DISPATCH_GRACE, DispatchLane
from crosstalk.agent.taskgroup import TaskGroup
from crosstalk.core.admission import Limits
from crosstalk.core.ids import new_instance_id, new_message_id
from crosstalk.core.policy import TargetRole
from crosstalk.harness.base import Binding
from crosstalk.harness.fake import FakeHarness
from crosstalk.receiver import Receiver
from crosstalk.store.journal import Journal
from crosstalk.store.registry import Registration, Registry
from tests.support.agents import register_agent

SECRET_CWD = "/work/secret-project-cwd"


@dataclass
class Agent:
    registration: Registration
    name: str

    @property
    def agent_id(self) -> str:
        return self.registration.agent_id

    @property
    def token(self) -> str:
        assert self.registration.token is not None
        return self.registration.token


def registered_agent(reg: Registry, name: str, *, harness: str = "codex",
                     role: str = "primary", owner: str | None = None) -> Agent:
    """An agent registered under ``name`` (or its fallback) in a fresh session of ``harness``."""
    registration = register_agent(reg, f"{name}-{uuid.uuid4().hex[:8]}", name, harness=harness,
                                  cwd=SECRET_CWD, role=role, owner=owner)
    assert registration.name is not None
    return Agent(registration, registration.name)


@dataclass
class Node:
    """One receiving agent: its journal, receiver (fake harness), dispatch lane (in the
    agent's task group, as :class:`crosstalk.agent.Agent` runs it) and A2A server."""

    agent: Agent
    journal: Journal
    fake: FakeHarness
    receiver: Receiver
    server: A2AServer
    group: TaskGroup
    lane: DispatchLane
    url: str = ""
    journal_path: Path = field(default_factory=Path)

    async def start(self) -> str:
        """The lane first (what restore resumed is dispatched), then the listener."""
        await self.lane.start()
        self.url = await self.server.start()
        return self.url

    async def stop(self) -> None:
        """The agent's order: the listener, then the lane (with its grace), then the group."""
        await self.server.stop()
        await self.lane.close()
        await self.group.close()

    def records(self) -> list[dict[str, Any]]:
        return Journal(self.journal_path).replay().records

    def message_records(self, message_id: str) -> list[dict[str, Any]]:
        return [r for r in self.records()
                if r.get("subject") == "message" and r.get("id") == message_id]


def make_node(reg: Registry, agent: Agent, journal_path: Path, *,
              fake: FakeHarness | None = None, limits: Limits | None = None,
              target_role: Callable[[], TargetRole] | None = None,
              binding: Binding | None = None, dispatch_grace_seconds: float = DISPATCH_GRACE,
              **server_kw: Any) -> Node:
    journal = Journal(journal_path)
    fake = fake or FakeHarness()
    receiver = Receiver(
        agent.agent_id, journal, fake,
        binding or Binding("fake", f"session-of-{agent.name}", None, new_instance_id()),
        limits=limits or Limits(), target_role=target_role or TargetRole)
    group = TaskGroup(f"agent {agent.agent_id}")
    lane = DispatchLane(receiver, group, grace_seconds=dispatch_grace_seconds)
    server = A2AServer(receiver=receiver, registry=reg, agent_id=agent.agent_id,
                       name=agent.name, lane=lane, **server_kw)
    return Node(agent, journal, fake, receiver, server, group, lane,
                journal_path=journal_path)


@asynccontextmanager
async def serving(node: Node) -> AsyncIterator[Node]:
    await node.start()
    try:
        yield node
    finally:
        await node.stop()


@asynccontextmanager
async def sdk_client(url: str, token: str | None, *,
                     http: httpx.AsyncClient | None = None) -> AsyncIterator[tuple[
                         Client, ClientCallContext]]:
    """The a2a-sdk's own client: card resolution, JSON-RPC transport, AuthInterceptor."""
    own = http is None
    http = http or httpx.AsyncClient(timeout=30)
    store = InMemoryContextCredentialStore()
    session = uuid.uuid4().hex
    if token is not None:
        await store.set_credentials(session, "bearer", token)
    try:
        client = await create_client(
            url, client_config=ClientConfig(httpx_client=http, streaming=False),
            interceptors=[AuthInterceptor(store)])
        try:
            yield client, ClientCallContext(state={"sessionId": session})
        finally:
            await client.close()
    finally:
        if own:
            await http.aclose()


def text_message(text: str, *, message_id: str | None = None, task_id: str | None = None,
                 context_id: str | None = None, **meta: Any) -> pb.Message:
    msg = pb.Message(message_id=message_id or new_message_id(), role=pb.ROLE_USER,
                     parts=[pb.Part(text=text)])
    if task_id:
        msg.task_id = task_id
    if context_id:
        msg.context_id = context_id
    if meta:
        msg.metadata.update({f"crosstalk.{k}": v for k, v in meta.items()})
    return msg


async def send(client: Client, ctx: ClientCallContext, message: pb.Message, *,
               return_immediately: bool = False) -> pb.Task:
    request = pb.SendMessageRequest(
        message=message,
        configuration=pb.SendMessageConfiguration(return_immediately=return_immediately))
    tasks = [ev.task async for ev in client.send_message(request, context=ctx)
             if ev.HasField("task")]
    assert len(tasks) == 1
    return tasks[0]


def meta(task: pb.Task) -> dict[str, Any]:
    return MessageToDict(task.metadata) if task.HasField("metadata") else {}


# -- fixtures: a test module imports them to use them ----------------------------------------


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    return Registry(tmp_path / "state")


@pytest.fixture
def agents(registry: Registry) -> Iterator[dict[str, Agent]]:
    """alice, bob and carol, registered (not serving)."""
    made = {name: registered_agent(registry, name) for name in ("alice", "bob", "carol")}
    yield made
    for a in made.values():
        a.registration.close()


@pytest.fixture
async def bob(registry: Registry, agents: dict[str, Agent],
              tmp_path: Path) -> AsyncIterator[Node]:
    """Bob's receiving side, served on a real loopback socket."""
    node = make_node(registry, agents["bob"], tmp_path / "bob.jsonl")
    async with serving(node):
        yield node
    node.journal.close()
