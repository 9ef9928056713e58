"""Fuzzing the uds ingress over a real socket: whatever a client sends, the server survives,
answers with one well-formed ack or nothing, and loses no message it acknowledged.

The server runs on its own loop thread; hypothesis drives blocking clients from the test
thread. This process is registered as an agent, so auth-less frames from it reach the receiver
(shape b) and the whole decoding path is exercised, not just the door.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crosstalk.core.ids import new_message_id
from crosstalk.ingress.claude_wire import BadFrame, parse_line, user_frame
from tests.support.agents import register_agent
from tests.support.dirs import short_dir
from tests.support.uds import LoopThread, Node, auth, make_node, user

TOKEN_MARK = "<<the-real-token>>"
MAX_LINE = 4096
STATES = {"accepted", "queued", "rejected", "unreachable", "unknown", "error"}


@dataclass
class Fuzzed:
    node: Node
    loop: LoopThread
    token: str
    #: message ids the server acknowledged as accepted, with how we learned it
    accepted: dict[str, str] = field(default_factory=dict)
    #: message ids rejected by the receiver's policy (journaled)
    rejected: set[str] = field(default_factory=set)


@pytest.fixture
def fuzzed(tmp_path: Path) -> Iterator[Fuzzed]:
    with short_dir() as sockdir:
        node = make_node(tmp_path / "state", sockdir / "r.sock", idle_timeout=1.0,
                         first_line_timeout=1.0, max_line=MAX_LINE, close_grace=0.5)
        node.registrations.append(register_agent(node.registry, "fuzz-sender", "fuzz-sender",
                                                 uds_path=sockdir / "s.sock", exact_name=True))
        loop = LoopThread()
        try:
            loop.run(node.start())
            yield Fuzzed(node, loop, node.token())
        finally:
            with contextlib.suppress(Exception):
                loop.run(node.stop())
            # Nothing of the server may outlive stop().
            leftover = loop.pending_tasks()
            loop.close()
            for r in node.registrations:
                r.close()
            node.journal.close()
            assert leftover == []


def talk(path: Path, chunks: list[bytes], *, pause: float, half_close: bool,
         timeout: float = 10.0) -> bytes:
    """A blocking client that may dribble its bytes; resets and broken pipes are closes."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    got = b""
    try:
        sock.connect(os.fspath(path))
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            for chunk in chunks:
                sock.sendall(chunk)
                if pause:
                    time.sleep(pause)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
            while data := sock.recv(65536):
                got += data
    finally:
        sock.close()
    return got


# -- strategies --------------------------------------------------------------------------------

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                    st.text(max_size=20))
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=8)
attr_values = st.text(st.characters(blacklist_characters='"\n', codec="utf-8"), max_size=20)
kinds = st.sampled_from(["inform", "ask", "command", "control", "INFORM", ""])


@st.composite
def envelopes(draw: st.DrawFn, depth: int = 0) -> str:
    names = draw(st.lists(st.sampled_from(
        ["from", "from-session", "hop-chain", "from-name", "from-mode", "from-plugin", "kind",
         "message-id"]), max_size=4, unique=True))
    attrs = "".join(f' {n}="{draw(attr_values)}"' for n in names)
    body = draw(st.text(max_size=60))
    if depth < 2 and draw(st.booleans()):
        body = f"{body}\n{draw(envelopes(depth + 1))}"
    if draw(st.booleans()):
        body = f"[crosstalk message-id={new_message_id()} kind={draw(kinds)}]\n{body}"
    return f"<cross-session-message{attrs}>\n{body}\n</cross-session-message>"


contents = st.one_of(st.text(min_size=1, max_size=120), envelopes(), st.just(""), json_values)
metadata = st.one_of(
    json_values,
    st.fixed_dictionaries({}, optional={
        "message_id": st.one_of(st.uuids().map(str), st.text(max_size=12), json_values),
        "kind": st.one_of(kinds, json_values)}))
