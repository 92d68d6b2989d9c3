"""Baseline verdicts: say per figure whether a run regressed against an earlier one, and
tabulate it.

A comparison of one figure has five outcomes (:class:`Outcome`). A **regression** is a change
for the worse that is both larger than the metric's tolerance and statistically significant at
level ``alpha``; an **improvement** is the same for the better. A change within the tolerance
**passes**, significant or not. A change beyond the tolerance that is not significant, or too
few samples to test at all, is **inconclusive**. A zero, negative, NaN or infinite figure is
**invalid**. Every verdict carries the smallest change the test could have detected.

A figure measured in rounds (P2P) is tested across rounds and runs, not samples
(:func:`~pytest_tfgrpc.stats.replicates.replicate_test`; a baseline may be a history of runs).
Otherwise how each figure is tested is the registry's
(:class:`~pytest_tfgrpc.metrics.GateTest`), on the sketched samples:

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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Any

import numpy as np

from pytest_tfgrpc.metrics import GATED, GateTest
from pytest_tfgrpc.report.junit import Baseline
from pytest_tfgrpc.report.record import (
    Key,
    Measurement,
    Outcome,
    TestRecord,
    Verdict,
    sketch_property,
)
from pytest_tfgrpc.report.setup_check import Mismatch, check_metadata, split_by_setup
from pytest_tfgrpc.report.telemetry_text import gate_context
from pytest_tfgrpc.report.tolerance import gated_metrics, tolerance_for
from pytest_tfgrpc.stats import significance
from pytest_tfgrpc.stats.replicates import (
    MIN_HISTORY,
    ReplicateTest,
    history_detectable,
    invalid_values,
    replicate_test,
    run_spread,
    run_test,
)
from pytest_tfgrpc.stats.significance import (
    DEFAULT_ALPHA,
    DEFAULT_RESAMPLES,
    bootstrap_quantile_ratio,
    mann_whitney_u_sketches,
)
from pytest_tfgrpc.stats.sketch import Sketch
from pytest_tfgrpc.units import align_columns

__all__ = [
    "Comparison",
    "blind_history_warnings",
    "compare_figure",
    "compare_runs",
    "compare_test",
    "format_comparison",
    "judge_replicated",
    "min_samples",
    "short_history_warning",
    "typical_run_spread",
]


def short_history_warning(runs: int) -> str:
    """What a baseline of ``runs`` runs cannot tell ("" from :data:`MIN_HISTORY` runs on):
    the spread between runs is then unknown, and verdicts rest on the rounds of one run."""
    if runs >= MIN_HISTORY:
        return ""
    return (
        f"the baseline holds {runs} run{'s' if runs != 1 else ''}: the spread between runs is "
        f"unknown below {MIN_HISTORY} and taken as one round's (figures without rounds are "
        "tested on samples), so a shift between runs can fail unchanged code; keep a history "
        "of 5 or more runs (a directory of their JUnit files): 3 see only large changes"
    )


#: A history is blind to a figure when it can see only changes beyond this many times the
#: figure's tolerance.
BLIND_FACTOR = 2.0


def blind_history_warnings(
    history: Sequence[Baseline],
    tolerances: Mapping[str, float],
    *,
    alpha: float = DEFAULT_ALPHA,
    limit: int = 5,
) -> list[str]:
    """What a history of >= :data:`MIN_HISTORY` runs cannot see, said before the run: one
    line per figure of its most recent run whose detectable change
    (:func:`~pytest_tfgrpc.stats.replicates.history_detectable`, at ``alpha`` over the
    figures its test tests together, as the gate tests them) is more than
    :data:`BLIND_FACTOR` times its tolerance, worst first, at most ``limit`` of them and then
    how many more. The current run's rounds can only make it worse."""
    runs = [run.measurements for run in history]
    if len(runs) < MIN_HISTORY:
        return []
    metrics = [m for m in gated_metrics(tolerances) if GATED[m].gate is not GateTest.RATIO]
    floor = _typical_run_spread(runs, set().union(*(r.keys() for r in runs)), metrics)
    values: dict[tuple[Key, str], tuple[list[float], float]] = {}
    for key in runs[-1]:
        measured = [run[key] for run in runs if key in run]
        for metric in metrics:
            rounds = [m.rounds[metric] for m in measured if len(m.rounds.get(metric, ())) > 1]
            if len(rounds) >= MIN_HISTORY:
                values[(key, metric)] = ([float(np.median(r)) for r in rounds], 0.0)
                continue
            figures = [_figure(m, metric) for m in measured]
            if _across_runs(figures):
                values[(key, metric)] = ([v for v in figures if v is not None], floor)
    family: dict[str, int] = {}
    for key, _ in values:
        family[key.test] = family.get(key.test, 0) + 1
    blind = []
    for (key, metric), (series, spread) in values.items():
        level = alpha / max(family[key.test], 1)
        seen = history_detectable(series, alpha=level, min_spread=spread)
        tolerance = tolerance_for(tolerances, metric)
        if math.isfinite(seen) and seen > BLIND_FACTOR * tolerance:
            blind.append((seen, key, metric, tolerance))
    blind.sort(key=lambda found: (-found[0], found[1].order(), found[2]))
    lines = [
        f"this history can see changes above {seen:.0%} in {key.label}.{key.size}.{metric} "
        f"({key.test}{f' on {key.fabric}' if key.fabric else ''}, {len(runs)} runs); tolerance "
        f"{_percent(tolerance)}: consider tfgrpc-ab or more runs"
        for seen, key, metric, tolerance in blind[:limit]
    ]
    if len(blind) > limit:
        lines.append(
            f"{len(blind) - limit} more figures of this history see only changes above twice "
            "their tolerance"
        )
    return lines


