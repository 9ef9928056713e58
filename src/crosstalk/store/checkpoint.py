"""A restart checkpoint's file: what an agent's start pass had read up to a journal offset.

The checkpoint is a cache of the replay; the journal stays the truth. A start that finds a
valid checkpoint reads only the journal's tail after it; anything doubtful means a full replay,
never a failed start and never a different result (ADR 0018). This module is the file and its
validation; what the readers hold, and how it becomes sections, is
:mod:`crosstalk.agent.start_pass`.

The file, ``journal/<agent_id>.ckpt`` (0600 in the 0700 directory), is one header line, then
one line per section (JSON each). The header names the format version, the agent, the
journal it was read from (its inode: retention renames a new file over the old), the offset
``X`` the readers had read up to, the highest ``seq`` before it, the ``seq`` and CRC-32 of the
journal line that ends at ``X``, and each section's length and CRC-32. It is written by temp +
fsync + rename + directory fsync, so a crash leaves the old checkpoint or the new one.

Refused (:class:`CheckpointRefused`, the caller replays everything): another format version,
another agent, a torn or corrupt file, a file that is not a private regular file of ours.
Refused at the journal (:class:`~crosstalk.store.journal_read.ResumeRefused`, checked under
the journal's lock by :meth:`Mark.check`): another inode, a journal now shorter than ``X``, or
a different line ending at ``X`` (cut and rewritten, e.g. an append that failed after a
lock-free read had seen it).
"""

from __future__ import annotations

import json
import os
import stat
import zlib
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from crosstalk.config import MAX_JOURNAL_LINE
from crosstalk.store.files import write_atomic
from crosstalk.store.journal_format import decode_line
from crosstalk.store.journal_read import ResumeRefused
from crosstalk.store.jsonload import loads

FORMAT = "crosstalk-restart-checkpoint"
#: Bumped whenever what a section holds changes: a checkpoint of another version is refused.
VERSION = 1
SUFFIX = ".ckpt"
_BACK_CHUNK = 64 * 1024


class CheckpointRefused(Exception):
    """The checkpoint file cannot be used (the message says why); replay the whole journal."""


def path_for(journal_path: Path) -> Path:
    """``journal/<agent_id>.ckpt`` beside ``journal/<agent_id>.jsonl``."""
    return journal_path.with_suffix(SUFFIX)


def line_ending_at(fd: int, end: int, max_line: int = MAX_JOURNAL_LINE) -> bytes | None:
    """The journal line (newline included) that ends at byte ``end``, or ``None`` if no whole
    line ends there."""
    if end <= 0:
        return None
    got = b""
    pos = end
    while pos > 0 and len(got) <= max_line + 1:
        n = min(_BACK_CHUNK, pos)
        pos -= n
        got = os.pread(fd, n, pos) + got
        if not got.endswith(b"\n"):
            return None
        start = got.rfind(b"\n", 0, len(got) - 1)
        if start >= 0:
            return got[start + 1:]
    return got if pos == 0 and len(got) <= max_line + 1 else None


def _seq_of(line: bytes) -> int | None:
    decoded = decode_line(line[:-1])
    seq = decoded.get("seq") if isinstance(decoded, dict) else None
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else None


@dataclass(frozen=True)
class Mark:
    """How far a checkpoint's readers had read: a :class:`~crosstalk.store.journal_read.Resume`
    for ``Journal.replay(since=...)``."""

    ino: int
    offset: int
    #: The highest ``seq`` before ``offset`` (the journal's own count resumes from it).
    seq: int
    #: The ``seq`` and CRC-32 of the line that ends at ``offset``.
    line_seq: int | None
    line_crc: int

    @classmethod
    def at(cls, fd: int, ino: int, end: int, seq: int) -> Mark | None:
        """The mark for a read of the file at ``fd`` that ended at ``end``."""
        line = line_ending_at(fd, end)
        if line is None:
            return None
        return cls(ino, end, seq, _seq_of(line), zlib.crc32(line))

    def check(self, fd: int, ino: int, size: int) -> None:
        if ino != self.ino:
            raise ResumeRefused("the journal is another file now (retention or a restore)")
        if size < self.offset:
            raise ResumeRefused(f"the journal ends at {size}, before the checkpoint's "
                                f"{self.offset}")
        line = line_ending_at(fd, self.offset)
        if line is None or zlib.crc32(line) != self.line_crc or _seq_of(line) != self.line_seq:
            raise ResumeRefused(f"the journal line ending at {self.offset} is not the one "
                                "the checkpoint read")

    def to_json(self) -> dict[str, Any]:
        return {"ino": self.ino, "offset": self.offset, "seq": self.seq,
                "line_seq": self.line_seq, "line_crc": self.line_crc}


