"""Edit a JSONC document (JSON with comments and trailing commas) as text, not as data.

opencode reads its config files as JSONC (``opencode.json`` too), and users keep comments and
their own layout in them. Loading, changing and dumping would lose both, so install and
uninstall change only the bytes of the one member they add or remove: :func:`parse` records
where every value and member lies in the text, and the edits splice text at those places.

The edits are inverse by construction: :func:`insert_member` adds one contiguous chunk, and
:func:`remove_member` deletes exactly the chunk an insertion at that place adds, so removing a
member right after inserting it gives back the original bytes (the hypothesis tests check this
on generated documents with comments, trailing commas and odd spacing). A new member copies
the layout around it: on its own line with its siblings' indentation in a multi-line object,
inline in a one-line object.

The grammar is the one of opencode's parser (Microsoft's ``jsonc-parser`` with trailing commas
allowed): JSON, plus ``//`` and ``/* */`` comments and a trailing comma in objects and arrays.
Anything else is a :class:`JsoncError` (a ``ValueError``) naming the line and column.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

_WS = " \t\r\n\ufeff"
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_STRING = re.compile(r'"(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*"')
_LITERALS = {"true": True, "false": False, "null": None}


class JsoncError(ValueError):
    """The text is not JSONC (or not the shape an edit needs)."""


@dataclass
class Node:
    """A value: ``text[start:end]`` is its source; ``value`` the Python value it denotes."""

    start: int
    end: int
    value: Any


@dataclass
class Member:
    key: str
    #: Where the key's string starts.
    start: int
    value: Node
    #: Where the comma after the value is (``None``: none, it is the last member).
    comma: int | None = None


@dataclass
class Obj(Node):
    members: list[Member] = field(default_factory=list)

    def get(self, key: str) -> Member | None:
        """The member named ``key``; a key given twice is an error (which one would count?)."""
        found = [m for m in self.members if m.key == key]
        if len(found) > 1:
            raise JsoncError(f"the key {key!r} appears {len(found)} times in one object")
        return found[0] if found else None


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def error(self, what: str, pos: int | None = None) -> JsoncError:
        at = self.pos if pos is None else pos
        line = self.text.count("\n", 0, at) + 1
        column = at - (self.text.rfind("\n", 0, at) + 1) + 1
        return JsoncError(f"{what} at line {line}, column {column}")

    def skip(self) -> None:
        """Whitespace and comments."""
        text, n = self.text, len(self.text)
        while self.pos < n:
            c = text[self.pos]
            if c in _WS:
                self.pos += 1
            elif text.startswith("//", self.pos):
                end = text.find("\n", self.pos)
                self.pos = n if end < 0 else end + 1
            elif text.startswith("/*", self.pos):
                end = text.find("*/", self.pos + 2)
                if end < 0:
                    raise self.error("an unterminated /* comment")
                self.pos = end + 2
            else:
                return

    def peek(self) -> str:
        self.skip()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def value(self) -> Node:
        c = self.peek()
        start = self.pos
        if c == "{":
            return self.obj()
        if c == "[":
            return self.array()
        if c == '"':
            return Node(start, *self.string())
        m = _NUMBER.match(self.text, self.pos)
        if m and m.end() > start:
            self.pos = m.end()
            return Node(start, self.pos, json.loads(m.group(0)))
        for word, literal in _LITERALS.items():
            if self.text.startswith(word, self.pos):
                self.pos += len(word)
                return Node(start, self.pos, literal)
        raise self.error("a value was expected" if c else "the text ended where a value was "
                         "expected")

    def string(self) -> tuple[int, str]:
        m = _STRING.match(self.text, self.pos)
        if m is None:
            raise self.error("a malformed string")
        self.pos = m.end()
        try:
            value: str = json.loads(m.group(0))
        except ValueError as exc:  # a lone surrogate escape, say
            raise self.error(f"a malformed string ({exc})") from None
        return self.pos, value

    def obj(self) -> Obj:
        node = Obj(self.pos, -1, None)
        self.pos += 1
        values: dict[str, Any] = {}
        while True:
            c = self.peek()
            if c == "}":
                break
            if c != '"':
                raise self.error("a key (a string) or } was expected")
            key_start = self.pos
            _, key = self.string()
            if self.peek() != ":":
                raise self.error("a : was expected")
            self.pos += 1
            member = Member(key, key_start, self.value())
            node.members.append(member)
            values[key] = member.value.value
            if self.peek() == ",":
                member.comma = self.pos
                self.pos += 1
            elif self.peek() != "}":
                raise self.error("a , or } was expected")
        self.pos += 1
        node.end, node.value = self.pos, values
        return node

    def array(self) -> Node:
        start = self.pos
        self.pos += 1
        items: list[Any] = []
        while self.peek() != "]":
            items.append(self.value().value)
            if self.peek() == ",":
                self.pos += 1
            elif self.peek() != "]":
                raise self.error("a , or ] was expected")
        self.pos += 1
        return Node(start, self.pos, items)


def parse(text: str) -> Node:
    """The document's one value, with positions (:class:`JsoncError` if it is not JSONC)."""
    parser = _Parser(text)
    root = parser.value()
    if parser.peek():
        raise parser.error("text after the document's value")
    return root