user_frames = st.fixed_dictionaries(
    {"type": st.just("user"),
     "message": st.one_of(st.fixed_dictionaries({"role": st.just("user"), "content": contents}),
                          json_values)},
    optional={"crosstalk": metadata, "kind": st.one_of(kinds, json_values),
              "msg_id": json_values, "from": st.text(max_size=30), "priority": kinds,
              "session_id": json_values, "msgV": json_values})
auth_frames = st.fixed_dictionaries(
    {"type": st.just("auth"),
     "token": st.one_of(st.just(TOKEN_MARK), st.text(max_size=40), json_values)})
control_frames = st.fixed_dictionaries(
    {"type": st.just("control"), "action": st.text(max_size=20)},
    optional={"status": st.text(max_size=10)})
objects = st.one_of(user_frames, auth_frames, control_frames,
                    st.dictionaries(st.text(max_size=8), json_values, max_size=4))


@st.composite
def json_lines(draw: st.DrawFn) -> bytes:
    text = json.dumps(draw(objects), ensure_ascii=draw(st.booleans()))
    end = draw(st.sampled_from(["\n", "\n", "\r\n", "", "\n\n"]))
    return (text + end).encode()


@st.composite
def broken_lines(draw: st.DrawFn) -> bytes:
    whole = draw(json_lines())
    return whole[: draw(st.integers(0, max(0, len(whole) - 1)))] + b"\n"


huge_lines = st.integers(MAX_LINE - 60, MAX_LINE * 3).map(
    lambda n: b'{"type":"user","message":{"content":"' + b"x" * n + b'"}}\n')
#: A well-formed shape (a) message (random text, maybe a random kind): the fuzz must also get
#: through the door, or "nothing accepted is lost" would hold vacuously.
good_messages = st.builds(
    lambda text, mid, kind: (auth(TOKEN_MARK) + user(text, message_id=mid, kind=kind)),
    st.text(min_size=1, max_size=80), st.one_of(st.none(), st.uuids().map(str)),
    st.one_of(st.none(), kinds))
lines = st.one_of(json_lines(), json_lines(), broken_lines(), st.binary(max_size=200),
                  huge_lines, st.just(b"\n"), good_messages)


@dataclass(frozen=True)
class Connection:
    payload: bytes
    cuts: tuple[int, ...]
    pause: float
    half_close: bool

    def chunks(self, payload: bytes) -> list[bytes]:
        out, pos = [], 0
        for cut in self.cuts:
            if pos >= len(payload):
                break
            out.append(payload[pos:pos + cut])
            pos += cut
        out.append(payload[pos:])
        return [c for c in out if c]


connections = st.builds(
    Connection,
    payload=st.lists(lines, max_size=4).map(b"".join),
    cuts=st.lists(st.integers(1, 40), max_size=6).map(tuple),
    pause=st.sampled_from([0.0, 0.0, 0.0, 0.001, 0.004]),
    half_close=st.sampled_from([True] * 19 + [False]),
)


# -- the properties ----------------------------------------------------------------------------


def check_reply(f: Fuzzed, payload: bytes, reply: bytes) -> None:
    """Nothing, or exactly one well-formed ack line (only ever to an authenticated shape)."""
    if not reply:
        return
    assert b'"auth"' in payload, f"bytes written back to an auth-less connection: {reply!r}"
    assert reply.endswith(b"\n"), reply
    assert reply.count(b"\n") == 1, reply
    ack = json.loads(reply)
    assert set(ack) == {"type", "message_id", "state", "reason"}
    assert ack["type"] == "ack"
    assert ack["state"] in STATES
    if ack["state"] == "accepted":
        assert isinstance(ack["message_id"], str)
        f.accepted[ack["message_id"]] = "fuzz"
    if ack["state"] == "rejected" and ack["reason"] == "uds_inform_only":
        f.rejected.add(ack["message_id"])


def still_serving(f: Fuzzed) -> None:
    mid = new_message_id()
    reply = talk(f.node.path, [auth(f.token) + user("canary", message_id=mid)], pause=0,
                 half_close=True)
    ack = json.loads(reply)
    assert ack == {"type": "ack", "message_id": mid, "state": "accepted", "reason": None}
    f.accepted[mid] = "canary"


