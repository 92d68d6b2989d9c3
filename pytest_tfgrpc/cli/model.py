"""``tfgrpc-model``: print the analytic model's scaling projection for a profile and a link.

The link is given on the command line (``--alpha 50us --bandwidth "1.2 GB/s"``) or fitted from
the P2P figures of an earlier run's JUnit file (``--from-junit perf.xml [--fabric lo]``) or
results file (``--from-results results.jsonl``)::

    tfgrpc-model --profile resnet50 --ps 1,2,4 --workers 1,2,4,8 --sharding greedy \\
        --from-junit perf.xml --compute 200ms --overlap 0.5

``--calibrate FILE`` fits the cluster-scale model (:mod:`pytest_tfgrpc.model.scaling`) to
measured scaling points instead, and projects PS and all-reduce side by side::

    tfgrpc-model --profile resnet50_tf_cnn --calibrate points.csv --compute 250ms \\
        --pairs 64:16,128:32,512:64 [--json]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pytest_tfgrpc.cli.arguments import bounded
from pytest_tfgrpc.model.analytic import (
    DEFAULT_BACKWARD_SHARE,
    DEFAULT_PS,
    DEFAULT_WORKERS,
    CpuCost,
    LinkFit,
    fit,
    link_point,
    project,
)
from pytest_tfgrpc.model.placement import SHARDINGS, place_profile
from pytest_tfgrpc.model.profiles import load_profile
from pytest_tfgrpc.model.scaling import (
    ALLREDUCE_ALGORITHMS,
    FITTABLE,
    Calibration,
    ClusterTerms,
    MeasuredPoint,
    allreduce_step,
    allreduce_time,
    calibrate,
    describe_allreduce_cpu,
    ps_step,
)
from pytest_tfgrpc.report.junit import BaselineError, read_junit
from pytest_tfgrpc.report.record import figure_name, read_record
from pytest_tfgrpc.report.results_file import read_results
from pytest_tfgrpc.units import UnitError, parse_duration_ns, parse_rate_Bps, parse_size

__all__ = [
    "link_points_from_junit",
    "link_points_from_results",
    "main",
    "read_scaling_points",
]

PROG = "tfgrpc-model"
#: The figure a run gives for a size's typical time: its median.
_MEDIAN = "p50"
_NO_FABRIC = "unknown"


class ModelInputError(Exception):
    """An input the command cannot use; the message says which and why."""


#: The engine of figures whose settings do not name one (runs before engines were recorded).
_NO_ENGINE = "unrecorded"


@dataclass
class _Points:
    """P2P medians grouped by (engine, fabric), and which of those ran over a loopback."""

    points: dict[tuple[str, str], list[tuple[int, float]]] = field(default_factory=dict)
    loopback: set[tuple[str, str]] = field(default_factory=set)
    #: A worker's CPU per all-reduce step, by fabric, from each ``allreduce`` point's
    #: ``model.cpu_step_us`` and ``model.cpu_MBps`` (grpcio workers only: no engine to choose).
    allreduce_cpu: dict[str, list[CpuCost]] = field(default_factory=dict)

    def engines(self) -> list[str]:
        return sorted({engine for engine, _ in self.points})


def _recorded_allreduce_cpu(model: Mapping[str, str]) -> CpuCost | None:
    """The all-reduce CPU inputs an ``allreduce`` point records beside it, or None."""
    step, rate = model.get("cpu_step_us"), model.get("cpu_MBps")
    if step is None or rate is None:
        return None
    try:
        per_step, per_second = float(step) / 1e6, float(rate) * 1e6
    except ValueError:
        return None
    if not (math.isfinite(per_step) and per_step >= 0 and per_second > 0):
        return None
    return CpuCost(per_step, 0.0, 1 / per_second if math.isfinite(per_second) else 0.0)


def _add_points(properties: Mapping[str, object], found: _Points) -> None:
    """Add one test's P2P medians to ``found``, under its engine (``engine=`` in the label's
    settings) and its fabric, and its all-reduces' CPU inputs under its fabric. A transport
    floor's rows (``<label>_floor``, raw TCP) are not the gRPC link and are left out."""
    record = read_record("", properties.items())
    fabric = record.fabric or _NO_FABRIC
    over_loopback = fabric == "lo" or record.loopback
    for measurement in record.measurements:
        at = measurement.key
        cpu = _recorded_allreduce_cpu(measurement.model)
        if cpu is not None:
            found.allreduce_cpu.setdefault(fabric, []).append(cpu)
        median = measurement.figures.get(_MEDIAN)
        label = record.label(at.label)
        if median is None or label.floor:
            continue
        try:
            size = parse_size(at.size)
        except UnitError:
            continue
        seconds = median / 1e9
        point = link_point(at.label, size, seconds)
        if point is not None and seconds > 0:
            key = (label.engine or _NO_ENGINE, fabric)
            found.points.setdefault(key, []).append(point)
            if over_loopback:
                found.loopback.add(key)