# -- layout ------------------------------------------------------------------------------------


def _line_indent(text: str, pos: int) -> str:
    """The whitespace that starts the line holding ``pos``."""
    start = text.rfind("\n", 0, pos) + 1
    m = re.match(r"[ \t]*", text[start:pos])
    return m.group(0) if m else ""


def _own_line(text: str, pos: int) -> bool:
    """Whether only whitespace precedes ``pos`` on its line."""
    start = text.rfind("\n", 0, pos) + 1
    return start > 0 and text[start:pos].strip(" \t") == ""


def indent_unit(text: str, root: Node) -> str:
    """The document's indentation step: that of its first member on a line of its own."""
    if isinstance(root, Obj):
        for member in root.members:
            if _own_line(text, member.start):
                return _line_indent(text, member.start) or "  "
    return "  "


def render(value: Any, indent: str | None, unit: str, newline: str = "\n") -> str:
    """``value`` as JSON: multi-line continuing at ``indent`` (``None``: on one line)."""
    if indent is None:
        return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    return json.dumps(value, ensure_ascii=False, indent=unit).replace("\n", newline + indent)


def newline_of(text: str) -> str:
    """The document's line break (a CRLF file stays CRLF)."""
    return "\r\n" if "\r\n" in text else "\n"


def member_indent(text: str, obj: Obj, unit: str) -> tuple[str | None, str]:
    """How a new member of ``obj`` is laid out: (its indentation, ``None`` when the members
    share one line; the text that goes before it)."""
    if obj.members:
        first = obj.members[0]
        if _own_line(text, first.start):
            indent = _line_indent(text, first.start)
            return indent, newline_of(text) + indent
        gap = text[obj.start + 1:first.start]
        return None, " " if gap.startswith(" ") else ""
    # An empty object gets one inline member after a space: a layout of ours it could not
    # have had (so uninstall can tell an `"mcp"` that install created whole from one the user
    # had, empty).
    return None, " "


# -- edits (text in, text out) --------------------------------------------------------------


def insert_member(text: str, obj: Obj, key: str, value: Any, unit: str) -> str:
    """``text`` with ``"key": value`` added as the last member of ``obj``.

    After the last member's value (with a comma before ours), or, if that member has a
    trailing comma, after that comma (with one after ours too), or right after ``{`` in an
    empty object: one chunk, which :func:`remove_member` takes out again."""
    indent, sep = member_indent(text, obj, unit)
    rendered = render(value, indent, unit, newline_of(text))
    member = f"{json.dumps(key, ensure_ascii=False)}: {rendered}"
    if not obj.members:
        at, chunk = obj.start + 1, sep + member
    elif obj.members[-1].comma is not None:
        at, chunk = _after(obj.members[-1]), sep + member + ","
    else:
        at, chunk = obj.members[-1].value.end, "," + sep + member
    return text[:at] + chunk + text[at:]


def remove_member(text: str, obj: Obj, key: str) -> str:
    """``text`` without the member ``key`` of ``obj`` (the inverse of :func:`insert_member`):

    * followed by a comma: from the end of what precedes it (the previous comma, or ``{``)
      through its own comma;
    * the last member, without a trailing comma: from the previous member's comma (``{`` if
      it is the only one) through its value.
    """
    member = obj.get(key)
    if member is None:
        return text
    index = obj.members.index(member)
    previous = obj.members[index - 1] if index else None
    if member.comma is not None:
        start = obj.start + 1 if previous is None else _after(previous)
        return text[:start] + text[member.comma + 1:]
    if previous is None:
        return text[:obj.start + 1] + text[member.value.end:]
    assert previous.comma is not None  # a member follows it
    return text[:previous.comma] + text[member.value.end:]


def _after(member: Member) -> int:
    assert member.comma is not None
    return member.comma + 1


def replace_value(text: str, node: Node, value: Any, indent: str | None, unit: str) -> str:
    """``text`` with ``node``'s source replaced by ``value`` (continuing at ``indent``;
    ``None``: on one line)."""
    return text[:node.start] + render(value, indent, unit, newline_of(text)) + text[node.end:]
