"""Fixtures of the live suite: the real Claude Code binary, a loopback-only network namespace,
and a fresh :class:`~tests.live.support.claude.World` per test.

Every test here is marked ``live``. Missing prerequisites (npm cannot install the pinned
binary, ``unshare -n`` is not permitted) FAIL the tests with the reason: a live suite that
silently skips proves nothing. ``CROSSTALK_LIVE=0`` skips them deliberately.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.live.support.claude import LiveError, Netns, World
from tests.live.support.install import VERSION, InstallError, ensure_claude

LIVE_DIR = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "live: drives the real Claude Code binary in a loopback-only network "
        "namespace (CROSSTALK_LIVE=0 skips)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if LIVE_DIR in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.live)


def _live_disabled() -> bool:
    return os.environ.get("CROSSTALK_LIVE", "").strip() == "0"


def _installed(what: str, version: str, install: Callable[[], Path]) -> Path:
    """A pinned binary, installed once; a failure fails the run (only CROSSTALK_LIVE=0 skips)."""
    if _live_disabled():
        pytest.skip(f"CROSSTALK_LIVE=0: live {what} tests disabled")
    try:
        return install()
    except InstallError as exc:
        pytest.fail(f"live suite: cannot install {what} {version}: {exc}\n"
                    "(set CROSSTALK_LIVE=0 to skip the live suite deliberately)", pytrace=False)


def _namespace() -> Iterator[Netns]:
    """A loopback-only network namespace for the session's harness processes."""
    try:
        ns = Netns()
    except LiveError as exc:
        pytest.fail(f"live suite: {exc}\n(set CROSSTALK_LIVE=0 to skip the live suite "
                    "deliberately)", pytrace=False)
    try:
        yield ns
    finally:
        ns.close()


@pytest.fixture(scope="session")
def claude_binary() -> Path:
    return _installed("Claude Code", VERSION, ensure_claude)


@pytest.fixture(scope="session")
def netns(claude_binary: Path) -> Iterator[Netns]:
    yield from _namespace()


@dataclass
class Timings:
    """Durations the live tests report; printed in the terminal summary."""

    rows: list[tuple[str, str, float]] = field(default_factory=list)
    test: str = ""

    def add(self, what: str, seconds: float) -> None:
        self.rows.append((self.test, what, seconds))
        print(f"[live timing] {self.test}: {what} = {seconds:.3f} s")


_TIMINGS = Timings()


@pytest.fixture
def timings(request: pytest.FixtureRequest) -> Timings:
    _TIMINGS.test = request.node.name
    return _TIMINGS


_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call":
        item.stash[_FAILED] = report.failed
        if LIVE_DIR in Path(str(item.path)).resolve().parents:
            _TIMINGS.rows.append((item.name, "whole test call", report.duration))
    return report


@pytest.fixture
def world(request: pytest.FixtureRequest, netns: Netns, claude_binary: Path) -> Iterator[World]:
    """The shared setting of one test's Claude sessions; torn down with a leak check."""
    w = World(netns, claude_binary)
    try:
        yield w
    finally:
        if request.node.stash.get(_FAILED, False):
            print(w.diagnostics())
        w.close()
    if w.leftovers:
        pytest.fail("live teardown: processes outlived their sessions:\n  "
                    + "\n  ".join(w.leftovers), pytrace=False)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _TIMINGS.rows:
        return
    terminalreporter.section("live timings")
    for test, what, seconds in _TIMINGS.rows:
        terminalreporter.write_line(f"{seconds:8.3f} s  {test}: {what}")


# == OpenAI Codex =============================================================================
# The Codex half of the live suite (tests/live/test_codex_live.py). Codex tests get a namespace
# of their own (``codex_netns``), so running only them needs no Claude install; a test that
# wants both harnesses takes ``codex_with_claude``, which shares the Claude ``world``'s dirs
# and namespace and is torn down before it.

from tests.live.support.codex import CodexWorld  # noqa: E402
from tests.live.support.install import CODEX_VERSION, ensure_codex  # noqa: E402


@pytest.fixture(scope="session")
def codex_binary() -> Path:
    return _installed("Codex", CODEX_VERSION, ensure_codex)


@pytest.fixture(scope="session")
def codex_netns(codex_binary: Path) -> Iterator[Netns]:
    yield from _namespace()


def _codex_teardown(request: pytest.FixtureRequest, cw: CodexWorld) -> None:
    if request.node.stash.get(_FAILED, False):
        print(cw.diagnostics())
    cw.close()
    if cw.leftovers:
        pytest.fail("live teardown: Codex processes or files outlived their app-server:\n  "
                    + "\n  ".join(cw.leftovers), pytrace=False)


@pytest.fixture
def codex_world(request: pytest.FixtureRequest, codex_netns: Netns,
                codex_binary: Path) -> Iterator[CodexWorld]:
    """One test's Codex threads: a CODEX_HOME, the mock Responses API and an app-server."""
    cw = CodexWorld(codex_netns, codex_binary)
    try:
        yield cw
    finally:
        _codex_teardown(request, cw)


@pytest.fixture
def codex_with_claude(request: pytest.FixtureRequest, world: World,
                      codex_binary: Path) -> Iterator[CodexWorld]:
    """Codex threads sharing the Claude ``world``'s HOME, CROSSTALK_HOME, XDG_RUNTIME_DIR,
    CLAUDE_CONFIG_DIR and namespace (stopped first; the world's leak check then covers both)."""
    cw = CodexWorld(world.netns, codex_binary, share=world)
    try:
        yield cw
    finally:
        _codex_teardown(request, cw)


# == opencode =================================================================================
# The opencode half (tests/live/test_opencode_live_plugin.py): its own namespace
# (``opencode_netns``), so running only these needs no Claude install; ``opencode_with_claude``
# shares the Claude ``world``'s dirs and namespace and is torn down before it.

from tests.live.support.opencode import VERSION as OPENCODE_VERSION  # noqa: E402
from tests.live.support.opencode import OpencodeWorld, ensure_opencode  # noqa: E402


@pytest.fixture(scope="session")
def opencode_binary() -> Path:
    return _installed("opencode", OPENCODE_VERSION, ensure_opencode)


@pytest.fixture(scope="session")
def opencode_netns(opencode_binary: Path) -> Iterator[Netns]:
    yield from _namespace()


def _opencode_teardown(request: pytest.FixtureRequest, ow: OpencodeWorld) -> None:
    if request.node.stash.get(_FAILED, False):
        print(ow.diagnostics())
    ow.close()
    if ow.leftovers:
        pytest.fail("live teardown: opencode processes outlived their test:\n  "
                    + "\n  ".join(ow.leftovers), pytrace=False)


@pytest.fixture
def opencode_world(request: pytest.FixtureRequest, opencode_netns: Netns,
                   opencode_binary: Path) -> Iterator[OpencodeWorld]:
    """One test's opencode processes: HOME and XDG dirs, CROSSTALK_HOME, the mock provider."""
    ow = OpencodeWorld(opencode_netns, opencode_binary)
    try:
        yield ow
    finally:
        _opencode_teardown(request, ow)


@pytest.fixture
def opencode_with_claude(request: pytest.FixtureRequest, world: World,
                         opencode_binary: Path) -> Iterator[OpencodeWorld]:
    """opencode processes sharing the Claude ``world``'s HOME, CROSSTALK_HOME,
    XDG_RUNTIME_DIR and namespace (stopped first; the world's leak check then covers both)."""
    ow = OpencodeWorld(world.netns, opencode_binary, share=world)
    try:
        yield ow
    finally:
        _opencode_teardown(request, ow)
