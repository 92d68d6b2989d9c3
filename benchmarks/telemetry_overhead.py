"""The cost of transport telemetry per size: reads between timed loops, against the figures.

    python benchmarks/telemetry_overhead.py [--rounds 5] [--json out.json]

A local tensor server on ``lo``; per round, the 1 KiB echo (``p2p_latency``, unary, the
default run: 1000 iterations in each of 10 interleaved rounds) and the 64 MiB stream push
(``p2p_bandwidth``, 50 iterations in 10 rounds) are measured twice, in turn: with telemetry
(the plugin as it is) and without (a probe that reads nothing), the order alternating per
round. For each size it reports:

- the wall time telemetry reads took (two readings per window: one ``sock_diag`` dump per
  address family, the fabric's link and qdisc, ``/proc`` files), per size, against the size's
  measured time (the sum of its timed loops' wall time): the target is under 1%;
- the p50 (echo) and throughput (push) with and without telemetry, median over rounds: reads
  happen outside the timed loops, so the figures should not move beyond the round-to-round
  spread, which is printed beside them.

It prints whether the machine looked loaded (the 1-minute load average against the CPUs this
process may use) and labels the figures "under load" when it did: such figures are no evidence
for the target. Nothing here asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import pytest_tfgrpc.bench.p2p as p2p
from pytest_tfgrpc.bench import telemetry
from pytest_tfgrpc.bench.p2p import BandwidthCall, LatencyCall, p2p_bandwidth, p2p_latency
from pytest_tfgrpc.roles.processes import ServerProcess
from pytest_tfgrpc.wire.fabric import resolve_fabric

TARGET_SHARE = 0.01


@dataclass(frozen=True)
class Arm:
    """One size measured once, with or without telemetry."""

    size: str
    telemetry: bool
    figure: str
    value: float
    measured_s: float
    read_s: float
    reads: int


class _NoProbe(telemetry.TransportProbe):
    """A probe that reads nothing: the run as it was before telemetry."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.windows = []
        self.errors = []
        self.cpu_wait = {}

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def transport(self) -> None:
        return None

    def close(self) -> None: ...


@contextmanager
def timed_reads(enabled: bool) -> Iterator[list[float]]:
    """Patch the P2P loop's probe: timed (enabled) or a no-op one; yields each read's time."""
    spent: list[float] = []
    original = p2p.probe_for
    if not enabled:
        p2p.probe_for = lambda *a, **k: _NoProbe()  # type: ignore[assignment]
    else:

        def made(*args: Any, **kwargs: Any) -> telemetry.TransportProbe:
            probe = original(*args, **kwargs)
            for name in ("start", "stop"):
                inner = getattr(probe, name)

                def wrapped(inner: Any = inner) -> None:
                    began = time.perf_counter()
                    inner()
                    spent.append(time.perf_counter() - began)

                setattr(probe, name, wrapped)
            return probe

        p2p.probe_for = made  # type: ignore[assignment]
    try:
        yield spent
    finally:
        p2p.probe_for = original


def one(server: ServerProcess, size: str, enabled: bool) -> Arm:
    with timed_reads(enabled) as spent:
        if size == "1KiB":
            result = p2p_latency(server, [1024], LatencyCall())
            figure, value = "p50_us", result.sizes[0].summary.p50_ns / 1e3
        else:
            result = p2p_bandwidth(server, [64 * 2**20], BandwidthCall())
            figure, value = "throughput_MBps", result.sizes[0].throughput_Bps / 1e6
    point = result.sizes[0]
    return Arm(size, enabled, figure, value, point.elapsed_ns / 1e9, sum(spent), len(spent))


def loaded() -> tuple[bool, str]:
    cpus = len(os.sched_getaffinity(0))
    load = os.getloadavg()[0]
    return load > 0.5 * cpus, f"load average {load:.2f} on {cpus} CPUs"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="write every arm's figures here")
    args = parser.parse_args(argv)
    busy, load_text = loaded()
    arms: list[Arm] = []
    with ServerProcess.start(resolve_fabric("lo")) as server:
        for r in range(args.rounds):
            for size in ("1KiB", "64MiB"):
                order = (True, False) if r % 2 == 0 else (False, True)
                for enabled in order:
                    arms.append(one(server, size, enabled))
                    print(f"round {r + 1}: {arms[-1]}", file=sys.stderr)
    busy = busy or loaded()[0]
    label = f" (UNDER LOAD: {load_text})" if busy else f" ({load_text})"
    print(f"telemetry overhead per size, median of {args.rounds} rounds{label}")
    for size in ("1KiB", "64MiB"):
        on = [a for a in arms if a.size == size and a.telemetry]
        off = [a for a in arms if a.size == size and not a.telemetry]
        share = statistics.median(a.read_s / a.measured_s for a in on)
        read_ms = statistics.median(a.read_s for a in on) * 1e3
        reads = on[0].reads
        with_, without = (statistics.median(a.value for a in arms_) for arms_ in (on, off))
        spread = statistics.pstdev(a.value for a in off) / without if len(off) > 1 else 0.0
        verdict = "meets" if share < TARGET_SHARE else "misses"
        print(
            f"{size}: {reads} reads, {read_ms:.2f} ms per size = {share:.3%} of the measured "
            f"time ({verdict} the {TARGET_SHARE:.0%} target); {on[0].figure} with "
            f"{with_:.4g}, without {without:.4g} ({with_ / without - 1:+.1%}; rounds spread "
            f"{spread:.1%})"
        )
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"load": load_text, "under_load": busy, "arms": [asdict(a) for a in arms]},
                      out, indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
