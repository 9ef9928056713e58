"""CrossTalk: any AI coding-agent session on this machine can message any other by name.

The package is layered the way h11 and hypercorn are: ``crosstalk.core`` is pure logic (no I/O),
``crosstalk.store`` is the durable state on disk (journal, registry), ``crosstalk.proc`` answers
questions about processes and sockets, and everything that speaks a wire protocol sits on top.
"""

from crosstalk._version import __version__
from crosstalk.core.ids import agent_id_for, new_message_id
from crosstalk.core.naming import fallback_name, name_candidates
from crosstalk.store.journal import Journal, JournalError
from crosstalk.store.journal_read import Replay
from crosstalk.store.registry import Descriptor, Registration, Registry

__all__ = [
    "Descriptor",
    "Journal",
    "JournalError",
    "Registration",
    "Registry",
    "Replay",
    "__version__",
    "agent_id_for",
    "fallback_name",
    "name_candidates",
    "new_message_id",
]
