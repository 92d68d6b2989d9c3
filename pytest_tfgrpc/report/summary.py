"""Records -> the terminal summary's rows, groups and tables (the HTML report shows the same).

Each test's figures arrive as its :class:`~pytest_tfgrpc.report.record.TestRecord` (read from
the properties it recorded, which pytest-xdist forwards from its workers), so the terminal
never shows a figure the XML does not hold. A group is one test (its fabric and engine
parameters aside), benchmark label and point: its rows are the engines, each with its fabrics
side by side; best and worst are marked among one engine's fabrics, and with several engines
their ratio is shown per fabric.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pytest_tfgrpc.report.record import Measurement, PSRow, TestRecord, Verdict, without_params
from pytest_tfgrpc.report.telemetry_text import summary_cell
from pytest_tfgrpc.stats.significance import mann_whitney_u_sketches
from pytest_tfgrpc.units import align_columns, format_duration, format_rate, format_size, parse_size

__all__ = [
    "MARK_ALPHA",
    "MARK_MIN_GAP",
    "MODEL_TOLERANCE",
    "Group",
    "SummaryRow",
    "cells",
    "engine_ratios",
    "format_ps_loads",
    "format_summary",
    "grouped",
    "marks",
    "model_misses",
    "summary_rows",
]

#: The summary's columns, by the metric each shows (a sync-SGD step's where a point has one).
_P50 = ("p50", "step_p50")
_P99 = ("p99", "step_p99")

#: Best and worst are marked only where the difference is beyond noise: a two-sided
#: Mann-Whitney U test of the two fabrics' sketched samples below this p-value, and a gap of
#: the headline figures wider than MARK_MIN_GAP. The U test sees the noise within the run;
#: the gap guards against the drift of a shared machine between the fabrics' turns, which it
#: cannot see (5-10% between back-to-back runs here, under load).
MARK_ALPHA = 0.05
MARK_MIN_GAP = 0.05


@dataclass(frozen=True)
class SummaryRow:
    """One line of the summary: one test, benchmark label, point, engine and fabric.

    ``measurement`` is the point as recorded; ``verdict`` the gate's verdict on its headline
    figure (throughput where there is one, else p50), when the run had a baseline.
    """

    test: str
    engine: str
    measurement: Measurement
    verdict: Verdict | None = None

    @property
    def fabric(self) -> str:
        return self.measurement.key.fabric

    @property
    def label(self) -> str:
        return self.measurement.key.label

    @property
    def size(self) -> str:
        return self.measurement.key.size

    @property
    def p50_ns(self) -> float | None:
        return self.measurement.figure(*_P50)

    @property
    def p99_ns(self) -> float | None:
        return self.measurement.figure(*_P99)

    @property
    def throughput_Bps(self) -> float | None:
        return self.measurement.figure("throughput")

    @property
    def limit(self) -> str:
        """The named limit (``cpu-bound (client)``), empty where none was named."""
        return self.measurement.limit.partition(":")[0]

    @property
    def limit_figures(self) -> str:
        """The figures the limit's verdict used (``client_busy=0.97 server_busy=0.41``)."""
        return self.measurement.limit.partition(":")[2].strip()

    @property
    def transport(self) -> str:
        """What the transport saw that is not nothing (``1,204 retx/GB, 413 qdisc drops``)."""
        return summary_cell(self.measurement.figures)

    @property
    def samples(self) -> int | None:
        count = self.measurement.figure("samples")
        return int(count) if count is not None else None

    @property
    def group(self) -> tuple[str, str, str]:
        """The test without its fabric and engine parameters, the label and the point: rows
        of one group differ only in their engine and fabric."""
        return (without_params(self.test, self.fabric, self.engine), self.label, self.size)

    @property
    def headline(self) -> float | None:
        """The figure rows are ranked by: throughput where there is one, else p50."""
        return self.throughput_Bps if self.throughput_Bps is not None else self.p50_ns

    def baseline_text(self) -> str:
        """The "vs baseline" cell: the change with one sign convention (``+`` = the figure
        grew) and the gate's word for it (``worse``, ``better``, ``same``, ``unsure``), then
        the smallest change the gate could detect (``±3.0%``) when it recorded one."""
        v = self.verdict
        if v is None or v.change_text() == "n/a":
            return "-"
        text = f"{v.change_text()} {v.outcome.word}"
        threshold = v.threshold
        return text + (f" ±{threshold:.1%}" if math.isfinite(threshold) else "")


