"""PNG plots of a run's figures (``--tfgrpc-plot DIR``), drawn from its JUnit properties.

Plots are made from the same ``tfgrpc.*`` properties that the JUnit XML and the results file
hold, so they work from either (:func:`properties_from_junit`, or the records of
:func:`pytest_tfgrpc.report.results_file.read_results`) and never show a figure the XML does not
have.

* ``latency_<label>.png`` for each latency benchmark label (a label without throughput
  figures): time against message size, log-log, one colour per fabric: the p50 as a solid
  line with a shaded p10-p90 band (read from the point's sketch), the p99 as its own dashed
  line, and the raw-TCP floor (``<label>_floor``, ``floor=True``) dotted on the same axes.
* ``bandwidth_<label>.png`` for each label with throughput figures: throughput against
  message size, with the per-tensor rate of the p10-p90 band, the rate of the slowest 1%
  (size over the p99 time) dashed, and the floor dotted.
* ``ps_<label>.png`` for each parameter-server label (one with a ``.topology`` property):
  bars of the step (or RPC) p50 and p99 per payload, topology and sharding, one colour per
  fabric, beside a step-time histogram per fabric and category drawn from the sketches (a
  bounded summary of every sample, ~1% buckets).

Legends name the fabric and the engine (``gRPC unary raw``, ``raw-TCP floor``). Time and rate
axes are labelled at every decade and at 2x and 5x between (3x and 7x too on a narrow axis),
and span at least one decade, so that noise of a few percent does not look like a trend.

A label measured by several tests (``p2p_latency`` called from two test functions) gets one
plot per test function, its fabric parametrization aside.

matplotlib is an optional dependency (the ``plot`` extra); it is imported only when drawing,
and drawing uses the Agg canvas directly, leaving pyplot's global backend alone.
"""

from __future__ import annotations

import io
import itertools
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from pytest_tfgrpc.metrics import FLOOR_SUFFIX, METRICS, is_floor
from pytest_tfgrpc.report.junit import read_junit
from pytest_tfgrpc.report.record import TestRecord, read_record, without_params
from pytest_tfgrpc.report.results_file import atomic_write
from pytest_tfgrpc.stats.sketch import Sketch
from pytest_tfgrpc.units import UnitError, format_duration, format_rate, parse_size

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "PlotUnavailableError",
    "PropertySource",
    "Row",
    "draw",
    "measurement_rows",
    "per_test_properties",
    "plot_available",
    "properties_from_junit",
    "records_of",
    "write_plots",
]

INSTALL_HINT = "install the plot extra: pip install -e '.[plot]' in a checkout of pytest-tfgrpc"

#: A run's tests: their records (``{test: TestRecord}``), their properties (``{test:
#: properties}``, a mapping or ``(name, value)`` pairs), or the records of a results file (dicts
#: with ``test`` and ``properties``).
PropertySource = (
    Mapping[str, TestRecord]
    | Mapping[str, Mapping[str, object] | Iterable[tuple[str, object]]]
    | Iterable[Mapping[str, Any]]
)

_FILE_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_TOPOLOGY = re.compile(r"^(\d+)ps_(\d+)workers_(.+)$")


class PlotUnavailableError(RuntimeError):
    """Plots were asked for but matplotlib cannot be imported; the message says how to fix it."""


def plot_available() -> tuple[bool, str]:
    """Whether plots can be drawn: ``(True, "matplotlib 3.x")``, or ``(False, why)``."""
    try:
        import matplotlib
    except ImportError as error:
        return False, f"matplotlib cannot be imported ({error}); {INSTALL_HINT}"
    return True, f"matplotlib {matplotlib.__version__}"


# ---------------------------------------------------------------------------------------------
# Properties in


