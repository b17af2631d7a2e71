"""The delaying TCP proxy: real sockets, real servers on loopback.

Only lower bounds on times, except one upper bound with a margin noise cannot break: a
proxy that slept per chunk would take at least chunks x delay (the chunks it counted),
and a busy machine only makes the pipelined one slower by its transfer time, never by a
delay per chunk.
"""

from __future__ import annotations

import os
import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from autotune.emulate.delayproxy import DelayProxy

DELAY = 0.05


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


class _Source(socketserver.BaseRequestHandler):
    """Sends SIZE bytes as soon as a client connects, then closes."""
    SIZE = 32 * 1024 * 1024

    def handle(self) -> None:
        block = b"\xab" * (1024 * 1024)
        for _ in range(self.SIZE // len(block)):
            self.request.sendall(block)


def _serve(handler: type) -> Iterator[tuple[str, int]]:
    srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield srv.server_address[:2]
    finally:
        srv.shutdown()
        srv.server_close()


class _Ranged(socketserver.BaseRequestHandler):
    """A keep-alive request-response server: each line b"N\\n" is answered with N bytes."""

    def handle(self) -> None:
        f = self.request.makefile("rb")
        while line := f.readline():
            n = int(line)
            block = bytes(range(256)) * 4096  # 1 MiB
            while n > 0:
                self.request.sendall(block[:n])
                n -= min(n, len(block))


class _Endless(socketserver.BaseRequestHandler):
    """Sends until the connection breaks, then says so (`ended`)."""
    ended = threading.Event()

    def handle(self) -> None:
        block = b"\xcd" * (1024 * 1024)
        try:
            while True:
                self.request.sendall(block)
        except OSError:
            _Endless.ended.set()


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    yield from _serve(_Echo)


@pytest.fixture
def source() -> Iterator[tuple[str, int]]:
    yield from _serve(_Source)


@pytest.fixture
def ranged() -> Iterator[tuple[str, int]]:
    yield from _serve(_Ranged)


@pytest.fixture
def endless() -> Iterator[tuple[str, int]]:
    _Endless.ended.clear()
    yield from _serve(_Endless)


def _recv_exactly(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(min(1 << 20, n - len(buf)))
        assert chunk, f"connection closed after {len(buf)} of {n} bytes"
        buf += chunk
    return bytes(buf)


def test_round_trip_waits_the_delay_each_way_and_bytes_are_identical(echo) -> None:
    payload = os.urandom(4 * 1024 * 1024)
    with DelayProxy(echo, DELAY) as addr, socket.create_connection(addr) as s:
        t0 = time.monotonic()
        s.sendall(b"x")
        first = _recv_exactly(s, 1)
        rtt = time.monotonic() - t0
        sender = threading.Thread(target=s.sendall, args=(payload,))
        sender.start()
        got = _recv_exactly(s, len(payload))
        sender.join()
    assert first == b"x"
    # Up and down, each released DELAY after it arrived (1 ms for the loop's clock).
    assert rtt >= 2 * DELAY - 0.001
    assert got == payload


def test_first_byte_from_server_waits_the_delay(source) -> None:
    with DelayProxy(source, DELAY) as addr:
        t0 = time.monotonic()
        with socket.create_connection(addr) as s:
            s.recv(1)
            assert time.monotonic() - t0 >= DELAY - 0.001


def test_half_close_passes_through(echo) -> None:
    with DelayProxy(echo, 0.01) as addr, socket.create_connection(addr) as s:
        s.sendall(b"abc")
        s.shutdown(socket.SHUT_WR)
        assert _recv_exactly(s, 3) == b"abc"
        assert s.recv(10) == b""  # the server saw our EOF and closed


@pytest.mark.slow
def test_bandwidth_is_not_cut_by_the_delay(source) -> None:
    proxy = DelayProxy(source, DELAY)
    with proxy as addr, socket.create_connection(addr) as s:
        t0 = time.monotonic()
        n = 0
        while chunk := s.recv(1 << 20):
            n += len(chunk)
        elapsed = time.monotonic() - t0
        chunks = proxy.chunks
    assert n == _Source.SIZE
    assert elapsed >= DELAY - 0.001
    # A sleep per chunk would need chunks x DELAY (>= 128 x 50 ms = 6.4 s for 32 MiB in
    # chunks of at most 256 KiB); the delay line needs DELAY plus the copy.
    assert chunks >= _Source.SIZE // (256 * 1024)
    assert elapsed < 0.5 * chunks * DELAY, (elapsed, chunks)


def test_refuses_a_negative_delay() -> None:
    with pytest.raises(ValueError, match="delay must be at least 0"):
        DelayProxy(("127.0.0.1", 1), -1)


def test_connections_that_pause_mid_body_and_resume_get_every_byte(ranged) -> None:
    # Several keep-alive connections at once, each asking for multi-MB bodies and pausing
    # halfway through each (the queue, 256 KiB here, fills and the proxy stops reading),
    # as a ranged GET read by a busy DataLoader worker does. Bytes are counted; the socket
    # timeout is only there to turn a stall into a failure.
    size, got, errors = 6 * 1024 * 1024, [], []

    def client(addr: tuple[str, int]) -> None:
        try:
            with socket.create_connection(addr, timeout=30) as s:
                for _ in range(3):
                    s.sendall(b"%d\n" % size)
                    first = _recv_exactly(s, size // 2)
                    time.sleep(0.2)  # the client stops reading mid-body
                    rest = _recv_exactly(s, size - size // 2)
                    got.append(first + rest)
        except Exception as e:  # noqa: BLE001 (handed to the assertion)
            errors.append(e)

    with DelayProxy(ranged, 0.01, max_queued=256 * 1024) as addr:
        threads = [threading.Thread(target=client, args=(addr,)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    expected = (bytes(range(256)) * 4096 * 6)[:size]
    assert len(got) == 12 and all(g == expected for g in got)


def test_a_client_that_abandons_a_body_ends_the_server_side(endless) -> None:
    proxy = DelayProxy(endless, 0.01, max_queued=1024 * 1024)
    with proxy as addr:
        with socket.create_connection(addr, timeout=30) as s:
            _recv_exactly(s, 1024 * 1024)
        # The proxy can no longer write to the client, so it closes its side to the server
        # (which sees its send fail) instead of holding it and a full queue for ever.
        assert _Endless.ended.wait(30)
        assert proxy.aborted == 1
        # And it still serves the next connection.
        with socket.create_connection(addr, timeout=30) as s:
            assert len(_recv_exactly(s, 1024 * 1024)) == 1024 * 1024
