"""``tfgrpc-model``: print the analytic model's scaling projection for a profile and a link.

The link is given on the command line (``--alpha 50us --bandwidth "1.2 GB/s"``) or fitted from
the P2P figures of an earlier run's JUnit file (``--from-junit perf.xml [--fabric lo]``) or
results file (``--from-results results.jsonl``)::

    tfgrpc-model --profile resnet50 --ps 1,2,4 --workers 1,2,4,8 --sharding greedy \\
        --from-junit perf.xml --compute 200ms --overlap 0.5
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from pytest_tfgrpc.model.analytic import (
    DEFAULT_BACKWARD_SHARE,
    DEFAULT_PS,
    DEFAULT_WORKERS,
    LinkFit,
    fit,
    link_point,
    project,
)
from pytest_tfgrpc.model.placement import SHARDINGS
from pytest_tfgrpc.report.junit import BaselineError, read_junit
from pytest_tfgrpc.report.record import figure_name, read_record
from pytest_tfgrpc.report.results_file import read_results
from pytest_tfgrpc.units import UnitError, parse_duration_ns, parse_rate_Bps, parse_size

__all__ = ["link_points_from_junit", "link_points_from_results", "main"]

PROG = "tfgrpc-model"
#: The figure a run gives for a size's typical time: its median.
_MEDIAN = "p50"
_NO_FABRIC = "unknown"


class ModelInputError(Exception):
    """An input the command cannot use; the message says which and why."""


def _add_points(
    properties: Mapping[str, object], points: dict[str, list[tuple[int, float]]]
) -> None:
    """Add one test's P2P medians to ``points``, under its ``tfgrpc.fabric``. A transport
    floor's rows (``<label>_floor``, raw TCP) are not the gRPC link and are left out."""
    record = read_record("", properties.items())
    fabric = record.fabric or _NO_FABRIC
    for measurement in record.measurements:
        at = measurement.key
        median = measurement.figures.get(_MEDIAN)
        if median is None or record.label(at.label).floor:
            continue
        try:
            size = parse_size(at.size)
        except UnitError:
            continue
        seconds = median / 1e9
        point = link_point(at.label, size, seconds)
        if point is not None and seconds > 0:
            points.setdefault(fabric, []).append(point)


def link_points_from_junit(path: Path) -> dict[str, list[tuple[int, float]]]:
    """``{fabric: [(bytes, seconds), ...]}`` from a JUnit file's P2P medians.

    Reads every ``tfgrpc.<label>.<size>.p50_us`` property whose label starts with
    ``p2p_latency`` or ``p2p_bandwidth`` (counted as
    :func:`~pytest_tfgrpc.model.analytic.link_point` does), but not a transport floor's
    (``p2p_latency_floor``), and takes the fabric from the same test case's ``tfgrpc.fabric``.
    """
    try:
        run = read_junit(path)
    except BaselineError as exc:  # names the file and why it cannot be read
        raise ModelInputError(str(exc)) from None
    points: dict[str, list[tuple[int, float]]] = {}
    for case in run.cases:
        _add_points(dict(case.properties), points)
    return points


def link_points_from_results(path: Path) -> dict[str, list[tuple[int, float]]]:
    """``{fabric: [(bytes, seconds), ...]}`` from a results file (``--tfgrpc-results``), read
    as :func:`~pytest_tfgrpc.report.results_file.read_results` does, counted as from a JUnit
    file."""
    if not path.is_file():
        raise ModelInputError(f"results file '{path}' does not exist or is not a file")
    try:
        records = read_results(path)
    except OSError as exc:
        raise ModelInputError(f"cannot read results file '{path}': {exc}") from exc
    points: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        properties = record.get("properties")
        if isinstance(properties, Mapping):
            _add_points({str(k): v for k, v in properties.items()}, points)
    return points


def _fits_from(path: Path, fabric: str | None, results: bool) -> list[LinkFit]:
    kind = "results file" if results else "JUnit file"
    points = link_points_from_results(path) if results else link_points_from_junit(path)
    if not points:
        raise ModelInputError(
            f"{kind} '{path}' holds no P2P figures to fit a link to (expected properties "
            f"such as {figure_name('p2p_latency', '1KiB', _MEDIAN)} or "
            f"{figure_name('p2p_bandwidth', '4MiB', _MEDIAN)})"
        )
    if fabric is not None and fabric not in points:
        raise ModelInputError(
            f"{kind} '{path}' holds no P2P figures on fabric {fabric!r} "
            f"(it has: {', '.join(sorted(points))})"
        )
    chosen = [fabric] if fabric is not None else sorted(points)
    fits = []
    for name in chosen:
        try:
            fits.append(fit(points[name], name))
        except ValueError as exc:
            raise ModelInputError(f"{kind} '{path}', fabric {name!r}: {exc}") from exc
    return fits


