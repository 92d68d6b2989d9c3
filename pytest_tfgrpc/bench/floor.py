"""The transport floor beside a gRPC figure: the same work over a raw TCP socket.

Run on the same fabric address, right after the gRPC measurement and with the same run
settings, it lets each gRPC figure be read as floor + gRPC overhead: a ping-pong of the same
sizes for latency, a push with one acknowledgement per tensor for bandwidth. The floor server
is a child process like the tensor server
(:class:`~pytest_tfgrpc.roles.floor_server.FloorServer`, which also defines the protocol),
and every floor loop is timed by :mod:`pytest_tfgrpc.bench.timing`, as the gRPC loops are:
the warm-up bounded apart from the measured time, no cyclic garbage collection while timing,
at most ``run.iterations`` operations within ``run.time_limit_s``.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from pytest_tfgrpc.bench.settings import run_settings
from pytest_tfgrpc.bench.timing import RunSpec, Samples, measure
from pytest_tfgrpc.metrics import FLOOR_SUFFIX
from pytest_tfgrpc.results import BenchmarkResult, SizeResult
from pytest_tfgrpc.roles.floor_server import (
    ACK_BYTE,
    HEADER,
    OP_ACK,
    OP_ECHO,
    OP_SINK,
    OP_SINK_ACK,
    FloorError,
    FloorServer,
    recv_exact,
)
from pytest_tfgrpc.roles.processes import LOCAL, Launcher
from pytest_tfgrpc.tuning.cpus import pin_server, release_server
from pytest_tfgrpc.wire.client import rpc_timeout
from pytest_tfgrpc.wire.fabric import Fabric

__all__ = [
    "FLOOR_SUFFIX",
    "FloorClient",
    "FloorStream",
    "tcp_pingpong",
    "tcp_push_ack",
    "tcp_stream",
    "transport_floor",
]


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


def _set_io_timeout(sock: socket.socket, seconds: float) -> None:
    # A kernel timeout on a blocking socket bounds every call without the poll() that Python
    # adds before each recv when the socket has a Python-level timeout.
    sec = int(seconds)
    tv = struct.pack("ll", sec, int((seconds - sec) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


def _payload(op: int, size: int) -> memoryview:
    """The header of ``op`` followed by ``size`` bytes of a pattern that is not all zeros."""
    buf = bytearray(HEADER.size + size)
    np.frombuffer(buf, dtype=np.uint8, offset=HEADER.size)[:] = (
        np.arange(size, dtype=np.uint64) * 2654435761 >> 13
    ).astype(np.uint8)
    HEADER.pack_into(buf, 0, op, size)
    return memoryview(buf)


class FloorClient:
    """One TCP connection to a floor server (TCP_NODELAY), with the timed operations.

    Every timed loop is :func:`~pytest_tfgrpc.bench.timing.measure` under ``run``: it always
    times at least one operation, so a result is never empty.
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

    def __exit__(self, *exc: object) -> None:
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
        recv_exact(self.sock, memoryview(back))
        return bytes(back)

    def push_ack(self, data: bytes | bytearray | memoryview) -> None:
        """Send ``data`` as one SINK_ACK operation and wait for its acknowledgement."""
        out = bytearray(HEADER.size) + bytes(data)
        HEADER.pack_into(out, 0, OP_SINK_ACK, len(out) - HEADER.size)
        self.sock.sendall(out)
        self._wait_ack()

    def pingpong(self, size: int, run: RunSpec) -> Samples:
        """Round-trip time of each ECHO of ``size`` bytes, in ns; checks the echoed bytes."""
        send = _payload(OP_ECHO, size)
        recv = memoryview(bytearray(size))
        sock = self.sock

        def op() -> None:
            sock.sendall(send)
            recv_exact(sock, recv)

        samples, _ = measure(op, run)
        if recv != send[HEADER.size :]:
            raise FloorError(f"the floor server echoed different bytes for size {size}")
        return samples

    def push_ack_samples(self, size: int, run: RunSpec) -> Samples:
        """Time of each push of ``size`` bytes until its one-byte acknowledgement, in ns."""
        send = _payload(OP_SINK_ACK, size)
        sock, wait_ack = self.sock, self._wait_ack

        def op() -> None:
            sock.sendall(send)
            wait_ack()

        samples, _ = measure(op, run)
        return samples

    def stream(self, size: int, run: RunSpec) -> FloorStream:
        """Push up to ``run.iterations`` payloads back to back, one acknowledgement after the
        last; the stream's time is the pushes' plus the wait for that acknowledgement."""
        send = _payload(OP_SINK, size)
        sock, clock = self.sock, time.perf_counter_ns
        samples, elapsed = measure(lambda: sock.sendall(send), run, _Drain(self))
        t0 = clock()
        self.acknowledged()
        return FloorStream(size=size, count=len(samples), elapsed_ns=elapsed + clock() - t0)

    def acknowledged(self) -> None:
        """Ask for one acknowledgement once the server has read all sent so far; wait for it."""
        self.sock.sendall(_ACK_OP)
        self._wait_ack()


