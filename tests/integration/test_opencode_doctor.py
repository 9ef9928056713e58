"""``crosstalk doctor`` on opencode's instance records: read with the harness's own reader
(``records.scan``), a live instance asked what discovery asks it (a real fake opencode on a
real unix socket), so doctor says what a sender would find."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from crosstalk.harness.opencode import setup
from crosstalk.harness.opencode.records import FORMAT, record_stem
from crosstalk.proc import process_start_time
from tests.support.fakes.opencode_instance import FakeOpencode
from tests.unit.test_opencode_setup import env_for, installed

pytestmark = pytest.mark.anyio


def write_record(records: Path, owner: int, directory: str, **fields: Any) -> Path:
    """A record as the plugin names and writes it for process ``owner`` (tests spoil it
    through ``fields``)."""
    records.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = records / f"{record_stem(owner, directory)}.json"
    path.write_text(json.dumps({"format": FORMAT, "version": 1, "pid": owner,
                                "process_start": process_start_time(owner),
                                "directory": directory, "socket": "/nowhere.sock",
                                "opencode_version": "1.18.33", "written_at": 1.0,
                                **fields}))
    return path


async def test_doctor_reads_records_as_the_harness_does(tmp_path: Path) -> None:
    """Doctor reads the records with the harness's own reader (``records.scan``) and asks a
    live instance what discovery asks it: what it says is what a sender would find."""
    env = env_for(tmp_path, CROSSTALK_HOME=str(tmp_path / "state"))
    installed(tmp_path, env)
    records = tmp_path / "state" / "opencode"
    folder = tempfile.mkdtemp(prefix="ct-doc-", dir="/tmp")
    live = await FakeOpencode(os.path.join(folder, "i.sock"), "/w/a",
                              str(tmp_path / "state")).start()
    try:
        idle, busy = live.add_session("idle one"), live.add_session("busy one")
        live.sessions[idle]["time"]["updated"] = 1000  # stored before this process published
        live.set_busy(busy, True)
        me = os.getpid()
        write_record(records, me, "/w/b", process_start="1")  # its process is gone
        write_record(records, me, "/w/c", socket=str(tmp_path / "none.sock"))
        (records / "torn.json").write_text('{"format": "crosstalk-open')
        forged = write_record(records, me, "/w/d", pid="1")
        (records / "alien.json").write_text('{"format": "something-else", "version": 1}')
        misnamed = records / "misnamed.json"
        misnamed.write_text(write_record(records, me, "/w/e").read_text())
        found = await asyncio.to_thread(setup.doctor, env)
    finally:
        await live.stop()
        shutil.rmtree(folder, ignore_errors=True)
    text = "\n".join(f.line() for f in found)
    # The idle session is stored, not run by this process: discovery does not list it.
    assert f"opencode {me} in /w/a: reachable, 1 sessions live, 1 busy (opencode 1.18.33)" \
        in text, text
    assert {idle, busy} <= set(live.sessions)
    assert f"{record_stem(me, '/w/b')}.json: its process is gone (a stale record, ignored)" \
        in text
    assert f"opencode {me} in /w/c: its socket {tmp_path / 'none.sock'} does not answer " \
        "(socket_missing" in text
    assert f"fix: restart that opencode (pid {me})" in text
    assert f"rm {records / 'torn.json'}" in text
    assert f"{forged.name}: forged_record: pid" in text
    assert f"rm {forged}" in text
    assert "alien.json: unknown_record_format: something-else v1" in text
    assert f"{misnamed.name}: forged_record: file name does not match" in text
