"""An MCP stdio "server command" whose real server is spawned by a fake Claude session.

``python claude_launch.py <ctl socket>`` hands this process's stdin, stdout and stderr to the
fake Claude (``claude_session.py``) with ``{"op":"spawn"}`` (SCM_RIGHTS), so the shim it starts
talks to the MCP client over these very pipes while its parent is the "Claude session". It then
waits for ``{"exit": rc}`` and exits with that code (1 if the connection closes without it;
128+N if the shim died of signal N). Only the standard library: it starts fast.
"""

from __future__ import annotations

import json
import socket
import sys


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        sys.stderr.write("usage: claude_launch.py <ctl socket path>\n")
        return 2
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(argv[1])
        socket.send_fds(sock, [b'{"op":"spawn"}\n'], [0, 1, 2])
        buf = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return 1
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for raw in lines:
                if not raw.strip():
                    continue
                reply = json.loads(raw)
                if "exit" in reply:
                    rc = int(reply["exit"])
                    return 128 - rc if rc < 0 else rc
                if "pid" not in reply:
                    sys.stderr.write(f"claude_launch: spawn failed: {reply}\n")
                    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
