"""Claude Code's session registry, read-only (research claude-code.md §2-§4, §10; seeds 001, 004).

Fake config roots in tmp_path hold records for real processes: this test process, live and then
reaped children, a recycled pid (wrong procStart), another pid domain, torn and garbage files.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from crosstalk import proc
from crosstalk.harness.claude import registry
from crosstalk.harness.claude.registry import (
    ClaudeSession,
    RecordError,
    SessionBinding,
    config_dirs,
    discover,
    liveness,
    parse_record,
    read_peer_token,
    read_record,
)

SLEEPER = "import sys; sys.stdout.write('up\\n'); sys.stdout.flush(); sys.stdin.read()"
OTHER_DOMAIN = "linux:0123456789abcdef0123456789abcdef:pid:[4026531999]"
TOKEN = "e6f3a7f4e6776b93802c6cd1c22b8868"
SID_A = "4b22009a-0000-4000-8000-00000000000a"
SID_B = "4b22009a-0000-4000-8000-00000000000b"


def _start(pid: int) -> str:
    started = proc.process_start_time(pid)
    assert started is not None
    return started


def record(pid: int, **fields: Any) -> dict[str, Any]:
    """A record shaped like the live one in research §2, for a process that really exists."""
    obj: dict[str, Any] = {
        "pid": pid,
        "sessionId": SID_A,
        "cwd": "/work",
        "startedAt": 1796053718467,
        "procStart": proc.process_start_time(pid),
        "version": "2.1.328",
        "peerProtocol": 1,
        "peerFeatures": ["notify_idle", "reply_across_default_dirs", "artifact_yield"],
        "kind": "interactive",
        "entrypoint": "cli",
        "pidDomain": proc.pid_domain(),
        "asksForConvertedSkills": None,
        "messagingSocketPath": f"/tmp/cc-socks/{pid}.sock",
        "name": "work-cf",
        "nameSource": "derived",
        "nameSince": 1796053718467,
        "status": "idle",
        "updatedAt": 1796053718500,
        "statusUpdatedAt": 1796053718501,
    }
    for key, value in fields.items():
        if value is ...:
            obj.pop(key, None)
        else:
            obj[key] = value
    return obj


def write(sessions: Path, name: str | int, content: dict[str, Any] | bytes) -> Path:
    sessions.mkdir(parents=True, exist_ok=True)
    path = sessions / (f"{name}.json" if isinstance(name, int) else name)
    path.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    return path


def rewrite_in_place(path: Path, content: bytes) -> None:
    """What Claude does: same inode, truncate and write (not temp+rename)."""
    with path.open("r+b") as f:
        f.truncate(0)
        f.write(content)


def set_mtime(path: Path, ns: int) -> None:
    os.utime(path, ns=(ns, ns))


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "home"
    (h / ".claude" / "sessions").mkdir(parents=True)
    return h


@pytest.fixture
def env(home: Path) -> dict[str, str]:
    return {"HOME": str(home)}


@pytest.fixture
def sessions(home: Path) -> Path:
    return home / ".claude" / "sessions"


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Replace the retry sleep: record each delay instead of waiting."""
    calls: list[float] = []
    monkeypatch.setattr(registry, "_sleep", calls.append)
    return calls


def _spawn() -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", SLEEPER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    assert child.stdout.readline() == "up\n"
    return child


def _reap(child: subprocess.Popen[str]) -> None:
    child.kill()
    child.wait(timeout=30)
    for stream in (child.stdin, child.stdout):
        if stream is not None:
            stream.close()


@pytest.fixture
def children() -> Iterator[Callable[[], subprocess.Popen[str]]]:
    spawned: list[subprocess.Popen[str]] = []

    def make() -> subprocess.Popen[str]:
        spawned.append(_spawn())
        return spawned[-1]

    yield make
    for child in spawned:
        _reap(child)


def parse(obj: dict[str, Any] | bytes, name: str | None = None) -> ClaudeSession:
    raw = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    if name is None:
        assert isinstance(obj, dict)
        name = f"{obj['pid']}.json"
    cfg = Path("/cfg")
    return parse_record(raw, config_dir=cfg, path=cfg / "sessions" / name)


# -- config roots ------------------------------------------------------------------------------


def test_config_dirs_order_profiles_and_dedup(home: Path) -> None:
    profiles = home / ".claude-profiles"
    for name in ("work", "alpha", ".hidden"):
        (profiles / name).mkdir(parents=True)
    (profiles / "notes.txt").write_text("not a profile")
    (profiles / "same-as-default").symlink_to(home / ".claude")  # the same root under two names
    (profiles / "dangling").symlink_to(home / "nowhere")
    custom = home / "custom"
    got = config_dirs({"HOME": str(home), "CLAUDE_CONFIG_DIR": str(custom)})
    assert got == [custom, home / ".claude", profiles / "alpha", profiles / "work"]


