"""Baseline verdicts: say per figure whether a run regressed against an earlier one, and
tabulate it.

A comparison of one figure has four outcomes (:class:`Outcome`). A **regression** is a change
for the worse that is both larger than the metric's tolerance and statistically significant at
level ``alpha``; an **improvement** is the same for the better. A change within the tolerance
**passes**, significant or not. A change beyond the tolerance that is not significant, or too
few samples to test at all, is **inconclusive**. How each figure is tested is the registry's
(:class:`~pytest_tfgrpc.report.metrics.GateTest`), on the sketched samples:

- central figures (``p50``, ``mean``, ``step_p50``, ``step_mean``) and rates (``throughput``,
  ``throughput_p50``, ``rpc_rate``, ``step_rate``): the Mann-Whitney U test
  (:func:`~pytest_tfgrpc.stats.significance.mann_whitney_u_sketches`). A rate is work over the
  same duration samples, so it is tested on them with the direction reversed.
- tail quantiles (``p90``, ``p99``, ``p999``, ``step_p90``, ``step_p99``): a bootstrap
  confidence interval of the quantile ratio
  (:func:`~pytest_tfgrpc.stats.significance.bootstrap_quantile_ratio`).
- ``imbalance``, the placement's, is fixed by the run, not sampled: any change beyond the
  tolerance counts.

``min`` and ``max`` are not gated: a single extreme sample has no sampling distribution worth
testing. The runs are read by :mod:`pytest_tfgrpc.report.junit`, the tolerances by
:mod:`pytest_tfgrpc.report.tolerance`, setup mismatches checked by
:mod:`pytest_tfgrpc.report.setup_check`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

from pytest_tfgrpc.report.junit import Baseline, Key, Measurement, measurements_from_properties
from pytest_tfgrpc.report.metrics import GATED, GateTest
from pytest_tfgrpc.report.properties import PREFIX, SKETCH
from pytest_tfgrpc.report.setup_check import Mismatch, check_metadata
from pytest_tfgrpc.report.tolerance import gated_metrics, tolerance_for
from pytest_tfgrpc.stats import significance
from pytest_tfgrpc.stats.significance import (
    DEFAULT_ALPHA,
    DEFAULT_RESAMPLES,
    bootstrap_quantile_ratio,
    mann_whitney_u_sketches,
)

__all__ = [
    "Comparison",
    "Outcome",
    "Verdict",
    "compare_figure",
    "compare_runs",
    "compare_test",
    "format_comparison",
    "min_samples",
    "verdict_properties",
]


def min_samples(metric: str) -> int:
    """Samples each run needs for a verdict on ``metric`` (0 for a figure no test samples)."""
    gated = GATED[metric]
    if gated.gate is GateTest.RATIO:
        return 0
    quantile = gated.quantile if gated.gate is GateTest.BOOTSTRAP else None
    return significance.min_samples(quantile)


class Outcome(str, Enum):
    """What a comparison of one figure concluded."""

    PASS = "pass"
    REGRESSION = "regression"
    IMPROVEMENT = "improvement"
    INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True)
class Verdict:
    """The outcome of one figure's comparison, with the numbers behind it.

    ``baseline`` and ``current`` are in the metric's base unit (``unit``: ns or B/s); ``change``
    is ``current / baseline - 1`` (NaN when undefined). ``method`` names the test
    (``mann-whitney-u`` or ``bootstrap``, empty when none ran); ``p_value`` is the U test's,
    ``ci`` the bootstrap interval of the relative change at level ``1 - alpha``. ``reason`` is
    one line for people.
    """

    key: Key
    metric: str
    outcome: Outcome
    baseline: float
    current: float
    change: float
    tolerance: float
    unit: str
    baseline_samples: int
    current_samples: int
    reason: str
    method: str = ""
    p_value: float | None = None
    ci: tuple[float, float] | None = None
    alpha: float = DEFAULT_ALPHA


def _pct(x: float) -> str:
    return f"{x:+.1%}" if math.isfinite(x) else "n/a"


def _figure(measurement: Measurement, metric: str) -> float | None:
    return measurement.figures.get(metric)


def compare_figure(
    baseline: Measurement,
    current: Measurement,
    metric: str,
    tolerance: float,
    *,
    alpha: float = DEFAULT_ALPHA,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> Verdict:
    """Compare one figure of one test, fabric, label and size between two runs.

    The change is taken from the recorded figures; its significance from the sketches, by
    the test the registry names for the metric (see the module docstring). Regression: worse
    by more than ``tolerance`` and significant at ``alpha``; improvement: the same for the
    better. Inconclusive: no sketch, too few samples (:func:`min_samples`), a figure missing,
    NaN or zero, or a change beyond the tolerance that is not significant. A figure the run
    fixes (``imbalance``) needs no sketch: any change beyond the tolerance counts.
    """
    if metric not in GATED:
        raise ValueError(f"metric {metric!r} is not gated; gated are {', '.join(GATED)}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be between 0 and 1 (exclusive), got {alpha!r}")
    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise ValueError(f"a tolerance must be a finite fraction >= 0, got {tolerance!r}")
    gated = GATED[metric]
    old, new = _figure(baseline, metric), _figure(current, metric)
    base_value = old if old is not None else math.nan
    cur_value = new if new is not None else math.nan
    change = cur_value / base_value - 1.0 if base_value else math.nan

    p_value: float | None = None
    ci: tuple[float, float] | None = None
    method = ""

    def verdict(outcome: Outcome, reason: str) -> Verdict:
        return Verdict(
            key=current.key,
            metric=metric,
            outcome=outcome,
            baseline=base_value,
            current=cur_value,
            change=change,
            tolerance=tolerance,
            unit=gated.unit.base,
            baseline_samples=baseline.samples,
            current_samples=current.samples,
            reason=f"{metric}: {reason}",
            method=method,
            p_value=p_value,
            ci=ci,
            alpha=alpha,
        )

    inconclusive = Outcome.INCONCLUSIVE
    for name, value in (("baseline", old), ("current run", new)):
        if value is None:
            return verdict(inconclusive, f"the {name} has no {metric} figure")
        if not math.isfinite(value):
            return verdict(inconclusive, f"the {name}'s {metric} is {value}")
    if not base_value:
        return verdict(inconclusive, f"the baseline's {metric} is 0: no relative change")
    worse = -change if gated.higher_is_better else change
    limit = f"{_percent(tolerance)} tolerance"
    if gated.gate is GateTest.RATIO:
        # A figure the run fixes (a placement's imbalance): any change is real.
        method = "ratio"
        if worse > tolerance:
            return verdict(Outcome.REGRESSION, f"{_pct(change)} is worse than the {limit}")
        if -worse > tolerance:
            return verdict(Outcome.IMPROVEMENT, f"{_pct(change)} is better than the {limit}")
        return verdict(Outcome.PASS, f"{_pct(change)} is within the {limit}")
    for name, m in (("baseline", baseline), ("current run", current)):
        if m.sketch is None:
            return verdict(
                inconclusive,
                f"the {name} has no sketch of its samples to test significance "
                f"(property {PREFIX}{m.key.label}.{m.key.size}.{SKETCH})",
            )
    assert baseline.sketch is not None and current.sketch is not None
    needed = min_samples(metric)
    for name, m in (("baseline", baseline), ("current run", current)):
        if m.samples < needed:
            what = "a Mann-Whitney U test" if gated.gate is GateTest.U else f"resolving {metric}"
            return verdict(
                inconclusive,
                f"{_pct(change)}, but the {name} has {m.samples} samples: {what} needs >= {needed}",
            )
    # `direction` is +1 when the test finds the current run significantly worse, -1 better, and
    # 0 not significant; durations that grew are worse for every metric (throughput is size
    # over duration).
    if gated.gate is GateTest.U:
        test = mann_whitney_u_sketches(current.sketch, baseline.sketch)
        method, p_value = "mann-whitney-u", test.p_value
        direction = (1 if test.x_larger else -1) if test.p_value < alpha else 0
        evidence = f"Mann-Whitney U p={test.p_value:.2g}"
    else:
        assert gated.quantile is not None  # the registry bootstraps quantiles only
        low, high = bootstrap_quantile_ratio(
            baseline.sketch,
            current.sketch,
            gated.quantile,
            confidence=1.0 - alpha,
            resamples=resamples,
            seed=seed,
        )
        method = "bootstrap"
        if not (math.isfinite(low) and math.isfinite(high)):
            return verdict(inconclusive, "the bootstrap is undefined (a resampled value of 0)")
        ci = (low - 1.0, high - 1.0)
        direction = 1 if low > 1.0 else -1 if high < 1.0 else 0
        evidence = f"bootstrap {1 - alpha:.0%} CI [{_pct(ci[0])}, {_pct(ci[1])}]"
    moved = _pct(change)
    # Positive `worse` is a change for the worse, whichever way the metric runs.
    if abs(worse) > tolerance:
        bad = worse > 0
        if direction == (1 if bad else -1):
            outcome = Outcome.REGRESSION if bad else Outcome.IMPROVEMENT
            side = "worse" if bad else "better"
            return verdict(outcome, f"{moved} is {side} than the {limit}, significant ({evidence})")
        if direction == 0 and not bad:
            return verdict(Outcome.PASS, f"{moved} is better but not significantly ({evidence})")
        why = "is not significant" if direction == 0 else "the test finds the opposite"
        return verdict(inconclusive, f"{moved} is beyond the {limit} but {why} ({evidence})")
    significance = "significant" if direction else "not significant"
    return verdict(Outcome.PASS, f"{moved} is within the {limit} ({significance}: {evidence})")


def _percent(fraction: float) -> str:
    """A tolerance as written: 10%, 2.5%."""
    return f"{fraction * 100:g}%"


@dataclass(frozen=True)
class Comparison:
    """A whole run against its baseline: a verdict per test, fabric, label, size and metric;
    the measurements only the baseline has (``missing``) or only the current run (``new``);
    and how the two setups differ (``mismatches``)."""

    verdicts: tuple[Verdict, ...]
    missing: tuple[Key, ...] = ()
    new: tuple[Key, ...] = ()
    mismatches: tuple[Mismatch, ...] = ()

    def with_outcome(self, outcome: Outcome) -> tuple[Verdict, ...]:
        return tuple(v for v in self.verdicts if v.outcome is outcome)

    @property
    def regressions(self) -> tuple[Verdict, ...]:
        return self.with_outcome(Outcome.REGRESSION)

    @property
    def improvements(self) -> tuple[Verdict, ...]:
        return self.with_outcome(Outcome.IMPROVEMENT)

    @property
    def inconclusive(self) -> tuple[Verdict, ...]:
        return self.with_outcome(Outcome.INCONCLUSIVE)

    def summary(self) -> str:
        """One line: how many of each outcome, missing, new, mismatches."""
        words = {
            Outcome.PASS: "passed",
            Outcome.REGRESSION: "regressed",
            Outcome.IMPROVEMENT: "improved",
            Outcome.INCONCLUSIVE: "inconclusive",
        }
        counts = ", ".join(f"{len(self.with_outcome(o))} {words[o]}" for o in Outcome)
        mismatches = len(self.mismatches)
        return (
            f"{counts}; {len(self.missing)} missing, {len(self.new)} new; {mismatches} setup "
            f"{'mismatch' if mismatches == 1 else 'mismatches'}"
        )


def _compare_measurements(
    old: Mapping[Key, Measurement],
    new: Mapping[Key, Measurement],
    tolerances: Mapping[str, float],
    alpha: float,
    resamples: int,
    seed: int,
) -> tuple[list[Verdict], list[Mismatch]]:
    verdicts: list[Verdict] = []
    mismatches: list[Mismatch] = []
    metrics = gated_metrics(tolerances)
    for key in sorted(old.keys() & new.keys(), key=Key.order):
        base, cur = old[key], new[key]
        for attribute in ("rpc", "mode"):
            was, now = getattr(base, attribute), getattr(cur, attribute)
            if was and now and was != now:
                what = f"{key.test} {key.label}.{attribute}"
                if not any(m.what == what for m in mismatches):
                    mismatches.append(Mismatch(what, was, now))
        for metric in metrics:
            if metric not in base.figures and metric not in cur.figures:
                continue
            verdicts.append(
                compare_figure(
                    base,
                    cur,
                    metric,
                    tolerance_for(tolerances, metric),
                    alpha=alpha,
                    resamples=resamples,
                    seed=seed,
                )
            )
    return verdicts, mismatches


def compare_runs(
    baseline: Baseline,
    current: Baseline,
    tolerances: Mapping[str, float],
    *,
    alpha: float = DEFAULT_ALPHA,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> Comparison:
    """Compare every figure of every measurement both runs have (see :func:`compare_figure`;
    the metrics are :func:`gated_metrics`), and list what only one run has and how the setups
    differ (:func:`check_metadata`, and a label measured with another rpc or mode)."""
    verdicts, mismatches = _compare_measurements(
        baseline.measurements, current.measurements, tolerances, alpha, resamples, seed
    )
    setup = check_metadata(baseline, current.setup(), current.fabrics)
    return Comparison(
        tuple(verdicts),
        tuple(sorted(baseline.measurements.keys() - current.measurements.keys(), key=Key.order)),
        tuple(sorted(current.measurements.keys() - baseline.measurements.keys(), key=Key.order)),
        (*setup, *mismatches),
    )


def compare_test(
    baseline: Baseline,
    test: str,
    properties: Iterable[tuple[str, object]],
    tolerances: Mapping[str, float],
    *,
    alpha: float = DEFAULT_ALPHA,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> Comparison:
    """Compare one finished test, from its properties, with its baseline measurements
    (``test`` is its JUnit id, :func:`junit_test_id`). ``missing`` lists what the baseline
    measured for this test and the test no longer did; ``new`` what has no baseline.
    Setup mismatches are the caller's to check once per run (:func:`check_metadata`)."""
    current = measurements_from_properties(test, properties)
    old = baseline.for_test(test)
    verdicts, mismatches = _compare_measurements(old, current, tolerances, alpha, resamples, seed)
    return Comparison(
        tuple(verdicts),
        tuple(sorted(old.keys() - current.keys(), key=Key.order)),
        tuple(sorted(current.keys() - old.keys(), key=Key.order)),
        tuple(mismatches),
    )