def encode(value: object) -> bytes:
    """One section's line (ASCII JSON: lone surrogates and NaN survive the round trip)."""
    return json.dumps(value, separators=(",", ":"), check_circular=False).encode() + b"\n"


def write(path: Path, agent_id: str, mark: Mark,
          sections: Sequence[tuple[str, bytes]]) -> None:
    """Write the checkpoint durably (temp + fsync + rename + directory fsync)."""
    header = {"format": FORMAT, "version": VERSION, "agent_id": agent_id, **mark.to_json(),
              "sections": [[name, len(data), zlib.crc32(data)] for name, data in sections]}
    write_atomic(path, [encode(header), *(data for _, data in sections)],
                 role="a restart checkpoint")


@dataclass
class Opened:
    """A checkpoint whose header passed: its mark, and its sections to read in order (use
    it as a context manager: leaving closes the file, read to the end or not)."""

    mark: Mark
    sections: Generator[tuple[str, Any], None, None]
    file: BinaryIO

    def __enter__(self) -> Opened:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sections.close()
        self.file.close()


def read(path: Path, agent_id: str) -> Opened | None:
    """The checkpoint at ``path``, or ``None`` if there is none; :class:`CheckpointRefused`
    if it cannot be used. Each section's CRC is checked as :attr:`Opened.sections` reads it
    (a section that does not match raises :class:`CheckpointRefused` then)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CheckpointRefused(f"cannot open it ({exc.strerror})") from exc
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise CheckpointRefused("it is not a regular file")
    f = os.fdopen(fd, "rb")
    try:
        if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
            raise CheckpointRefused(f"its owner or mode ({stat.S_IMODE(st.st_mode):04o}) is "
                                    "not a private file of ours")
        header = _header(f.readline(), agent_id)
        mark = Mark(header["ino"], header["offset"], header["seq"], header["line_seq"],
                    header["line_crc"])
        listed = [(str(n), int(length), int(crc)) for n, length, crc in header["sections"]]
    except BaseException:
        f.close()
        raise
    return Opened(mark, _sections(f, listed), f)


def _header(line: bytes, agent_id: str) -> dict[str, Any]:
    try:
        header = json.loads(line)
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise CheckpointRefused("it is not a restart checkpoint")
    except ValueError as exc:
        raise CheckpointRefused("its header is torn or corrupt") from exc
    if header.get("version") != VERSION:
        raise CheckpointRefused(f"it is format version {header.get('version')!r}, this "
                                f"CrossTalk reads {VERSION}")
    if header.get("agent_id") != agent_id:
        raise CheckpointRefused("it was written for another agent's journal")
    for key in ("ino", "offset", "seq", "line_crc"):
        if not isinstance(header.get(key), int):
            raise CheckpointRefused(f"its header has no {key}")
    if not isinstance(header.get("sections"), list):
        raise CheckpointRefused("its header lists no sections")
    return header


def _sections(f: BinaryIO, listed: Sequence[tuple[str, int, int]],
              ) -> Generator[tuple[str, Any], None, None]:
    with f:
        for name, length, crc in listed:
            data = f.read(length)
            if len(data) != length or zlib.crc32(data) != crc:
                raise CheckpointRefused(f"its section {name!r} is torn or corrupt")
            try:
                yield name, loads(data)
            except ValueError as exc:
                raise CheckpointRefused(f"its section {name!r} does not read") from exc
            finally:
                del data
