"""The shim's side of the inbound gate: one detached helper per agent writes its peer frames.

Why (ADR 0020, research ``claude-code.md`` §5, §11): Claude applies permission-mode parity,
``crossSessionInbound``, the hold dialog and expiry only to frames from a process that does
not descend from it, and it sends receipts only to a ``from`` listener owned by the very
process that wrote the frame. A shim is Claude's child; its helper
(:mod:`crosstalk.harness.claude.helper`) is not, and it owns the listener it writes from.

:class:`HelperLink` starts the helper and talks to it over a socketpair: it asks for writes
and gets their results; whatever reaches the helper's listener comes back here and is
re-delivered through the agent's own uds ingress, so the receiver chain and the journal stay
the only path in:

* only what the session we inject into sent (its pid and start time) is taken; anything else
  at that address is dropped;
* a ``user`` line (a native reply from the session) goes in as it came: the ingress sees this
  shim, i.e. the session's own agent, as it saw the session before (a bounce);
* a ``control`` line (a receipt, an idle notice) goes in with the session's credentials under
  :data:`RELAY_KEY`; :func:`unwrap` trusts them only on a frame this very process relayed.

The helper exits when the shim does (its end of the socketpair closes). If it dies first,
writes in flight end ``unknown`` (the frame may have been written) and the next injection
starts a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import socket
import sys
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Final

from crosstalk import proc
from crosstalk.core.states import MessageState
from crosstalk.harness.claude.inbox import EOF_TIMEOUT, LINK_LIMIT, InboxResult

log = logging.getLogger(__name__)

#: Where a relayed control frame carries the credentials of the process that sent it.
RELAY_KEY: Final = "crosstalk_relayed_peer"
#: How long the helper may take to start (interpreter, imports, reparenting, bind).
START_TIMEOUT: Final = 20.0
#: How long a write may take in the helper: its connect and the inbox's close, with margin.
WRITE_TIMEOUT: Final = 2.0 + EOF_TIMEOUT + 10.0
#: How long a relayed line waits for the agent's ingress to come up (about twice this).
RELAY_PATIENCE: Final = 5.0
#: Longest socket path Claude accepts as an address.
MAX_SOCKET_PATH: Final = 103


class HelperError(Exception):
    """The helper could not be started (nothing was written)."""


def listen_path_for(reply_address: str) -> str:
    """The helper's listener: beside the agent's uds ingress (a directory Claude vets), a
    basename of 16 hex digits (what Claude accepts in a ``cc-socks`` directory), derived from
    the ingress path so it survives restarts and never collides with a pid's ``<pid>.sock``."""
    digest = hashlib.sha256(f"gate:{reply_address}".encode()).hexdigest()
    return str(Path(reply_address).with_name(f"c{digest[:15]}.sock"))


@cache
def _own_start() -> str | None:
    return proc.process_start_time(os.getpid())


def unwrap(frame: Mapping[str, Any], peer_pid: int | None,
           peer_start: str | None) -> tuple[Mapping[str, Any], int | None, str | None] | None:
    """A control frame as its real sender sent it: a frame this process relayed carries that
    sender's credentials; the same key from anyone else is a forgery (``None``: ignore it)."""
    relayed = frame.get(RELAY_KEY)
    if relayed is None:
        return frame, peer_pid, peer_start
    if peer_pid != os.getpid() or peer_start != _own_start() or not isinstance(relayed, dict):
        return None
    pid, start = relayed.get("pid"), relayed.get("start")
    rest = {k: v for k, v in frame.items() if k != RELAY_KEY}
    return rest, pid if isinstance(pid, int) else None, start if isinstance(start, str) else None


@dataclass(frozen=True)
class Target:
    """Who may speak to the helper's listener, and where what it says goes."""

    pid: int
    start: str | None
    #: The agent's uds ingress.
    relay_to: str