def _junit_points(path: Path) -> _Points:
    try:
        run = read_junit(path)
    except BaselineError as exc:  # names the file and why it cannot be read
        raise ModelInputError(str(exc)) from None
    found = _Points()
    for case in run.cases:
        _add_points(dict(case.properties), found)
    return found


def _results_points(path: Path) -> _Points:
    found = _Points()
    for properties in _results_properties(path):
        _add_points(properties, found)
    return found


def _results_properties(path: Path) -> list[dict[str, object]]:
    if not path.is_file():
        raise ModelInputError(f"results file '{path}' does not exist or is not a file")
    try:
        records = read_results(path)
    except OSError as exc:
        raise ModelInputError(f"cannot read results file '{path}': {exc}") from exc
    out = []
    for record in records:
        properties = record.get("properties")
        if isinstance(properties, Mapping):
            out.append({str(k): v for k, v in properties.items()})
    return out


def _one_engine(found: _Points, engine: str | None, where: str) -> str | None:
    """The engine whose figures to fit: ``engine``, or the only one the file holds."""
    engines = found.engines()
    if engine is not None:
        if engine not in engines:
            raise ModelInputError(
                f"{where} holds no P2P figures measured with engine {engine!r} "
                f"(it has: {', '.join(engines) or 'none'})"
            )
        return engine
    if len(engines) > 1:
        raise ModelInputError(
            f"{where} holds P2P figures from several engines ({', '.join(engines)}): "
            "one link fit mixes them; choose one with --engine"
        )
    return engines[0] if engines else None


def _by_fabric(found: _Points, engine: str | None) -> dict[str, list[tuple[int, float]]]:
    return {fabric: pts for (eng, fabric), pts in found.points.items() if eng == engine}


def link_points_from_junit(
    path: Path, engine: str | None = None
) -> dict[str, list[tuple[int, float]]]:
    """``{fabric: [(bytes, seconds), ...]}`` from a JUnit file's P2P medians.

    Reads every ``tfgrpc.<label>.<size>.p50_us`` property whose label starts with
    ``p2p_latency`` or ``p2p_bandwidth`` (counted as
    :func:`~pytest_tfgrpc.model.analytic.link_point` does), but not a transport floor's
    (``p2p_latency_floor``), and takes the fabric from the same test case's ``tfgrpc.fabric``.
    Only the figures of ``engine`` (``engine=`` in the label's settings) count; without it
    the file must hold one engine's, else ModelInputError names the engines it holds.
    """
    found = _junit_points(path)
    return _by_fabric(found, _one_engine(found, engine, f"JUnit file '{path}'"))


def link_points_from_results(
    path: Path, engine: str | None = None
) -> dict[str, list[tuple[int, float]]]:
    """``{fabric: [(bytes, seconds), ...]}`` from a results file (``--tfgrpc-results``), read
    as :func:`~pytest_tfgrpc.report.results_file.read_results` does, counted and chosen by
    engine as from a JUnit file."""
    found = _results_points(path)
    return _by_fabric(found, _one_engine(found, engine, f"results file '{path}'"))


@dataclass(frozen=True)
class _Link:
    """A fitted or given link, and the all-reduce CPU inputs recorded on its fabric (None:
    none recorded)."""

    link: LinkFit
    allreduce_cpu: CpuCost | None = None


def _median_cpu(costs: Sequence[CpuCost]) -> CpuCost:
    """The median of each input over an ``allreduce`` test's points (one measurement each)."""
    return CpuCost(
        statistics.median(c.rpc_s for c in costs),
        0.0,
        statistics.median(c.byte_s for c in costs),
    )


