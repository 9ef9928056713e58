"""Where CrossTalk keeps its state, and the limits every module agrees on.

State lives under one private directory so a single ``chmod``-audit covers every secret:
``CROSSTALK_HOME`` if set, else ``$XDG_STATE_HOME/crosstalk``, else ``~/.local/state/crosstalk``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

#: The largest journal line (record plus framing) a reader accepts. The writer refuses anything
#: larger, so every record that was acknowledged can be read back (seed R10).
MAX_JOURNAL_LINE = 1024 * 1024

#: Journal records older than this are dropped by retention unless something unresolved needs them.
RETENTION_SECONDS = 24 * 60 * 60

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


class StateDirError(RuntimeError):
    """The state directory exists but cannot be made private to this user."""


def state_dir(env: dict[str, str] | None = None) -> Path:
    """Resolve the state directory from the environment (without creating it)."""
    env = dict(os.environ) if env is None else env
    home = env.get("HOME") or str(Path.home())

    def expand(value: str) -> Path:  # "~" means the HOME of *this* environment
        if value == "~" or value.startswith("~/"):
            value = home + value[1:]
        return Path(value)

    if env.get("CROSSTALK_HOME"):
        return expand(env["CROSSTALK_HOME"])
    if env.get("XDG_STATE_HOME"):
        return expand(env["XDG_STATE_HOME"]) / "crosstalk"
    return expand(home) / ".local" / "state" / "crosstalk"


def journal_path(home: Path, agent_id: str) -> Path:
    """Where an agent's journal lives: ``<state>/journal/<agent_id>.jsonl`` (seed §5)."""
    return home / "journal" / f"{agent_id}.jsonl"


def uds_key_path(uds_path: Path) -> Path:
    """The key file beside a uds ingress socket: ``<uds_path minus .sock>.key`` (seed §5)."""
    if uds_path.suffix == ".sock":
        return uds_path.with_suffix(".key")
    return uds_path.with_name(uds_path.name + ".key")


#: How long a sender may wait for a delivery outcome: a paced injection into a Claude session
#: can wait ~55 s for a token, and a dropped frame is resent after 31 s (ADR 0007).
DELIVERY_TIMEOUT = 150.0

#: The longest path an agent's socket takes in a harness's socket directory (sun_path is 108
#: bytes; a harness may refuse less: Claude Code takes at most 103).
MAX_SOCKET_PATH = 103


def uds_path_for(home: Path, agent_id: str, env: dict[str, str] | None = None) -> Path:
    """Where an agent's uds ingress lives: ``<harness socket dir>/<agent_id>.sock`` when usable.

    A harness may accept an address as a reply or receipt address only in its own socket
    directory (Claude: its cc-socks, design doc §4.4); the harnesses say which through their
    plugins (:func:`crosstalk.harness.loader.socket_dir`). The path depends only on agent_id,
    so a reply address survives a shim restart (seed CQ7). If no harness asks for a directory,
    that directory cannot be made private to us, or the path is too long, the state
    directory's ``sock/`` is used instead.
    """
    # Imported here: every module imports config, and the harness packages import it too.
    from crosstalk.harness.loader import socket_dir

    wanted = socket_dir(os.environ if env is None else env)
    if wanted is not None:
        preferred = wanted / f"{agent_id}.sock"
        if len(os.fsencode(preferred)) <= MAX_SOCKET_PATH:
            try:
                ensure_private_dir(preferred.parent)
            except (OSError, StateDirError):
                pass
            else:
                return preferred
    return ensure_private_dir(home / "sock") / f"{agent_id}.sock"


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) and make it mode 0700, owned by us.

    A directory owned by another user is refused rather than trusted: its owner could read or
    swap our tokens and sockets.
    """
    try:
        path.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise StateDirError(f"{path} exists and is not a directory") from None
    st = path.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise StateDirError(f"{path} is not a directory")
    if st.st_uid != os.getuid():
        raise StateDirError(f"{path} is owned by uid {st.st_uid}, not by us ({os.getuid()})")
    if stat.S_IMODE(st.st_mode) != PRIVATE_DIR_MODE:
        os.chmod(path, PRIVATE_DIR_MODE)
    return path


def fsync_dir(path: Path) -> None:
    """Make a create, rename or unlink inside ``path`` durable (ALICE: apps forget this)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
