"""The Claude-compatible unix-socket ingress (seed §5 "uds ingress"; design §4 items 3-5).

Wire format, as Claude Code 2.1.328 speaks it (``research/claude-code.md`` §5-§6): UTF-8
NDJSON on a stream socket, one JSON object per ``\\n``-terminated line, blank lines skipped, a
final fragment without ``\\n`` parsed at EOF, a line over 1,048,576 characters or 30 s without
a complete line closes the connection, and connect-and-close probes are normal (Claude's
ListAgents makes two before it sends).

A connection carries one message, in one of two shapes:

(a) ``{"type":"auth","token":T}`` then one ``{"type":"user",...}`` line. ``T`` must equal the
    content of the key file beside the socket (``<path minus .sock>.key``, a regular 0600 file
    owned by us; anything else fails every auth). The sender is still identified by the peer's
    credentials: a registered agent if its pid maps to exactly one live descriptor, else
    *unverified* (``crosstalk send`` from a script). Exactly one ack line comes back —
    ``{"type":"ack","message_id":…,"state":…,"reason":…}`` — then the server closes.
(b) one ``{"type":"user",...}`` line and no auth line: Claude's own SendMessage. Accepted only
    when the peer pid (SO_PEERCRED), with the start time read at accept, maps to exactly one
    live descriptor by ``pid``/``started_at`` or ``harness_pid``/``harness_started_at``. Anything
    else — no match, or a pooled pid matching several descriptors — is closed with no state:
    nothing journaled, nothing injected. Shape (b) never gets a byte back, on success or on any
    rejection: Claude's sender takes EOF as success and reports a socket still open after 5 s
    as a failure, so the server closes as soon as the frame is journaled ``submitted``.

Dispatch is the agent's: both shapes hand admitted messages to the agent's one ordered
dispatch lane (:class:`Lane`), which the A2A ingress shares. Shape (a) waits for its
message's turn and outcome before it acks; shape (b) does not wait at all.

Identity comes only from the transport (peer pid + start time → descriptor); what a frame says
about itself (``msg_id``, ``from``, ``priority``, ``session_id``, envelope attributes) is kept as
display claims only. A frame carrying our metadata (``"crosstalk": {"message_id": <uuid>}``) is
an identified message the receiver dedupes; any other frame is native and gets a fresh id. A uds
frame is ``inform``: a frame that asks for another kind (``crosstalk.kind``, a top-level
``kind``, or a ``kind`` attribute on the envelope) is handed to the receiver *with* that kind so
its policy rejects and journals it; a kind outside the protocol is refused here.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import re
import secrets
import socket
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from crosstalk import proc
from crosstalk.config import PRIVATE_DIR_MODE, PRIVATE_FILE_MODE, uds_key_path
from crosstalk.core.envelope import parse_claude
from crosstalk.core.ids import new_message_id
from crosstalk.core.message import Ingress, Kind, Message, Sender
from crosstalk.receiver import Entry, Receiver, ReceiverUnavailable, Result
from crosstalk.store.files import unlink_durable, write_atomic
from crosstalk.store.registry import Descriptor, Registry

log = logging.getLogger(__name__)

#: Claude Code's inbox limit: a buffered line longer than this many characters kills the
#: connection (``Line exceeded 1048576 chars``).
MAX_LINE = 1_048_576
#: Claude Code closes a connection that sends no complete line within 30 s.
IDLE_TIMEOUT = 30.0
#: How long stop() lets a connection already inside the receiver chain finish.
CLOSE_GRACE = 2.0
#: Longest socket path accepted, in bytes; Claude Code refuses longer ones (macOS' sun_path is
#: 104 bytes with the NUL, Linux' 108), so a longer path could not be addressed by Claude anyway.
MAX_SOCKET_PATH = 103
#: Concurrent connections served; more are closed at once (probes and senders are short-lived).
MAX_CONNECTIONS = 64

_UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_CLAIMED_FIELDS = ("msg_id", "from", "priority", "session_id")
_MAX_CLAIM_CHARS = 300
_KEY_READ_LIMIT = 4096
#: In-flight accepts surface as connection tasks within a few loop turns after the listener
#: closes; stop() waits this many quiet turns before it declares the server drained.
_SETTLE_TURNS = 8


#: Receives a control frame with the peer's pid and start time (``None`` if unknown).
ControlHandler = Callable[[Mapping[str, Any], int | None, str | None], None]


class Lane(Protocol):
    """What the ingress needs from its agent's dispatch lane (one per agent, in order)."""

    def submit(self, entry: Entry, *, resume: bool = False) -> None:
        """Dispatch ``entry`` in its turn; do not wait."""

    async def dispatch(self, entry: Entry) -> Result:
        """Dispatch ``entry`` in its turn and return its outcome."""

    async def settle(self) -> None:
        """Return once everything submitted so far has been dispatched."""


