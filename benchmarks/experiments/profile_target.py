"""A loop of the plugin's measuring path to profile with py-spy (client and server).

    python benchmarks/experiments/profile_target.py WHAT SECONDS PIDFILE

``WHAT``: ``unary`` / ``stream`` (1 KiB raw echo, the p2p_latency loops) or
``push-raw-4MiB``, ``push-protobuf-64MiB`` ... (the p2p_bandwidth stream push). The plugin's
server is started with the tuned allocator environment; its pid is written to ``PIDFILE`` and
the loop starts one second later, so a profiler can attach to the server first. Every loop is
bounded by ``SECONDS`` and by a count.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pytest_tfgrpc import tuning
from pytest_tfgrpc.bench import RunSpec, p2p_bandwidth, p2p_latency
from pytest_tfgrpc.fabric import resolve_fabric
from pytest_tfgrpc.process import ServerProcess
from pytest_tfgrpc.units import parse_sizes


def main() -> int:
    what, seconds, pidfile = sys.argv[1], float(sys.argv[2]), Path(sys.argv[3])
    env = tuning.apply_policy("tuned")
    with ServerProcess.start(resolve_fabric("lo"), env=env) as server:
        pidfile.write_text(str(server.pid))
        time.sleep(1.0)
        t0 = time.monotonic()
        count = 0
        if what in ("unary", "stream"):
            spec = RunSpec(iterations=200_000, warmup=100, max_seconds=seconds, warmup_seconds=1.0)
            result = p2p_latency(server, [1024], mode="raw", rpc=what, run=spec)
            count = result.sizes[0].count
            p50 = result.sizes[0].summary.p50_ns / 1e3
            print(f"{what} echo 1KiB: {count} round trips, p50 {p50:.1f} us")
        else:
            _, mode, size_text = what.split("-")
            size = parse_sizes(size_text)[0]
            spec = RunSpec(iterations=100_000, warmup=2, max_seconds=seconds, warmup_seconds=2.0)
            result = p2p_bandwidth(server, [size], mode=mode, rpc="stream", run=spec)
            count = result.sizes[0].count
            bw = result.sizes[0].throughput_p50_Bps / 1e9
            print(f"{what}: {count} tensors, {bw:.3f} GB/s at the median")
        print(f"loop {time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
