"""``crosstalk send``: a plain-script client of an agent's uds ingress.

``send`` is a shape (a) client of the uds ingress (seed §5): it resolves exactly one live
registered agent, reads that agent's key file (it never creates one), writes the auth line and
one user line carrying our metadata (``"crosstalk": {"message_id": <uuid7>}``), half-closes and
reads the one ack line. The script is not a registered agent, so the receiver sees an
unverified sender: an inform labelled unverified, never a wake where the harness can hold
it back (Codex: appended without a turn; Claude 2.1.328 starts a turn for any frame into an
idle session, even at priority "later"). The message enters the one
receiver chain; the CLI injects nothing itself.

Exit codes (design §6): 0 accepted or queued, 1 the agent answered with another state, 2 usage,
3 no such agent or an ambiguous name, 4 transport failure (no key, no socket, no ack, timeout).
"""

from __future__ import annotations

import json
import os
import socket
import stat
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from crosstalk.config import DELIVERY_TIMEOUT, uds_key_path
from crosstalk.core.ids import new_message_id
from crosstalk.core.states import DELIVERED
from crosstalk.store.registry import Descriptor, Registry

EXIT_OK = 0
EXIT_STATE = 1
EXIT_USAGE = 2
EXIT_NO_TARGET = 3
EXIT_TRANSPORT = 4
EXIT_PARTIAL = 5

#: What Claude Code's inbox accepts in one line (characters, without the newline).
MAX_LINE = 1_048_576
_ACK_LIMIT = 64 * 1024