def test_config_dirs_env_var_naming_the_default_root_is_listed_once(home: Path) -> None:
    assert config_dirs({"HOME": str(home), "CLAUDE_CONFIG_DIR": "~/.claude"}) == [home / ".claude"]
    link = home / "link-to-claude"
    link.symlink_to(home / ".claude")
    assert config_dirs({"HOME": str(home), "CLAUDE_CONFIG_DIR": str(link)}) == [link]


def test_config_dirs_empty_env_var_and_no_profiles(home: Path) -> None:
    assert config_dirs({"HOME": str(home), "CLAUDE_CONFIG_DIR": ""}) == [home / ".claude"]
    # HOME comes from the mapping, not from this process's environment.
    other = home / "elsewhere"
    assert config_dirs({"HOME": str(other)}) == [other / ".claude"]


# -- parsing -----------------------------------------------------------------------------------


def test_parse_the_live_example_record() -> None:
    obj = record(11658, procStart="36592", pidDomain="linux:m:pid:[4026531836]",
                 unknownFutureField={"x": [1, 2]}, waitingFor=None)
    s = parse(obj)
    assert s.pid == 11658
    assert s.session_id == SID_A
    assert (s.cwd, s.name, s.name_source) == ("/work", "work-cf", "derived")
    assert (s.status, s.waiting_for) == ("idle", None)
    assert (s.kind, s.entrypoint, s.version) == ("interactive", "cli", "2.1.328")
    assert s.socket_path == Path("/tmp/cc-socks/11658.sock")
    assert s.messaging_socket_path == "/tmp/cc-socks/11658.sock"
    assert (s.proc_start, s.proc_start_ft, s.recorded_start) == ("36592", None, "36592")
    assert s.pid_domain == "linux:m:pid:[4026531836]"
    assert (s.started_at, s.updated_at, s.status_updated_at) == (
        1796053718467, 1796053718500, 1796053718501)
    assert s.peer_protocol == 1
    assert s.peer_features == ("notify_idle", "reply_across_default_dirs", "artifact_yield")
    assert (s.spare, s.parked_job_id) == (False, None)
    assert s.config_dir == Path("/cfg")
    assert s.record_path == Path("/cfg/sessions/11658.json")
    digest = hashlib.sha256(b"/tmp/cc-socks/11658.sock").hexdigest()
    assert s.key_path == Path(f"/cfg/sessions/11658.{digest}.key")


def test_parse_waiting_carries_waiting_for() -> None:
    s = parse(record(7, status="waiting", waitingFor="permission prompt"))
    assert (s.status, s.waiting_for) == ("waiting", "permission prompt")
    assert parse(record(7, status="shell")).status == "shell"
    assert parse(record(7, status="busy")).status == "busy"


@pytest.mark.parametrize("status", [..., None, "compacting", "IDLE", ""])
def test_parse_missing_or_unknown_status_is_unknown_never_idle(status: Any) -> None:
    # (g) sdk-cli sessions write no status; a status from a newer Claude is not ours to guess.
    s = parse(record(7, entrypoint="sdk-cli", status=status))
    assert s.status == "unknown"
    assert s.entrypoint == "sdk-cli"


def test_parse_minimal_record() -> None:
    s = parse({"pid": 5, "sessionId": "x"})
    assert (s.pid, s.session_id, s.status) == (5, "x", "unknown")
    assert (s.socket_path, s.key_path, s.proc_start, s.pid_domain) == (None, None, None, None)
    assert s.peer_features == ()


def test_parse_peer_features_kept_like_claude() -> None:
    features = ["ok_1", "Bad", "", "x" * 33, 5, None, *(f"f{i}" for i in range(20))]
    s = parse(record(7, peerFeatures=features))
    assert s.peer_features == ("ok_1", *(f"f{i}" for i in range(15)))


def test_parse_socket_path_kept_verbatim_for_the_key_name() -> None:
    # A Path would normalise "//" away; the key file name hashes the string Claude wrote.
    s = parse(record(7, messagingSocketPath="/run/user/1000//cc-socks/7.sock"))
    assert s.messaging_socket_path == "/run/user/1000//cc-socks/7.sock"
    digest = hashlib.sha256(b"/run/user/1000//cc-socks/7.sock").hexdigest()
    assert s.key_path == Path(f"/cfg/sessions/7.{digest}.key")
    assert parse(record(7, messagingSocketPath="")).socket_path is None