class IngressError(RuntimeError):
    """The ingress cannot start safely (directory not private, path in use, path too long)."""


class BadFrame(ValueError):
    """A line that is not a frame this ingress accepts (bad JSON, wrong types, bad metadata)."""


class _Close(Exception):
    """Close the connection now, writing nothing (oversize line, idle timeout)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# -- frames (pure) -----------------------------------------------------------------------------


@dataclass(frozen=True)
class UserFrame:
    """A decoded ``type:"user"`` line. Nothing in it is identity."""

    text: str
    #: Our metadata's message id (an identified message), or ``None`` for a native frame.
    message_id: str | None
    #: The kind the frame asks for; ``None`` when it names a kind outside the protocol.
    kind: Kind | None
    claimed: dict[str, str]


def parse_line(line: str) -> dict[str, Any]:
    """One NDJSON line as a JSON object, or :class:`BadFrame`."""
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise BadFrame(f"not JSON: {type(exc).__name__}") from None
    if not isinstance(obj, dict):
        raise BadFrame("not a JSON object")
    return obj


def _claim(value: object) -> str | None:
    return value[:_MAX_CLAIM_CHARS] if isinstance(value, str) else None


def _requested_kind(values: list[object]) -> Kind | None:
    """The kind a frame asks for: any non-inform request wins; a value outside the protocol
    (not one of our kinds) is ``None``; no request at all is inform."""
    unknown = False
    for value in values:
        if value is None:
            continue
        try:
            kind = Kind(value) if isinstance(value, str) else None
        except ValueError:
            kind = None
        if kind is None:
            unknown = True
        elif kind is not Kind.INFORM:
            return kind
    return None if unknown else Kind.INFORM


def user_frame(obj: Mapping[str, Any]) -> UserFrame:
    """Decode a ``type:"user"`` object (seed §5 normalisation), or raise :class:`BadFrame`."""
    message = obj.get("message")
    if not isinstance(message, dict):
        raise BadFrame("message is not an object")
    content = message.get("content")
    if not isinstance(content, str) or not content:
        raise BadFrame("message.content is not a non-empty string")
    meta = obj.get("crosstalk")
    if meta is not None and not isinstance(meta, dict):
        raise BadFrame("crosstalk metadata is not an object")
    message_id: str | None = None
    meta_kind: object = None
    if meta is not None:
        mid = meta.get("message_id")
        if mid is not None:
            if not isinstance(mid, str) or not _UUID_RE.fullmatch(mid.lower()):
                raise BadFrame("crosstalk.message_id is not a uuid")
            message_id = mid.lower()
        meta_kind = meta.get("kind")
    claimed = {k: v for k in _CLAIMED_FIELDS if (v := _claim(obj.get(k))) is not None}
    text = content
    envelope_kind: str | None = None
    envelope = parse_claude(content)
    if envelope is not None:
        # The body is the message; every attribute is a claim (display only), and a nested
        # envelope inside the body stays body text (parse_claude parses the outermost only).
        text = envelope.body
        for name, value in (*envelope.attrs.items(), *envelope.foreign.items()):
            claimed[f"envelope.{name}"] = value[:_MAX_CLAIM_CHARS]
        envelope_kind = envelope.foreign.get("kind")
    kind = _requested_kind([meta_kind, obj.get("kind"), envelope_kind])
    return UserFrame(text=text, message_id=message_id, kind=kind, claimed=claimed)


def ack_line(message_id: str | None, state: str, reason: str | None) -> bytes:
    ack = {"type": "ack", "message_id": message_id, "state": state, "reason": reason}
    return json.dumps(ack, separators=(",", ":")).encode() + b"\n"


def matches_peer(desc: Descriptor, pid: int, start_time: str) -> bool:
    """The descriptor's shim (``pid``) or harness session (``harness_pid``) is this process."""
    return (desc.pid == pid and desc.started_at == start_time) or (
        desc.harness_pid == pid and desc.harness_started_at == start_time)


