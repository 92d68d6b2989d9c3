"""A rank's CPU per ring step at the same piece size with 2 ranks (the model's two-rank sweep)
and with 4 (the run), on one cluster of this machine: is the large-size ring's miss its bytes'
CPU (more per byte with 4 ranks on the cores than with 2), or cores left idle?

    python benchmarks/experiments/allreduce_rank_cpu.py [--pieces 256KiB,1MiB] [--rounds 6]

Each round runs, for each piece size, the two-rank ring of 2 pieces (as the sweep: a core each
when the machine has two), the same with both ranks pinned to one core (as ranks sharing cores
run: interleaved on it), the four-rank ring of 4 pieces (check off, 3 warm-up, at most 15
all-reduces within 2 s), then the four-rank ring with check on (as ``allreduce_model.py`` runs
it: each rank also holds the expected sum and verifies every result), alternating, so all meet
the same load. Per row: a rank's CPU per step less its input's copy and, with check, the
verification (the workers' own clocks; both timed here as the model times them,
``measure_whole_buffer``: alone, on warm caches), the slowest rank's median all-reduce, and the
cores the ranks kept busy (all ranks' CPU over the wall time); the medians over rounds, and the
ratio of the CPU per step to the two-rank ring's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
from pathlib import Path

import numpy as np

from pytest_tfgrpc.bench.allreduce import measure_whole_buffer
from pytest_tfgrpc.model.placement import Topology
from pytest_tfgrpc.ps.jobs import samples as jobs_samples
from pytest_tfgrpc.ps.ps_cluster import PSCluster
from pytest_tfgrpc.units import parse_sizes, size_label
from pytest_tfgrpc.wire.fabric import resolve_fabric

#: (label, ranks, check, the two ranks on one core): the model's sweep first, the ratio's base.
CONFIGS = (
    ("2 ranks", 2, False, False),
    ("2 ranks, one core", 2, False, True),
    ("4 ranks", 4, False, False),
    ("4 ranks, check", 4, True, False),
)


def pin(pids: list[int], cpus: set[int]) -> None:
    """Every thread of each process in ``pids`` onto ``cpus`` (threads started later inherit)."""
    for pid in pids:
        for thread in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(int(thread.name), cpus)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pieces", default="256KiB,1MiB")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    pieces = [int(s) for s in parse_sizes(args.pieces)]
    allowed = os.sched_getaffinity(0)
    print(f"loadavg {os.getloadavg()[0]:.2f} at the start, CPUs {sorted(allowed)}")
    found: dict[tuple[int, str], list[tuple[float, float, float]]] = {}
    with PSCluster(resolve_fabric("lo"), Topology(ps=1, workers=4)) as cluster:
        pair = [w.pid for w in cluster.workers[:2]]
        for _ in range(args.rounds):
            for piece in pieces:
                for label, ranks, check, one_core in CONFIGS:
                    if one_core and len(allowed) < 2:
                        continue
                    nbytes = ranks * piece
                    pin(pair, {min(allowed)} if one_core else allowed)
                    try:
                        replies = cluster.allreduce(
                            nbytes,
                            algorithm="ring",
                            warmup=3,
                            iterations=15,
                            seconds=2.0,
                            check=check,
                            ranks=ranks,
                        )
                    finally:
                        pin(pair, allowed)
                    count = len(replies[0].samples_ns)
                    walls = np.max(np.vstack([jobs_samples(r.samples_ns) for r in replies]), axis=0)
                    wall = float(np.median(walls)) / 1e9
                    cpu = statistics.mean(
                        (r.cpu_user_ns + r.cpu_system_ns) / 1e9 / count for r in replies
                    )
                    copy = measure_whole_buffer(nbytes, check=check) * nbytes
                    steps = 2 * (ranks - 1)
                    found.setdefault((piece, label), []).append(
                        ((cpu - copy) / steps, wall, ranks * cpu / wall)
                    )
    print(f"loadavg {os.getloadavg()[0]:.2f} at the end; medians over {args.rounds} rounds")
    print(f"{'piece':>6} {'ranks':<18} {'cpu/step':>9} {'wall':>9} {'busy':>5} {'cpu x':>6}")
    for piece in pieces:
        base = statistics.median(c for c, _, _ in found[piece, CONFIGS[0][0]])
        for label, *_ in CONFIGS:
            rows = found.get((piece, label), [])
            if not rows:
                continue
            cpu = statistics.median(c for c, _, _ in rows)
            print(
                f"{size_label(piece):>6} {label:<18} {cpu * 1e3:>7.3f}ms "
                f"{statistics.median(w for _, w, _ in rows) * 1e3:>7.2f}ms "
                f"{statistics.median(b for _, _, b in rows):>5.2f} {cpu / base:>6.2f}"
            )


if __name__ == "__main__":
    main()
