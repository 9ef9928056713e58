"""``crosstalk capture <agent>``: stream a running agent's raw wire as JSON lines (seed 000 §6).

The agent is not restarted and nothing it delivers changes: the client connects to the agent's
uds ingress, authenticates as ``crosstalk send`` does (the key file beside the socket, 0600,
so only the same user can), and asks for a capture (``{"type":"capture"}``,
:mod:`crosstalk.capture.stream`). The agent answers ``capture_started`` and then one line per
frame until Ctrl-C (exit 0) or the agent stops (exit 0, said on stderr).

Every line is redacted twice: by the agent (:mod:`crosstalk.capture.redact`), and here again
with every token and key this user can read in the state directory (every agent's bearer
credential and uds key), so a capture is safe to share even if one rule missed a value.

Exit codes: 0 interrupted or the agent stopped, 1 the agent refused (it already has
:data:`~crosstalk.capture.tap.MAX_CAPTURES` captures, or the key), 2 usage, 3 no such agent or
ambiguous, 4 transport failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from crosstalk.capture.redact import Redactor
from crosstalk.capture.stream import CAPTURE_TYPE, STARTED_TYPE
from crosstalk.cli.send import (
    EXIT_OK,
    EXIT_STATE,
    EXIT_TRANSPORT,
    SendFailure,
    auth_failed_hint,
    read_key,
    resolve_target,
)
from crosstalk.config import uds_key_path
from crosstalk.store.registry import Registry

CONNECT_TIMEOUT = 5.0
_MAX_LINE = 64 << 20


def known_secrets(home: Path) -> set[str]:
    """Every token and key in the state directory this user can read: bearer credentials
    and the uds key beside each registered agent's socket."""
    found: set[str] = set()
    paths = list((home / "credentials").glob("*.token"))
    with contextlib.suppress(OSError):
        paths += [uds_key_path(Path(d.uds_path)) for d in Registry(home).live() if d.uds_path]
    for path in paths:
        try:
            value = path.read_text("ascii").strip()
        except (OSError, UnicodeDecodeError):
            continue
        if value:
            found.add(value)
    return found


def open_capture(uds_path: Path, token: str) -> socket.socket:
    """Connect, authenticate, ask for a capture; the write side stays open (its close is how
    the agent learns the capture ended)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_TIMEOUT)
        sock.connect(os.fspath(uds_path))
        sock.sendall(json.dumps({"type": "auth", "token": token}).encode() + b"\n"
                     + json.dumps({"type": CAPTURE_TYPE}).encode() + b"\n")
        sock.settimeout(None)
    except OSError as exc:
        sock.close()
        raise SendFailure(EXIT_TRANSPORT, f"cannot connect to {uds_path}: "
                          f"{exc.strerror or exc} (is the agent's shim running?)") from None
    return sock


def read_lines(sock: socket.socket) -> Iterator[bytes]:
    """The lines the agent sends, until it closes."""
    buf = b""
    while True:
        chunk = sock.recv(1 << 16)
        if not chunk:
            if buf.strip():
                yield buf
            return
        buf += chunk
        *done, buf = buf.split(b"\n")
        yield from (line for line in done if line.strip())
        if len(buf) > _MAX_LINE:
            raise SendFailure(EXIT_TRANSPORT, "the agent sent an over-long line")


def run_capture(home: Path, to: str, *, out: IO[str] | None = None,
                err: IO[str] | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        target = resolve_target(home, to)
        if not target.uds_path:
            raise SendFailure(EXIT_TRANSPORT, f"agent {target.name} publishes no uds ingress")
        uds_path = Path(target.uds_path)
        key_path = uds_key_path(uds_path)
        sock = open_capture(uds_path, read_key(key_path))
    except SendFailure as exc:
        print(f"crosstalk capture: {exc}", file=err)
        return exc.exit_code
    redactor = Redactor(known_secrets(home))
    try:
        return _stream(sock, target.name, redactor, key_path, out=out, err=err)
    except KeyboardInterrupt:
        return EXIT_OK
    except SendFailure as exc:
        print(f"crosstalk capture: {exc}", file=err)
        return exc.exit_code
    except BrokenPipeError:  # `| head`: the reader is gone, which is how it says stop
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), sys.stdout.fileno())
        return EXIT_OK
    finally:
        sock.close()


def _stream(sock: socket.socket, name: str, redactor: Redactor, key_path: Path, *,
            out: IO[str], err: IO[str]) -> int:
    lines = read_lines(sock)
    try:
        hello = json.loads(next(lines))
    except (StopIteration, ValueError):
        raise SendFailure(EXIT_TRANSPORT, f"agent {name} closed without answering the "
                          "capture (a version without crosstalk capture?)") from None
    except OSError as exc:
        raise SendFailure(EXIT_TRANSPORT, f"the connection failed: {exc}") from None
    if not isinstance(hello, dict) or hello.get("type") != STARTED_TYPE:
        reason = hello.get("reason") if isinstance(hello, dict) else None
        why = (auth_failed_hint(key_path) if reason == "auth_failed"
               else "it already has as many captures as it takes; end one first"
               if reason == "too_many_captures" else "")
        print(f"crosstalk capture: agent {name} refused the capture ({reason}) {why}".rstrip(),
              file=err)
        return EXIT_STATE
    print(f"crosstalk capture: capturing {name} ({hello.get('agent')}); Ctrl-C stops",
          file=err, flush=True)
    try:
        for raw in lines:
            # The agent redacted already; this pass uses every secret this user can read.
            print(redactor.text(raw.decode("utf-8", "replace")), file=out, flush=True)
    except OSError as exc:
        raise SendFailure(EXIT_TRANSPORT, f"the connection failed: {exc}") from None
    print(f"crosstalk capture: agent {name} closed the capture (it stopped)", file=err)
    return EXIT_OK
