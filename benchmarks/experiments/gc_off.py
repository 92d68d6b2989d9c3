"""The 1 KiB echo loops with the client's cyclic GC on (as now) and off during timing.

    python benchmarks/experiments/gc_off.py [--rounds 15]

py-spy showed ``gc_collect_main`` among the busy frames of the client and the server. This
times ``p2p_latency`` (raw, unary and stream) with ``gc.disable()`` around the call against
the stock call, alternating, on one server: what ``gc.disable()`` inside ``measure`` would buy.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
from collections.abc import Sequence

import numpy as np

from pytest_tfgrpc.bench import LatencyCall, RunSpec, p2p_latency
from pytest_tfgrpc.roles.processes import ServerProcess
from pytest_tfgrpc.tuning import allocator as tuning
from pytest_tfgrpc.wire.fabric import resolve_fabric

RUN = RunSpec(iterations=400, warmup=30, max_seconds=1.0, warmup_seconds=0.5)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args(argv)
    env = tuning.apply_policy("tuned")
    got: dict[tuple[str, bool], list[float]] = {}
    load0 = os.getloadavg()
    with ServerProcess.start(resolve_fabric("lo"), env=env) as server:
        for _ in range(args.rounds):
            for rpc in ("unary", "stream"):
                for off in (False, True):
                    if off:
                        gc.disable()
                    try:
                        result = p2p_latency(server, [1024], LatencyCall(rpc=rpc, run=RUN))
                    finally:
                        gc.enable()
                    got.setdefault((rpc, off), []).append(
                        float(np.median(result.sizes[0].samples_ns))
                    )
    print(f"{args.rounds} rounds; load average {load0} -> {os.getloadavg()}")
    for rpc in ("unary", "stream"):
        gc_on, gc_off = got[rpc, False], got[rpc, True]
        paired = statistics.median(b / a for a, b in zip(gc_on, gc_off, strict=True))
        print(
            f"{rpc:<6} gc on {statistics.median(gc_on) / 1e3:.1f} us, gc off "
            f"{statistics.median(gc_off) / 1e3:.1f} us, off/on paired median {paired:.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
