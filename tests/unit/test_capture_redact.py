"""Redaction of captured frames: no token or key survives, however it is dressed."""

from __future__ import annotations

import json
import secrets

from hypothesis import given
from hypothesis import strategies as st

from crosstalk.capture.redact import REDACTED, Redactor, secret_name
from crosstalk.harness.base import Receipt

TOKEN = secrets.token_hex(16)
CRED = secrets.token_hex(32)


def test_fields_named_like_credentials_lose_their_whole_value() -> None:
    r = Redactor()
    frame = {"type": "auth", "token": "abc", "peerToken": {"nested": 1}, "x-api-key": "k",
             "Authorization": "Basic dXNlcjpwdw==", "client_secret": ["s"],
             "password": 7, "credentials": None, "cookie": "c=1", "tokens": 12,
             "text": "keep me"}
    out = r.value(frame)
    assert out == {"type": "auth", "token": REDACTED, "peerToken": REDACTED,
                   "x-api-key": REDACTED, "Authorization": REDACTED,
                   "client_secret": REDACTED, "password": REDACTED, "credentials": REDACTED,
                   "cookie": REDACTED, "tokens": 12, "text": "keep me"}
    assert frame["token"] == "abc"  # the input is left as it was


def test_known_values_go_wherever_they_appear() -> None:
    r = Redactor([TOKEN, CRED, "short"])
    frame = {"text": f"the key is {TOKEN}!", "url": f"http://x/?q={CRED}&a=1",
             "list": [f"{CRED}{TOKEN}"], f"field-{TOKEN}": 1}
    dumped = json.dumps(r.value(frame))
    assert TOKEN not in dumped
    assert CRED not in dumped
    assert "short" not in r.secrets  # a short value would hit ordinary words


def test_tokens_inside_strings_urls_and_embedded_json() -> None:
    r = Redactor()
    cases = {
        "Authorization: Bearer abc.DEF-123_xyz": "Bearer abc.DEF-123_xyz",
        "GET /cb?access_token=s3cr3tvalue&next=1": "s3cr3tvalue",
        'log: {"type":"auth","token":"tok\\"en-value"} done': 'tok\\"en-value',
        "cmd --foo password=hunter2xyz": "hunter2xyz",
        "apiKey=AKIAXXXXXXXX;": "AKIAXXXXXXXX",
        f"bare hex {secrets.token_hex(20)} in text": None,
    }
    for text, secret in cases.items():
        out = r.text(text)
        assert REDACTED in out, text
        if secret is not None:
            assert secret not in out, text
    assert r.text("next=1&page=2") == "next=1&page=2"
    assert r.text("a uuid 0190a3b2-7c4d-7e8f-9a0b-1c2d3e4f5a6b stays") == (
        "a uuid 0190a3b2-7c4d-7e8f-9a0b-1c2d3e4f5a6b stays")


def test_a_frame_of_ndjson_lines_is_one_value_per_line() -> None:
    r = Redactor([TOKEN])
    payload = (json.dumps({"type": "auth", "token": TOKEN}) + "\n\n"
               + json.dumps({"type": "user", "message": {"content": f"hi {TOKEN}"}}) + "\n"
               + "not json " + TOKEN + "\n").encode()
    out = r.frames(payload)
    assert out == [{"type": "auth", "token": REDACTED},
                   {"type": "user", "message": {"content": f"hi {REDACTED}"}},
                   f"not json {REDACTED}"]


def test_http_bodies_are_parsed_and_odd_values_never_fail() -> None:
    r = Redactor()
    body = json.dumps({"params": {"metadata": {"api_token": "v"}}, "id": 1}).encode()
    out = r.value({"body": body, "bad": b"\xff\xfe", "receipt": Receipt("m", "held"),
                   "obj": object(), "deep": _deep(100)})
    assert out["body"] == {"params": {"metadata": {"api_token": REDACTED}}, "id": 1}
    assert isinstance(out["bad"], str)
    assert out["receipt"] == {"message_id": "m", "status": "held", "reason": None,
                              "frame_id": None}
    assert isinstance(out["obj"], str)
    assert REDACTED in json.dumps(out["deep"])


def _deep(n: int) -> object:
    value: object = "leaf"
    for _ in range(n):
        value = [value]
    return value


def test_secret_names() -> None:
    assert all(secret_name(n) for n in ("token", "peerToken", "X-Api-Key", "AUTHORIZATION",
                                         "db_password", "credential", "session-secret"))
    assert not any(secret_name(n) for n in ("tokens", "content", "message_id", "keys",
                                            "threadId", "inputTokens"))


@given(st.text(max_size=40), st.text(max_size=40))
def test_a_known_secret_never_survives_in_any_text(prefix: str, suffix: str) -> None:
    r = Redactor([CRED])
    assert CRED not in r.text(prefix + CRED + suffix)
    assert CRED not in json.dumps(r.value({prefix: [suffix + CRED]}))
