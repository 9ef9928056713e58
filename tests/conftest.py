"""Fixtures every test directory shares: the asyncio backend, the journal audit, and a whole
"machine" (Claude sessions as fake real processes, a Codex home, CrossTalk's state, all in
throw-away directories)."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.claude import FakeClaude, claude_env
from tests.support.journal_audit import OPT_OUT_MARKER, audited


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{OPT_OUT_MARKER}: writes an illegal or damaged journal on purpose; the "
        "journal audit leaves the test alone")


@pytest.fixture
def anyio_backend() -> str:
    """Every ``pytest.mark.anyio`` test runs on asyncio: the product runs on asyncio only."""
    return "asyncio"


@pytest.fixture(autouse=True)
def journal_audit(request: pytest.FixtureRequest) -> Iterator[None]:
    """At teardown, every journal the test wrote must fold through the state table (see
    :mod:`tests.support.journal_audit`; off until ``audit_journal`` exists)."""
    with audited(request):
        yield


@pytest.fixture
def machine_env(tmp_path: Path) -> dict[str, str]:
    """:func:`claude_env` plus a short ``CODEX_HOME`` (its control socket path must fit)."""
    env = claude_env(tmp_path)
    codex_home = tempfile.mkdtemp(prefix="ct-cx-", dir="/tmp")
    atexit.register(shutil.rmtree, codex_home, ignore_errors=True)
    env["CODEX_HOME"] = codex_home
    return env


@pytest.fixture
def fake_sessions() -> Iterator[list[FakeClaude]]:
    """Fake Claude sessions a test started; each is stopped at teardown."""
    started: list[FakeClaude] = []
    yield started
    for fc in started:
        fc.stop()