def summary_rows(record: TestRecord) -> list[SummaryRow]:
    """The summary rows of one test: one per label and point with a time or rate figure."""
    rows = []
    for m in record.measurements:
        has_throughput = m.figure("throughput") is not None
        if m.figure(*_P50, *_P99) is None and not has_throughput:
            continue
        headline = ("throughput",) if has_throughput else _P50
        rows.append(
            SummaryRow(
                test=record.test,
                engine=record.label(m.key.label).engine,
                measurement=m,
                verdict=record.verdict(m.key, *headline),
            )
        )
    return rows


def _size_key(size: str) -> int:
    try:
        return parse_size(size)
    except ValueError:
        return -1


def _beyond_noise(best: SummaryRow, worst: SummaryRow) -> bool:
    """Whether two fabrics' figures differ beyond noise: their sketched samples differ by the
    U test (:data:`MARK_ALPHA`) and their headline figures by more than :data:`MARK_MIN_GAP`.
    Without sketches to test, no difference is taken as beyond noise."""
    a, b = best.measurement.sketch, worst.measurement.sketch
    high, low = best.headline, worst.headline
    if a is None or b is None or high is None or low is None or min(high, low) <= 0:
        return False
    if abs(high / low - 1.0) <= MARK_MIN_GAP:
        return False
    return mann_whitney_u_sketches(a, b).p_value < MARK_ALPHA


def marks(rows: Sequence[SummaryRow]) -> dict[int, str]:
    """``best``/``worst`` per row index among rows of one engine measured on more than one
    fabric, by throughput when every row has one, else by p50; only when best and worst
    differ beyond noise (:func:`_beyond_noise`)."""
    by_rate = all(row.throughput_Bps is not None for row in rows)
    ranked = [
        (i, value)
        for i, row in enumerate(rows)
        if (value := row.throughput_Bps if by_rate else row.p50_ns) is not None
    ]
    if len({rows[i].fabric for i, _ in ranked}) < 2:
        return {}
    ordered = sorted(ranked, key=lambda item: item[1], reverse=by_rate)
    best, worst = ordered[0][0], ordered[-1][0]
    if not _beyond_noise(rows[best], rows[worst]):
        return {}
    return {best: "best", worst: "worst"}


@dataclass(frozen=True)
class Group:
    """The rows of one test (fabric and engine aside), label and point: ``engines`` in the
    order they ran, each with its rows in the order of the command line's fabrics."""

    test: str
    label: str
    size: str
    engines: tuple[tuple[str, tuple[SummaryRow, ...]], ...]

    @property
    def rows(self) -> tuple[SummaryRow, ...]:
        return tuple(row for _, rows in self.engines for row in rows)


def grouped(rows: Sequence[SummaryRow], fabrics: Sequence[str] = ()) -> list[Group]:
    """Rows by group (test without its fabric and engine, label, point), groups sorted by
    test, label and point; within a group by engine (first seen first), then fabric in the
    order of ``fabrics`` (the command line's)."""
    order = {name: i for i, name in enumerate(fabrics)}
    engine_order: dict[str, int] = {}
    groups: dict[tuple[str, str, str], list[SummaryRow]] = {}
    for row in rows:
        engine_order.setdefault(row.engine, len(engine_order))
        groups.setdefault(row.group, []).append(row)
    out = []
    for key in sorted(groups, key=lambda g: (g[0], g[1], _size_key(g[2]), g[2])):
        by_engine: dict[str, list[SummaryRow]] = {}
        for row in groups[key]:
            by_engine.setdefault(row.engine, []).append(row)
        engines = tuple(
            (
                engine,
                tuple(sorted(members, key=lambda r: (order.get(r.fabric, len(order)), r.fabric))),
            )
            for engine, members in sorted(by_engine.items(), key=lambda e: engine_order[e[0]])
        )
        out.append(Group(key[0], key[1], key[2], engines))
    return out


