"""opencode's entry in the ``crosstalk.harnesses`` group: ``opencode.plugin:plugin``.

Install, doctor and the unreachable reasons come from ``.setup`` (the config edit and the
plugin file), imported when a command needs them: a shim never edits a config. It is built
beside this package; until it is there, install and doctor have nothing to say for opencode.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import cast

from crosstalk.harness.base import Discovery, Identifier, Session
from crosstalk.harness.opencode.discovery import OpencodeDiscovery
from crosstalk.harness.opencode.harness import HARNESS
from crosstalk.harness.opencode.identifier import (
    HostedOpencodeIdentifier,
    OpencodeIdentifier,
    parent_is_opencode,
)
from crosstalk.harness.plugin import ConfigEdit, Finding, HarnessPlugin, PlacedFile, ShimContext


def _identifier(ctx: ShimContext) -> Identifier:
    """In every shim (it removes ``_opencode`` stamps and lists opencode sessions); it binds
    and registers sessions only under opencode (``OPENCODE_PID`` == our parent)."""
    env = dict(ctx.env)
    if parent_is_opencode(env, ctx.ppid):
        return HostedOpencodeIdentifier(env=env, cwd=ctx.cwd, ppid=ctx.ppid)
    return OpencodeIdentifier(env=env, cwd=ctx.cwd)


def _discovery(env: Mapping[str, str]) -> Discovery:
    return OpencodeDiscovery(dict(env))


def _setup() -> ModuleType | None:
    try:
        return importlib.import_module("crosstalk.harness.opencode.setup")
    except ModuleNotFoundError as exc:
        if exc.name != "crosstalk.harness.opencode.setup":
            raise
        return None


def _install(env: Mapping[str, str]) -> Sequence[ConfigEdit | PlacedFile]:
    setup = _setup()
    return () if setup is None else cast(Sequence[ConfigEdit | PlacedFile],
                                         setup.install_entries(env))


def _doctor(env: Mapping[str, str]) -> Sequence[Finding]:
    setup = _setup()
    return () if setup is None else cast(Sequence[Finding], setup.doctor(env))


def _why_unreachable(session: Session) -> str | None:
    setup = _setup()
    return None if setup is None else cast(str | None, setup.why_unreachable(session))


HINTS: Mapping[str, str] = {
    "opencode_session_not_found": "that opencode session no longer exists in its instance",
    "opencode_route_missing": ("that opencode does not serve the routes CrossTalk uses "
                               "(another opencode version?); `crosstalk doctor` says which"),
    "opencode_no_evidence": ("opencode took the message but never showed it stored; it may "
                             "or may not have arrived: check before resending"),
    "opencode_aborted_before_answer": ("the message was stored, but the session's turn was "
                                       "aborted before it answered; it sees it next turn"),
    "opencode_auth_required": "that opencode instance asks for a password CrossTalk lacks",
}


#: Between Codex (10: ``_meta.threadId`` on every call) and Claude (20: the process tree):
#: the plugin's stamp on every call, honoured only under opencode.
plugin = HarnessPlugin(
    name=HARNESS, trust=15, identifier=_identifier, discovery=_discovery, install=_install,
    doctor=_doctor, why_unreachable=_why_unreachable, hints=HINTS)