def min_samples(metric: str) -> int:
    """Samples each run needs for a verdict on ``metric`` (0 for a figure no test samples)."""
    gated = GATED[metric]
    if gated.gate is GateTest.RATIO:
        return 0
    quantile = gated.quantile if gated.gate is GateTest.BOOTSTRAP else None
    return significance.min_samples(quantile)


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
    earlier: Sequence[Measurement] = (),
    family: int = 1,
    spread_floor: float = 0.0,
) -> Verdict:
    """Compare one figure of one test, fabric, label and size between two runs.

    When both runs measured the point in rounds (``Measurement.rounds``), the test is across
    rounds or runs, not samples (:func:`~pytest_tfgrpc.stats.replicates.replicate_test`):
    ``earlier`` are older baseline runs' measurements of the same point, whose spread between
    runs the test then uses (``baseline`` is the most recent). A zero, negative, NaN or
    infinite figure or round is :attr:`Outcome.INVALID`. ``family`` is how many figures the
    caller tests together (a test's): the replicate test runs at ``alpha / family``
    (Bonferroni), so that a run of many figures fails unchanged code no more often than
    ``alpha`` says. A figure without rounds is tested across >= 3 runs, its spread between
    runs never taken below ``spread_floor`` (the caller's typical spread of such figures).
    With fewer than :data:`~pytest_tfgrpc.stats.replicates.MIN_HISTORY`
    baseline runs the spread between runs is unknown and taken as one round's. Without
    rounds:

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

    def verdict(outcome: Outcome, reason: str, **found: Any) -> Verdict:
        made = Verdict(
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
            detectable=detectable,
            runs=1 + len(earlier),
        )
        return replace(made, **found) if found else made

    detectable = math.nan
    inconclusive = Outcome.INCONCLUSIVE
    for name, value in (("baseline", old), ("current run", new)):
        if value is None:
            return verdict(inconclusive, f"the {name} has no {metric} figure")
    for name, m in (("baseline", baseline), ("current run", current)):
        why = invalid_figure(m, metric)
        if why:
            return verdict(Outcome.INVALID, f"the {name}'s {why}: not a measurement")
    worse = -change if gated.higher_is_better else change
    limit = f"{_percent(tolerance)} tolerance"
    runs = [m.rounds[metric] for m in (*earlier, baseline) if len(m.rounds.get(metric, ())) > 1]
    if gated.gate is not GateTest.RATIO and len(current.rounds.get(metric, ())) > 1 and runs:
        return judge_replicated(
            verdict,
            lambda a: replicate_test(current.rounds[metric], runs, alpha=a),
            gated.higher_is_better,
            tolerance,
            alpha / max(family, 1),
        )
    history = [_figure(m, metric) for m in (*earlier, baseline)]
    if gated.gate is not GateTest.RATIO and _across_runs(history):
        # No rounds, but runs enough to know their spread: the run is the replicate.
        values = [value for value in history if value is not None]
        return judge_replicated(
            verdict,
            lambda a: run_test(cur_value, values, alpha=a, min_spread=spread_floor),
            gated.higher_is_better,
            tolerance,
            alpha / max(family, 1),
        )
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
                f"(property {sketch_property(m.key)})",
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
        detectable = _sample_detectable(
            baseline.sketch, current.sketch, alpha, rate=gated.higher_is_better
        )
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
        detectable = (high - low) / 2.0
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


def invalid_figure(measurement: Measurement, metric: str) -> str:
    """Why ``measurement``'s ``metric`` (its figure, or a round of it) is no measurement:
    zero, negative, NaN or infinite; "" when it is one. A placement's ``imbalance`` of 0 is
    as invalid as a latency of 0."""
    value = measurement.figures.get(metric)
    if value is not None:
        why = invalid_values((value,))
        if why:
            return f"{metric} is {value:g}" if math.isfinite(value) else f"{metric} is {value}"
    why = invalid_values(measurement.rounds.get(metric, ()))
    return f"{metric} per round: {why}" if why else ""


def _sample_detectable(
    baseline: Sketch, current: Sketch, alpha: float, *, rate: bool = False
) -> float:
    """The smallest median shift the U test would call significant on samples this spread,
    were they independent (they are not quite: consecutive samples correlate): the normal
    approximation of the median's standard error from the inter-quartile range of the logs.
    On the figure's own scale, as its change is: the samples are durations, so for a ``rate``
    (work over those durations) the rate's drop that such a longer duration means
    (+39.2% in time is -28.2% in rate), not the time's growth."""
    spreads = []
    for sketch in (baseline, current):
        q1, q3 = sketch.quantile(0.25), sketch.quantile(0.75)
        if not (q1 > 0 and q3 > 0):
            return math.nan
        spreads.append((math.log(q3) - math.log(q1)) / 1.349)
    se = 1.2533 * math.sqrt(
        spreads[0] ** 2 / max(baseline.count, 1) + spreads[1] ** 2 / max(current.count, 1)
    )
    shift = NormalDist().inv_cdf(1.0 - alpha / 2.0) * se  # on the log of the durations
    return -math.expm1(-shift) if rate else math.expm1(shift)