class HelperLink:
    """One running helper and the socketpair to it."""

    def __init__(self, target: Target, listen_path: str) -> None:
        self.target = target
        self.path = listen_path
        self.pid: int | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Future[InboxResult]] = {}
        self._next = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._dead = False

    @property
    def alive(self) -> bool:
        return self._writer is not None and not self._dead

    async def start(self) -> None:
        """Start the helper and wait for its ``ready`` (:class:`HelperError` if it fails)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            launcher = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "crosstalk.harness.claude.helper", str(theirs.fileno()),
                self.path, str(self.target.pid), pass_fds=(theirs.fileno(),),
                start_new_session=True, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        except OSError as exc:
            ours.close()
            raise HelperError(f"cannot start the helper: {exc}") from None
        finally:
            theirs.close()  # only the helper holds its end: our exit is its EOF
        await launcher.wait()  # the middle process: exits as soon as it has forked
        reader, self._writer = await asyncio.open_unix_connection(sock=ours, limit=LINK_LIMIT)
        try:
            line = await asyncio.wait_for(reader.readline(), START_TIMEOUT)
            hello = json.loads(line) if line else {}
        except (TimeoutError, OSError, ValueError):
            hello = {}
        if not isinstance(hello, dict) or hello.get("op") != "ready":
            self.close()
            why = hello.get("why") if isinstance(hello, dict) else None
            raise HelperError(f"the helper did not start ({why or 'no answer'})")
        self.pid = int(hello["pid"])
        self._reader_task = asyncio.get_running_loop().create_task(self._read(reader))
        log.debug("gate helper %d writing from %s", self.pid, self.path)

    async def write(self, socket_path: str, payload: bytes) -> InboxResult:
        """Have the helper write ``payload`` into the inbox; what the socket proved."""
        if not self.alive or self._writer is None:
            return InboxResult(MessageState.UNREACHABLE, "helper_unavailable")
        self._next += 1
        rid = self._next
        future: asyncio.Future[InboxResult] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        request = {"op": "write", "id": rid, "socket": socket_path,
                   "payload": payload.decode()}
        try:
            self._writer.write(json.dumps(request, ensure_ascii=False).encode() + b"\n")
            await self._writer.drain()
        except OSError:
            self._pending.pop(rid, None)
            self._died()
            # Our request may have reached the helper, which may have written it.
            return InboxResult(MessageState.UNKNOWN, "helper_exited")
        try:
            return await asyncio.wait_for(asyncio.shield(future), WRITE_TIMEOUT)
        except TimeoutError:
            return InboxResult(MessageState.UNKNOWN, "helper_did_not_answer")
        finally:
            self._pending.pop(rid, None)

    def close(self) -> None:
        """Close our end: the helper exits on the EOF."""
        self._died()
        if self._reader_task is not None:
            self._reader_task.cancel()

    def _died(self) -> None:
        if not self._dead:
            self._dead = True
            for future in self._pending.values():
                if not future.done():
                    future.set_result(InboxResult(MessageState.UNKNOWN, "helper_exited"))
            if self._writer is not None:
                self._writer.close()

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while line := await reader.readline():
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if isinstance(msg, dict):
                    self._on_message(msg)
        except (OSError, ValueError):
            pass
        except asyncio.CancelledError:  # our own shutdown, not the helper's end
            self._died()
            raise
        if not self._dead:
            log.warning("gate helper %s for %s exited", self.pid, self.path)
        self._died()

    def _on_message(self, msg: dict[str, Any]) -> None:
        if msg.get("op") == "wrote":
            future = self._pending.get(msg.get("id"))  # type: ignore[arg-type]
            if future is not None and not future.done():
                state = MessageState(str(msg.get("state")))
                future.set_result(InboxResult(state, msg.get("reason"), msg.get("evidence")))
        elif msg.get("op") == "arrived":
            pid, start = self.target.pid, self.target.start
            if (msg.get("pid"), msg.get("start")) != (pid, start) or msg.get("uid") != (
                    os.getuid()):
                log.info("gate helper %s: dropped a connection from pid %s (not the session)",
                         self.path, msg.get("pid"))
                return
            for line in str(msg.get("data", "")).splitlines():
                relayed = relay_line(line, pid, start)
                if relayed is not None:
                    task = asyncio.get_running_loop().create_task(
                        self._relay(relayed))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)

    async def _relay(self, line: bytes) -> None:
        """One line into the agent's uds ingress, on a connection of its own (the helper is
        up before the ingress, so a line that comes that early waits for it a little)."""
        delay = 0.02
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(self.target.relay_to)
                break
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                if delay > RELAY_PATIENCE:
                    log.warning("gate: cannot relay to %s: %s", self.target.relay_to, exc)
                    return
            except OSError as exc:
                log.warning("gate: cannot relay to %s: %s", self.target.relay_to, exc)
                return
            await asyncio.sleep(delay)
            delay *= 2
        try:
            writer.write(line)
            writer.write_eof()
            await asyncio.wait_for(reader.read(), EOF_TIMEOUT)
        except (OSError, TimeoutError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


def relay_line(line: str, pid: int, start: str | None) -> bytes | None:
    """What of one line from the session goes on to the ingress: a user frame as it is, a
    control frame with the session's credentials; nothing else (auth lines, junk)."""
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    if obj.get("type") == "control":
        obj[RELAY_KEY] = {"pid": pid, "start": start}
    elif obj.get("type") != "user":
        return None
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


#: One helper per agent uds ingress per event loop (a link's futures belong to its loop).
_LINKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, HelperLink]] = (
    weakref.WeakKeyDictionary())
_STARTING: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
    weakref.WeakKeyDictionary())


async def link_for(target: Target) -> HelperLink:
    """The running helper for ``target``'s agent, started (or restarted) if need be."""
    loop = asyncio.get_running_loop()
    links = _LINKS.setdefault(loop, {})
    lock = _STARTING.setdefault(loop, asyncio.Lock())
    async with lock:
        link = links.get(target.relay_to)
        if link is not None and link.alive and link.target == target:
            return link
        if link is not None:
            link.close()
        path = listen_path_for(target.relay_to)
        if len(os.fsencode(path)) > MAX_SOCKET_PATH:
            raise HelperError(f"the helper's socket path {path} is too long")
        link = HelperLink(target, path)
        await link.start()
        links[target.relay_to] = link
        return link


def close_all() -> None:
    """Close every helper of this event loop (tests; a shim's exit does it by itself)."""
    for link in _LINKS.pop(asyncio.get_running_loop(), {}).values():
        link.close()
