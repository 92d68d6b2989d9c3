"""The transport floor beside a gRPC figure: the same work over a raw TCP socket.

Run on the same fabric address, right after the gRPC measurement and with the same run
settings, it lets each gRPC figure be read as floor + gRPC overhead: a ping-pong of the same
sizes for latency, a push with one acknowledgement per tensor for bandwidth.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping
from types import MappingProxyType

from pytest_tfgrpc.bench.timing import RunSpec
from pytest_tfgrpc.results import BenchmarkResult, SizeResult
from pytest_tfgrpc.servers.floor_server import FloorServer, tcp_pingpong, tcp_push_ack
from pytest_tfgrpc.servers.processes import LOCAL, ChildProcess, Launcher
from pytest_tfgrpc.wire.fabric import Fabric

FLOOR_SUFFIX = "_floor"


def transport_floor(
    fabric: Fabric,
    result: BenchmarkResult,
    run: RunSpec,
    *,
    env: Mapping[str, str] | None = None,
    launcher: Launcher = LOCAL,
) -> BenchmarkResult:
    """Measure the raw-TCP floor of every size of ``result`` on ``fabric``; ``env`` is the
    floor server's environment (the servers' allocator settings, to compare like with like).
    With a node agent's ``launcher`` (the one the measured server ran through), the floor
    server runs on that host, so the floor is taken between the same two hosts.

    The result is labelled ``<label>_floor``; its ``elapsed_ns`` per size is the sum of its
    samples (the floor's operations run back to back).
    """
    latency = result.benchmark == "p2p_latency"
    measure = tcp_pingpong if latency else tcp_push_ack
    host = f"{fabric.address}%{fabric.zone}" if fabric.zone else fabric.address
    host = launcher.address or host
    sizes = []
    with _floor_server(host, env, launcher) as port:
        for size in result.sizes:
            samples = measure(
                host,
                port,
                size.size_bytes,
                iterations=run.iterations,
                warmup=run.warmup,
                max_seconds=run.time_limit_s,
            )
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
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return BenchmarkResult(
        benchmark="tcp_floor_latency" if latency else "tcp_floor_bandwidth",
        label=result.label + FLOOR_SUFFIX,
        fabric=result.fabric,
        target=target,
        mode="raw",
        rpc="tcp-pingpong" if latency else "tcp-push-ack",
        sizes=tuple(sizes),
        settings=MappingProxyType({**run.describe(), "floor_of": result.label}),
    )


@contextlib.contextmanager
def _floor_server(host: str, env: Mapping[str, str] | None, launcher: Launcher) -> Iterator[int]:
    """A floor server's port: here, or on the launcher's host (bound by its agent)."""
    if launcher is LOCAL:
        with FloorServer(host, env=env) as server:
            yield server.port
        return
    argv = [sys.executable, "-m", "pytest_tfgrpc.servers.floor_server", "--bind", host]
    name = f"floor server on host {launcher.host}"
    child = ChildProcess(argv, name=name, env=env, launcher=launcher)
    try:
        yield int(child.ready_line(15.0)["port"])
    finally:
        child.stop()
