"""A sender in its own process, so the ingress sees a real, distinct peer pid (SO_PEERCRED).

Prints ``{"ready": <pid>}``, then reads one JSON command ``{"path", "payload"}`` (payload as a
latin-1 string of bytes), connects, writes, half-closes like Claude's sender, reads to EOF and
prints ``{"reply", "secs", "error"}``.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time


def main() -> int:
    print(json.dumps({"ready": os.getpid()}), flush=True)
    cmd = json.loads(sys.stdin.readline())
    reply, error = b"", None
    start = time.monotonic()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(20)
    try:
        sock.connect(cmd["path"])
        sock.sendall(cmd["payload"].encode("latin-1"))
        sock.shutdown(socket.SHUT_WR)
        while chunk := sock.recv(65536):
            reply += chunk
    except OSError as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        sock.close()
    secs = time.monotonic() - start
    print(json.dumps({"reply": reply.decode("latin-1"), "secs": secs, "error": error}),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