_ACK_OP = HEADER.pack(OP_ACK, 0)


class _Drain:
    """The stream's measured phase starts once the server has read the warm-up's pushes."""

    def __init__(self, client: FloorClient) -> None:
        self.client = client

    def start(self) -> None:
        self.client.acknowledged()

    def stop(self) -> None:
        pass


def _io_timeout(size: int, run: RunSpec) -> float:
    """A socket operation's bound: as a gRPC call's deadline, the run's bound and the bytes."""
    return rpc_timeout(2 * size, run.warmup_seconds + run.time_limit_s)


def tcp_pingpong(host: str, port: int, size: int, run: RunSpec) -> Samples:
    """Round-trip times (ns) of ``size``-byte echoes over one fresh connection."""
    with FloorClient(host, port, io_timeout=_io_timeout(size, run)) as client:
        return client.pingpong(size, run)


def tcp_push_ack(host: str, port: int, size: int, run: RunSpec) -> Samples:
    """Push-until-acknowledged times (ns) of ``size``-byte tensors over one fresh connection."""
    with FloorClient(host, port, io_timeout=_io_timeout(size, run)) as client:
        return client.push_ack_samples(size, run)


def tcp_stream(host: str, port: int, size: int, run: RunSpec) -> FloorStream:
    """A stream of ``size``-byte tensors with one acknowledgement at the end."""
    with FloorClient(host, port, io_timeout=_io_timeout(size, run)) as client:
        return client.stream(size, run)


def transport_floor(
    fabric: Fabric,
    result: BenchmarkResult,
    run: RunSpec,
    *,
    env: Mapping[str, str] | None = None,
    launcher: Launcher = LOCAL,
    pin: bool = False,
) -> BenchmarkResult:
    """Measure the raw-TCP floor of every size of ``result`` on ``fabric``; ``env`` is the
    floor server's environment (the servers' allocator settings, to compare like with like).
    With a node agent's ``launcher`` (the one the measured server ran through), the floor
    server runs on that host, so the floor is taken between the same two hosts. ``pin``
    (when the measured server was pinned, so on this host): the floor server runs on the
    placement's server CPUs (``--tfgrpc-cpus``) too.

    The result is labelled ``<label>_floor``; its ``elapsed_ns`` per size is the sum of its
    samples (the floor's operations run back to back).
    """
    latency = result.benchmark == "p2p_latency"
    timed = tcp_pingpong if latency else tcp_push_ack
    host = f"{fabric.address}%{fabric.zone}" if fabric.zone else fabric.address
    host = launcher.address or host
    sizes = []
    with FloorServer.start(host, env=env, launcher=launcher) as server:
        pinned = pin and launcher is LOCAL and pin_server(server.pid, who="the floor server")
        try:
            for size in result.sizes:
                samples = timed(host, server.port, size.size_bytes, run)
                sizes.append(
                    SizeResult.from_samples(
                        size.size_bytes,
                        size.size_bytes,
                        samples,
                        int(samples.sum()),
                        payload=size.payload,
                        buffers=size.buffers,
                    )
                )
        finally:
            if pinned:
                release_server(server.pid)
        target = f"[{host}]:{server.port}" if ":" in host else f"{host}:{server.port}"
    return BenchmarkResult(
        benchmark="tcp_floor_latency" if latency else "tcp_floor_bandwidth",
        label=result.label + FLOOR_SUFFIX,
        fabric=result.fabric,
        target=target,
        mode="raw",
        rpc="tcp-pingpong" if latency else "tcp-push-ack",
        sizes=tuple(sizes),
        settings=run_settings(run, engine=None, floor_of=result.label),
    )