def per_test_properties(source: PropertySource) -> dict[str, dict[str, str]]:
    """``{test: {property name: value}}`` from any :data:`PropertySource`, values as text.

    A name given twice in one test keeps its first value, as the results file does; a test
    given twice (a results file with a rerun) has its later properties added over the earlier.
    """
    pairs: Iterable[tuple[object, object]]
    if isinstance(source, Mapping):
        pairs = source.items()
    else:
        pairs = ((record.get("test"), record.get("properties", {})) for record in source)
    out: dict[str, dict[str, str]] = {}
    for test, properties in pairs:
        if not isinstance(test, str) or not test:
            continue
        items: Iterable[Any]
        if isinstance(properties, Mapping):
            items = properties.items()
        elif isinstance(properties, Iterable) and not isinstance(properties, (str, bytes)):
            items = properties
        else:
            continue
        named: dict[str, str] = {}
        for item in items:
            if isinstance(item, (tuple, list)) and len(item) == 2:
                named.setdefault(str(item[0]), str(item[1]))
        out.setdefault(test, {}).update(named)
    return out


def properties_from_junit(path: str | os.PathLike[str]) -> dict[str, dict[str, str]]:
    """``{test: {property name: value}}`` of every named test case in a JUnit XML file.

    Tests are named ``classname.name`` as pytest writes them. A file that cannot be read or
    parsed raises ``ValueError`` naming it.
    """
    run = read_junit(path)  # BaselineError is a ValueError naming the file
    out: dict[str, dict[str, str]] = {}
    for case in run.cases:
        named = out.setdefault(case.test, {})
        for name, value in case.properties:
            named.setdefault(name, value)
    return out


@dataclass(frozen=True)
class Row:
    """The figures of one message size (or payload) of one labelled result of one test.

    ``metrics`` maps metric names as in the property (``p99_us``, ``throughput_MBps``) to
    numbers as the property writes them; ``size_bytes`` is None for a key that is neither a
    size nor a payload with a recorded size (a PS profile). ``topology`` is ``""`` except for
    parameter-server results.
    """

    test: str
    fabric: str
    label: str
    key: str
    size_bytes: int | None
    metrics: Mapping[str, float]
    topology: str = ""
    rpc: str = ""
    mode: str = ""
    sketch: Sketch | None = field(default=None, compare=False)

    @property
    def is_ps(self) -> bool:
        return bool(self.topology)

    @property
    def floor(self) -> bool:
        """A raw-TCP transport floor's row (label ``<label>_floor``)."""
        return is_floor(self.label)

    def quantile_ns(self, q: float) -> float | None:
        """Quantile ``q`` of the point's samples (ns), from its recorded sketch; None without
        one (or when it does not decode)."""
        if self.sketch is None:
            return None
        return self.sketch.quantile(q) if self.sketch.count else None


def _key_bytes(key: str, recorded: int | None) -> int | None:
    if recorded is not None:
        return recorded
    try:
        return parse_size(key)
    except UnitError:
        return None


def records_of(source: PropertySource) -> list[TestRecord]:
    """The records of ``source`` (read from properties where it holds properties)."""
    if isinstance(source, Mapping) and all(isinstance(v, TestRecord) for v in source.values()):
        return [v for v in source.values() if isinstance(v, TestRecord)]
    return [read_record(test, props.items()) for test, props in per_test_properties(source).items()]


def measurement_rows(source: PropertySource) -> list[Row]:
    """Every point of every labelled result in ``source``, as :class:`Row` objects: its
    figures (per PS and workers' left out), the label's ``rpc``, ``mode`` and ``topology``,
    and the test's fabric."""
    rows: list[Row] = []
    for record in records_of(source):
        for m in record.measurements:
            about = record.label(m.key.label)
            metrics = {}
            for name, value in m.figures.items():
                if math.isfinite(value):
                    metric = METRICS[name]
                    metrics[metric.property_suffix] = value / metric.unit.scale
            rows.append(
                Row(
                    test=record.test,
                    fabric=record.fabric,
                    label=m.key.label,
                    key=m.key.size,
                    size_bytes=_key_bytes(m.key.size, m.size_bytes),
                    metrics=MappingProxyType(metrics),
                    topology=about.topology,
                    rpc=about.rpc,
                    mode=about.mode,
                    sketch=m.sketch,
                )
            )
    return rows


