"""opencode: sessions identified by the CrossTalk plugin's stamp, injected over its socket.

- :mod:`.records` — the plugin's instance records (``<state>/opencode/<pid>-<dirhash>.json``),
  validated and checked live (pid + start time + a socket of ours that connects);
- :mod:`.http` — an HTTP/1.1 client over an instance's unix socket, with the SSE reader;
- :mod:`.sessions` — which root sessions of an instance are live, from its event stream;
- :mod:`.identifier` — the shim side: the ``_opencode`` stamp, live-session registration;
- :mod:`.harness` — injection by ``prompt_async`` with event-stream evidence;
- :mod:`.discovery` — every live instance's sessions, and informs to those without CrossTalk;
- :mod:`.plugin` — the ``crosstalk.harnesses`` entry; ``setup`` (install, doctor) and
  ``crosstalk.js`` (the opencode plugin) are installed by ``crosstalk install``.

The names below resolve on first access (ADR 0034): a shim loads this package for its
entry point, which needs none of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from crosstalk._lazy import by_module, exports

if TYPE_CHECKING:
    from crosstalk.harness.opencode.discovery import OpencodeDiscovery, session_rows
    from crosstalk.harness.opencode.harness import (
        HARNESS,
        OpencodeHarness,
        find_stored,
        inject_at,
        prompt_body,
        render,
    )
    from crosstalk.harness.opencode.http import (
        HTTPStatus,
        Instance,
        NoAnswer,
        NotSent,
        OpencodeError,
    )
    from crosstalk.harness.opencode.identifier import (
        STAMP,
        HostedOpencodeIdentifier,
        OpencodeIdentifier,
        parent_is_opencode,
    )
    from crosstalk.harness.opencode.records import (
        InstanceRecord,
        RecordError,
        check_live,
        host_record,
        live_records,
        parse_record,
        read_record,
        record_stem,
        records_dir,
        scan,
    )
    from crosstalk.harness.opencode.sessions import LiveSet, session_name

__getattr__ = exports(__name__, by_module({
    "crosstalk.harness.opencode.discovery": ("OpencodeDiscovery", "session_rows",),
    "crosstalk.harness.opencode.harness": (
        "HARNESS", "OpencodeHarness", "find_stored", "inject_at", "prompt_body", "render",
    ),
    "crosstalk.harness.opencode.http": (
        "HTTPStatus", "Instance", "NoAnswer", "NotSent", "OpencodeError",
    ),
    "crosstalk.harness.opencode.identifier": (
        "STAMP", "HostedOpencodeIdentifier", "OpencodeIdentifier", "parent_is_opencode",
    ),
    "crosstalk.harness.opencode.records": (
        "InstanceRecord", "RecordError", "check_live", "host_record", "live_records",
        "parse_record", "read_record", "record_stem", "records_dir", "scan",
    ),
    "crosstalk.harness.opencode.sessions": ("LiveSet", "session_name",),
}), globals())

__all__ = [
    "HARNESS",
    "STAMP",
    "HTTPStatus",
    "HostedOpencodeIdentifier",
    "Instance",
    "InstanceRecord",
    "LiveSet",
    "NoAnswer",
    "NotSent",
    "OpencodeDiscovery",
    "OpencodeError",
    "OpencodeHarness",
    "OpencodeIdentifier",
    "RecordError",
    "check_live",
    "find_stored",
    "host_record",
    "inject_at",
    "live_records",
    "parent_is_opencode",
    "parse_record",
    "prompt_body",
    "read_record",
    "record_stem",
    "records_dir",
    "render",
    "scan",
    "session_name",
    "session_rows",
]
