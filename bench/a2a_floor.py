"""The bare A2A stack's own ceiling: SendMessage/s into one agent with no CrossTalk code at all.

Why: the project must speak A2A through the official a2a-sdk (1.x, JSON-RPC binding) served by
uvicorn, and its client over httpx. Before asking how fast CrossTalk's A2A path can be, this
asks how fast *any* server on that stack can be on this machine: can it take 1,500
SendMessage/s into one agent at all? The answer bounds every A2A figure in throughput.py.

What runs, and what does not:

- **server** (this process): the SDK's ``create_jsonrpc_routes`` + ``create_agent_card_routes``
  in a bare ``Starlette`` app (no middleware), on uvicorn in this process's asyncio loop
  (``http="h11"`` by default, ``log_config=None``, ``access_log=False``, ``loop="asyncio"``),
  over one pre-bound ``127.0.0.1`` socket with ``TCP_NODELAY`` as crosstalk.a2a.listener binds
  its own (but uvicorn's own accept loop and protocol, not the listener's bounded ones). The
  request handler is a trivial :class:`RequestHandler` whose ``on_message_send`` answers a
  completed Task at once: no journal, no fsync, no bearer guard, no body cap. The SDK still
  does all its wire work: JSON-RPC parsing and dispatch, the ``A2A-Version`` check (1.0),
  protobuf conversion both ways, required-field validation.
- **client** (a child process, so its CPU is not the server's): the SDK client made as
  crosstalk.a2a.peers makes its own (``ClientFactory(ClientConfig(httpx_client=...,
  streaming=False)).create(card)``; the factory adds the ``A2A-Version: 1.0`` header to the
  shared client) over one kept-alive ``httpx.AsyncClient``; the card is fetched once with the
  SDK's ``A2ACardResolver``. 16 concurrent ``send_message`` calls (``asyncio.Semaphore``), or
  one at a time with ``--sequential``. A send counts if its answer is a completed Task.

Two knobs say where a shortfall comes from. ``--client-pool slots`` swaps httpx's own pool for
one-connection transports handed out from a queue: httpcore's pool walks every connection
(polling each idle socket) several times per request, so at 16 in flight the *sender* pays
~2x the CPU per message (the reason for crosstalk.a2a.pool; ADR 0042). ``--senders K`` splits
the messages and the concurrency over K sender processes, released together after their
warm-ups, so one sender's core is not the ceiling (on 2 cores they then share with the server).

CPU per message: each sender reports its own ``time.process_time()`` across its timed window.
It prints a ``start`` line when its warm-up is done and waits for ``go`` on stdin; this
process takes its own ``process_time()`` just before writing ``go`` and again when it has read
every sender's result line, so the server's CPU window brackets the senders' (by one pipe hop
each way, tens of µs in a window of seconds) and includes that pipe I/O (negligible).
``--profile`` runs cProfile (on CPU time) on the server over the same window and prints the top
packages by own time (profiled runs are slower: take their figures as shares, not costs).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import importlib.util
import json
import pstats
import re
import socket
import subprocess
import sys
import sysconfig
import time
import uuid
from collections.abc import AsyncGenerator, Generator

import uvicorn
from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue import Event
from a2a.server.request_handlers import RequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.types import a2a_pb2 as pb
from a2a.utils.constants import PROTOCOL_VERSION_1_0
from a2a.utils.errors import TaskNotFoundError, UnsupportedOperationError
from starlette.applications import Starlette

from _stats import percentile

RPC_PATH = "/"

_SENDER = r"""
import asyncio, json, sys, time, uuid
import httpx
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types import a2a_pb2 as pb

url, total, conc, warm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
sequential, profile_to, pool = sys.argv[5] == "1", sys.argv[6], sys.argv[7]
profile = None
if profile_to:
    import cProfile
    profile = cProfile.Profile()

class Slots(httpx.AsyncBaseTransport):
    # --client-pool slots: conc one-connection transports handed out from a queue, so
    # httpcore's pool bookkeeping walks one connection per request, not conc.

    def __init__(self, n):
        self.all = [httpx.AsyncHTTPTransport(limits=httpx.Limits(
            max_connections=1, max_keepalive_connections=1)) for _ in range(n)]
        self.idle = asyncio.Queue()
        for slot in self.all:
            self.idle.put_nowait(slot)

    async def handle_async_request(self, request):
        slot = await self.idle.get()
        try:
            response = await slot.handle_async_request(request)
            body = b"".join([chunk async for chunk in response.stream])
            await response.stream.aclose()
        finally:
            self.idle.put_nowait(slot)
        return httpx.Response(response.status_code, headers=response.headers, content=body,
                              extensions=response.extensions)

    async def aclose(self):
        for slot in self.all:
            await slot.aclose()

