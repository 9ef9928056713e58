"""Hypothesis against the A2A endpoint: whatever arrives, the server keeps serving.

Malformed JSON, wrong JSON-RPC shapes, random method names and param types, random
``crosstalk.*`` metadata, oversize bodies, bad or missing tokens and versions. For every
example: the answer is a well-formed JSON-RPC response (or a 401 for auth), the server still
answers a normal request, and nothing the server reported as accepted is missing from the
journal. In-process ASGI for speed, plus one smoke run over a real socket.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crosstalk.core.admission import Limits
from crosstalk.core.ids import new_message_id
from crosstalk.core.states import MessageState
from crosstalk.store.journal import Journal
from crosstalk.store.registry import Registry
from tests.support.a2a import Agent, Node, make_node, registered_agent
from tests.support.waiting import eventually

METHODS = ["SendMessage", "SendStreamingMessage", "GetTask", "ListTasks", "CancelTask",
           "SubscribeToTask", "GetExtendedAgentCard", "CreateTaskPushNotificationConfig",
           "GetTaskPushNotificationConfig", "ListTaskPushNotificationConfigs",
           "DeleteTaskPushNotificationConfig", "message/send", "tasks/get"]
CAP = 4096  # a small body cap keeps oversize examples cheap; the logic is the same
#: Examples leave asks open; admission limits are exercised elsewhere (test_a2a.py).
FUZZ_LIMITS = Limits(max_body_bytes=CAP, max_pending_tasks=100_000, max_open_asks=100_000)

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)),
    max_leaves=12)

crosstalk_meta = st.fixed_dictionaries({}, optional={
    "crosstalk.kind": st.one_of(st.sampled_from(["inform", "ask", "command", "control", ""]),
                                json_values),
    "crosstalk.delivery": st.one_of(st.sampled_from(["immediate", "next_turn"]), json_values),
    "crosstalk.deadline_seconds": st.one_of(st.integers(-5, 10**12), json_values),
    "crosstalk.hop_chain": st.one_of(
        st.lists(st.from_regex(r"[0-9a-f]{24}", fullmatch=True), max_size=40), json_values),
    "crosstalk.in_reply_to": st.one_of(st.text(max_size=200), json_values),
    "other.key": json_values,
})


@st.composite
def send_params(draw: st.DrawFn) -> dict[str, Any]:
    # Mostly well-formed, so that many examples are accepted and some are subtly wrong.
    mostly = draw(st.integers(0, 3)) > 0
    fresh_id = st.builds(new_message_id)
    text_parts = st.lists(st.fixed_dictionaries({"text": st.text(max_size=50)}), min_size=1,
                          max_size=3)
    message: dict[str, Any] = {
        "messageId": draw(fresh_id if mostly else st.one_of(
            fresh_id, st.text(max_size=140), json_values)),
        "role": "ROLE_USER" if mostly else draw(st.sampled_from(
            ["ROLE_USER", "ROLE_AGENT", "ROLE_UNSPECIFIED", 7])),
        "parts": draw(text_parts if mostly else st.one_of(
            text_parts,
            st.lists(st.fixed_dictionaries({"data": json_values}), max_size=2),
            st.lists(st.fixed_dictionaries({"url": st.text(max_size=20)}), max_size=2),
            json_values)),
    }
    meta = draw(crosstalk_meta)
    if meta:
        message["metadata"] = meta
    if draw(st.integers(0, 5)) == 0:
        message["taskId"] = draw(st.text(max_size=40))
    if draw(st.integers(0, 3)) == 0:
        message["contextId"] = draw(st.one_of(st.text(max_size=140), json_values))
    params: dict[str, Any] = {"message": message}
    if draw(st.booleans()):
        params["configuration"] = {"returnImmediately": draw(st.booleans()),
                                   "historyLength": draw(st.integers(-3, 5))}
    if draw(st.integers(0, 7)) == 0:
        params = draw(json_values)  # wrong param types altogether
    return params


@st.composite
def rpc_bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["send", "send", "send", "rpc", "json", "text", "bytes",
                                 "oversize"]))
    if kind == "send":
        obj: Any = {"jsonrpc": "2.0", "id": draw(st.one_of(st.integers(), st.text(max_size=8))),
                    "method": "SendMessage", "params": draw(send_params())}
        return json.dumps(obj).encode()
    if kind == "rpc":
        obj = {"jsonrpc": draw(st.sampled_from(["2.0", "1.0", 2])),
               "id": draw(st.one_of(st.integers(), st.text(max_size=8), st.none(),
                                    st.booleans(), st.lists(st.integers(), max_size=2))),
               "method": draw(st.one_of(st.sampled_from(METHODS), st.text(max_size=30))),
               "params": draw(st.one_of(json_values, send_params()))}
        for key in draw(st.sets(st.sampled_from(["jsonrpc", "id", "method", "params"]),
                                max_size=2)):
            obj.pop(key, None)
        return json.dumps(obj).encode()
    if kind == "json":
        return json.dumps(draw(json_values)).encode()
    if kind == "text":
        return draw(st.text(max_size=200)).encode()
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    return b'{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"pad":"' + (
        b"x" * (CAP + draw(st.integers(1, 3 * CAP)))) + b'"}}'


@dataclass
class Env:
    node: Node
    good: Agent
    other: Agent
    http: httpx.AsyncClient
    probe_task: str = ""
    reported: set[str] = field(default_factory=set)


def _auth_choice(env: Env, choice: str) -> dict[str, str]:
    return {
        "good": {"Authorization": f"Bearer {env.good.token}"},
        "other": {"Authorization": f"Bearer {env.other.token}"},
        "missing": {},
        "garbage": {"Authorization": "Bearer 0123456789abcdef"},
        "scheme": {"Authorization": f"Token {env.good.token}"},
        "receiver": {"Authorization": f"Bearer {env.node.agent.token}"},
    }[choice]


AUTH_OK = {"good", "other", "receiver"}


def _check_jsonrpc(resp: httpx.Response, auth: str) -> dict[str, Any]:
    if auth not in AUTH_OK:
        assert resp.status_code == 401
    else:
        assert resp.status_code == 200, resp.text[:300]
    body = resp.json()
    assert isinstance(body, dict)
    assert body.get("jsonrpc") == "2.0"
    assert ("result" in body) != ("error" in body), body
    assert "id" in body
    if "error" in body:
        err = body["error"]
        assert isinstance(err["code"], int)
        assert isinstance(err["message"], str)
    return body


async def _setup(tmp: Path, registry: Registry, bob: Agent, alice: Agent,
                 carol: Agent, *, limits: Limits = FUZZ_LIMITS) -> Env:
    node = make_node(registry, bob, tmp / "bob.jsonl", limits=limits,
                     max_wait_seconds=0.05)
    await node.lane.start()
    app = node.server.build_app(base_url="http://bob.test")
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://bob.test")
    env = Env(node, alice, carol, http)
    body = await _post(env, "good", _send_body("probe"))
    env.probe_task = body["result"]["task"]["id"]
    return env


def _send_body(text: str, **meta: Any) -> bytes:
    message: dict[str, Any] = {"messageId": new_message_id(), "role": "ROLE_USER",
                               "parts": [{"text": text}]}
    if meta:
        message["metadata"] = meta
    return json.dumps({"jsonrpc": "2.0", "id": "n", "method": "SendMessage",
                       "params": {"message": message}}).encode()


async def _post(env: Env, auth: str, body: bytes, version: str | None = "1.0") -> dict[str, Any]:
    headers = {"Content-Type": "application/json", **_auth_choice(env, auth)}
    if version is not None:
        headers["A2A-Version"] = version
    resp = await env.http.post("/", content=body, headers=headers)
    parsed = _check_jsonrpc(resp, auth)
    task = (parsed.get("result") or {}).get("task") if isinstance(
        parsed.get("result"), dict) else None
    if isinstance(task, dict):
        state = (task.get("metadata") or {}).get("crosstalk.state")
        mid = (task.get("metadata") or {}).get("crosstalk.message_id")
        if state in ("submitted", "dispatching", "accepted", "queued") and isinstance(mid, str):
            env.reported.add(mid)
    return parsed


async def _still_serving(env: Env, full: bool) -> None:
    got = await _post(env, "good", json.dumps({
        "jsonrpc": "2.0", "id": 1, "method": "GetTask",
        "params": {"id": env.probe_task}}).encode())
    assert got["result"]["status"]["state"] == "TASK_STATE_COMPLETED"
    if full:
        sent = await _post(env, "good", _send_body("are you still there?"))
        assert sent["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"


def _assert_nothing_lost(env: Env) -> None:
    records = Journal(env.node.journal_path).replay().records
    journaled = {r["id"] for r in records
                 if r.get("subject") == "message" and r.get("state") == "submitted"}
    assert env.reported, "the fuzz run never got a message accepted"
    print("REPORTED", len(env.reported), "JOURNALED", len(journaled))
    assert env.reported <= journaled


@pytest.fixture
def parties(tmp_path: Path) -> Iterator[tuple[Registry, Agent, Agent, Agent]]:
    registry = Registry(tmp_path / "state")
    bob, alice, carol = (registered_agent(registry, n) for n in ("bob", "alice", "carol"))
    yield registry, bob, alice, carol
    for a in (bob, alice, carol):
        a.registration.close()


def test_fuzz_endpoint_survives_anything(
        tmp_path: Path, parties: tuple[Registry, Agent, Agent, Agent]) -> None:
    registry, bob, alice, carol = parties
    with asyncio.Runner() as runner:
        env = runner.run(_setup(tmp_path, registry, bob, alice, carol))
        counter = [0]

        @settings(max_examples=250, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(body=rpc_bodies(), auth=st.sampled_from(
                   ["good", "good", "good", "other", "receiver", "missing", "garbage",
                    "scheme"]),
               version=st.sampled_from(["1.0"] * 6 + ["0.3", None, "banana", "1.0.7"]))
        def one(body: bytes, auth: str, version: str | None) -> None:
            counter[0] += 1
            runner.run(_post(env, auth, body, version))
            runner.run(_still_serving(env, full=counter[0] % 25 == 0))

        one()
        runner.run(_still_serving(env, full=True))
        _assert_nothing_lost(env)
        runner.run(env.http.aclose())
        runner.run(env.node.stop())
    env.node.journal.close()


def test_fuzz_crosstalk_metadata_never_injects_a_malformed_kind(
        tmp_path: Path, parties: tuple[Registry, Agent, Agent, Agent]) -> None:
    """Random ``crosstalk.*`` values: either a clean JSON-RPC error and no injection, or an
    accepted message whose decoded fields are exactly the allowed ones."""
    registry, bob, alice, carol = parties
    with asyncio.Runner() as runner:
        env = runner.run(_setup(tmp_path, registry, bob, alice, carol))
        fake = env.node.fake

        @settings(max_examples=120, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.too_slow])
        @given(meta=crosstalk_meta, immediate=st.booleans())
        def one(meta: dict[str, Any], immediate: bool) -> None:
            writes = len(fake.writes)
            body = json.loads(_send_body("fuzzed metadata", **meta))
            body["params"]["configuration"] = {"returnImmediately": immediate}
            parsed = runner.run(_post(env, "good", json.dumps(body).encode()))
            mid = body["params"]["message"]["messageId"]
            runner.run(eventually(lambda: (e := env.node.receiver.entries.get(mid)) is None
                                  or e.state not in (MessageState.SUBMITTED,
                                                     MessageState.DISPATCHING),
                                  what="the lane settled the message"))
            if "error" in parsed:
                assert len(fake.writes) == writes  # refused: nothing reached the session
                return
            task = parsed["result"]["task"]
            if len(fake.writes) > writes:
                msg = fake.writes[-1].delivery.message
                assert msg.kind.value in ("inform", "ask", "command")
                # an explicit null is the same as an absent key
                assert msg.kind.value == (meta.get("crosstalk.kind") or "inform")
                assert msg.delivery.value == (meta.get("crosstalk.delivery") or "immediate")
            else:
                assert task["status"]["state"] in ("TASK_STATE_REJECTED", "TASK_STATE_SUBMITTED")

        one()
        runner.run(_still_serving(env, full=True))
        _assert_nothing_lost(env)
        runner.run(env.http.aclose())
        runner.run(env.node.stop())
    env.node.journal.close()


def test_fuzz_smoke_over_a_real_socket(
        tmp_path: Path, parties: tuple[Registry, Agent, Agent, Agent]) -> None:
    registry, bob, alice, carol = parties
    with asyncio.Runner() as runner:
        node = make_node(registry, bob, tmp_path / "bob.jsonl", limits=FUZZ_LIMITS,
                         max_wait_seconds=0.05)
        url = runner.run(node.start())
        env = Env(node, alice, carol, httpx.AsyncClient(base_url=url, timeout=30))
        env.probe_task = runner.run(_post(env, "good", _send_body("probe")))[
            "result"]["task"]["id"]
        host, port = url.removeprefix("http://").split(":")
        for raw in (b"GARBAGE\r\n\r\n",
                    b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nab",
                    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"):
            runner.run(_raw_exchange(host, int(port), raw))  # answered or closed, not fatal
            runner.run(_still_serving(env, full=False))

        @settings(max_examples=30, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(body=rpc_bodies(), auth=st.sampled_from(sorted([*AUTH_OK, "missing"])))
        def one(body: bytes, auth: str) -> None:
            runner.run(_post(env, auth, body))
            runner.run(_still_serving(env, full=False))

        one()
        runner.run(_still_serving(env, full=True))
        _assert_nothing_lost(env)
        runner.run(env.http.aclose())
        runner.run(node.stop())
    node.journal.close()


async def _raw_exchange(host: str, port: int, raw: bytes) -> bytes:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(raw)
        await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


# -- bad JSON: answered as the invalid request it is, one log line (issue 12, item 7) -----------

#: What a JSON-RPC error's message must never carry: Python's own words.
INTERNALS = ("recursion", "set_int_max_str_digits", "Traceback", "Error:", "sys.", "line ")


def _rpc(method: str, params: bytes | str) -> bytes:
    raw = params.encode() if isinstance(params, str) else params
    return b'{"jsonrpc":"2.0","id":7,"method":"' + method.encode() + b'","params":' + raw + b"}"


def _send_with_text(text_json: str, *, message_id: str | None = None,
                    metadata: str | None = None) -> bytes:
    """A SendMessage body whose text part is the given JSON text (escapes kept as written)."""
    mid = json.dumps(message_id or new_message_id())
    meta = f',"metadata":{metadata}' if metadata is not None else ""
    return _rpc("SendMessage", '{"message":{"messageId":' + mid + ',"role":"ROLE_USER",'
                '"parts":[{"text":' + text_json + "}]" + meta + "}}")


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


BAD_JSON = {
    "nested 1500 deep in params": _rpc("SendMessage", _nested(1500)),
    "nested 100k deep at the top": _nested(100_000).encode(),
    "nested 1500 deep in metadata": _send_with_text('"hi"', metadata='{"k":' + _nested(1500)
                                                     + "}"),
    "5000-digit id": b'{"jsonrpc":"2.0","id":' + b"1" * 5000 + b',"method":"GetTask",'
                     b'"params":{"id":"x"}}',
    "5000-digit param": _rpc("GetTask", '{"id":"x","historyLength":' + "9" * 5000 + "}"),
    "5000-digit negative in metadata": _send_with_text('"hi"', metadata='{"n":-' + "7" * 5000
                                                        + "}"),
}


@pytest.fixture
def real_node(tmp_path: Path, parties: tuple[Registry, Agent, Agent, Agent]) -> Iterator[
        tuple[Node, Agent]]:
    registry, bob, alice, _ = parties
    node = make_node(registry, bob, tmp_path / "bob.jsonl")
    yield node, alice
    node.journal.close()


async def _post_raw(url: str, token: str, body: bytes) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=30) as http:
        resp = await http.post(url + "/", content=body, headers={
            "Authorization": f"Bearer {token}", "Content-Type": "application/json",
            "A2A-Version": "1.0"})
    assert resp.status_code == 200, resp.text[:300]
    parsed: dict[str, Any] = resp.json()
    return parsed


def _one_line_each(records: list[logging.LogRecord], requests: int) -> None:
    """Each malformed request leaves one log line, and none carries a traceback."""
    mine = [r for r in records if r.name.startswith(("a2a", "crosstalk", "uvicorn"))]
    assert [r for r in mine if r.exc_info] == [], [r.getMessage()[:200] for r in mine]
    assert len(mine) == requests, [r.getMessage()[:200] for r in mine]


@pytest.mark.parametrize("case", sorted(BAD_JSON))
def test_bad_json_is_an_invalid_request_not_an_internal_error(
        real_node: tuple[Node, Agent], case: str, caplog: pytest.LogCaptureFixture) -> None:
    node, alice = real_node

    async def run() -> dict[str, Any]:
        url = await node.start()
        try:
            caplog.clear()
            with caplog.at_level(logging.INFO):
                answer = await _post_raw(url, alice.token, BAD_JSON[case])
                records = list(caplog.records)
            probe = await _post_raw(url, alice.token, _send_with_text('"still there?"'))
            assert probe["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
        finally:
            await node.stop()
        _one_line_each(records, 1)
        return answer

    answer = asyncio.run(run())
    error = answer["error"]
    assert error["code"] == -32600, error  # a request we refuse, never "internal" (-32603)
    assert not any(word in error["message"] for word in INTERNALS), error
    [info] = error["data"]
    assert info["metadata"]["reason"] in ("too_deep", "number_too_long"), error
    assert info["metadata"]["crosstalk.state"] == "rejected"
    assert node.fake.writes == [] or node.fake.texts() == ["still there?"]


def test_nesting_up_to_the_limit_and_long_floats_are_accepted(
        real_node: tuple[Node, Agent]) -> None:
    """The checks refuse only what the SDK could not take: metadata nested to the limit and
    a number with many digits after the point (a float, which Python parses fine) pass."""
    node, alice = real_node
    deep = '{"k":' * 28 + "1" + "}" * 28  # + params, message, metadata = 31 levels

    async def run() -> list[dict[str, Any]]:
        url = await node.start()
        try:
            return [await _post_raw(url, alice.token, _send_with_text('"deep"', metadata=deep)),
                    await _post_raw(url, alice.token, _send_with_text(
                        '"float"', metadata='{"f":0.' + "3" * 5000 + "}"))]
        finally:
            await node.stop()

    for answer in asyncio.run(run()):
        assert answer["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED", answer
    assert node.fake.texts() == ["deep", "float"]


def test_malformed_params_log_one_line_without_a_traceback(
        real_node: tuple[Node, Agent], caplog: pytest.LogCaptureFixture) -> None:
    node, alice = real_node
    bodies = [_rpc("SendMessage", '{"message":{"messageId":"m","role":"ROLE_USER",'
                   '"parts":"not a list"}}'),
              _rpc("SendMessage", '{"message":7}'),
              b'{"jsonrpc":"2.0","id":1,"method":"GetTask","params":[1,2]}',
              b'[{"jsonrpc":"2.0"}, 1]',
              b'"just a string"',
              b'{"jsonrpc":',
              ]

    async def run() -> list[dict[str, Any]]:
        url = await node.start()
        try:
            with caplog.at_level(logging.INFO):
                return [await _post_raw(url, alice.token, body) for body in bodies]
        finally:
            await node.stop()

    caplog.clear()
    answers = asyncio.run(run())
    codes = [a["error"]["code"] for a in answers]
    assert codes == [-32602, -32602, -32602, -32600, -32600, -32700], answers
    records = [r for r in caplog.records if r.name.startswith("a2a")]
    _one_line_each(records, len(bodies))


def test_a_lone_surrogate_escape_is_repaired_and_delivered(
        real_node: tuple[Node, Agent]) -> None:
    """``"\\ud83d"`` (half an emoji, as JavaScript writes it) reaches the session as U+FFFD
    and the receiver journals the repair; a valid pair stays the character it encodes."""
    node, alice = real_node

    async def run() -> dict[str, Any]:
        url = await node.start()
        try:
            return await _post_raw(url, alice.token, _send_with_text(
                r'"half \ud83d, stray \ude00, whole \ud83d\ude00, literal \\ud83d"'))
        finally:
            await node.stop()

    answer = asyncio.run(run())
    task = answer["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED", answer
    assert node.fake.texts() == ["half \ufffd, stray \ufffd, whole \U0001f600, literal \\ud83d"]
    [record] = [r for r in node.records()
                if r.get("subject") == "message" and r.get("state") == "submitted"]
    assert record["repaired"] == ["text"]


def test_a_lone_surrogate_in_a_message_id_is_refused_not_merged(
        real_node: tuple[Node, Agent]) -> None:
    """Repairing an id could make two different ids one (and the second message a "retry" of
    the first): an id with a lone surrogate is an invalid parameter, and nothing is journaled."""
    node, alice = real_node

    async def run() -> dict[str, Any]:
        url = await node.start()
        try:
            body = _send_with_text('"hi"', message_id="placeholder").replace(
                b'"placeholder"', b'"id-\\ud83d"')
            return await _post_raw(url, alice.token, body)
        finally:
            await node.stop()

    answer = asyncio.run(run())
    assert answer["error"]["code"] == -32602, answer
    assert answer["error"]["data"][0]["metadata"]["reason"] == "bad_message_id", answer
    assert node.fake.writes == []
    assert [r for r in node.records() if r.get("subject") == "message"] == []


def test_fuzz_depth_digits_and_surrogates_never_read_as_internal(
        tmp_path: Path, parties: tuple[Registry, Agent, Agent, Agent]) -> None:
    """Any nesting, any integer length, any surrogate escape: a definite answer, never -32603
    (which a client must read as "maybe delivered"), and never Python's words."""
    registry, bob, alice, carol = parties
    with asyncio.Runner() as runner:
        env = runner.run(_setup(tmp_path, registry, bob, alice, carol, limits=Limits(
            max_body_bytes=64 * 1024, max_pending_tasks=100_000, max_open_asks=100_000)))

        @settings(max_examples=60, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.too_slow])
        @given(depth=st.integers(0, 3000), digits=st.integers(1, 6000),
               where=st.sampled_from(["params", "metadata", "id", "text"]),
               surrogate=st.sampled_from(["", "\\ud800", "\\udfff", "\\ud83d\\ude00"]))
        def one(depth: int, digits: int, where: str, surrogate: str) -> None:
            number = "4" * digits
            nest = "[" * depth + number + "]" * depth
            body = {
                "params": _rpc("SendMessage", nest),
                "metadata": _send_with_text('"m' + surrogate + '"',
                                            metadata='{"x":' + nest + "}"),
                "id": b'{"jsonrpc":"2.0","id":' + number.encode() + b',"method":"GetTask",'
                      b'"params":{"id":"' + surrogate.encode() + b'"}}',
                "text": _send_with_text('"t' + surrogate + '"'),
            }[where]
            answer = runner.run(_post(env, "good", body))
            if "error" in answer:
                assert answer["error"]["code"] != -32603, answer
                assert not any(w in answer["error"]["message"] for w in INTERNALS), answer
            runner.run(_still_serving(env, full=False))

        one()
        runner.run(_still_serving(env, full=True))
        runner.run(env.http.aclose())
        runner.run(env.node.stop())
    env.node.journal.close()
