"""What Codex contributes to ``crosstalk install`` and ``doctor``, and where its files are.

Paths: ``$CODEX_HOME`` (else ``~/.codex``) holds ``config.toml`` and the shared app-server's
control socket.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def control_socket(env: Mapping[str, str]) -> str:
    """``$CODEX_HOME/app-server-control/app-server-control.sock`` (CODEX_HOME: ``~/.codex``)."""
    home = env.get("CODEX_HOME") or os.path.join(env.get("HOME") or str(Path.home()),
                                                 ".codex")
    return os.path.join(home, "app-server-control", "app-server-control.sock")
