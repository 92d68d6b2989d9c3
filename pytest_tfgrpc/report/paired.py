"""Paired A/B verdicts: version B against version A, measured side by side in pairs.

``tfgrpc-ab`` runs the same suite as A and B in turn; each pair of runs (one A, one B, back to
back) is a replicate, and each figure is tested across the pairs with
:func:`~pytest_tfgrpc.stats.paired.paired_test`. The verdicts are the gate's
(:class:`~pytest_tfgrpc.report.compare.Verdict`, :class:`~pytest_tfgrpc.report.compare.Comparison`,
judged by :func:`~pytest_tfgrpc.report.compare.judge_replicated`): the same outcomes,
tolerances, detectable change, missing-figure and setup-mismatch rules, so the same table
(:func:`~pytest_tfgrpc.report.compare.format_comparison`) and exit codes follow. A is the
baseline, B the current run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from pytest_tfgrpc.metrics import GATED, GateTest
from pytest_tfgrpc.report.compare import BLIND_FACTOR, Comparison, judge_replicated
from pytest_tfgrpc.report.junit import Baseline
from pytest_tfgrpc.report.record import Key, Measurement, Outcome, Verdict
from pytest_tfgrpc.report.setup_check import Mismatch, check_metadata
from pytest_tfgrpc.report.tolerance import gated_metrics, tolerance_for
from pytest_tfgrpc.stats.paired import (
    MAX_PAIRS_SAID,
    MIN_PAIRS,
    PairedTest,
    paired_test,
    pairs_to_detect,
)
from pytest_tfgrpc.stats.replicates import ReplicateTest, invalid_values
from pytest_tfgrpc.stats.significance import DEFAULT_ALPHA
from pytest_tfgrpc.units import counted

__all__ = [
    "Pair",
    "PairedRegression",
    "blind_pairs_warnings",
    "compare_pairs",
    "pair_value",
    "paired_verdict",
]


@dataclass(frozen=True)
class Pair:
    """One run of A and one of B, made back to back: the replicate of a paired comparison."""

    a: Baseline
    b: Baseline


def pair_value(measurement: Measurement, metric: str) -> float | None:
    """A run's value of ``metric`` for one point, as the gate takes it: the median of its
    rounds where it was measured in rounds, else its figure (None when it has neither)."""
    rounds = measurement.rounds.get(metric, ())
    if len(rounds) > 1:
        return float(np.median(rounds))
    return measurement.figures.get(metric)


def _as_replicate(test: PairedTest) -> ReplicateTest:
    return ReplicateTest(
        baseline=test.baseline,
        current=test.current,
        change=test.change,
        detectable=test.detectable,
        direction=test.direction,
        p_value=test.p_value,
        runs=test.pairs,
        rounds=1,
        method=test.method,
    )


def paired_verdict(
    key: Key,
    metric: str,
    values: Sequence[tuple[float | None, float | None]],
    tolerance: float,
    alpha: float,
    family: int,
) -> Verdict:
    """The verdict of one figure (``metric``) of one point (``key``) over the pairs:
    ``values`` holds A's and B's value of each pair (base units; None where that side lacks
    it), judged as :func:`compare_pairs` judges, at ``alpha / family``. A is the baseline."""
    gated = GATED[metric]
    both = [(a, b) for a, b in values if a is not None and b is not None]
    a_values = [a for a, _ in both]
    b_values = [b for _, b in both]

    def mean(xs: Sequence[float]) -> float:
        if not xs or invalid_values(xs):
            return math.nan
        return float(np.exp(np.mean(np.log(xs))))

    base, cur = mean(a_values), mean(b_values)
    change = cur / base - 1.0 if math.isfinite(base) and math.isfinite(cur) else math.nan

    def verdict(outcome: Outcome, reason: str, **found: Any) -> Verdict:
        made = Verdict(
            key=key,
            metric=metric,
            outcome=outcome,
            baseline=base,
            current=cur,
            change=change,
            tolerance=tolerance,
            unit=gated.unit.base,
            baseline_samples=len(a_values),
            current_samples=len(b_values),
            reason=f"{metric}: {reason}",
            alpha=alpha,
            runs=len(both),
        )
        return replace(made, **found) if found else made

    for side, index in (("A", 0), ("B", 1)):
        if all(pair[index] is None for pair in values):
            other = "B" if side == "A" else "A"
            return verdict(Outcome.INCONCLUSIVE, f"side {side} has no {metric} figure; {other} has")
    for side, xs in (("A", a_values), ("B", b_values)):
        why = invalid_values(xs)
        if why:
            return verdict(Outcome.INVALID, f"side {side}'s {metric}: {why}: not a measurement")
    broken = len(values) - len(both)
    lacking = (
        f" ({broken} pair{'s lack' if broken != 1 else ' lacks'} it on one side)" if broken else ""
    )
    if gated.gate is GateTest.RATIO:
        # A figure the run fixes (a placement's imbalance): any change is real.
        worse = -change if gated.higher_is_better else change
        limit = f"{tolerance * 100:g}% tolerance"
        if abs(worse) > tolerance:
            outcome = Outcome.REGRESSION if worse > 0 else Outcome.IMPROVEMENT
            side = "worse" if worse > 0 else "better"
            return verdict(outcome, f"{change:+.1%} is {side} than the {limit}", method="ratio")
        return verdict(Outcome.PASS, f"{change:+.1%} is within the {limit}", method="ratio")
    if len(both) < MIN_PAIRS:
        return verdict(
            Outcome.INCONCLUSIVE,
            f"{counted(len(both), 'pair')} with both sides{lacking}: "
            f"a paired test needs {MIN_PAIRS}",
        )
    tested: Callable[[float], ReplicateTest] = lambda level: _as_replicate(  # noqa: E731
        paired_test(a_values, b_values, alpha=level)
    )
    made = judge_replicated(verdict, tested, gated.higher_is_better, tolerance, alpha / family)
    return replace(made, reason=made.reason + lacking) if lacking else made


class PairedRegression(AssertionError):
    """B regressed against A in a test's own paired measurement (``Driver.p2p_latency_ab``);
    the message is the cause, then the gate's table."""