# ---------------------------------------------------------------------------------------------
# Charts: what to draw, decided without matplotlib


@dataclass(frozen=True)
class _Series:
    name: str
    fabric: str
    rows: tuple[Row, ...]
    floor: bool = False

    @property
    def engine(self) -> str:
        """What carried the bytes, for the legend: ``gRPC unary raw``, ``raw-TCP floor``."""
        if self.floor:
            return "raw-TCP floor"
        how = sorted({" ".join(x for x in (r.rpc, r.mode) if x) for r in self.rows})
        return "gRPC" + (f" {how[0]}" if len(how) == 1 and how[0] else "")


@dataclass(frozen=True)
class _Chart:
    kind: str  # "latency", "bandwidth", "ps"
    label: str
    test: str  # the test the chart is about, its fabric parameter aside; "" for ps charts
    series: tuple[_Series, ...]


def _short(test: str) -> str:
    """The test function and parameters of a node id or JUnit name, without its module."""
    start = test.find("[")
    head, params = (test, "") if start < 0 else (test[:start], test[start:])
    return re.split(r"::|\.", head)[-1] + params


def _series(rows: Sequence[Row]) -> tuple[_Series, ...]:
    by_run: dict[tuple[str, str, bool], list[Row]] = {}
    for row in rows:
        by_run.setdefault((row.fabric, row.test, row.floor), []).append(row)
    fabric_counts: dict[tuple[str, bool], int] = {}
    for fabric, _, floor in by_run:
        fabric_counts[(fabric, floor)] = fabric_counts.get((fabric, floor), 0) + 1
    out = []
    for (fabric, test, floor), group in sorted(by_run.items()):
        name = fabric or "(no fabric)"
        if fabric_counts[(fabric, floor)] > 1:
            name = f"{name} {_short(test)}"
        out.append(_Series(name, fabric, tuple(group), floor))
    return tuple(out)


def _fabric_series(rows: Sequence[Row]) -> tuple[_Series, ...]:
    by_fabric: dict[str, list[Row]] = {}
    for row in rows:
        by_fabric.setdefault(row.fabric, []).append(row)
    return tuple(
        _Series(fabric or "(no fabric)", fabric, tuple(group))
        for fabric, group in sorted(by_fabric.items())
    )


def _charts(rows: Sequence[Row]) -> list[_Chart]:
    # A transport floor is drawn on the axes of the figure it bounds, not on its own.
    by_label: dict[str, list[Row]] = {}
    for row in rows:
        base = row.label.removesuffix(FLOOR_SUFFIX) if row.floor else row.label
        by_label.setdefault(base, []).append(row)
    charts: list[_Chart] = []
    for label, label_rows in sorted(by_label.items()):
        ps = [r for r in label_rows if r.is_ps]
        if ps:
            charts.append(_Chart("ps", label, "", _fabric_series(ps)))
        by_test: dict[str, list[Row]] = {}
        for row in label_rows:
            if not row.is_ps and row.size_bytes is not None and row.size_bytes > 0:
                by_test.setdefault(without_params(row.test, row.fabric), []).append(row)
        for test, test_rows in sorted(by_test.items()):
            if all(r.floor for r in test_rows):
                kind = (
                    "bandwidth"
                    if any("throughput_MBps" in r.metrics for r in test_rows)
                    else "latency"
                )
                charts.append(_Chart(kind, label + FLOOR_SUFFIX, test, _series(test_rows)))
            elif any("throughput_MBps" in r.metrics for r in test_rows if not r.floor):
                charts.append(_Chart("bandwidth", label, test, _series(test_rows)))
            else:
                charts.append(_Chart("latency", label, test, _series(test_rows)))
    return charts


