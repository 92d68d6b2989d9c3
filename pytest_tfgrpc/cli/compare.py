"""``tfgrpc-compare OLD... NEW.xml``: the baseline gate outside pytest, for CI.

``OLD`` may be one run's JUnit XML or several earlier runs (files, directories of JUnit files,
results files), oldest first: with >= 3 the gate knows the spread between runs.

Prints the comparison table (see :func:`pytest_tfgrpc.report.compare.format_comparison`) and exits
0 when nothing regressed, 1 on a regression (or an inconclusive verdict or a setup mismatch,
when ``--inconclusive fail`` or ``--mismatch fail`` says so), and 2 on bad input: a missing,
corrupt or figureless file, or a bad option.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TextIO

from pytest_tfgrpc.cli.arguments import bounded
from pytest_tfgrpc.report.compare import (
    Comparison,
    compare_runs,
    format_comparison,
    short_history_warning,
)
from pytest_tfgrpc.report.junit import BaselineError, load_baseline, load_history
from pytest_tfgrpc.report.record import Outcome
from pytest_tfgrpc.report.tolerance import DEFAULT_TOLERANCE, ToleranceError, parse_tolerances
from pytest_tfgrpc.stats.significance import DEFAULT_ALPHA, DEFAULT_RESAMPLES, MAX_RESAMPLES

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_OK",
    "EXIT_REGRESSION",
    "add_gate_options",
    "gate_failures",
    "main",
]

EXIT_OK = 0
EXIT_REGRESSION = 1
EXIT_BAD_INPUT = 2

PROG = "tfgrpc-compare"


def gate_failures(
    comparison: Comparison, *, missing: str, inconclusive: str, mismatch: str
) -> list[str]:
    """Why a comparison fails the command, one phrase each (empty: it passes): a regression,
    an invalid figure, nothing compared, and what the policies (``fail`` or not) make fail."""
    failures = []
    if comparison.regressions:
        failures.append(f"{len(comparison.regressions)} regressed")
    invalid = comparison.with_outcome(Outcome.INVALID)
    if invalid:
        failures.append(f"{len(invalid)} invalid (zero, negative, NaN or infinite)")
    if not comparison.verdicts:
        failures.append("nothing compared: no figure of the baseline matches the current run")
    if missing == "fail" and comparison.missing:
        failures.append(f"{len(comparison.missing)} missing (--missing fail)")
    if inconclusive == "fail" and comparison.inconclusive:
        failures.append(f"{len(comparison.inconclusive)} inconclusive (--inconclusive fail)")
    if mismatch == "fail" and comparison.mismatches:
        failures.append(f"{len(comparison.mismatches)} setup mismatched (--mismatch fail)")
    return failures


def add_gate_options(parser: argparse.ArgumentParser) -> None:
    """The options that say how figures are judged, shared with ``tfgrpc-ab``."""
    parser.add_argument(
        "--missing",
        choices=("fail", "warn"),
        default="fail",
        help="whether a baseline figure the current run lacks fails (default: fail)",
    )
    parser.add_argument(
        "--max-regression",
        metavar="[METRIC:]PCT",
        action="append",
        default=[],
        help=(
            "tolerated change for the worse, relative to the baseline: '10%%' for every metric, "
            "'p99:10%%' or 'throughput:5%%' for one (repeatable, or comma-separated); "
            f"default {DEFAULT_TOLERANCE * 100:g}%%"
        ),
    )
    parser.add_argument(
        "--alpha",
        type=bounded(float, lambda a: 0.0 < a < 1.0, "a significance level between 0 and 1"),
        default=DEFAULT_ALPHA,
        help=f"significance level of the tests (default {DEFAULT_ALPHA})",
    )
    parser.add_argument(
        "--inconclusive",
        choices=("fail", "pass"),
        default="pass",
        help="whether an inconclusive verdict fails (default: pass, but it is reported)",
    )
    parser.add_argument(
        "--mismatch",
        choices=("fail", "warn"),
        default="warn",
        help="whether a setup mismatch (host, fabric, MTU, grpcio, ...) fails (default: warn)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "Compare the tfgrpc figures of two pytest JUnit XML files. A figure regressed "
            "when it is worse by more than its tolerance and the change is significant "
            "(Mann-Whitney U for p50/mean/rates, bootstrap CI for p90/p99/p999, their "
            "step_ forms alike; a placement's imbalance by its ratio)."
        ),
        epilog="exit status: 0 no regression, 1 regression (or a failing policy), 2 bad input",
    )
    parser.add_argument(
        "old",
        metavar="OLD",
        nargs="+",
        help="the baseline: a run's JUnit XML, or several earlier runs (JUnit files, "
        "directories of them, --tfgrpc-results files), oldest first",
    )
    parser.add_argument("new", metavar="NEW.xml", help="the current run's JUnit XML")
    add_gate_options(parser)
    parser.add_argument(
        "--resamples",
        type=bounded(
            int,
            lambda n: 1 <= n <= MAX_RESAMPLES,
            f"a number of resamples between 1 and {MAX_RESAMPLES}",
        ),
        default=DEFAULT_RESAMPLES,
        help=f"bootstrap resamples for tail quantiles (default {DEFAULT_RESAMPLES})",
    )
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    return parser


@dataclass(frozen=True)
class GateCommand:
    """A gate command's parsed line (``tfgrpc-compare``, ``tfgrpc-ab``): its ``parser`` (for
    usage errors), ``args``, the ``--max-regression`` ``tolerances``, and where it prints."""

    parser: argparse.ArgumentParser
    args: argparse.Namespace
    tolerances: Mapping[str, float]
    stdout: TextIO
    stderr: TextIO


def parse_gate_command(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None, out: TextIO | None
) -> GateCommand:
    """Parse ``argv`` with ``parser`` (built with :func:`add_gate_options`); ``out``, if given,
    takes both outputs (tests). A bad option or tolerance is a usage error naming the option:
    argparse prints it and exits 2."""
    args = parser.parse_args(argv)
    try:
        tolerances = parse_tolerances(args.max_regression)
    except ToleranceError as error:
        parser.error(f"--max-regression: {error}")
    stdout = out if out is not None else sys.stdout
    return GateCommand(parser, args, tolerances, stdout, out if out is not None else sys.stderr)


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run the command; returns the exit status (argparse exits 2 itself on a bad option)."""
    command = parse_gate_command(build_parser(), argv, out)
    args, tolerances = command.args, command.tolerances
    stdout, stderr = command.stdout, command.stderr
    try:
        duplicates: list[str] = []
        old = load_history(args.old, skipped=duplicates)
        new = load_baseline(args.new)
    except BaselineError as error:
        print(f"{PROG}: error: {error}", file=stderr)
        return EXIT_BAD_INPUT
    comparison = compare_runs(
        old, new, tolerances, alpha=args.alpha, resamples=args.resamples, seed=args.seed
    )
    for note in duplicates:
        print(f"{PROG}: warning: {note}: counted once", file=stderr)
    short = short_history_warning(len(old))
    if short:
        print(f"{PROG}: warning: {short}", file=stderr)
    for line in format_comparison(comparison):
        print(line, file=stdout)
    failures = gate_failures(
        comparison, missing=args.missing, inconclusive=args.inconclusive, mismatch=args.mismatch
    )
    verdict = f"FAILED: {'; '.join(failures)}" if failures else "OK"
    print(f"{PROG}: {comparison.summary()}: {verdict}", file=stdout)
    return EXIT_REGRESSION if failures else EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