def _fits_from(
    path: Path, fabric: str | None, engine: str | None, results: bool
) -> tuple[list[_Link], list[str]]:
    """The link fits, each with the all-reduce CPU inputs recorded on its fabric, and the
    warnings they deserve (a loopback, fewer than four points)."""
    kind = "results file" if results else "JUnit file"
    found = _results_points(path) if results else _junit_points(path)
    if not found.points:
        raise ModelInputError(
            f"{kind} '{path}' holds no P2P figures to fit a link to (expected properties "
            f"such as {figure_name('p2p_latency', '1KiB', _MEDIAN)} or "
            f"{figure_name('p2p_bandwidth', '4MiB', _MEDIAN)})"
        )
    chosen_engine = _one_engine(found, engine, f"{kind} '{path}'")
    points = _by_fabric(found, chosen_engine)
    if fabric is not None and fabric not in points:
        raise ModelInputError(
            f"{kind} '{path}' holds no P2P figures on fabric {fabric!r} "
            f"(it has: {', '.join(sorted(points))})"
        )
    chosen = [fabric] if fabric is not None else sorted(points)
    fits, warnings = [], []
    for name in chosen:
        try:
            link = fit(points[name], name)
        except ValueError as exc:
            raise ModelInputError(f"{kind} '{path}', fabric {name!r}: {exc}") from exc
        costs = found.allreduce_cpu.get(name)
        fits.append(_Link(link, _median_cpu(costs) if costs else None))
        if (chosen_engine, name) in found.loopback:
            warnings.append(
                f"the link of fabric {name!r} was measured over a loopback: its alpha and "
                "bandwidth are one host's memory and CPU, not a network's; a projection to "
                "many hosts from it says little"
            )
        if len(points[name]) < 4:
            warnings.append(
                f"the link of fabric {name!r} was fitted to {len(points[name])} points "
                "(fewer than 4): measure more message sizes to judge the fit"
            )
    return fits, warnings


# --- measured scaling points -----------------------------------------------------------------

_STEP_COLUMNS = {"step_s": 1.0, "step_ms": 1e-3, "step_us": 1e-6}
_TOPOLOGY = re.compile(r"^(?P<ps>\d+)ps_(?P<workers>\d+)workers_")
_SYNC_STEP = "sync_sgd_step"


@dataclass(frozen=True)
class ScalingInput:
    """Measured points, and the compute time their step times imply (None: efficiencies
    given, the compute time must come from ``--compute``)."""

    points: tuple[MeasuredPoint, ...]
    compute_s: float | None
    kind: str


def _efficiencies_from_steps(
    rows: list[tuple[int, int, float, str]], compute_s: float | None, where: str
) -> ScalingInput:
    """Efficiency ``t_c / step``: ``t_c`` is ``compute_s`` or the one-worker step time."""
    if compute_s is None:
        singles = [step for workers, _, step, _ in rows if workers == 1]
        if not singles:
            raise ModelInputError(
                f"{where}: step times need a one-worker row or --compute to turn them into "
                "efficiencies"
            )
        compute_s = min(singles)
    points = tuple(
        MeasuredPoint(workers, ps, compute_s / step, source) for workers, ps, step, source in rows
    )
    return ScalingInput(points, compute_s, "step times")