@dataclass(frozen=True)
class EngineRatio:
    """One engine's figures over another's on one fabric: ``p50``, ``p99`` and
    ``throughput`` of ``engine`` divided by those of ``reference`` (None where either lacks
    the figure). A ratio of times above 1 is what ``engine`` costs over ``reference``."""

    engine: str
    reference: str
    fabric: str
    p50: float | None
    p99: float | None
    throughput: float | None

    @property
    def name(self) -> str:
        return f"{self.engine}/{self.reference}"


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b is not None and b > 0 else None


def engine_ratios(group: Group) -> list[EngineRatio]:
    """With several engines, per fabric both measured on: the first engine's figures over
    each other engine's (``grpcio/native``: what grpcio costs over native)."""
    if len(group.engines) < 2:
        return []
    first, first_rows = group.engines[0]
    out = []
    for engine, rows in group.engines[1:]:
        theirs = {row.fabric: row for row in rows}
        for mine in first_rows:
            other = theirs.get(mine.fabric)
            if other is None:
                continue
            out.append(
                EngineRatio(
                    first,
                    engine,
                    mine.fabric,
                    _ratio(mine.p50_ns, other.p50_ns),
                    _ratio(mine.p99_ns, other.p99_ns),
                    _ratio(mine.throughput_Bps, other.throughput_Bps),
                )
            )
    return out


def ratio_text(value: float | None) -> str:
    """``x2.31``, or ``-``."""
    return f"x{value:.3g}" if value is not None else "-"


def cells(row: SummaryRow) -> list[str]:
    """A row's figures as the tables write them: p50, p99, throughput, samples."""
    return [
        format_duration(row.p50_ns) if row.p50_ns is not None else "-",
        format_duration(row.p99_ns) if row.p99_ns is not None else "-",
        format_rate(row.throughput_Bps) if row.throughput_Bps is not None else "-",
        str(row.samples) if row.samples is not None else "-",
    ]


