"""The inbound gate's helper process: writes a shim's peer frames as a stranger to Claude.

Claude Code skips its permission-mode parity and ``crossSessionInbound`` for a frame whose
writer descends from the receiving Claude (research ``claude-code.md`` §5, §11), and every
shim does. So the shim's peer frames are written by this process instead (ADR 0020): started
``python -m crosstalk.harness.claude.helper <fd> <listen path> <ancestor pid>`` in a new
session, it forks once more and the middle process exits, so the helper is reparented away
from Claude; it checks that ``<ancestor pid>`` (the session) is no longer its ancestor, binds
its listener at ``<listen path>`` (the frames' ``from``: Claude sends receipts only to the
process that wrote the frame), says ``ready``, and then only moves bytes:

* ``{"op":"write","id":N,"socket":S,"payload":P}`` from the shim: write ``P`` into the inbox at
  ``S`` (:func:`crosstalk.harness.claude.inbox.write_bytes`), answer ``{"op":"wrote","id":N,
  "state","reason","evidence"}``;
* every connection to the listener: its peer's pid, uid and start time and everything it sent,
  as ``{"op":"arrived",...}``. The shim decides what it is; this process decides nothing and
  never touches the journal.

Its lifetime is the shim's: fd ``<fd>`` is one end of a socketpair whose other end only the shim
holds, so the kernel closes it when the shim exits in any way (SIGKILL too), and the helper
exits on that EOF, removing its socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import stat
import sys
import time
from typing import Any, Final

from crosstalk import proc
from crosstalk.harness.claude import inbox
from crosstalk.harness.claude.inbox import LINK_LIMIT

#: Largest connection to the listener we forward (Claude sends one line per connection).
MAX_ARRIVAL: Final = 4 << 20
#: A connection to the listener that sends nothing more for this long is closed.
ARRIVAL_IDLE: Final = 30.0
#: How long the helper waits to be reparented after the middle process exits.
REPARENT_TIMEOUT: Final = 5.0


class Helper:
    """The helper's one event loop: the link to its shim, its listener, its writes."""

    def __init__(self, link: socket.socket, listen_path: str) -> None:
        self.link = link
        self.listen_path = listen_path
        self.writer: asyncio.StreamWriter | None = None
        self.send_lock = asyncio.Lock()
        self.tasks: set[asyncio.Task[None]] = set()
        self.socket_id: tuple[int, int] | None = None

    async def send(self, obj: dict[str, Any]) -> None:
        if self.writer is None:
            return
        async with self.send_lock:
            self.writer.write(json.dumps(obj, ensure_ascii=False).encode() + b"\n")
            with contextlib.suppress(OSError):
                await self.writer.drain()

    def spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def bind(self) -> socket.socket:
        """Our listener, bound 0600 (a stale socket at the path is replaced, nothing else)."""
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.lstat(self.listen_path).st_mode):
                os.unlink(self.listen_path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(self.listen_path)
        os.chmod(self.listen_path, 0o600)
        st = os.lstat(self.listen_path)
        self.socket_id = (st.st_dev, st.st_ino)
        return sock

    def unbind(self) -> None:
        with contextlib.suppress(OSError):
            st = os.lstat(self.listen_path)
            if (st.st_dev, st.st_ino) == self.socket_id:
                os.unlink(self.listen_path)

    async def run(self, ancestor: int) -> int:
        reader, self.writer = await asyncio.open_unix_connection(sock=self.link,
                                                                 limit=LINK_LIMIT)
        if ancestor in proc.ancestors(os.getpid()):
            await self.send({"op": "failed", "why": "still_a_descendant"})
            return 1
        try:
            listener = self.bind()
        except OSError as exc:
            await self.send({"op": "failed", "why": f"bind_failed:{exc.errno}"})
            return 1
        server = await asyncio.start_unix_server(self.arrived, sock=listener)
        try:
            await self.send({"op": "ready", "pid": os.getpid(),
                             "start": proc.process_start_time(os.getpid()),
                             "path": self.listen_path})
            while line := await reader.readline():
                request = json.loads(line)
                if isinstance(request, dict) and request.get("op") == "write":
                    self.spawn(self.write(request))
        except (OSError, ValueError):
            pass
        finally:
            server.close()
            self.unbind()
        return 0

    async def write(self, request: dict[str, Any]) -> None:
        got = await inbox.write_bytes(str(request["socket"]),
                                      str(request["payload"]).encode())
        await self.send({"op": "wrote", "id": request["id"], "state": got.state.value,
                         "reason": got.reason, "evidence": got.evidence})

    async def arrived(self, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        try:
            creds = proc.peer_credentials(sock)
            pid: int | None = creds.pid
            uid: int | None = creds.uid
        except OSError:
            pid = uid = None
        start = proc.process_start_time(pid) if pid else None
        data = b""
        try:
            while len(data) <= MAX_ARRIVAL:
                chunk = await asyncio.wait_for(reader.read(65536), ARRIVAL_IDLE)
                if not chunk:
                    break
                data += chunk
        except (OSError, TimeoutError):
            pass
        finally:
            writer.close()  # the sender waits for our close (Claude: 5 s, then "failed")
        if data and len(data) <= MAX_ARRIVAL:
            await self.send({"op": "arrived", "pid": pid, "uid": uid, "start": start,
                             "data": data.decode("utf-8", "replace")})


def _detach() -> None:
    """Fork once more; the middle process (a session leader) exits, the helper carries on
    and waits until it has been reparented, away from its starter's ancestry."""
    middle = os.getpid()
    if os.fork():
        os._exit(0)
    deadline = time.monotonic() + REPARENT_TIMEOUT
    while os.getppid() == middle and time.monotonic() < deadline:
        time.sleep(0.002)


def main(argv: list[str]) -> int:
    fd, listen_path, ancestor = int(argv[0]), argv[1], int(argv[2])
    _detach()
    link = socket.socket(fileno=fd)
    return asyncio.run(Helper(link, listen_path).run(ancestor))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
