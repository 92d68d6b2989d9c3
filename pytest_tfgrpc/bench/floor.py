"""The transport floor beside a gRPC figure: the same work over a raw TCP socket.

Run on the same fabric address, right after the gRPC measurement and with the same run
settings, it lets each gRPC figure be read as floor + gRPC overhead: a ping-pong of the same
sizes for latency, a push with one acknowledgement per tensor for bandwidth.
"""

from __future__ import annotations

from collections.abc import Mapping

from pytest_tfgrpc.bench.settings import run_settings
from pytest_tfgrpc.bench.timing import RunSpec
from pytest_tfgrpc.report.metrics import FLOOR_SUFFIX
from pytest_tfgrpc.results import BenchmarkResult, SizeResult
from pytest_tfgrpc.servers.floor_server import FloorServer, tcp_pingpong, tcp_push_ack
from pytest_tfgrpc.wire.fabric import Fabric


def transport_floor(
    fabric: Fabric,
    result: BenchmarkResult,
    run: RunSpec,
    *,
    env: Mapping[str, str] | None = None,
) -> BenchmarkResult:
    """Measure the raw-TCP floor of every size of ``result`` on ``fabric``; ``env`` is the
    floor server's environment (the servers' allocator settings, to compare like with like).

    The result is labelled ``<label>_floor``; its ``elapsed_ns`` per size is the sum of its
    samples (the floor's operations run back to back).
    """
    latency = result.benchmark == "p2p_latency"
    measure = tcp_pingpong if latency else tcp_push_ack
    host = f"{fabric.address}%{fabric.zone}" if fabric.zone else fabric.address
    sizes = []
    with FloorServer(host, env=env) as server:
        for size in result.sizes:
            samples = measure(
                host,
                server.port,
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
        target = f"[{host}]:{server.port}" if ":" in host else f"{host}:{server.port}"
    return BenchmarkResult(
        benchmark="tcp_floor_latency" if latency else "tcp_floor_bandwidth",
        label=result.label + FLOOR_SUFFIX,
        fabric=result.fabric,
        target=target,
        mode="raw",
        rpc="tcp-pingpong" if latency else "tcp-push-ack",
        sizes=tuple(sizes),
        settings=run_settings(run, floor_of=result.label),
    )
