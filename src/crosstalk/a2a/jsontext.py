"""What the A2A endpoint checks in a request body's JSON text before the SDK parses it.

The SDK parses with ``json.loads`` and answers whatever that raises as an internal error
(-32603, which a client must read as "maybe delivered", with Python's own words in the message
and a traceback in the log). Legal JSON makes it raise in two ways: nesting deeper than the
interpreter's recursion limit (about 1000 levels) and an integer of more than 4300 digits
(``sys.get_int_max_str_digits``). And JSON may carry a lone surrogate escape (``"\\ud83d"``,
half an emoji from a JavaScript string), which the SDK's protobuf parse refuses (-32602), where
the rule on every ingress is "repair to U+FFFD and deliver" (:func:`valid_unicode`). So, once
per request, on the bytes the body cap already holds:

- nesting deeper than :data:`MAX_DEPTH` is refused: -32600, reason ``too_deep``;
- an integer longer than :data:`MAX_INTEGER_DIGITS` is refused: -32600, ``number_too_long``;
- a lone surrogate is repaired to U+FFFD and the fields it was in are named (the receiver
  journals them as ``repaired``); in an identifier (``messageId``, ``taskId``, ``contextId``)
  it is refused instead (-32602, ``bad_message_id`` …): two ids that differ only there would
  become one, and the second message would be answered as a retry of the first, never
  delivered.

An ordinary body costs three scans at C speed; the text is parsed here only when one of them
finds something to look at (many brackets, a long run of digits, a surrogate escape).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from a2a.utils.errors import A2AError

from crosstalk.a2a.errors import invalid_params, rejected_error
from crosstalk.core.message import valid_unicode_json

#: Deepest nesting accepted (the body's top-level object is depth 1). Metadata is a protobuf
#: Struct, two message levels per JSON level, and upb will not decode one nested ~45 deep
#: (measured): a task holding deeper metadata could be stored but not read back.
MAX_DEPTH = 32
#: Longest integer accepted, in digits. No A2A field holds more than an int64 (19 digits);
#: Python refuses to convert more than 4300 digits, and the SDK reports that as an internal
#: error.
MAX_INTEGER_DIGITS = 64

_LONG_DIGITS = re.compile(rf"\d{{{MAX_INTEGER_DIGITS + 1},}}")
#: A ``\u`` escape of a surrogate code point (D800-DFFF), possibly half of a valid pair.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_IDS = {"messageId": "bad_message_id", "taskId": "bad_task_id",
        "contextId": "bad_context_id"}
#: Message metadata keys the receiver keeps as fields of their own (``Message``).
_FIELD_KEYS = {"crosstalk.in_reply_to": "in_reply_to", "crosstalk.hop_chain": "hop_chain"}


@dataclass(frozen=True)
class Verdict:
    """The body to hand on (repaired, or as it came), the fields repaired, or the refusal."""

    text: str
    repaired: tuple[str, ...] = ()
    error: A2AError | None = None


class _NumberTooLong(ValueError):
    pass


def inspect(text: str) -> Verdict:
    """Check a request body's JSON text (already known to be UTF-8); see the module doc."""
    deep = text.count("[") + text.count("{") > MAX_DEPTH
    long_digits = _LONG_DIGITS.search(text) is not None
    surrogates = "\\u" in text and _SURROGATE_ESCAPE.search(text) is not None
    if not (deep or long_digits or surrogates):
        return Verdict(text)
    try:
        obj = json.loads(text, parse_int=_bounded_int) if long_digits else json.loads(text)
    except RecursionError:
        return _too_deep()
    except _NumberTooLong:
        return Verdict(text, error=rejected_error(
            "number_too_long", f"integers are limited to {MAX_INTEGER_DIGITS} digits"))
    except ValueError:
        return Verdict(text)  # not JSON: the SDK answers it as the parse error it is
    if deep and _depth_exceeds(obj, MAX_DEPTH):
        return _too_deep()
    if not surrogates:
        return Verdict(text)
    found: list[tuple[Any, ...]] = []
    repaired = valid_unicode_json(obj, (), found)  # the depth is already bounded
    if not found:
        return Verdict(text)  # a valid pair, or an escaped backslash before "ud83d"
    fields: set[str] = set()
    for path in found:
        field = _field_of(path)
        if field in _IDS.values():
            return Verdict(text, error=invalid_params(
                field, f"{path[-1]} holds a lone surrogate (an unpaired \\uD800-\\uDFFF)"))
        fields.add(field)
    return Verdict(json.dumps(repaired, ensure_ascii=False, separators=(",", ":")),
                   repaired=tuple(sorted(fields)))


def _too_deep() -> Verdict:
    return Verdict("", error=rejected_error(
        "too_deep", f"JSON nesting is limited to {MAX_DEPTH} levels"))


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INTEGER_DIGITS:
        raise _NumberTooLong
    return int(digits)


def _depth_exceeds(obj: Any, limit: int) -> bool:
    """Whether ``obj`` nests containers deeper than ``limit`` (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node \
            if isinstance(node, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children
                     if isinstance(child, dict | list))
    return False


def _field_of(path: tuple[Any, ...]) -> str:
    """The field a repaired string belongs to, named as the receiver's record names it."""
    if path[:2] != ("params", "message") or len(path) < 3:
        return ".".join(str(p) for p in path[:2]) or "request"
    key = path[2]
    if key in _IDS and len(path) == 3:
        return _IDS[key]
    if key == "parts":
        return "text"
    if key == "metadata":
        return _FIELD_KEYS.get(path[3], "metadata") if len(path) > 3 else "metadata"
    return str(key)