def check_journal(f: Fuzzed) -> None:
    """Replaying the journal finds every acknowledged acceptance, and nothing else injected."""
    records = f.node.records()
    final: dict[str, str] = {}
    submitted: set[str] = set()
    for rec in records:
        if rec.get("subject") == "message":
            final[rec["id"]] = rec["state"]
            if rec["state"] == "submitted":
                submitted.add(rec["id"])
    for mid in f.accepted:
        assert final.get(mid) == "accepted", (mid, final.get(mid))
        assert mid in submitted
    for mid in f.rejected:
        assert final.get(mid) == "rejected"
    injected = {w.delivery.message.message_id for w in f.node.harness.writes}
    assert len(injected) == len(f.node.harness.writes)  # nothing injected twice
    assert injected == {m for m, s in final.items() if s == "accepted"}
    assert set(f.accepted) <= injected


def test_fuzz_the_ingress_over_a_real_socket(fuzzed: Fuzzed) -> None:
    f = fuzzed

    @settings(max_examples=400, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(conn=connections)
    def one(conn: Connection) -> None:
        payload = conn.payload.replace(TOKEN_MARK.encode(), f.token.encode())
        reply = talk(f.node.path, conn.chunks(payload), pause=conn.pause,
                     half_close=conn.half_close)
        check_reply(f, payload, reply)
        still_serving(f)

    one()
    check_journal(f)
    assert sum(1 for how in f.accepted.values() if how == "fuzz") > 0, "fuzz never got in"


def test_many_concurrent_clients_lose_nothing(fuzzed: Fuzzed) -> None:
    """Interleaved good, bad and slow connections at once: every ack is backed by the journal."""
    import threading

    f = fuzzed
    results: list[tuple[bytes, bytes]] = []
    lock = threading.Lock()

    def client(i: int) -> None:
        mid = new_message_id()
        good = auth(f.token) + user(f"message {i}", message_id=mid)
        variants = [good, good[: len(good) // 2], b"\xff" * 50 + b"\n" + good,
                    auth("bad") + user("x"), user(f"native {i}")]
        payload = variants[i % len(variants)]
        chunks = [payload[j:j + 7] for j in range(0, len(payload), 7)]
        reply = talk(f.node.path, chunks, pause=0.001 if i % 3 == 0 else 0, half_close=True)
        with lock:
            results.append((payload, reply))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(results) == 40
    for payload, reply in results:
        check_reply(f, payload, reply)
    assert sum(1 for how in f.accepted.values() if how == "fuzz") == 8  # the "good" variants
    still_serving(f)
    check_journal(f)
    # the 8 auth-less "native" frames came from a registered pid: verified and injected too
    natives = [w for w in f.node.harness.writes if w.delivery.message.native]
    assert len(natives) == 8


# -- the decoder on its own (no socket, many more examples) -----------------------------------


@settings(max_examples=600, deadline=None)
@given(text=st.one_of(st.text(max_size=300), json_lines().map(lambda b: b.decode())))
def test_parse_line_raises_only_bad_frame(text: str) -> None:
    try:
        obj = parse_line(text)
    except BadFrame:
        return
    assert isinstance(obj, dict)


@settings(max_examples=600, deadline=None)
@given(obj=objects)
def test_user_frame_raises_only_bad_frame_and_never_trusts_claims(obj: dict[str, Any]) -> None:
    try:
        frame = user_frame(obj)
    except BadFrame:
        return
    assert isinstance(frame.text, str)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in frame.asserted.items())
    content = obj["message"]["content"]
    if frame.kind is not None and frame.kind.value == "inform":
        # inform is only ever the answer when nothing asked for another known kind
        meta = obj.get("crosstalk") or {}
        assert meta.get("kind") in (None, "inform")
        assert obj.get("kind") in (None, "inform")
    assert frame.text == content or content.endswith("</cross-session-message>")
