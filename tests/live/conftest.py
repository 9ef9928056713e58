"""Fixtures of the live suite: the real Claude Code binary, a loopback-only network namespace,
and a fresh :class:`~tests.live.support.claude.World` per test.

Every test here is marked ``live``. Missing prerequisites (npm cannot install the pinned
binary, ``unshare -n`` is not permitted) FAIL the tests with the reason: a live suite that
silently skips proves nothing. ``CROSSTALK_LIVE=0`` skips them deliberately.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
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


@pytest.fixture(scope="session")
def claude_binary() -> Path:
    if _live_disabled():
        pytest.skip("CROSSTALK_LIVE=0: live Claude Code tests disabled")
    try:
        return ensure_claude()
    except InstallError as exc:
        pytest.fail(f"live suite: cannot install Claude Code {VERSION}: {exc}\n"
                    "(set CROSSTALK_LIVE=0 to skip the live suite deliberately)", pytrace=False)


@pytest.fixture(scope="session")
def netns(claude_binary: Path) -> Iterator[Netns]:
    try:
        ns = Netns()
    except LiveError as exc:
        pytest.fail(f"live suite: {exc}\n(set CROSSTALK_LIVE=0 to skip the live suite "
                    "deliberately)", pytrace=False)
    try:
        yield ns
    finally:
        ns.close()


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
