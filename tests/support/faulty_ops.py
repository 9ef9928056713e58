"""The one fault-injecting ``FileOps``: the journal's system calls, failing where a test says.

Every choice is an attribute a test may change between appends, so one object can first let a
journal write and then break it. Call numbers are 1-based and count failed calls too.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterable

from crosstalk.store.files import OsFileOps


class FaultyOps:
    """``FileOps`` that counts calls and fails the chosen ones with ``OSError(err)``.

    A write fails when its number is in ``fail_write``, when ``fail_if(data)`` is true, or when
    ``armed`` (the next write, once; any failing write disarms it). ``max_chunk`` makes every
    write short (the journal must loop); ``partial`` makes a failing write put half its bytes in
    the file before raising, like a disk that fills mid-write. An fsync fails when its number is
    in ``fail_fsync`` or while ``fsync_broken``; every ftruncate fails while
    ``truncate_broken``. ``raised`` counts the errors raised.
    """

    def __init__(
        self,
        *,
        fail_write: Iterable[int] = (),
        fail_fsync: Iterable[int] = (),
        err: int = errno.EIO,
        max_chunk: int | None = None,
        partial: bool = False,
        fsync_broken: bool = False,
        truncate_broken: bool = False,
    ) -> None:
        self.inner = OsFileOps()
        self.fail_write = set(fail_write)
        self.fail_fsync = set(fail_fsync)
        self.fail_if: Callable[[bytes], bool] | None = None
        self.armed = False
        self.err = err
        self.max_chunk = max_chunk
        self.partial = partial
        self.fsync_broken = fsync_broken
        self.truncate_broken = truncate_broken
        self.writes = 0
        self.fsyncs = 0
        self.truncates = 0
        self.raised = 0

    def _raise(self) -> None:
        self.raised += 1
        raise OSError(self.err, os.strerror(self.err))

    def write(self, fd: int, data: bytes) -> int:
        self.writes += 1
        if self.max_chunk is not None:
            data = data[: self.max_chunk]
        hit = self.writes in self.fail_write or (self.fail_if is not None and self.fail_if(data))
        if hit or self.armed:
            self.armed = False
            if self.partial and len(data) > 1:
                self.inner.write(fd, data[: len(data) // 2])
            self._raise()
        return self.inner.write(fd, data)

    def fsync(self, fd: int) -> None:
        self.fsyncs += 1
        if self.fsync_broken or self.fsyncs in self.fail_fsync:
            self._raise()
        self.inner.fsync(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        self.truncates += 1
        if self.truncate_broken:
            self._raise()
        self.inner.ftruncate(fd, size)