def _file_names(charts: Sequence[_Chart]) -> list[str]:
    """``<kind>_<label>.png``; with the test's name too where a label has several charts."""
    counts: dict[tuple[str, str], int] = {}
    for chart in charts:
        counts[(chart.kind, chart.label)] = counts.get((chart.kind, chart.label), 0) + 1
    names = []
    for chart in charts:
        stem = f"{chart.kind}_{chart.label}"
        if counts[(chart.kind, chart.label)] > 1:
            stem += f"__{_short(chart.test)}"
        names.append(stem)
    taken: dict[str, int] = {}
    out = []
    for name in names:
        safe = _FILE_UNSAFE.sub("_", name).strip("_.") or "plot"
        taken[safe] = taken.get(safe, 0) + 1
        out.append(f"{safe}.png" if taken[safe] == 1 else f"{safe}_{taken[safe]}.png")
    return out


# ---------------------------------------------------------------------------------------------
# Drawing


def _colours(charts: Sequence[_Chart]) -> dict[str, str]:
    """One colour per fabric, the same in every plot of the run."""
    palette = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf")
    fabrics = sorted({s.fabric for chart in charts for s in chart.series})
    return {fabric: palette[i % len(palette)] for i, fabric in enumerate(fabrics)}


def _size_axis(ax: Axes, rows: Iterable[Row]) -> None:
    from matplotlib.ticker import FixedLocator, NullLocator

    labels: dict[int, str] = {}
    for row in rows:
        if row.size_bytes:
            labels.setdefault(row.size_bytes, row.key)  # "64KiB", or a payload's name
    ax.set_xscale("log", base=2)
    sizes = sorted(labels)
    step = max(1, math.ceil(len(sizes) / 12))  # at most a dozen tick labels
    shown = sizes[::step]
    ax.xaxis.set_major_locator(FixedLocator([float(s) for s in shown]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([labels[s] for s in shown], rotation=45, ha="right")
    ax.set_xlabel("message size")


#: A log axis spans at least this many decades, so that run-to-run noise of a few percent
#: does not fill the plot and look like a trend.
MIN_DECADES = 1.0


def _log_y(ax: Axes, values: Sequence[float], text: Callable[[float], str]) -> None:
    """A log y axis labelled in people's units (``text``) at every decade and at 2x and 5x
    between (also 3x and 7x when the axis spans less than two decades), spanning at least
    :data:`MIN_DECADES` around the values."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    positive = [v for v in values if v > 0 and math.isfinite(v)]
    ax.set_yscale("log")
    if positive:
        low, high = min(positive), max(positive)
        missing = MIN_DECADES - math.log10(high / low)
        if missing > 0:
            pad = 10 ** (missing / 2)
            low, high = low / pad, high * pad
        ax.set_ylim(low / 1.15, high * 1.15)
        decades = math.log10(high / low)
    else:
        decades = 0.0
    subs = (1.0, 2.0, 3.0, 5.0, 7.0) if decades < 2 else (1.0, 2.0, 5.0)
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=subs, numticks=40))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: text(v)))
    ax.yaxis.set_minor_locator(LogLocator(base=10, subs=tuple(float(m) for m in range(1, 10))))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _title(ax: Axes, what: str, chart: _Chart) -> None:
    detail = [_short(chart.test)] if chart.test else []
    ax.set_title(f"{chart.label}: {what}" + (f"\n{'; '.join(detail)}" if detail else ""))


@dataclass(frozen=True)
class _Curve:
    """One series' points: sizes, the central value, the p10-p90 band and the tail (p99),
    all in the unit drawn (ns for latency, B/s for bandwidth); a band or tail point is None
    where the row has no sketch / no p99."""

    x: list[int]
    mid: list[float]
    low: list[float | None]
    high: list[float | None]
    tail: list[float | None]


def _curve(series: _Series, bandwidth: bool) -> _Curve:
    x: list[int] = []
    mid: list[float] = []
    low: list[float | None] = []
    high: list[float | None] = []
    tail: list[float | None] = []
    for row in sorted(series.rows, key=lambda r: r.size_bytes or 0):
        metric = "throughput_MBps" if bandwidth else "p50_us"
        if not row.size_bytes or row.metrics.get(metric, 0) <= 0:
            continue
        q10, q90 = row.quantile_ns(0.1), row.quantile_ns(0.9)
        p99_ns = row.metrics.get("p99_us", 0.0) * 1e3 or None
        x.append(row.size_bytes)
        if bandwidth:
            # The per-tensor rate of the 10% fastest and the 10% slowest tensors, and of the
            # slowest 1% (size over its p99 time), beside the run's throughput.
            mid.append(row.metrics[metric] * 1e6)
            low.append(row.size_bytes * 1e9 / q90 if q90 else None)
            high.append(row.size_bytes * 1e9 / q10 if q10 else None)
            tail.append(row.size_bytes * 1e9 / p99_ns if p99_ns else None)
        else:
            mid.append(row.metrics[metric] * 1e3)
            low.append(q10)
            high.append(q90)
            tail.append(p99_ns)
    return _Curve(x, mid, low, high, tail)


def _draw_sizes(fig: Figure, chart: _Chart, colours: Mapping[str, str]) -> None:
    """Latency or bandwidth against message size: per series the p50 (throughput) line, a
    shaded p10-p90 band from the sketch, the p99 as its own dashed line; a transport floor on
    the same axes, dotted, in its fabric's colour."""
    bandwidth = chart.kind == "bandwidth"
    ax = fig.add_subplot()
    values: list[float] = []
    for series in chart.series:
        curve = _curve(series, bandwidth)
        if not curve.x:
            continue
        colour = colours[series.fabric]
        who = f"{series.name}, {series.engine}"
        centre = "throughput" if bandwidth else "p50"
        if series.floor:
            ax.plot(curve.x, curve.mid, ":", color=colour, marker="s", markersize=3,
                    alpha=0.8, label=f"{who}: {centre}")  # fmt: skip
            values += curve.mid
            continue
        ax.plot(curve.x, curve.mid, "-", color=colour, marker="o", markersize=4,
                label=f"{who}: {centre}")  # fmt: skip
        band = [(x, lo, hi) for x, lo, hi in zip(curve.x, curve.low, curve.high, strict=True)
                if lo is not None and hi is not None]  # fmt: skip
        if band:
            ax.fill_between([b[0] for b in band], [b[1] for b in band], [b[2] for b in band],
                            color=colour, alpha=0.18, linewidth=0,
                            label=f"{who}: p10-p90 of each operation")  # fmt: skip
            values += [b[1] for b in band] + [b[2] for b in band]
        tail = [(x, t) for x, t in zip(curve.x, curve.tail, strict=True) if t is not None]
        if tail:
            ax.plot([t[0] for t in tail], [t[1] for t in tail], "--", color=colour,
                    marker="v", markersize=3, label=f"{who}: p99")  # fmt: skip
            values += [t[1] for t in tail]
        values += curve.mid
    if bandwidth:
        _log_y(ax, values, format_rate)
        ax.set_ylabel("throughput (p99: rate of the slowest 1% of tensors)")
        _title(ax, "bandwidth vs message size", chart)
    else:
        _log_y(ax, values, format_duration)
        ax.set_ylabel("round-trip time")
        _title(ax, "latency vs message size", chart)
    _size_axis(ax, (r for s in chart.series for r in s.rows))
    ax.grid(True, which="major", alpha=0.35)
    ax.grid(True, which="minor", alpha=0.12)
    # Below the axes, not over the curves it explains.
    fig.legend(fontsize="x-small", loc="outside lower center", ncols=2)


def _topology_text(topology: str) -> str:
    match = _TOPOLOGY.match(topology)
    if match is None:
        return topology
    ps, workers, sharding = match.groups()
    return f"{ps} PS, {workers} worker{'' if workers == '1' else 's'}\n{sharding}"


def _ps_categories(chart: _Chart) -> Callable[[Row], tuple[str, ...]]:
    """How a PS chart tells its bars apart: payload and topology, and the test function
    where two tests measured the same payload and topology on one fabric."""
    seen: dict[tuple[str, str, str], str] = {}
    clash = False
    for series in chart.series:
        for row in series.rows:
            test = without_params(row.test, row.fabric)
            clash = clash or seen.setdefault((row.fabric, row.key, row.topology), test) != test
    if clash:
        return lambda r: (r.key, r.topology, _short(without_params(r.test, r.fabric)))
    return lambda r: (r.key, r.topology)


#: Histogram bins of a step-time plot: log-spaced over the sketched range.
HISTOGRAM_BINS = 40

#: Tick steps within a decade, densest first; each set's closest two ticks, in decades.
_TICK_STEPS = ((1.0, 2.0, 3.0, 5.0, 7.0), (1.0, 2.0, 5.0), (1.0, 3.0), (1.0,))
#: The share of a histogram's axis one tick label takes ("7.00ms" at the default size, with a
#: gap: about 60 of the 400 px the narrower of a PS plot's two panels gives its axis at least).
LABEL_SHARE = 0.15


def log_ticks(low: float, high: float, label_share: float = LABEL_SHARE) -> list[float]:
    """Tick values for a log axis from ``low`` to ``high`` (> 0) whose labels cannot overlap: the
    densest 1-2-3-5-7, 1-2-5, 1-3 or decade steps whose closest two ticks are at least
    ``label_share`` of the axis apart (every n-th decade when even decades are too close);
    on an axis narrower than those steps allow two ticks on, three ticks evenly spaced in log
    and rounded to two significant digits (more where two would make them equal). Always at
    least two values, in order.

    :raises ValueError: ``low`` or ``high`` not positive and finite, or ``high <= low``.
    """
    if not (0 < low < high and math.isfinite(high)):
        raise ValueError(f"a log axis needs 0 < low < high, got {low!r} and {high!r}")
    span = math.log10(high / low)
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    for steps in _TICK_STEPS:
        marks = [*steps, 10.0]
        closest = min(math.log10(b / a) for a, b in itertools.pairwise(marks))
        if closest < label_share * span:
            continue
        ticks = [s * 10.0**k for k in range(first, last + 1) for s in steps]
        inside = [t for t in ticks if low <= t <= high]
        if len(inside) >= 2:
            return inside
    every = max(1, math.ceil(label_share * span))
    decades = [10.0**k for k in range(first, last + 1) if k % every == 0]
    inside = [t for t in decades if low <= t <= high]
    if len(inside) >= 2:
        return inside
    even = [low * (high / low) ** (i / 4) for i in (1, 2, 3)]
    for digits in range(2, 17):
        rounded = sorted({float(f"{t:.{digits}g}") for t in even})
        if len(rounded) == len(even):
            break
    return rounded


def _draw_histograms(ax: Axes, chart: _Chart, colours: Mapping[str, str], step: bool) -> None:
    """Step-time (RPC-time) histograms from the sketches the properties hold (bounded: a
    sketch keeps ~1% relative buckets, not every sample), one outline per fabric and
    category, on a log time axis."""
    import numpy as np
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    category_of = _ps_categories(chart)
    sketches: list[tuple[str, str, Sketch]] = []
    for series in chart.series:
        for row in sorted(series.rows, key=category_of):
            sketch = row.sketch
            if sketch is not None and sketch.count:
                name = " ".join(c.replace("\n", " ") for c in category_of(row))
                sketches.append((series.fabric, f"{series.name}: {name}", sketch))
    if not sketches:
        ax.set_axis_off()
        ax.text(0.5, 0.5, "no sketches recorded: no histogram", ha="center", va="center")
        return
    low = min(float(s.values().min()) for _, _, s in sketches)
    high = max(float(s.values().max()) for _, _, s in sketches)
    edges = np.geomspace(low / 1.05, high * 1.05, HISTOGRAM_BINS + 1)
    styles = ("-", "--", ":", "-.")
    for i, (fabric, name, sketch) in enumerate(sketches):
        counts, _ = np.histogram(sketch.values(), bins=edges, weights=sketch.weights())
        ax.stairs(counts, edges, color=colours[fabric], linestyle=styles[i % len(styles)],
                  label=f"{name} (n={sketch.count})")  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlim(edges[0], edges[-1])
    ax.xaxis.set_major_locator(FixedLocator(log_ticks(float(edges[0]), float(edges[-1]))))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: format_duration(v)))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("step time" if step else "RPC time")
    ax.set_ylabel("count")
    ax.legend(fontsize="x-small")
    ax.grid(True, alpha=0.3)


