"""Text that is not valid Unicode is repaired and delivered on every ingress, never dropped.

A lone surrogate escape (``"\\ud83d"``: a truncated emoji; JavaScript strings carry them) is
legal JSON but not encodable as UTF-8. The rule (``core.message.valid_unicode``): a lone
surrogate becomes U+FFFD, the message is delivered, and its journal record says which fields
were repaired. ``crosstalk send`` refuses bytes that are not UTF-8 with a clear error.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crosstalk.core.ids import new_message_id
from crosstalk.store.registry import Registry
from tests.support.agents import register_agent
from tests.support.dirs import short_dir
from tests.support.uds import Node, acks, auth, exchange, make_node, serving

pytestmark = pytest.mark.anyio

#: Any code point, surrogates included (``st.text`` never yields a surrogate, so texts are
#: joined from single characters).
CODE_POINTS = st.one_of(st.characters(exclude_categories=()),
                        st.sampled_from(["\ud83d", "\ude00", "\udfff", "\x00"]))
LONE = "half an emoji \ud83d and a stray low \ude00 and a NUL \x00"
REPAIRED = "half an emoji \ufffd and a stray low \ufffd and a NUL \x00"


def escaped_line(obj: dict[str, object]) -> bytes:
    """A frame as JSON.stringify writes a lone surrogate: as a ``\\uXXXX`` escape."""
    return json.dumps(obj, ensure_ascii=True, separators=(",", ":")).encode() + b"\n"


def user_frame(content: str, message_id: str | None = None) -> bytes:
    frame: dict[str, object] = {"type": "user", "message": {"role": "user", "content": content}}
    if message_id is not None:
        frame["crosstalk"] = {"message_id": message_id}
    return escaped_line(frame)


@pytest.fixture
def sockdir() -> Iterator[Path]:
    with short_dir() as d:
        yield d


@pytest.fixture
def node(tmp_path: Path, sockdir: Path) -> Node:
    return make_node(tmp_path / "state", sockdir / "cc-socks" / "r.sock")


def submitted(node: Node) -> list[dict[str, object]]:
    return [r for r in node.records() if r.get("state") == "submitted"]


async def test_shape_a_lone_surrogates_are_repaired_acknowledged_and_delivered(
        node: Node) -> None:
    async with serving(node):
        mid = new_message_id()
        raw, _ = await exchange(node.path, auth(node.token()) + user_frame(LONE, mid))
        assert acks(raw) == [{"type": "ack", "message_id": mid, "state": "accepted",
                              "reason": None}]
        assert node.harness.texts() == [REPAIRED]
        [rec] = submitted(node)
        assert rec["text"] == REPAIRED
        assert rec["repaired"] == ["text"]
        assert node.states(mid) == ["submitted", "dispatching", "accepted"]


async def test_shape_b_native_frame_with_a_lone_surrogate_is_delivered(
        node: Node, sockdir: Path) -> None:
    """The high-severity case: a registered peer's native frame used to vanish silently."""
    async with serving(node):
        node.registrations.append(register_agent(Registry(node.home), "me", "me-agent",
                                                 uds_path=sockdir / "me.sock", exact_name=True))
        raw, _ = await exchange(node.path, user_frame(LONE))
        assert raw == b""
        await node.ingress.settle()
        assert node.harness.texts() == [REPAIRED]
        [rec] = submitted(node)
        assert rec["repaired"] == ["text"]
        assert node.states(str(rec["id"])) == ["submitted", "dispatching", "accepted"]


@settings(max_examples=8, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(st.lists(CODE_POINTS, min_size=1, max_size=40).map("".join),
                      min_size=1, max_size=25))
def test_any_code_points_on_the_uds_are_acknowledged_and_journaled(
        tmp_path: Path, texts: list[str]) -> None:
    """Arbitrary code points (surrogates and NULs included): every message is answered; an
    accepted one is journaled and injected as valid Unicode; nothing is dropped."""
    asyncio.run(_send_each(tmp_path, texts))


async def _send_each(tmp_path: Path, texts: list[str]) -> None:
    with short_dir() as sock, tempfile.TemporaryDirectory(dir=tmp_path) as state:
        node = make_node(Path(state), sock / "cc-socks" / "r.sock")
        async with serving(node):
            for text in texts:
                mid = new_message_id()
                raw, _ = await exchange(node.path, auth(node.token()) + user_frame(text, mid))
                [ack] = acks(raw)
                assert ack["message_id"] == mid
                if ack["state"] == "accepted":
                    assert node.states(mid) == ["submitted", "dispatching", "accepted"]
                    node.harness.writes[-1].text.encode("utf-8")
                else:  # a deterministic refusal says why, and is journaled
                    assert ack["state"] == "rejected", ack
                    assert ack["reason"], ack
        node.journal.close()


def run_send(args: list[bytes], stdin: bytes | None,
             tmp_path: Path) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "CROSSTALK_HOME": str(tmp_path / "state")}
    return subprocess.run([sys.executable.encode(), b"-m", b"crosstalk", b"send", *args],
                          input=stdin, capture_output=True, env=env, timeout=60, check=False)


def test_send_refuses_a_message_that_is_not_utf8_in_argv(tmp_path: Path) -> None:
    done = run_send([b"someone", b"caf\xe9"], None, tmp_path)
    assert done.returncode == 2
    assert b"not valid UTF-8" in done.stderr
    assert b"Traceback" not in done.stderr


def test_send_refuses_a_message_that_is_not_utf8_on_stdin(tmp_path: Path) -> None:
    done = run_send([b"someone", b"-"], b"caf\xe9\n", tmp_path)
    assert done.returncode == 2
    assert b"not UTF-8" in done.stderr
    assert b"Traceback" not in done.stderr