def _across_runs(history: Sequence[float | None]) -> bool:
    """Whether a figure without rounds is tested across runs: every baseline run has it, and
    there are :data:`MIN_HISTORY` of them or more."""
    return len(history) >= MIN_HISTORY and all(value is not None for value in history)


def judge_replicated(
    verdict: Callable[..., Verdict],
    tested: Callable[[float], ReplicateTest],
    higher_is_better: bool,
    tolerance: float,
    alpha: float,
) -> Verdict:
    """The verdict of a figure tested across replicates (rounds, runs, or the pairs of
    :mod:`pytest_tfgrpc.report.paired`; see :func:`compare_figure`): ``tested(alpha)`` runs
    the test; ``verdict(outcome, reason, **found)`` makes the Verdict."""
    try:
        test = tested(alpha)
    except ValueError as error:
        return verdict(Outcome.INCONCLUSIVE, str(error))
    found = {
        "baseline": test.baseline,
        "current": test.current,
        "change": test.change,
        "detectable": test.detectable,
        "runs": test.runs,
        "method": test.method,
        "p_value": test.p_value,
    }
    worse = -test.change if higher_is_better else test.change
    bad = worse > 0
    limit = f"{_percent(tolerance)} tolerance"
    seen = f"could detect >= {max(tolerance, test.detectable):.1%}"
    rounds = f", {test.rounds} rounds" if test.rounds > 1 else ""
    evidence = f"{test.method}{rounds}, p={test.p_value:.2g}; {seen}"
    moved = _pct(test.change)
    significant = test.direction != 0 and (test.direction > 0) == (test.change > 0)
    if abs(worse) > tolerance and significant:
        outcome = Outcome.REGRESSION if bad else Outcome.IMPROVEMENT
        side = "worse" if bad else "better"
        return verdict(
            outcome, f"{moved} is {side} than the {limit}, significant ({evidence})", **found
        )
    if abs(worse) > tolerance and bad:
        return verdict(
            Outcome.INCONCLUSIVE,
            f"{moved} is beyond the {limit} but within the noise ({evidence})",
            **found,
        )
    what = "within the " + limit if abs(worse) <= tolerance else "better, within the noise"
    return verdict(Outcome.PASS, f"{moved} is {what} ({evidence})", **found)


def _percent(fraction: float) -> str:
    """A tolerance as written: 10%, 2.5%."""
    return f"{fraction * 100:g}%"


