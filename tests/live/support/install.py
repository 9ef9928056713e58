"""Install the pinned Claude Code (and OpenAI Codex) releases from npm into cache folders this
test run owns.

    python -m tests.live.support.install          # prints the path of the native binary
    python -m tests.live.support.install codex    # the same for Codex

The npm package ``@anthropic-ai/claude-code`` ships its native linux-x64 build as a platform
package (``node_modules/@anthropic-ai/…linux-x64…/claude``); we run that binary directly, never
the JS wrapper, so no Node process sits between tmux and the session. Idempotent: a cache
whose binary is already there (and answers ``--version`` with the pinned version) is reused.

The cache is ``<repo>/.cache/live/claude-code-<version>`` unless ``CROSSTALK_LIVE_CACHE`` names
another folder. Installing only talks to the npm registry; the binary itself is only ever run
inside a loopback-only network namespace (see ``claude.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

PACKAGE = "@anthropic-ai/claude-code"
VERSION = "2.1.328"
REPO = Path(__file__).resolve().parents[3]
INSTALL_TIMEOUT = 600.0


class InstallError(RuntimeError):
    """The pinned Claude Code binary could not be installed or found."""


def cache_dir(env: dict[str, str] | None = None) -> Path:
    env = dict(os.environ) if env is None else env
    configured = env.get("CROSSTALK_LIVE_CACHE")
    if configured:
        return Path(configured).expanduser().resolve()
    return REPO / ".cache" / "live" / f"claude-code-{VERSION}"


def _ignore_in_git(prefix: Path) -> None:
    """Keep the ~370 MB cache out of ``git status`` and ``git add -A`` wherever it lives (as
    ``.pytest_cache`` does): a ``.gitignore`` of ``*`` ignores the folder and itself."""
    marker = prefix / ".gitignore"
    if not marker.exists():
        marker.write_text("# created by tests/live/support/install.py\n*\n")


def find_binary(prefix: Path) -> Path | None:
    """The native linux-x64 ``claude`` under ``prefix/node_modules/@anthropic-ai``."""
    scope = prefix / "node_modules" / "@anthropic-ai"
    if not scope.is_dir():
        return None
    found = sorted(p for p in scope.rglob("claude")
                   if p.is_file() and "linux-x64" in str(p.relative_to(scope))
                   and "musl" not in str(p.relative_to(scope)))
    for path in found:
        if os.access(path, os.X_OK) and _is_elf(path):
            return path
    return None


def _is_elf(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def installed_version(binary: Path) -> str | None:
    """The version of the platform package that holds ``binary`` (from its package.json).

    Read from the file, not by running ``claude --version``: the binary is only ever run
    inside the loopback-only namespace.
    """
    try:
        meta = json.loads((binary.parent / "package.json").read_text())
    except (OSError, ValueError):
        return None
    version = meta.get("version") if isinstance(meta, dict) else None
    return version if isinstance(version, str) else None


def _npm_install(package: str, version: str, prefix: Path, *,
                 find: Callable[[Path], Path | None],
                 installed: Callable[[Path], str | None], what: str) -> Path:
    """Install ``package@version`` into ``prefix`` once; the native binary ``find`` locates,
    checked against ``installed`` (its package.json, never by running it)."""
    binary = find(prefix)
    if binary is not None and installed(binary) == version:
        _ignore_in_git(prefix)
        return binary
    npm = shutil.which("npm")
    if npm is None:
        raise InstallError("npm is not on PATH: the live suite needs Node.js and npm to install "
                           f"{package}@{version}")
    prefix.mkdir(parents=True, exist_ok=True)
    _ignore_in_git(prefix)
    cmd = [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund",
           "--save-exact", "--loglevel=error", f"{package}@{version}"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT,
                              check=False)
    except subprocess.TimeoutExpired:
        raise InstallError(f"{' '.join(cmd)} took longer than {INSTALL_TIMEOUT:.0f} s") from None
    if done.returncode != 0:
        raise InstallError(f"{' '.join(cmd)} failed ({done.returncode}):\n"
                           f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    binary = find(prefix)
    if binary is None:
        raise InstallError(f"{package}@{version} installed into {prefix}, but no {what} was "
                           "found in it")
    got = installed(binary)
    if got != version:
        raise InstallError(f"{binary} belongs to {package} {got!r}, expected {version}")
    return binary


def ensure_claude(env: dict[str, str] | None = None) -> Path:
    """Install (once) and return the path of the pinned native ``claude`` binary."""
    return _npm_install(PACKAGE, VERSION, cache_dir(env), find=find_binary,
                        installed=installed_version,
                        what="native linux-x64 'claude' binary under node_modules/@anthropic-ai")


# -- OpenAI Codex ---------------------------------------------------------------------------
#
# ``@openai/codex`` is a JS wrapper whose optional dependency ``@openai/codex-linux-x64`` (an
# npm alias of ``@openai/codex@<version>-linux-x64``) ships the native musl build at
# ``vendor/x86_64-unknown-linux-musl/bin/codex``. We run that binary directly, and only inside
# the loopback-only namespace (see ``codex.py``); the version is read from package.json.

CODEX_PACKAGE = "@openai/codex"
CODEX_VERSION = "0.169.0"
CODEX_TRIPLE = "x86_64-unknown-linux-musl"


def codex_cache_dir(env: dict[str, str] | None = None) -> Path:
    env = dict(os.environ) if env is None else env
    configured = env.get("CROSSTALK_LIVE_CODEX_CACHE")
    if configured:
        return Path(configured).expanduser().resolve()
    return REPO / ".cache" / "live" / f"codex-{CODEX_VERSION}"


def find_codex_binary(prefix: Path) -> Path | None:
    """The native ``codex`` under ``prefix/node_modules/@openai`` (the linux-x64 musl build)."""
    scope = prefix / "node_modules" / "@openai"
    if not scope.is_dir():
        return None
    found = sorted(p for p in scope.rglob("codex")
                   if p.is_file() and f"vendor/{CODEX_TRIPLE}/bin/" in str(p.relative_to(scope)))
    for path in found:
        if os.access(path, os.X_OK) and _is_elf(path):
            return path
    return None


def codex_installed_version(binary: Path) -> str | None:
    """The version of the platform package that holds ``binary`` (its package.json says
    ``<version>-linux-x64``), read from the file: the binary only ever runs in the namespace."""
    package = binary.parents[3]  # <package>/vendor/<triple>/bin/codex
    try:
        meta = json.loads((package / "package.json").read_text())
    except (OSError, ValueError):
        return None
    version = meta.get("version") if isinstance(meta, dict) else None
    if not isinstance(version, str):
        return None
    return version.removesuffix("-linux-x64")


def ensure_codex(env: dict[str, str] | None = None) -> Path:
    """Install (once) and return the path of the pinned native ``codex`` binary."""
    return _npm_install(CODEX_PACKAGE, CODEX_VERSION, codex_cache_dir(env),
                        find=find_codex_binary, installed=codex_installed_version,
                        what=("native codex binary under node_modules/@openai/*/vendor/"
                              f"{CODEX_TRIPLE}/bin"))



if __name__ == "__main__":
    try:
        print(ensure_codex() if sys.argv[1:] == ["codex"] else ensure_claude())
    except InstallError as exc:
        print(f"install: {exc}", file=sys.stderr)
        sys.exit(1)
