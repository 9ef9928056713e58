"""The JSONC text editor behind opencode's install: it reads what opencode's parser reads, and
an inserted member removed again gives back the original bytes, comments and layout included.

Documents are generated with hypothesis as (value, text) pairs: JSON values written with
random whitespace, ``//`` and ``/* */`` comments and optional trailing commas.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crosstalk.harness.opencode import jsonc

GAPS = ["", " ", "  ", "\n", "\n  ", "\n\t\t", "\r\n    ", " // note\n", "/* c */",
        "\n  /* a\n  block */ ", " // \u00e9t\u00e9 \u2603\n  "]
gap = st.sampled_from(GAPS)
keys = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=8)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                    st.floats(allow_nan=False, allow_infinity=False, width=32),
                    st.text(max_size=10))


@st.composite
def _scalar(draw: st.DrawFn) -> tuple[Any, str]:
    value = draw(scalars)
    return value, json.dumps(value, ensure_ascii=draw(st.booleans()))


def _container(children: st.SearchStrategy[tuple[Any, str]]
               ) -> st.SearchStrategy[tuple[Any, str]]:
    @st.composite
    def obj(draw: st.DrawFn) -> tuple[Any, str]:
        items = draw(st.dictionaries(keys, children, max_size=4))
        parts = [f"{draw(gap)}{json.dumps(k, ensure_ascii=draw(st.booleans()))}{draw(gap)}:"
                 f"{draw(gap)}{text}{draw(gap)}" for k, (_, text) in items.items()]
        comma = "," if parts and draw(st.booleans()) else ""
        body = ",".join(parts) + comma + (draw(gap) if comma or not parts else "")
        return {k: v for k, (v, _) in items.items()}, "{" + body + "}"

    @st.composite
    def array(draw: st.DrawFn) -> tuple[Any, str]:
        items = draw(st.lists(children, max_size=4))
        parts = [f"{draw(gap)}{text}{draw(gap)}" for _, text in items]
        comma = "," if parts and draw(st.booleans()) else ""
        return [v for v, _ in items], "[" + ",".join(parts) + comma + draw(gap) + "]"

    return st.one_of(obj(), array())


documents = st.recursive(_scalar(), _container, max_leaves=12)


@st.composite
def objects(draw: st.DrawFn) -> tuple[dict[str, Any], str]:
    """A top-level object document, with comments or whitespace around it."""
    value, text = draw(_container(documents).filter(lambda d: isinstance(d[0], dict)))
    return value, draw(gap) + text + draw(gap)


@settings(max_examples=300)
@given(documents)
def test_parse_reads_the_value_jsonc_denotes(doc: tuple[Any, str]) -> None:
    value, text = doc
    assert jsonc.parse(text).value == value


@settings(max_examples=200)
@given(st.recursive(scalars, lambda c: st.one_of(st.lists(c, max_size=3),
                                                  st.dictionaries(keys, c, max_size=3)),
                    max_leaves=10), st.sampled_from([None, 1, 4, "\t"]))
def test_plain_json_parses_as_json_does(value: Any, indent: int | str | None) -> None:
    text = json.dumps(value, indent=indent)
    assert jsonc.parse(text).value == json.loads(text)


@settings(max_examples=300)
@given(objects(), keys, documents)
def test_insert_then_remove_gives_back_the_same_bytes(doc: tuple[dict[str, Any], str],
                                                      key: str, new: tuple[Any, str]) -> None:
    value, text = doc
    if key in value:
        return
    root = jsonc.parse(text)
    assert isinstance(root, jsonc.Obj)
    added = jsonc.insert_member(text, root, key, new[0], jsonc.indent_unit(text, root))
    after = jsonc.parse(added)
    assert after.value == {**value, key: new[0]}
    assert list(after.value) == [*value, key]  # appended, order kept
    assert isinstance(after, jsonc.Obj)
    assert jsonc.remove_member(added, after, key) == text


@settings(max_examples=200)
@given(objects(), keys)
def test_removing_a_member_keeps_the_others(doc: tuple[dict[str, Any], str], key: str) -> None:
    value, text = doc
    root = jsonc.parse(text)
    assert isinstance(root, jsonc.Obj)
    for name in value:
        rest = jsonc.remove_member(text, root, name)
        assert jsonc.parse(rest).value == {k: v for k, v in value.items() if k != name}
    if key not in value:
        assert jsonc.remove_member(text, root, key) == text


def test_a_new_member_copies_the_layout_around_it() -> None:
    text = '{\n    // mine\n    "a": 1\n}\n'
    root = jsonc.parse(text)
    assert isinstance(root, jsonc.Obj)
    added = jsonc.insert_member(text, root, "b", {"c": [1]}, jsonc.indent_unit(text, root))
    assert added == ('{\n    // mine\n    "a": 1,\n    "b": {\n        "c": [\n'
                     '            1\n        ]\n    }\n}\n')
    inline = '{"a": 1}'
    root = jsonc.parse(inline)
    assert isinstance(root, jsonc.Obj)
    assert jsonc.insert_member(inline, root, "b", {"c": 2}, "  ") == '{"a": 1,"b": {"c": 2}}'


def test_a_trailing_comma_stays_trailing() -> None:
    text = '{\n  "a": 1,\n}'
    root = jsonc.parse(text)
    assert isinstance(root, jsonc.Obj)
    assert jsonc.insert_member(text, root, "b", 2, "  ") == '{\n  "a": 1,\n  "b": 2,\n}'


@pytest.mark.parametrize(("text", "where"), [
    ("", "ended"), ("{", "key"), ('{"a" 1}', ":"), ('{"a": 1 "b": 2}', ", or }"),
    ("[1 2]", ", or ]"), ("{} x", "after"), ("/* open", "unterminated"),
    ('{"a": tru}', "value"), ("{'a': 1}", "key"), ('"\\x"', "malformed"),
    ('{"a": "\x01"}', "malformed"), ("01", "after"), ('{"a": 1,,}', "key"),
])
def test_bad_text_is_an_error_that_says_where(text: str, where: str) -> None:
    with pytest.raises(jsonc.JsoncError, match="line 1, column") as info:
        jsonc.parse(text)
    assert where in str(info.value)


def test_the_error_names_the_line() -> None:
    with pytest.raises(jsonc.JsoncError, match="line 3, column 8"):
        jsonc.parse('{\n  "a": 1,\n  "b": ]\n}')


def test_a_key_given_twice_cannot_be_edited() -> None:
    root = jsonc.parse('{"mcp": 1, "mcp": 2}')
    assert isinstance(root, jsonc.Obj)
    with pytest.raises(jsonc.JsoncError, match="appears 2 times"):
        root.get("mcp")