def test_parse_spare_and_parked() -> None:
    assert parse(record(7, spare=True)).spare is True
    assert parse(record(7, spare="yes")).spare is False  # Claude: spare === true
    assert parse(record(7, parkedJobId="e622614e")).parked_job_id == "e622614e"


MALFORMED: list[tuple[str, bytes]] = [
    ("empty", b""),
    ("torn", json.dumps(record(7)).encode()[:40]),
    ("trailing garbage", json.dumps(record(7)).encode() + b"tus\":\"idle\"}"),
    ("array", b"[1, 2]"),
    ("string", b'"7.json"'),
    ("null", b"null"),
    ("not utf-8", b'{"pid": 7, "sessionId": "\xff"}'),
    ("utf-16", json.dumps(record(7)).encode("utf-16")),
    ("bom", b"\xef\xbb\xbf" + json.dumps(record(7)).encode()),
    ("NaN", b'{"pid": 7, "sessionId": "x", "startedAt": NaN}'),
    ("Infinity", b'{"pid": 7, "sessionId": "x", "updatedAt": -Infinity}'),
    ("deep", b"[" * 100_000),
    ("huge int", b'{"pid": ' + b"9" * 5000 + b', "sessionId": "x"}'),
    ("oversize", b'{"pid": 7, "sessionId": "x", "pad": "' + b"p" * 262_144 + b'"}'),
    ("pid missing", b'{"sessionId": "x"}'),
    ("pid string", b'{"pid": "7", "sessionId": "x"}'),
    ("pid bool", b'{"pid": true, "sessionId": "x"}'),
    ("pid float", b'{"pid": 7.0, "sessionId": "x"}'),
    ("pid zero", b'{"pid": 0, "sessionId": "x"}'),
    ("pid negative", b'{"pid": -7, "sessionId": "x"}'),
    ("pid mismatch", b'{"pid": 8, "sessionId": "x"}'),
    ("session missing", b'{"pid": 7}'),
    ("session empty", b'{"pid": 7, "sessionId": ""}'),
    ("session number", b'{"pid": 7, "sessionId": 42}'),
    ("status number", b'{"pid": 7, "sessionId": "x", "status": 1}'),
    ("name list", b'{"pid": 7, "sessionId": "x", "name": ["a"]}'),
    ("procStart number", b'{"pid": 7, "sessionId": "x", "procStart": 36592}'),
    ("startedAt string", b'{"pid": 7, "sessionId": "x", "startedAt": "1796053718467"}'),
    ("startedAt bool", b'{"pid": 7, "sessionId": "x", "startedAt": false}'),
    ("peerProtocol float", b'{"pid": 7, "sessionId": "x", "peerProtocol": 1.5}'),
    ("peerFeatures dict", b'{"pid": 7, "sessionId": "x", "peerFeatures": {}}'),
    ("socket number", b'{"pid": 7, "sessionId": "x", "messagingSocketPath": 3}'),
    ("socket relative", b'{"pid": 7, "sessionId": "x", "messagingSocketPath": "cc/7.sock"}'),
    ("socket NUL", b'{"pid": 7, "sessionId": "x", "messagingSocketPath": "/tmp/\\u0000.sock"}'),
    ("lone surrogate", b'{"pid": 7, "sessionId": "\\ud800"}'),
    ("surrogate in socket", b'{"pid": 7, "sessionId": "x", "messagingSocketPath": "/\\udfff"}'),
]


@pytest.mark.parametrize("raw", [raw for _, raw in MALFORMED], ids=[n for n, _ in MALFORMED])
def test_parse_malformed_raises_record_error(raw: bytes) -> None:
    with pytest.raises(RecordError):
        parse(raw, "7.json")


@pytest.mark.parametrize("name", ["0007.json", "7.JSON", "7.json.tmp", "x7.json", "7 .json",
                                  "\u0667.json", "7.json\n", ".json", "7.key"])
def test_parse_requires_the_exact_record_name(name: str) -> None:
    good = json.dumps({"pid": 7, "sessionId": "x"}).encode()
    assert parse(good, "7.json").pid == 7
    with pytest.raises(RecordError):
        parse(good, name)


KNOWN_KEYS = ["pid", "sessionId", "cwd", "startedAt", "procStart", "procStartFt", "version",
              "peerProtocol", "peerFeatures", "kind", "entrypoint", "pidDomain", "name",
              "nameSource", "messagingSocketPath", "status", "waitingFor", "updatedAt",
              "statusUpdatedAt", "spare", "parkedJobId"]
