"""PS throughput of every pairing of PS-task and worker engines, as ratios inside one run.

    python benchmarks/native_ps.py [--rounds N] [--seconds S] [--ps P] [--workers W]

Four clusters on loopback: Python PS tasks with Python workers (the grpcio engine), native PS
tasks (``tfgrpc-native-server`` with the job token) with native workers
(``tfgrpc-native-worker``: the native engine), and the two mixed pairs. Each round measures
every pairing at 1 KiB and 4 MiB, raw mode, one after the other, rotating which goes first; a
figure is the median over rounds of the aggregate RPC rate (calls/s over every worker and PS),
with the CPU time the PS tasks and the workers spent per GB moved (median over rounds). The
machine's load (``os.getloadavg``) is printed before and after: figures taken while other work
runs are labelled by it. Nothing is asserted. Needs the native engine built
(``tfgrpc-build-native``).
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
#: (PS tasks' engine, workers' engine)
PAIRS = (("grpcio", "grpcio"), ("native", "native"), ("native", "grpcio"), ("grpcio", "native"))


def _name(pair: tuple[str, str]) -> str:
    return f"ps={pair[0]:<6} workers={pair[1]:<6}"


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
    rates: dict[tuple[tuple[str, str], str], list[float]] = {
        (p, s): [] for p in PAIRS for s in SIZES
    }
    ps_cpu: dict[tuple[tuple[str, str], str], list[float]] = {k: [] for k in rates}
    worker_cpu: dict[tuple[tuple[str, str], str], list[float]] = {k: [] for k in rates}
    clusters: dict[tuple[str, str], PSCluster] = {}
    try:
        for pair in PAIRS:
            clusters[pair] = PSCluster(fabric, topology, ps_engine=pair[0], workers_engine=pair[1])
        for round_ in range(args.rounds):
            shift = round_ % len(PAIRS)
            for pair in PAIRS[shift:] + PAIRS[:shift]:
                result = ps_throughput(clusters[pair], list(SIZES.values()), run=run)
                for key, point in zip(SIZES, result.sizes, strict=True):
                    assert point.rate_per_s is not None
                    rates[(pair, key)].append(point.rate_per_s)
                    moved_gb = sum(load.bytes_in for load in point.per_ps) / 1e9
                    if moved_gb > 0:
                        ps_ns = sum(load.cpu.total_ns for load in point.per_ps)
                        ps_cpu[(pair, key)].append(ps_ns / 1e9 / moved_gb)
                        worker_cpu[(pair, key)].append(
                            point.cpu["workers"].total_ns / 1e9 / moved_gb
                        )
    finally:
        for cluster in clusters.values():
            cluster.stop()
    print(f"load after:  {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{args.ps} PS x {args.workers} workers, raw mode, {args.rounds} rounds (median)")
    for key in SIZES:
        base = statistics.median(rates[(PAIRS[0], key)])
        for pair in PAIRS:
            rate = statistics.median(rates[(pair, key)])
            print(
                f"{key:>5} {_name(pair)}: {rate:9.1f} rpc/s  {rate / base:5.2f}x python/python"
                f"  CPU s per GB: PS {statistics.median(ps_cpu[(pair, key)]):7.2f}"
                f"  workers {statistics.median(worker_cpu[(pair, key)]):7.2f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