# -- the server --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Peer:
    pid: int
    uid: int
    #: The pid's start time, read at accept (before the pid could be reused).
    start_time: str | None


@dataclass
class _Conn:
    receiving: bool = False


@dataclass
class _Lines:
    """Reads NDJSON lines with Claude's limits: ``max_line`` characters, and a complete
    (non-blank) line within ``idle_timeout`` or the connection is closed."""

    reader: asyncio.StreamReader
    max_line: int
    idle_timeout: float
    eof: bool = field(default=False, init=False)

    async def next(self) -> str | None:
        """The next non-blank line, ``None`` at EOF; raises :class:`_Close` or :class:`BadFrame`."""
        try:
            async with asyncio.timeout(self.idle_timeout):
                while not self.eof:
                    line = await self._read()
                    if line is not None and line.strip():
                        return line
        except TimeoutError:
            raise _Close("idle_timeout") from None
        return None

    async def _read(self) -> str | None:
        try:
            raw = await self.reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:
            self.eof = True
            raw = exc.partial  # a final fragment without "\n" is parsed at EOF (Claude does)
        except asyncio.LimitOverrunError:
            raise _Close("line_too_long") from None
        if not raw:
            return None
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise BadFrame("not UTF-8") from None
        if len(line.rstrip("\n")) > self.max_line:
            raise _Close("line_too_long")
        return line