async def main():
    limits = httpx.Limits(max_connections=conc, max_keepalive_connections=conc)
    transport = Slots(conc) if pool == "slots" else httpx.AsyncHTTPTransport(limits=limits)
    async with httpx.AsyncClient(timeout=30.0, transport=transport) as http:
        card = await A2ACardResolver(http, url).get_agent_card()
        client = ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create(card)

        async def send(i):
            request = pb.SendMessageRequest(message=pb.Message(
                message_id=uuid.uuid4().hex, role=pb.ROLE_USER,
                parts=[pb.Part(text=f"floor-{i}")]))
            state = None
            try:
                async for event in client.send_message(request):
                    if event.HasField("task"):
                        state = event.task.status.state
            except Exception as exc:  # counted, by cause, not fatal
                cause = exc.__cause__ or exc
                return f"{type(exc).__name__}:{type(cause).__name__}"
            return state == pb.TASK_STATE_COMPLETED or f"state:{state}"

        sem = asyncio.Semaphore(conc)

        async def one(i):
            async with sem:
                return await send(i)

        # warm-up: as concurrent as the timed run, so every pooled connection is open first
        await asyncio.gather(*(one(-1 - i) for i in range(warm)))
        print("start", flush=True)
        sys.stdin.readline()  # "go": every sender starts its timed sends together
        latencies = []
        if profile is not None:
            profile.enable()
        c0, t0 = time.process_time(), time.perf_counter()
        if sequential:
            ok = []
            for i in range(total):
                t = time.perf_counter()
                ok.append(await send(i))
                latencies.append(time.perf_counter() - t)
        else:
            ok = await asyncio.gather(*(one(i) for i in range(total)))
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        if profile is not None:
            profile.disable()
            profile.dump_stats(profile_to)
        await client.close()
    errors = {}
    for o in ok:
        if o is not True:
            errors[o] = errors.get(o, 0) + 1
    print(json.dumps({"accepted": ok.count(True), "seconds": seconds, "cpu": cpu,
                      "errors": errors, "latencies": latencies}), flush=True)

asyncio.run(main())
"""


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


class FloorHandler(RequestHandler):
    """Answers SendMessage with a completed Task at once; everything else is unsupported."""

    async def on_message_send(self, params: pb.SendMessageRequest,
                              context: ServerCallContext) -> pb.Task | pb.Message:
        message = params.message
        return pb.Task(id=message.task_id or uuid.uuid4().hex,
                       context_id=message.context_id or uuid.uuid4().hex,
                       status=pb.TaskStatus(state=pb.TASK_STATE_COMPLETED))

    async def on_get_task(self, params: pb.GetTaskRequest,
                          context: ServerCallContext) -> pb.Task | None:
        return None

    async def on_list_tasks(self, params: pb.ListTasksRequest,
                            context: ServerCallContext) -> pb.ListTasksResponse:
        return pb.ListTasksResponse()

    async def on_cancel_task(self, params: pb.CancelTaskRequest,
                             context: ServerCallContext) -> pb.Task | None:
        raise TaskNotFoundError

    async def on_message_send_stream(self, params: pb.SendMessageRequest,
                                     context: ServerCallContext) -> AsyncGenerator[Event]:
        raise UnsupportedOperationError
        yield

    async def on_subscribe_to_task(self, params: pb.SubscribeToTaskRequest,
                                   context: ServerCallContext) -> AsyncGenerator[Event]:
        raise UnsupportedOperationError
        yield

    async def on_create_task_push_notification_config(
            self, params: pb.TaskPushNotificationConfig,
            context: ServerCallContext) -> pb.TaskPushNotificationConfig:
        raise UnsupportedOperationError

    async def on_get_task_push_notification_config(
            self, params: pb.GetTaskPushNotificationConfigRequest,
            context: ServerCallContext) -> pb.TaskPushNotificationConfig:
        raise UnsupportedOperationError

    async def on_list_task_push_notification_configs(
            self, params: pb.ListTaskPushNotificationConfigsRequest,
            context: ServerCallContext) -> pb.ListTaskPushNotificationConfigsResponse:
        raise UnsupportedOperationError

    async def on_delete_task_push_notification_config(
            self, params: pb.DeleteTaskPushNotificationConfigRequest,
            context: ServerCallContext) -> None:
        raise UnsupportedOperationError

    async def on_get_extended_agent_card(self, params: pb.GetExtendedAgentCardRequest,
                                         context: ServerCallContext) -> pb.AgentCard:
        raise UnsupportedOperationError


def floor_card(url: str) -> pb.AgentCard:
    return pb.AgentCard(
        name="a2a-floor", description="bare a2a-sdk server (bench/a2a_floor.py)", version="0",
        supported_interfaces=[pb.AgentInterface(
            url=url, protocol_binding="JSONRPC", protocol_version=PROTOCOL_VERSION_1_0)],
        capabilities=pb.AgentCapabilities(streaming=False, push_notifications=False),
        default_input_modes=["text/plain"], default_output_modes=["text/plain"],
        skills=[pb.AgentSkill(id="floor", name="floor", description="answers completed",
                              tags=["bench"])])


def build_app(url: str) -> Starlette:
    return Starlette(routes=[
        *create_agent_card_routes(agent_card=floor_card(url)),
        *create_jsonrpc_routes(request_handler=FloorHandler(), rpc_url=RPC_PATH),
    ])


class _Server(uvicorn.Server):
    """uvicorn in this process's loop, leaving its signals alone."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


