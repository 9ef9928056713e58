"""What one harness package contributes to CrossTalk: the object its entry point names.

A harness is one package plus one line in the ``crosstalk.harnesses`` entry-point group
(``name = "package.module:plugin"``), Claude and Codex exactly as a third party would register.
The plugin says how the shim recognises the harness's sessions, how ``crosstalk agents`` lists
them, what ``crosstalk install`` writes and ``crosstalk doctor`` checks, and where an agent's
socket must live for the harness to accept it as a reply address. Nothing outside the harness's
package names it.

A plugin object must be cheap to import: every field is a function, called only when a command
needs it (``crosstalk install`` never starts a shim's identifier).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from crosstalk.harness.base import Discovery, Identifier, Session

if TYPE_CHECKING:
    from crosstalk.store.registry import Descriptor

#: The name CrossTalk's MCP server is registered under in every harness's config.
SERVER = "crosstalk"


@dataclass(frozen=True)
class ShimContext:
    """What a harness's identifier is built from in one ``crosstalk mcp`` process."""

    env: Mapping[str, str]
    #: The shim's parent as seen at process start (Claude: the session's pid).
    ppid: int
    cwd: str
    #: A live descriptor by agent_id (a verified sender's session, for Claude's parity).
    live_descriptor: Callable[[str], Descriptor | None] = lambda _agent_id: None
    #: Endpoints that live agents of a harness recorded (Codex: their app-servers, CQ10).
    recorded_endpoints: Callable[[str], list[str]] = lambda _harness: []


@dataclass(frozen=True)
class Finding:
    """One line of ``crosstalk doctor``: a fact, or a problem with the command that fixes it."""

    ok: bool
    what: str
    fix: str | None = None

    def line(self) -> str:
        head = "ok      " if self.ok else "PROBLEM "
        return head + self.what + (f"\n        fix: {self.fix}" if self.fix else "")


class ConfigError(Exception):
    """A harness config that install cannot edit (it is not the shape the harness writes)."""


@dataclass(frozen=True)
class ConfigEdit:
    """A harness config file in which install registers ``crosstalk mcp``.

    ``add`` and ``remove`` are pure (text in, text out) and raise :class:`ConfigError` or
    ``ValueError`` for a file they cannot read, so nothing is written for it."""

    #: The install record's name (``<state>/install/<key>.json``: the bytes before install).
    key: str
    path: Path
    #: (the file's text, ``None`` if there is none; the server command) -> the text after.
    add: Callable[[str | None, list[str]], str]
    remove: Callable[[str], str]


@dataclass(frozen=True)
class PlacedFile:
    """A file install places whole (Claude's skill) and uninstall removes."""

    path: Path
    content: Callable[[], str]


def _no_entries(_env: Mapping[str, str]) -> Sequence[ConfigEdit | PlacedFile]:
    return ()


def _no_findings(_env: Mapping[str, str]) -> Sequence[Finding]:
    return ()


@dataclass(frozen=True)
class HarnessPlugin:
    """One harness, as its package registers it in the ``crosstalk.harnesses`` group."""

    name: str
    #: Identifiers are asked in this order, lowest first (seed §3: the strongest evidence
    #: first; Codex's per-request ``_meta.threadId`` before Claude's process tree).
    trust: int
    #: The identifier a shim in this environment uses (``None``: not here, e.g. the fake
    #: harness unless ``CROSSTALK_HARNESS=fake``).
    identifier: Callable[[ShimContext], Identifier | None]
    #: Its sessions without a shim, for ``crosstalk agents`` and ``send`` (``None``: not listed).
    discovery: Callable[[Mapping[str, str]], Discovery] | None = None
    #: What ``crosstalk install`` writes (configs are planned before placed files).
    install: Callable[[Mapping[str, str]], Sequence[ConfigEdit | PlacedFile]] = _no_entries
    #: What ``crosstalk doctor`` reports about this harness.
    doctor: Callable[[Mapping[str, str]], Sequence[Finding]] = _no_findings
    #: Why one of its sessions that its discovery shows unreachable cannot be messaged, for
    #: people (``crosstalk agents``); ``None``: no reason known.
    why_unreachable: Callable[[Session], str | None] = field(default=lambda _s: None)
    #: What the reasons its injections give mean, for the sending model (``send_message``).
    hints: Mapping[str, str] = field(default_factory=dict)
    #: Where an agent's uds ingress must live for this harness to accept its address (Claude
    #: vets reply and receipt addresses by directory); ``None``: anywhere.
    socket_dir: Callable[[Mapping[str, str]], Path] | None = None