@dataclass(frozen=True)
class Comparison:
    """A whole run against its baseline: a verdict per test, fabric, label, size and metric;
    the measurements only the baseline has (``missing``) or only the current run (``new``);
    and how the two setups differ (``mismatches``); ``notes``: how the baseline history was
    used (split by setup)."""

    verdicts: tuple[Verdict, ...]
    missing: tuple[Key, ...] = ()
    new: tuple[Key, ...] = ()
    mismatches: tuple[Mismatch, ...] = ()
    notes: tuple[str, ...] = ()

    def with_outcome(self, outcome: Outcome) -> tuple[Verdict, ...]:
        return tuple(v for v in self.verdicts if v.outcome is outcome)

    @property
    def regressions(self) -> tuple[Verdict, ...]:
        return self.with_outcome(Outcome.REGRESSION)

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
            Outcome.INVALID: "invalid",
        }
        counts = ", ".join(f"{len(self.with_outcome(o))} {words[o]}" for o in Outcome)
        mismatches = len(self.mismatches)
        return (
            f"{counts}; {len(self.missing)} missing, {len(self.new)} new; {mismatches} setup "
            f"{'mismatch' if mismatches == 1 else 'mismatches'}"
        )


def _compare_measurements(
    history: Sequence[Mapping[Key, Measurement]],
    new: Mapping[Key, Measurement],
    tolerances: Mapping[str, float],
    alpha: float,
    resamples: int,
    seed: int,
    floor: float,
) -> tuple[list[Verdict], list[Mismatch]]:
    verdicts: list[Verdict] = []
    mismatches: list[Mismatch] = []
    metrics = gated_metrics(tolerances)
    known = set().union(*(run.keys() for run in history)) if history else set()
    # The figures tested together: a test's, in pytest and in tfgrpc-compare alike.
    family: dict[str, int] = {}
    for key in known & new.keys():
        runs = [run[key] for run in history if key in run]
        tested = [
            m
            for m in metrics
            if GATED[m].gate is not GateTest.RATIO
            and (m in new[key].rounds or _across_runs([_figure(r, m) for r in runs]))
        ]
        family[key.test] = family.get(key.test, 0) + len(tested)
    for key in sorted(known & new.keys(), key=Key.order):
        runs = [run[key] for run in history if key in run]
        base, cur = runs[-1], new[key]
        for attribute in ("rpc", "mode"):
            was, now = getattr(base, attribute), getattr(cur, attribute)
            if was and now and was != now:
                what = f"{key.test} {key.label}.{attribute}"
                if not any(m.what == what for m in mismatches):
                    mismatches.append(Mismatch(what, was, now))
        # What the transport saw in both runs, quoted beside any figure that changed.
        context = gate_context(base.figures, cur.figures)
        for metric in metrics:
            if metric not in base.figures and metric not in cur.figures:
                continue
            verdict = compare_figure(
                base,
                cur,
                metric,
                tolerance_for(tolerances, metric),
                alpha=alpha,
                resamples=resamples,
                seed=seed,
                earlier=runs[:-1],
                family=family.get(key.test, 1),
                spread_floor=floor,
            )
            if context and verdict.outcome is not Outcome.PASS:
                verdict = replace(verdict, reason=f"{verdict.reason}; transport: {context}")
            verdicts.append(verdict)
    return verdicts, mismatches


def typical_run_spread(
    baseline: Baseline | Sequence[Baseline], tolerances: Mapping[str, float] | None = None
) -> float:
    """The median spread between runs (standard deviation of the logs) of the baseline's
    figures that are tested across runs (gated, without rounds, in >= 3 of its runs): the
    floor of each such figure's spread. One figure's three runs may agree by chance; the
    machine's drift between runs is shared by all its figures, so their median is the better
    guess of how much any of them moves. 0 when no figure is tested across runs."""
    runs = [run.measurements for run in _history(baseline)]
    keys = set().union(*(run.keys() for run in runs))
    return _typical_run_spread(runs, keys, gated_metrics(tolerances or {}))


def _typical_run_spread(
    history: Sequence[Mapping[Key, Measurement]], keys: Iterable[Key], metrics: Iterable[str]
) -> float:
    spreads = []
    for key in keys:
        runs = [run[key] for run in history if key in run]
        for metric in metrics:
            if GATED[metric].gate is GateTest.RATIO or any(metric in r.rounds for r in runs):
                continue
            values = [_figure(r, metric) for r in runs]
            if _across_runs(values):
                spread = run_spread([v for v in values if v is not None])
                if math.isfinite(spread):
                    spreads.append(spread)
    return float(np.median(spreads)) if spreads else 0.0