def _draw_ps(fig: Figure, chart: _Chart, colours: Mapping[str, str]) -> None:
    from matplotlib.ticker import FuncFormatter

    step = any("step_p50_us" in r.metrics for s in chart.series for r in s.rows)
    low, high = ("step_p50_us", "step_p99_us") if step else ("p50_us", "p99_us")
    category_of = _ps_categories(chart)
    categories = sorted({category_of(r) for s in chart.series for r in s.rows})
    ax, hist = fig.subplots(1, 2, width_ratios=(1.1, 1))
    width = 0.8 / (2 * len(chart.series))
    values: list[float] = []
    for i, series in enumerate(chart.series):
        by_category = {category_of(r): r for r in series.rows}
        for j, (metric, hatch, alpha) in enumerate(((low, "", 1.0), (high, "//", 0.45))):
            xs, heights = [], []
            for c, category in enumerate(categories):
                found = by_category.get(category)
                if found is not None and metric in found.metrics:
                    xs.append(c - 0.4 + width * (2 * i + j + 0.5))
                    heights.append(found.metrics[metric] * 1e3)  # to ns, for format_duration
            values += heights
            quantile = metric.removeprefix("step_").split("_")[0]
            ax.bar(
                xs,
                heights,
                width,
                color=colours[series.fabric],
                alpha=alpha,
                hatch=hatch,
                edgecolor=colours[series.fabric],
                label=f"{series.name}, {series.engine}: {quantile}",
            )
    positive = [v for v in values if v > 0]
    if positive and max(positive) / min(positive) > 50:
        _log_y(ax, positive, format_duration)
    else:
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: format_duration(v)))
    ax.set_xticks(range(len(categories)))
    ax.set_xticklabels(["\n".join((c[0], _topology_text(c[1]), *c[2:])) for c in categories],
                       fontsize="x-small")  # fmt: skip
    what = "step time" if step else "RPC latency"
    ax.set_ylabel(f"{what} (p50 solid, p99 hatched)")
    ax.grid(True, axis="y", alpha=0.3)
    fig.legend(fontsize="x-small", loc="outside lower center", ncols=4)
    _draw_histograms(hist, chart, colours, step)
    fig.suptitle(f"{chart.label}: {what} per payload and topology, and its distribution")


