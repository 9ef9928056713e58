"""What outside A2A clients tripped over (issue 13 §3), over raw HTTP to a real listener.

Raw HTTP because the wire forms are the point: the A2A TCK and ``@a2a-js/sdk`` send what the
Python SDK's client never would (``"status": "UNRECOGNIZED"``, no ``A2A-Version``), and read
what it hides (the JSON-RPC body of a 401, the card's caching headers).
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from crosstalk.core.ids import new_message_id
from crosstalk.core.states import AskState
from tests.support.a2a import Agent, Node, agents, bob, registry
from tests.support.waiting import eventually

pytestmark = pytest.mark.anyio
__all__ = ["agents", "bob", "registry"]  # fixtures

CARD = "/.well-known/agent-card.json"
V1 = {"A2A-Version": "1.0"}


def _rpc(method: str, params: dict[str, Any], rid: Any = "r-1") -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}


def _send(text: str, **meta: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"messageId": new_message_id(), "role": "ROLE_USER",
                               "parts": [{"text": text}]}
    if meta:
        message["metadata"] = meta
    return {"message": message, "configuration": {"returnImmediately": True}}


async def _post(http: httpx.AsyncClient, url: str, token: str | None, body: Any,
                headers: dict[str, str] | None = None) -> httpx.Response:
    auth = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return await http.post(url, json=body, headers={**V1, **auth, **(headers or {})})


# -- A2A-Version (spec 1.0 §3.6.2) ----------------------------------------------------------


async def test_a_request_without_a2a_version_is_refused_as_version_not_supported(
        bob: Node, agents: dict[str, Agent]) -> None:
    token = agents["alice"].token
    async with httpx.AsyncClient() as http:
        bare = await http.post(bob.url, json=_rpc("SendMessage", _send("no header"), 5),
                               headers={"Authorization": f"Bearer {token}"})
        old = await _post(http, bob.url, token, _rpc("ListTasks", {}, 6),
                          {"A2A-Version": "0.3"})
        ok = await _post(http, bob.url, token, _rpc("ListTasks", {}, 7))
    for resp, rid in ((bare, 5), (old, 6)):
        assert resp.status_code == 200
        body = resp.json()
        assert body["id"] == rid
        assert body["error"]["code"] == -32009, body  # VersionNotSupportedError
    assert "result" in ok.json()
    assert bob.fake.writes == []  # the refused SendMessage reached nobody


# -- ListTasks' status filter --------------------------------------------------------------


@pytest.fixture
async def two_tasks(bob: Node, agents: dict[str, Agent]) -> dict[str, str]:
    """One COMPLETED task (an inform) and one WORKING task (an open ask), both alice's."""
    token = agents["alice"].token
    async with httpx.AsyncClient() as http:
        inform = (await _post(http, bob.url, token, _rpc("SendMessage", _send("fyi")))).json()
        ask_body = _send("which test is flaky?", **{"crosstalk.kind": "ask"})
        ask_id = ask_body["message"]["messageId"]
        ask = (await _post(http, bob.url, token, _rpc("SendMessage", ask_body))).json()
    await eventually(lambda: (e := bob.receiver.entries.get(ask_id)) is not None
                     and e.ask is AskState.OPEN, what="the ask reached the session")
    return {"completed": inform["result"]["task"]["id"], "working": ask["result"]["task"]["id"]}


async def _listed(bob: Node, token: str, params: dict[str, Any]) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        resp = await _post(http, bob.url, token, _rpc("ListTasks", params, "list-1"))
    assert resp.status_code == 200
    body: dict[str, Any] = resp.json()
    assert body["id"] == "list-1"
    return body


@pytest.mark.parametrize("params", [
    {}, {"status": None}, {"status": "TASK_STATE_UNSPECIFIED"}, {"status": 0},
    # what @a2a-js/sdk 1.x sends for "no filter": its ts-proto ListTasksRequest.toJSON writes
    # taskStateToJSON(undefined) = "UNRECOGNIZED"; -1 is that enum member's number.
    {"status": "UNRECOGNIZED"}, {"status": -1},
], ids=["absent", "null", "unspecified", "zero", "unrecognized", "minus-one"])
async def test_list_tasks_without_a_real_status_filter_lists_everything(
        bob: Node, agents: dict[str, Agent], two_tasks: dict[str, str],
        params: dict[str, Any]) -> None:
    body = await _listed(bob, agents["alice"].token, params)
    assert "error" not in body, body
    assert {t["id"] for t in body["result"]["tasks"]} == set(two_tasks.values())


