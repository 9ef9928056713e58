"""The watch's filter line: ``agent:NAME harness:H state:S kind:K`` terms and free words.

A person types it into the filter input (``/``); ``crosstalk watch --agent/--harness/--state``
start the app with the same terms. The rule: terms with the same key are alternatives (any may
match), different keys and every free word must all match; matching is case-insensitive, and
a word matches as a substring of what the row shows (text, names, ids, kind, states), so a
person can search for what they see. An unknown ``key:value`` is a free word, so a message
that says "re: the build" is still searchable as typed.

Pure: no terminal, no files (unit-tested in tests/unit/test_watch_filters.py).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from crosstalk.watch.model import MessageView, SessionView

KEYS = ("agent", "harness", "state", "kind")

#: The harness of an agent id (``None`` when the board does not know it).
HarnessOf = Callable[[str | None], str | None]


@dataclass(frozen=True)
class Filter:
    agents: tuple[str, ...] = ()
    harnesses: tuple[str, ...] = ()
    states: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()
    words: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.agents or self.harnesses or self.states or self.kinds or self.words)

    def matches_session(self, session: SessionView) -> bool:
        """Sessions are narrowed by ``agent:`` and ``harness:`` only: a message filter should
        not hide who is on the machine."""
        if self.agents and not _any_in(self.agents, (session.name, session.key)):
            return False
        return not self.harnesses or _any_equal(self.harnesses, (session.harness,))

    def matches_message(self, message: MessageView, harness_of: HarnessOf) -> bool:
        sides = (message.to_name, message.to_agent, message.sender_label, message.sender_agent)
        if self.agents and not _any_in(self.agents, sides):
            return False
        if self.harnesses and not _any_equal(
                self.harnesses, (harness_of(message.to_agent), harness_of(message.sender_agent))):
            return False
        if self.states and not _any_equal(self.states, _states_of(message)):
            return False
        if self.kinds and not _any_equal(self.kinds, (message.kind,)):
            return False
        if not self.words:
            return True
        seen = _searchable(message)
        return all(word in seen for word in self.words)


def parse(line: str) -> Filter:
    """The filter a person typed. Quotes group words (``"build is green"``); a line with an
    unbalanced quote is split on spaces instead, so typing never raises."""
    try:
        tokens = shlex.split(line)
    except ValueError:
        tokens = line.split()
    terms: dict[str, list[str]] = {key: [] for key in KEYS}
    words: list[str] = []
    for token in tokens:
        key, sep, value = token.partition(":")
        if sep and key.lower() in terms and value:
            terms[key.lower()].append(value.casefold())
        elif token:
            words.append(token.casefold())
    return Filter(agents=tuple(terms["agent"]), harnesses=tuple(terms["harness"]),
                  states=tuple(terms["state"]), kinds=tuple(terms["kind"]), words=tuple(words))


def from_options(*, agent: Iterable[str] | str | None = None,
                 harness: Iterable[str] | str | None = None,
                 state: Iterable[str] | str | None = None) -> str:
    """The filter line for command-line options, so the input shows what is applied."""
    out: list[str] = []
    for key, values in (("agent", agent), ("harness", harness), ("state", state)):
        listed = [values] if isinstance(values, str) else list(values or ())
        out += [f"{key}:{shlex.quote(v)}" for v in listed if v]
    return " ".join(out)


def _states_of(message: MessageView) -> tuple[str | None, ...]:
    """Every state a person may mean by ``state:``: the message's current state, its ask's
    (open/answered/expired) and its receipt's first word (held, delivered, dropped...)."""
    receipt = message.receipt.split(":", 1)[0] if message.receipt else None
    return (message.state, message.ask_state, receipt)


def _searchable(message: MessageView) -> str:
    parts = (message.text, message.reply_text, message.message_id, message.to_agent,
             message.to_name, message.sender_label, message.sender_agent, message.kind,
             message.state, message.reason, message.ask_state, message.receipt,
             message.in_reply_to, message.ingress)
    return "\n".join(p for p in parts if p).casefold()


def _any_equal(wanted: tuple[str, ...], values: Iterable[str | None]) -> bool:
    have = {v.casefold() for v in values if v}
    return any(w in have for w in wanted)


def _any_in(wanted: tuple[str, ...], values: Iterable[str | None]) -> bool:
    """An agent term names an agent: its whole name, or a prefix of its id (ids are long)."""
    have = [v.casefold() for v in values if v]
    return any(v == w or (len(w) >= 4 and v.startswith(w)) for w in wanted for v in have)
