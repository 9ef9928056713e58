"""The shim's start-up keeps the agent stack out (issue 16, start-up): a fresh interpreter
that loads what ``crosstalk mcp`` needs before its first ``tools/list`` must not have loaded
the A2A stack, the receiver or httpx. Not timed: it checks what is loaded."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("crosstalk.agent", "crosstalk.a2a", "crosstalk.receiver", "a2a", "httpx")


def test_shim_modules_do_not_load_the_agent_stack() -> None:
    code = ("import json, sys, crosstalk.shim.serve, crosstalk.shim.tools; "
            f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert json.loads(out.stdout) == []
