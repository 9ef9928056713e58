"""``crosstalk demo``: two agents talking, with no harness installed.

Everything is the real thing — registry (flocks, descriptors, 0600 credentials), journal
(fsync before every acknowledgement), receiver chain, uds ingress, A2A listeners on
127.0.0.1, the Claude injector with its envelope — except the two sessions: each is an
in-process inbox that behaves like a Claude Code session's (NDJSON over a unix socket, never
a byte back, closes at EOF), and a few lines here stand in for the two models.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crosstalk import proc
from crosstalk.agent import Agent, AgentSpec
from crosstalk.core.records import kind_of
from crosstalk.harness.base import Binding, Delivery, Outcome
from crosstalk.harness.claude import Injector
from crosstalk.harness.claude.registry import ClaudeSession
from crosstalk.store.registry import Registry


def _say(step: str, text: str) -> None:
    print(f"[{step:<8}] {text}", flush=True)


@dataclass
class DemoSession:
    """A session's inbox, as Claude Code has one: what reaches its model is printed."""

    name: str
    path: Path
    frames: list[dict[str, Any]] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    _server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._on_connect, str(self.path))

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _on_connect(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        data = await reader.read()  # to EOF; nothing is ever written back
        writer.close()
        for line in data.decode().splitlines():
            frame = json.loads(line) if line.strip() else {}
            if frame.get("type") != "user":
                continue
            self.frames.append(frame)
            lines = frame["message"]["content"].splitlines()
            _say(self.name, f"model receives: {lines[0][:72]}...")
            for shown in lines[1:-1]:
                _say(self.name, f"                {shown}")
            self.arrived.set()

    async def next_frame(self) -> dict[str, Any]:
        await asyncio.wait_for(self.arrived.wait(), 10)
        self.arrived.clear()
        return self.frames[-1]


@dataclass
class DemoHarness:
    """Injects into a :class:`DemoSession` with the real Claude injector (frame, envelope,
    pacing, EOF semantics)."""

    session: DemoSession
    config_dir: Path
    name: str = "demo"

    async def inject(self, binding: Binding, delivery: Delivery) -> Outcome:
        me = os.getpid()
        target = ClaudeSession(pid=me, session_id=binding.session_ref,
                               config_dir=self.config_dir, record_path=self.config_dir / "none",
                               messaging_socket_path=str(self.session.path),
                               proc_start=proc.process_start_time(me),
                               pid_domain=proc.pid_domain())
        return await Injector(grace=0.05).deliver(
            target, delivery, from_address=delivery.reply_address or "", session_id=None)


def _journal_line(rec: dict[str, Any]) -> str:
    what = kind_of(rec)
    extra = rec.get("reason") or rec.get("evidence") or ""
    return f"seq {rec.get('seq'):>2}  {what:<8} {rec.get('state', '')!s:<11} {extra}"


async def _run(home: Path) -> None:
    reg = Registry(home)
    _say("state", f"state directory {home} (mode {oct(home.stat().st_mode & 0o777)})")
    runtime = Path(tempfile.mkdtemp(prefix="ct-demo-", dir="/tmp"))
    env = {"XDG_RUNTIME_DIR": str(runtime)}
    sessions = {n: DemoSession(n, runtime / f"{n}.inbox") for n in ("alice", "bob")}
    agents: dict[str, Agent] = {}
    try:
        for name, session in sessions.items():
            await session.start()
            agent = Agent(reg, AgentSpec(DemoHarness(session, home), f"{name}-session",
                                         os.getcwd(), name), env=env)
            await agent.start()
            agents[name] = agent
            d = agent.descriptor
            assert d is not None
            _say("register", f"{name}: agent {agent.agent_id}, A2A {d.a2a_url}, uds "
                 f"{Path(d.uds_path or '').name}; token only in a 0600 file")
        alice, bob = agents["alice"], agents["bob"]

        _say("send", "alice -> bob (inform, over A2A with alice's bearer token)")
        sent = await alice.send("bob", "build 1432 is green")
        await sessions["bob"].next_frame()
        _say("result", f"{sent.state}: bob's inbox read the frame (journaled before the answer)")

        _say("ask", "alice asks bob, deadline 60 s")
        asked = await alice.send("bob", "which test is flaky?", kind="ask",
                                 deadline_seconds=60, until_delivered=True)
        await sessions["bob"].next_frame()
        _say("result", f"{asked.state}; the ask stays open until bob's model replies")

        _say("reply", f"bob's model calls reply(message_id={asked.message_id[:13]}...)")
        answer = await bob.reply(asked.message_id, "test_retry, in tests/test_a2a.py")
        frame = await sessions["alice"].next_frame()
        linked = "in-reply-to=" + asked.message_id in frame["message"]["content"]
        _say("result", f"{answer['state']}: it reached alice"
             + (", marked as the answer to her ask" if linked else ""))

        _say("journal", "bob's journal (every line fsynced before anything was acknowledged):")
        for rec in bob.journal_records():
            _say("", _journal_line(rec))
    finally:
        for agent in agents.values():
            await agent.stop()
        for session in sessions.values():
            await session.stop()
        shutil.rmtree(runtime, ignore_errors=True)
    _say("exit", f"agents stopped; live descriptors left: {len(reg.live())}")


def run_demo(*, keep: bool = False) -> int:
    home = Path(tempfile.mkdtemp(prefix="crosstalk-demo-"))
    try:
        asyncio.run(_run(home))
        print("\nInstall for real sessions: crosstalk install (see docs/setup.md).")
        return 0
    finally:
        if keep:
            print(f"state kept in {home}")
        else:
            shutil.rmtree(home, ignore_errors=True)
