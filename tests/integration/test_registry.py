"""The registry on real files, real flocks and real processes (seed §3, §11 tests 15, 24, 29)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from crosstalk import proc
from crosstalk.core.ids import agent_id_for, new_instance_id
from crosstalk.core.naming import fallback_name, name_candidates
from crosstalk.store import descriptor as descriptor_module
from crosstalk.store import registration as registration_module
from crosstalk.store.files import FileLock, write_atomic
from crosstalk.store.registry import (
    AgentBusy,
    Descriptor,
    DescriptorError,
    DescriptorLiveness,
    NoFreeName,
    Registration,
    Registry,
    RegistryError,
    StatePathError,
    Unreadable,
    liveness,
    own_process_identity,
)
from tests.support.agent_proc import AgentProc
from tests.support.agents import register_agent

CWD = "/work/proj"
Spawn = Callable[..., AgentProc]

# -- fixtures and helpers ----------------------------------------------------------------------


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def registry(home: Path) -> Registry:
    return Registry(home)


@pytest.fixture
def registrations() -> Iterator[list[Registration]]:
    regs: list[Registration] = []
    try:
        yield regs
    finally:
        for r in regs:
            r.close()


@pytest.fixture
def spawn(home: Path, tmp_path: Path) -> Iterator[Spawn]:
    """Start helper processes; every one of them is killed at teardown, whatever happened."""
    kids: list[AgentProc] = []

    def make(*, barrier_fd: int | None = None) -> AgentProc:
        kid = AgentProc(home, tmp_path / "logs", barrier_fd=barrier_fd)
        kids.append(kid)
        return kid

    try:
        yield make
    finally:
        for kid in kids:
            kid.stop()


@pytest.fixture(scope="module")
def dead_process() -> tuple[int, str]:
    """(pid, start time) of a process that has exited and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    started = proc.process_start_time(child.pid)
    assert child.stdin is not None
    child.stdin.close()
    assert child.wait(timeout=60) == 0
    assert started is not None
    assert not proc.pid_alive(child.pid)
    return child.pid, started


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def make_descriptor(session: str = "s-1", name: str = "alpha", **changes: Any) -> Descriptor:
    pid, started = own_process_identity()
    agent_id = agent_id_for("claude", session)
    desc = Descriptor(
        agent_id=agent_id, name=name, harness="claude", session_ref=session, cwd=CWD, pid=pid,
        started_at=started, instance_id=new_instance_id(),
        credential_ref=f"/nonexistent/{agent_id}.token", pid_domain=proc.pid_domain(),
    )
    return replace(desc, **changes)


def valid_dict(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(make_descriptor().to_json())
    data.update(changes)
    return data


def plant(registry: Registry, desc: Descriptor) -> Path:
    """Write a descriptor file directly, as another (possibly dead) process left it."""
    path = registry.descriptor_path(desc.agent_id)
    write_atomic(path, desc.to_json())
    return path


def lock_is_free(path: Path) -> bool:
    lock = FileLock.try_acquire(path)
    if lock is None:
        return False
    lock.release()
    return True


# -- descriptors -------------------------------------------------------------------------------


def test_descriptor_round_trip() -> None:
    desc = make_descriptor(
        role="subagent", owner="boss", harness_pid=4242, harness_started_at="77",
        a2a_url="http://127.0.0.1:5000", uds_path="/s/x.sock", harness_endpoint="/e.sock",
        harness_version="1.2.3", installed=False, extra={"future_field": [1, {"a": None}]},
    )
    raw = desc.to_json()
    back = Descriptor.from_json(raw)
    assert back == desc
    assert back.to_json() == raw
    data = json.loads(raw)
    assert data["future_field"] == [1, {"a": None}]  # unknown fields are kept, flattened
    assert "extra" not in data
    assert list(data) == sorted(data)


def test_descriptor_defaults() -> None:
    d = Descriptor.from_dict({k: v for k, v in valid_dict().items()
                              if k in descriptor_module._REQUIRED})
    assert (d.role, d.owner, d.installed, d.protocol, d.extra) == ("primary", None, True, 1, {})


@pytest.mark.parametrize(
    ("field_name", "value"),
    [
        ("pid", True), ("pid", False), ("pid", "123"), ("pid", 1.0), ("pid", None), ("pid", [1]),
        ("agent_id", 123), ("agent_id", None), ("name", None), ("name", ["alpha"]),
        ("harness", 1), ("session_ref", {}), ("cwd", None), ("started_at", 12345),
        ("instance_id", None), ("credential_ref", 0), ("role", None), ("owner", 7),
        ("harness_pid", True), ("harness_pid", "1"), ("harness_pid", 1.5),
        ("harness_started_at", 5), ("a2a_url", False), ("uds_path", []),
        ("harness_endpoint", 1), ("harness_version", 2), ("pid_domain", 3),
        ("installed", 1), ("installed", "true"), ("installed", None),
        ("protocol", True), ("protocol", "1"), ("protocol", 1.0),
    ],
)
def test_from_json_rejects_wrong_types(field_name: str, value: object) -> None:
    raw = json.dumps(valid_dict(**{field_name: value})).encode()
    with pytest.raises(DescriptorError, match="wrong type"):
        Descriptor.from_json(raw)


@pytest.mark.parametrize("field_name", descriptor_module._REQUIRED)
def test_from_json_rejects_missing_fields(field_name: str) -> None:
    data = valid_dict()
    del data[field_name]
    with pytest.raises(DescriptorError, match=f"missing fields: {field_name}"):
        Descriptor.from_json(json.dumps(data).encode())


@pytest.mark.parametrize(
    "raw",
    [b"[]", b'"x"', b"1", b"null", b"true", b"[{}]", b'["agent_id"]'],
)
def test_from_json_rejects_non_objects(raw: bytes) -> None:
    with pytest.raises(DescriptorError, match="not a JSON object"):
        Descriptor.from_json(raw)


@pytest.mark.parametrize(
    "raw",
    [b"", b"{", b'{"a": 1', b"\xff\xfe\x00", b"{'pid': 1}", b"\x00" * 10, b"garbage\n"],
)
def test_from_json_rejects_non_json(raw: bytes) -> None:
    with pytest.raises(DescriptorError, match="not JSON"):
        Descriptor.from_json(raw)


def test_from_json_rejects_deep_nesting() -> None:
    # 64 KiB of "[" makes json.loads raise RecursionError, which is not a DescriptorError:
    # unless from_json turns it into one, one such file crashes scan(), live() and sweep_stale().
    for raw in (b"[" * 60_000, b'{"a":' * 20_000, b"[" * 5_000 + b"]" * 5_000):
        with pytest.raises(DescriptorError):
            Descriptor.from_json(raw)


def test_from_json_rejects_oversize() -> None:
    limit = descriptor_module._MAX_DESCRIPTOR_BYTES
    raw = json.dumps(valid_dict(padding="x" * limit)).encode()
    with pytest.raises(DescriptorError, match="too large"):
        Descriptor.from_json(raw)
    small = json.dumps(valid_dict(padding="x" * (limit - 2000))).encode()
    assert len(small) <= limit
    assert Descriptor.from_json(small).extra["padding"].startswith("x")


@pytest.mark.parametrize(
    "agent_id", ["", "0123", "0123456789ABCDEF", "0123456789abcdef0", "../../../etc/pass",
                 "0123456789abcde\n"],
)
def test_from_json_rejects_bad_agent_id(agent_id: str) -> None:
    with pytest.raises(DescriptorError, match="agent_id"):
        Descriptor.from_json(json.dumps(valid_dict(agent_id=agent_id)).encode())


@pytest.mark.parametrize("name", ["", "../x", "a/b", ".hidden", "-x", "x" * 65, "é", "a\n"])
def test_from_json_rejects_bad_name(name: str) -> None:
    with pytest.raises(DescriptorError, match="name"):
        Descriptor.from_json(json.dumps(valid_dict(name=name)).encode())


@pytest.mark.parametrize("pid", [0, -1, -(2**40)])
def test_from_json_rejects_non_positive_pid(pid: int) -> None:
    with pytest.raises(DescriptorError, match="pid"):
        Descriptor.from_json(json.dumps(valid_dict(pid=pid)).encode())


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12,
)
field_names = st.sampled_from(
    [f for f in Descriptor.__dataclass_fields__ if f != "extra"] + ["extra", "x"]
)