def compare_pairs(
    pairs: Sequence[Pair],
    tolerances: Mapping[str, float],
    *,
    alpha: float = DEFAULT_ALPHA,
) -> Comparison:
    """B against A over ``pairs``, per test, fabric, label, size and gated metric
    (:func:`~pytest_tfgrpc.report.tolerance.gated_metrics`): a paired t on the pairs' log
    ratios (:func:`~pytest_tfgrpc.stats.paired.paired_test`), at ``alpha`` over the number
    of figures a test has tested together (Bonferroni, as the gate does). ``missing`` are the
    points A measured in some pair and B in none, ``new`` the reverse; the setups are checked
    between the sides' most recent runs (:func:`check_metadata`), and a label measured with
    another rpc or mode on the two sides is a mismatch.

    :raises ValueError: no pair at all.
    """
    if not pairs:
        raise ValueError("no pair of runs to compare")
    a_keys = set().union(*(p.a.measurements.keys() for p in pairs))
    b_keys = set().union(*(p.b.measurements.keys() for p in pairs))
    metrics = gated_metrics(tolerances)
    shared = sorted(a_keys & b_keys, key=Key.order)

    def measured(key: Key) -> list[tuple[Measurement | None, Measurement | None]]:
        return [(p.a.measurements.get(key), p.b.measurements.get(key)) for p in pairs]

    def present(key: Key, metric: str) -> bool:
        return any(
            m is not None and pair_value(m, metric) is not None
            for both in measured(key)
            for m in both
        )

    family: dict[str, int] = {}
    for key in shared:
        tested = [m for m in metrics if GATED[m].gate is not GateTest.RATIO and present(key, m)]
        family[key.test] = family.get(key.test, 0) + len(tested)
    verdicts: list[Verdict] = []
    mismatches: list[Mismatch] = []
    for key in shared:
        runs = measured(key)
        for attribute in ("rpc", "mode"):
            was = {getattr(a, attribute) for a, _ in runs if a is not None} - {""}
            now = {getattr(b, attribute) for _, b in runs if b is not None} - {""}
            if was and now and was != now:
                mismatches.append(
                    Mismatch(
                        f"{key.test} {key.label}.{attribute}",
                        ", ".join(sorted(was)),
                        ", ".join(sorted(now)),
                    )
                )
        for metric in metrics:
            if not present(key, metric):
                continue
            values = [
                (
                    pair_value(a, metric) if a is not None else None,
                    pair_value(b, metric) if b is not None else None,
                )
                for a, b in runs
            ]
            verdicts.append(
                paired_verdict(
                    key,
                    metric,
                    values,
                    tolerance_for(tolerances, metric),
                    alpha,
                    max(family.get(key.test, 1), 1),
                )
            )
    latest = pairs[-1]
    setup = check_metadata(latest.a, latest.b.setup(), latest.b.fabrics)
    return Comparison(
        tuple(verdicts),
        tuple(sorted(a_keys - b_keys, key=Key.order)),
        tuple(sorted(b_keys - a_keys, key=Key.order)),
        (*setup, *_unique(mismatches)),
    )


def _unique(mismatches: Sequence[Mismatch]) -> list[Mismatch]:
    seen: set[str] = set()
    out = []
    for mismatch in mismatches:
        if mismatch.what not in seen:
            seen.add(mismatch.what)
            out.append(mismatch)
    return out


def blind_pairs_warnings(comparison: Comparison, *, limit: int = 5) -> list[str]:
    """What the pairs of ``comparison`` (:func:`compare_pairs`) could not see: one line per
    tested figure whose detectable change is more than
    :data:`~pytest_tfgrpc.report.compare.BLIND_FACTOR` times its tolerance (as a history is
    called blind), worst first, at most ``limit`` and then how many more, each with the pairs
    that would see its tolerance at the same spread
    (:func:`~pytest_tfgrpc.stats.paired.pairs_to_detect`, at the level the figure was tested
    at: ``alpha`` over the figures its test tested together)."""
    family: dict[str, int] = {}
    for v in comparison.verdicts:
        if GATED[v.metric].gate is not GateTest.RATIO:
            family[v.key.test] = family.get(v.key.test, 0) + 1
    blind = [
        v
        for v in comparison.verdicts
        if math.isfinite(v.detectable)
        and math.isfinite(v.tolerance)
        and v.detectable > BLIND_FACTOR * v.tolerance
    ]
    blind.sort(key=lambda v: (-v.detectable, v.key.order(), v.metric))
    lines = []
    for v in blind[:limit]:
        level = v.alpha / max(family.get(v.key.test, 1), 1)
        needed = pairs_to_detect(v.detectable, v.runs, v.tolerance, alpha=level)
        more = f"about {needed}" if needed is not None else f"more than {MAX_PAIRS_SAID}"
        where = f" on {v.key.fabric}" if v.key.fabric else ""
        lines.append(
            f"these {v.runs} pairs can see changes above {v.detectable:.0%} in "
            f"{v.key.label}.{v.key.size}.{v.metric} ({v.key.test}{where}); tolerance "
            f"{v.tolerance * 100:g}%: at their spread {more} pairs would see it"
        )
    if len(blind) > limit:
        lines.append(
            f"{len(blind) - limit} more figures of these pairs see only changes above twice "
            "their tolerance"
        )
    return lines
