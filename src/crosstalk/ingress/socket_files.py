"""The uds ingress's files: its private directory, its socket path (a stale socket left by a
crash is replaced; a live one, or anything that is not a socket, is refused) and its key file
(trusted only as a regular 0600 file of ours).
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import time
from collections.abc import Callable
from pathlib import Path

from crosstalk.config import PRIVATE_DIR_MODE, PRIVATE_FILE_MODE
from crosstalk.store.files import SETTLED_FINE_NS, SETTLED_NS, settled, signature

_KEY_READ_LIMIT = 4096


class IngressError(RuntimeError):
    """The ingress cannot start safely (directory not private, path in use, path too long)."""


# -- the files -------------------------------------------------------------------------------


def private_dir(directory: Path) -> None:
    """Create the socket directory 0700, or refuse one that is not ours or not private."""
    try:
        directory.mkdir(mode=PRIVATE_DIR_MODE, parents=True)
    except FileExistsError:
        pass
    else:
        os.chmod(directory, PRIVATE_DIR_MODE)  # mkdir's mode is filtered by the umask
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode):
        raise IngressError(f"{directory} is not a directory")
    if st.st_uid != os.getuid():
        raise IngressError(f"{directory} is owned by uid {st.st_uid}, not by us")
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise IngressError(f"{directory} is not private (mode {stat.S_IMODE(st.st_mode):o}); "
                           "the socket directory must be mode 0700")


def clear_stale_socket(path: Path) -> None:
    """Remove a dead socket left by a crash; refuse a live one or a non-socket file."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise IngressError(f"{path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(os.fspath(path))
    except ConnectionRefusedError:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    except FileNotFoundError:
        return
    except OSError as exc:
        raise IngressError(f"cannot tell whether {path} is in use: {exc}") from exc
    finally:
        probe.close()
    raise IngressError(f"another process is listening on {path}")


def read_key(path: Path, *, check_mode: bool,
             on_unsafe: Callable[[], None] | None = None) -> str | None:
    """The key file's content, or ``None`` if it is missing or (``check_mode``) is not a
    regular 0600 file owned by us — then it is refused, never trusted, and ``on_unsafe`` is
    told."""
    return _read_key(path, check_mode=check_mode, on_unsafe=on_unsafe)[0]


def _read_key(path: Path, *, check_mode: bool, on_unsafe: Callable[[], None] | None
              ) -> tuple[str | None, os.stat_result | None]:
    """:func:`read_key`, with the ``fstat`` of the file it read (``None`` if it read none)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None, None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, None
        if check_mode and (stat.S_IMODE(st.st_mode) != PRIVATE_FILE_MODE
                           or st.st_uid != os.getuid()):
            if on_unsafe is not None:
                on_unsafe()
            return None, None
        raw = os.read(fd, _KEY_READ_LIMIT)
    except OSError:
        return None, None
    finally:
        os.close(fd)
    try:
        return raw.decode("ascii").strip(), st
    except UnicodeDecodeError:
        return None, None


#: How old the key file's last change must be before its content is kept between frames
#: (:func:`crosstalk.store.files.settled`, the registry's rule too): past the filesystem's
#: timestamp granularity, so a later write, even in place and of the same size, changes what
#: ``lstat`` says; the second for a filesystem with sub-second times.
KEY_SETTLED_NS = SETTLED_NS
KEY_SETTLED_FINE_NS = SETTLED_FINE_NS


class KeyFile:
    """The key file, checked on every frame as :func:`read_key` with ``check_mode`` does, but
    read again only when it has changed.

    An ``lstat`` answers for the open, ``fstat``, read and close a frame cost (four syscalls
    of every uds message, profiled). The content is kept only with the signature of the very
    file it was read from, and only once that file is settled (:data:`KEY_SETTLED_NS`), so a
    replacement, a rewrite in place, a ``chmod`` or a removal is seen on the next frame."""

    def __init__(self, path: Path, *, on_unsafe: Callable[[], None] | None = None) -> None:
        self.path = path
        self.on_unsafe = on_unsafe
        self._kept: tuple[tuple[int, ...], str] | None = None

    def current(self) -> str | None:
        """The key a frame must present now, or ``None`` (missing, or not a 0600 file of ours:
        every authentication fails)."""
        kept = self._kept
        if kept is not None:
            try:
                st = os.lstat(self.path)
            except OSError:
                st = None
            if st is not None and signature(st) == kept[0]:
                return kept[1]
            self._kept = None
        content, st = _read_key(self.path, check_mode=True, on_unsafe=self.on_unsafe)
        if content is not None and st is not None and settled(
                st, time.time_ns(), coarse_ns=KEY_SETTLED_NS, fine_ns=KEY_SETTLED_FINE_NS):
            self._kept = (signature(st), content)
        return content
