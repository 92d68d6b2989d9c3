"""The raw-TCP transport floor: what the fabric gives before gRPC adds anything.

A floor server runs in its own process, bound to one address, and answers a tiny protocol. Every
operation starts with a header (op code, payload length) sent in the same buffer as its payload:

- ``ECHO``: the server reads the payload and sends the same bytes back (ping-pong latency);
- ``SINK_ACK``: the server reads the payload, then sends one acknowledgement byte (a push with one
  acknowledgement per tensor, as gRPC push-with-ack does);
- ``SINK``: the server reads the payload and answers nothing; a following ``ACK`` (length 0) asks
  for one acknowledgement byte once everything before it was read (a pure stream).

The client functions return the duration of every timed operation in nanoseconds, so each gRPC
figure measured in the same run can be read as floor + gRPC overhead.

Run ``python -m pytest_tfgrpc.servers.floor_server --bind HOST`` to serve: it prints one JSON line
``{"port": N, "pid": P}`` once listening, and exits on stdin EOF or SIGTERM.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import IO

import numpy as np
import numpy.typing as npt

from pytest_tfgrpc.servers.processes import end_process

OP_ECHO = 1
OP_SINK_ACK = 2
OP_SINK = 3
OP_ACK = 4

HEADER = struct.Struct("!BQ")
ACK_BYTE = b"\x06"
#: Largest payload one operation may carry (a guard against a corrupt header).
MAX_PAYLOAD = 2**34
#: The sink ops read through a buffer of this size: they never hold a whole tensor.
SINK_CHUNK = 4 * 1024 * 1024


class FloorError(Exception):
    """The floor server could not start, or answered outside the protocol."""


@dataclass(frozen=True)
class FloorStream:
    """A timed stream: ``count`` payloads of ``size`` bytes, one acknowledgement at the end."""

    size: int
    count: int
    elapsed_ns: int

    @property
    def nbytes(self) -> int:
        return self.size * self.count

    @property
    def throughput(self) -> float:
        """Payload bytes per second (headers not counted)."""
        return self.nbytes * 1e9 / self.elapsed_ns if self.elapsed_ns > 0 else 0.0


# --------------------------------------------------------------------------------------------
# Server side (runs in the child process)
# --------------------------------------------------------------------------------------------


def _resolve_bind(host: str, port: int) -> tuple[socket.AddressFamily, tuple[object, ...]]:
    try:
        infos = socket.getaddrinfo(
            host,
            port,
            socket.AF_UNSPEC,
            socket.SOCK_STREAM,
            0,
            socket.AI_NUMERICHOST | socket.AI_PASSIVE,
        )
    except socket.gaierror as exc:
        raise FloorError(
            f"cannot bind to {host!r}: not a numeric IPv4/IPv6 address ({exc})"
        ) from exc
    family, _, _, _, sockaddr = infos[0]
    if ipaddress.ip_address(str(sockaddr[0]).split("%")[0]).is_unspecified:
        raise FloorError(f"refusing to bind to {host!r}: it means all interfaces, name one address")
    return family, tuple(sockaddr)


def listen(host: str, port: int = 0) -> socket.socket:
    """A listening TCP socket on exactly ``host`` (port 0: the OS picks one)."""
    family, sockaddr = _resolve_bind(host, port)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind(sockaddr)
        sock.listen(16)
    except OSError as exc:
        sock.close()
        raise FloorError(f"cannot bind to {host!r} port {port}: {exc.strerror or exc}") from exc
    return sock


def _recv_exact(sock: socket.socket, view: memoryview) -> None:
    n = len(view)
    got = sock.recv_into(view)
    while got < n:
        if got == 0:
            raise FloorError("peer closed the connection in the middle of a message")
        k = sock.recv_into(view[got:])
        if k == 0:
            raise FloorError("peer closed the connection in the middle of a message")
        got += k


def _serve_connection(conn: socket.socket) -> None:
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    header = bytearray(HEADER.size)
    hview = memoryview(header)
    buf = bytearray(SINK_CHUNK)
    view = memoryview(buf)
    try:
        while True:
            got = conn.recv_into(hview)
            if got == 0:
                return  # clean close between operations
            if got < HEADER.size:
                _recv_exact(conn, hview[got:])
            op, length = HEADER.unpack(header)
            if length > MAX_PAYLOAD:
                return
            if op == OP_ECHO:
                if length > len(buf):
                    buf = bytearray(length)
                    view = memoryview(buf)
                _recv_exact(conn, view[:length])
                conn.sendall(view[:length])
            elif op in (OP_SINK_ACK, OP_SINK):
                remaining = length
                while remaining:
                    k = min(remaining, len(buf))
                    _recv_exact(conn, view[:k])
                    remaining -= k
                if op == OP_SINK_ACK:
                    conn.sendall(ACK_BYTE)
            elif op == OP_ACK:
                conn.sendall(ACK_BYTE)
            else:
                return  # unknown op: the stream is out of sync, drop it
    except (OSError, FloorError):
        return
    finally:
        conn.close()


def _accept_loop(listener: socket.socket) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return  # listener closed: shutting down
        threading.Thread(target=_serve_connection, args=(conn,), daemon=True).start()


def _on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(0)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the floor protocol until stdin reaches EOF or SIGTERM arrives."""
    parser = argparse.ArgumentParser(
        prog="python -m pytest_tfgrpc.servers.floor_server", description=__doc__
    )
    parser.add_argument("--bind", required=True, help="IPv4 or IPv6 address to listen on")
    parser.add_argument("--port", type=int, default=0, help="port (default 0: the OS picks)")
    args = parser.parse_args(argv)
    # The parent shuts us down through stdin; a Ctrl-C to the process group is its business.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        listener = listen(args.bind, args.port)
    except FloorError as exc:
        print(f"floor: {exc}", file=sys.stderr, flush=True)
        return 2
    try:
        threading.Thread(target=_accept_loop, args=(listener,), daemon=True).start()
        port = listener.getsockname()[1]
        print(json.dumps({"port": port, "pid": os.getpid()}), flush=True)
        while os.read(0, 4096):
            pass
    finally:
        listener.close()
    return 0


