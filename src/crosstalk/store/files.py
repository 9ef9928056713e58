"""Small durable-file primitives shared by the registry, credentials and the journal.

Maildir's rule: write a temp file, fsync it, rename it into place, fsync the directory. At the
rename the file is complete; before it, nobody looks at it.

Something that is not a regular file where one of ours belongs (a directory someone made at
``names/<name>.lock``, a FIFO at a journal path) is :class:`StatePathError`: a message naming
the path and the command that clears it, never a bare ``IsADirectoryError`` from deep inside a
start-up. It is an ``OSError``, so every caller that already survives a failed open survives it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import shlex
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from crosstalk.config import PRIVATE_FILE_MODE, fsync_dir

#: How old a file's last change must be before what was read from it may be kept on the word of
#: its ``lstat`` alone: past the filesystem's timestamp granularity, so that any later write,
#: even in place and of the same size, changes its times. 2 s covers the coarsest (FAT).
SETTLED_NS = 2_000_000_000
#: The same for a file whose times have a sub-second part: such a filesystem (ext4, xfs,
#: btrfs, tmpfs) stamps times from the kernel's clock tick, 10 ms at the coarsest. A whole-second
#: time (a coarse filesystem, or one write in a billion on a fine one) gets :data:`SETTLED_NS`.
SETTLED_FINE_NS = 50_000_000


def signature(st: os.stat_result) -> tuple[int, ...]:
    """What an ``lstat`` says of a file that any change to it changes: its identity, type,
    mode, owner, size and times (what was read from it is kept while this is the same)."""
    return (st.st_ino, st.st_dev, st.st_mode, st.st_uid, st.st_size, st.st_mtime_ns,
            st.st_ctime_ns)


def settled(st: os.stat_result, now_ns: int, *, coarse_ns: int = SETTLED_NS,
            fine_ns: int = SETTLED_FINE_NS) -> bool:
    """Whether ``st`` (an ``lstat``/``fstat``) was last changed long enough before ``now_ns``
    (``time.time_ns()``) that a later change cannot leave the same times."""
    changed = max(st.st_mtime_ns, st.st_ctime_ns)
    fine = st.st_mtime_ns % 1_000_000_000 != 0 or st.st_ctime_ns % 1_000_000_000 != 0
    return now_ns - changed > (min(coarse_ns, fine_ns) if fine else coarse_ns)


class StatePathError(OSError):
    """A path where CrossTalk keeps one of its files holds something else (see module doc)."""

    def __init__(self, path: Path, kind: str, role: str, fix: str) -> None:
        super().__init__(f"{path} is {kind} where {role} belongs; CrossTalk cannot use it "
                         f"(and never makes one there). To clear it: {fix}")
        self.path, self.kind, self.role, self.fix = path, kind, role, fix


def in_the_way(path: Path, role: str, st: os.stat_result | None = None) -> StatePathError:
    """The error for ``path`` holding something other than ``role``, with the fix: ``rmdir``
    for an empty directory (nothing is lost), else moving it aside (it may be someone's)."""
    if st is None:
        try:
            st = os.lstat(path)
        except OSError:
            st = None
    mode = st.st_mode if st is not None else 0
    kind = ("a directory" if stat.S_ISDIR(mode) else "a symbolic link" if stat.S_ISLNK(mode)
            else "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "not a regular file")
    quoted = shlex.quote(str(path))
    fix = f"mv {quoted} {shlex.quote(str(path) + '.moved')}"
    if stat.S_ISDIR(mode):
        with contextlib.suppress(OSError):
            if not any(os.scandir(path)):
                fix = f"rmdir {quoted}"
    return StatePathError(path, kind, role, fix)


def open_regular(path: Path, flags: int, mode: int = PRIVATE_FILE_MODE, *, role: str,
                 follow: bool = True) -> int:
    """``os.open`` for one of our files: a directory, FIFO, socket (or, unless ``follow``, a
    symlink) at ``path`` is :class:`StatePathError` naming ``role``, not an opaque errno.
    ``O_NONBLOCK`` keeps a FIFO from hanging the open; the file returned is blocking again."""
    extra = os.O_CLOEXEC | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags | extra, mode)
    except IsADirectoryError:
        raise in_the_way(path, role) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise in_the_way(path, role) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise in_the_way(path, role, st)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_atomic(path: Path, data: bytes | Sequence[bytes],
                 mode: int = PRIVATE_FILE_MODE, *,
                 role: str = "a file CrossTalk writes") -> None:
    """Replace ``path`` with ``data`` (bytes, or chunks written in turn: a restart
    checkpoint need not be joined first) so that readers see the old or the new file, never
    half.

    A directory at ``path`` (rename cannot replace one) is :class:`StatePathError` naming
    ``role``; any other file type there is simply replaced."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        for chunk in (data,) if isinstance(data, bytes) else data:
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
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
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, IsADirectoryError):
            raise in_the_way(path, role) from None
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
    def try_acquire(cls, path: Path, *, role: str = "a lock file") -> FileLock | None:
        """The lock, or ``None`` if another holder has it; :class:`StatePathError` (naming
        ``role``) if something that is not a lock file is at ``path`` (a symlink is not one
        we made)."""
        fd = open_regular(path, os.O_RDWR | os.O_CREAT, role=role, follow=False)
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
    """True if some process holds ``path``'s flock (probing briefly takes it if free).

    :class:`StatePathError` if ``path`` is not a lock file: nobody can hold that."""
    if not path.exists() and not path.is_symlink():
        return False
    lock = FileLock.try_acquire(path)
    if lock is None:
        return True
    lock.release()
    return False


class FileOps(Protocol):
    """The system calls an append depends on; a seam for fault injection."""

    def write(self, fd: int, data: bytes) -> int: ...
    def fsync(self, fd: int) -> None: ...
    def ftruncate(self, fd: int, size: int) -> None: ...


class OsFileOps:
    def write(self, fd: int, data: bytes) -> int:
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)
