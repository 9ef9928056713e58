"""``crosstalk send`` and ``crosstalk tail`` as real subprocesses against a running ingress.

The receiving agent is registered by this test process and serves its uds ingress on a loop
thread; the CLI is a separate, unregistered process, so it is an unverified sender.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from crosstalk.config import uds_key_path
from crosstalk.core.ids import agent_id_for, new_instance_id
from crosstalk.store.files import write_atomic
from crosstalk.store.registry import Descriptor, own_process_identity
from tests.support.agents import register_agent
from tests.support.dirs import short_dir
from tests.support.uds import LoopThread, Node, make_node

NAME = "receiver-r"


@dataclass
class Env:
    node: Node
    loop: LoopThread
    sockdir: Path

    @property
    def home(self) -> Path:
        return self.node.home

    def run(self, *args: str, stdin: str | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "CROSSTALK_HOME": str(self.home)}
        return subprocess.run([sys.executable, "-m", "crosstalk", *args], input=stdin,
                              capture_output=True, text=True, env=env, timeout=timeout,
                              check=False)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    with short_dir() as sockdir:
        session = "receiver-session"
        node = make_node(tmp_path / "state", sockdir / f"{agent_id_for('fake', session)}.sock",
                         session=session)
        node.registrations.append(register_agent(node.registry, session, NAME, harness="fake",
                                                 uds_path=node.path, exact_name=True))
        assert node.registrations[0].agent_id == node.agent_id
        loop = LoopThread()
        try:
            loop.run(node.start())
            yield Env(node, loop, sockdir)
        finally:
            with contextlib.suppress(Exception):
                loop.run(node.stop())
            loop.close()
            for r in node.registrations:
                r.close()
            node.journal.close()


def parse_out(out: str) -> tuple[str, str, str]:
    mid, state, reason = out.split()
    return mid, state, reason


def assert_no_secret(e: Env, proc: subprocess.CompletedProcess[str]) -> None:
    token = e.node.token()
    assert token not in proc.stdout
    assert token not in proc.stderr


# -- send ----------------------------------------------------------------------------------


def test_send_delivers_as_an_unverified_inform_and_prints_the_ack(env: Env) -> None:
    proc = env.run("send", NAME, "hello from a script")
    assert proc.returncode == 0, proc.stderr
    mid, state, reason = parse_out(proc.stdout)
    assert (state, reason) == ("accepted", "-")
    assert uuid.UUID(mid).version == 7
    assert env.node.states(mid) == ["submitted", "dispatching", "accepted"]
    [written] = env.node.harness.writes
    assert written.text == "hello from a script"
    msg = written.delivery.message
    assert msg.message_id == mid
    assert not msg.native
    assert not msg.sender.verified
    assert msg.sender.label == "unverified"
    assert msg.sender.peer_pid not in (None, os.getpid())
    assert written.delivery.wake is False
    assert_no_secret(env, proc)


def test_send_by_agent_id_with_json_output(env: Env) -> None:
    proc = env.run("send", env.node.agent_id, "by id", "--json")
    assert proc.returncode == 0, proc.stderr
    ack = json.loads(proc.stdout)
    assert ack["type"] == "ack"
    assert ack["state"] == "accepted"
    assert ack["reason"] is None
    assert env.node.states(ack["message_id"])[-1] == "accepted"


def test_send_reads_the_text_from_stdin(env: Env) -> None:
    proc = env.run("send", NAME, "-", stdin="line one\nline two\n")
    assert proc.returncode == 0, proc.stderr
    assert env.node.harness.texts() == ["line one\nline two"]


def test_a_rejected_message_exits_1_with_its_reason(env: Env) -> None:
    proc = env.run("send", NAME, "-", stdin="x" * (70 * 1024))  # over the 64 KiB admission
    assert proc.returncode == 1, proc.stderr
    mid, state, reason = parse_out(proc.stdout)
    assert (state, reason) == ("rejected", "message_too_large")
    assert env.node.states(mid) == ["rejected"]
    assert env.node.harness.writes == []


def test_unknown_name_exits_3(env: Env) -> None:
    proc = env.run("send", "nobody-here", "hi")
    assert proc.returncode == 3
    assert "nobody-here" in proc.stderr
    assert env.node.harness.writes == []


def test_ambiguous_name_exits_3_and_lists_the_candidates(env: Env) -> None:
    # Name locks make this impossible for well-behaved shims; a hand-written or foreign
    # descriptor can still produce it, and send must refuse to pick one.
    pid, started = own_process_identity()
    other = agent_id_for("fake", "impostor-session")
    desc = Descriptor(agent_id=other, name=NAME, harness="fake", session_ref="impostor-session",
                      cwd="/", pid=pid, started_at=started, instance_id=new_instance_id(),
                      credential_ref="/nonexistent", uds_path=str(env.sockdir / "x.sock"))
    write_atomic(env.node.registry.descriptor_path(other), desc.to_json())
    proc = env.run("send", NAME, "hi")
    assert proc.returncode == 3
    assert "ambiguous" in proc.stderr
    assert env.node.agent_id in proc.stderr
    assert other in proc.stderr
    assert env.node.harness.writes == []


def test_missing_key_exits_4_and_creates_no_key(env: Env) -> None:
    path = env.sockdir / "keyless.sock"
    env.node.registrations.append(register_agent(env.node.registry, "keyless", "keyless",
                                                 uds_path=path, exact_name=True))
    proc = env.run("send", "keyless", "hi")
    assert proc.returncode == 4
    assert "key" in proc.stderr
    assert not uds_key_path(path).exists()


def test_dead_socket_exits_4(env: Env) -> None:
    path = env.sockdir / "dead.sock"
    env.node.registrations.append(register_agent(env.node.registry, "dead", "dead", uds_path=path,
                                                 exact_name=True))
    write_atomic(uds_key_path(path), b"0123456789abcdef0123456789abcdef\n")
    proc = env.run("send", "dead", "hi")  # no socket file at all
    assert proc.returncode == 4
    assert "cannot connect" in proc.stderr
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(os.fspath(path))  # a socket file nobody listens on (a crashed shim)
    stale.close()
    proc = env.run("send", "dead", "hi")
    assert proc.returncode == 4
    assert "cannot connect" in proc.stderr


@pytest.mark.parametrize("behaviour", ["close_at_once", "never_answer"])
def test_no_ack_exits_4(env: Env, behaviour: str) -> None:
    path = env.sockdir / "mute.sock"
    env.node.registrations.append(register_agent(env.node.registry, "mute", "mute", uds_path=path,
                                                 exact_name=True))
    write_atomic(uds_key_path(path), b"0123456789abcdef0123456789abcdef\n")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(os.fspath(path))
    listener.listen(1)
    conns: list[socket.socket] = []

    def serve() -> None:
        conn, _ = listener.accept()
        if behaviour == "close_at_once":
            conn.recv(65536)
            conn.close()
        else:
            conns.append(conn)  # hold it open, say nothing

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        proc = env.run("send", "mute", "hi", "--timeout", "1")
        assert proc.returncode == 4
        assert ("without an ack" if behaviour == "close_at_once" else "in time") in proc.stderr
    finally:
        t.join(timeout=10)
        for c in conns:
            c.close()
        listener.close()


@pytest.mark.parametrize("args", [("send",), ("send", NAME), ("send", NAME, "")])
def test_usage_errors_exit_2(env: Env, args: tuple[str, ...]) -> None:
    proc = env.run(*args)
    assert proc.returncode == 2
    assert env.node.harness.writes == []


# -- tail ----------------------------------------------------------------------------------


def test_tail_prints_the_journal_readably(env: Env) -> None:
    sent = env.run("send", NAME, "tail should show this text")
    mid = parse_out(sent.stdout)[0]
    proc = env.run("tail", NAME)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if mid in ln]
    assert [ln.split()[4] for ln in lines] == ["submitted", "dispatching", "accepted"]
    assert "tail should show this text" in lines[0]
    assert all(" unverified" in ln and " message " in ln for ln in lines)
    assert lines[0].split()[1] == "#1"
    by_id = env.run("tail", env.node.agent_id)
    assert by_id.stdout == proc.stdout


def test_tail_json_and_all_agents(env: Env) -> None:
    env.run("send", NAME, "one")
    proc = env.run("tail", NAME, "--json")
    records = [json.loads(ln) for ln in proc.stdout.splitlines()]
    assert [r["seq"] for r in records] == [1, 2, 3]
    assert records[0]["text"] == "one"
    every = env.run("tail")
    assert every.returncode == 0
    assert all(ln.startswith(env.node.agent_id + " ") for ln in every.stdout.splitlines())
    assert len(every.stdout.splitlines()) == 3
    assert env.run("tail", "nobody-here").returncode == 3


def test_tail_follow_prints_new_records(env: Env) -> None:
    first = parse_out(env.run("send", NAME, "before follow").stdout)[0]
    p = subprocess.Popen([sys.executable, "-m", "crosstalk", "tail", NAME, "--follow"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "CROSSTALK_HOME": str(env.home)})
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert p.stdout is not None
        for ln in p.stdout:
            lines.put(ln)

    threading.Thread(target=pump, daemon=True).start()

    def wait_for(needle: str) -> str:
        while True:
            ln = lines.get(timeout=30)
            if needle in ln and ln.split()[4] == "accepted":
                return ln

    try:
        wait_for(first)
        second = parse_out(env.run("send", NAME, "after follow").stdout)[0]
        assert second in wait_for(second)
    finally:
        p.kill()
        p.wait(timeout=30)
        for stream in (p.stdout, p.stderr):
            if stream is not None:
                stream.close()


# -- broadcast (seed 001 §5) -------------------------------------------------------------------


def test_broadcast_checks_the_count_first_and_reports_partial_delivery(env: Env) -> None:
    path = env.sockdir / "keyless.sock"
    env.node.registrations.append(register_agent(env.node.registry, "keyless", "keyless",
                                                 uds_path=path, exact_name=True))
    # A count that does not match: a preview, nothing sent.
    proc = env.run("send", "--to", NAME, "--to", "keyless", "--confirm-count", "3", "hi all")
    assert proc.returncode == 2
    assert "nothing was sent" in proc.stderr
    assert env.node.agent_id in proc.stderr
    # One unknown target: nothing sent either.
    proc = env.run("send", "--to", NAME, "--to", "nobody", "--confirm-count", "2", "hi all")
    assert proc.returncode == 3
    assert env.node.harness.writes == []
    # The same agent named twice counts once.
    proc = env.run("send", "--to", NAME, "--to", env.node.agent_id, "--confirm-count", "1",
                   "just once")
    assert proc.returncode == 0, proc.stderr
    assert [w.text for w in env.node.harness.writes] == ["just once"]
    # Each target its own message; one cannot be reached: exit 5, the other still delivered.
    proc = env.run("send", "--json", "--to", NAME, "--to", "keyless", "--confirm-count", "2",
                   "hi all")
    assert proc.returncode == 5, proc.stderr
    (line,) = proc.stdout.splitlines()
    assert json.loads(line)["to"] == NAME
    assert json.loads(line)["state"] == "accepted"
    assert "keyless" in proc.stderr
    assert [w.text for w in env.node.harness.writes] == ["just once", "hi all"]
    usage = env.run("send", "--to", NAME, "hi")
    assert usage.returncode == 2  # a broadcast needs --confirm-count
    assert_no_secret(env, proc)
