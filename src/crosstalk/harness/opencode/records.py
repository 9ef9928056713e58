"""The instance records CrossTalk's opencode plugin publishes, read and checked.

Per opencode *instance* (process x directory) the plugin writes ``<pid>-<dirhash>.json`` and
serves the instance's HTTP API on the ``.sock`` the record names, both under
``<state dir>/opencode/`` (the socket elsewhere if that path is too long). opencode itself
advertises nothing (research §2), so these files are the only way in. They are also claims:
anyone who can write the directory could write one. So a record is used only when:

- it parses as the plugin's format and version, with every field the right type;
- its pid is alive and its process start time is the recorded one (not a recycled pid);
- the socket it names is a socket owned by us, mode 0600 (a socket another user placed, or a
  world-writable one, is not the plugin's);
- the socket accepts a connection.

Whether the socket speaks opencode's API (``/global/health``) is asked over HTTP by the
callers (:mod:`.http`). Every failure is a :class:`RecordError` with a short reason, never a
crash: a torn record (written in place by hand) reads as ``torn_record``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import socket
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from crosstalk import proc
from crosstalk.config import state_dir

FORMAT = "crosstalk-opencode-instance"
VERSION = 1
#: A record larger than this is not one the plugin wrote (it writes ~300 bytes).
MAX_RECORD_BYTES = 16 * 1024
#: A connect to a live instance's socket answers at once; longer means nobody accepts.
CONNECT_TIMEOUT = 1.0


class RecordError(Exception):
    """A record that cannot be used, with the reason (``torn_record``, ``pid_gone``, ...)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail = reason, detail


@dataclass(frozen=True)
class InstanceRecord:
    """One opencode instance as its plugin published it."""

    pid: int
    process_start: str
    directory: str
    socket: str
    opencode_version: str | None
    written_at: float
    #: Where the record was read from.
    path: str

    @property
    def written_ms(self) -> int:
        """``written_at`` on opencode's own clock: whole milliseconds (``Date.now()``), so a
        session stored in the same millisecond as the record counts as after it."""
        return math.floor(self.written_at * 1000)


def records_dir(env: Mapping[str, str]) -> Path:
    """``<state dir>/opencode`` (state dir as :func:`crosstalk.config.state_dir`)."""
    return state_dir(dict(env)) / "opencode"


def record_stem(pid: int, directory: str) -> str:
    """``<pid>-<first 12 hex of sha256(directory)>``: one name per process x directory (a
    pid alone collides: one ``serve`` hosts several directories, research §3)."""
    return f"{pid}-{hashlib.sha256(directory.encode()).hexdigest()[:12]}"


def parse_record(raw: bytes, path: str) -> InstanceRecord:
    """The record in ``raw``, validated for shape only (liveness is :func:`check_live`)."""
    if len(raw) > MAX_RECORD_BYTES:
        raise RecordError("forged_record", f"{len(raw)} bytes")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise RecordError("torn_record", path) from None
    if not isinstance(doc, dict):
        raise RecordError("forged_record", "not an object")
    if doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise RecordError("unknown_record_format",
                          f"{str(doc.get('format'))[:64]} v{str(doc.get('version'))[:8]}")
    pid, start = doc.get("pid"), doc.get("process_start")
    directory, sock = doc.get("directory"), doc.get("socket")
    version, written = doc.get("opencode_version"), doc.get("written_at")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        raise RecordError("forged_record", "pid")
    if not isinstance(start, str) or not start.isdigit():
        raise RecordError("forged_record", "process_start")
    for name, value in (("directory", directory), ("socket", sock)):
        if not isinstance(value, str) or not os.path.isabs(value) or "\0" in value:
            raise RecordError("forged_record", name)
    if version is not None and not isinstance(version, str):
        raise RecordError("forged_record", "opencode_version")
    if isinstance(written, bool) or not isinstance(written, (int, float)):
        raise RecordError("forged_record", "written_at")
    assert isinstance(directory, str)  # checked above
    assert isinstance(sock, str)
    if Path(path).stem != record_stem(pid, directory):
        raise RecordError("forged_record", "file name does not match pid and directory")
    return InstanceRecord(pid, start, directory, sock, version, float(written), path)


