"""Directories short enough for unix socket paths: sun_path holds 108 bytes and pytest's
``tmp_path`` is often longer, so socket directories go directly under /tmp."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def short_tmpdir(prefix: str = "ct-") -> Path:
    """A fresh directory directly under /tmp; the caller removes it."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


@contextlib.contextmanager
def short_dir(prefix: str = "ct-") -> Iterator[Path]:
    """:func:`short_tmpdir`, removed with everything in it on exit."""
    path = short_tmpdir(prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