def _read_csv(path: Path, compute_s: float | None) -> ScalingInput:
    where = f"scaling file '{path}'"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ModelInputError(f"{where}: cannot read: {exc.strerror or exc}") from exc
    reader = csv.DictReader(line for line in text.splitlines() if not line.startswith("#"))
    columns = [c.strip() for c in reader.fieldnames or ()]
    value_columns = [c for c in columns if c in ("efficiency", *_STEP_COLUMNS, "throughput")]
    if not {"workers", "ps"} <= set(columns) or len(value_columns) != 1:
        raise ModelInputError(
            f"{where}: expected a header 'workers,ps,efficiency' (or one of "
            f"{', '.join(_STEP_COLUMNS)} or throughput instead of efficiency), got "
            f"{','.join(columns) or 'nothing'}"
        )
    column = value_columns[0]
    rows: list[tuple[int, int, float, str]] = []
    percent = False
    for number, raw in enumerate(reader, start=2):
        row = {(k or "").strip(): (v or "").strip() for k, v in raw.items()}
        try:
            workers, ps = int(row["workers"]), int(row["ps"])
            text_value = row[column]
            if text_value.endswith("%"):
                percent = True
                text_value = text_value[:-1]
            value = float(text_value)
        except ValueError:
            raise ModelInputError(
                f"{where}, line {number}: {','.join(raw.values())!r}: workers and ps must be "
                f"whole numbers and {column} a number"
            ) from None
        if workers < 1 or ps < 1 or not value > 0:
            raise ModelInputError(
                f"{where}, line {number}: workers and ps must be >= 1 and {column} > 0"
            )
        rows.append((workers, ps, value, f"{path.name}:{number}"))
    if not rows:
        raise ModelInputError(f"{where}: no points below the header")
    if column in _STEP_COLUMNS:
        scale = _STEP_COLUMNS[column]
        steps = [(w, p, v * scale, src) for w, p, v, src in rows]
        return _efficiencies_from_steps(steps, compute_s, where)
    if column == "throughput":
        singles = [v for w, _, v, _ in rows if w == 1]
        if not singles:
            raise ModelInputError(f"{where}: throughputs need a one-worker row as the baseline")
        base = max(singles)
        points = tuple(MeasuredPoint(w, p, v / (w * base), src) for w, p, v, src in rows)
        return ScalingInput(points, None, "throughputs")
    # A fraction is at most a little above 1 (superlinear runs); percentages are larger.
    if percent or max(v for _, _, v, _ in rows) > 2:
        rows = [(w, p, v / 100, src) for w, p, v, src in rows]
    points = tuple(MeasuredPoint(w, p, v, src) for w, p, v, src in rows)
    return ScalingInput(points, None, "efficiencies")


def _sync_steps(
    cases: Sequence[tuple[str, Mapping[str, object]]], compute_s: float | None, where: str
) -> ScalingInput:
    """``sync_sgd_step`` medians with their topologies, one point per (workers, ps)."""
    rows: list[tuple[int, int, float, str]] = []
    for name, properties in cases:
        record = read_record(name, properties.items())
        for measurement in record.measurements:
            at = measurement.key
            median = measurement.figures.get(f"step_{_MEDIAN}")
            if median is None or not at.label.startswith(_SYNC_STEP):
                continue
            topology = _TOPOLOGY.match(record.label(at.label).topology)
            if topology is None:
                continue
            rows.append(
                (int(topology["workers"]), int(topology["ps"]), median / 1e9, f"{name} {at.label}")
            )
    if not rows:
        raise ModelInputError(
            f"{where} holds no {_SYNC_STEP} medians with a topology "
            f"(such as {figure_name(_SYNC_STEP, '<profile>', 'step_p50')} beside the result's "
            "topology)"
        )
    if compute_s is None:
        raise ModelInputError(
            f"{where}: {_SYNC_STEP} steps exchange tensors without computing; give the "
            "compute time of one worker's step with --compute"
        )
    # The plugin's steps are the exchange alone: a training step would add the compute.
    points = tuple(
        MeasuredPoint(workers, ps, compute_s / (compute_s + step), source)
        for workers, ps, step, source in rows
    )
    return ScalingInput(points, compute_s, f"{_SYNC_STEP} steps added to --compute")


def read_scaling_points(path: Path, compute_s: float | None = None) -> ScalingInput:
    """Measured scaling points from ``path``: a CSV file (``workers,ps,efficiency`` with
    efficiencies as fractions, percentages above 2 or written ``80%``; ``step_s``,
    ``step_ms`` or ``step_us`` instead: efficiency ``t_c / step`` with ``t_c`` from
    ``compute_s`` or the one-worker row; ``throughput``: ``x_W / (W x_1)``), or a JUnit XML
    (``.xml``) or results file (``.jsonl``) of runs with ``sync_sgd_step`` results at several
    worker counts: those steps exchange tensors without computing, so their efficiency is
    ``t_c / (t_c + step)`` and ``compute_s`` is required. Lines starting with ``#`` are
    comments. ModelInputError says what is wrong.
    """
    if not path.is_file():
        raise ModelInputError(f"scaling file '{path}' does not exist or is not a file")
    if path.suffix == ".xml":
        try:
            run = read_junit(path)
        except BaselineError as exc:
            raise ModelInputError(str(exc)) from None
        cases: list[tuple[str, Mapping[str, object]]] = [
            (case.test, dict(case.properties)) for case in run.cases
        ]
        return _sync_steps(cases, compute_s, f"JUnit file '{path}'")
    if path.suffix == ".jsonl":
        records: list[tuple[str, Mapping[str, object]]] = [
            ("", props) for props in _results_properties(path)
        ]
        return _sync_steps(records, compute_s, f"results file '{path}'")
    return _read_csv(path, compute_s)


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


