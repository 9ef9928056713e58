"""An attacker in its own process: ``N`` slowloris connections to one A2A listener.

Each connection sends a request head one byte a second and never finishes it; when the server
closes one, it is opened again a moment later, so the pressure holds for the whole run.

    python slow_clients.py HOST PORT N

stdout, one JSON line each: ``{"event":"connected"}`` once all ``N`` first connections are
open; ``{"event":"first_wave_closed"}`` once the server has closed every one of those; and at
the end (stdin closed, or ``--seconds`` passed) ``{"event":"done","opened":…,"closed":…}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading

#: A head that never ends: one byte a second would take hours to send it.
HEAD = b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 100_000
RECONNECT_PAUSE = 0.1
#: The whole run's bound, whatever the parent does.
MAX_SECONDS = 120.0


class Stats:
    def __init__(self, first_wave: int) -> None:
        self.first_wave = first_wave
        self.opened = 0
        self.closed = 0
        self.first_wave_closed = 0
        self.connected = asyncio.Event()
        self.all_first_closed = asyncio.Event()


async def _hold(host: str, port: int, stats: Stats, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            await asyncio.sleep(RECONNECT_PAUSE)
            continue
        index = stats.opened
        stats.opened += 1
        if stats.opened == stats.first_wave:
            stats.connected.set()
        closed_by_server = False
        try:
            for i in range(len(HEAD)):
                writer.write(HEAD[i:i + 1])
                await writer.drain()
                try:
                    if await asyncio.wait_for(reader.read(1), 1.0) == b"":
                        closed_by_server = True
                        break
                except TimeoutError:
                    pass
                if stop.is_set():
                    break
        except OSError:
            closed_by_server = True
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        if closed_by_server:
            stats.closed += 1
            if index < stats.first_wave:
                stats.first_wave_closed += 1
                if stats.first_wave_closed == stats.first_wave:
                    stats.all_first_closed.set()
        await asyncio.sleep(RECONNECT_PAUSE)


def _say(**event: object) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


async def main(host: str, port: int, n: int) -> None:
    stats = Stats(n)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def watch_stdin() -> None:
        sys.stdin.read()
        loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=watch_stdin, daemon=True).start()
    loop.call_later(MAX_SECONDS, stop.set)
    holders = [asyncio.create_task(_hold(host, port, stats, stop)) for _ in range(n)]

    async def report() -> None:
        await stats.connected.wait()
        _say(event="connected")
        await stats.all_first_closed.wait()
        _say(event="first_wave_closed")

    reporter = asyncio.create_task(report())
    await stop.wait()
    reporter.cancel()
    for task in holders:
        task.cancel()
    await asyncio.gather(*holders, reporter, return_exceptions=True)
    _say(event="done", opened=stats.opened, closed=stats.closed)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