_DRAW = {"latency": _draw_sizes, "bandwidth": _draw_sizes, "ps": _draw_ps}


def draw(source: PropertySource) -> list[tuple[str, Figure]]:
    """Every plot that ``source``'s figures allow, as ``(file name, matplotlib Figure)``
    pairs on Agg canvases, not yet saved. Raises :class:`PlotUnavailableError` when
    matplotlib cannot be imported."""
    available, why = plot_available()
    if not available:
        raise PlotUnavailableError(why)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    charts = _charts(measurement_rows(source))
    colours = _colours(charts)
    out = []
    for chart, name in zip(charts, _file_names(charts), strict=True):
        wide = chart.kind == "ps"  # bars beside the step-time histogram
        fig = Figure(figsize=(12 if wide else 8, 5), dpi=110, layout="constrained")
        FigureCanvasAgg(fig)
        _DRAW[chart.kind](fig, chart, colours)
        out.append((name, fig))
    return out


def write_plots(source: PropertySource, directory: str | os.PathLike[str]) -> list[Path]:
    """Draw every plot that ``source``'s figures allow into ``directory`` (made if missing).

    Each PNG is written atomically. Returns the files written, in drawing order; an empty
    list, and no directory made, when ``source`` holds no figures to plot. Raises
    :class:`PlotUnavailableError` when matplotlib cannot be imported.
    """
    figures = draw(source)
    if not figures:
        return []
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fig in figures:
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
        written.append(atomic_write(target / name, buffer.getvalue()))
    return written
