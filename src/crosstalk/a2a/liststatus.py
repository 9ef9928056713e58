"""What a ListTasks request's ``status`` filter means, read from the wire (issue 13 §3).

The SDK parses params with ``ignore_unknown_fields``, which also turns an enum name it does
not know into ``TASK_STATE_UNSPECIFIED`` (0, "no filter") and keeps a number outside the enum
as it came: ``"status": "TASK_STATE_BOGUS"`` would list every task, ``99`` none, and neither
tells the client its request was wrong. So the body cap (:mod:`crosstalk.a2a.asgi`) hands the
raw JSON value on, and the handler reads it here:

- absent, ``null``, ``"TASK_STATE_UNSPECIFIED"`` or ``0``: no filter;
- ``"UNRECOGNIZED"`` or ``-1``: no filter too. ``@a2a-js/sdk`` 1.x sends it for a request
  without a status: its ts-proto ``ListTasksRequest.toJSON`` writes ``status`` whenever it is
  not ``0``, and ``taskStateToJSON(undefined)`` is ``"UNRECOGNIZED"`` (``-1`` is that enum
  member's number). Refusing it would break every ListTasks that client sends;
- a TaskState name or number: that state;
- anything else (another string, a number outside the enum, a boolean, a fraction): the
  request is wrong, ``-32602``.
"""

from __future__ import annotations

import json
from typing import Any

from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import InvalidParamsError

#: Written by a client that has no status to filter by (see the module doc).
UNRECOGNIZED_NAME = "UNRECOGNIZED"
UNRECOGNIZED_NUMBER = -1
#: Stands for "the request has no ``status`` key" (``None`` is JSON ``null``).
ABSENT: Any = object()

_NAMES = frozenset(pb.TaskState.keys())
_NUMBERS = frozenset(pb.TaskState.values())


def status_filter(raw: Any) -> int:
    """The TaskState number ListTasks filters by, ``0`` for none; a bad value raises
    :class:`~a2a.utils.errors.InvalidParamsError` (``-32602``)."""
    if raw is ABSENT or raw is None or raw == UNRECOGNIZED_NAME:
        return pb.TASK_STATE_UNSPECIFIED
    if isinstance(raw, str) and raw in _NAMES:
        return int(pb.TaskState.Value(raw))
    if isinstance(raw, int) and not isinstance(raw, bool):
        if raw == UNRECOGNIZED_NUMBER:
            return pb.TASK_STATE_UNSPECIFIED
        if raw in _NUMBERS:
            return raw
    raise InvalidParamsError(
        message="status must be a TaskState name or number (TASK_STATE_UNSPECIFIED or "
                "UNRECOGNIZED for no filter)",
        data={"reason": "bad_status"})


def wire_status(text: str) -> Any:
    """The raw ``params.status`` of a ListTasks request body, else :data:`ABSENT`.

    Only a body that names the method is parsed (the body cap has already bounded its depth
    and numbers, so ``json.loads`` cannot fail on them); one that is not JSON, or not a
    ListTasks call, is left to the SDK to answer.
    """
    if "ListTasks" not in text:
        return ABSENT
    try:
        request = json.loads(text)
    except ValueError:
        return ABSENT
    if not isinstance(request, dict) or request.get("method") != "ListTasks":
        return ABSENT
    params = request.get("params")
    if not isinstance(params, dict) or "status" not in params:
        return ABSENT
    return params["status"]
