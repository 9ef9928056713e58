"""``crosstalk.a2a.jsontext.inspect`` on its own: what it refuses, what it repairs, and that an
ordinary body passes through untouched."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from crosstalk.a2a.jsontext import MAX_DEPTH, MAX_INTEGER_DIGITS, inspect
from crosstalk.core.message import valid_unicode

LONE = ["\ud800", "\udbff", "\udc00", "\udfff", "\ud83d"]
text = st.lists(st.one_of(st.characters(), st.sampled_from(LONE)), max_size=8).map("".join)
values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30), text,
              st.floats(allow_nan=False)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(text, inner, max_size=3)), max_leaves=10)


def repaired(obj: Any) -> Any:
    if isinstance(obj, str):
        return valid_unicode(obj)
    if isinstance(obj, list):
        return [repaired(v) for v in obj]
    if isinstance(obj, dict):
        return {valid_unicode(k): repaired(v) for k, v in obj.items()}
    return obj


def body(message: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
            "params": {"message": {"role": "ROLE_USER", "parts": [{"text": "x"}],
                                   "metadata": {"k": message}}}}


@settings(max_examples=300, deadline=None)
@given(value=values, ascii_only=st.booleans())
def test_what_passes_parses_to_the_same_value_with_surrogates_repaired(
        value: Any, ascii_only: bool) -> None:
    raw = json.dumps(body(value), ensure_ascii=ascii_only)
    if not ascii_only:
        raw = json.dumps(body(repaired(value)), ensure_ascii=False)  # UTF-8 cannot carry one
    verdict = inspect(raw)
    assert verdict.error is None, verdict.error
    assert json.loads(verdict.text) == repaired(json.loads(raw))
    if verdict.text == raw:
        assert verdict.repaired == ()
    else:
        assert verdict.repaired == ("metadata",)


def test_an_ordinary_body_is_handed_on_as_it_came() -> None:
    raw = json.dumps(body({"crosstalk.kind": "ask", "n": 12, "s": "caf\u00e9 \U0001f600"}))
    verdict = inspect(raw)
    assert verdict == type(verdict)(raw)


def test_nesting_beyond_the_limit_is_refused_and_at_the_limit_passes() -> None:
    def nested(levels: int) -> str:
        return "[" * levels + "]" * levels
    assert inspect(nested(MAX_DEPTH)).error is None
    refused = inspect(nested(MAX_DEPTH + 1)).error
    assert refused is not None
    assert refused.data is not None
    assert refused.data["reason"] == "too_deep"
    assert inspect(nested(200_000)).error is not None  # past the interpreter's recursion limit
    brackets_in_strings = json.dumps(["[" * 5000])  # many brackets, none of them structure
    assert inspect(brackets_in_strings).error is None


def test_integers_beyond_the_limit_are_refused_and_digits_in_strings_are_not() -> None:
    assert inspect("[" + "9" * MAX_INTEGER_DIGITS + "]").error is None
    assert inspect("[-" + "9" * MAX_INTEGER_DIGITS + "]").error is None
    for raw in ("[" + "9" * (MAX_INTEGER_DIGITS + 1) + "]", '{"id":' + "1" * 5000 + "}"):
        refused = inspect(raw).error
        assert refused is not None
        assert refused.data is not None
        assert refused.data["reason"] == "number_too_long"
    assert inspect(json.dumps({"text": "1" * 5000})).error is None
    assert inspect("[0." + "3" * 5000 + "]").error is None  # a float: Python parses it


def test_repairs_name_the_message_fields_and_refuse_identifiers() -> None:
    def send(**message: Any) -> str:
        return json.dumps({"params": {"message": message}}, ensure_ascii=True)
    got = inspect(send(parts=[{"text": "a\ud83d"}], metadata={
        "crosstalk.in_reply_to": "r\udc00", "other": "\udfff"}))
    assert got.error is None
    assert got.repaired == ("in_reply_to", "metadata", "text")
    assert "\ufffd" in json.loads(got.text)["params"]["message"]["parts"][0]["text"]
    for field, reason in (("messageId", "bad_message_id"), ("taskId", "bad_task_id"),
                          ("contextId", "bad_context_id")):
        refused = inspect(send(**{field: "id\ud800"})).error
        assert refused is not None
        assert refused.data is not None
        assert refused.data["reason"] == reason
    # an escaped backslash before "ud83d" is text, not an escape: nothing to repair
    literal = json.dumps({"params": {"message": {"parts": [{"text": "\\ud83d"}]}}})
    assert inspect(literal).text == literal
