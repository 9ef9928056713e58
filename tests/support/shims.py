"""Real ``crosstalk mcp`` processes for the fake harness, driven by the official MCP client.

A call names its session in ``_meta`` (as Codex names its thread), and what reaches a session's
"model" is appended to ``$CROSSTALK_FAKE_INBOX/<session>.jsonl``. ``world`` is a fixture: a
test module imports it to use it.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from crosstalk.harness.fake import FAKE_NAME_META, FAKE_SESSION_META


@pytest.fixture
def world(tmp_path: Path) -> dict[str, str]:
    runtime = tempfile.mkdtemp(prefix="ct-rt-", dir="/tmp")
    # Claude's config roots too: list_agents discovers Claude sessions, and the machine's own
    # (~/.claude) must not leak into a test's world.
    return {**os.environ, "CROSSTALK_HOME": str(tmp_path / "state"),
            "CLAUDE_CONFIG_DIR": str(tmp_path / "claude"), "HOME": str(tmp_path),
            "XDG_RUNTIME_DIR": runtime, "CROSSTALK_HARNESS": "fake",
            "CROSSTALK_FAKE_INBOX": str(tmp_path / "inbox")}


def meta(session: str, name: str | None = None) -> dict[str, Any]:
    m: dict[str, Any] = {FAKE_SESSION_META: session}
    if name:
        m[FAKE_NAME_META] = name
    return m


@asynccontextmanager
async def shim(env: dict[str, str], mode: str = "legacy") -> AsyncIterator[Client]:
    params = StdioServerParameters(command=sys.executable, args=["-m", "crosstalk", "mcp"],
                                   env=env)
    async with Client(params, mode=mode) as client:  # type: ignore[arg-type]
        yield client


def data(result: Any) -> dict[str, Any]:
    assert result.structured_content is not None
    parsed = json.loads(result.content[0].text)
    assert parsed == result.structured_content
    return dict(result.structured_content)


def inbox(env: dict[str, str], session: str) -> list[dict[str, Any]]:
    path = Path(env["CROSSTALK_FAKE_INBOX"]) / f"{session}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]
