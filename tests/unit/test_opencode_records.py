"""The opencode plugin's instance records: validated, and live only with a process and a
socket that are what the record says (real files, real processes, real sockets)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crosstalk import proc
from crosstalk.harness.opencode.records import (
    RecordError,
    check_live,
    host_record,
    parse_record,
    read_record,
    record_stem,
    records_dir,
    scan,
)


@pytest.fixture
def listening() -> Iterator[str]:
    """A unix socket of ours, mode 0600, that accepts connections."""
    folder = tempfile.mkdtemp(prefix="ct-oc-", dir="/tmp")
    path = os.path.join(folder, "i.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    os.chmod(path, 0o600)
    s.listen(8)
    yield path
    s.close()
    os.unlink(path)
    os.rmdir(folder)


def _record(sock: str, directory: str = "/work/p", **over: Any) -> dict[str, Any]:
    pid = os.getpid()
    return {"format": "crosstalk-opencode-instance", "version": 1, "pid": pid,
            "process_start": proc.process_start_time(pid), "directory": directory,
            "socket": sock, "opencode_version": "1.18.33", "written_at": time.time(), **over}


def _write(env: dict[str, str], doc: dict[str, Any] | bytes, stem: str | None = None) -> Path:
    folder = records_dir(env)
    folder.mkdir(parents=True, exist_ok=True)
    if stem is None:
        assert isinstance(doc, dict)
        stem = record_stem(doc["pid"], doc["directory"])
    path = folder / f"{stem}.json"
    path.write_bytes(doc if isinstance(doc, bytes) else json.dumps(doc).encode())
    return path


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"CROSSTALK_HOME": str(tmp_path / "state"), "HOME": str(tmp_path)}


def test_a_live_record_of_ours_is_used(env: dict[str, str], listening: str) -> None:
    path = _write(env, _record(listening))
    record = read_record(path)
    check_live(record)
    assert record.opencode_version == "1.18.33"
    assert host_record(env, os.getpid(), "/work/p") == record
    [found] = list(scan(env))
    assert found.record == record


@pytest.mark.parametrize(("raw", "reason"), [
    (b'{"format": "crosstalk-opencode-instance", "vers', "torn_record"),
    (b"\xff\xfe not utf-8", "torn_record"),
    (b"[1, 2]", "forged_record"),
    (b'{"format": "something-else", "version": 1}', "unknown_record_format"),
    (b'{"format": "crosstalk-opencode-instance", "version": 2}', "unknown_record_format"),
    (b"x" * 20000, "forged_record"),
])
def test_torn_and_foreign_records_say_why(env: dict[str, str], raw: bytes,
                                          reason: str) -> None:
    path = _write(env, raw, stem="123-abcdefabcdef")
    with pytest.raises(RecordError) as got:
        read_record(path)
    assert got.value.reason == reason
    [found] = list(scan(env))
    assert found.record is None
    assert found.reason == reason


@pytest.mark.parametrize("field", ["pid", "process_start", "directory", "socket",
                                   "opencode_version", "written_at"])
def test_a_field_of_the_wrong_type_is_forged(field: str, listening: str) -> None:
    doc = _record(listening)
    bad: dict[str, Any] = {"pid": "12", "process_start": 12, "directory": "relative",
                           "socket": None, "opencode_version": 1, "written_at": "now"}
    doc[field] = bad[field]
    with pytest.raises(RecordError) as got:
        parse_record(json.dumps(doc).encode(), f"/x/{os.getpid()}-000000000000.json")
    assert got.value.reason == "forged_record"


def test_a_file_name_that_is_not_the_records_is_forged(listening: str) -> None:
    doc = _record(listening)
    with pytest.raises(RecordError) as got:
        parse_record(json.dumps(doc).encode(), "/x/1-000000000000.json")
    assert got.value.reason == "forged_record"


def test_a_dead_pid_is_stale(env: dict[str, str], listening: str) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    start = proc.process_start_time(child.pid)
    child.wait()
    doc = _record(listening, pid=child.pid, process_start=start or "1")
    with pytest.raises(RecordError) as got:
        check_live(read_record(_write(env, doc)))
    assert got.value.reason == "pid_gone"


def test_a_recycled_pid_is_stale(env: dict[str, str], listening: str) -> None:
    doc = _record(listening, process_start="1")
    with pytest.raises(RecordError) as got:
        check_live(read_record(_write(env, doc)))
    assert got.value.reason == "process_start_mismatch"


def test_a_socket_others_may_use_is_not_ours(env: dict[str, str], listening: str) -> None:
    os.chmod(listening, 0o666)
    with pytest.raises(RecordError) as got:
        check_live(read_record(_write(env, _record(listening))))
    assert got.value.reason == "socket_not_ours"


def test_a_file_that_is_not_a_socket_is_not_ours(env: dict[str, str], tmp_path: Path) -> None:
    plain = tmp_path / "plain.sock"
    plain.write_text("")
    plain.chmod(0o600)
    with pytest.raises(RecordError) as got:
        check_live(read_record(_write(env, _record(str(plain)))))
    assert got.value.reason == "socket_not_ours"


def test_a_missing_or_dead_socket_is_unusable(env: dict[str, str], tmp_path: Path) -> None:
    with pytest.raises(RecordError) as got:
        check_live(read_record(_write(env, _record(str(tmp_path / "none.sock")))))
    assert got.value.reason == "socket_missing"
    folder = tempfile.mkdtemp(prefix="ct-oc-", dir="/tmp")
    dead = os.path.join(folder, "d.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(dead)
    os.chmod(dead, 0o600)
    s.close()  # the file stays, nobody listens (a killed opencode's socket)
    with pytest.raises(RecordError) as got:
        check_live(read_record(_write(env, _record(dead, directory="/work/q"))))
    assert got.value.reason == "socket_refused"


def test_the_host_is_found_through_a_symlinked_directory(env: dict[str, str], tmp_path: Path,
                                                         listening: str) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    _write(env, _record(listening, directory=str(tmp_path / "link")))
    record = host_record(env, os.getpid(), str(real))
    assert record.directory == str(tmp_path / "link")
    with pytest.raises(RecordError) as got:
        host_record(env, os.getpid(), str(tmp_path))
    assert got.value.reason == "no_record"