scalars = (st.none() | st.booleans() | st.integers()
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12)
           | st.sampled_from(["idle", "busy", "waiting", "/tmp/cc-socks/7.sock", "36592", ""]))
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=3),
    max_leaves=6,
)


def _typed(key: str) -> st.SearchStrategy[Any]:
    """A value of the type Claude writes for this key (or null)."""
    if key in {"startedAt", "updatedAt", "statusUpdatedAt", "peerProtocol"}:
        return st.none() | st.integers()
    if key == "peerFeatures":
        return st.lists(st.text(max_size=6) | st.integers(), max_size=20)
    if key == "spare":
        return st.booleans()
    if key == "messagingSocketPath":
        return st.sampled_from(["", "/tmp/cc-socks/7.sock", "/a//b.sock", "rel.sock"])
    if key == "status":
        return st.sampled_from(["idle", "busy", "shell", "waiting", "bogus"]) | st.none()
    return st.none() | st.text(max_size=12)


# Known keys are usually present with a plausible scalar, sometimes with anything at all.
record_objects = st.builds(
    lambda known, extra: {**extra, **known},
    st.fixed_dictionaries(
        {"pid": st.just(7) | json_values, "sessionId": st.text(min_size=1, max_size=8)
         | json_values},
        optional={key: _typed(key) | json_values for key in KNOWN_KEYS[2:]},
    ),
    st.dictionaries(st.text(max_size=8), json_values, max_size=2),
)


def _check_invariants(s: ClaudeSession) -> None:
    assert s.pid == 7
    assert isinstance(s.session_id, str)
    assert s.session_id
    assert s.status in {"idle", "busy", "shell", "waiting", "unknown"}
    assert all(isinstance(f, str) for f in s.peer_features)
    assert len(s.peer_features) <= 16
    if s.socket_path is not None:
        assert s.key_path is not None
        assert s.key_path.name.startswith("7.")


@given(st.binary(max_size=400))
@settings(deadline=None, max_examples=400)
@example(b'{"pid": 7, "sessionId": "x"}')
@example(b'{"pid": 7, "sessionId": "x", "status": "busy", "peerFeatures": ["a", 1]}')
@example(b"[" * 5000)
@example(b"\xef\xbb\xbf{}")
def test_parse_arbitrary_bytes_raises_only_record_error(raw: bytes) -> None:
    try:
        s = parse(raw, "7.json")
    except RecordError:
        return
    _check_invariants(s)


@given(record_objects)
@settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_parse_arbitrary_json_objects_raises_only_record_error(obj: dict[str, Any]) -> None:
    try:
        s = parse(json.dumps(obj).encode(), "7.json")
    except RecordError:
        return
    _check_invariants(s)
    assert s.session_id == obj["sessionId"]
    status = obj.get("status")
    assert s.status == (status if status in {"idle", "busy", "shell", "waiting"} else "unknown")


@given(
    name=st.text(max_size=30) | st.none(),
    status=st.sampled_from(["idle", "busy", "shell", "waiting"]) | st.none(),
    sock=st.text(max_size=30).map(lambda t: "/tmp/" + t.replace("\0", "")) | st.none(),
    started=st.integers(0, 2**53),
)
@settings(deadline=None, max_examples=200)
def test_parse_well_formed_records_round_trip(
    name: str | None, status: str | None, sock: str | None, started: int
) -> None:
    obj: dict[str, Any] = {"pid": 7, "sessionId": "s-1", "name": name, "status": status,
                           "messagingSocketPath": sock, "startedAt": started}
    s = parse(json.dumps(obj).encode(), "7.json")
    assert (s.name, s.started_at, s.messaging_socket_path) == (name, started, sock)
    assert s.socket_path == (None if sock is None else Path(sock))
    assert s.status == (status or "unknown")


# -- liveness ----------------------------------------------------------------------------------


def test_liveness_this_process_is_live() -> None:  # (a)
    assert liveness(parse(record(os.getpid()))) == "live"


def test_liveness_child_is_live_then_dead_once_reaped() -> None:  # (b)
    child = _spawn()
    try:
        s = parse(record(child.pid))
        assert liveness(s) == "live"
    finally:
        _reap(child)
    assert liveness(s) == "dead"


def test_liveness_recycled_pid_is_dead() -> None:  # (c)
    wrong = str(int(_start(os.getpid())) + 1)
    assert liveness(parse(record(os.getpid(), procStart=wrong))) == "dead"


def test_liveness_other_pid_domain_is_foreign() -> None:  # (d)
    # Even for a pid that exists here: pids from another namespace are not comparable.
    assert liveness(parse(record(os.getpid(), pidDomain=OTHER_DOMAIN))) == "foreign"
    assert liveness(parse(record(os.getpid(), pidDomain=""))) == "foreign"


