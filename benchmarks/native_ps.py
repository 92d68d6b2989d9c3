"""PS throughput with native (C++) workers against Python workers, as ratios inside one run.

    python benchmarks/native_ps.py [--rounds N] [--seconds S] [--ps P] [--workers W]

Both clusters run the plugin's Python PS tasks on loopback; only the workers differ
(``ps/worker.py`` against ``tfgrpc-native-worker``). Each round measures both engines at
1 KiB and 4 MiB, raw mode, one after the other, alternating which goes first; a figure is the
median over rounds of the aggregate RPC rate (calls/s over every worker and PS). The machine's
load (``os.getloadavg``) is printed before and after. Nothing is asserted: on a shared 2-core
machine the Python PS tasks, not the workers, may be what bounds the rate. Needs the native
engine built (``tfgrpc-build-native``).
"""

from __future__ import annotations

import argparse
import os
import statistics

from pytest_tfgrpc.bench.ps import ps_throughput
from pytest_tfgrpc.bench.timing import RunSpec
from pytest_tfgrpc.model.placement import Topology
from pytest_tfgrpc.ps.ps_cluster import PSCluster
from pytest_tfgrpc.wire.fabric import resolve_fabric

SIZES = {"1KiB": 1 << 10, "4MiB": 4 << 20}
ENGINES = ("grpcio", "native")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0, help="measured seconds per point")
    parser.add_argument("--ps", type=int, default=1)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    fabric = resolve_fabric("lo")
    topology = Topology(ps=args.ps, workers=args.workers)
    run = RunSpec(iterations=100_000, warmup=20, max_seconds=args.seconds, warmup_seconds=1.0)
    print(f"load before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    rates: dict[tuple[str, str], list[float]] = {(e, s): [] for e in ENGINES for s in SIZES}
    clusters = {e: PSCluster(fabric, topology, workers_engine=e) for e in ENGINES}
    try:
        for round_ in range(args.rounds):
            order = ENGINES if round_ % 2 == 0 else ENGINES[::-1]
            for engine in order:
                result = ps_throughput(clusters[engine], list(SIZES.values()), run=run)
                for key, point in zip(SIZES, result.sizes, strict=True):
                    assert point.rate_per_s is not None
                    rates[(engine, key)].append(point.rate_per_s)
    finally:
        for cluster in clusters.values():
            cluster.stop()
    print(f"load after:  {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{args.ps} PS x {args.workers} workers, raw mode, {args.rounds} rounds (median)")
    for key in SIZES:
        python = statistics.median(rates[("grpcio", key)])
        cpp = statistics.median(rates[("native", key)])
        print(
            f"{key:>5}: python workers {python:9.1f} rpc/s, native workers {cpp:9.1f} rpc/s, "
            f"native/python {cpp / python:.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
