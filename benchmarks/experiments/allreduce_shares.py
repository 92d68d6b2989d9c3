"""Does measuring one size's all-reduces in several jobs change their median? One job of 20
against three of 6, 7 and 7 (each job its own server, channels and 3 warm-up all-reduces), as a
tried version of ``allreduce()`` ran them to put a round of the model's probes between shares.

    python benchmarks/experiments/allreduce_shares.py [--pairs 6]

One cluster of 4 local workers, ring, check on; per size (64 KiB, 1 MiB, 4 MiB) ``--pairs``
alternating pairs. Per size: the median over the pairs of each run's median, the median of
the pairs' three-jobs over one-job ratios, and the one job's first two all-reduces against the
rest (a warm-up effect would show there).
"""

from __future__ import annotations

import argparse
import os
import statistics

import numpy as np
import numpy.typing as npt

from pytest_tfgrpc.model.placement import Topology
from pytest_tfgrpc.ps.jobs import samples as jobs_samples
from pytest_tfgrpc.ps.ps_cluster import PSCluster
from pytest_tfgrpc.wire.fabric import resolve_fabric


def run(cluster: PSCluster, nbytes: int, jobs: list[int]) -> npt.NDArray[np.float64]:
    """All-reduces of ``nbytes`` in one job per entry of ``jobs`` (its count), in ms."""
    found = []
    for iterations in jobs:
        replies = cluster.allreduce(
            nbytes,
            algorithm="ring",
            warmup=3,
            iterations=iterations,
            seconds=10 / len(jobs),
            check=True,
        )
        found.append(np.max(np.vstack([jobs_samples(r.samples_ns) for r in replies]), axis=0))
    return np.concatenate(found).astype(np.float64) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=6)
    args = parser.parse_args()
    with PSCluster(resolve_fabric("lo"), Topology(ps=1, workers=4)) as cluster:
        for nbytes in (64 << 10, 1 << 20, 4 << 20):
            one, three, ratios, firsts, rest = [], [], [], [], []
            for _ in range(args.pairs):
                a = run(cluster, nbytes, [20])
                b = run(cluster, nbytes, [6, 7, 7])
                one.append(float(np.median(a)))
                three.append(float(np.median(b)))
                ratios.append(three[-1] / one[-1])
                firsts.append(float(np.median(a[:2])))
                rest.append(float(np.median(a[2:])))
            print(
                f"{nbytes >> 10}KiB: one job {statistics.median(one):.2f} ms, three jobs "
                f"{statistics.median(three):.2f} ms, ratio {statistics.median(ratios):.3f}; "
                f"one job's first 2 {statistics.median(firsts):.2f} ms, the rest "
                f"{statistics.median(rest):.2f} ms; loadavg {os.getloadavg()[0]:.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