@pytest.mark.parametrize(("status", "which"), [
    ("TASK_STATE_COMPLETED", "completed"), (3, "completed"), ("TASK_STATE_WORKING", "working"),
    (2, "working"),
])
async def test_list_tasks_filters_by_a_known_status(
        bob: Node, agents: dict[str, Agent], two_tasks: dict[str, str], status: Any,
        which: str) -> None:
    body = await _listed(bob, agents["alice"].token, {"status": status})
    assert [t["id"] for t in body["result"]["tasks"]] == [two_tasks[which]]


@pytest.mark.parametrize("status", [
    "TASK_STATE_BOGUS", "completed", "working", "", "3", 9, 99, -2, 2**40, True, 3.5, [], {},
])
async def test_list_tasks_with_an_invalid_status_is_invalid_params(
        bob: Node, agents: dict[str, Agent], two_tasks: dict[str, str], status: Any) -> None:
    body = await _listed(bob, agents["alice"].token, {"status": status})
    assert "result" not in body, body
    assert body["error"]["code"] == -32602, body


# -- the Agent Card's caching headers (spec §8.6.1) ---------------------------------------


async def test_the_agent_card_carries_cache_control_max_age_next_to_its_etag(bob: Node) -> None:
    async with httpx.AsyncClient() as http:
        first = await http.get(bob.url + CARD)
        again = await http.get(bob.url + CARD, headers={"If-None-Match": first.headers["etag"]})
        head = await http.head(bob.url + CARD)
    assert first.status_code == 200
    assert again.status_code == 304
    assert head.status_code == 200
    for resp in (first, again, head):
        assert resp.headers["etag"] == first.headers["etag"]
        found = re.search(r"(?:^|[,\s])max-age=(\d+)(?:$|[,\s])", resp.headers["cache-control"])
        assert found is not None, resp.headers["cache-control"]
        assert 0 < int(found.group(1)) <= 60  # small: the card follows renames
    assert again.content == b""


# -- a missing or wrong bearer token -------------------------------------------------------


async def test_a_refused_token_answers_401_with_the_request_id_and_an_auth_code(
        bob: Node, agents: dict[str, Agent]) -> None:
    wrong = agents["bob"].token + "x"  # close to a real token: it must never come back
    cases: list[tuple[str | None, Any]] = [(None, "req-7"), (wrong, 42), (wrong, None)]
    async with httpx.AsyncClient() as http:
        answers = [(await _post(http, bob.url, token, _rpc("ListTasks", {}, rid)), rid)
                   for token, rid in cases]
        echoed = await _post(http, bob.url, wrong, _rpc("ListTasks", {}, wrong))
        not_json = await http.post(bob.url, content=b"{not json",
                                   headers={**V1, "Authorization": f"Bearer {wrong}"})
        basic = await http.post(bob.url, json=_rpc("GetTask", {"id": "t"}, "b-1"),
                                headers={**V1, "Authorization": "Basic eDp5"})
        deep = await http.post(bob.url, content=b'{"id": "deep", "x": ' + b"[" * 50_000
                               + b"]" * 50_000 + b"}", headers={**V1, "Authorization": "Bearer n"})
        big = await http.post(bob.url, content=b'{"id": "huge", "x": "' + b"y" * 4_000_000
                              + b'"}', headers={"Authorization": "Bearer nope"})
    for resp, rid in [*answers, (not_json, None), (basic, "b-1"), (deep, None), (big, None)]:
        assert resp.status_code == 401, resp.text
        assert resp.headers["www-authenticate"].startswith("Bearer")
        body = resp.json()
        assert body["jsonrpc"] == "2.0"
        assert body["id"] == rid, body
        error = body["error"]
        assert error["code"] == -32000, error  # not -32600 (a malformed request)
        [info] = error["data"]
        assert info["reason"] == "UNAUTHENTICATED"
        assert info["metadata"]["reason"] == "unauthorized"
        assert wrong not in resp.text
    # an id that carries the presented token is not echoed
    assert echoed.status_code == 401
    assert echoed.json()["id"] is None
    assert wrong not in echoed.text
    assert bob.fake.writes == []
