"""Each figure's trend over a series of runs, with its change points.

A series is one figure (test, fabric, benchmark label, size, metric) over runs in order; a
run's value is the median of its rounds when it measured in rounds, else its recorded
figure. Change points are found by :mod:`pytest_tfgrpc.stats.changepoints` (PELT from
ruptures, the ``history`` extra, on log values, with a significance level and a minimum
relative change): a change point is the first run of a new level, with the levels on either
side.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_tfgrpc.metrics import GATED
from pytest_tfgrpc.report.junit import Baseline
from pytest_tfgrpc.report.record import Key
from pytest_tfgrpc.report.tolerance import DEFAULT_METRICS, tolerance_for
from pytest_tfgrpc.stats.changepoints import MIN_RUNS, Shift, change_points

__all__ = [
    "DEFAULT_ALPHA",
    "MIN_RUNS",
    "HistoryUnavailableError",
    "Trend",
    "format_trends",
    "plot_trends",
    "trends",
]

#: The chance that unchanged runs show a change point, Otava's default p-value.
DEFAULT_ALPHA = 0.001


class HistoryUnavailableError(RuntimeError):
    """The plotting library (the ``plot`` extra) is not installed."""


@dataclass(frozen=True)
class Trend:
    """One figure over the runs: ``values`` per run (NaN where a run lacks it), in the
    metric's base unit, and its change points (``Shift.index`` counts all runs)."""

    key: Key
    metric: str
    sources: tuple[str, ...]
    values: tuple[float, ...]
    change_points: tuple[Shift, ...]

    def describe(self) -> str:
        return f"{self.key.describe()} {self.metric}"


def _value(run: Baseline, key: Key, metric: str) -> float:
    measurement = run.measurements.get(key)
    if measurement is None:
        return math.nan
    rounds = measurement.rounds.get(metric)
    if rounds and len(rounds) > 1:
        return float(statistics.median(rounds))
    return float(measurement.figures.get(metric, math.nan))


def _detect(values: Sequence[float], alpha: float, min_change: float) -> tuple[Shift, ...]:
    present = [(i, v) for i, v in enumerate(values) if math.isfinite(v) and v > 0.0]
    found = change_points([v for _, v in present], alpha=alpha, min_change=min_change)
    return tuple(Shift(present[s.index][0], s.before, s.after) for s in found)


def trends(
    runs: Sequence[Baseline],
    metrics: Sequence[str] = DEFAULT_METRICS,
    *,
    alpha: float = DEFAULT_ALPHA,
    min_changes: Mapping[str, float] | None = None,
) -> list[Trend]:
    """The trend of every ``metrics`` figure any of ``runs`` (oldest first) recorded. A change
    point is one of :func:`~pytest_tfgrpc.stats.changepoints.change_points` at ``alpha``,
    at least the metric's tolerance in ``min_changes`` (parsed as ``--tfgrpc-max-regression``;
    10 % by default) either way. Raises
    :class:`~pytest_tfgrpc.stats.changepoints.ChangePointsUnavailableError` without the
    ``history`` extra, ValueError for an unknown metric or an ``alpha`` outside (0, 1)."""
    unknown = [m for m in metrics if m not in GATED]
    if unknown:
        raise ValueError(f"metric {unknown[0]!r} is not gated; gated are {', '.join(GATED)}")
    keys = sorted(set().union(*(run.measurements for run in runs)), key=Key.order)
    out = []
    sources = tuple(run.source for run in runs)
    for key in keys:
        for metric in metrics:
            values = tuple(_value(run, key, metric) for run in runs)
            if not any(math.isfinite(v) for v in values):
                continue
            least = tolerance_for(min_changes or {}, metric)
            out.append(Trend(key, metric, sources, values, _detect(values, alpha, least)))
    return out


def format_trends(found: Sequence[Trend]) -> list[str]:
    """Per figure: first, last, lowest and highest value, and each change point with the run
    it starts at."""
    lines = []
    for trend in found:
        unit = GATED[trend.metric].unit
        present = [v for v in trend.values if math.isfinite(v)]
        lines.append(
            f"{trend.describe()}: {len(present)} runs, first {unit.format(present[0])}, last "
            f"{unit.format(present[-1])}, range {unit.format(min(present))}.."
            f"{unit.format(max(present))}; "
            f"{len(trend.change_points) or 'no'} change point"
            f"{'' if len(trend.change_points) == 1 else 's'}"
            + (f" (too short: needs {MIN_RUNS} runs)" if len(present) < MIN_RUNS else "")
        )
        for point in trend.change_points:
            lines.append(
                f"  change point at run {point.index + 1} ({trend.sources[point.index]}): "
                f"{point.change:+.1%} ({unit.format(point.before)} -> {unit.format(point.after)})"
            )
    return lines


def plot_trends(found: Sequence[Trend], directory: str | Path) -> list[Path]:
    """A PNG per figure (needs the ``plot`` extra): the values over runs, each change point
    a vertical line. Returns the files written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError:
        raise HistoryUnavailableError(
            "plots need matplotlib: pip install -e '.[plot]' in the checkout"
        ) from None
    out_dir = Path(directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for trend in found:
        unit = GATED[trend.metric].unit
        figure, axes = plt.subplots(figsize=(8, 3.5))
        try:
            runs = list(range(1, len(trend.values) + 1))
            axes.plot(runs, trend.values, marker="o", linewidth=1)
            for point in trend.change_points:
                axes.axvline(point.index + 0.5, color="red", linestyle="--", linewidth=1)
                axes.annotate(
                    f"{point.change:+.0%}",
                    (point.index + 1, trend.values[point.index]),
                    color="red",
                )
            axes.set_xlabel("run")
            # Ticks in the figure's unit (us, MB/s), not its base unit with an offset.
            axes.yaxis.set_major_formatter(FuncFormatter(lambda v, _, u=unit: u.format(v)))
            axes.set_ylabel(trend.metric)
            axes.set_title(trend.describe(), fontsize=8)
            name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{trend.describe()}")[:150] + ".png"
            path = out_dir / name
            figure.savefig(path, dpi=80, bbox_inches="tight")  # labels never clipped
            written.append(path)
        finally:
            plt.close(figure)
    return written