def test_liveness_prefers_proc_start_ft_like_claude() -> None:
    mine, wrong = _start(os.getpid()), "133000000000000000"
    assert liveness(parse(record(os.getpid(), procStart=wrong, procStartFt=mine))) == "live"
    assert liveness(parse(record(os.getpid(), procStart=mine, procStartFt=wrong))) == "dead"


def test_liveness_without_a_start_time_is_dead_and_without_domain_is_checked() -> None:
    # A frozen record that cannot prove its process identity is not live (seed 004).
    assert liveness(parse(record(os.getpid(), procStart=...))) == "dead"
    assert liveness(parse(record(os.getpid(), pidDomain=...))) == "live"
    assert liveness(parse(record(os.getpid(), pidDomain=..., procStart="1"))) == "dead"


# -- reading -----------------------------------------------------------------------------------


def test_read_record_sets_config_dir_from_the_path(sessions: Path, home: Path) -> None:
    path = write(sessions, os.getpid(), record(os.getpid()))
    s = read_record(path)
    assert s is not None
    assert (s.config_dir, s.record_path, s.pid) == (home / ".claude", path, os.getpid())


def test_read_record_torn_file_fixed_before_the_retry(  # (e)
    sessions: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = json.dumps(record(os.getpid(), sessionId=SID_B)).encode()
    path = write(sessions, os.getpid(), whole[: len(whole) // 2])
    delays: list[float] = []

    def claude_finishes_its_write(delay: float) -> None:
        delays.append(delay)
        rewrite_in_place(path, whole)

    monkeypatch.setattr(registry, "_sleep", claude_finishes_its_write)
    s = read_record(path)
    assert s is not None
    assert s.session_id == SID_B
    assert delays == [0.025]


def test_read_record_still_torn_after_retries_is_none(
    sessions: Path, sleeps: list[float]
) -> None:
    path = write(sessions, 7, b'{"pid": 7, "sessi')
    assert read_record(path) is None
    assert sleeps == [0.025] * 3
    sleeps.clear()
    assert read_record(path, retries=1, delay=0.5) is None
    assert sleeps == [0.5]
    sleeps.clear()
    assert read_record(path, retries=0) is None
    assert sleeps == []


def test_read_record_really_sleeps_between_attempts(sessions: Path) -> None:
    path = write(sessions, 7, b"{")
    t0 = time.monotonic()
    assert read_record(path, retries=2, delay=0.02) is None
    assert time.monotonic() - t0 >= 0.04


def test_read_record_missing_or_vanishing_is_none(
    sessions: Path, monkeypatch: pytest.MonkeyPatch, sleeps: list[float]
) -> None:
    assert read_record(sessions / "123.json") is None
    assert read_record(sessions.parent / "no-such-dir" / "sessions" / "1.json") is None
    assert sleeps == []  # nothing to wait for
    path = write(sessions, 7, b"{")
    monkeypatch.setattr(registry, "_sleep", lambda _d: path.unlink())  # /exit mid-read
    assert read_record(path) is None


def test_read_record_refuses_non_files_without_hanging(
    sessions: Path, sleeps: list[float]
) -> None:
    fifo = sessions / "41.json"
    os.mkfifo(fifo)  # opening it blocking would hang a scan forever
    (sessions / "42.json").mkdir()
    (sessions / "43.json").symlink_to("/dev/zero")
    assert read_record(fifo) is None
    assert read_record(sessions / "42.json") is None
    assert read_record(sessions / "43.json") is None
    assert sleeps == []


def test_read_record_other_os_errors_are_none(
    sessions: Path, tmp_path: Path, sleeps: list[float]
) -> None:
    loop = sessions / "44.json"
    loop.symlink_to(loop)  # ELOOP
    assert read_record(loop) is None
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    assert read_record(not_a_dir / "sessions" / "45.json") is None  # ENOTDIR
    path = write(sessions, os.getpid(), record(os.getpid()))
    path.chmod(0)
    try:
        if not os.access(path, os.R_OK):  # EACCES (not as root: root reads mode 0 files)
            assert read_record(path) is None
    finally:
        path.chmod(0o644)
    assert read_record(path) is not None
    assert sleeps == []


def test_read_record_wrongly_named_file_is_none(sessions: Path, sleeps: list[float]) -> None:
    path = write(sessions, "abc.json", record(os.getpid()))
    assert read_record(path) is None
    assert sleeps == []


def test_read_record_symlinked_record_is_followed(sessions: Path, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps(record(os.getpid())))
    (sessions / f"{os.getpid()}.json").symlink_to(target)
    s = read_record(sessions / f"{os.getpid()}.json")
    assert s is not None
    assert s.pid == os.getpid()


# -- discovery ---------------------------------------------------------------------------------


def test_discover_live_sessions_only(
    env: dict[str, str], sessions: Path, sleeps: list[float],
    children: Callable[[], subprocess.Popen[str]],
) -> None:
    me, live, sdk = os.getpid(), children(), children()
    dead = _spawn()
    dead_record = record(dead.pid)
    _reap(dead)
    write(sessions, me, record(me, status="busy"))  # (a)
    write(sessions, live.pid, record(live.pid, sessionId=SID_B, status="waiting",
                                     waitingFor="permission prompt"))  # (b) live
    write(sessions, dead.pid, dead_record)  # (b) dead after reaping
    write(sessions, os.getppid(), record(os.getppid(), procStart="1"))  # (c) recycled pid
    write(sessions, 4242, record(4242, pidDomain=OTHER_DOMAIN))  # (d) foreign
    write(sessions, sdk.pid, record(sdk.pid, entrypoint="sdk-cli", status=...))  # (g)
    # (f) not records, or not well-formed ones
    write(sessions, "abc.json", record(me, sessionId="wrong-name"))
    write(sessions, f"{me}.json.tmp", record(me, sessionId="temp-file"))
    write(sessions, f"0{me}.json", record(me, sessionId="leading-zero"))
    write(sessions, 77, b"\x00garbage\xff")
    write(sessions, 78, b'{"pid": 78, "sessionId": "x", "p": "' + b"p" * 262_144 + b'"}')
    write(sessions, 79, record(me, sessionId="pid-mismatch"))
    (sessions / f"{me}.{'0' * 64}.key").write_text(json.dumps({"peerToken": TOKEN}))
    before = sorted(p.name for p in sessions.iterdir())

    found = discover(env)

    assert [(s.pid, s.session_id, s.status) for s in found] == sorted([
        (me, SID_A, "busy"), (live.pid, SID_B, "waiting"), (sdk.pid, SID_A, "unknown")])
    assert {s.pid: s.waiting_for for s in found}[live.pid] == "permission prompt"
    assert all(s.config_dir == sessions.parent for s in found)
    # Read-only: dead, foreign and garbage records are all still there.
    assert sorted(p.name for p in sessions.iterdir()) == before
    # Three malformed files, but torn-file retries are shared: three sleeps for the whole scan.
    assert sleeps == [0.025] * 3


def test_discover_skips_spares_and_parked_jobs(
    env: dict[str, str], sessions: Path, children: Callable[[], subprocess.Popen[str]]
) -> None:
    spare, parked = children(), children()
    write(sessions, os.getpid(), record(os.getpid()))
    write(sessions, spare.pid, record(spare.pid, kind="bg", spare=True))
    write(sessions, parked.pid, record(parked.pid, parkedJobId="e622614e"))
    assert [s.pid for s in discover(env)] == [os.getpid()]


def test_discover_with_no_config_dirs_at_all(tmp_path: Path) -> None:
    assert discover({"HOME": str(tmp_path / "nobody")}) == []


def test_discover_merges_profiles_and_dedups_a_shared_sessions_dir(
    home: Path, env: dict[str, str], sessions: Path,
    children: Callable[[], subprocess.Popen[str]],
) -> None:
    child = children()
    profiles = home / ".claude-profiles"
    (profiles / "work").mkdir(parents=True)
    (profiles / "work" / "sessions").symlink_to(sessions)  # shares ~/.claude/sessions
    write(profiles / "other" / "sessions", child.pid, record(child.pid, sessionId=SID_B))
    write(sessions, os.getpid(), record(os.getpid()))
    # Same pid, another sessionId and socket in a third root: a different identity, kept.
    write(profiles / "zeta" / "sessions", os.getpid(),
          record(os.getpid(), sessionId="other-session", messagingSocketPath="/tmp/x/1.sock"))

    found = discover(env)
    assert sorted((s.pid, s.session_id, s.config_dir) for s in found) == sorted([
        (os.getpid(), SID_A, home / ".claude"),
        (os.getpid(), "other-session", profiles / "zeta"),
        (child.pid, SID_B, profiles / "other"),
    ])
    assert [s.pid for s in found] == sorted(s.pid for s in found)

    # The root listed first wins the shared record: here the profile named by CLAUDE_CONFIG_DIR.
    found = discover({**env, "CLAUDE_CONFIG_DIR": str(profiles / "work")})
    mine = [s for s in found if s.session_id == SID_A]
    assert [s.config_dir for s in mine] == [profiles / "work"]
    assert mine[0].record_path == profiles / "work" / "sessions" / f"{os.getpid()}.json"
    assert len(found) == 3


def test_discover_keeps_each_records_own_config_home_for_its_key(
    home: Path, env: dict[str, str], children: Callable[[], subprocess.Popen[str]]
) -> None:
    # Seed 001: a record found under a profile reads its key from that profile, not ~/.claude.
    child = children()
    profile_sessions = home / ".claude-profiles" / "p1" / "sessions"
    write(profile_sessions, child.pid, record(child.pid))
    (s,) = discover(env)
    assert s.key_path is not None
    assert s.key_path.parent == profile_sessions
    s.key_path.write_text(json.dumps({"peerToken": TOKEN}))
    assert read_peer_token(s) == TOKEN


# -- the shim's binding ------------------------------------------------------------------------


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Count the record reads that reach the disk."""
    seen: list[Path] = []
    real = registry._read_regular

    def counting(path: Path, limit: int, *, follow: bool) -> bytes | None:
        seen.append(path)
        return real(path, limit, follow=follow)

    monkeypatch.setattr(registry, "_read_regular", counting)
    return seen


def _settled(path: Path) -> None:
    set_mtime(path, time.time_ns() - 10 * 10**9)


def test_binding_rereads_only_when_the_file_changes(
    home: Path, sessions: Path, reads: list[Path]
) -> None:
    path = write(sessions, os.getpid(), record(os.getpid()))
    _settled(path)
    binding = SessionBinding(home / ".claude", os.getpid())
    first = binding.current()
    assert first is not None
    assert first.session_id == SID_A
    assert binding.current() is first
    assert binding.current() is first
    assert len(reads) == 1

    rewrite_in_place(path, json.dumps(record(os.getpid(), name="renamed")).encode())
    _settled(path)
    second = binding.current()
    assert second is not None
    assert second.name == "renamed"
    assert len(reads) == 2
    assert binding.current() is second
    assert len(reads) == 2


def test_binding_follows_clear(home: Path, sessions: Path) -> None:
    path = write(sessions, os.getpid(), record(os.getpid(), sessionId=SID_A))
    binding = SessionBinding(home / ".claude", os.getpid())
    assert binding.superseded(SID_A) is False
    # /clear: same pid, socket and key; the record is rewritten with a new sessionId.
    rewrite_in_place(path, json.dumps(record(os.getpid(), sessionId=SID_B)).encode())
    s = binding.current()
    assert s is not None
    assert s.session_id == SID_B
    assert binding.superseded(SID_A) is True
    assert binding.superseded(SID_B) is False


def test_binding_same_size_rewrite_in_the_same_tick_is_not_missed(
    home: Path, sessions: Path, reads: list[Path]
) -> None:
    path = write(sessions, os.getpid(), record(os.getpid(), status="idle"))
    stamp = time.time_ns()
    set_mtime(path, stamp)
    binding = SessionBinding(home / ".claude", os.getpid())
    s = binding.current()
    assert s is not None
    assert s.status == "idle"
    # "idle" -> "busy" keeps the size; restoring the mtime mimics a coarse timestamp tick.
    rewrite_in_place(path, json.dumps(record(os.getpid(), status="busy")).encode())
    set_mtime(path, stamp)
    s = binding.current()
    assert s is not None
    assert s.status == "busy"
    assert len(reads) == 2


def test_binding_settled_stat_is_trusted(
    home: Path, sessions: Path, reads: list[Path]
) -> None:
    # The other side of the racy window: an old, unchanged stat is a cache hit even if someone
    # swapped same-size bytes under it while restoring the mtime (stat is all we look at).
    path = write(sessions, os.getpid(), record(os.getpid(), status="idle"))
    stamp = time.time_ns() - 10 * 10**9
    set_mtime(path, stamp)
    binding = SessionBinding(home / ".claude", os.getpid())
    assert binding.current() is not None
    rewrite_in_place(path, json.dumps(record(os.getpid(), status="busy")).encode())
    set_mtime(path, stamp)
    s = binding.current()
    assert s is not None
    assert s.status == "idle"
    assert len(reads) == 1


def test_binding_missing_record_is_no_evidence(home: Path, sessions: Path) -> None:
    binding = SessionBinding(home / ".claude", os.getpid())
    assert binding.current() is None
    assert binding.superseded(SID_A) is None
    path = write(sessions, os.getpid(), record(os.getpid()))
    assert binding.superseded(SID_A) is False
    path.unlink()  # clean exit removes the record
    assert binding.current() is None
    assert binding.superseded(SID_A) is None


def test_binding_stale_record_of_a_recycled_pid_is_not_ours(home: Path, sessions: Path) -> None:
    # A crashed earlier process with our parent's pid left this record: not our session.
    write(sessions, os.getpid(), record(os.getpid(), procStart="1", sessionId=SID_B))
    binding = SessionBinding(home / ".claude", os.getpid())
    assert binding.current() is None
    assert binding.superseded(SID_A) is None
    write(sessions, os.getpid(), record(os.getpid(), pidDomain=OTHER_DOMAIN))
    assert binding.current() is None


def test_binding_torn_record_is_not_cached(
    home: Path, sessions: Path, sleeps: list[float]
) -> None:
    good = json.dumps(record(os.getpid(), sessionId=SID_B)).encode()
    path = write(sessions, os.getpid(), good[:-1] + b" ")  # same size, not JSON
    stamp = time.time_ns() - 10 * 10**9
    set_mtime(path, stamp)
    binding = SessionBinding(home / ".claude", os.getpid())
    assert binding.current() is None
    assert binding.superseded(SID_A) is None
    assert sleeps  # it did retry
    rewrite_in_place(path, good)
    set_mtime(path, stamp)  # identical stat: only a non-cached failure lets us see the fix
    s = binding.current()
    assert s is not None
    assert s.session_id == SID_B
    assert binding.superseded(SID_A) is True


# -- key files ---------------------------------------------------------------------------------


def _session_with_key(sessions: Path, key: dict[str, Any] | bytes, **fields: Any) -> ClaudeSession:
    pid = os.getpid()
    s = read_record(write(sessions, pid, record(pid, **fields)))
    assert s is not None
    # Name computed independently of key_path: sha256 of the socket path string (research §4).
    sock = s.messaging_socket_path
    assert sock is not None
    path = sessions / f"{pid}.{hashlib.sha256(sock.encode()).hexdigest()}.key"
    assert s.key_path == path
    path.write_bytes(key if isinstance(key, bytes) else json.dumps(key).encode())
    path.chmod(0o600)
    return s


def test_read_peer_token(sessions: Path) -> None:
    s = _session_with_key(sessions, {"peerToken": TOKEN, "procStart": _start(os.getpid()),
                                     "pidDomain": proc.pid_domain()})
    assert read_peer_token(s) == TOKEN
    assert TOKEN not in repr(s)


def test_read_peer_token_windows_style_start_field(sessions: Path) -> None:
    # A live Windows row wrote its FILETIME under procStart in the record, procStartFt in the key.
    s = _session_with_key(sessions, {"peerToken": TOKEN, "procStartFt": "134320979894294095"},
                          procStart="134320979894294095")
    assert read_peer_token(s) == TOKEN


@pytest.mark.parametrize("key", [
    {"peerToken": TOKEN.upper()},
    {"peerToken": TOKEN[:-1]},
    {"peerToken": TOKEN + "0"},
    {"peerToken": TOKEN + "\n"},
    {"peerToken": 12345},
    {"peerToken": None},
    {"token": TOKEN},
    {"peerToken": TOKEN, "procStart": "1"},  # another process's key
    {"peerToken": TOKEN, "pidDomain": OTHER_DOMAIN},
    [TOKEN],
    b"",
    b"not json " + TOKEN.encode(),
    b'{"peerToken": "' + TOKEN.encode() + b'", "pad": "' + b"x" * 5000 + b'"}',
    b'{"peerToken": "' + TOKEN.encode() + b'", "procStart": NaN}',
])
def test_read_peer_token_rejects(sessions: Path, key: Any) -> None:
    s = _session_with_key(sessions, key)
    assert s.key_path is not None
    assert s.key_path.is_file()
    assert read_peer_token(s) is None


def test_read_peer_token_requires_a_regular_file(sessions: Path, tmp_path: Path) -> None:
    s = _session_with_key(sessions, {"peerToken": TOKEN})
    assert read_peer_token(s) == TOKEN
    key = s.key_path
    assert key is not None
    real = tmp_path / "real.key"
    key.rename(real)
    assert read_peer_token(s) is None  # missing
    key.symlink_to(real)
    assert read_peer_token(s) is None  # a symlink is not Claude's key file
    key.unlink()
    key.mkdir()
    assert read_peer_token(s) is None
    key.rmdir()
    os.mkfifo(key)
    assert read_peer_token(s) is None  # and does not hang


def test_read_peer_token_without_socket_is_none(sessions: Path) -> None:
    s = read_record(write(sessions, os.getpid(), record(os.getpid(), messagingSocketPath=...)))
    assert s is not None
    assert s.key_path is None
    assert read_peer_token(s) is None