def _pairs(text: str) -> tuple[tuple[int, int], ...]:
    pairs = []
    for item in text.split(","):
        workers, sep, ps = item.partition(":")
        try:
            pair = (int(workers), int(ps))
        except ValueError:
            pair = (0, 0)
        if not sep or min(pair) < 1:
            raise argparse.ArgumentTypeError(
                f"{item!r} in {text!r} is not WORKERS:PS with both >= 1, e.g. 64:16,512:64"
            )
        pairs.append(pair)
    if len(set(pairs)) != len(pairs):
        raise argparse.ArgumentTypeError(f"{text!r} repeats a pair")
    return tuple(pairs)


def _allreduce_cpu(text: str) -> CpuCost:
    """``PER_STEP[,RATE]``: a worker's CPU per all-reduce step, and the bytes it sends or takes
    per CPU second (none: bytes cost no CPU)."""
    step, _, rate = text.partition(",")
    per_byte = 1 / _rate(rate) if rate.strip() else 0.0
    return CpuCost(_seconds(step), 0.0, per_byte)


def _terms(text: str) -> tuple[str, ...]:
    names = tuple(item.strip() for item in text.split(",") if item.strip())
    unknown = [name for name in names if name not in FITTABLE]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"cannot fit {', '.join(unknown)}; fittable terms: {', '.join(FITTABLE)}"
        )
    return names