def format_summary(rows: Sequence[SummaryRow], fabrics: Sequence[str] = ()) -> list[str]:
    """An aligned table: test, benchmark, size, (engine, where a group has several,) fabric,
    then p50, p99, throughput and samples, one line per engine and fabric; the best and worst
    fabric of each engine (by throughput, else p50) are marked when they differ beyond noise;
    with several engines a line per fabric gives the first engine's figures over each other
    one's (``grpcio/native``); with a baseline, the change of the headline figure with the
    gate's word for it. Legend lines under the table say how to read it."""
    with_change = any(row.verdict is not None for row in rows)
    groups = grouped(rows, fabrics)
    with_engines = any(len(g.engines) > 1 for g in groups)
    header = ["test", "benchmark", "size", *(["engine"] if with_engines else []), "fabric"]
    left = len(header)
    header += ["p50", "p99", "throughput", "samples", *(["vs baseline"] if with_change else [])]
    with_limit = any(row.limit for row in rows)
    with_transport = any(row.transport for row in rows)
    header += [*(["limit"] if with_limit else []), *(["transport"] if with_transport else [])]
    table = [header]
    marked_any = False
    for group in groups:
        first = True
        for engine, members in group.engines:
            marked = marks(members)
            marked_any = marked_any or bool(marked)
            for i, row in enumerate(members):
                names = [group.test, group.label, group.size] if first else ["", "", ""]
                first = False
                line = [*names, *([engine] if with_engines else []), row.fabric, *cells(row)]
                if with_change:
                    line.append(row.baseline_text())
                if with_limit:
                    line.append(row.limit or "-")
                if with_transport:
                    line.append(row.transport or "-")
                table.append([*line, marked.get(i, "")])
        for ratio in engine_ratios(group):
            table.append(
                ["", "", "", ratio.name, ratio.fabric, ratio_text(ratio.p50),
                 ratio_text(ratio.p99), ratio_text(ratio.throughput)]
            )  # fmt: skip
    lines = align_columns(table, left)
    legend = []
    if marked_any:
        legend.append(
            "best/worst: by throughput, else p50, among one engine's fabrics where they differ "
            f"beyond noise (U test p < {MARK_ALPHA:g}, gap > {MARK_MIN_GAP:.0%})"
        )
    if with_engines:
        legend.append(
            "a/b: engine a's p50, p99 and throughput over engine b's on that fabric "
            "(x2 in p50: a takes twice b's time)"
        )
    if with_limit:
        legend.append(
            "limit: what bounded the point, by the rule of the docs' \"What limited a "
            'figure" (the JUnit record holds the figures it used)'
        )
    if with_transport:
        legend.append("transport: TCP retransmissions per GB sent and drops, where not zero")
    if with_change:
        legend.append(
            "vs baseline: current/baseline - 1 of throughput, else p50 (+ = grew); "
            "worse/better/same/unsure as the gate judged it; ± the smallest change it could "
            "detect"
        )
    return lines + legend


def _bytes(value: float | None) -> str:
    return format_size(int(value)) if value is not None else "-"


def ps_cells(row: PSRow) -> list[str]:
    """A PS task's load as the tables write it: bytes in, bytes out, RPCs, CPU time."""
    return [
        _bytes(row.bytes_in),
        _bytes(row.bytes_out),
        f"{row.rpcs:.0f}" if row.rpcs is not None else "-",
        format_duration(row.cpu_ns) if row.cpu_ns is not None else "-",
    ]


def format_ps_loads(rows: Iterable[SummaryRow]) -> list[str]:
    """Per PS point, one line per PS task: bytes in and out, RPCs served and CPU time, the
    slowest task (most bytes in, then CPU) marked; empty without PS points."""
    table: list[list[str]] = [
        ["test", "benchmark", "point", "fabric", "ps", "bytes in", "bytes out", "rpcs", "cpu"]
    ]
    for row in rows:
        for i, load in enumerate(row.measurement.ps_rows()):
            names = [row.test, row.label, row.size, row.fabric] if i == 0 else ["", "", "", ""]
            table.append([*names, load.task, *ps_cells(load), "slowest" if load.slowest else ""])
    if len(table) == 1:
        return []
    return ["PS load per task:", *align_columns(table, left=5)]


#: How far a prediction may miss its measured step before the summary says so: the model's
#: stated accuracy on this machine (docs/tasks/model.md).
MODEL_TOLERANCE = 0.25


def model_misses(record: TestRecord, tolerance: float = MODEL_TOLERANCE) -> list[str]:
    """One line per model prediction of ``record`` (its ``model`` ``error_pct``) that missed
    its measured step by more than ``tolerance``: the error, the predicted time and whose
    links the prediction used (``links``)."""
    lines = []
    for measurement in record.measurements:
        model = measurement.model
        try:
            error = float(model["error_pct"])
            predicted_us = float(model["step_us"])
        except (KeyError, ValueError):
            continue
        if abs(error) <= 100 * tolerance:
            continue
        key = measurement.key
        links = model.get("links", "PS 0 for all")
        lines.append(
            f"tfgrpc: model missed {record.test} {key.label}.{key.size}: predicted "
            f"{predicted_us / 1e3:.4g} ms, {error:+.0f}% off the measured p50 (links: {links})"
        )
    return lines