async def serve(http: str) -> tuple[_Server, asyncio.Task[None], str]:
    # As crosstalk.a2a.listener: proto=IPPROTO_TCP so asyncio keeps Nagle off, and NODELAY.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    config = uvicorn.Config(build_app(url), log_config=None, access_log=False,
                            lifespan="off", ws="none", http=http, loop="asyncio",
                            server_header=False, interface="asgi3",
                            timeout_graceful_shutdown=1)
    server = _Server(config)
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            raise RuntimeError(f"uvicorn did not start: {task.exception()!r}")
        await asyncio.sleep(0.005)
    return server, task, url


async def run(*, http: str, total: int, conc: int, warm: int, sequential: bool,
              profile: cProfile.Profile | None, client_profile: str | None,
              client_pool: str, senders: int) -> dict[str, object]:
    server, task, url = await serve(http)
    try:
        procs = [await asyncio.create_subprocess_exec(
            sys.executable, "-c", _SENDER, url, str(total // senders + (k < total % senders)),
            str(max(1, conc // senders)), str(warm), "1" if sequential else "0",
            f"{client_profile}.{k}" if client_profile else "", client_pool,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            limit=1 << 24) for k in range(senders)]  # the latencies line is long
        for proc in procs:
            assert proc.stdout is not None
            start = await proc.stdout.readline()
            if start.strip() != b"start":
                raise SystemExit(f"a sender failed in its warm-up: {start!r}")
        if profile is not None:
            profile.enable()
        c0 = time.process_time()
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            await proc.stdin.drain()
        lines = await asyncio.gather(*(p.stdout.readline() for p in procs if p.stdout))
        server_cpu = time.process_time() - c0
        if profile is not None:
            profile.disable()
        for proc, line in zip(procs, lines, strict=True):
            await proc.wait()
            if proc.returncode != 0 or not line:
                raise SystemExit(f"a sender failed (exit {proc.returncode})")
        results = [json.loads(line) for line in lines]
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            await task
    n = sum(r["accepted"] for r in results)
    seconds = max(r["seconds"] for r in results)
    client_cpu = sum(r["cpu"] for r in results)
    errors: dict[str, int] = {}
    for r in results:
        for cause, count in r["errors"].items():
            errors[cause] = errors.get(cause, 0) + count
    out: dict[str, object] = {
        "accepted": n, "failed": total - n, **({"errors": errors} if errors else {}),
        "seconds": round(seconds, 3),
        "server_cpu_us_per_msg": round(server_cpu / total * 1e6, 1),
        "client_cpu_us_per_msg": round(client_cpu / total * 1e6, 1),
        "server_cpu_share": round(server_cpu / seconds, 3),
        "client_cpu_share": round(client_cpu / seconds, 3)}
    if sequential:
        lat = [x * 1e6 for r in results for x in r["latencies"]]
        out |= {"p50_us": round(percentile(lat, 50), 1), "p90_us": round(percentile(lat, 90), 1),
                "p99_us": round(percentile(lat, 99), 1)}
    else:
        out["msgs_per_sec"] = round(n / seconds, 1)
    return out


_SITE = re.compile(r"[/\\](?:site|dist)-packages[/\\]([^/\\]+)")
_STDLIB = sysconfig.get_paths()["stdlib"].rstrip("/") + "/"
_C_OWNER = re.compile(r"of '([\w.]+)' objects|built-in method ([\w.]+)")


def package_of(filename: str, funcname: str) -> str:
    """A profile entry's top-level package: site-packages' first component; ``stdlib:x``;
    C functions (``~``) by their type's or module's top-level name, as ``C:x``."""
    found = _SITE.search(filename)
    if found:
        top = found.group(1)
        return top.removesuffix(".py").split(".")[0]
    if filename.startswith(_STDLIB):
        return "stdlib:" + filename[len(_STDLIB):].partition("/")[0].removesuffix(".py")
    if filename == "~":
        owner = _C_OWNER.search(funcname)
        name = next((g for g in owner.groups() if g), "") if owner else ""
        return "C:" + (name.split(".")[0] if "." in name else "builtins")
    return filename


def top_packages(profile: cProfile.Profile, k: int = 15) -> list[tuple[str, float]]:
    stats = pstats.Stats(profile)
    by: dict[str, float] = {}
    total = 0.0
    for (filename, _line, funcname), row in stats.stats.items():  # type: ignore[attr-defined]
        own = float(row[2])  # tottime
        total += own
        key = package_of(filename, funcname)
        by[key] = by.get(key, 0.0) + own
    ranked = sorted(by.items(), key=lambda kv: -kv[1])[:k]
    return [(name, own / total if total else 0.0) for name, own in ranked]


def main(args: argparse.Namespace) -> None:
    # CPU time, not wall: in --sequential the loop mostly waits in epoll for the next request,
    # and a wall-clock profile would rank that wait first.
    profile = cProfile.Profile(time.process_time_ns, 1e-9) if args.profile else None
    res = asyncio.run(run(
        http=args.http, total=args.messages,
        conc=args.senders if args.sequential else args.concurrency, warm=args.warmup,
        sequential=args.sequential, profile=profile, client_profile=args.client_profile_out,
        client_pool=args.client_pool, senders=args.senders))
    if args.sequential:
        emit(figure="a2a_sdk_floor_sequential_p50_us", value=res.pop("p50_us"), **res,
             messages=args.messages, concurrency=args.senders, http=args.http,
             client_pool=args.client_pool, senders=args.senders,
             profiled=profile is not None)
    else:
        emit(figure="a2a_sdk_floor_msgs_per_sec", value=res.pop("msgs_per_sec"), **res,
             messages=args.messages, concurrency=args.concurrency, http=args.http,
             client_pool=args.client_pool, senders=args.senders,
             profiled=profile is not None)
    if profile is not None:
        for rank, (name, share) in enumerate(top_packages(profile), 1):
            emit(figure="server_own_time_by_package", rank=rank, package=name,
                 share=round(share, 4))
        if args.profile_out:
            profile.dump_stats(args.profile_out)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--http", choices=["h11", "httptools"], default="h11")
    ap.add_argument("--client-pool", choices=["httpx", "slots"], default="httpx",
                    help="httpx: one AsyncClient's own pool (the default, as asked); slots: "
                         "one-connection transports from a queue (httpcore's pool walks every "
                         "connection per request, see crosstalk.a2a.pool)")
    ap.add_argument("--senders", type=int, default=1,
                    help="sender processes; --concurrency and --messages are split among them")
    ap.add_argument("--sequential", action="store_true",
                    help="one send at a time: p50 round trip and CPU per message")
    ap.add_argument("--profile", action="store_true",
                    help="cProfile the server over the timed window; top packages by own time")
    ap.add_argument("--profile-out", help="also dump the server's raw cProfile stats here")
    ap.add_argument("--client-profile-out",
                    help="cProfile the sender over its timed window; dump the stats here")
    args = ap.parse_args()
    if args.http == "httptools" and importlib.util.find_spec("httptools") is None:
        raise SystemExit("--http httptools: httptools is not importable in this environment")
    main(args)
