"""Wrong things in the wrong places (issue 12, item 8): a directory where a lock file or a
journal belongs. A real ``crosstalk mcp`` shim (the fake harness; a fake Claude session for the
eager path) starts with the directory planted. The session gets a clear error naming the path
and what to do (or, for a name lock, the fallback name), never a traceback; once the path is
cleared, the next call registers.
"""

from __future__ import annotations

import contextlib
import shlex
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from crosstalk.config import journal_path
from crosstalk.core.ids import agent_id_for
from crosstalk.store.registry import Registry
from tests.support.claude import claude_env
from tests.support.claude_world import Node, world
from tests.support.shims import data, meta
from tests.support.shims import world as fake_world
from tests.support.waiting import eventually

pytestmark = pytest.mark.anyio
__all__ = ["fake_world", "world"]  # fixtures

SESSION = "s-paths"
AGENT_ID = agent_id_for("fake", SESSION)


@contextlib.asynccontextmanager
async def logged_shim(env: dict[str, str], log: Path,
                      argv: list[str] | None = None) -> AsyncIterator[Client]:
    """A shim whose stderr goes to ``log`` (``exec``: the shim's parent is still the client)."""
    argv = argv or [sys.executable, "-m", "crosstalk", "mcp"]
    command = f"exec {shlex.join(argv)} 2>>{shlex.quote(str(log))}"
    params = StdioServerParameters(command="/bin/sh", args=["-c", command], env=env)
    async with Client(params, mode="legacy") as client:
        yield client


def state(env: dict[str, str]) -> Path:
    home = Path(env["CROSSTALK_HOME"])
    Registry(home)  # the tree, as a shim makes it
    (home / "journal").mkdir(mode=0o700, exist_ok=True)
    return home


def no_traceback(log: Path) -> str:
    text = log.read_text() if log.exists() else ""
    assert "Traceback" not in text, text
    assert "IsADirectoryError" not in text, text
    return text


async def test_a_directory_at_the_name_lock_gives_the_fallback_name(
        fake_world: dict[str, str], tmp_path: Path) -> None:
    planted = state(fake_world) / "names" / "bob.lock"
    planted.mkdir()
    log = tmp_path / "shim.log"
    async with logged_shim(fake_world, log) as c:
        res = await c.call_tool("receive_message", {}, meta=meta(SESSION, "bob"))
        assert not res.is_error, data(res)
        notice = data(res)["notice"]
        assert str(planted) in notice
        assert "bob" in notice
        [row] = data(await c.call_tool("list_agents", {}))["agents"]
        assert row["agent_id"] == AGENT_ID
        assert row["name"].startswith("fake-")
        assert row["name"].endswith(AGENT_ID[:8])
        assert row["reachable"] is True
    text = no_traceback(log)
    assert str(planted) in text  # one warning line naming it, for whoever reads the log
    assert planted.is_dir()  # not ours: left alone


@pytest.mark.parametrize("where", ["agent lock", "journal", "journal lock", "descriptor",
                                   "credential"])
async def test_a_directory_at_a_lock_or_journal_is_a_clear_error(
        fake_world: dict[str, str], tmp_path: Path, where: str) -> None:
    home = state(fake_world)
    planted = {
        "agent lock": home / "agents" / f"{AGENT_ID}.lock",
        "journal": journal_path(home, AGENT_ID),
        "journal lock": journal_path(home, AGENT_ID).with_suffix(".jsonl.lock"),
        "descriptor": home / "agents" / f"{AGENT_ID}.json",
        "credential": home / "credentials" / f"{AGENT_ID}.token",
    }[where]
    planted.mkdir()
    log = tmp_path / "shim.log"
    async with logged_shim(fake_world, log) as c:
        res = await c.call_tool("receive_message", {}, meta=meta(SESSION, "bob"))
        assert res.is_error
        failed = data(res)
        assert failed["error"] == "registration_failed", failed
        assert str(planted) in failed["hint"]
        assert "is a directory" in failed["hint"]
        assert f"rmdir {planted}" in failed["hint"]  # it is empty: say exactly what to run
        assert data(await c.call_tool("list_agents", {}))["agents"] == []
        planted.rmdir()
        # A failed registration is not cached: the next call registers.
        res = await c.call_tool("receive_message", {}, meta=meta(SESSION, "bob"))
        assert not res.is_error, data(res)
        [row] = data(await c.call_tool("list_agents", {}))["agents"]
        assert (row["name"], row["reachable"]) == ("bob", True)
    no_traceback(log)


async def test_a_non_empty_directory_is_moved_away_not_removed(
        fake_world: dict[str, str], tmp_path: Path) -> None:
    planted = journal_path(state(fake_world), AGENT_ID)
    planted.mkdir()
    (planted / "notes.txt").write_text("someone's")
    async with logged_shim(fake_world, tmp_path / "shim.log") as c:
        res = await c.call_tool("receive_message", {}, meta=meta(SESSION, "bob"))
        hint = data(res)["hint"]
        assert "rmdir" not in hint
        assert f"mv {planted} " in hint
    assert (planted / "notes.txt").read_text() == "someone's"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return claude_env(tmp_path)


async def test_an_eager_session_with_a_directory_at_its_agent_lock(
        world: Callable[..., Node], tmp_path: Path) -> None:
    """A Claude shim registers at start and retries every poll: one clear line in its log, a
    clear tool error, and registration once the directory is gone."""
    bob = world("bob")
    home = state(bob.env)
    planted = home / "agents" / f"{bob.agent_id}.lock"
    planted.mkdir()
    log = tmp_path / "eager.log"
    launch = bob.fc.server_params()
    async with logged_shim(bob.env, log, [launch.command, *launch.args]) as c:
        await eventually(lambda: log.exists() and str(planted) in log.read_text(),
                         what="the shim logs why it cannot register")
        res = await c.call_tool("send_message", {"to": "nobody", "text": "hi"})
        assert res.is_error
        assert data(res)["error"] == "registration_failed"
        assert str(planted) in data(res)["hint"]
        planted.rmdir()
        reg = Registry(home)
        await eventually(lambda: reg.live_descriptor(bob.agent_id) is not None,
                         what="bob registered once the directory is gone")
    text = no_traceback(log)
    logged = [line for line in text.splitlines() if str(planted) in line]
    assert len(logged) == 1, text  # logged once, not once per poll
