"""A receiving agent with few file descriptors to spare: its A2A listener and uds ingress on
a real registry and journal, then ``RLIMIT_NOFILE`` lowered to what it holds plus ``SPARE``.

    python fd_starved_agent.py STATE_DIR SOCK_DIR SPARE

Logs go to stderr (INFO and up, as a shim writes them); stdout gets one JSON line once serving:
``{"url":…,"token":…,"uds":…,"uds_token":…,"limit":…}`` (``token`` is a registered sender's
bearer token). It serves until stdin closes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import resource
import sys
from pathlib import Path

from crosstalk.store.registry import Registry
from tests.support import a2a, uds


async def main(state: Path, sock_dir: Path, spare: int) -> None:
    registry = Registry(state)
    bob, alice = a2a.registered_agent(registry, "bob"), a2a.registered_agent(registry, "alice")
    node = a2a.make_node(registry, bob, state / "bob.jsonl")
    url = await node.start()
    inbox = uds.make_node(state, sock_dir / "r.sock")
    await inbox.start()
    held = len(os.listdir("/proc/self/fd"))
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (held + spare, hard))
    sys.stdout.write(json.dumps({"url": url, "token": alice.token, "uds": str(inbox.path),
                                 "uds_token": inbox.token(), "limit": held + spare}) + "\n")
    sys.stdout.flush()
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    await inbox.stop()
    await node.stop()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    asyncio.run(main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])))