class SendFailure(Exception):
    """``crosstalk send`` cannot deliver; ``exit_code`` says which kind of failure. ``reason``
    names a target that resolved to no agent (``no_such_agent``, ``ambiguous_name``): a
    definite failure, sent nowhere, which ``--json`` reports as ``rejected``."""

    def __init__(self, exit_code: int, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.reason = reason

    def result(self, to: str) -> dict[str, str] | None:
        """The ``--json`` line for a target that resolved to nobody, else ``None``."""
        if self.reason is None:
            return None
        return {"to": to, "state": "rejected", "reason": self.reason}


def message_text(text: str, stdin: IO[str] | None = None) -> str:
    """The message to send: ``text``, or stdin for ``-``. Bytes that are not UTF-8 (in argv,
    decoded by Python with surrogate escapes, or on stdin) are a usage error: what they were
    meant to say cannot be known, so nothing is sent."""
    if text == "-":
        if stdin is None:
            raw = sys.stdin.buffer.read()
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise SendFailure(2, f"the message on stdin is not UTF-8 (byte {exc.start} "
                                  f"is {raw[exc.start]:#04x}); nothing was sent") from None
        else:
            text = stdin.read()
        text = text.removesuffix("\n")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise SendFailure(2, f"the message is not valid UTF-8 (character {exc.start}); "
                          "nothing was sent") from None
    return text


# -- resolving and reading the key --------------------------------------------------------------


def resolve_target(home: Path, to: str, env: Mapping[str, str] | None = None) -> Descriptor:
    """The one live registered agent ``to`` names: a name, an agent_id, or an address
    (``claude:<pid|session-id|name>``, ``codex:<thread-id|name>``, ``uds:<path>``).
    Ambiguity is an error naming the candidates, never a guess."""
    if not (home / "agents").is_dir():
        raise SendFailure(EXIT_NO_TARGET, f"no agent {to!r}: nothing is registered in {home}",
                          "no_such_agent")
    found = Registry(home).find(to)
    if len(found) > 1:
        raise _ambiguous(to, [(d.agent_id, d.name, d.harness, d.cwd) for d in found])
    if found:
        return found[0]
    # Addresses and sessions without CrossTalk need the harnesses' own registries.
    from crosstalk.directory import Directory, Unresolved
    from crosstalk.harness.loader import discoveries

    target = Directory(Registry(home), discoveries(os.environ if env is None else env)
                       ).resolve(to)
    if isinstance(target, Unresolved):
        if target.reason == "ambiguous_name":
            raise _ambiguous(to, [(e.agent_id, e.name, e.harness, e.cwd or "?")
                                  for e in target.candidates])
        raise SendFailure(EXIT_NO_TARGET, f"no live agent named or identified by {to!r}",
                          "no_such_agent")
    if target.descriptor is None:
        raise SendFailure(EXIT_NO_TARGET, f"{to!r} is a {target.harness} session without "
                          "CrossTalk: crosstalk send reaches CrossTalk agents only (a session "
                          "with CrossTalk can send it an inform with send_message)")
    return target.descriptor


def _ambiguous(to: str, rows: list[tuple[str, str, str, str]]) -> SendFailure:
    listed = "\n".join(f"  {aid}  {name}  {harness}  {cwd}" for aid, name, harness, cwd in rows)
    return SendFailure(EXIT_NO_TARGET, f"{to!r} is ambiguous; use one of these agent ids:\n"
                       f"{listed}", "ambiguous_name")


def read_key(key_path: Path) -> str:
    """The token in an agent's key file; a missing or unreadable key is a transport failure."""
    try:
        raw = key_path.read_bytes()
    except FileNotFoundError:
        raise SendFailure(EXIT_TRANSPORT, f"key file {key_path} does not exist: the agent's "
                          "uds ingress is not running (crosstalk send never creates one)") from None
    except OSError as exc:
        raise SendFailure(EXIT_TRANSPORT, f"cannot read key file {key_path}: "
                          f"{exc.strerror or exc}") from None
    try:
        token = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        token = ""
    if not token:
        raise SendFailure(EXIT_TRANSPORT, f"key file {key_path} holds no key")
    return token


# -- the wire -----------------------------------------------------------------------------------


def frames(token: str, text: str, message_id: str) -> bytes:
    """The two lines of a shape (a) send: auth, then one user line with our metadata."""
    auth = json.dumps({"type": "auth", "token": token}, separators=(",", ":"))
    user = json.dumps({"type": "user", "message": {"role": "user", "content": text},
                       "crosstalk": {"message_id": message_id}},
                      ensure_ascii=False, separators=(",", ":"))
    if len(user) > MAX_LINE:
        raise SendFailure(EXIT_USAGE, f"message too large: {len(user)} characters encoded, "
                          f"the limit is {MAX_LINE}")
    return f"{auth}\n{user}\n".encode()


def exchange(uds_path: Path, payload: bytes, *, timeout: float) -> dict[str, Any]:
    """Connect, write, half-close, read one ack line. Transport trouble is :class:`SendFailure`."""
    deadline = time.monotonic() + timeout
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        try:
            sock.connect(os.fspath(uds_path))
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise SendFailure(EXIT_TRANSPORT, f"cannot connect to {uds_path}: "
                              f"{exc.strerror or exc} (is the agent's shim running?)") from None
        except OSError as exc:
            raise SendFailure(EXIT_TRANSPORT, f"cannot connect to {uds_path}: {exc}") from None
        try:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
        except OSError as exc:
            raise SendFailure(EXIT_TRANSPORT, f"the connection to {uds_path} failed while "
                              f"sending: {exc}") from None
        data = _read_line(sock, deadline, uds_path)
    finally:
        sock.close()
    try:
        ack = json.loads(data)
    except ValueError:
        ack = None
    if not isinstance(ack, dict) or ack.get("type") != "ack" or not isinstance(
            ack.get("state"), str):
        raise SendFailure(EXIT_TRANSPORT, f"{uds_path} answered with something that is not an "
                          "ack")
    return ack


def _read_line(sock: socket.socket, deadline: float, uds_path: Path) -> bytes:
    buf = b""
    while b"\n" not in buf:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise SendFailure(EXIT_TRANSPORT, f"no ack from {uds_path} in time")
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            raise SendFailure(EXIT_TRANSPORT, f"no ack from {uds_path} in time") from None
        except OSError as exc:
            raise SendFailure(EXIT_TRANSPORT, f"the connection to {uds_path} failed before an "
                              f"ack: {exc}") from None
        if not chunk:
            break
        buf += chunk
        if len(buf) > _ACK_LIMIT:
            raise SendFailure(EXIT_TRANSPORT, f"{uds_path} sent an over-long answer")
    if not buf.strip():
        raise SendFailure(EXIT_TRANSPORT, f"{uds_path} closed without an ack (the agent did "
                          "not accept the connection)")
    return buf.split(b"\n", 1)[0]


def auth_failed_hint(key_path: Path) -> str:
    """Why an agent refused the key we read from ``key_path``. Its ingress takes a key only
    from a regular 0600 file of its own user (:mod:`crosstalk.ingress.uds`), so a loosened
    mode fails every send; else the agent most likely restarted with a new key meanwhile."""
    again = "the agent may have restarted with a new key meanwhile: send again"
    try:
        st = key_path.lstat()
    except OSError:
        return again
    if not stat.S_ISREG(st.st_mode):
        return (f"key file {key_path} is not a regular file, so the agent refuses every key: "
                "restart that session's crosstalk mcp (crosstalk doctor shows it)")
    if st.st_uid != os.getuid():
        return (f"key file {key_path} is owned by uid {st.st_uid}, not by you, so the agent "
                "refuses every key: restart that session's crosstalk mcp")
    mode = stat.S_IMODE(st.st_mode)
    if mode != 0o600:
        return (f"key file {key_path} is mode {mode:04o}; the agent takes a key only from a "
                "0600 file, so it refuses every send: run crosstalk doctor --fix (or chmod 600 "
                f"{key_path})")
    return again


@dataclass(frozen=True)
class Sent:
    message_id: str
    ack: dict[str, Any]
    #: The key file the token came from (for the hint when the agent refuses it).
    key_path: Path | None = None

    @property
    def hint(self) -> str | None:
        if self.ack.get("reason") == "auth_failed" and self.key_path is not None:
            return auth_failed_hint(self.key_path)
        return None

    @property
    def state(self) -> str:
        return str(self.ack.get("state"))

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.state in DELIVERED else EXIT_STATE


def send(home: Path, to: str, text: str, *, timeout: float = DELIVERY_TIMEOUT,
         message_id: str | None = None) -> Sent:
    """Resolve, read the key, deliver one message through the agent's uds ingress."""
    if not text:
        raise SendFailure(EXIT_USAGE, "nothing to send: the text is empty")
    target = resolve_target(home, to)
    if not target.uds_path:
        raise SendFailure(EXIT_TRANSPORT, f"agent {target.name} ({target.agent_id}) publishes "
                          "no uds ingress")
    uds_path = Path(target.uds_path)
    key_path = uds_key_path(uds_path)
    token = read_key(key_path)
    message_id = message_id or new_message_id()
    ack = exchange(uds_path, frames(token, text, message_id), timeout=timeout)
    return Sent(message_id, ack, key_path)


def run_send(home: Path, to: str, text: str, *, as_json: bool = False,
             timeout: float = DELIVERY_TIMEOUT,
             stdin: IO[str] | None = None, out: IO[str] | None = None,
             err: IO[str] | None = None) -> int:
    """The ``crosstalk send`` command: ``text`` ``-`` reads the message from stdin."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        text = message_text(text, stdin)
        sent = send(home, to, text, timeout=timeout)
    except SendFailure as exc:
        print(f"crosstalk send: {exc}", file=err)
        if as_json and (line := exc.result(to)) is not None:
            print(json.dumps(line, separators=(",", ":")), file=out)
        return exc.exit_code
    if as_json:
        print(json.dumps(sent.ack, separators=(",", ":")), file=out)
    else:
        mid = sent.ack.get("message_id") or sent.message_id
        print(f"{mid} {sent.state} {sent.ack.get('reason') or '-'}", file=out)
    if sent.hint:
        print(f"crosstalk send: {sent.hint}", file=err)
    return sent.exit_code


def run_broadcast(home: Path, targets: list[str], text: str, *, confirm_count: int | None,
                  as_json: bool = False, timeout: float = DELIVERY_TIMEOUT,
                  stdin: IO[str] | None = None, out: IO[str] | None = None,
                  err: IO[str] | None = None) -> int:
    """``crosstalk send --to A --to B --confirm-count 2 TEXT`` (seed 001 §5): every target is
    resolved first (one unknown or ambiguous target: nothing is sent); the count must match
    what the targets resolve to, else a preview and nothing sent; then each target gets its
    own message and ack. Exit 0 all accepted/queued, 5 some, else the first failure's."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        text = message_text(text, stdin)
        resolved = list({d.agent_id: d for d in (resolve_target(home, t) for t in targets)
                         }.values())
    except SendFailure as exc:
        print(f"crosstalk send: {exc} (nothing was sent)", file=err)
        return exc.exit_code
    if confirm_count != len(resolved):
        print(f"crosstalk send: --confirm-count {confirm_count} does not match the "
              f"{len(resolved)} agents these targets name; nothing was sent:", file=err)
        for d in resolved:
            print(f"  {d.agent_id}  {d.name}  {d.harness}  {d.cwd}", file=err)
        return EXIT_USAGE
    codes = []
    for desc in resolved:
        try:
            sent = send(home, desc.agent_id, text, timeout=timeout)
        except SendFailure as exc:
            print(f"crosstalk send: {desc.name}: {exc}", file=err)
            codes.append(exc.exit_code)
            continue
        codes.append(sent.exit_code)
        if as_json:
            print(json.dumps({"to": desc.name, **sent.ack}, separators=(",", ":")), file=out)
        else:
            mid = sent.ack.get("message_id") or sent.message_id
            print(f"{desc.name} {mid} {sent.state} {sent.ack.get('reason') or '-'}", file=out)
        if sent.hint:
            print(f"crosstalk send: {desc.name}: {sent.hint}", file=err)
    if all(c == EXIT_OK for c in codes):
        return EXIT_OK
    if any(c == EXIT_OK for c in codes):
        return EXIT_PARTIAL
    return next(c for c in codes if c != EXIT_OK)