def read_record(path: Path) -> InstanceRecord:
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_RECORD_BYTES + 1)
    except FileNotFoundError:
        raise RecordError("no_record", str(path)) from None
    except OSError as exc:
        raise RecordError("unreadable_record", f"{path}: {exc.strerror}") from None
    return parse_record(raw, str(path))


def check_live(record: InstanceRecord) -> None:
    """Raise :class:`RecordError` unless the record's process and socket are live and ours."""
    if not proc.process_matches(record.pid, record.process_start):
        reason = "pid_gone" if not proc.pid_alive(record.pid) else "process_start_mismatch"
        raise RecordError(reason, str(record.pid))
    check_socket(record.socket)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(CONNECT_TIMEOUT)
            s.connect(record.socket)
    except OSError as exc:
        raise RecordError("socket_refused", exc.strerror or type(exc).__name__) from None


def check_socket(path: str) -> None:
    """The path is a unix socket owned by this user, with no access for others."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise RecordError("socket_missing", path) from None
    except OSError as exc:
        raise RecordError("socket_missing", f"{path}: {exc.strerror}") from None
    if not stat.S_ISSOCK(st.st_mode):
        raise RecordError("socket_not_ours", "not a socket")
    if st.st_uid != os.getuid():
        raise RecordError("socket_not_ours", f"owned by uid {st.st_uid}")
    if st.st_mode & 0o077:
        raise RecordError("socket_not_ours", f"mode {stat.S_IMODE(st.st_mode):o}")


@dataclass(frozen=True)
class Scanned:
    """One record file: the live record, or why it is not usable."""

    path: str
    record: InstanceRecord | None
    reason: str | None = None
    #: What the reason is about (a field, a pid, an errno), for people (``doctor``).
    detail: str = ""
    #: The record as read when it reads but is not live (a stale one, a dead socket).
    parsed: InstanceRecord | None = None


def scan(env: Mapping[str, str]) -> Iterator[Scanned]:
    """Every ``*.json`` in the records directory, checked (blocking: file reads, connects)."""
    folder = records_dir(env)
    names: list[str] = []
    with contextlib.suppress(OSError):
        names = sorted(n for n in os.listdir(folder) if n.endswith(".json"))
    for name in names:
        path = folder / name
        parsed = None
        try:
            parsed = read_record(path)
            check_live(parsed)
        except RecordError as exc:
            yield Scanned(str(path), None, exc.reason, exc.detail, parsed)
            continue
        yield Scanned(str(path), parsed)


def live_records(env: Mapping[str, str]) -> list[InstanceRecord]:
    return [s.record for s in scan(env) if s.record is not None]


def host_record(env: Mapping[str, str], pid: int, directory: str) -> InstanceRecord:
    """The live record of the instance ``pid`` x ``directory`` (a shim's own host).

    The shim's cwd is a resolved path; if opencode's instance directory was not (a symlink
    on the way), the record is found among the pid's records by resolved directory."""
    try:
        record = read_record(records_dir(env) / f"{record_stem(pid, directory)}.json")
    except RecordError as exc:
        if exc.reason != "no_record":
            raise
        record = _by_resolved_directory(env, pid, directory) or _raise(exc)
    check_live(record)
    return record


def _by_resolved_directory(env: Mapping[str, str], pid: int,
                           directory: str) -> InstanceRecord | None:
    folder = records_dir(env)
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir(folder)):
            if not (name.startswith(f"{pid}-") and name.endswith(".json")):
                continue
            with contextlib.suppress(RecordError, OSError):
                record = read_record(folder / name)
                if os.path.realpath(record.directory) == os.path.realpath(directory):
                    return record
    return None


def _raise(exc: RecordError) -> InstanceRecord:
    raise exc