def _check_parsed(desc: Descriptor) -> None:
    """Whatever from_json accepts is well-typed and survives a round trip."""
    assert type(desc.pid) is int
    assert desc.pid > 0
    assert type(desc.installed) is bool
    assert type(desc.protocol) is int
    assert desc.harness_pid is None or type(desc.harness_pid) is int
    for name in descriptor_module._REQUIRED:
        if name != "pid":
            assert isinstance(getattr(desc, name), str)
    raw = desc.to_json()  # compared as bytes: an extra NaN is never == itself
    assert Descriptor.from_json(raw).to_json() == raw


@given(st.binary(max_size=2000))
@settings(deadline=None, max_examples=300)
@example(b"[" * 70_000)
@example(b"\xef\xbb\xbf{}")
@example(b'{"pid": NaN}')
def test_fuzz_bytes_only_raise_descriptor_error(raw: bytes) -> None:
    try:
        desc = Descriptor.from_json(raw)
    except DescriptorError:
        return
    _check_parsed(desc)


@given(st.dictionaries(st.one_of(field_names, st.text(max_size=10)), json_values, max_size=25))
@settings(deadline=None, max_examples=300)
def test_fuzz_json_objects_only_raise_descriptor_error(data: dict[str, Any]) -> None:
    try:
        desc = Descriptor.from_json(json.dumps(data).encode())
    except DescriptorError:
        return
    _check_parsed(desc)


@given(
    changes=st.dictionaries(field_names, json_values, max_size=4),
    drop=st.sets(field_names, max_size=2),
)
@settings(deadline=None, max_examples=500)
@example(changes={"pid": 2**70}, drop=set())
@example(changes={"pid": True}, drop=set())
@example(changes={"x": float("nan"), "extra": {"pid": 1}}, drop=set())
def test_fuzz_mutated_descriptors_only_raise_descriptor_error(
    changes: dict[str, Any], drop: set[str]
) -> None:
    data = valid_dict(**changes)
    for name in drop:
        data.pop(name, None)
    try:
        desc = Descriptor.from_json(json.dumps(data).encode())
    except DescriptorError:
        return
    _check_parsed(desc)
    liveness(desc)  # judging any accepted descriptor never raises either


# -- scanning a damaged registry ---------------------------------------------------------------


