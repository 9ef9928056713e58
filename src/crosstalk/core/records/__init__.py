"""The journal's vocabulary (rules in :mod:`crosstalk.core.records.base`)."""

from crosstalk.core.records.agent import (
    ClaimRecord,
    NativeSendAttempted,
    NativeSendEnded,
    NudgeRecord,
    ReceiptRecord,
    TaskDeleted,
    TaskRecord,
)
from crosstalk.core.records.base import (
    ASK,
    CLAIM,
    KEY,
    LEGACY_KEY,
    MESSAGE,
    NATIVE_SEND,
    NUDGE,
    RECEIPT,
    REPLY,
    TASK,
    TASK_DELETED,
    Record,
    StateRecord,
    sender_from_dict,
    sender_to_dict,
)
from crosstalk.core.records.message import (
    AskEnded,
    AskOpened,
    MessageChange,
    MessageFinal,
    MessageRecord,
    MessageSubmitted,
    ReplyEnded,
    ReplyStaged,
)
from crosstalk.core.records.parse import Links, Unreadable, kind_of, links, parse_record

__all__ = [
    "ASK", "CLAIM", "KEY", "LEGACY_KEY", "MESSAGE", "NATIVE_SEND", "NUDGE",
    "RECEIPT", "REPLY", "TASK", "TASK_DELETED", "AskEnded", "AskOpened", "ClaimRecord",
    "Links", "MessageChange", "MessageFinal", "MessageRecord", "MessageSubmitted",
    "NativeSendAttempted", "NativeSendEnded", "NudgeRecord", "ReceiptRecord", "Record",
    "ReplyEnded", "ReplyStaged", "StateRecord", "TaskDeleted", "TaskRecord", "Unreadable",
    "kind_of", "links", "parse_record", "sender_from_dict", "sender_to_dict",
]
