"""``crosstalk mcp``, the shim: stdio and process life (:mod:`.serve`), the tools' catalog and
server (:mod:`.catalog`), what it serves (:mod:`.build`), the agents of the sessions it serves
(:mod:`.roster`), and the seven tools (:mod:`.tools`).

The names below resolve on first access (PEP 562): ``crosstalk mcp`` imports
``crosstalk.shim.serve`` through this package, and its first ``tools/list`` must not wait for
the roster and the tools (ADR 0043).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from crosstalk._lazy import by_module, exports

if TYPE_CHECKING:
    from crosstalk.shim.catalog import TOOL_NAMES, build_server
    from crosstalk.shim.roster import Shim
    from crosstalk.shim.serve import run_mcp, serve_stdio
    from crosstalk.shim.tools import Tools

_WHERE = by_module({
    "crosstalk.shim.catalog": ("TOOL_NAMES", "build_server"),
    "crosstalk.shim.roster": ("Shim",),
    "crosstalk.shim.serve": ("run_mcp", "serve_stdio"),
    "crosstalk.shim.tools": ("Tools",),
})

__getattr__ = exports(__name__, _WHERE, globals())

__all__ = ["TOOL_NAMES", "Shim", "Tools", "build_server", "run_mcp", "serve_stdio"]
