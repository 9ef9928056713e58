"""A small HTTP/1.1 client for one opencode instance, over its plugin's unix socket.

httpx over a UDS transport; JSON in and out, and an SSE reader for ``GET /event``. Timeouts
are short (research §1: a client that connects during a server's first second may get no
answer for a minute; poll with short timeouts and retry), except the event stream's read,
which only has to outlast opencode's 10 s heartbeat.

Failures are split by what they prove: :class:`NotSent` (nothing reached opencode: connect
refused, socket gone), :class:`NoAnswer` (a request may have been sent, no answer came: never
resent), :class:`HTTPStatus` (opencode, or whatever holds the socket, answered an error).
The instance's password, if one is set, is never in an exception or a log line.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Mapping
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:  # httpx loads with the first instance, not at shim start (ADR 0033)
    import httpx

#: The URL host is ignored over a unix socket; opencode routes by path.
BASE_URL: Final = "http://opencode.crosstalk"
CONNECT_TIMEOUT: Final = 1.0
REQUEST_TIMEOUT: Final = 5.0
#: Longer than opencode's 10 s ``server.heartbeat``: silence past it means the stream is dead.
EVENT_READ_TIMEOUT: Final = 25.0
#: A JSON answer larger than this is not an answer we asked for.
MAX_BODY: Final = 8 * 1024 * 1024


class OpencodeError(Exception):
    """A request to an opencode instance that failed; ``reason`` is short and stable."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class NotSent(OpencodeError):
    """Nothing reached the instance (connect refused, socket gone, connect timed out)."""


class NoAnswer(OpencodeError):
    """The request may have reached the instance; no (complete) answer came."""


class HTTPStatus(OpencodeError):
    """An error status; ``body`` is the start of the answer (opencode's error name)."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"http_{status}", body[:200])
        self.status = status
        self.body = body


def _auth(env: Mapping[str, str]) -> httpx.BasicAuth | None:
    """Basic auth when the instance has ``OPENCODE_SERVER_PASSWORD`` (research §7); a shim
    inherits opencode's environment, so it has the same one."""
    password = env.get("OPENCODE_SERVER_PASSWORD")
    if not password:
        return None
    import httpx  # loaded on first use (ADR 0033)
    return httpx.BasicAuth(env.get("OPENCODE_SERVER_USERNAME") or "opencode", password)


class Instance:
    """Requests to one instance's socket; use as ``async with Instance(path) as api``."""

    def __init__(self, socket_path: str, *, env: Mapping[str, str] | None = None,
                 timeout: float = REQUEST_TIMEOUT) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        import httpx  # loaded on first use (ADR 0033)
        self._client = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=socket_path, retries=0),
            base_url=BASE_URL, auth=_auth(env or {}),
            timeout=httpx.Timeout(timeout, connect=CONNECT_TIMEOUT))

    async def __aenter__(self) -> Instance:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._client.aclose()

    async def request(self, method: str, path: str, *, body: Any = None,
                      params: Mapping[str, str] | None = None) -> tuple[int, Any]:
        """The status and the decoded JSON answer (``None`` for an empty one)."""
        import httpx  # loaded on first use (ADR 0033)
        try:
            resp = await self._client.request(method, path, json=body, params=params)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise NotSent("opencode_unreachable", type(exc).__name__) from None
        except httpx.TransportError as exc:  # timeouts after connect, a dropped connection
            raise NoAnswer("opencode_no_answer", type(exc).__name__) from None
        text = resp.text[:MAX_BODY]
        if resp.status_code >= 400:
            raise HTTPStatus(resp.status_code, text)
        if not text.strip():
            return resp.status_code, None
        try:
            return resp.status_code, json.loads(text)
        except ValueError:
            raise NoAnswer("opencode_bad_answer", "not JSON") from None

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        return (await self.request("GET", path, params=params))[1]

    async def post(self, path: str, body: Any) -> tuple[int, Any]:
        return await self.request("POST", path, body=body)

    async def health(self) -> str | None:
        """opencode's version if the socket answers as opencode does, else
        :class:`OpencodeError` with ``not_opencode`` (it answered, but not as opencode)."""
        try:
            got = await self.get("/global/health")
        except HTTPStatus as exc:
            raise OpencodeError("not_opencode", f"health: {exc.status}") from None
        except NoAnswer as exc:
            raise OpencodeError("not_opencode", exc.reason) from None
        if not isinstance(got, dict) or got.get("healthy") is not True:
            raise OpencodeError("not_opencode", "health answer is not opencode's")
        version = got.get("version")
        return version if isinstance(version, str) else None

    async def events(self) -> AsyncGenerator[dict[str, Any], None]:
        """``GET /event``: each SSE ``data:`` line decoded (``{"type", "properties"}``). Ends
        when the instance closes the stream; a line that is not a JSON object is skipped."""
        import httpx  # loaded on first use (ADR 0033)
        timeout = httpx.Timeout(self.timeout, connect=CONNECT_TIMEOUT, read=EVENT_READ_TIMEOUT)
        try:
            async with self._client.stream("GET", "/event", timeout=timeout) as resp:
                if resp.status_code >= 400:
                    raise HTTPStatus(resp.status_code, (await resp.aread()).decode(
                        errors="replace"))
                async for line in resp.aiter_lines():
                    event = _data(line)
                    if event is not None:
                        yield event
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise NotSent("opencode_unreachable", type(exc).__name__) from None
        except httpx.TransportError as exc:
            raise NoAnswer("opencode_stream_lost", type(exc).__name__) from None


def _data(line: str) -> dict[str, Any] | None:
    if not line.startswith("data:"):
        return None
    try:
        event = json.loads(line[5:].strip())
    except ValueError:
        return None
    return event if isinstance(event, dict) and isinstance(event.get("type"), str) else None
