"""The parent-side handle of a registering child process (``fakes/registering_agent.py``).

:class:`AgentProc` starts the child and reads its stdout on a thread into a queue, so every
wait has a timeout and nothing blocks forever on a wedged child.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

#: The child's script.
AGENT_SCRIPT = Path(__file__).resolve().parent / "fakes" / "registering_agent.py"
DEFAULT_TIMEOUT = 60.0


class ChildFailed(AssertionError):
    pass


class AgentProc:
    """One child process running ``fakes/registering_agent.py``; every read has a timeout."""

    def __init__(self, home: Path, log_dir: Path, *, barrier_fd: int | None = None) -> None:
        args = [sys.executable, str(AGENT_SCRIPT), str(home)]
        pass_fds: tuple[int, ...] = ()
        if barrier_fd is not None:
            args += ["--barrier-fd", str(barrier_fd)]
            pass_fds = (barrier_fd,)
        log_dir.mkdir(parents=True, exist_ok=True)
        fd_log, self.log_path = _mklog(log_dir)
        self._log: IO[bytes] = os.fdopen(fd_log, "wb")
        self.proc = subprocess.Popen(
            args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
            pass_fds=pass_fds, text=True, bufsize=1,
        )
        self.pid = self.proc.pid
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        try:
            ready = self.expect(timeout=DEFAULT_TIMEOUT)
            if ready.get("event") != "ready" or ready.get("pid") != self.pid:
                raise ChildFailed(f"unexpected first line {ready!r}")
        except BaseException:
            self.stop()
            raise

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def expect(self, timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise ChildFailed(f"child {self.pid}: no answer in {timeout}s{self._tail()}") from None
        if line is None:
            self._lines.put(None)
            raise ChildFailed(f"child {self.pid} exited{self._tail()}")
        data: dict[str, Any] = json.loads(line)
        return data

    def send(self, op: str, **kwargs: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **kwargs}) + "\n")
        self.proc.stdin.flush()

    def request(self, op: str, timeout: float = DEFAULT_TIMEOUT, **kwargs: Any) -> dict[str, Any]:
        self.send(op, **kwargs)
        reply = self.expect(timeout)
        if reply.get("op") != op:
            raise ChildFailed(f"child {self.pid}: asked {op}, got {reply!r}")
        return reply

    def kill9(self) -> None:
        """SIGKILL and reap: no exit path runs, the kernel drops every flock."""
        self.proc.kill()
        self.proc.wait(timeout=DEFAULT_TIMEOUT)

    def stop(self) -> None:
        """Always safe: used in ``finally`` / fixture teardown."""
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=DEFAULT_TIMEOUT)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self._log.close()

    def _tail(self) -> str:
        with contextlib.suppress(OSError):
            self._log.flush()
            text = self.log_path.read_text(errors="replace")[-2000:]
            if text:
                return f"; stderr:\n{text}"
        return ""


def _mklog(log_dir: Path) -> tuple[int, Path]:
    for n in range(10_000):
        path = log_dir / f"child-{n}.log"
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), path
        except FileExistsError:
            continue
    raise RuntimeError("no free log name")