def _history(baseline: Baseline | Sequence[Baseline]) -> tuple[Baseline, ...]:
    runs = (baseline,) if isinstance(baseline, Baseline) else tuple(baseline)
    if not runs:
        raise ValueError("no baseline run to compare with")
    return runs


def compare_runs(
    baseline: Baseline | Sequence[Baseline],
    current: Baseline,
    tolerances: Mapping[str, float],
    *,
    alpha: float = DEFAULT_ALPHA,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> Comparison:
    """Compare every figure of every measurement the current run and a baseline run have (see
    :func:`compare_figure`; the metrics are :func:`gated_metrics`), and list what only one run
    has and how the setups differ (:func:`check_metadata`, and a label measured with another
    rpc or mode). ``baseline`` may be a history of runs, oldest first, split by setup first
    (:func:`split_by_setup`: only the runs of the current run's setup, or of the most recent
    run's, said in ``notes``): each point is compared with every run of it that measured it,
    ``missing`` is what the most recent of them has and the current run lacks, and the setup
    is checked against the most recent of them."""
    split = split_by_setup(_history(baseline), current.setup(), current.fabrics)
    runs = split.runs
    verdicts, mismatches = _compare_measurements(
        [run.measurements for run in runs],
        current.measurements,
        tolerances,
        alpha,
        resamples,
        seed,
        typical_run_spread(runs, tolerances),
    )
    latest = runs[-1]
    known = set().union(*(run.measurements.keys() for run in runs))
    setup = check_metadata(latest, current.setup(), current.fabrics)
    return Comparison(
        tuple(verdicts),
        tuple(sorted(latest.measurements.keys() - current.measurements.keys(), key=Key.order)),
        tuple(sorted(current.measurements.keys() - known, key=Key.order)),
        (*setup, *mismatches),
        (split.note,) if split.note else (),
    )


def compare_test(
    baseline: Baseline | Sequence[Baseline],
    record: TestRecord,
    tolerances: Mapping[str, float],
    *,
    alpha: float = DEFAULT_ALPHA,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    spread_floor: float | None = None,
) -> Comparison:
    """Compare one finished test, from its record (read under its JUnit id,
    :func:`~pytest_tfgrpc.report.record.junit_test_id`), with its baseline measurements
    (``baseline`` one run or a history,
    oldest first). ``missing`` lists what the most recent baseline run measured for this test
    and the test no longer did; ``new`` what no baseline run has. Setup mismatches are the
    caller's to check once per run (:func:`check_metadata`). ``spread_floor`` is the
    history's :func:`typical_run_spread` (computed when None: pass it when judging many
    tests against one history)."""
    runs = _history(baseline)
    current = record.by_key()
    history = [run.for_test(record.test) for run in runs]
    floor = typical_run_spread(runs, tolerances) if spread_floor is None else spread_floor
    verdicts, mismatches = _compare_measurements(
        history, current, tolerances, alpha, resamples, seed, floor
    )
    known = set().union(*(h.keys() for h in history))
    return Comparison(
        tuple(verdicts),
        tuple(sorted(history[-1].keys() - current.keys(), key=Key.order)),
        tuple(sorted(current.keys() - known, key=Key.order)),
        tuple(mismatches),
    )


def _format_value(value: float, metric: str) -> str:
    if not math.isfinite(value):
        return "-"
    return GATED[metric].unit.format(value)


def format_comparison(comparison: Comparison, *, reasons: bool = True) -> list[str]:
    """An aligned table (test, benchmark, fabric, size, metric, baseline, current, change,
    verdict), then, with ``reasons``, one line per verdict other than pass saying why, the
    measurements only one run has, and the setup mismatches."""
    header = (
        "test", "benchmark", "fabric", "size", "metric", "baseline", "current", "change",
        "detectable", "verdict",
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
                f">={v.threshold:.1%}" if math.isfinite(v.threshold) else "-",
                v.outcome.value.upper() if v.outcome is Outcome.REGRESSION else v.outcome.value,
            )
        )
    lines = []
    if comparison.verdicts:
        lines = align_columns(table, left=5)
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
    lines += comparison.notes
    return lines
