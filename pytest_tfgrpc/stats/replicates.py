"""Tests of a change across replicates (rounds of a run, or whole runs), not across samples.

Consecutive samples of one run are correlated and runs differ from each other (load,
placement, CPU frequency), so a test that treats a run's thousand samples as independent
draws finds any shift between runs "significant". The replicate here is a **round**: a share
of a point's operations, interleaved in time with the other points (Google Benchmark's
repetitions with random interleaving). Each round gives one value of a figure (its p50, p99,
throughput); a run's value is the median of its rounds. All figures are compared on a log
scale, so that a change is a ratio whichever the unit.

:func:`replicate_test` picks the test by how much history there is:

- ``k >= MIN_HISTORY`` baseline runs: the spread **between runs** is estimated from the
  baseline runs' values, and the current run's value is tested against their mean with a
  Student t prediction interval (``k - 1`` degrees of freedom), as conbench's lookback z-score
  and Bencher's t-test threshold do; the spread is never taken below the current run's own
  standard error (its rounds' spread over sqrt(rounds)).
- fewer baseline runs: the spread between runs is unknown; it is taken to be the spread of
  one round (the rounds' pooled standard deviation, *not* divided by the number of rounds),
  with the rounds' degrees of freedom. Rounds are short, so runs usually vary more than that:
  the tolerance must cover the rest, and a history of runs is better.

Either way the result carries the **detectable change**: the smallest ratio the test would
call significant at that noise (gRPC's ``bm_diff`` reports the same idea).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = [
    "MIN_HISTORY",
    "MIN_ROUNDS",
    "UNSTABLE_CV",
    "ChangeTest",
    "ReplicateTest",
    "history_detectable",
    "instability",
    "invalid_values",
    "replicate_test",
    "run_spread",
    "run_test",
]

#: pyperf's rule: a standard deviation above 10 % of the mean "may be unstable".
UNSTABLE_CV = 0.10

#: Baseline runs from which the spread between runs is estimated (t with 2 degrees of freedom).
MIN_HISTORY = 3
#: Rounds a run needs for its values to be tested at all.
MIN_ROUNDS = 3


@dataclass(frozen=True)
class ChangeTest:
    """What every significance test of a change (B against A) finds.

    ``baseline`` and ``current`` are the compared values in the figure's unit; ``change`` is
    ``current / baseline - 1``. ``detectable`` is the smallest relative change, either way,
    that the test would call significant at ``alpha`` (as a fraction, ``0.12`` = 12 %).
    ``direction`` is +1 (significantly higher), -1 (lower) or 0; ``p_value`` is the test's
    two-sided p.
    """

    baseline: float
    current: float
    change: float
    detectable: float
    direction: int
    p_value: float


@dataclass(frozen=True)
class ReplicateTest(ChangeTest):
    """The outcome of :func:`replicate_test`, a :class:`ChangeTest`.

    ``baseline`` is the geometric mean of the baseline runs' medians of rounds, ``current``
    the current run's median of rounds. ``runs`` counts the baseline runs, ``rounds`` the
    current run's rounds; ``method`` names the test.
    """

    runs: int
    rounds: int
    method: str


def invalid_values(values: Sequence[float]) -> str:
    """Why ``values`` cannot be figures of a duration or rate ("" when they can): a zero,
    negative, NaN or infinite value is no measurement."""
    for value in values:
        if not math.isfinite(value):
            return f"a value is {value}"
        if value <= 0:
            return f"a value is {value:g}, not positive"
    return ""


def instability(values: Sequence[float]) -> float:
    """The rounds' standard deviation over their mean (the coefficient of variation), as
    pyperf checks its runs; NaN for fewer than 2 values or a mean that is not positive."""
    if len(values) < 2:
        return math.nan
    array = np.asarray(values, dtype=np.float64)
    mean = float(np.mean(array))
    return float(np.std(array, ddof=1)) / mean if mean > 0 else math.nan


def _logs(values: Sequence[float]) -> npt.NDArray[np.float64]:
    return np.log(np.asarray(values, dtype=np.float64))


def replicate_test(
    current: Sequence[float],
    baseline_runs: Sequence[Sequence[float]],
    *,
    alpha: float,
    min_history: int = MIN_HISTORY,
) -> ReplicateTest:
    """Test whether ``current`` (one value per round of the current run) differs from
    ``baseline_runs`` (per baseline run, one value per round; oldest first), as the module
    docstring says. Raises ValueError when a run has fewer than :data:`MIN_ROUNDS` rounds, a
    value is not a positive finite number (:func:`invalid_values`), there is no baseline run,
    or ``alpha`` is not in (0, 1)."""

    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be between 0 and 1 (exclusive), got {alpha!r}")
    if not baseline_runs:
        raise ValueError("no baseline run to test against")
    for name, values in (("current run", current), *(("baseline run", r) for r in baseline_runs)):
        if len(values) < MIN_ROUNDS:
            raise ValueError(f"the {name} has {len(values)} rounds: a test needs {MIN_ROUNDS}")
        why = invalid_values(values)
        if why:
            raise ValueError(f"the {name}'s rounds are invalid: {why}")
    cur = _logs(current)
    runs = [_logs(values) for values in baseline_runs]
    k, n = len(runs), len(cur)
    cur_value = float(np.median(cur))
    medians = np.array([np.median(r) for r in runs])
    center = float(np.mean(medians))
    if k >= min_history:
        spread = float(np.std(medians, ddof=1))
        own = float(np.std(cur, ddof=1)) / math.sqrt(n)
        se = max(spread, own) * math.sqrt(1.0 + 1.0 / k)
        df = float(k - 1)
        method = f"t-test across {k} baseline runs"
    else:
        # The spread between runs is unknown: assume a run's value varies between runs as
        # much as one round's does (the rounds' pooled spread, not divided by their count).
        every = [cur, *runs]
        df = float(sum(len(r) - 1 for r in every))
        pooled = sum(float(np.var(r, ddof=1)) * (len(r) - 1) for r in every) / df
        se = math.sqrt(pooled) * math.sqrt(1.0 + 1.0 / k)
        method = f"t-test, {k} baseline run{'s' if k > 1 else ''}: run spread taken as a round's"
    return _prediction_test(center, cur_value, se, df, alpha, runs=k, rounds=n, method=method)


def _prediction_test(
    center: float,
    value: float,
    se: float,
    df: float,
    alpha: float,
    *,
    runs: int,
    rounds: int,
    method: str,
) -> ReplicateTest:
    """``value`` (log scale) against a baseline mean ``center`` (log scale) whose prediction
    standard error is ``se``, with a two-sided Student t at ``df`` degrees of freedom."""
    from scipy import stats

    shift = value - center
    critical = float(stats.t.ppf(1.0 - alpha / 2.0, df))
    # Identical replicates (se 0): any shift at all is certain.
    certain = 0.0 if shift else 1.0
    p_value = float(2.0 * stats.t.sf(abs(shift / se), df)) if se > 0 else certain
    return ReplicateTest(
        baseline=math.exp(center),
        current=math.exp(value),
        change=math.expm1(shift),
        detectable=math.expm1(critical * se),
        direction=(1 if shift > 0 else -1) if p_value < alpha else 0,
        p_value=p_value,
        runs=runs,
        rounds=rounds,
        method=method,
    )


def run_spread(values: Sequence[float]) -> float:
    """The spread between runs of one figure: the standard deviation of its logs (NaN for
    fewer than 2 values or a value that is not a positive finite number)."""
    if len(values) < 2 or invalid_values(values):
        return math.nan
    return float(np.std(_logs(values), ddof=1))


def run_test(
    current: float,
    baseline_values: Sequence[float],
    *,
    alpha: float,
    min_spread: float = 0.0,
) -> ReplicateTest:
    """Test one run's figure ``current`` against the same figure of earlier runs
    (``baseline_values``, oldest first; at least :data:`MIN_HISTORY`), for a figure measured
    without rounds (PS throughput, sync-SGD steps, an engine's own loops): the run is the
    replicate. The spread between runs is the baseline values' (on a log scale), and the
    current value is tested against their mean with a Student t prediction interval
    (``k - 1`` degrees of freedom), as :func:`replicate_test` does with rounds. The spread
    is never taken below ``min_spread`` (a log-scale standard deviation): three runs that
    happen to agree would otherwise claim a precision the machine does not have. Raises
    ValueError for fewer than :data:`MIN_HISTORY` values, a value that is not a positive
    finite number, or ``alpha`` outside (0, 1)."""

    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be between 0 and 1 (exclusive), got {alpha!r}")
    if len(baseline_values) < MIN_HISTORY:
        raise ValueError(
            f"{len(baseline_values)} baseline runs: a test across runs needs {MIN_HISTORY}"
        )
    for name, values in (("current run", [current]), ("baseline runs", baseline_values)):
        why = invalid_values(values)
        if why:
            raise ValueError(f"the {name}' figure is invalid: {why}".replace("run'", "run's"))
    logs = _logs(baseline_values)
    k = len(logs)
    se = max(float(np.std(logs, ddof=1)), min_spread) * math.sqrt(1.0 + 1.0 / k)
    method = f"t-test across {k} baseline runs' figures (no rounds)"
    return _prediction_test(
        float(np.mean(logs)), math.log(current), se, k - 1.0, alpha, runs=k, rounds=1, method=method
    )


def history_detectable(
    run_values: Sequence[float], *, alpha: float, min_spread: float = 0.0
) -> float:
    """The smallest relative change (a fraction) a history of runs lets the tests across runs
    (:func:`replicate_test`, :func:`run_test`) call significant at ``alpha``, before the
    current run is known: one value per baseline run (the median of its rounds, or its
    figure), at least :data:`MIN_HISTORY` of them; their spread on a log scale (never below
    ``min_spread``) as the prediction's, with ``k - 1`` degrees of freedom. NaN for fewer
    values or a value that is not a positive finite number. The current run's own rounds can
    only widen it."""
    from scipy import stats

    if len(run_values) < MIN_HISTORY or invalid_values(run_values):
        return math.nan
    k = len(run_values)
    se = max(float(np.std(_logs(run_values), ddof=1)), min_spread) * math.sqrt(1.0 + 1.0 / k)
    return math.expm1(float(stats.t.ppf(1.0 - alpha / 2.0, k - 1.0)) * se)
