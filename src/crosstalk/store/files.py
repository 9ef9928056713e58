"""Small durable-file primitives shared by the registry and credentials.

Maildir's rule: write a temp file, fsync it, rename it into place, fsync the directory. At the
rename the file is complete; before it, nobody looks at it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
from pathlib import Path

from crosstalk.config import PRIVATE_FILE_MODE, fsync_dir


def write_atomic(path: Path, data: bytes, mode: int = PRIVATE_FILE_MODE) -> None:
    """Replace ``path`` with ``data`` so that readers see the old or the new file, never half."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view.tobytes()) :]
        os.fchmod(fd, mode)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def unlink_durable(path: Path) -> bool:
    """Remove ``path`` and make the removal durable; ``False`` if it was already gone."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    fsync_dir(path.parent)
    return True


class FileLock:
    """An exclusive ``flock`` held on an open file description until :meth:`release`.

    The lock file itself is never unlinked: a later opener of a fresh file with the same name
    would lock a different inode while the old holder still believes it owns the lock (seed §9).
    Two ``FileLock`` objects in one process exclude each other too, since each has its own open
    file description.
    """

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd = fd

    @classmethod
    def try_acquire(cls, path: Path) -> FileLock | None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd)

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def release(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)  # closing the last descriptor drops the flock


def is_locked(path: Path) -> bool:
    """True if some process holds ``path``'s flock (probing briefly takes it if free)."""
    if not path.exists():
        return False
    lock = FileLock.try_acquire(path)
    if lock is None:
        return True
    lock.release()
    return False
