"""Fixtures shared by the integration tests that build a whole "machine": Claude sessions
(fake, real processes), a Codex home, CrossTalk's state — all in throw-away directories."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration._claude_support import FakeClaude, claude_env


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
