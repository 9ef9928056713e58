"""Taking every token and key out of a captured frame before it leaves the agent.

A capture is made to be shared (pasted into an issue after a harness upgrade broke
something), so what it prints must carry no credential, whoever reads it. Four rules, applied
together because each catches what the others miss:

1. **By field name.** Any object field whose name, lowercased and without ``-``/``_``, ends
   in ``token``, ``key``, ``secret``, ``authorization``, ``credential(s)``, ``password``,
   ``passwd`` or ``cookie`` has its whole value replaced (``peerToken``, ``x-api-key``, the
   uds ``auth`` frame's ``token``, an HTTP ``Authorization`` header).
2. **By known value.** The agent's own secrets (its uds key, its A2A bearer credential) and
   any the caller adds are replaced wherever they appear, inside any string: a body that
   quotes a token, a URL that carries one.
3. **By shape, in text.** ``Bearer <x>`` (8 characters or more), ``token=<x>`` style query
   or form parameters and ``"token": "<x>"`` inside JSON that is itself a string (an A2A
   body, a Claude frame in a log line) lose their values.
4. **Long hex runs.** A run of 32 or more hex digits is how CrossTalk's and Claude's tokens
   look (``secrets.token_hex``); it is replaced even when nothing names it. A git object id
   in a message is redacted too: over-redacting a diagnostic costs less than leaking a key.

Redaction never fails: a value it does not understand is turned into text and redacted as
text.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

REDACTED: Final = "[redacted]"
_SECRET_SUFFIXES: Final = ("token", "key", "secret", "authorization", "credential",
                           "credentials", "password", "passwd", "cookie")
#: A field or parameter name that holds a credential, as a pattern (rule 3; rule 1 in text).
_NAMES: Final = "[a-z0-9_-]*(?:token|key|secret|authorization|credentials?|passwd|password|cookie)"
#: ``"api_key": "…"`` inside text (JSON embedded in a string, a logged frame).
_JSON_FIELD: Final = re.compile(rf'("(?i:{_NAMES})"\s*:\s*)"(?:[^"\\]|\\.)*"')
#: ``token=…`` in a query string, a form body or a command line.
_PARAM: Final = re.compile(rf"(?i)\b({_NAMES})=([^&\s\"'<>]+)")
_BEARER: Final = re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]{8,}")
_HEX_MIN: Final = 32
_HEX_RUN: Final = re.compile(rf"(?<![0-9A-Fa-f])[0-9A-Fa-f]{{{_HEX_MIN},}}(?![0-9A-Fa-f])")
#: Shorter known values are not replaced by value: they would hit ordinary words.
MIN_SECRET_LEN: Final = 8
_MAX_DEPTH: Final = 64


def secret_name(name: str) -> bool:
    """Whether a field called ``name`` holds a credential (rule 1)."""
    squashed = name.lower().replace("-", "").replace("_", "")
    return squashed.endswith(_SECRET_SUFFIXES)


class Redactor:
    """Redacts frames with the four rules; ``secrets`` are the known values (rule 2)."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        known = {s for s in secrets if isinstance(s, str) and len(s) >= MIN_SECRET_LEN}
        # Longest first, so a secret that contains another is replaced whole.
        self.secrets = sorted(known, key=len, reverse=True)

    def text(self, text: str) -> str:
        if len(text) < MIN_SECRET_LEN:
            return text  # too short to hold anything a rule looks for
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        # Each rule runs only where its pattern could match: most strings in a frame are
        # short words, and a capture's cost is the agent's loop's.
        if '"' in text and ":" in text:
            text = _JSON_FIELD.sub(rf'\1"{REDACTED}"', text)
        if "=" in text:
            text = _PARAM.sub(rf"\1={REDACTED}", text)
        if " " in text:
            text = _BEARER.sub(rf"\1 {REDACTED}", text)
        return _HEX_RUN.sub(REDACTED, text) if len(text) >= _HEX_MIN else text

    def value(self, value: Any, depth: int = 0) -> Any:
        """A JSON-like value with every secret replaced (a new value; the input is kept)."""
        if isinstance(value, str):
            return self.text(value)
        if value is None or isinstance(value, bool | int | float):
            return value
        if depth > _MAX_DEPTH:
            return REDACTED  # deeper than any frame we make: not worth the risk
        if isinstance(value, Mapping):
            return {self.text(str(k)): REDACTED if secret_name(str(k))
                    else self.value(v, depth + 1) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.value(v, depth + 1) for v in value]
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return self.value(dataclasses.asdict(value), depth + 1)  # a Receipt
        if isinstance(value, bytes | bytearray):
            # A wire payload inside a frame (an HTTP body): JSON if it is, else its text.
            return self.value(_parsed(bytes(value).decode("utf-8", "replace")), depth + 1)
        return self.text(repr(value))

    def frames(self, raw: Any) -> list[Any]:
        """One captured frame as the values to print: text is split into its NDJSON lines,
        each line that parses as JSON redacted as JSON, any other as text."""
        if isinstance(raw, bytes | bytearray):
            raw = bytes(raw).decode("utf-8", "replace")
        if not isinstance(raw, str):
            return [self.value(raw)]
        lines = [line for line in raw.splitlines() if line.strip()] or [raw]
        return [self.value(_parsed(line)) for line in lines]


def _parsed(line: str) -> Any:
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        return line
