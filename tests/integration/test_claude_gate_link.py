"""The gate helper's link, process by process (ADR 0020): real helper processes, real sockets.

A helper that dies while a write is in flight leaves that write ``unknown`` (it may have been
written), never accepted; the next link is a new helper. A closed link ends its helper, and a
shim killed with SIGKILL ends it too. A relayed control frame's credentials count only when
this very process relayed it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from crosstalk import proc
from crosstalk.core.states import MessageState
from crosstalk.harness.claude import gate
from crosstalk.proc import ancestors
from tests.support.claude import running
from tests.support.dirs import short_dir
from tests.support.waiting import eventually, eventually_sync

pytestmark = pytest.mark.anyio


@pytest.fixture
async def sockets() -> AsyncIterator[Path]:
    with short_dir("ct-gl-") as d:
        yield d
        gate.close_all()


def target(d: Path) -> gate.Target:
    return gate.Target(os.getpid(), proc.process_start_time(os.getpid()), str(d / "agent.sock"))


async def test_a_helper_killed_mid_write_leaves_the_write_unknown(sockets: Path) -> None:
    held: list[asyncio.StreamWriter] = []

    async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # reads nothing, never closes: the write waits for our EOF
        await asyncio.sleep(60)

    server = await asyncio.start_unix_server(stall, str(sockets / "inbox.sock"))
    try:
        link = await gate.link_for(target(sockets))
        assert link.pid is not None
        assert os.getpid() not in ancestors(link.pid)
        write = asyncio.ensure_future(link.write(str(sockets / "inbox.sock"), b'{"x":1}\n'))
        await eventually(lambda: held, what="the helper connected to the inbox")
        os.kill(link.pid, signal.SIGKILL)
        got = await asyncio.wait_for(write, 20)
        assert (got.state, got.reason) == (MessageState.UNKNOWN, "helper_exited")
        again = await gate.link_for(target(sockets))
        assert again is not link
        assert again.pid != link.pid
        missing = await again.write(str(sockets / "nobody.sock"), b"{}\n")
        assert (missing.state, missing.reason) == (MessageState.UNREACHABLE, "inbox_missing")
    finally:
        server.close()


async def test_a_closed_link_ends_its_helper_and_removes_its_socket(sockets: Path) -> None:
    link = await gate.link_for(target(sockets))
    assert link.pid is not None
    assert Path(link.path).exists()
    link.close()
    await eventually(lambda: not running(link.pid or 0), what="the helper exited")
    await eventually(lambda: not Path(link.path).exists(), what="its socket removed")


def test_a_helper_outlives_no_shim_killed_with_sigkill(tmp_path: Path) -> None:
    """A stand-in shim (a real process running a link) is SIGKILLed: its helper goes too."""
    with short_dir("ct-gk-") as d:
        script = "\n".join([
            "import asyncio, os",
            "from crosstalk.harness.claude import gate",
            "async def main():",
            f"    t = gate.Target(os.getppid(), None, {str(d / 'a.sock')!r})",
            "    link = await gate.link_for(t)",
            "    print(link.pid, flush=True)",
            "    await asyncio.sleep(120)",
            "asyncio.run(main())"])
        shim = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
        try:
            assert shim.stdout is not None
            helper = int(shim.stdout.readline())
            assert running(helper)
            assert shim.pid not in ancestors(helper)
            shim.send_signal(signal.SIGKILL)
            shim.wait(10)
            eventually_sync(lambda: not running(helper), what="the helper gone with its shim")
        finally:
            if shim.poll() is None:
                shim.kill()
                shim.wait()
            shim.stdout and shim.stdout.close()


def test_relayed_credentials_count_only_from_this_process() -> None:
    frame = {"type": "control", "action": "peer_message_status",
             gate.RELAY_KEY: {"pid": 4242, "start": "99"}}
    me, start = os.getpid(), proc.process_start_time(os.getpid())
    real = gate.unwrap(frame, me, start)
    assert real is not None
    assert real[1:] == (4242, "99")
    assert gate.RELAY_KEY not in real[0]
    assert gate.unwrap(frame, me + 1, start) is None  # forged by another process
    plain = {"type": "control", "action": "peer_message_status"}
    assert gate.unwrap(plain, 7, "1") == (plain, 7, "1")

