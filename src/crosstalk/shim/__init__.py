"""``crosstalk mcp``, the shim: stdio and process life (:mod:`.serve`), the agents of the
sessions it serves (:mod:`.roster`), and the seven tools (:mod:`.tools`)."""

from crosstalk.shim.roster import Shim
from crosstalk.shim.serve import run_mcp, serve_stdio
from crosstalk.shim.tools import TOOL_NAMES, Tools, build_server

__all__ = ["TOOL_NAMES", "Shim", "Tools", "build_server", "run_mcp", "serve_stdio"]
