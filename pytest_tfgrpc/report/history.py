"""Each figure's trend over a series of runs, with its change points.

A series is one figure (test, fabric, benchmark label, size, metric) over runs in order; a
run's value is the median of its rounds when it measured in rounds, else its recorded
figure. Change points are found by Apache Otava (the Hunter / E-divisive means detector that
MongoDB and DataStax gate on; the ``history`` extra), not by home-made code: a change point is
the first run of a new level, with the change of the mean and its p-value.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_tfgrpc.metrics import GATED
from pytest_tfgrpc.report.junit import Baseline
from pytest_tfgrpc.report.record import Key
from pytest_tfgrpc.report.tolerance import DEFAULT_METRICS

__all__ = [
    "ChangePoint",
    "HistoryUnavailableError",
    "Trend",
    "format_trends",
    "plot_trends",
    "trends",
]

#: Otava's defaults for its significance test and window.
DEFAULT_MAX_PVALUE = 0.001
DEFAULT_WINDOW = 30


class HistoryUnavailableError(RuntimeError):
    """The change-point library (the ``history`` extra) is not installed."""


@dataclass(frozen=True)
class ChangePoint:
    """A run at which a figure's level changed: its index in the series (from 0), the
    relative change of the mean (``0.2`` = +20 %), and the detector's p-value."""

    index: int
    change: float
    p_value: float


@dataclass(frozen=True)
class Trend:
    """One figure over the runs: ``values`` per run (NaN where a run lacks it), in the
    metric's base unit, and its change points."""

    key: Key
    metric: str
    sources: tuple[str, ...]
    values: tuple[float, ...]
    change_points: tuple[ChangePoint, ...]

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


#: The fewest runs in which a figure can show a change point.
MIN_RUNS = 3


def _detect(values: Sequence[float], max_pvalue: float, window: int) -> tuple[ChangePoint, ...]:
    try:
        from otava.analysis import compute_change_points
    except ImportError:
        raise HistoryUnavailableError(
            "change points need Apache Otava: pip install 'pytest-tfgrpc[history]'"
        ) from None
    present = [(i, v) for i, v in enumerate(values) if math.isfinite(v)]
    if len(present) < MIN_RUNS:
        return ()
    found, _ = compute_change_points(
        [v for _, v in present], window_len=window, max_pvalue=max_pvalue
    )
    return tuple(
        ChangePoint(
            present[point.index][0],
            point.stats.forward_change_percent() / 100.0,
            float(point.stats.pvalue),
        )
        for point in found
    )


def trends(
    runs: Sequence[Baseline],
    metrics: Sequence[str] = DEFAULT_METRICS,
    *,
    max_pvalue: float = DEFAULT_MAX_PVALUE,
    window: int = DEFAULT_WINDOW,
) -> list[Trend]:
    """The trend of every ``metrics`` figure any of ``runs`` (oldest first) recorded. Raises
    :class:`HistoryUnavailableError` without the ``history`` extra, ValueError for an unknown
    metric or a p-value outside (0, 1)."""
    unknown = [m for m in metrics if m not in GATED]
    if unknown:
        raise ValueError(f"metric {unknown[0]!r} is not gated; gated are {', '.join(GATED)}")
    if not 0.0 < max_pvalue < 1.0:
        raise ValueError(f"max p-value {max_pvalue!r}: between 0 and 1 (exclusive)")
    keys = sorted(set().union(*(run.measurements for run in runs)), key=Key.order)
    out = []
    sources = tuple(run.source for run in runs)
    for key in keys:
        for metric in metrics:
            values = tuple(_value(run, key, metric) for run in runs)
            if not any(math.isfinite(v) for v in values):
                continue
            found = _detect(values, max_pvalue, window)
            out.append(Trend(key, metric, sources, values, found))
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
                f"{point.change:+.1%} (p={point.p_value:.2g})"
            )
    return lines


def plot_trends(found: Sequence[Trend], directory: str | Path) -> list[Path]:
    """A PNG per figure (needs the ``plot`` extra): the values over runs, each change point
    a vertical line. Returns the files written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise HistoryUnavailableError(
            "plots need matplotlib: pip install 'pytest-tfgrpc[plot]'"
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
            axes.set_ylabel(f"{trend.metric} ({unit.base})")
            axes.set_title(trend.describe(), fontsize=8)
            name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{trend.describe()}")[:150] + ".png"
            path = out_dir / name
            figure.savefig(path, dpi=80)
            written.append(path)
        finally:
            plt.close(figure)
    return written