def verdict_properties(comparison: Comparison) -> list[tuple[str, str]]:
    """JUnit properties of a test's verdicts: ``tfgrpc.<label>.<size>.<metric>.verdict`` (the
    outcome: pass, regression, improvement or inconclusive), ``...<metric>.verdict_reason``
    (its one-line reason) and ``...<metric>.change`` (current / baseline - 1, when defined);
    and ``tfgrpc.<label>.<size>.verdict`` = ``no baseline`` for each measurement the baseline
    lacks."""
    out = []
    for v in comparison.verdicts:
        name = f"{PREFIX}{v.key.label}.{v.key.size}.{v.metric}"
        out.append((f"{name}.verdict", v.outcome.value))
        out.append((f"{name}.verdict_reason", v.reason))
        if math.isfinite(v.change):
            out.append((f"{name}.change", repr(v.change)))
    for key in comparison.new:
        out.append((f"{PREFIX}{key.label}.{key.size}.verdict", "no baseline"))
    return out


def _format_value(value: float, metric: str) -> str:
    if not math.isfinite(value):
        return "-"
    return GATED[metric].unit.format(value)


def format_comparison(comparison: Comparison, *, reasons: bool = True) -> list[str]:
    """An aligned table (test, benchmark, fabric, size, metric, baseline, current, change,
    verdict), then, with ``reasons``, one line per verdict other than pass saying why, the
    measurements only one run has, and the setup mismatches."""
    header = (
        "test", "benchmark", "fabric", "size", "metric", "baseline", "current", "change", "verdict"
    )  # fmt: skip
    table = [header]
    for v in comparison.verdicts:
        table.append(
            (
                v.key.test,
                v.key.label,
                v.key.fabric or "-",
                v.key.size,
                v.metric,
                _format_value(v.baseline, v.metric),
                _format_value(v.current, v.metric),
                _pct(v.change) if math.isfinite(v.change) else "-",
                v.outcome.value.upper() if v.outcome is Outcome.REGRESSION else v.outcome.value,
            )
        )
    lines = []
    if comparison.verdicts:
        widths = [max(len(row[i]) for row in table) for i in range(len(header))]
        for row in table:
            cells = [c.ljust(w) for c, w in zip(row[:5], widths[:5], strict=True)]
            cells += [c.rjust(w) for c, w in zip(row[5:8], widths[5:8], strict=True)]
            cells.append(row[8])
            lines.append("  ".join(cells).rstrip())
    else:
        lines.append("no figure in common to compare")
    if not reasons:
        return lines
    for v in comparison.verdicts:
        if v.outcome is not Outcome.PASS:
            lines.append(f"{v.outcome.value}: {v.key.describe()} {v.reason}")
    for key in comparison.missing:
        lines.append(f"missing: {key.describe()} is in the baseline, not in the current run")
    for key in comparison.new:
        lines.append(f"new: {key.describe()} has no baseline")
    for mismatch in comparison.mismatches:
        lines.append(f"setup mismatch: {mismatch.describe()}")
    return lines
