"""A/A pair spread of tfgrpc-ab's two interleavings beside a CPU-bound neighbour.

``--interleave runs`` runs a pair's sides one after the other (seconds apart: under a
neighbour the 1 KiB echo's p50 sits in modes that last seconds, so the two sides land in
different ones); ``--interleave rounds`` runs them at once, their measured rounds in lockstep.
This script runs ``--pairs`` A/A pairs of each, alternating the two kinds in time (so drift
over the script hits both alike), with ab_calibration.py's suite and run settings, and
reports the standard deviation of each kind's pair log ratios (the paired test's noise: a
1.2x slowdown caught in 16 of 20 trials of 5 pairs needs about 13%).

    benchmarks/ab_lockstep.py --pairs 8   # writes benchmarks/results/ab_lockstep.txt
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_calibration import (
    HERE,
    RUN_TIMEOUT_S,
    Neighbour,
    run_value,
    side,
    uptime,
)

from pytest_tfgrpc.cli.ab import DEFAULT_TURN_S, run_lockstep, run_side


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=8, help="A/A pairs of each kind (8)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "ab_lockstep.txt")
    args = parser.parse_args(argv)
    command = side()
    logs: dict[str, list[float]] = {"runs": [], "rounds": []}
    neighbour = Neighbour()
    with open(args.out, "w") as out, tempfile.TemporaryDirectory(prefix="tfgrpc-ab-ls-") as tmp:
        work = Path(tmp)

        def say(line: str) -> None:
            print(line, file=out, flush=True)
            print(line, flush=True)

        try:
            say(f"# benchmarks/ab_lockstep.py {' '.join(argv or sys.argv[1:])}".rstrip())
            say(f"# load before (neighbour pid {neighbour.proc.pid} just started): {uptime()}")
            say(f"# side A = side B = {' '.join(command)}")
            for pair in range(1, args.pairs + 1):
                kinds = ("runs", "rounds") if pair % 2 else ("rounds", "runs")
                for kind in kinds:
                    started = time.monotonic()
                    stem = work / f"{kind}-{pair:02d}"
                    if kind == "runs":
                        a, _ = run_side(
                            command,
                            stem.with_suffix(".a.xml"),
                            stem.with_suffix(".a.log"),
                            RUN_TIMEOUT_S,
                        )
                        b, _ = run_side(
                            command,
                            stem.with_suffix(".b.xml"),
                            stem.with_suffix(".b.log"),
                            RUN_TIMEOUT_S,
                        )
                    else:
                        stems = {
                            "A": work / f"{kind}-{pair:02d}-a",
                            "B": work / f"{kind}-{pair:02d}-b",
                        }
                        answers, _ = run_lockstep(
                            {"A": command, "B": command}, stems, RUN_TIMEOUT_S, DEFAULT_TURN_S
                        )
                        a, b = answers["A"][0], answers["B"][0]
                    va, vb = run_value(a), run_value(b)
                    took = time.monotonic() - started
                    if va and vb:
                        logs[kind].append(math.log(vb / va))
                        say(
                            f"pair {pair} {kind:6s}: A {va / 1e3:.1f} us, B {vb / 1e3:.1f} us, "
                            f"B/A {vb / va:.3f}; {took:.1f} s"
                        )
                    else:
                        say(f"pair {pair} {kind:6s}: broken ({took:.1f} s)")
            for kind, values in logs.items():
                if len(values) > 1:
                    say(
                        f"# --interleave {kind}: sd of the A/A pairs' log ratios "
                        f"{statistics.stdev(values):.1%}, mean {statistics.mean(values):+.1%} "
                        f"({len(values)} pairs)"
                    )
        finally:
            neighbour.stop()
            say(f"# load after (neighbour stopped): {uptime()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
