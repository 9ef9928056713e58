"""Claude Code's session registry, read-only (research ``claude-code.md`` §2-§4, §10).

Every running Claude Code session writes ``<configDir>/sessions/<pid>.json`` (its record) and
``<configDir>/sessions/<pid>.<sha256hex(socket path)>.key`` (the inbox's ``peerToken``). This
module reads them the way Claude's own listers do and never writes, renames or deletes anything
there: a stale record is skipped, not cleaned up (that is Claude's business).

Facts the code depends on:

* Only names matching ``^\\d+\\.json$`` (ASCII digits) are records; at most 262144 bytes.
* Claude rewrites a record *in place* (read-modify-write, not temp+rename) on every status and
  name change, so a reader can see a torn file; like Claude, re-read after ~25 ms.
* ``status`` is ``idle|busy|shell|waiting`` (``waiting`` carries ``waitingFor``). ``sdk-cli``
  sessions may have no status at all: that is ``"unknown"``, never ``"idle"`` (seed 004).
* A crashed session leaves its record with a frozen status, so a record is trusted only while
  its process is: same ``pidDomain``, pid alive, and the pid's current start time equals the
  record's ``procStartFt ?? procStart`` (a recycled pid has another start time).
* The name is rewritten ~0.2 s after start and ``/clear`` rewrites the record with a new
  ``sessionId`` (same pid, socket and key): read the record on every use, never once.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, cast

from crosstalk import proc

#: Claude's reader ignores records larger than this (``Ol = 262144``).
MAX_RECORD_BYTES: Final = 262_144
#: A key file is ~150 bytes; anything much larger is not one.
MAX_KEY_BYTES: Final = 4096
#: Claude's torn-record re-read delay.
RETRY_DELAY: Final = 0.025
#: The record cache of :class:`SessionBinding` trusts (mtime, size, inode) only for a file
#: last modified at least this long ago: two rewrites of the same size within one timestamp
#: tick ("idle" -> "busy") are indistinguishable by stat (git's "racily clean" problem).
RACY_WINDOW_NS: Final = 2_000_000_000

Status = Literal["idle", "busy", "shell", "waiting", "unknown"]
#: Whether a Claude session record's process is running (Claude's own three answers).
SessionLiveness = Literal["live", "dead", "foreign"]

_STATUSES: Final[frozenset[str]] = frozenset({"idle", "busy", "shell", "waiting"})
# fullmatch with explicit ASCII classes: Python's \d also matches other scripts' digits and
# "$" matches before a trailing newline; JS's /^\d+\.json$/ does neither.
_RECORD_NAME: Final = re.compile(r"[0-9]+\.json")
_PEER_TOKEN: Final = re.compile(r"[0-9a-f]{32}")
_PEER_FEATURE: Final = re.compile(r"[a-z0-9_]{1,32}")
_MAX_PEER_FEATURES: Final = 16

#: What :func:`read_record` sleeps with between attempts (tests replace it).
_sleep = time.sleep


class RecordError(ValueError):
    """Bytes that are not a well-formed Claude session record (possibly a torn one)."""


@dataclass(frozen=True, kw_only=True)
class ClaudeSession:
    """One parsed ``<configDir>/sessions/<pid>.json`` record.

    Optional fields are ``None`` when the record lacks them (or has ``null``). Times are
    milliseconds since the epoch, as Claude writes them.
    """

    pid: int
    session_id: str
    config_dir: Path
    record_path: Path
    status: Status = "unknown"
    waiting_for: str | None = None
    cwd: str | None = None
    name: str | None = None
    name_source: str | None = None
    kind: str | None = None
    entrypoint: str | None = None
    socket_path: Path | None = None
    #: ``messagingSocketPath`` exactly as written (the key file name hashes this string; a
    #: ``Path`` would normalise away a doubled slash). ``None`` when there is no socket.
    messaging_socket_path: str | None = None
    proc_start: str | None = None
    #: Windows writes its FILETIME start here; when present it wins (``procStartFt ?? procStart``).
    proc_start_ft: str | None = None
    pid_domain: str | None = None
    started_at: int | None = None
    updated_at: int | None = None
    status_updated_at: int | None = None
    version: str | None = None
    peer_protocol: int | None = None
    peer_features: tuple[str, ...] = ()
    #: Pre-started spare processes (``spare: true``) and parked jobs (``parkedJobId``) are not
    #: sessions anyone addresses; Claude's ListAgents hides them and so does :func:`discover`.
    spare: bool = False
    parked_job_id: str | None = None

    @property
    def recorded_start(self) -> str | None:
        """The start time the liveness check compares: ``procStartFt ?? procStart``."""
        return self.proc_start_ft if self.proc_start_ft is not None else self.proc_start

    @property
    def key_path(self) -> Path | None:
        """``<config_dir>/sessions/<pid>.<sha256hex(socket path)>.key`` (``None``: no socket)."""
        text = self.messaging_socket_path
        if text is None:
            if self.socket_path is None:
                return None
            text = str(self.socket_path)
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        return self.config_dir / "sessions" / f"{self.pid}.{digest}.key"


# -- config roots ------------------------------------------------------------------------------


def config_dirs(env: Mapping[str, str]) -> list[Path]:
    """Every Claude config root to read, in priority order, de-duplicated by resolved path.

    ``$CLAUDE_CONFIG_DIR`` (if set and non-empty), ``~/.claude``, then each directory in
    ``~/.claude-profiles/`` in name order (hidden entries skipped), with ``~`` = ``HOME`` from
    ``env``. The first two are listed whether or not they exist (readers tolerate a missing
    ``sessions`` directory); a profile that is a symlink to another root appears once, under
    the earlier name.
    """
    home = Path(env.get("HOME") or str(Path.home()))

    def expand(value: str) -> Path:
        if value == "~" or value.startswith("~/"):
            return home / value[2:]
        return Path(value)

    candidates: list[Path] = []
    configured = env.get("CLAUDE_CONFIG_DIR")
    if configured:
        candidates.append(expand(configured))
    candidates.append(home / ".claude")
    profiles = home / ".claude-profiles"
    try:
        entries = sorted(os.scandir(profiles), key=lambda e: e.name)
    except OSError:
        entries = []
    for entry in entries:
        try:
            is_dir = entry.is_dir()  # follows symlinks: a linked profile is still a profile
        except OSError:
            continue
        if is_dir and not entry.name.startswith("."):
            candidates.append(profiles / entry.name)

    seen: set[Path] = set()
    result: list[Path] = []
    for candidate in candidates:
        absolute = candidate if candidate.is_absolute() else Path.cwd() / candidate
        try:
            identity = absolute.resolve()
        except (OSError, RuntimeError):  # a symlink loop (RuntimeError before 3.13)
            identity = Path(os.path.abspath(absolute))
        if identity not in seen:
            seen.add(identity)
            result.append(absolute)
    return result


# -- parsing -----------------------------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _text(value: str, key: str) -> str:
    try:
        value.encode("utf-8")  # lone surrogates (from "\ud800" escapes) cannot be hashed or used
    except UnicodeEncodeError:
        raise RecordError(f"{key} is not valid Unicode") from None
    return value


def _opt_str(obj: Mapping[str, Any], key: str) -> str | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise RecordError(f"{key} must be a string, not {type(value).__name__}")
    return _text(value, key)


def _opt_int(obj: Mapping[str, Any], key: str) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RecordError(f"{key} must be an integer, not {type(value).__name__}")
    return value


def _status(obj: Mapping[str, Any]) -> Status:
    value = _opt_str(obj, "status")
    if value in _STATUSES:
        return cast(Status, value)
    # Missing (sdk-cli sessions) or a status from a newer Claude: we do not know. Never "idle".
    return "unknown"


def _peer_features(obj: Mapping[str, Any]) -> tuple[str, ...]:
    value = obj.get("peerFeatures")
    if value is None:
        return ()
    if not isinstance(value, list):
        raise RecordError("peerFeatures must be a list")
    # Like Claude's reader: keep well-formed names only, at most 16.
    kept = [f for f in value if isinstance(f, str) and _PEER_FEATURE.fullmatch(f)]
    return tuple(kept[:_MAX_PEER_FEATURES])


def _socket(obj: Mapping[str, Any]) -> str | None:
    value = _opt_str(obj, "messagingSocketPath")
    if not value:
        return None  # Claude's reader maps a missing socket to "": no inbox
    if "\0" in value:
        raise RecordError("messagingSocketPath contains NUL")
    if not value.startswith("/"):
        raise RecordError("messagingSocketPath is not absolute")
    return value


def parse_record(raw: bytes, *, config_dir: Path, path: Path) -> ClaudeSession:
    """Parse a record's bytes; raise :class:`RecordError` (only) on anything malformed.

    Checked: size ≤ 262144 bytes; strict UTF-8; one JSON object (no NaN/Infinity); the file is
    named ``<pid>.json`` with exactly the record's ``pid`` (a positive integer, not a bool);
    ``sessionId`` is a non-empty string; every known field has its JSON type (``null`` counts
    as absent); ``messagingSocketPath`` is absolute without NUL. Unknown fields are ignored, an
    unknown ``status`` value is ``"unknown"`` and ill-formed ``peerFeatures`` entries are
    dropped (as Claude's reader does), so a newer Claude's record still parses.
    """
    if len(raw) > MAX_RECORD_BYTES:
        raise RecordError(f"record is {len(raw)} bytes (> {MAX_RECORD_BYTES})")
    if not _RECORD_NAME.fullmatch(path.name):
        raise RecordError(f"{path.name!r} is not a record name")
    try:
        obj = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise RecordError(f"not JSON: {type(exc).__name__}") from None
    if not isinstance(obj, dict):
        raise RecordError("record is not a JSON object")

    pid = obj.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        raise RecordError("pid must be a positive integer")
    if path.name != f"{pid}.json":
        raise RecordError(f"pid {pid} does not match the file name {path.name!r}")
    session_id = _opt_str(obj, "sessionId")
    if not session_id:
        raise RecordError("sessionId must be a non-empty string")
    socket_text = _socket(obj)
    return ClaudeSession(
        pid=pid,
        session_id=session_id,
        config_dir=config_dir,
        record_path=path,
        status=_status(obj),
        waiting_for=_opt_str(obj, "waitingFor"),
        cwd=_opt_str(obj, "cwd"),
        name=_opt_str(obj, "name"),
        name_source=_opt_str(obj, "nameSource"),
        kind=_opt_str(obj, "kind"),
        entrypoint=_opt_str(obj, "entrypoint"),
        socket_path=None if socket_text is None else Path(socket_text),
        messaging_socket_path=socket_text,
        proc_start=_opt_str(obj, "procStart"),
        proc_start_ft=_opt_str(obj, "procStartFt"),
        pid_domain=_opt_str(obj, "pidDomain"),
        started_at=_opt_int(obj, "startedAt"),
        updated_at=_opt_int(obj, "updatedAt"),
        status_updated_at=_opt_int(obj, "statusUpdatedAt"),
        version=_opt_str(obj, "version"),
        peer_protocol=_opt_int(obj, "peerProtocol"),
        peer_features=_peer_features(obj),
        spare=obj.get("spare") is True,
        parked_job_id=_opt_str(obj, "parkedJobId"),
    )


# -- reading -----------------------------------------------------------------------------------


class _Torn:
    """Marker: the file exists but did not parse (maybe mid-rewrite); worth another read."""


_TORN: Final = _Torn()


def _read_regular(path: Path, limit: int, *, follow: bool) -> bytes | None:
    """Up to ``limit`` bytes of a regular file; ``None`` if it is not one.

    O_NONBLOCK + S_ISREG: a FIFO or device planted under a record name must not hang a scan.
    Raises ``OSError`` (``FileNotFoundError`` when it is gone).
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks: list[bytes] = []
        size = 0
        while size < limit:
            chunk = os.read(fd, limit - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _read_once(path: Path) -> ClaudeSession | _Torn | None:
    if not _RECORD_NAME.fullmatch(path.name):
        return None
    try:
        raw = _read_regular(path, MAX_RECORD_BYTES + 1, follow=True)
    except OSError:
        return None  # gone, unreadable (EACCES), a directory, a symlink loop...
    if raw is None:
        return None
    try:
        return parse_record(raw, config_dir=path.parent.parent, path=path)
    except RecordError:
        return _TORN


def _read_many(paths: Sequence[Path], retries: int, delay: float) -> list[ClaudeSession | None]:
    """Read several records; torn ones are re-read together (a scan sleeps ≤ ``retries`` times)."""
    results: list[ClaudeSession | None] = [None] * len(paths)
    pending = list(range(len(paths)))
    for attempt in range(max(retries, 0) + 1):
        if attempt:
            _sleep(delay)
        torn: list[int] = []
        for i in pending:
            got = _read_once(paths[i])
            if isinstance(got, _Torn):
                torn.append(i)
            else:
                results[i] = got
        pending = torn
        if not pending:
            break
    return results


def read_record(
    path: Path, *, retries: int = 3, delay: float = RETRY_DELAY
) -> ClaudeSession | None:
    """Read and parse one record, tolerating Claude's in-place rewrites. Never raises on content.

    Content that does not parse is re-read up to ``retries`` more times, ``delay`` seconds
    apart (a torn file is usually whole again within one Claude write). Returns ``None`` when
    the file is missing (or vanishes between attempts), is still malformed after the last
    attempt, is not a regular file, has a name other than ``<digits>.json``, or cannot be read
    for any other ``OSError`` (permission denied, ...): the caller learns "no usable record",
    not why. The record's ``config_dir`` is ``path.parent.parent``.
    """
    return _read_many([path], retries, delay)[0]


# -- liveness ----------------------------------------------------------------------------------


def liveness(s: ClaudeSession) -> SessionLiveness:
    """Whether the record's process is running, as Claude's listers decide it.

    ``"foreign"``: the record names another pid domain (pid namespace / machine), so its pid
    cannot be checked from here. Otherwise ``"live"`` iff the pid is alive and its current start
    time equals ``procStartFt ?? procStart``; ``"dead"`` if not, and also when the record carries
    no start time at all (then a recycled pid cannot be told apart, and a crashed session's
    frozen status must not pass for live). A record without ``pidDomain`` is checked as ours,
    like CrossTalk's own descriptors.
    """
    if s.pid_domain is not None and s.pid_domain != proc.pid_domain():
        return "foreign"
    return "live" if proc.process_matches(s.pid, s.recorded_start) else "dead"


def _record_paths(sessions: Path) -> list[Path]:
    try:
        names = sorted(e.name for e in os.scandir(sessions) if _RECORD_NAME.fullmatch(e.name))
    except OSError:
        return []
    return [sessions / name for name in names]


def discover(
    env: Mapping[str, str], *, retries: int = 3, delay: float = RETRY_DELAY
) -> list[ClaudeSession]:
    """Every live Claude session in every config root of :func:`config_dirs`, sorted by pid.

    A record seen under several roots (profiles sharing one ``sessions`` directory through a
    symlink) is listed once — same pid, sessionId and socket — with the earliest root as its
    ``config_dir``. Dead and foreign records, spares and parked jobs are skipped; nothing is
    deleted. Torn records are re-read (all of them together, ``retries`` times at most).
    """
    paths = [p for root in config_dirs(env) for p in _record_paths(root / "sessions")]
    seen: set[tuple[int, str, str | None]] = set()
    found: list[ClaudeSession] = []
    for s in _read_many(paths, retries, delay):
        if s is None or s.spare or s.parked_job_id is not None:
            continue
        identity = (s.pid, s.session_id, s.messaging_socket_path)
        if identity in seen or liveness(s) != "live":
            continue
        seen.add(identity)
        found.append(s)
    found.sort(key=lambda s: s.pid)  # stable: ties keep config-root order
    return found


# -- the shim's own session --------------------------------------------------------------------


class SessionBinding:
    """The Claude session a shim (a child of Claude: ``ppid`` = Claude's pid) belongs to.

    Reads ``<config_dir>/sessions/<ppid>.json`` on each :meth:`current` call, but re-parses it
    only when its (mtime_ns, size, inode) changed since the last read — or when that last
    read is within :data:`RACY_WINDOW_NS` of the file's mtime, since a same-size rewrite in the
    same timestamp tick would not change the stat. The record wins over
    ``CLAUDE_CODE_SESSION_ID``: after ``/clear`` the environment is stale, the record is not.
    Blocking file I/O (up to ~75 ms of retry sleeps on a torn record): from an event loop, call
    it in a worker thread. Not thread-safe; one binding per caller.
    """

    def __init__(self, config_dir: Path, ppid: int) -> None:
        self.config_dir = config_dir
        self.ppid = ppid
        self.path = config_dir / "sessions" / f"{ppid}.json"
        self._key: tuple[int, int, int] | None = None
        self._cached: ClaudeSession | None = None

    def current(self) -> ClaudeSession | None:
        """The parent's record as it is now; ``None`` if missing, unreadable or not the parent's.

        A record at ``<ppid>.json`` whose start time is not the running parent's (a crashed
        earlier process that had the same pid) is ``None``, never a binding.
        """
        try:
            st = os.stat(self.path)
        except OSError:
            self._key, self._cached = None, None
            return None
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        if self._key is not None and key == self._key:
            return self._cached
        session = read_record(self.path)
        if session is None:
            # Missing or torn past the retries: no answer now, and nothing worth caching.
            self._key, self._cached = None, None
            return None
        if liveness(session) != "live":
            session = None
        settled = time.time_ns() - st.st_mtime_ns >= RACY_WINDOW_NS
        self._key, self._cached = (key if settled else None), session
        return session

    def superseded(self, session_id: str) -> bool | None:
        """Whether the parent's record now names another session (``/clear``, ``/resume``).

        ``True``: it parses and names another sessionId; ``False``: it names this one;
        ``None``: missing, unreadable or stale — no evidence either way.
        """
        session = self.current()
        if session is None:
            return None
        return session.session_id != session_id


# -- key files ---------------------------------------------------------------------------------


def read_peer_token(s: ClaudeSession) -> str | None:
    """The inbox ``peerToken`` from the session's key file, or ``None``.

    ``None`` when there is no socket, the file is missing, not a regular file (a symlink is
    refused), over 4096 bytes, not a JSON object, the token is not 32 lowercase hex digits, or
    the key names another process than the record (``procStartFt ?? procStart`` or
    ``pidDomain`` both present and different). The token is a credential: never log it.
    """
    path = s.key_path
    if path is None:
        return None
    try:
        raw = _read_regular(path, MAX_KEY_BYTES + 1, follow=False)
    except OSError:
        return None
    if raw is None or len(raw) > MAX_KEY_BYTES:
        return None
    try:
        obj = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    token = obj.get("peerToken")
    if not isinstance(token, str) or not _PEER_TOKEN.fullmatch(token):
        return None
    key_start = obj.get("procStartFt")
    if key_start is None:
        key_start = obj.get("procStart")
    for theirs, ours in ((key_start, s.recorded_start), (obj.get("pidDomain"), s.pid_domain)):
        if isinstance(theirs, str) and ours is not None and theirs != ours:
            return None
    return token
