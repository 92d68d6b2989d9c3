"""A loop of the plugin's measuring path to profile with py-spy (client and server).

    python benchmarks/experiments/profile_target.py WHAT SECONDS PIDFILE

``WHAT``: ``unary`` / ``stream`` (1 KiB raw echo, the p2p_latency loops) or
``push-raw-4MiB``, ``push-protobuf-64MiB`` ... (the p2p_bandwidth stream push), or
``floor-4MiB`` (the raw-TCP push+ack floor, for its CPU per tensor). The plugin's
server is started with the tuned allocator environment; its pid is written to ``PIDFILE`` and
the loop starts one second later, so a profiler can attach to the server first. Every loop is
bounded by ``SECONDS`` and by a count.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from pytest_tfgrpc.bench import BandwidthCall, LatencyCall, RunSpec, p2p_bandwidth, p2p_latency
from pytest_tfgrpc.bench import floor as floor_client
from pytest_tfgrpc.roles import floor_server as floor
from pytest_tfgrpc.roles.processes import ServerProcess
from pytest_tfgrpc.tuning import allocator as tuning
from pytest_tfgrpc.units import parse_sizes
from pytest_tfgrpc.wire.fabric import resolve_fabric


def cpu_ns(pid: int) -> int:
    """User + system CPU time of a process, all its threads (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    return ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def thread_cpu_ns(pid: int) -> dict[str, int]:
    """CPU time of each thread of a process, summed by thread name (``/proc/<pid>/task``).

    grpc core's own threads (event engine pollers and executors) are invisible to py-spy,
    which samples Python threads only; their names show here.
    """
    out: dict[str, int] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks = int(fields[11]) + int(fields[12])
        out[name] = out.get(name, 0) + ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    return out


def _per_op(before: dict[str, int], after: dict[str, int], count: int) -> str:
    used = {k: v - before.get(k, 0) for k, v in after.items()}
    top = sorted(used.items(), key=lambda kv: -kv[1])[:6]
    return ", ".join(f"{name} {ns / count / 1e3:.0f}" for name, ns in top if ns > 0)


def floor_push(size: int, seconds: float, pidfile: Path, env: dict[str, str] | None) -> int:
    """The raw-TCP floor's push+ack loop, with the same CPU accounting as the plugin's."""
    saved = dict(os.environ)
    os.environ.update(env or {})
    try:
        server = floor.FloorServer.start("127.0.0.1")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        pidfile.write_text(str(server.pid))
        time.sleep(1.0)
        cpu0 = cpu_ns(os.getpid()), cpu_ns(server.pid)
        t0 = time.monotonic()
        host, port = server.address
        samples = floor_client.tcp_push_ack(
            host, port, size, RunSpec(100_000, 2, max_seconds=seconds, warmup_seconds=seconds)
        )
        wall = time.monotonic() - t0
        count = len(samples)
        client_cpu = cpu_ns(os.getpid()) - cpu0[0]
        server_cpu = cpu_ns(server.pid) - cpu0[1]
        median = float(sorted(samples)[count // 2])
        print(f"floor push+ack {size} B: {count} tensors, {size / median:.3f} GB/s at the median")
        print(
            f"CPU per operation: client {client_cpu / count / 1e3:.0f} us, server "
            f"{server_cpu / count / 1e3:.0f} us; wall per operation {wall * 1e6 / count:.0f} us"
        )
    finally:
        server.stop()
    return 0


def main() -> int:
    what, seconds, pidfile = sys.argv[1], float(sys.argv[2]), Path(sys.argv[3])
    env = tuning.apply_policy("tuned")
    if what.startswith("floor-"):
        return floor_push(parse_sizes(what.split("-")[1])[0], seconds, pidfile, env)
    with ServerProcess.start(resolve_fabric("lo"), env=env) as server:
        pidfile.write_text(str(server.pid))
        time.sleep(1.0)
        cpu0 = cpu_ns(os.getpid()), cpu_ns(server.pid)
        threads0 = thread_cpu_ns(os.getpid()), thread_cpu_ns(server.pid)
        t0 = time.monotonic()
        count = 0
        if what in ("unary", "stream"):
            spec = RunSpec(iterations=200_000, warmup=100, max_seconds=seconds, warmup_seconds=1.0)
            result = p2p_latency(server, [1024], LatencyCall(rpc=what, run=spec))
            count = result.sizes[0].count
            p50 = result.sizes[0].summary.p50_ns / 1e3
            print(f"{what} echo 1KiB: {count} round trips, p50 {p50:.1f} us")
        else:
            _, mode, size_text = what.split("-")
            size = parse_sizes(size_text)[0]
            spec = RunSpec(iterations=100_000, warmup=2, max_seconds=seconds, warmup_seconds=2.0)
            result = p2p_bandwidth(server, [size], BandwidthCall(mode=mode, run=spec))
            count = result.sizes[0].count
            bw = result.sizes[0].throughput_p50_Bps / 1e9
            print(f"{what}: {count} tensors, {bw:.3f} GB/s at the median")
        wall = time.monotonic() - t0
        threads1 = thread_cpu_ns(os.getpid()), thread_cpu_ns(server.pid)
        client_cpu = cpu_ns(os.getpid()) - cpu0[0]
        server_cpu = cpu_ns(server.pid) - cpu0[1]
        print(f"loop {wall:.1f} s (warm-up and checks included)")
        print(
            f"CPU per operation: client {client_cpu / count / 1e3:.0f} us, server "
            f"{server_cpu / count / 1e3:.0f} us; wall per operation {wall * 1e6 / count:.0f} us"
        )
        print(f"client threads, us CPU per op: {_per_op(threads0[0], threads1[0], count)}")
        print(f"server threads, us CPU per op: {_per_op(threads0[1], threads1[1], count)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
