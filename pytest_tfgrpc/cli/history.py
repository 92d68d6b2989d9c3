"""``tfgrpc-history RUN...``: each figure's trend over a series of runs, with change points.

The runs are JUnit files, directories of them (sorted by name) or ``--tfgrpc-results`` files,
oldest first. Change points come from :mod:`pytest_tfgrpc.stats.changepoints` (ruptures, the
``history`` extra); ``--plot DIR`` writes a PNG per figure (the ``plot`` extra). Exits 0, or 1
when ``--fail-on-change`` is given and the last run starts a new level for the worse, or 2 on
bad input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TextIO

from pytest_tfgrpc.metrics import GATED
from pytest_tfgrpc.report.history import (
    DEFAULT_ALPHA,
    MIN_RUNS,
    HistoryUnavailableError,
    format_trends,
    plot_trends,
    trends,
)
from pytest_tfgrpc.report.junit import BaselineError, load_history
from pytest_tfgrpc.report.tolerance import (
    DEFAULT_METRICS,
    DEFAULT_TOLERANCE,
    ToleranceError,
    parse_tolerances,
)
from pytest_tfgrpc.stats.changepoints import ChangePointsUnavailableError

PROG = "tfgrpc-history"


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run the command; returns the exit status."""
    stdout = out if out is not None else sys.stdout
    stderr = out if out is not None else sys.stderr
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="RUN", help="runs, oldest first")
    parser.add_argument(
        "--metric",
        action="append",
        choices=tuple(GATED),
        help=f"a figure to follow (repeatable; default {', '.join(DEFAULT_METRICS)})",
    )
    parser.add_argument(
        "--alpha",
        type=float,
        default=DEFAULT_ALPHA,
        help="the chance that unchanged runs show a change point (default "
        f"{DEFAULT_ALPHA}, Otava's p-value)",
    )
    parser.add_argument(
        "--min-change",
        action="append",
        metavar="TOLERANCE",
        help="the smallest change that is a change point, either way, as --tfgrpc-max-regression "
        f"reads it ('5%%', 'p99:20%%'; default {DEFAULT_TOLERANCE * 100:g}%%)",
    )
    parser.add_argument("--plot", metavar="DIR", help="write a PNG per figure into DIR")
    parser.add_argument(
        "--fail-on-change",
        action="store_true",
        help="exit 1 when the last run starts a new level for the worse",
    )
    args = parser.parse_args(argv)
    try:
        min_changes = parse_tolerances(args.min_change or [])
    except ToleranceError as error:
        parser.error(f"--min-change: {error}")
    try:
        runs = load_history(args.runs)
        found = trends(
            runs, args.metric or DEFAULT_METRICS, alpha=args.alpha, min_changes=min_changes
        )
        for line in format_trends(found):
            print(line, file=stdout)
        if args.plot:
            for path in plot_trends(found, args.plot):
                print(f"plot {path}", file=stdout)
    except (
        BaselineError,
        ChangePointsUnavailableError,
        HistoryUnavailableError,
        ValueError,
    ) as error:
        print(f"{PROG}: error: {error}", file=stderr)
        return 2
    last = len(runs) - 1
    worse = [
        t
        for t in found
        for point in t.change_points
        if point.index == last
        and (point.change < 0 if GATED[t.metric].higher_is_better else point.change > 0)
    ]
    print(
        f"{PROG}: {len(runs)} runs, {len(found)} figures, "
        f"{sum(len(t.change_points) for t in found)} change points",
        file=stdout,
    )
    if len(runs) < MIN_RUNS:
        print(
            f"{PROG}: {len(runs)} runs are too short a history: a change point needs at least "
            f"{MIN_RUNS} runs of a figure",
            file=stderr,
        )
    if args.fail_on_change and worse:
        print(f"{PROG}: the last run starts a worse level for {len(worse)} figures", file=stdout)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
