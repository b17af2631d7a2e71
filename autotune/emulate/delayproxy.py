"""A delaying TCP proxy on loopback: remote-region latency in front of a local server.

    with DelayProxy(("127.0.0.1", 8333), delay=0.05) as (host, port):
        ...  # connect to host:port instead: every byte arrives 50 ms later each way

A pipelined delay line, not a sleep per chunk: each chunk read from either side is
stamped with its arrival time and queued; a writer per direction releases it to the other
side `delay` seconds after it arrived. Reading goes on while earlier chunks wait, so a
stream's bandwidth is not cut by the delay (a sleep per chunk would cap it at
chunk/delay); a request-response round trip costs 2 x delay, as a link with that one-way
latency would. A direction's queue holds at most `max_queued` bytes (then reading pauses:
TCP's own back-pressure), which bounds memory when one side reads slowly.
A side that goes away mid-stream (a client closing a body it did not finish) ends the
connection both ways, so the other side is not held open behind a full queue.

This kernel has no sch_netem, hence a proxy; it touches nothing of the machine's own
loopback. Runs an asyncio loop in a daemon thread (`DelayProxy`), or as a process:
`python -m autotune.emulate.delayproxy --target HOST:PORT --delay 0.05 [--listen PORT]`.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

CHUNK = 256 * 1024


class _Line:
    """One direction's delay line: chunks with their release times, bounded in bytes."""

    def __init__(self, delay: float, max_queued: int) -> None:
        self.delay, self.max_queued = delay, max_queued
        self.items: collections.deque[tuple[float, bytes]] = collections.deque()
        self.queued = 0
        self.changed = asyncio.Event()

    def put(self, data: bytes) -> None:
        self.items.append((time.monotonic() + self.delay, data))
        self.queued += len(data)
        self.changed.set()

    async def room(self) -> None:
        while self.queued >= self.max_queued:
            self.changed.clear()
            await self.changed.wait()

    async def get(self) -> bytes:
        """The next chunk at its release time (b'' is the end of the stream)."""
        while not self.items:
            self.changed.clear()
            await self.changed.wait()
        due, data = self.items[0]
        wait = due - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        self.items.popleft()
        self.queued -= len(data)
        self.changed.set()
        return data


async def _read_into(reader: asyncio.StreamReader, line: _Line, proxy: DelayProxy) -> None:
    try:
        while True:
            await line.room()
            data = await reader.read(CHUNK)
            proxy.chunks += 1
            line.put(data)
            if not data:
                return
    except (ConnectionError, OSError):
        line.put(b"")


async def _write_from(line: _Line, writer: asyncio.StreamWriter,
                      abort: Callable[[], None]) -> None:
    try:
        while True:
            data = await line.get()
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()  # half-close, delayed like the data before it
                return
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        # This side is gone (a client that closed mid-body): nothing more can reach it,
        # so end the connection both ways. Else the other side kept sending into a queue
        # that no one drains, its reader parked in room() and its socket open for ever.
        abort()


class DelayProxy:
    """Listen on loopback, forward to `target`, each direction delayed by `delay` seconds.

    listen_port: 0 picks a free port (the address is what the context manager returns,
        and `.address` after `start()`).
    max_queued: bytes held per direction of a connection before reading from it pauses.
    """

    def __init__(self, target: tuple[str, int], delay: float, *, listen_host: str = "127.0.0.1",
                 listen_port: int = 0, max_queued: int = 64 * 1024 * 1024) -> None:
        if delay < 0:
            raise ValueError(f"delay must be at least 0 seconds, but got {delay}.")
        self.target, self.delay, self.max_queued = target, delay, max_queued
        self.listen = (listen_host, listen_port)
        self.address: tuple[str, int] = ("", 0)
        self.connections = 0
        self.chunks = 0  # chunks read (both directions): a sleep per chunk would cost each
        self.aborted = 0  # connections ended because one side went away mid-stream
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> tuple[str, int]:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://{self.address[0]}:{self.address[1]}"

    def start(self) -> tuple[str, int]:
        ready = threading.Event()
        failed: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self._server = loop.run_until_complete(
                    asyncio.start_server(self._handle, *self.listen))
                self.address = self._server.sockets[0].getsockname()[:2]
            except BaseException as e:  # noqa: BLE001 (handed to the caller)
                failed.append(e)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name="delayproxy", daemon=True)
        self._thread.start()
        ready.wait()
        if failed:
            raise failed[0]
        return self.address

    def stop(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return

        async def close() -> None:
            if self._server is not None:
                self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            # Let every connection's finally run (sockets closed) before the loop stops.
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(close(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)

    async def _handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            sreader, swriter = await asyncio.open_connection(*self.target)
        except OSError:
            cwriter.close()
            return
        up, down = _Line(self.delay, self.max_queued), _Line(self.delay, self.max_queued)
        tasks = [asyncio.ensure_future(c) for c in (
            _read_into(creader, up, self), _read_into(sreader, down, self))]

        def abort() -> None:
            self.aborted += 1
            for t in tasks:
                t.cancel()
            for w in (swriter, cwriter):
                w.close()

        tasks += [asyncio.ensure_future(_write_from(up, swriter, abort)),
                  asyncio.ensure_future(_write_from(down, cwriter, abort))]
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        except asyncio.CancelledError:
            pass  # stop(): end quietly (Python 3.11's start_server logs a cancelled handler)
        finally:
            for w in (swriter, cwriter):
                with contextlib.suppress(Exception):
                    w.close()


def main(argv: list[str] | None = None) -> None:
    """Run a proxy in the foreground until interrupted; prints its address."""
    ap = argparse.ArgumentParser(prog="python -m autotune.emulate.delayproxy")
    ap.add_argument("--target", required=True, help="HOST:PORT to forward to")
    ap.add_argument("--delay", type=float, required=True, help="seconds each way")
    ap.add_argument("--listen", type=int, default=0, help="loopback port (0: a free one)")
    a = ap.parse_args(argv)
    host, _, port = a.target.rpartition(":")
    proxy = DelayProxy((host or "127.0.0.1", int(port)), a.delay, listen_port=a.listen)
    addr: Any = proxy.start()
    print(f"{addr[0]}:{addr[1]}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        proxy.stop()


if __name__ == "__main__":
    main()
