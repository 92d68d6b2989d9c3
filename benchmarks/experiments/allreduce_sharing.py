"""Where a shared machine's all-reduce time goes: per all-reduce, the slowest rank's wall time,
each rank's CPU time (its own clock, what the workers report) and its run-queue wait (the
kernel's ``/proc/PID/task/*/schedstat``: time runnable but not running), with 2 and 4 ranks
of one cluster on this machine.

    python benchmarks/experiments/allreduce_sharing.py [--sizes 4KiB,1MiB] [--iterations 30]

Per row: ranks, algorithm, size, the median all-reduce (ms), a rank's CPU per all-reduce (ms,
mean over ranks), the cores busy = all ranks' CPU / wall, a rank's run-queue wait per
all-reduce (ms), and the wall time left once CPU / cores and the wait are taken away (idle:
every rank waiting on a peer's piece). The schedstat deltas cover the whole job (warm-up and
setup too), so they are scaled by the measured iterations' share of the job's CPU.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

from pytest_tfgrpc.bench.fit import available_cpus
from pytest_tfgrpc.model.placement import Topology
from pytest_tfgrpc.ps.jobs import samples as jobs_samples
from pytest_tfgrpc.ps.ps_cluster import PSCluster
from pytest_tfgrpc.units import parse_sizes, size_label
from pytest_tfgrpc.wire.fabric import resolve_fabric


def schedstat(pid: int) -> tuple[int, int, int]:
    """(ns on CPU, ns runnable waiting, timeslices) summed over a process's threads."""
    total = [0, 0, 0]
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "schedstat").read_text().split()
        except OSError:
            continue
        for i in range(3):
            total[i] += int(fields[i])
    return total[0], total[1], total[2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="4KiB,1MiB")
    parser.add_argument("--algorithms", default="ring,halving_doubling")
    parser.add_argument("--iterations", type=int, default=30)
    args = parser.parse_args()
    cores = available_cpus()
    print(f"cores {cores}, loadavg {os.getloadavg()[0]:.2f}")
    print(
        f"{'ranks':>5} {'algorithm':<17} {'size':>6} {'wall':>8} {'cpu/rank':>8} {'busy':>5} "
        f"{'wait/rank':>9} {'idle':>7} {'threads':>7}"
    )
    with PSCluster(resolve_fabric("lo"), Topology(ps=1, workers=4)) as cluster:
        for ranks in (2, 4):
            pids = [w.pid for w in cluster.workers[:ranks]]
            for algorithm in args.algorithms.split(","):
                for nbytes in (int(s) for s in parse_sizes(args.sizes)):
                    before = [schedstat(p) for p in pids]
                    replies = cluster.allreduce(
                        nbytes,
                        algorithm=algorithm,
                        warmup=3,
                        iterations=args.iterations,
                        seconds=10.0,
                        check=False,
                        ranks=ranks,
                    )
                    after = [schedstat(p) for p in pids]
                    threads = len(list(Path(f"/proc/{pids[0]}/task").iterdir()))
                    per = np.max(np.vstack([jobs_samples(r.samples_ns) for r in replies]), axis=0)
                    count = len(per)
                    wall = float(np.median(per)) / 1e6
                    cpu = [(r.cpu_user_ns + r.cpu_system_ns) / count / 1e6 for r in replies]
                    waits = []
                    for r, b, a in zip(replies, before, after, strict=True):
                        run_ns, wait_ns = a[0] - b[0], a[1] - b[1]
                        share = (r.cpu_user_ns + r.cpu_system_ns) / run_ns if run_ns else 0.0
                        waits.append(wait_ns * share / count / 1e6)
                    mean_cpu = float(np.mean(cpu))
                    busy = ranks * mean_cpu / wall
                    idle = wall - ranks * mean_cpu / min(cores, ranks)
                    print(
                        f"{ranks:>5} {algorithm:<17} {size_label(nbytes):>6} {wall:>6.2f}ms "
                        f"{mean_cpu:>6.2f}ms {busy:>5.2f} {float(np.mean(waits)):>7.2f}ms "
                        f"{idle:>5.2f}ms {threads:>7}"
                    )
    print(f"loadavg {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