class UdsIngress:
    """One agent's Claude-compatible socket, feeding its receiver chain."""

    def __init__(
        self,
        path: Path,
        receiver: Receiver,
        registry: Registry,
        *,
        lane: Lane,
        idle_timeout: float = IDLE_TIMEOUT,
        max_line: int = MAX_LINE,
        close_grace: float = CLOSE_GRACE,
        max_connections: int = MAX_CONNECTIONS,
        control: ControlHandler | None = None,
    ) -> None:
        self.path = Path(os.path.abspath(path))
        self.key_path = uds_key_path(self.path)
        self.receiver = receiver
        self.registry = registry
        #: The agent's dispatch lane: every admitted frame is dispatched there, in order.
        self.lane = lane
        self.idle_timeout = idle_timeout
        self.max_line = max_line
        self.close_grace = close_grace
        self.max_connections = max_connections
        #: Where control frames (Claude's receipts) go; they are never messages.
        self.control = control
        self._server: asyncio.Server | None = None
        self._conns: dict[asyncio.Task[Any], _Conn] = {}
        self._closing = False
        self._token: str | None = None
        self._socket_id: tuple[int, int] | None = None
        self._key_warned = False

    @property
    def serving(self) -> bool:
        return self._server is not None

    @property
    def connections(self) -> int:
        """Connections being served right now."""
        return len(self._conns)

    async def __aenter__(self) -> UdsIngress:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.stop()

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Private directory, fresh key (0600, atomic), socket bound 0600, then serve."""
        if self._server is not None:
            raise IngressError(f"uds ingress on {self.path} is already serving")
        if len(os.fsencode(self.path)) > MAX_SOCKET_PATH:
            raise IngressError(f"socket path {self.path} is longer than {MAX_SOCKET_PATH} bytes")
        _private_dir(self.path.parent)
        _clear_stale_socket(self.path)
        # The key first: a sender that finds the socket must be able to authenticate.
        token = secrets.token_hex(16)  # Claude's peerToken shape: 32 hex
        write_atomic(self.key_path, token.encode() + b"\n", PRIVATE_FILE_MODE)
        self._token, self._closing, self._key_warned = token, False, False
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(os.fspath(self.path))
            os.chmod(self.path, PRIVATE_FILE_MODE)  # the 0700 directory guards the gap
            st = os.lstat(self.path)
            self._socket_id = (st.st_dev, st.st_ino)
            # Bytes, not characters, bound the reader: a character is at most 4 UTF-8 bytes.
            self._server = await asyncio.start_unix_server(
                self._on_connect, sock=sock, limit=4 * self.max_line + 8)
        except BaseException:
            sock.close()
            self._remove_files()
            raise
        log.debug("uds ingress serving on %s", self.path)

    def close_listener(self) -> None:
        """Stop accepting and remove our socket and key now; :meth:`stop` finishes the rest."""
        if self._server is not None and not self._closing:
            self._closing = True
            self._server.close()
            self._remove_files()

    async def stop(self) -> None:
        """Stop listening, finish or cancel every connection, remove our socket and key.

        Dispatches are the lane's: its owner closes it (before this, so a connection waiting
        for its outcome is released rather than cut off after a second grace)."""
        server, self._server = self._server, None
        if server is None:
            return
        self._closing = True
        server.close()
        # The address goes first: a harness may kill us within ~0.5 s of asking us to stop
        # (Claude: SIGINT, SIGTERM 100 ms later, SIGKILL 400 ms after that), and a socket and
        # key left behind outlive us. Accepted connections are not affected by the unlink.
        self._remove_files()
        quiet = 0
        while quiet < _SETTLE_TURNS:
            if self._conns:
                quiet = 0
                await self._drain_connections()
            else:
                quiet += 1
                await asyncio.sleep(0)
        await server.wait_closed()
        self._remove_files()
        log.debug("uds ingress on %s stopped", self.path)

    async def settle(self) -> None:
        """Wait until every native frame already admitted has been dispatched."""
        await self.lane.settle()

    async def _drain_connections(self) -> None:
        tasks = list(self._conns)
        for task in tasks:
            if not self._conns[task].receiving:
                task.cancel()  # waiting for input: nothing of it was accepted yet
        _, pending = await asyncio.wait(tasks, timeout=self.close_grace)
        for task in pending:
            task.cancel()  # a dispatch cancelled here is journaled unknown by the receiver
        await asyncio.gather(*tasks, return_exceptions=True)

    def _remove_files(self) -> None:
        """Remove the socket and key, but only while they are still the ones we made."""
        with contextlib.suppress(OSError):
            st = os.lstat(self.path)
            if stat.S_ISSOCK(st.st_mode) and (st.st_dev, st.st_ino) == self._socket_id:
                unlink_durable(self.path)
        if self._token is not None and self._read_key(check_mode=False) == self._token:
            with contextlib.suppress(OSError):
                unlink_durable(self.key_path)
        self._socket_id = None
        self._token = None

    # -- connections -------------------------------------------------------------------------

    async def _on_connect(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        conn = _Conn()
        self._conns[task] = conn
        try:
            if self._closing:
                return
            if len(self._conns) > self.max_connections:
                log.info("uds ingress %s: too many connections, closing one", self.path)
                return
            await self._serve(reader, writer, conn)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        except _Close as exc:
            log.debug("uds ingress %s: closed (%s)", self.path, exc.reason)
        except asyncio.CancelledError:
            # stop() cancelled us. This task is ours alone and ends here; ending it cancelled
            # would make asyncio's own done-callback (task.exception()) log an error.
            log.debug("uds ingress %s: connection cancelled by stop", self.path)
        except Exception:
            log.exception("uds ingress %s: connection failed", self.path)
        finally:
            del self._conns[task]
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     conn: _Conn) -> None:
        peer = _peer(writer)
        if peer is not None and peer.uid != os.getuid():
            log.warning("uds ingress %s: refused a peer of uid %d", self.path, peer.uid)
            return
        lines = _Lines(reader, self.max_line, self.idle_timeout)
        try:
            first = await lines.next()
            if first is None:
                return  # a connect-and-close probe: nothing to say, nothing to record
            obj = parse_line(first)
        except BadFrame as exc:
            log.debug("uds ingress %s: bad first line (%s)", self.path, exc)
            return
        kind = obj.get("type")
        if kind == "auth":
            await self._shape_a(obj, lines, writer, peer, conn)
        elif kind == "user":
            await self._shape_b(obj, peer, conn)
        elif kind == "control":
            # Receipts (peer_message_status) and other control frames are not messages: never
            # injected, never answered; the handler decides whether they name our frames.
            self._control(obj, peer)
        else:
            log.debug("uds ingress %s: unknown frame type", self.path)

    async def _shape_a(self, auth: Mapping[str, Any], lines: _Lines,
                       writer: asyncio.StreamWriter, peer: _Peer | None, conn: _Conn) -> None:
        token = auth.get("token")
        if not isinstance(token, str) or not self._token_ok(token):
            log.info("uds ingress %s: authentication failed", self.path)
            await self._ack(writer, None, "rejected", "auth_failed")
            return
        try:
            line = await lines.next()
            if line is None:
                raise BadFrame("no user line after auth")
            obj = parse_line(line)
            if obj.get("type") == "control":
                self._control(obj, peer)
                return
            if obj.get("type") != "user":
                raise BadFrame("not a user frame")
            frame = user_frame(obj)
        except BadFrame as exc:
            log.debug("uds ingress %s: bad frame after auth (%s)", self.path, exc)
            await self._ack(writer, None, "rejected", "bad_frame")
            return
        if frame.kind is None:
            await self._ack(writer, frame.message_id, "rejected", "unknown_kind")
            return
        msg = self._message(frame, self._sender(peer))
        try:
            result = await self._receive(msg, conn)
        except ReceiverUnavailable as exc:
            log.warning("uds ingress %s: %s", self.path, exc)
            await self._ack(writer, msg.message_id, "error", "journal_unavailable")
            return
        await self._ack(writer, result.message_id, result.state.value, result.reason)

    async def _shape_b(self, obj: Mapping[str, Any], peer: _Peer | None, conn: _Conn) -> None:
        # Nothing is ever written back on this shape: Claude's sender reads EOF as success.
        try:
            frame = user_frame(obj)
        except BadFrame as exc:
            log.debug("uds ingress %s: bad native frame (%s)", self.path, exc)
            return
        desc = self._identify(peer)
        if desc is None:
            log.info("uds ingress %s: unauthenticated frame from pid %s, which is not exactly "
                     "one registered agent: closed", self.path, peer.pid if peer else "?")
            return
        if frame.kind is None:
            log.info("uds ingress %s: frame asked for a kind outside the protocol", self.path)
            return
        msg = self._message(frame, _verified(desc, peer))
        try:
            admitted = self.receiver.admit(msg)
        except ReceiverUnavailable as exc:
            log.warning("uds ingress %s: %s", self.path, exc)
            return
        if isinstance(admitted, Entry):
            # The message is durable (journaled submitted), so EOF may go now: Claude's sender
            # reports a failure if the socket stays open 5 s, and its model would then resend
            # a frame that dedupe cannot catch. Injection follows in the agent's lane.
            self.lane.submit(admitted)

    def _control(self, obj: Mapping[str, Any], peer: _Peer | None) -> None:
        if self.control is None:
            log.debug("uds ingress %s: control frame %r ignored", self.path, obj.get("action"))
            return
        try:
            self.control(obj, peer.pid if peer else None, peer.start_time if peer else None)
        except Exception:
            log.exception("uds ingress %s: control frame handler failed", self.path)

    async def _receive(self, msg: Message, conn: _Conn) -> Result:
        conn.receiving = True
        try:
            return await self.receiver.receive(msg, dispatch=self.lane.dispatch)
        finally:
            conn.receiving = False

    async def _ack(self, writer: asyncio.StreamWriter, message_id: str | None, state: str,
                   reason: str | None) -> None:
        writer.write(ack_line(message_id, state, reason))
        with contextlib.suppress(OSError, TimeoutError):
            async with asyncio.timeout(self.close_grace):
                await writer.drain()

    # -- identity ----------------------------------------------------------------------------

    def _message(self, frame: UserFrame, sender: Sender) -> Message:
        assert frame.kind is not None
        return Message(
            message_id=frame.message_id or new_message_id(), sender=sender, text=frame.text,
            kind=frame.kind, native=frame.message_id is None, claimed=frame.claimed,
        )

    def _sender(self, peer: _Peer | None) -> Sender:
        desc = self._identify(peer)
        if desc is not None:
            return _verified(desc, peer)
        return Sender(agent_id=None, ingress=Ingress.UDS, peer_pid=peer.pid if peer else None)

    def _identify(self, peer: _Peer | None) -> Descriptor | None:
        """The one live descriptor this peer process is, else ``None`` (never the first of
        several: a pooled pid stays unverified)."""
        if peer is None or peer.start_time is None:
            return None
        try:
            live = self.registry.live()
        except OSError as exc:
            log.warning("uds ingress %s: cannot read the registry: %s", self.path, exc)
            return None
        found = [d for d in live if matches_peer(d, peer.pid, peer.start_time)]
        return found[0] if len(found) == 1 else None

    def _token_ok(self, token: str) -> bool:
        stored = self._read_key(check_mode=True)
        return bool(stored) and stored is not None and hmac.compare_digest(
            stored.encode(), token.encode())

    def _read_key(self, *, check_mode: bool) -> str | None:
        """The key file's content, or ``None`` if it is missing or (``check_mode``) is not a
        regular 0600 file owned by us — then it is refused, never trusted."""
        try:
            fd = os.open(self.key_path,
                         os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None
            if check_mode and (stat.S_IMODE(st.st_mode) != PRIVATE_FILE_MODE
                               or st.st_uid != os.getuid()):
                if not self._key_warned:
                    self._key_warned = True
                    log.warning("uds ingress %s: key file %s is not a 0600 file of ours; "
                                "refusing every authentication", self.path, self.key_path)
                return None
            raw = os.read(fd, _KEY_READ_LIMIT)
        except OSError:
            return None
        finally:
            os.close(fd)
        try:
            return raw.decode("ascii").strip()
        except UnicodeDecodeError:
            return None


def _verified(desc: Descriptor, peer: _Peer | None) -> Sender:
    """Identity from the registration, never from the frame."""
    return Sender(agent_id=desc.agent_id, name=desc.name, role=desc.role, ingress=Ingress.UDS,
                  peer_pid=peer.pid if peer else None, reply_address=desc.uds_path)


def _peer(writer: asyncio.StreamWriter) -> _Peer | None:
    """The kernel's word on who connected, with the pid's start time read right now."""
    sock = writer.get_extra_info("socket")
    if sock is None:
        return None
    try:
        creds = proc.peer_credentials(sock)
    except OSError:
        return None
    return _Peer(creds.pid, creds.uid, proc.process_start_time(creds.pid))


def _private_dir(directory: Path) -> None:
    """Create the socket directory 0700, or refuse one that is not ours or not private."""
    try:
        directory.mkdir(mode=PRIVATE_DIR_MODE, parents=True)
    except FileExistsError:
        pass
    else:
        os.chmod(directory, PRIVATE_DIR_MODE)  # mkdir's mode is filtered by the umask
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode):
        raise IngressError(f"{directory} is not a directory")
    if st.st_uid != os.getuid():
        raise IngressError(f"{directory} is owned by uid {st.st_uid}, not by us")
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise IngressError(f"{directory} is not private (mode {stat.S_IMODE(st.st_mode):o}); "
                           "the socket directory must be mode 0700")


def _clear_stale_socket(path: Path) -> None:
    """Remove a dead socket left by a crash; refuse a live one or a non-socket file."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise IngressError(f"{path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(os.fspath(path))
    except ConnectionRefusedError:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    except FileNotFoundError:
        return
    except OSError as exc:
        raise IngressError(f"cannot tell whether {path} is in use: {exc}") from exc
    finally:
        probe.close()
    raise IngressError(f"another process is listening on {path}")