# --------------------------------------------------------------------------------------------
# Process handle (parent side)
# --------------------------------------------------------------------------------------------


def _read_tail(f: IO[bytes], limit: int = 4000) -> str:
    f.seek(0)
    return f.read().decode(errors="replace")[-limit:]


class FloorServer:
    """A floor server in its own process: start, wait until ready, stop; never left behind.

    Use as a context manager, or call :meth:`start` and :meth:`stop`. Dropping the last
    reference stops the process too, and the process exits by itself when this one dies (it
    watches its stdin).
    """

    def __init__(
        self,
        host: str,
        port: int = 0,
        *,
        python: str = sys.executable,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.env = dict(env) if env is not None else None
        self.host = host
        self.requested_port = port
        self.python = python
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self._port: int | None = None
        self._finalizer: weakref.finalize[[subprocess.Popen[bytes], float], FloorServer] | None = (
            None
        )

    @property
    def port(self) -> int:
        if self._port is None:
            raise FloorError("the floor server is not ready")
        return self._port

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise FloorError("the floor server was not started")
        return self._proc.pid

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    def start(self) -> FloorServer:
        """Start the process (returns at once; :meth:`ready` waits for it to listen)."""
        if self._proc is not None:
            raise FloorError("the floor server was already started")
        # A file, not a pipe: a chatty child can never block on a full pipe nobody drains.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed in stop())
        self._proc = subprocess.Popen(
            [
                self.python,
                "-m",
                "pytest_tfgrpc.servers.floor_server",
                "--bind",
                self.host,
                "--port",
                str(self.requested_port),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=self.env,
        )
        self._finalizer = weakref.finalize(self, end_process, self._proc, 5.0)
        return self

    def ready(self, timeout: float = 15.0) -> FloorServer:
        """Wait until the server listens; raise :class:`FloorError` with its stderr otherwise."""
        proc = self._proc
        if proc is None or proc.stdout is None:
            raise FloorError("the floor server was not started")
        if self._port is not None:
            return self
        deadline = time.monotonic() + timeout
        line = b""
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while not line.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0:
                    self.stop()
                    raise FloorError(
                        f"floor server on {self.host!r} not ready within {timeout} s"
                        f"{self._stderr_note()}"
                    )
                if sel.select(left):
                    chunk = os.read(proc.stdout.fileno(), 4096)
                    if not chunk:
                        code = proc.wait()
                        note = self._stderr_note()
                        self.stop()
                        raise FloorError(
                            f"floor server on {self.host!r} exited with status {code}{note}"
                        )
                    line += chunk
        self._port = int(json.loads(line)["port"])
        return self

    def _stderr_note(self) -> str:
        if self._stderr is None:
            return ""
        tail = _read_tail(self._stderr).strip()
        return f": {tail}" if tail else ""

    def stop(self, timeout: float = 5.0) -> int | None:
        """Close its stdin, wait, then SIGTERM, then SIGKILL; return its exit status."""
        proc = self._proc
        if proc is None:
            return None
        if self._finalizer is not None:
            self._finalizer.detach()
        end_process(proc, timeout)
        if proc.stdout is not None:
            proc.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        return proc.returncode

    def __enter__(self) -> FloorServer:
        if self._proc is None:
            self.start()
        try:
            return self.ready()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


# --------------------------------------------------------------------------------------------
# Client side
# --------------------------------------------------------------------------------------------


def _set_io_timeout(sock: socket.socket, seconds: float) -> None:
    # A kernel timeout on a blocking socket bounds every call without the poll() that Python
    # adds before each recv when the socket has a Python-level timeout.
    sec = int(seconds)
    tv = struct.pack("ll", sec, int((seconds - sec) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


def _check_counts(iterations: int, warmup: int, max_seconds: float) -> None:
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if not max_seconds > 0:
        raise ValueError(f"max_seconds must be > 0, got {max_seconds}")


def _payload(size: int) -> bytearray:
    """A header-sized gap followed by ``size`` bytes of a pattern that is not all zeros."""
    buf = bytearray(HEADER.size + size)
    np.frombuffer(buf, dtype=np.uint8, offset=HEADER.size)[:] = (
        np.arange(size, dtype=np.uint64) * 2654435761 >> 13
    ).astype(np.uint8)
    return buf


class FloorClient:
    """One TCP connection to a floor server (TCP_NODELAY), with the timed operations.

    Every loop stops at ``iterations`` (or ``count``) operations or when ``max_seconds`` have
    passed since the call began, whichever comes first; it checks the time between operations,
    and always times at least one, so a result is never empty.
    """

    def __init__(
        self, host: str, port: int, *, connect_timeout: float = 10.0, io_timeout: float = 60.0
    ) -> None:
        self.sock = socket.create_connection((host, port), timeout=connect_timeout)
        self.sock.settimeout(None)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _set_io_timeout(self.sock, io_timeout)
        self._ack = bytearray(1)
        self._ackview = memoryview(self._ack)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> FloorClient:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _wait_ack(self) -> None:
        if self.sock.recv_into(self._ackview) != 1 or self._ack != ACK_BYTE:
            raise FloorError("expected one acknowledgement byte from the floor server")

    def echo(self, data: bytes | bytearray | memoryview) -> bytes:
        """Send ``data`` as one ECHO operation and return what came back."""
        out = bytearray(HEADER.size) + bytes(data)
        HEADER.pack_into(out, 0, OP_ECHO, len(out) - HEADER.size)
        self.sock.sendall(out)
        back = bytearray(len(out) - HEADER.size)
        _recv_exact(self.sock, memoryview(back))
        return bytes(back)

    def push_ack(self, data: bytes | bytearray | memoryview) -> None:
        """Send ``data`` as one SINK_ACK operation and wait for its acknowledgement."""
        out = bytearray(HEADER.size) + bytes(data)
        HEADER.pack_into(out, 0, OP_SINK_ACK, len(out) - HEADER.size)
        self.sock.sendall(out)
        self._wait_ack()

    def pingpong(
        self, size: int, *, iterations: int, warmup: int = 10, max_seconds: float = 10.0
    ) -> npt.NDArray[np.int64]:
        """Round-trip time of each ECHO of ``size`` bytes, in ns; checks the echoed bytes."""
        _check_counts(iterations, warmup, max_seconds)
        out = _payload(size)
        HEADER.pack_into(out, 0, OP_ECHO, size)
        send = memoryview(out)
        back = bytearray(size)
        recv = memoryview(back)
        sock, clock = self.sock, time.perf_counter_ns
        deadline = clock() + int(max_seconds * 1e9)
        for _ in range(warmup):
            if clock() >= deadline:
                break
            sock.sendall(send)
            _recv_exact(sock, recv)
        samples = np.empty(iterations, dtype=np.int64)
        n = 0
        while n < iterations:
            t0 = clock()
            sock.sendall(send)
            _recv_exact(sock, recv)
            t1 = clock()
            samples[n] = t1 - t0
            n += 1
            if t1 >= deadline:
                break
        if recv != send[HEADER.size :]:
            raise FloorError(f"the floor server echoed different bytes for size {size}")
        taken: npt.NDArray[np.int64] = samples[:n].copy()
        return taken

    def push_ack_samples(
        self, size: int, *, iterations: int, warmup: int = 3, max_seconds: float = 10.0
    ) -> npt.NDArray[np.int64]:
        """Time of each push of ``size`` bytes until its one-byte acknowledgement, in ns."""
        _check_counts(iterations, warmup, max_seconds)
        out = _payload(size)
        HEADER.pack_into(out, 0, OP_SINK_ACK, size)
        send = memoryview(out)
        sock, clock, wait_ack = self.sock, time.perf_counter_ns, self._wait_ack
        deadline = clock() + int(max_seconds * 1e9)
        for _ in range(warmup):
            if clock() >= deadline:
                break
            sock.sendall(send)
            wait_ack()
        samples = np.empty(iterations, dtype=np.int64)
        n = 0
        while n < iterations:
            t0 = clock()
            sock.sendall(send)
            wait_ack()
            t1 = clock()
            samples[n] = t1 - t0
            n += 1
            if t1 >= deadline:
                break
        taken: npt.NDArray[np.int64] = samples[:n].copy()
        return taken

    def stream(
        self, size: int, *, count: int, warmup: int = 2, max_seconds: float = 10.0
    ) -> FloorStream:
        """Push up to ``count`` payloads back to back, one acknowledgement after the last."""
        _check_counts(count, warmup, max_seconds)
        out = _payload(size)
        HEADER.pack_into(out, 0, OP_SINK, size)
        send = memoryview(out)
        ack_op = HEADER.pack(OP_ACK, 0)
        sock, clock = self.sock, time.perf_counter_ns
        deadline = clock() + int(max_seconds * 1e9)
        for _ in range(warmup):
            if clock() >= deadline:
                break
            sock.sendall(send)
        sock.sendall(ack_op)
        self._wait_ack()
        n = 0
        t0 = clock()
        while n < count:
            sock.sendall(send)
            n += 1
            if clock() >= deadline:
                break
        sock.sendall(ack_op)
        self._wait_ack()
        return FloorStream(size=size, count=n, elapsed_ns=clock() - t0)


def tcp_pingpong(
    host: str,
    port: int,
    size: int,
    *,
    iterations: int,
    warmup: int = 10,
    max_seconds: float = 10.0,
) -> npt.NDArray[np.int64]:
    """Round-trip times (ns) of ``size``-byte echoes over one fresh connection."""
    with FloorClient(host, port) as client:
        return client.pingpong(size, iterations=iterations, warmup=warmup, max_seconds=max_seconds)


def tcp_push_ack(
    host: str,
    port: int,
    size: int,
    *,
    iterations: int,
    warmup: int = 3,
    max_seconds: float = 10.0,
) -> npt.NDArray[np.int64]:
    """Push-until-acknowledged times (ns) of ``size``-byte tensors over one fresh connection."""
    with FloorClient(host, port) as client:
        return client.push_ack_samples(
            size, iterations=iterations, warmup=warmup, max_seconds=max_seconds
        )


def tcp_stream(
    host: str, port: int, size: int, *, count: int, warmup: int = 2, max_seconds: float = 10.0
) -> FloorStream:
    """A stream of ``size``-byte tensors with one acknowledgement at the end."""
    with FloorClient(host, port) as client:
        return client.stream(size, count=count, warmup=warmup, max_seconds=max_seconds)


if __name__ == "__main__":
    sys.exit(main())
