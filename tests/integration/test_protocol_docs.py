"""docs/protocol.md's A2A section says what the server really does, and its ``curl`` example
works exactly as written (issue 13 §3).

The example is the fenced block after ``<!-- curl-example -->``. The test replaces only the
placeholders the page documents (two agent names), runs the block with the real ``curl``
against a real ``crosstalk mcp`` agent (the fake harness), and reads both answers. It installs
nothing: without ``curl`` or ``jq`` on the machine it is skipped.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from crosstalk.a2a import asgi
from tests.support.shims import data, inbox, meta, shim, world

pytestmark = pytest.mark.anyio
__all__ = ["world"]  # fixtures

PROTOCOL_MD = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
MARKER = "<!-- curl-example -->"
#: The placeholders the page documents, and what the test puts in their place.
PLACEHOLDERS = {"RECEIVER": "bob", "SENDER": "alice"}
CURL_WAIT = 60.0


def _a2a_section() -> str:
    text = PROTOCOL_MD.read_text()
    start = text.index("\n## A2A")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def curl_example() -> tuple[str, str]:
    """The example's shell text and the prose before it (where its placeholders are named)."""
    text = PROTOCOL_MD.read_text()
    at = text.index(MARKER)
    found = re.compile(r"```sh\n(.*?)\n```", re.S).search(text, at)
    assert found is not None, "no ```sh block after the marker"
    assert text[at + len(MARKER):found.start()].strip() == "", "the block must follow the marker"
    return found.group(1), text[max(0, at - 1500):at]


def test_the_a2a_section_names_the_version_header_and_the_wire() -> None:
    section = _a2a_section()
    assert "JSON-RPC 1.0" not in PROTOCOL_MD.read_text()
    assert "JSON-RPC 2.0" in section
    assert "A2A-Version: 1.0" in section
    assert "-32009" in section
    card_doc = asgi.agent_card.__doc__ or ""
    assert "JSON-RPC 1.0" not in card_doc
    assert "JSON-RPC 2.0" in card_doc
    for said in ("-32000", "UNAUTHENTICATED", "Cache-Control", "UNRECOGNIZED"):
        assert said in section, said


@pytest.mark.skipif(shutil.which("curl") is None or shutil.which("jq") is None,
                    reason="the example needs curl and jq, and this test installs nothing")
async def test_the_curl_example_works_exactly_as_written(world: dict[str, str]) -> None:
    script, prose = curl_example()
    for placeholder, value in PLACEHOLDERS.items():
        assert f"`{placeholder}`" in prose, f"{placeholder} is not documented before the block"
        assert placeholder in script
        script = script.replace(placeholder, value)
    async with shim(world) as client:
        for session, name in (("b1", "bob"), ("a1", "alice")):  # both really registered
            assert "entries" in data(await client.call_tool(
                "receive_message", {}, meta=meta(session, name)))
        env = {**world, "PATH": os.pathsep.join([str(Path(sys.executable).parent),
                                                 os.environ.get("PATH", "")])}
        ran = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True,
                             timeout=CURL_WAIT, check=False)
        assert ran.returncode == 0, ran.stderr
        answers: list[dict[str, Any]] = [json.loads(line) for line in ran.stdout.splitlines()
                                         if line.strip()]
        got = [e["text"] for e in inbox(world, "b1")]
    card, sent = answers
    assert card["name"] == "bob"
    assert card["supportedInterfaces"][0]["protocolVersion"] == "1.0"
    assert "error" not in sent, sent
    task = sent["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert task["metadata"]["crosstalk.state"] == "accepted"
    text = next(p["text"] for p in task["history"][0]["parts"])
    assert got == [text]  # it reached bob's session, once
    token = (Path(world["CROSSTALK_HOME"]) / "credentials").glob("*.token")
    assert not any(t.read_text().strip() in ran.stdout for t in token)
