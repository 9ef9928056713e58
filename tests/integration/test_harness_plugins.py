"""A harness is one package plus one entry point: the ``crosstalk.harnesses`` group.

A third harness, registered by a throw-away distribution (a ``*.dist-info`` with an
``entry_points.txt`` in a temp directory on ``PYTHONPATH``), is found by the same loader as
Claude and Codex, with no change to CrossTalk: its sessions are listed by ``list_agents`` in a
real ``crosstalk mcp`` and by ``crosstalk agents``, it reports in ``crosstalk doctor``, and
``crosstalk install --dry-run`` plans its config.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
import textwrap
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from crosstalk.harness import GROUP, plugins
from crosstalk.harness.base import LoadedHarness
from crosstalk.harness.claude import ClaudeIdentifier
from crosstalk.harness.codex import CodexIdentifier
from crosstalk.harness.fake import FakeIdentifier

pytestmark = pytest.mark.anyio

#: The third harness's package: an identifier (by a ``_meta`` key, like Codex's threadId)
#: that is also a Discovery, a config install edits, and a doctor finding.
THIRD = textwrap.dedent('''
    """A third harness, as a third party would ship it."""

    from pathlib import Path

    from crosstalk.core.states import MessageState
    from crosstalk.harness.base import Identity, Outcome, Session
    from crosstalk.harness.fake import FakeHarness
    from crosstalk.harness.plugin import ConfigEdit, Finding, HarnessPlugin

    SESSION, NAME = "third/session", "third/name"


    class ThirdIdentifier:
        name = "third"
        supersession = False

        def __init__(self, cwd):
            self.cwd = cwd

        def identify(self, meta):
            session = (meta or {}).get(SESSION)
            if not isinstance(session, str):
                return None
            return Identity("third", session, self.cwd, session_name=(meta or {}).get(NAME))

        def harness_for(self, identity):
            return FakeHarness(name="third")

        def discover(self):
            return [Session("third", "native-1", "third-native", "/w/third", "idle",
                            reachable=False)]

        async def send_native(self, session, delivery):
            return Outcome(MessageState.UNREACHABLE, "third_native")


    def config(env):
        return Path(env["HOME"]) / ".third" / "config.txt"


    plugin = HarnessPlugin(
        name="third", trust=50,
        identifier=lambda ctx: ThirdIdentifier(ctx.cwd),
        discovery=lambda env: ThirdIdentifier("/"),
        install=lambda env: [ConfigEdit(
            "third", config(env),
            add=lambda text, command: (text or "") + "server " + " ".join(command) + "\\n",
            remove=lambda text: "")],
        doctor=lambda env: [Finding(True, f"Third: config at {config(env)}")],
        why_unreachable=lambda session: "third sessions take no messages today")
''')


@pytest.fixture
def third_site(tmp_path: Path) -> Path:
    """A directory that, on ``sys.path``, installs the ``crosstalk-third`` distribution."""
    site = tmp_path / "site"
    dist = site / "crosstalk_third-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: crosstalk-third\n"
                                   "Version: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{GROUP}]\nthird = crosstalk_third:plugin\n")
    (site / "crosstalk_third.py").write_text(THIRD)
    return site


@pytest.fixture
def env(tmp_path: Path, third_site: Path) -> Iterator[dict[str, str]]:
    short = tempfile.mkdtemp(prefix="ct-3h-", dir="/tmp")  # socket paths must stay short
    path = os.pathsep.join(filter(None, [str(third_site), os.environ.get("PYTHONPATH")]))
    world = {k: v for k, v in os.environ.items() if k != "CROSSTALK_HARNESS"}
    world.update(HOME=str(tmp_path / "home"), CROSSTALK_HOME=str(tmp_path / "state"),
                 CLAUDE_CONFIG_DIR=str(tmp_path / "claude"), CODEX_HOME=f"{short}/cx",
                 XDG_RUNTIME_DIR=f"{short}/rt", PYTHONPATH=path)
    yield world
    shutil.rmtree(short, ignore_errors=True)


async def crosstalk(env: dict[str, str], *args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "crosstalk", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


@asynccontextmanager
async def shim(env: dict[str, str]) -> AsyncIterator[Client]:
    params = StdioServerParameters(command=sys.executable, args=["-m", "crosstalk", "mcp"],
                                   env=env)
    async with Client(params) as client:
        yield client


def data(result: Any) -> dict[str, Any]:
    assert result.structured_content is not None
    return dict(result.structured_content)


def test_claude_and_codex_register_through_the_entry_point_group() -> None:
    names = {point.name for point in entry_points(group=GROUP)}
    assert {"claude", "codex"} <= names
    loaded = [p.name for p in plugins()]
    assert loaded.index("codex") < loaded.index("claude") < loaded.index("fake")  # trust order


def test_capabilities_are_read_once_from_the_identifier() -> None:
    claude = LoadedHarness.of(ClaudeIdentifier([]))
    assert (claude.eager, claude.supersession) == (True, True)
    assert claude.control is not None
    assert claude.discovery is not None
    assert claude.binder is not None  # starts the gate helper before registration (ADR 0020)
    assert claude.reconciler is None
    codex = LoadedHarness.of(CodexIdentifier())
    assert (codex.eager, codex.supersession) == (False, False)
    assert codex.binder is not None
    assert codex.reconciler is not None
    assert codex.discovery is not None
    assert codex.control is None
    fake = LoadedHarness.of(FakeIdentifier())
    assert (fake.binder, fake.control, fake.reconciler, fake.discovery) == (None,) * 4
    assert (fake.eager, fake.supersession) == (False, False)


async def test_a_third_harness_needs_only_its_package_and_an_entry_point(
        env: dict[str, str]) -> None:
    async with shim(env) as c:
        first = data(await c.call_tool("receive_message", {},
                                       meta={"third/session": "t-1", "third/name": "thirdling"}))
        assert first["entries"] == []
        rows = {r["name"]: r for r in data(await c.call_tool("list_agents", {}))["agents"]}
        assert rows["thirdling"]["harness"] == "third"
        assert rows["thirdling"]["crosstalk"] is True
        assert (rows["third-native"]["harness"], rows["third-native"]["crosstalk"]) == (
            "third", False)

        code, out = await crosstalk(env, "agents", "--json")
        assert code == 0, out
        listed = {r["name"]: r for r in json.loads(out)}
        assert listed["thirdling"]["harness"] == "third"
        assert listed["third-native"]["unreachable_because"] == (
            "third sessions take no messages today")

    code, out = await crosstalk(env, "doctor")
    assert f"ok      Third: config at {env['HOME']}/.third/config.txt" in out
    assert "Claude Code: no 'crosstalk' MCP server" in out  # the others still report

    code, out = await crosstalk(env, "install", "--dry-run")
    assert code == 0, out
    assert f"create: {env['HOME']}/.third/config.txt" in out
    assert "+server " in out
    assert out.count("create: ") == 6  # the third + Claude (2), Codex (1), opencode (2)
    assert not Path(env["HOME"]).exists()