_NONNEGATIVE = bounded(float, lambda value: value >= 0, "a number >= 0")
_FRACTION = bounded(float, lambda value: 0.0 <= value <= 1.0, "a fraction between 0 and 1")


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
    link.add_argument(
        "--engine",
        help="with --from-junit or --from-results: the engine whose figures to fit "
        "(required when the file holds several)",
    )
    scale = parser.add_argument_group(
        "calibration: fit the cluster-scale model to measured scaling points"
    )
    scale.add_argument(
        "--calibrate",
        type=Path,
        metavar="FILE",
        help="CSV workers,ps,efficiency (or step_s/step_ms/step_us or throughput), or a "
        "JUnit/results file with sync_sgd_step results at several worker counts",
    )
    scale.add_argument(
        "--fit",
        type=_terms,
        default=("bandwidth", "overlap", "fixed"),
        help=f"terms to fit, of {', '.join(FITTABLE)} (default: bandwidth,overlap,fixed)",
    )
    scale.add_argument(
        "--fixed", type=_NONNEGATIVE, default=0.0, help="per-step loss, fraction of --compute"
    )
    scale.add_argument(
        "--straggler",
        type=_NONNEGATIVE,
        default=0.0,
        help="relative standard deviation of a worker's compute time",
    )
    scale.add_argument(
        "--core", type=_rate, help="the network core's aggregate capacity, e.g. '40 GB/s'"
    )
    scale.add_argument("--colocated", action="store_true", help="PS tasks run on worker hosts")
    scale.add_argument(
        "--half-duplex", action="store_true", help="links carry one direction at a time"
    )
    scale.add_argument(
        "--allreduce",
        choices=ALLREDUCE_ALGORITHMS,
        default="ring",
        help="the all-reduce projected beside PS (default: ring)",
    )
    scale.add_argument(
        "--allreduce-cpu",
        type=_allreduce_cpu,
        metavar="PER_STEP[,RATE]",
        help="a worker's CPU per all-reduce step and the bytes it moves per CPU second, e.g. "
        "'1ms,800 MB/s' (default with --from-junit or --from-results: the model.cpu_step_us "
        "and model.cpu_MBps an allreduce test recorded on the fabric, if any)",
    )
    parser.add_argument(
        "--pairs",
        type=_pairs,
        help="project exactly these WORKERS:PS pairs, e.g. 64:16,512:64 (instead of a grid)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help='print {"fit": {...}, "points": [...]} as JSON instead of tables',
    )
    parser.add_argument(
        "--compute",
        type=_seconds,
        default=None,
        help="compute time of one step on one worker, e.g. 200ms; gives the efficiency",
    )
    parser.add_argument(
        "--overlap",
        type=_FRACTION,
        default=0.0,
        help="fraction of the backward pass that communication overlaps, 0..1 (default: 0)",
    )
    parser.add_argument(
        "--backward-share",
        type=_FRACTION,
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


def _links(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[list[_Link], list[str]]:
    given = args.alpha is not None or args.bandwidth is not None
    files = [f for f in (args.from_junit, args.from_results) if f is not None]
    if len(files) + given > 1:
        parser.error(
            "give the link one way: --alpha and --bandwidth, --from-junit or --from-results"
        )
    if args.fabric is not None and not files:
        parser.error("--fabric chooses a fabric in a file; give --from-junit or --from-results")
    if args.engine is not None and not files:
        parser.error("--engine chooses an engine in a file; give --from-junit or --from-results")
    if args.from_junit is not None:
        return _fits_from(args.from_junit, args.fabric, args.engine, results=False)
    if args.from_results is not None:
        return _fits_from(args.from_results, args.fabric, args.engine, results=True)
    if args.alpha is None or args.bandwidth is None:
        parser.error(
            "give the link: --alpha and --bandwidth together, --from-junit or --from-results"
        )
    return [_Link(LinkFit.given(args.alpha, args.bandwidth))], []


def _link_json(link: LinkFit) -> dict[str, object]:
    return {
        "fabric": link.fabric,
        "alpha_s": link.alpha,
        "bandwidth_Bps": link.bandwidth_Bps,
        "points": len(link.points),
        "r_squared": link.r_squared if len({n for n, _ in link.points}) > 2 else None,
        "max_relative_error": link.max_relative_error,
    }


def _link_mode(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[str, list[str]]:
    """The PS projection from a link (the analytic model of one step)."""
    found, warnings = _links(parser, args)
    if args.json and len(found) > 1:
        raise ModelInputError(
            f"--json prints one fit; the file holds {len(found)} fabrics "
            f"({', '.join(each.link.fabric for each in found)}): choose one with --fabric"
        )
    # A typed --allreduce-cpu wins over the inputs an allreduce test recorded in the file.
    cpus = {each.link.fabric: args.allreduce_cpu or each.allreduce_cpu for each in found}
    links = [each.link for each in found]
    compute = args.compute if args.compute is not None else 0.0
    options = {
        "sharding": args.sharding,
        "compute_s": compute,
        "overlap": args.overlap,
        "backward_share": args.backward_share,
    }
    if args.pairs is not None:
        workers = tuple(dict.fromkeys(w for w, _ in args.pairs))
        ps = tuple(dict.fromkeys(p for _, p in args.pairs))
    else:
        workers, ps = args.workers, args.ps
    projections = [
        project(
            args.profile,
            link,
            workers=workers,
            ps=ps,
            sharding=args.sharding,
            compute_s=compute,
            overlap=args.overlap,
            backward_share=args.backward_share,
        )
        for link in links
    ]
    if args.json:
        chosen = projections[0]
        wanted = args.pairs or [(w, p) for w in workers for p in ps]
        rows = [chosen.row(w, p) for w, p in wanted]
        cpu = cpus[chosen.link.fabric]
        reduced = {w: _link_allreduce(args, chosen.link, cpu, w, compute) for w in workers}
        document = {
            "fit": {
                "link": _link_json(chosen.link),
                "profile": chosen.profile,
                **options,
                "allreduce_cpu": _cpu_json(cpu, args),
            },
            "points": [
                {
                    "workers": r.topology.workers,
                    "ps": r.topology.ps,
                    "efficiency": r.efficiency,
                    "step_s": r.iter_s,
                    "comm_s": r.comm_s,
                    "limit": r.limit,
                    "imbalance": r.imbalance,
                    "allreduce": reduced[r.topology.workers],
                }
                for r in rows
            ],
            "warnings": warnings,
        }
        return json.dumps(document, indent=2), warnings
    blocks = []
    for p in projections:
        table = p.format_grid() if args.grid else p.format()
        if args.pairs is not None and not args.grid:
            wanted_rows = set(args.pairs)
            lines = table.splitlines()
            keep = [lines[0]] + [
                line
                for line, row in zip(lines[1:], p.rows, strict=True)
                if (row.topology.workers, row.topology.ps) in wanted_rows
            ]
            table = "\n".join(keep)
        reduced_table = _allreduce_table(args, p.link, cpus[p.link.fabric], workers)
        blocks.append(f"{p.describe()}\n\n{table}\n\n{reduced_table}")
    return "\n\n".join(blocks), warnings


def _cpu_json(cpu: CpuCost | None, args: argparse.Namespace) -> dict[str, object] | None:
    """The all-reduce CPU inputs the projection used, and where they came from."""
    if cpu is None:
        return None
    return {
        "step_s": cpu.rpc_s,
        "byte_s": cpu.byte_s,
        "from": "--allreduce-cpu" if args.allreduce_cpu is not None else "file",
    }


def _link_allreduce(
    args: argparse.Namespace, link: LinkFit, cpu: CpuCost | None, workers: int, compute: float
) -> dict[str, object]:
    """The all-reduce of the profile among ``workers`` workers over ``link`` (each worker a
    host of its own), as the link projection's JSON shows it beside PS."""
    model = load_profile(args.profile)
    comm = 0.0
    if workers > 1:
        comm, _, _ = allreduce_time(
            model.total_bytes,
            workers,
            args.allreduce,
            alpha_s=link.alpha,
            link_Bps=link.bandwidth_Bps,
            cpu=cpu,
        )
    out: dict[str, object] = {"algorithm": args.allreduce, "comm_s": comm}
    if compute > 0:
        terms = ClusterTerms(
            compute_s=compute,
            bandwidth_Bps=link.bandwidth_Bps,
            alpha_s=link.alpha,
            overlap=args.overlap,
            backward_share=args.backward_share,
            worker_cpu=cpu,
        )
        point = allreduce_step(model, workers, terms, algorithm=args.allreduce)
        out.update(efficiency=point.efficiency, step_s=point.step_s, limit=point.limit)
    return out


def _allreduce_table(
    args: argparse.Namespace, link: LinkFit, cpu: CpuCost | None, workers: Sequence[int]
) -> str:
    """The all-reduce beside the PS table: per worker count, its time and efficiency."""
    compute = args.compute if args.compute is not None else 0.0
    origin = "" if args.allreduce_cpu is not None else " (recorded by the file's allreduce test)"
    lines = [
        f"{args.allreduce} all-reduce of the profile over the same link, no PS (each worker "
        "a host of its own" + (", " + describe_allreduce_cpu(cpu) + origin if cpu else "") + "):",
        "workers  comm time" + ("  efficiency  limit" if compute > 0 else ""),
    ]
    for count in workers:
        row = _link_allreduce(args, link, cpu, count, compute)
        line = f"{count:>7}  {float(str(row['comm_s'])) * 1e3:>7.4g}ms"
        if "efficiency" in row:
            line += f"  {float(str(row['efficiency'])):>10.1%}  {row['limit']}"
        lines.append(line)
    return "\n".join(lines)


def _format_fit(calibration: Calibration, kind: str) -> str:
    lines = [
        f"calibrated on {len(calibration.points)} measured points ({kind}), profile "
        f"{calibration.profile}, sharding {calibration.sharding}:"
    ]
    for term in calibration.fitted:
        if term.name in ("bandwidth", "core"):
            value = f"{term.value / 1e6:.4g} MB/s"
            sd = f" +- {term.sd / 1e6:.2g} MB/s" if term.sd is not None else ""
        elif term.name == "alpha":
            value = f"{term.value * 1e6:.4g} us"
            sd = f" +- {term.sd * 1e6:.2g} us" if term.sd is not None else ""
        else:
            value = f"{term.value:.4g}"
            sd = f" +- {term.sd:.2g}" if term.sd is not None else ""
        note = "" if term.pinned else f"  NOT PINNED DOWN: {term.why}"
        lines.append(f"  {term.name:<10} {value}{sd}{note}")
    lines.append(f"  with {calibration.terms.describe()}")
    lines.append(f"  rms residual {calibration.rms * 100:.2f} efficiency points")
    lines.append("")
    lines.append("workers  ps  measured  fitted  residual  source")
    for point, predicted in zip(calibration.points, calibration.predicted, strict=True):
        lines.append(
            f"{point.workers:>7}  {point.ps:>2}  {point.efficiency:>8.1%}  {predicted:>6.1%}"
            f"  {100 * (predicted - point.efficiency):>+7.1f}pt  {point.source}"
        )
    unpinned = calibration.unpinned()
    if unpinned:
        lines.append("")
        lines.append(
            f"the points could not pin down: {', '.join(unpinned)} (the projection uses the "
            "values above, which the points do not determine)"
        )
    return "\n".join(lines)


def _calibrate_mode(args: argparse.Namespace) -> tuple[str, list[str]]:
    measured = read_scaling_points(args.calibrate, args.compute)
    compute = args.compute if args.compute is not None else measured.compute_s
    if compute is None:
        raise ModelInputError(
            f"--calibrate '{args.calibrate}' gives efficiencies: say the compute time of one "
            "worker's step with --compute (the fitted bandwidth is relative to it)"
        )
    start = ClusterTerms(
        compute_s=compute,
        bandwidth_Bps=args.bandwidth if args.bandwidth is not None else 1e9,
        alpha_s=args.alpha if args.alpha is not None else 50e-6,
        overlap=args.overlap,
        fixed=args.fixed,
        straggler=args.straggler,
        backward_share=args.backward_share,
        colocated=args.colocated,
        duplex=not args.half_duplex,
        core_Bps=args.core,
        worker_cpu=args.allreduce_cpu,
    )
    result = calibrate(measured.points, args.profile, start, free=args.fit, sharding=args.sharding)
    warnings = list(result.warnings)
    if result.unpinned():
        warnings.append(
            f"the points could not pin down {', '.join(result.unpinned())}: projections "
            "depend on values they do not determine"
        )
    pairs = args.pairs or [(w, p) for w in args.workers for p in args.ps]
    model = load_profile(args.profile)
    placements = {p: place_profile(model, p, args.sharding) for _, p in pairs}
    rows = []
    for workers, ps in pairs:
        point = ps_step(model, workers, ps, result.terms, placement=placements[ps])
        reduced = allreduce_step(model, workers, result.terms, algorithm=args.allreduce)
        rows.append((point, reduced))
    if args.json:
        document = {
            "fit": {
                "profile": result.profile,
                "sharding": result.sharding,
                "input": measured.kind,
                "terms": {k: v for k, v in result.terms.__dict__.items() if not k.startswith("_")},
                "fitted": {term.name: term.as_dict() for term in result.fitted},
                "unpinned": list(result.unpinned()),
                "rms": result.rms,
                "measured": [
                    {
                        "workers": m.workers,
                        "ps": m.ps,
                        "efficiency": m.efficiency,
                        "fitted": f,
                        "residual": f - m.efficiency,
                        "source": m.source,
                    }
                    for m, f in zip(result.points, result.predicted, strict=True)
                ],
            },
            "points": [
                {
                    **point.as_dict(),
                    "allreduce": {
                        "algorithm": args.allreduce,
                        "efficiency": reduced.efficiency,
                        "step_s": reduced.step_s,
                        "comm_s": reduced.comm_s,
                    },
                }
                for point, reduced in rows
            ],
            "warnings": warnings,
        }
        return json.dumps(document, indent=2), warnings
    table = ["workers    ps  ps efficiency  ps limit          " + f"{args.allreduce} efficiency"]
    for point, reduced in rows:
        table.append(
            f"{point.workers:>7}  {point.ps:>4}  {point.efficiency:>13.1%}  {point.limit:<16}"
            f"  {reduced.efficiency:>{len(args.allreduce) + 11}.1%}"
        )
    return _format_fit(result, measured.kind) + "\n\n" + "\n".join(table), warnings


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``tfgrpc-model``; returns 0, or 1 after printing why an input cannot be used.

    Usage errors (a bad option value, a missing link) exit with status 2, as argparse does.
    Warnings (a loopback link, a fit on fewer than four points, terms the points cannot pin
    down) go to stderr, and into the JSON document with ``--json``.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.calibrate is not None:
            if args.from_junit is not None or args.from_results is not None:
                parser.error(
                    "--calibrate fits its own bandwidth; --from-junit and --from-results fit "
                    "a link: give one"
                )
            out, warnings = _calibrate_mode(args)
        else:
            only = [
                option
                for option, value, default in (
                    ("--fit", args.fit, ("bandwidth", "overlap", "fixed")),
                    ("--fixed", args.fixed, 0.0),
                    ("--straggler", args.straggler, 0.0),
                    ("--core", args.core, None),
                    ("--colocated", args.colocated, False),
                    ("--half-duplex", args.half_duplex, False),
                )
                if value != default
            ]
            if only:
                parser.error(
                    f"{', '.join(only)} apply to the cluster-scale model: give --calibrate"
                )
            out, warnings = _link_mode(parser, args)
    except (ModelInputError, ValueError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    for warning in warnings:
        print(f"{PROG}: warning: {warning}", file=sys.stderr)
    print(out)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
