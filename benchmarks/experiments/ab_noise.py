"""Where the per-pair noise of ``tfgrpc-ab`` comes from, beside a CPU-bound neighbour.

    python benchmarks/experiments/ab_noise.py [--cycles 8] [--json out.json]

Runs A/A pairs (two runs of ``benchmarks/ab_suite`` back to back, nothing changed) of several
run designs, the designs interleaved cycle by cycle so that the machine's drift hits them
alike, while one CPU-bound Python loop runs beside them (as in ``ab_calibration.py``). For
each run it keeps every round's p50, the wall time, and where the neighbour ran (its CPU,
sampled every 5 ms from ``/proc/PID/stat``). It prints, per design and per-run statistic,
the standard deviation of the pairs' log ratios (what a paired t sees: 5 pairs catch 1.2x in
80 % of trials with a spread of about 13 %) and the runs' wall time.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from ab_calibration import BIN, SUITE, Neighbour, uptime  # noqa: E402

from pytest_tfgrpc.report.junit import load_baseline  # noqa: E402

DESIGNS: dict[str, tuple[str, ...]] = {
    "300 it": ("--tfgrpc-iterations=300", "--tfgrpc-warmup=30", "--tfgrpc-max-seconds=3"),
    "1000 it": ("--tfgrpc-iterations=1000", "--tfgrpc-warmup=100", "--tfgrpc-max-seconds=10"),
    "2000 it": ("--tfgrpc-iterations=2000", "--tfgrpc-warmup=100", "--tfgrpc-max-seconds=10"),
    "3000 it": ("--tfgrpc-iterations=3000", "--tfgrpc-warmup=30", "--tfgrpc-max-seconds=20"),
    "300 it off": (
        "--tfgrpc-iterations=300",
        "--tfgrpc-warmup=30",
        "--tfgrpc-max-seconds=3",
        "--tfgrpc-cpus=off",
    ),
    "3000 it off": (
        "--tfgrpc-iterations=3000",
        "--tfgrpc-warmup=30",
        "--tfgrpc-max-seconds=20",
        "--tfgrpc-cpus=off",
    ),
}

STATISTICS: dict[str, Callable[[Sequence[float]], float]] = {
    "median of rounds": lambda r: float(np.median(r)),
    "mean of rounds": lambda r: float(np.mean(r)),
    "min of rounds": lambda r: float(np.min(r)),
    "25th pct of rounds": lambda r: float(np.percentile(r, 25)),
}


def watch(pid: int, stop: threading.Event, seen: list[int]) -> None:
    stat = Path(f"/proc/{pid}/stat")
    while not stop.wait(0.005):
        try:
            seen.append(int(stat.read_text().rsplit(")", 1)[1].split()[36]))
        except (OSError, IndexError, ValueError):
            return


@dataclass(frozen=True)
class Run:
    wall_s: float
    rounds_p50: list[float]
    neighbour_on_cpu0: float


def one_run(options: Sequence[str], xml: Path, neighbour: int) -> Run:
    argv = [str(BIN / "pytest"), "-p", "no:cacheprovider", "-q", str(SUITE), *options]
    stop, seen = threading.Event(), list[int]()
    sampler = threading.Thread(target=watch, args=(neighbour, stop, seen))
    sampler.start()
    started = time.monotonic()
    subprocess.run([*argv, f"--junitxml={xml}"], capture_output=True, timeout=120, check=False)
    wall = time.monotonic() - started
    stop.set()
    sampler.join()
    (point,) = load_baseline(xml).measurements.values()
    on_cpu0 = seen.count(0) / len(seen) if seen else math.nan
    return Run(wall, list(point.rounds["p50"]), on_cpu0)


def describe(run: Run) -> str:
    return (
        f"med {np.median(run.rounds_p50) / 1e3:6.0f} us min {np.min(run.rounds_p50) / 1e3:6.0f} "
        f"nb@cpu0 {run.neighbour_on_cpu0:.2f} {run.wall_s:.1f} s"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=8)
    parser.add_argument("--only", default="", help="comma-separated design names")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    designs = {k: v for k, v in DESIGNS.items() if not args.only or k in args.only.split(",")}
    found: dict[str, list[tuple[Run, Run]]] = {d: [] for d in designs}
    neighbour = Neighbour()
    print(f"# load before (neighbour just started): {uptime()}", flush=True)
    try:
        with tempfile.TemporaryDirectory(prefix="tfgrpc-ab-noise-") as tmp:
            for cycle in range(args.cycles):
                for name, options in designs.items():
                    a, b = (
                        one_run(options, Path(tmp) / f"{cycle}-{side}.xml", neighbour.proc.pid)
                        for side in "ab"
                    )
                    found[name].append((a, b))
                    print(f"{cycle} {name:<12} {describe(a)} | {describe(b)}", flush=True)
    finally:
        neighbour.stop()
        print(f"# load after (neighbour stopped): {uptime()}", flush=True)
    for name, pairs in found.items():
        walls = [r.wall_s for p in pairs for r in p]
        print(f"{name}: {len(pairs)} A/A pairs, run wall median {statistics.median(walls):.1f} s")
        for stat, f in STATISTICS.items():
            logs = [math.log(f(b.rounds_p50) / f(a.rounds_p50)) for a, b in pairs]
            sd = statistics.stdev(logs) if len(logs) > 1 else math.nan
            print(f"  {stat:<20} sd of pair log ratios {sd:6.1%}")
    if args.json:
        args.json.write_text(
            json.dumps({k: [[asdict(r) for r in p] for p in v] for k, v in found.items()})
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
