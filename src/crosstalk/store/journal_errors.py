"""What a journal write can fail with; callers gate acknowledgement on these."""

from __future__ import annotations


class JournalError(Exception):
    """Base class for journal failures."""


class JournalWriteError(JournalError):
    """The record is **not** durable; the caller must fail the operation it was recording."""


class RecordTooLarge(JournalError):
    """The encoded record would exceed the reader's line limit; nothing was written."""
