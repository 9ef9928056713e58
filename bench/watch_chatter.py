"""Three real agents talking in one state dir until interrupted: something for ``crosstalk
watch`` to show in a terminal (docs/watch.md's screen snapshot is taken beside it).

alice, bob and carol are real agents (registry, journal, receiver, uds and A2A on loopback)
whose sessions are the fake harness; every few seconds alice informs bob, carol asks bob (bob
answers some, lets one expire), and now and then bob's session queues one or cannot be reached, so
every state the watch draws shows up. Usage:

    CROSSTALK_HOME=/tmp/ct-watch python bench/watch_chatter.py [--rounds N] [--every S]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
from pathlib import Path

from crosstalk.agent import Agent, AgentSpec
from crosstalk.config import state_dir
from crosstalk.core.states import MessageState
from crosstalk.harness.fake import FakeHarness, Step
from crosstalk.store.registry import Registry


async def chatter(home: Path, rounds: int, every: float) -> None:
    env = {"XDG_RUNTIME_DIR": tempfile.mkdtemp(prefix="ct-chat-", dir="/tmp")}
    reg = Registry(home)
    bob_session = FakeHarness(name="fake")
    agents = {name: Agent(reg, AgentSpec(harness, f"{name}-session", os.getcwd(), name),
                          env=env)
              for name, harness in (("alice", FakeHarness(name="fake")), ("bob", bob_session),
                                    ("carol", FakeHarness(name="fake")))}
    for agent in agents.values():
        await agent.start()
    alice, bob, carol = agents["alice"], agents["bob"], agents["carol"]
    try:
        for n in range(rounds):
            await alice.send("bob", f"build {1430 + n} is green")
            await asyncio.sleep(every / 3)
            asked = await carol.send("bob", f"which test is flaky in run {n}?", kind="ask",
                                     deadline_seconds=20 if n % 3 == 2 else 60,
                                     return_immediately=True)
            await asyncio.sleep(every / 3)
            if n % 3 != 2:  # every third ask is left to expire
                await bob.reply(asked.message_id, f"test_retry (run {n})")
            if n % 4 == 1:
                bob_session.script.append(Step(MessageState.QUEUED, reason="session busy"))
            if n % 4 == 3:
                bob_session.script.append(Step(MessageState.UNREACHABLE,
                                               reason="session closed", write=False))
            await bob.send("alice", f"deploying {1430 + n}", delivery="next_turn")
            await asyncio.sleep(every / 3)
    finally:
        for agent in agents.values():
            await agent.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--every", type=float, default=3.0, help="seconds per round")
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(chatter(state_dir(), args.rounds, args.every))


if __name__ == "__main__":
    main()