# --- argument types: small pure functions; argparse turns their errors into usage errors ----


def _counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(item) for item in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of whole numbers, e.g. 1,2,4"
        ) from None
    if any(count < 1 for count in counts):
        raise argparse.ArgumentTypeError(f"{text!r}: every count must be at least 1")
    if len(set(counts)) != len(counts):
        raise argparse.ArgumentTypeError(f"{text!r} repeats a count")
    return counts


def _seconds(text: str) -> float:
    try:
        return parse_duration_ns(text) / 1e9
    except UnitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _rate(text: str) -> float:
    try:
        rate = parse_rate_Bps(text)
    except UnitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if rate <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a bandwidth must be greater than zero")
    return rate


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction between 0 and 1")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "Project a sync-SGD step's communication time and weak-scaling efficiency over "
            "numbers of workers and parameter servers, from an alpha-beta model of the link."
        ),
    )
    parser.add_argument(
        "--profile", required=True, help="a built-in model profile (resnet50, ...) or a JSON file"
    )
    parser.add_argument(
        "--workers",
        type=_counts,
        default=DEFAULT_WORKERS,
        help="worker counts, comma-separated (default: 1,2,4,...,512)",
    )
    parser.add_argument(
        "--ps",
        type=_counts,
        default=DEFAULT_PS,
        help="parameter-server counts, comma-separated (default: 1,2,4,...,64)",
    )
    parser.add_argument(
        "--sharding",
        choices=SHARDINGS,
        default="round_robin",
        help="how tensors are placed on PS tasks (default: round_robin)",
    )
    link = parser.add_argument_group(
        "the link: give --alpha and --bandwidth, --from-junit or --from-results"
    )
    link.add_argument("--alpha", type=_seconds, help="time per message, e.g. 50us")
    link.add_argument("--bandwidth", type=_rate, help="bytes per second, e.g. '1.2 GB/s'")
    link.add_argument(
        "--from-junit",
        type=Path,
        metavar="FILE",
        help="fit the link to the P2P medians of an earlier run's JUnit XML",
    )
    link.add_argument(
        "--from-results",
        type=Path,
        metavar="FILE",
        help="fit the link to the P2P medians of an earlier run's results file (JSON lines)",
    )
    link.add_argument(
        "--fabric",
        help="with --from-junit or --from-results: the fabric to fit (default: each one)",
    )
    parser.add_argument(
        "--compute",
        type=_seconds,
        default=0.0,
        help="compute time of one step on one worker, e.g. 200ms; gives the efficiency",
    )
    parser.add_argument(
        "--overlap",
        type=_fraction,
        default=0.0,
        help="fraction of the backward pass that communication overlaps, 0..1 (default: 0)",
    )
    parser.add_argument(
        "--backward-share",
        type=_fraction,
        default=DEFAULT_BACKWARD_SHARE,
        help="the backward pass's share of --compute (default: 2/3)",
    )
    parser.add_argument(
        "--grid",
        action="store_true",
        help="print a workers x ps grid of the efficiency (or, without --compute, the "
        "communication time) instead of the full table",
    )
    return parser


def _links(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[LinkFit]:
    given = args.alpha is not None or args.bandwidth is not None
    files = [f for f in (args.from_junit, args.from_results) if f is not None]
    if len(files) + given > 1:
        parser.error(
            "give the link one way: --alpha and --bandwidth, --from-junit or --from-results"
        )
    if args.fabric is not None and not files:
        parser.error("--fabric chooses a fabric in a file; give --from-junit or --from-results")
    if args.from_junit is not None:
        return _fits_from(args.from_junit, args.fabric, results=False)
    if args.from_results is not None:
        return _fits_from(args.from_results, args.fabric, results=True)
    if args.alpha is None or args.bandwidth is None:
        parser.error(
            "give the link: --alpha and --bandwidth together, --from-junit or --from-results"
        )
    return [LinkFit.given(args.alpha, args.bandwidth)]


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``tfgrpc-model``; returns 0, or 1 after printing why an input cannot be used.

    Usage errors (a bad option value, a missing link) exit with status 2, as argparse does.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        links = _links(parser, args)
        projections = [
            project(
                args.profile,
                link,
                workers=args.workers,
                ps=args.ps,
                sharding=args.sharding,
                compute_s=args.compute,
                overlap=args.overlap,
                backward_share=args.backward_share,
            )
            for link in links
        ]
    except (ModelInputError, ValueError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    blocks = [
        f"{p.describe()}\n\n{p.format_grid() if args.grid else p.format()}" for p in projections
    ]
    print("\n\n".join(blocks))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