def test_scan_reports_torn_and_garbage_files_and_keeps_the_good_ones(
    registry: Registry, registrations: list[Registration], dead_process: tuple[int, str]
) -> None:
    good = [register_agent(registry, f"good-{i}", f"good-{i}", cwd=CWD, into=registrations)
            for i in range(2)]
    torn_desc = make_descriptor("torn", "torn")
    torn_raw = torn_desc.to_json()
    bad_paths: dict[str, Path] = {}

    def bad(label: str, filename: str, raw: bytes) -> None:
        path = registry.agents_dir / filename
        path.write_bytes(raw)
        bad_paths[label] = path

    bad("torn", f"{torn_desc.agent_id}.json", torn_raw[: len(torn_raw) // 2])
    bad("empty", f"{agent_id_for('claude', 'empty')}.json", b"")
    bad("garbage", f"{agent_id_for('claude', 'garbage')}.json", os.urandom(300))
    bad("array", f"{agent_id_for('claude', 'array')}.json", b"[1, 2, 3]")
    bad("deep", f"{agent_id_for('claude', 'deep')}.json", b"[" * 60_000)
    bad("not-an-id", "not-an-id.json", make_descriptor("x", "x").to_json())
    bad("wrong-file", f"{agent_id_for('claude', 'other')}.json",
        make_descriptor("mismatch", "mismatch").to_json())
    bad("huge", f"{agent_id_for('claude', 'huge')}.json",
        json.dumps(valid_dict(padding="x" * 70_000)).encode())
    directory = registry.agents_dir / f"{agent_id_for('claude', 'dir')}.json"
    directory.mkdir()
    bad_paths["dir"] = directory
    # A descriptor with an impossible pid is well-formed, and simply not alive.
    absurd = make_descriptor("absurd-pid", "absurd", pid=99_999_999_999)
    plant(registry, absurd)
    dead_pid, dead_start = dead_process
    stale = make_descriptor("stale", "stale", pid=dead_pid, started_at=dead_start)
    plant(registry, stale)

    listed, unreadable = registry.scan()

    verdicts = {item.descriptor.agent_id: item.liveness for item in listed}
    assert verdicts == {
        good[0].agent_id: DescriptorLiveness.LIVE,
        good[1].agent_id: DescriptorLiveness.LIVE,
        absurd.agent_id: DescriptorLiveness.STALE,
        stale.agent_id: DescriptorLiveness.STALE,
    }
    assert {u.path for u in unreadable} == set(bad_paths.values())
    assert all(isinstance(u, Unreadable) and u.reason for u in unreadable)
    assert {d.name for d in registry.live()} == {"good-0", "good-1"}
    assert [d.agent_id for d in registry.find("good-1")] == [good[1].agent_id]
    # A sweep removes only the well-formed stale ones; damaged files are reported, never trusted
    # (and never deleted on a guess).
    assert sorted(registry.sweep_stale()) == sorted([absurd.agent_id, stale.agent_id])
    assert all(p.exists() for p in bad_paths.values())
    assert {d.name for d in registry.live()} == {"good-0", "good-1"}


@given(raw=st.binary(max_size=500))
@settings(deadline=None, max_examples=60,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(raw=b"")
def test_fuzz_scan_never_raises(raw: bytes, tmp_path: Path) -> None:
    with tempfile.TemporaryDirectory(dir=tmp_path) as d:
        reg = Registry(Path(d))
        good = make_descriptor("fuzz-good", "fuzz-good")
        plant(reg, good)
        (reg.agents_dir / f"{agent_id_for('claude', 'fuzz')}.json").write_bytes(raw)
        listed, unreadable = reg.scan()
        assert good.agent_id in {i.descriptor.agent_id for i in listed}
        assert len(listed) + len(unreadable) == 2
        reg.sweep_stale()
        assert reg.descriptor_path(good.agent_id).exists()


# -- secrets and permissions -------------------------------------------------------------------


def test_token_only_in_a_private_credential_file(
    registry: Registry, registrations: list[Registration]
) -> None:
    reg = register_agent(registry, "secretive", "secretive", cwd=CWD, into=registrations)
    assert reg.token is not None
    assert reg.descriptor is not None
    token = reg.token
    assert len(token) >= 32
    desc_path = registry.descriptor_path(reg.agent_id)
    raw = desc_path.read_bytes()
    assert token.encode() not in raw
    assert token not in json.dumps(asdict(Descriptor.from_json(raw)))
    # No file anywhere in the registry, except the credential itself, mentions the token.
    cred = Path(reg.descriptor.credential_ref)
    assert cred == registry.credential_path(reg.agent_id)
    for path in registry.home.rglob("*"):
        if path.is_file() and path != cred:
            assert token.encode() not in path.read_bytes(), path
    assert cred.read_text() == token + "\n"
    assert _mode(cred) == 0o600
    assert cred.parent == registry.credentials_dir
    assert _mode(cred.parent) == 0o700
    assert _mode(desc_path) == 0o600
    for d in (registry.home, registry.agents_dir, registry.names_dir, registry.credentials_dir):
        assert _mode(d) == 0o700, d
    # Nothing half-written lies around after publication (temp + rename).
    assert not [p for p in registry.agents_dir.iterdir() if p.name.endswith(".tmp")]


def test_credential_rotates(registry: Registry, registrations: list[Registration]) -> None:
    reg = register_agent(registry, "rotating", cwd=CWD, into=registrations)
    first = reg.token
    path = reg.issue_credential()
    assert reg.token != first
    assert path.read_text() == f"{reg.token}\n"
    assert _mode(path) == 0o600


def test_a_token_is_verified_even_for_the_agent_it_is_hinted_at(
    registry: Registry, registrations: list[Registration]
) -> None:
    others = [register_agent(registry, f"other-{i}", f"aa-other-{i}", cwd=CWD,
                             into=registrations) for i in range(4)]
    reg = register_agent(registry, "bearer", "zz-bearer", cwd=CWD, into=registrations)
    first = reg.token
    assert first is not None
    found = registry.agent_for_token(first)
    assert found is not None
    assert found.agent_id == reg.agent_id
    again = registry.agent_for_token(first, hint=reg.agent_id)  # read and checked again
    assert again is not None
    assert again.agent_id == reg.agent_id
    wrong = registry.agent_for_token(first, hint=others[0].agent_id)  # a stale hint: the scan
    assert wrong is not None
    assert wrong.agent_id == reg.agent_id
    assert registry.agent_for_token(first, hint="not-an-agent-id") is not None
    reg.issue_credential()  # rotated: the hinted agent no longer holds the old token
    assert registry.agent_for_token(first, hint=reg.agent_id) is None
    assert reg.token is not None
    now = registry.agent_for_token(reg.token, hint=reg.agent_id)
    assert now is not None
    assert now.agent_id == reg.agent_id
    reg.close()  # gone: its token names nobody, hinted or not
    assert registry.agent_for_token(reg.token, hint=reg.agent_id) is None
    assert registry.agent_for_token("not-a-token", hint=reg.agent_id) is None


def test_a_hinted_token_owner_whose_process_died_is_not_live(
    registry: Registry, registrations: list[Registration], dead_process: tuple[int, str]
) -> None:
    reg = register_agent(registry, "mortal", "mortal", cwd=CWD, into=registrations)
    assert reg.token is not None
    assert registry.agent_for_token(reg.token, hint=reg.agent_id) is not None
    desc = registry.live_descriptor(reg.agent_id)
    assert desc is not None
    pid, started = dead_process
    write_atomic(registry.descriptor_path(reg.agent_id),
                 replace(desc, pid=pid, started_at=started).to_json())
    assert registry.agent_for_token(reg.token, hint=reg.agent_id) is None


def test_registry_tightens_loose_directories(home: Path) -> None:
    for sub in ("", "agents", "names", "credentials"):
        (home / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(home / sub, 0o755)
    reg = Registry(home)
    for d in (reg.home, reg.agents_dir, reg.names_dir, reg.credentials_dir):
        assert _mode(d) == 0o700


# -- staleness ---------------------------------------------------------------------------------


def test_liveness_verdicts(dead_process: tuple[int, str]) -> None:
    dead_pid, dead_start = dead_process
    ours = make_descriptor()
    assert liveness(ours) is DescriptorLiveness.LIVE
    assert liveness(replace(ours, pid_domain=None)) is DescriptorLiveness.LIVE
    assert liveness(replace(ours, pid=dead_pid, started_at=dead_start)) is DescriptorLiveness.STALE
    wrong_start = str(int(ours.started_at) + 1)
    assert liveness(replace(ours, started_at=wrong_start)) is DescriptorLiveness.STALE  # pid reuse
    assert liveness(replace(ours, started_at="")) is DescriptorLiveness.STALE
    foreign = replace(ours, pid_domain="linux:other-machine:pid:[1]")
    assert liveness(foreign) is DescriptorLiveness.FOREIGN
    # cannot judge: not dead
    assert liveness(replace(foreign, pid=dead_pid)) is DescriptorLiveness.FOREIGN
    assert liveness(replace(ours, pid=2**40)) is DescriptorLiveness.STALE


def test_scan_verdicts_and_sweep_removes_only_stale(
    registry: Registry, dead_process: tuple[int, str]
) -> None:
    dead_pid, dead_start = dead_process
    live = make_descriptor("live", "live")
    dead = make_descriptor("dead", "dead", pid=dead_pid, started_at=dead_start)
    reused = make_descriptor("reused", "reused", started_at=str(10**12))
    foreign = make_descriptor("foreign", "foreign", pid=dead_pid,
                              pid_domain="linux:elsewhere:pid:[4026531836]")
    for d in (live, dead, reused, foreign):
        plant(registry, d)
    listed, unreadable = registry.scan()
    assert unreadable == []
    assert {i.descriptor.agent_id: i.liveness for i in listed} == {
        live.agent_id: DescriptorLiveness.LIVE, dead.agent_id: DescriptorLiveness.STALE,
        reused.agent_id: DescriptorLiveness.STALE, foreign.agent_id: DescriptorLiveness.FOREIGN,
    }
    assert [d.agent_id for d in registry.live()] == [live.agent_id]
    assert registry.find("foreign") == []
    assert sorted(registry.sweep_stale()) == sorted([dead.agent_id, reused.agent_id])
    assert registry.descriptor_path(live.agent_id).exists()
    assert registry.descriptor_path(foreign.agent_id).exists()
    assert not registry.descriptor_path(dead.agent_id).exists()
    assert not registry.descriptor_path(reused.agent_id).exists()
    assert registry.sweep_stale() == []


def test_sweep_skips_a_stale_descriptor_whose_agent_lock_is_held(
    registry: Registry, dead_process: tuple[int, str], spawn: Spawn
) -> None:
    dead_pid, dead_start = dead_process
    stale = make_descriptor("held", "held", pid=dead_pid, started_at=dead_start)
    path = plant(registry, stale)
    # Held in this process (a Registration about to publish) ...
    holder = registry.acquire(stale.agent_id)
    try:
        assert registry.sweep_stale() == []
        assert Descriptor.from_json(path.read_bytes()) == stale
    finally:
        holder.close()
    assert path.exists()  # close() leaves a descriptor it did not publish
    # ... and held by another process.
    kid = spawn()
    assert kid.request("hold_lock", path=str(registry.agent_lock_path(stale.agent_id)))["held"]
    assert registry.sweep_stale() == []
    assert path.exists()
    kid.kill9()
    assert registry.sweep_stale() == [stale.agent_id]
    assert not path.exists()


def test_sweep_leaves_a_descriptor_republished_by_a_live_owner(
    registry: Registry, registrations: list[Registration], dead_process: tuple[int, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The scan saw a stale file, but by the time the sweeper holds the lock it was replaced."""
    dead_pid, dead_start = dead_process
    stale = make_descriptor("phoenix", "phoenix", pid=dead_pid, started_at=dead_start)
    path = plant(registry, stale)
    fresh = make_descriptor("phoenix", "phoenix")
    real_scan = registry.scan

    def scan_then_republish() -> Any:
        result = real_scan()
        plant(registry, fresh)  # a new owner published (and then released its lock)
        return result

    monkeypatch.setattr(registry, "scan", scan_then_republish)
    assert registry.sweep_stale() == []
    assert Descriptor.from_json(path.read_bytes()).instance_id == fresh.instance_id


# -- the registration lifecycle ----------------------------------------------------------------


def test_close_removes_own_descriptor_and_credential_but_keeps_lock_files(
    registry: Registry, registrations: list[Registration]
) -> None:
    reg = register_agent(registry, "closer", "closer", cwd=CWD, into=registrations)
    agent_lock = registry.agent_lock_path(reg.agent_id)
    name_lock = registry.name_lock_path("closer")
    assert not lock_is_free(agent_lock)
    assert not lock_is_free(name_lock)
    assert [d.name for d in registry.live()] == ["closer"]
    reg.close()
    assert not reg.active
    assert not registry.descriptor_path(reg.agent_id).exists()
    assert not registry.credential_path(reg.agent_id).exists()
    assert registry.live() == []
    # Lock files are never unlinked, and both are free now.
    assert agent_lock.exists()
    assert name_lock.exists()
    assert lock_is_free(agent_lock)
    assert lock_is_free(name_lock)
    reg.close()  # idempotent
    with pytest.raises(RegistryError, match="closed"):
        reg.take_name(["closer"])
    with pytest.raises(RegistryError, match="closed"):
        reg.issue_credential()
    again = register_agent(registry, "closer", "closer", cwd=CWD, into=registrations)
    assert again.name == "closer"


def test_close_leaves_a_descriptor_written_by_another_instance(
    registry: Registry, registrations: list[Registration]
) -> None:
    reg = register_agent(registry, "shared-session", "mine", cwd=CWD, into=registrations)
    assert reg.descriptor is not None
    newer = replace(reg.descriptor, instance_id=new_instance_id())
    path = plant(registry, newer)  # a later instance of this agent published meanwhile
    cred = registry.credential_path(reg.agent_id)
    cred.write_text("someone-elses-token\n")
    reg.close()
    assert Descriptor.from_json(path.read_bytes()).instance_id == newer.instance_id
    assert cred.read_text() == "someone-elses-token\n"


def test_close_with_an_unreadable_descriptor_leaves_it(
    registry: Registry, registrations: list[Registration]
) -> None:
    reg = register_agent(registry, "damaged", "damaged", cwd=CWD, into=registrations)
    path = registry.descriptor_path(reg.agent_id)
    path.write_bytes(b'{"torn": ')
    reg.close()
    assert path.read_bytes() == b'{"torn": '  # not ours to judge: left for a human or a sweep


def test_agent_busy_within_one_process(registry: Registry, home: Path) -> None:
    agent_id = agent_id_for("claude", "busy")
    first = registry.acquire(agent_id)
    try:
        with pytest.raises(AgentBusy):
            registry.acquire(agent_id)
        with pytest.raises(AgentBusy):
            Registry(home).acquire(agent_id)  # a second Registry object on the same tree
        other = registry.acquire(agent_id_for("claude", "not-busy"))
        other.close()
    finally:
        first.close()
    registry.acquire(agent_id).close()  # free again after close


def test_agent_busy_across_processes(registry: Registry, spawn: Spawn) -> None:
    kid = spawn()
    got = kid.request("register", harness="claude", session="busy-x", name="busy-x", cwd=CWD)
    assert got["ok"]
    with pytest.raises(AgentBusy):
        registry.acquire(got["agent_id"])
    kid.kill9()
    registry.acquire(got["agent_id"]).close()


@pytest.mark.parametrize("bad", ["../../x", "0123456789ABCDEF", "", "0123456789abcdef/"])
def test_paths_refuse_non_agent_ids(registry: Registry, bad: str) -> None:
    for make_path in (registry.acquire, registry.descriptor_path, registry.agent_lock_path,
                      registry.credential_path):
        with pytest.raises(RegistryError, match="not an agent id"):
            make_path(bad)
    assert sorted(p.name for p in registry.home.rglob("*")) == ["agents", "credentials", "names"]


def test_publish_guards(registry: Registry, registrations: list[Registration]) -> None:
    agent_id = agent_id_for("claude", "guarded")
    reg = registry.acquire(agent_id)
    registrations.append(reg)
    desc = make_descriptor("guarded", "guarded")
    with pytest.raises(RegistryError, match="name"):
        reg.publish(desc)  # no name lock yet
    reg.take_name(["guarded"])
    with pytest.raises(RegistryError, match="name"):
        reg.publish(replace(desc, name="other"))
    with pytest.raises(RegistryError, match="another agent"):
        reg.publish(make_descriptor("someone-else", "guarded"))
    assert not registry.descriptor_path(agent_id).exists()
    reg.publish(desc)
    assert Descriptor.from_json(registry.descriptor_path(agent_id).read_bytes()) == desc


def test_take_name_falls_back_and_names_the_live_holder(
    registry: Registry, registrations: list[Registration]
) -> None:
    first = register_agent(registry, "first", "builder", cwd=CWD, into=registrations)
    second = register_agent(registry, "second", "builder", cwd=CWD, into=registrations)
    assert first.name == "builder"
    assert second.name == fallback_name("claude", CWD, second.agent_id)
    third_id = agent_id_for("claude", "third")
    third = registry.acquire(third_id)
    registrations.append(third)
    choice = third.take_name(name_candidates("claude", CWD, third_id, "builder"))
    assert choice.is_fallback
    assert choice.preferred == "builder"
    assert choice.preferred_holder is not None
    assert choice.preferred_holder.agent_id == first.agent_id


def test_take_name_no_free_name(registry: Registry, registrations: list[Registration]) -> None:
    holder = register_agent(registry, "holder", "only", cwd=CWD, into=registrations)
    assert holder.name == "only"
    reg = registry.acquire(agent_id_for("claude", "loser"))
    registrations.append(reg)
    with pytest.raises(NoFreeName):
        reg.take_name(["only"])
    with pytest.raises(NoFreeName):
        reg.take_name([])
    with pytest.raises(RegistryError):
        reg.take_name(["../escape"])
    assert reg.name is None
    assert not (registry.home / "escape.lock").exists()


# -- rename ------------------------------------------------------------------------------------


def test_rename_moves_the_alias(
    registry: Registry, registrations: list[Registration], spawn: Spawn
) -> None:
    reg = register_agent(registry, "renamer", "old-name", cwd=CWD, into=registrations)
    assert reg.descriptor is not None
    instance = reg.descriptor.instance_id
    choice = reg.rename(["new-name"])
    assert choice.name == "new-name"
    assert reg.name == "new-name"
    on_disk = Descriptor.from_json(registry.descriptor_path(reg.agent_id).read_bytes())
    assert on_disk.name == "new-name"
    assert on_disk.instance_id == instance  # same registration, only the alias moved
    assert not lock_is_free(registry.name_lock_path("new-name"))
    assert [d.agent_id for d in registry.find("new-name")] == [reg.agent_id]
    assert registry.find("old-name") == []
    # The old alias is really released: another process can register under it now.
    kid = spawn()
    got = kid.request("register", harness="codex", session="taker", name="old-name", cwd=CWD)
    assert got["ok"]
    assert got["name"] == "old-name"
    assert not got["is_fallback"]


def test_rename_holds_the_old_alias_until_the_descriptor_is_rewritten(
    registry: Registry, registrations: list[Registration], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seed §3: new name taken under its lock, descriptor rewritten, *then* the old one released.

    Releasing first lets another agent take the old name while this descriptor still claims it:
    two live descriptors with one name (ambiguous sends, or a message for the newcomer delivered
    to us).
    """
    reg = register_agent(registry, "ordered", "before", cwd=CWD, into=registrations)
    seen: list[tuple[bool, bool]] = []
    real_write = write_atomic

    def spy(path: Path, data: bytes, mode: int = 0o600, **kw: str) -> None:
        if path == registry.descriptor_path(reg.agent_id):
            seen.append((registry.name_is_held("before"), registry.name_is_held("after")))
        real_write(path, data, mode, **kw)

    monkeypatch.setattr(registration_module, "write_atomic", spy)
    reg.rename(["after"])
    assert seen == [(True, True)]
    assert lock_is_free(registry.name_lock_path("before"))


def test_rename_to_a_held_name_keeps_the_current_one(
    registry: Registry, registrations: list[Registration]
) -> None:
    holder = register_agent(registry, "holder", "wanted", cwd=CWD, into=registrations)
    reg = register_agent(registry, "wanting", "wanted", cwd=CWD, into=registrations)
    current = reg.name
    assert current is not None
    assert current != "wanted"
    choice = reg.rename(["wanted", current])
    assert choice.name == current
    with pytest.raises(NoFreeName):
        reg.rename(["wanted"])
    assert reg.name == current
    assert not lock_is_free(registry.name_lock_path(current))  # still held after the failure
    assert [d.agent_id for d in registry.find(current)] == [reg.agent_id]
    holder.close()
    assert reg.rename(["wanted", current]).name == "wanted"
    assert lock_is_free(registry.name_lock_path(current))


# -- seed test 15: replacement vs old exit -----------------------------------------------------


@pytest.mark.seed(15)
def test_replacement_vs_old_exit_other_session(registry: Registry, spawn: Spawn) -> None:
    p1 = spawn()
    r1 = p1.request("register", harness="claude", session="session-one", name="builder", cwd=CWD)
    assert r1["ok"]
    assert r1["name"] == "builder"
    assert not r1["is_fallback"]

    # P2 binds the same name while P1 holds it: it does not register under it.
    p2 = spawn()
    r2 = p2.request("register", harness="claude", session="session-two", name="builder", cwd=CWD)
    assert r2["ok"]
    assert r2["is_fallback"]
    assert r2["name"] == fallback_name("claude", CWD, r2["agent_id"])
    assert r2["preferred_holder"] == r1["agent_id"]
    assert [d.agent_id for d in registry.find("builder")] == [r1["agent_id"]]

    # Kill P1: its descriptor stays behind, stale; its name lock is gone with it.
    p1.kill9()
    verdicts = {i.descriptor.agent_id: i.liveness for i in registry.scan()[0]}
    assert verdicts == {
        r1["agent_id"]: DescriptorLiveness.STALE, r2["agent_id"]: DescriptorLiveness.LIVE,
    }
    assert registry.find("builder") == []

    # P2 takes the name now that it is free.
    renamed = p2.request("rename")
    assert renamed["name"] == "builder"
    assert renamed["descriptor_name"] == "builder"
    assert lock_is_free(registry.name_lock_path(r2["name"]))  # its fallback is released

    # P1's exit path runs late (from a third process), followed by a sweep.
    p3 = spawn()
    exited = p3.request("stale_exit", agent_id=r1["agent_id"], descriptor=r1["descriptor"],
                        token=r1["token"])
    assert exited["ok"]
    assert r2["agent_id"] not in exited["swept"]
    assert registry.sweep_stale() == []

    # P2's registration survives, live, under the name.
    found = registry.find("builder")
    assert [(d.agent_id, d.instance_id) for d in found] == [(r2["agent_id"], r2["instance_id"])]
    assert Path(found[0].credential_ref).read_text() == r2["token"] + "\n"
    assert not lock_is_free(registry.name_lock_path("builder"))
    assert not lock_is_free(registry.agent_lock_path(r2["agent_id"]))
    # P1's own leftovers were its to remove.
    assert not registry.descriptor_path(r1["agent_id"]).exists()
    assert not registry.credential_path(r1["agent_id"]).exists()


@pytest.mark.seed(15)
def test_replacement_vs_old_exit_same_session(registry: Registry, spawn: Spawn) -> None:
    p1 = spawn()
    r1 = p1.request("register", harness="claude", session="session-s", name="builder", cwd=CWD)
    assert r1["ok"]
    assert r1["name"] == "builder"
    p1.kill9()

    # The same session registers again in a new process: same agent_id, new instance.
    p3 = spawn()
    r3 = p3.request("register", harness="claude", session="session-s", name="builder", cwd=CWD)
    assert r3["ok"]
    assert r3["agent_id"] == r1["agent_id"]
    assert r3["instance_id"] != r1["instance_id"]
    assert r3["name"] == "builder"
    assert r3["token"] != r1["token"]

    # P1's exit path cannot even take the agent lock while P3 lives ...
    p4 = spawn()
    refused = p4.request("stale_exit", agent_id=r1["agent_id"], descriptor=r1["descriptor"],
                         token=r1["token"])
    assert refused == {"op": "stale_exit", "ok": False, "error": "AgentBusy", "swept": []}
    # ... and even if it believes it holds it, the instance_id check saves P3's descriptor.
    forged = p4.request("stale_exit", agent_id=r1["agent_id"], descriptor=r1["descriptor"],
                        token=r1["token"], forge_lock=True)
    assert forged["ok"]
    assert forged["lock"] == "forged"
    assert forged["swept"] == []

    path = registry.descriptor_path(r3["agent_id"])
    assert Descriptor.from_json(path.read_bytes()).instance_id == r3["instance_id"]
    assert registry.credential_path(r3["agent_id"]).read_text() == r3["token"] + "\n"
    found = registry.find("builder")
    assert [(d.agent_id, d.instance_id) for d in found] == [(r3["agent_id"], r3["instance_id"])]
    assert registry.sweep_stale() == []
    assert path.exists()


# -- seed test 24: concurrent startup ----------------------------------------------------------

RACERS = 8
ROUNDS = 3


def _start_race(spawn: Spawn, n: int) -> tuple[list[AgentProc], int]:
    """Start ``n`` children parked on one pipe; returns them and the pipe's write end."""
    r, w = os.pipe()
    try:
        kids = [spawn(barrier_fd=r) for _ in range(n)]
        for kid in kids:
            kid.send("barrier")
        for kid in kids:
            assert kid.expect()["event"] == "waiting"
    except BaseException:
        os.close(w)
        raise
    finally:
        os.close(r)
    return kids, w


@pytest.mark.seed(24)
@pytest.mark.slow
def test_concurrent_startup_same_session(registry: Registry, spawn: Spawn) -> None:
    session = "race-session"
    agent_id = agent_id_for("claude", session)
    # A previous instance of the session crashed: there is a stale descriptor to be tempted by.
    crashed = spawn()
    assert crashed.request("register", harness="claude", session=session, name="racer",
                           cwd=CWD)["ok"]
    crashed.kill9()
    for round_no in range(ROUNDS):
        listed = {i.descriptor.agent_id: i.liveness for i in registry.scan()[0]}
        assert listed == {agent_id: DescriptorLiveness.STALE}, round_no
        kids, go = _start_race(spawn, RACERS)
        for kid in kids:
            kid.send("register", harness="claude", session=session, name="racer", cwd=CWD,
                     pre_publish_sweeps=5, sweep_if_busy=True, extra_rounds=30, timeout=60)
        os.close(go)  # every child's barrier read returns EOF at once
        results = [kid.expect(timeout=120) for kid in kids]

        winners = [(kid, res) for kid, res in zip(kids, results, strict=True) if res["ok"]]
        assert len(winners) == 1, results
        winner, won = winners[0]
        losers = [res for res in results if not res["ok"]]
        assert len(losers) == RACERS - 1
        for res in losers:
            assert res["error"] == "AgentBusy"
            assert not res["sweep"]["timed_out"]  # it saw the winner's descriptor go live
            assert res["sweep"]["removed"] == []
        assert won["removed"] == []
        assert won["name"] == "racer"

        path = registry.descriptor_path(agent_id)
        on_disk = Descriptor.from_json(path.read_bytes())
        assert on_disk.instance_id == won["instance_id"]
        assert on_disk.pid == winner.pid
        assert liveness(on_disk) is DescriptorLiveness.LIVE
        assert registry.sweep_stale() == []
        assert [d.instance_id for d in registry.find("racer")] == [won["instance_id"]]

        for kid in kids:
            if kid is not winner:
                assert kid.request("exit")["ok"]
        # The losers' exit paths removed nothing of the winner's.
        assert Descriptor.from_json(path.read_bytes()).instance_id == won["instance_id"]
        winner.kill9()  # leaves a stale descriptor for the next round


@pytest.mark.seed(24)
@pytest.mark.slow
def test_concurrent_startup_one_preferred_name(registry: Registry, spawn: Spawn) -> None:
    for round_no in range(ROUNDS):
        kids, go = _start_race(spawn, RACERS)
        sessions = [f"name-race-{round_no}-{i}" for i in range(RACERS)]
        for kid, session in zip(kids, sessions, strict=True):
            kid.send("register", harness="codex", session=session, name="shared", cwd=CWD,
                     pre_publish_sweeps=2)
        os.close(go)
        results = [kid.expect(timeout=120) for kid in kids]
        assert all(res["ok"] for res in results), results

        names = [res["name"] for res in results]
        assert names.count("shared") == 1, names
        assert len(set(names)) == RACERS
        winner = next(res for res in results if res["name"] == "shared")
        for res in results:
            assert res["preferred"] == "shared"
            if res is not winner:
                assert res["name"] == fallback_name("codex", CWD, res["agent_id"])
                assert res["preferred_holder"] in (None, winner["agent_id"])
        live = {d.agent_id: d.name for d in registry.live()}
        assert live == {res["agent_id"]: res["name"] for res in results}
        assert [d.agent_id for d in registry.find("shared")] == [winner["agent_id"]]

        for kid in kids:
            assert kid.request("exit")["ok"]
        assert registry.live() == []
        assert registry.scan() == ([], [])


# -- seed test 29: naming ----------------------------------------------------------------------

CODEX_THREADS = [
    "01a1a3c2-5b7e-7d10-9f3a-1c2d3e4f5a60",
    "01a1a3c2-5b7e-7d10-9f3a-1c2d3e4f5a61",
    "01a1a3c2-5b7f-7011-8e2b-2d3e4f5a6b70",
    "01a1a3d9-0c11-7a22-b3c4-d5e6f7a8b9c0",
]
FIFTH_THREAD = "01a1a3c2-5b7e-7d10-9f3a-1c2d3e4f5a62"


@pytest.mark.seed(29)
def test_naming_four_codex_threads_sharing_a_prefix(
    registry: Registry, spawn: Spawn, tmp_path: Path
) -> None:
    cwd = str(tmp_path / "proj")
    ids = [agent_id_for("codex", t) for t in CODEX_THREADS]
    assert len({t[:6] for t in CODEX_THREADS}) == 1
    assert len({i[:8] for i in ids}) == 4  # sha256 of the whole thread id separates them

    kids, go = _start_race(spawn, len(CODEX_THREADS))
    for kid, thread in zip(kids, CODEX_THREADS, strict=True):
        kid.send("register", harness="codex", session=thread, cwd=cwd)  # no harness name
    os.close(go)
    results = [kid.expect(timeout=120) for kid in kids]

    names = [res["name"] for res in results]
    assert len(set(names)) == 4
    for res, agent_id in zip(results, ids, strict=True):
        assert res["ok"]
        assert res["agent_id"] == agent_id
        assert res["name"] == f"codex-proj-{agent_id[:8]}"
        assert res["name"] == fallback_name("codex", cwd, agent_id)
    assert sorted(d.name for d in registry.live()) == sorted(names)


@pytest.mark.seed(29)
@pytest.mark.parametrize("holder", ["bare_lock", "registration"])
def test_naming_fifth_agent_extends_its_suffix(
    registry: Registry, spawn: Spawn, tmp_path: Path, holder: str
) -> None:
    cwd = str(tmp_path / "proj")
    four = [spawn() for _ in CODEX_THREADS]
    for kid, thread in zip(four, CODEX_THREADS, strict=True):
        assert kid.request("register", harness="codex", session=thread, cwd=cwd)["ok"]

    fifth_id = agent_id_for("codex", FIFTH_THREAD)
    eight = fallback_name("codex", cwd, fifth_id, 8)
    ten = fallback_name("codex", cwd, fifth_id, 10)
    assert eight not in {d.name for d in registry.live()}

    blocker = spawn()
    if holder == "bare_lock":
        assert blocker.request("hold_lock", path=str(registry.name_lock_path(eight)))["held"]
        expected_holder = None
    else:  # a Claude session that happens to be *named* exactly that
        got = blocker.request("register", harness="claude", session="squatter", name=eight,
                              cwd="/elsewhere")
        assert got["ok"]
        assert got["name"] == eight
        expected_holder = got["agent_id"]

    fifth = spawn()
    res = fifth.request("register", harness="codex", session=FIFTH_THREAD, cwd=cwd)
    assert res["ok"]
    assert res["preferred"] == eight
    assert res["name"] == ten
    assert res["name"] != eight
    assert res["name"].endswith("-" + fifth_id[:10])
    assert res["is_fallback"]
    assert res["preferred_holder"] == expected_holder
    all_names = [d.name for d in registry.live()]
    assert len(all_names) == len(set(all_names))  # nobody shares a name
    assert [d.agent_id for d in registry.find(ten)] == [fifth_id]
    assert not lock_is_free(registry.name_lock_path(eight))  # the holder keeps its name

    # Two hex more while that is taken as well.
    fifth.kill9()
    sixth = spawn()
    assert sixth.request("hold_lock", path=str(registry.name_lock_path(ten)))["held"]
    again = spawn()
    res2 = again.request("register", harness="codex", session=FIFTH_THREAD, cwd=cwd)
    assert res2["name"] == fallback_name("codex", cwd, fifth_id, 12)
    assert res2["name"].endswith("-" + fifth_id[:12])


# -- hardening: leftovers of crashed processes, odd files, failed renames ----------------------


def test_sweep_removes_a_dead_owners_token_too(
    registry: Registry, spawn: Spawn
) -> None:
    kid = spawn()
    got = kid.request("register", harness="claude", session="dies", name="dies", cwd=CWD)
    assert got["ok"]
    token_path = registry.credential_path(got["agent_id"])
    assert token_path.exists()
    kid.kill9()
    assert registry.sweep_stale() == [got["agent_id"]]
    assert not registry.descriptor_path(got["agent_id"]).exists()
    assert not token_path.exists()


def test_sweep_removes_old_temp_files_only(registry: Registry) -> None:
    old = registry.agents_dir / ".0123456789abcdef.json.a1b2c3.tmp"
    new = registry.credentials_dir / ".0123456789abcdef.token.d4e5f6.tmp"
    for p in (old, new):
        p.write_bytes(b"half")
    os.utime(old, (1_000_000, 1_000_000))
    registry.sweep_stale()
    assert not old.exists()
    assert new.exists()  # a writer may still be about to rename it


def test_scan_does_not_hang_on_a_fifo_or_follow_a_symlink(
    registry: Registry, registrations: list[Registration], tmp_path: Path
) -> None:
    good = register_agent(registry, "fifo-good", "fifo-good", cwd=CWD, into=registrations)
    fifo = registry.agents_dir / f"{agent_id_for('claude', 'fifo')}.json"
    os.mkfifo(fifo)
    target = tmp_path / "elsewhere.json"
    target.write_bytes(make_descriptor(session="link").to_json())
    link = registry.agents_dir / f"{agent_id_for('claude', 'link')}.json"
    link.symlink_to(target)
    listed, bad = registry.scan()
    assert [item.descriptor.agent_id for item in listed] == [good.agent_id]
    assert {u.path for u in bad} == {fifo, link}


def test_agent_id_shaped_names_are_invalid(registry: Registry) -> None:
    with pytest.raises(RegistryError):
        registry.name_lock_path("0123456789abcdef")
    with pytest.raises(DescriptorError):
        Descriptor.from_dict(valid_dict(name="0123456789abcdef"))


def test_unknown_fields_never_override_known_ones() -> None:
    desc = replace(make_descriptor(), extra={"name": "evil", "future_field": 1})
    data = json.loads(desc.to_json())
    assert data["name"] == "alpha"
    assert data["future_field"] == 1


def test_failed_rename_keeps_the_old_alias(
    registry: Registry, registrations: list[Registration], monkeypatch: pytest.MonkeyPatch
) -> None:
    reg = register_agent(registry, "ren-fail", "before", cwd=CWD, into=registrations)

    def broken(*_: object, **__: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(registration_module, "write_atomic", broken)
    with pytest.raises(OSError, match="No space"):
        reg.rename(["after"])
    monkeypatch.undo()
    assert reg.name == "before"
    assert not lock_is_free(registry.name_lock_path("before"))
    assert lock_is_free(registry.name_lock_path("after"))
    assert [d.name for d in registry.live()] == ["before"]


def test_acquire_waits_out_a_momentary_probe(registry: Registry) -> None:
    agent_id = agent_id_for("claude", "probe-race")
    probe = FileLock.try_acquire(registry.agent_lock_path(agent_id))
    assert probe is not None
    timer = threading.Timer(0.05, probe.release)  # a sweeper letting go
    timer.start()
    try:
        reg = registry.acquire(agent_id, patience=2.0)
    finally:
        timer.join()
    reg.close()
    held = registry.acquire(agent_id)
    try:
        with pytest.raises(AgentBusy):
            registry.acquire(agent_id, patience=0.05)
    finally:
        held.close()


# -- something not ours at a lock path (issue 12, item 8) ---------------------------------------


@pytest.mark.parametrize("kind", ["directory", "fifo", "symlink"])
def test_something_not_a_lock_file_at_a_name_lock_gives_the_next_candidate(
    registry: Registry, registrations: list[Registration], tmp_path: Path, kind: str
) -> None:
    planted = registry.name_lock_path("wanted")
    if kind == "directory":
        planted.mkdir()
    elif kind == "fifo":
        os.mkfifo(planted)
    else:
        target = tmp_path / "elsewhere"
        target.write_text("not a lock")
        planted.symlink_to(target)
    reg = registry.acquire(agent_id_for("claude", f"blocked-{kind}"))
    registrations.append(reg)
    choice = reg.take_name(["wanted", "fallback"])
    assert (choice.name, choice.is_fallback) == ("fallback", True)
    assert choice.preferred_blocked is not None
    assert choice.preferred_blocked.path == planted
    assert str(planted) in str(choice.preferred_blocked)
    assert os.path.lexists(planted)  # not ours: left where it is


def test_a_directory_at_an_agent_lock_is_a_clear_error(registry: Registry) -> None:
    agent_id = agent_id_for("claude", "blocked-agent")
    planted = registry.agent_lock_path(agent_id)
    planted.mkdir()
    with pytest.raises(StatePathError) as caught:
        registry.acquire(agent_id)
    assert isinstance(caught.value, OSError)  # every caller surviving a failed open survives it
    assert str(caught.value) == (
        f"{planted} is a directory where the lock file of agent {agent_id} belongs; "
        f"CrossTalk cannot use it (and never makes one there). To clear it: rmdir {planted}")
    planted.rmdir()
    registry.acquire(agent_id).close()


# -- the owner puts back a damaged descriptor (issue 12, item 9) --------------------------------


def test_keep_published_puts_back_a_torn_removed_or_replaced_descriptor(
    registry: Registry, registrations: list[Registration], tmp_path: Path
) -> None:
    reg = register_agent(registry, "keeper", "keeper", cwd=CWD, into=registrations)
    path = registry.descriptor_path(reg.agent_id)
    published = path.read_bytes()
    assert reg.keep_published() is False  # intact: not even rewritten
    assert path.read_bytes() == published

    path.write_bytes(published[:40])
    assert registry.scan()[0] == []  # invisible while torn
    assert reg.keep_published() is True
    assert path.read_bytes() == published
    path.unlink()
    assert reg.keep_published() is True
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_bytes(published)
    path.unlink()
    path.symlink_to(elsewhere)
    assert reg.keep_published() is True
    assert not path.is_symlink()
    assert [d.agent_id for d in registry.live()] == [reg.agent_id]

    # A later publish (a claim, a rename) is what must stay: the check compares with it.
    assert reg.descriptor is not None
    reg.publish(replace(reg.descriptor, role="subagent", owner="f" * 16))
    assert reg.keep_published() is False
    assert Descriptor.from_json(path.read_bytes()).role == "subagent"

    reg.close()
    assert reg.keep_published() is False  # closed: nothing to keep
    assert not path.exists()


def test_remove_unreadable_only_without_a_live_lock_holder(
    registry: Registry, registrations: list[Registration]
) -> None:
    held = register_agent(registry, "held-bad", "held-bad", cwd=CWD, into=registrations)
    registry.descriptor_path(held.agent_id).write_bytes(b"{")
    dead_id = agent_id_for("claude", "dead-bad")
    registry.descriptor_path(dead_id).write_bytes(b"{")
    registry.credential_path(dead_id).write_bytes(b"token\n")
    bad = {u.agent_id: u for u in registry.scan()[1]}
    assert registry.agent_is_held(held.agent_id)
    assert not registry.agent_is_held(dead_id)
    assert registry.remove_unreadable(bad[held.agent_id]) is False
    assert registry.remove_unreadable(bad[dead_id]) is True
    assert not registry.descriptor_path(dead_id).exists()
    assert not registry.credential_path(dead_id).exists()
    assert registry.descriptor_path(held.agent_id).read_bytes() == b"{"


def test_sweep_skips_a_stale_agent_whose_lock_path_is_blocked(
    registry: Registry, dead_process: tuple[int, str]
) -> None:
    dead_pid, dead_start = dead_process
    blocked = make_descriptor("blocked-stale", "blocked-stale", pid=dead_pid,
                              started_at=dead_start)
    swept = make_descriptor("swept-stale", "swept-stale", pid=dead_pid, started_at=dead_start)
    path = plant(registry, blocked)
    plant(registry, swept)
    registry.agent_lock_path(blocked.agent_id).mkdir()
    assert registry.sweep_stale() == [swept.agent_id]
    assert path.exists()  # unproven without its lock: left, and doctor names the directory


# -- the scan's memo of settled files ----------------------------------------------------------


def test_a_settled_descriptor_is_not_reread_and_any_change_is_seen(
        registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    """A scan keeps the parse of a file whose lstat has not changed since it was read (and
    that was settled then); a rewrite in place, a replacement, a removal, a file turned into
    a symlink or garbage: each is read anew on the next scan."""
    from crosstalk.store import registry as registry_module
    reads: list[Path] = []
    real = registry_module.read_descriptor

    def counting(path: Path) -> Descriptor:
        reads.append(path)
        return real(path)

    monkeypatch.setattr(registry_module, "read_descriptor", counting)
    monkeypatch.setattr(registry_module, "_SETTLED_NS", -(10 ** 12))  # every file settled
    desc = make_descriptor()
    path = plant(registry, desc)
    assert [d.name for d in registry.live()] == ["alpha"]
    assert [d.name for d in registry.live()] == ["alpha"]
    assert len(reads) == 1, "the second scan kept the first one's parse"

    path.write_bytes(replace(desc, name="bravo-longer").to_json())  # in place: same inode
    assert [d.name for d in registry.live()] == ["bravo-longer"]
    plant(registry, replace(desc, name="gamma"))  # replaced: a new inode
    assert [d.name for d in registry.find("gamma")] == ["gamma"]
    path.write_bytes(b'{"torn')
    listed, bad = registry.scan()
    assert listed == []
    assert [b.path for b in bad] == [path]
    path.unlink()
    path.symlink_to(tmp := path.with_name("elsewhere.txt"))
    tmp.write_bytes(desc.to_json())
    listed, bad = registry.scan()
    assert listed == [], "a symlink is never a descriptor"
    assert [b.path for b in bad] == [path]
    path.unlink()
    assert registry.live() == []
    assert registry.scan() == ([], [])


def test_the_kept_listing_sees_every_name_added_removed_or_renamed(
        registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    # A settled directory's listing is kept between scans; any name that comes or goes
    # changes the directory's times, so the next scan lists it again.
    from crosstalk.store import registry as registry_module
    monkeypatch.setattr(registry_module, "_SETTLED_NS", -(10 ** 12))  # everything settled
    listings: list[object] = []
    real = os.scandir

    def counting(path: Any) -> Any:
        listings.append(path)
        return real(path)

    monkeypatch.setattr(registry_module.os, "scandir", counting)
    first = plant(registry, make_descriptor())
    assert [d.name for d in registry.live()] == ["alpha"]
    assert [d.name for d in registry.live()] == ["alpha"]
    assert len(listings) == 1, "the second scan kept the first one's listing"
    plant(registry, make_descriptor(session="s-2", name="bravo"))  # a name added
    assert sorted(d.name for d in registry.live()) == ["alpha", "bravo"]
    moved = first.with_name("zz-" + first.name)
    first.rename(moved)  # renamed: listed under its new name (unreadable there: not its id)
    listed, bad = registry.scan()
    assert [x.descriptor.name for x in listed] == ["bravo"]
    assert [b.path for b in bad] == [moved]
    moved.unlink()  # removed
    assert registry.scan() == (listed, [])
    assert len(listings) == 4


def test_a_descriptor_written_within_the_settling_time_is_read_every_scan(
        registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    # Two writes within one timestamp tick can leave the same lstat: a file that new is not
    # kept, so a write after the read cannot go unseen.
    from crosstalk.store import registry as registry_module
    reads: list[Path] = []
    real = registry_module.read_descriptor

    def counting(path: Path) -> Descriptor:
        reads.append(path)
        return real(path)

    monkeypatch.setattr(registry_module, "read_descriptor", counting)
    monkeypatch.setattr(registry_module, "_SETTLED_NS", 10 ** 15)  # nothing ever settles
    monkeypatch.setattr(registry_module, "_SETTLED_FINE_NS", 10 ** 15)
    plant(registry, make_descriptor())
    for _ in range(3):
        assert [d.name for d in registry.live()] == ["alpha"]
    assert len(reads) == 3
