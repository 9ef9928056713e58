"""Every request line a harness writes to ``crosstalk mcp`` gets an answer.

Raw JSON-RPC lines into a real shim process (the fake harness): the official client cannot
write a lone surrogate escape or a malformed line, and a harness (JavaScript's
``JSON.stringify``) can. Before, the SDK's reader dropped such a line and the caller waited
forever.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crosstalk.core.message import valid_unicode, valid_unicode_json
from crosstalk.harness.fake import FAKE_NAME_META, FAKE_SESSION_META
from crosstalk.shim.stdio import vet

CODE_POINTS = st.one_of(st.characters(exclude_categories=()),
                        st.sampled_from(["\ud83d", "\ude00", "\udfff", "\x00"]))
ANSWER_WAIT = 20.0


class RawShim:
    """``crosstalk mcp`` spoken to line by line."""

    def __init__(self, root: Path) -> None:
        env = {**os.environ, "CROSSTALK_HOME": str(root / "state"),
               "CLAUDE_CONFIG_DIR": str(root / "claude"), "HOME": str(root),
               "XDG_RUNTIME_DIR": tempfile.mkdtemp(prefix="ct-rt-", dir="/tmp"),
               "CROSSTALK_HARNESS": "fake", "CROSSTALK_FAKE_INBOX": str(root / "inbox")}
        self.inbox_dir = root / "inbox"
        self.proc = subprocess.Popen([sys.executable, "-m", "crosstalk", "mcp"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self._next_id = 100
        assert self.request("initialize", {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}})["result"]["serverInfo"]
        self.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))

    def write(self, line: str | bytes) -> None:
        raw = line.encode("utf-8", "surrogatepass") if isinstance(line, str) else line
        assert self.proc.stdin is not None
        self.proc.stdin.write(raw + b"\n")
        self.proc.stdin.flush()

    def answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], ANSWER_WAIT)
        assert ready, "no answer came"
        return dict(json.loads(self.proc.stdout.readline()))

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self._next_id += 1
        self.write(json.dumps({"jsonrpc": "2.0", "id": self._next_id, "method": method,
                               "params": params}))
        got = self.answer()
        assert got["id"] == self._next_id, got
        return got

    def call(self, tool: str, args: dict[str, Any], session: str, name: str) -> dict[str, Any]:
        got = self.request("tools/call", {"name": tool, "arguments": args, "_meta": {
            FAKE_SESSION_META: session, FAKE_NAME_META: name}})
        return dict(got["result"]["structuredContent"])

    def inbox(self, session: str) -> list[dict[str, Any]]:
        path = self.inbox_dir / f"{session}.jsonl"
        return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=20)


@pytest.fixture
def raw(tmp_path: Path) -> Iterator[RawShim]:
    shim = RawShim(tmp_path)
    try:
        shim.call("receive_message", {}, "b1", "bob")
        yield shim
    finally:
        shim.close()


def test_a_lone_surrogate_in_tool_arguments_is_repaired_and_delivered(raw: RawShim) -> None:
    # json.dumps writes the lone surrogate as the escape "\ud83d", as JSON.stringify does
    raw.write(json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "send_message", "arguments": {"to": "bob", "text": "half \ud83d an emoji"},
        "_meta": {FAKE_SESSION_META: "a1", FAKE_NAME_META: "alice"}}}))
    got = raw.answer()
    assert got["id"] == 7
    assert got["result"]["structuredContent"]["state"] == "accepted", got
    assert [m["text"] for m in raw.inbox("b1")] == ["half \ufffd an emoji"]


@pytest.mark.parametrize(("line", "code"), [
    ("{not json", -32700),
    ("[" * 5000 + "]" * 5000, -32700),
    ('{"jsonrpc": "2.0", "id": 9, "method": 5}', -32600),
    ("[1, 2]", -32600),
    ('"just a string"', -32600),
])
def test_a_line_that_is_not_a_request_is_answered_and_the_next_one_served(
        raw: RawShim, line: str, code: int) -> None:
    raw.write(line)
    got = raw.answer()
    assert got["error"]["code"] == code, got
    assert got["id"] == (9 if '"id": 9' in line else None)
    assert "Traceback" not in got["error"]["message"]
    sent = raw.call("send_message", {"to": "bob", "text": "still here"}, "a1", "alice")
    assert sent["state"] == "accepted", sent


def test_invalid_utf8_bytes_on_the_wire_are_replaced_not_dropped(raw: RawShim) -> None:
    line = json.dumps({"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": {
        "name": "send_message", "arguments": {"to": "bob", "text": "XX"},
        "_meta": {FAKE_SESSION_META: "a1", FAKE_NAME_META: "alice"}}}).encode()
    raw.write(line.replace(b"XX", b"a\xffb"))
    got = raw.answer()
    assert got["id"] == 8
    assert got["result"]["structuredContent"]["state"] == "accepted", got
    assert [m["text"] for m in raw.inbox("b1")] == ["a\ufffdb"]


@pytest.fixture(scope="module")
def one_shim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RawShim]:
    shim = RawShim(tmp_path_factory.mktemp("wire"))
    try:
        shim.call("receive_message", {}, "b1", "bob")
        yield shim
    finally:
        shim.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts=st.lists(st.lists(CODE_POINTS, min_size=1, max_size=30).map("".join),
                      min_size=1, max_size=4))
def test_any_code_points_in_tool_arguments_are_answered_and_delivered(
        one_shim: RawShim, texts: list[str]) -> None:
    """Arbitrary code points, surrogates and NULs included: each call answered with its own
    id, each message delivered once with its text made valid Unicode."""
    before = len(one_shim.inbox("b1"))
    for text in texts:
        sent = one_shim.call("send_message", {"to": "bob", "text": text}, "a1", "alice")
        assert sent["state"] == "accepted", sent
    got = one_shim.inbox("b1")[before:]
    assert [m["text"] for m in got] == [valid_unicode(t) for t in texts]


@given(value=st.recursive(
    st.lists(CODE_POINTS, max_size=8).map("".join) | st.integers() | st.none(),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.lists(CODE_POINTS, max_size=4).map("".join), inner, max_size=3),
    max_leaves=8))
def test_repaired_json_always_encodes_and_changes_only_surrogates(value: Any) -> None:
    fixed = valid_unicode_json(value)
    json.dumps(fixed, ensure_ascii=False).encode("utf-8")
    assert valid_unicode_json(fixed) == fixed
    if not any(0xD800 <= ord(c) <= 0xDFFF for c in json.dumps(value, ensure_ascii=False)):
        assert fixed == value


@pytest.mark.parametrize("depth", range(900, 1001, 4))
def test_a_deep_line_with_a_lone_surrogate_is_answered_not_raised(depth: int) -> None:
    """json may read a line nested just under its limit that the repair walk, deeper in the
    stack, cannot: the line is still answered (served repaired, or refused), never raised."""
    line = '{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":' + "[" * depth + '"\\ud83d"' \
        + "]" * depth + "}}"
    verdict = vet(line)
    assert verdict is not None
    assert isinstance(verdict, str) or verdict.message.error.code in (-32700, -32600)


def test_a_line_the_sdk_accepts_passes_untouched() -> None:
    line = ('{"jsonrpc":"2.0","id":1,"method":"tools/list",'
            '"params":{"x":"caf\\u00e9 \\ud83d\\ude00"}}')
    assert vet(line) == line
    assert vet("   \n") is None


CLAIM_PROBE = """
import anyio, os, stat
from crosstalk.shim.stdio import claimed_stdin
async def main():
    with claimed_stdin() as wire:
        print("fd0", os.read(0, 100), flush=True)
        print("wire", repr(await wire.__anext__()), flush=True)
    print("after", stat.S_ISFIFO(os.fstat(0).st_mode), flush=True)
anyio.run(main)
"""


def test_while_serving_fd_0_is_the_null_device_and_the_wire_is_read_privately() -> None:
    """What the SDK's own claim did: a child or a stray read of fd 0 sees EOF, not requests."""
    out = subprocess.run([sys.executable, "-c", CLAIM_PROBE], input=b"line one\nrest\n",
                         capture_output=True, timeout=30, check=True).stdout.decode()
    assert out.splitlines() == ["fd0 b''", "wire 'line one\\n'", "after True"]
