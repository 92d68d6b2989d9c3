"""Budgets: limits on a result's figures (``p99="2ms"``, ``throughput=">=1 GB/s"``), per size.

A budget is written as keyword arguments, by the ``budget`` marker or :func:`assert_budget`.
Each names a metric from :data:`METRICS` (the registry's budget metrics,
:mod:`pytest_tfgrpc.metrics`) and a limit in that metric's kind of unit, optionally
after an operator. Every limit is checked against every message size of a result; a breach is
reported in a table like pytest's ``approx``: size, metric, measured, budget, margin, samples,
fabric.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from pytest_tfgrpc.metrics import (
    BUDGET_METRICS,
    PER_SECOND,
    RATE,
    RATIO,
    TIME,
    Metric,
    Unit,
)
from pytest_tfgrpc.results import BenchmarkResult
from pytest_tfgrpc.stats.summary import min_samples_for
from pytest_tfgrpc.suggest import did_you_mean
from pytest_tfgrpc.units import UnitError, align_columns

__all__ = [
    "METRICS",
    "PER_SECOND",
    "RATE",
    "RATIO",
    "TIME",
    "Breach",
    "Budget",
    "BudgetError",
    "BudgetExceeded",
    "Kind",
    "Limit",
    "Metric",
    "assert_budget",
    "check",
    "format_breaches",
    "parse_budget",
    "parse_limit",
]


class BudgetError(ValueError):
    """A budget that cannot be read or does not apply; the message names the argument."""

    # Named by its public path (``pytest_tfgrpc.BudgetError``): pytest's one-line summary
    # then keeps more of the message, which is the cause.
    __module__ = "pytest_tfgrpc"


class BudgetExceeded(AssertionError):
    """A result broke its budget; the message is the table of breaches."""

    __module__ = "pytest_tfgrpc"  # its public path, as BudgetError's

    def __init__(self, message: str, breaches: tuple[Breach, ...] = ()) -> None:
        super().__init__(message)
        self.breaches = breaches


#: How the limits of one kind of metric are read, compared by default and shown: the metric's
#: unit in the registry (:class:`~pytest_tfgrpc.metrics.Unit`).
Kind = Unit
#: Every metric a budget may name, by name, in the order error messages list them.
METRICS: Mapping[str, Metric] = BUDGET_METRICS

_COMPARE: Mapping[str, Callable[[float, float], bool]] = MappingProxyType(
    {"<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt}
)
_OPERATOR = re.compile(r"^\s*(?P<op>=[<>]|[<>=!]=?)?\s*(?P<rest>.*?)\s*$", re.DOTALL)


@dataclass(frozen=True)
class Limit:
    """One limit: ``metric op value``, ``value`` in the kind's base unit (ns, B/s or plain).

    ``text`` is the limit as the user wrote it.
    """

    metric: str
    op: str
    value: float
    text: str
    kind: Kind

    def holds(self, measured: float) -> bool:
        """Whether ``measured`` is within the limit (NaN never is)."""
        return _COMPARE[self.op](measured, self.value)

    def margin(self, measured: float) -> float:
        """How far ``measured`` is beyond the limit, relative to it: +0.31 is 31% over a
        maximum (or under a minimum); negative values are within it."""
        excess = measured - self.value if self.op in ("<=", "<") else self.value - measured
        if self.value == 0:
            return 0.0 if excess == 0 else math.copysign(math.inf, excess)
        return excess / abs(self.value)

    def describe(self) -> str:
        """The limit in the same units as measured values are shown: ``<= 2.00ms``."""
        return f"{self.op} {self.kind.format(self.value)}"


def _unknown_metric(name: str, metrics: Mapping[str, Metric]) -> BudgetError:
    return BudgetError(
        f"unknown budget metric {name!r}: known metrics are {', '.join(metrics)}"
        + did_you_mean(name, metrics)
    )


def parse_limit(metric: str, value: object, metrics: Mapping[str, Metric] = METRICS) -> Limit:
    """Read one budget argument, ``metric=value``: ``p99="2ms"``, ``throughput=">= 2 GB/s"``.

    Without an operator a time limit is a maximum (``<=``) and a rate limit a minimum
    (``>=``). Raises :class:`BudgetError` naming the argument and its value, for any metric:
    an unknown metric, a bad operator, a value that does not read in the metric's unit, or one
    that is not finite (``nan``, ``inf``, ``1e999ms``).
    """
    known = metrics.get(metric)
    if known is None:
        raise _unknown_metric(metric, metrics)
    kind = known.kind
    where = f"budget {metric}={value!r}"
    if isinstance(value, (int, float)) and not isinstance(value, bool) and kind.numbers:
        text = str(value)
        op, rest = kind.default_op, text
    elif isinstance(value, str):
        text = value
        match = _OPERATOR.match(value)
        assert match is not None  # the pattern matches any string
        op, rest = match["op"] or kind.default_op, match["rest"]
        if op not in _COMPARE:
            raise BudgetError(f"{where}: operator {op!r} is not one of {', '.join(_COMPARE)}")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        raise BudgetError(
            f"{where}: a {kind.name} limit needs a unit, e.g. {metric}={kind.example}"
        )
    else:
        raise BudgetError(f"{where}: expected a string such as {kind.example}")
    try:
        number = kind.parse(rest)
    except UnitError as error:
        raise BudgetError(f"{where}: {error}") from None
    if not math.isfinite(number):
        raise BudgetError(f"{where}: a limit must be a finite number, e.g. {metric}={kind.example}")
    return Limit(metric, op, number, text, kind)


@dataclass(frozen=True)
class Budget:
    """The limits one result must keep, at most one per metric."""

    limits: tuple[Limit, ...] = ()

    def __post_init__(self) -> None:
        metrics = [limit.metric for limit in self.limits]
        for metric in metrics:
            if metrics.count(metric) > 1:
                raise ValueError(f"a budget holds one limit per metric; {metric!r} has several")

    def merged(self, other: Budget) -> Budget:
        """This budget with ``other``'s limits overriding those for the same metric.

        The plugin merges the ``budget`` marker's limits with explicit ones, the latter winning.
        """
        overrides = {limit.metric: limit for limit in other.limits}
        limits = [overrides.pop(limit.metric, limit) for limit in self.limits]
        limits += [limit for limit in other.limits if limit.metric in overrides]
        return Budget(tuple(limits))


def parse_budget(limits: Mapping[str, object]) -> Budget:
    """Read budget arguments (``{"p99": "2ms", "throughput": ">=1 GB/s"}``) into a Budget."""
    return Budget(tuple(parse_limit(metric, value) for metric, value in limits.items()))


@dataclass(frozen=True)
class Breach:
    """One limit broken at one message size.

    ``measured`` and ``limit.value`` are in the kind's base unit; ``margin`` is the signed
    relative excess (+0.31 = 31% beyond the limit). ``reason`` is set when the figure could not
    be trusted at all (too few samples for the percentile), whatever its value.
    """

    size: str
    metric: str
    measured: float
    limit: Limit
    margin: float
    samples: int
    fabric: str
    reason: str = ""


def _name(result: BenchmarkResult) -> str:
    if result.label == result.benchmark:
        return result.label
    return f"{result.label} ({result.benchmark})"


def check(budget: Budget, result: BenchmarkResult) -> tuple[Breach, ...]:
    """Check every limit of ``budget`` against every size of ``result``; return the breaches.

    A percentile limit on a size with fewer samples than the percentile needs
    (:func:`~pytest_tfgrpc.stats.summary.min_samples_for`) is a breach. Raises :class:`BudgetError`
    when a limit names a figure the result does not report (a rate of a latency benchmark).
    """
    rates = result.reports_rates
    for limit in budget.limits:
        if limit.kind == RATE and not rates:
            raise BudgetError(
                f"budget {limit.metric}={limit.text!r}: {_name(result)} "
                "reports no rates; limit its times (p50, p99, ...) or measure with p2p_bandwidth"
            )
    breaches = []
    for size in result.sizes:
        for limit in budget.limits:
            figure = size.figure(limit.metric, rates=rates)
            if figure is None:
                raise BudgetError(
                    f"budget {limit.metric}={limit.text!r}: {_name(result)} "
                    f"reports no figure {limit.metric!r}"
                )
            reason = ""
            metric = METRICS.get(limit.metric)
            if metric is not None and metric.quantile is not None:
                needed = min_samples_for(metric.quantile)
                if size.count < needed:
                    reason = f"needs >= {needed} samples, has {size.count}"
            if reason or not limit.holds(figure.value):
                breaches.append(
                    Breach(
                        size=size.label,
                        metric=limit.metric,
                        measured=figure.value,
                        limit=limit,
                        margin=limit.margin(figure.value),
                        samples=size.count,
                        fabric=result.fabric,
                        reason=reason,
                    )
                )
    return tuple(breaches)


def format_breaches(result: BenchmarkResult, breaches: tuple[Breach, ...], checked: int) -> str:
    """The failure message: a headline naming the result and fabric, then an aligned table."""
    checks = "check" if checked == 1 else "checks"
    lines = [
        f"{result.label} on fabric {result.fabric} ({result.target}): "
        f"{len(breaches)} of {checked} budget {checks} failed"
    ]
    rows = [("size", "metric", "measured", "budget", "margin", "samples", "fabric")]
    for breach in breaches:
        margin = breach.reason or f"{breach.margin:+.1%}"
        rows.append(
            (
                breach.size,
                breach.metric,
                breach.limit.kind.format(breach.measured),
                breach.limit.describe(),
                margin,
                str(breach.samples),
                breach.fabric,
            )
        )
    lines += align_columns(rows, left=len(rows[0]), separator=" | ")
    return "\n".join(lines)


def assert_budget(result: BenchmarkResult, **limits: object) -> None:
    """Fail the test with a table when ``result`` breaks any of ``limits``.

    ``assert_budget(result, p99="500us", throughput=">=2 GB/s")``: each keyword is a metric of
    :data:`METRICS`, each value a limit as in the ``budget`` marker.
    """
    __tracebackhide__ = True
    if not isinstance(result, BenchmarkResult):
        raise TypeError(
            "assert_budget() takes the result a tfgrpc benchmark returned "
            f"(result = tfgrpc.p2p_latency(server)), not {type(result).__name__}"
        )
    if not limits:
        raise TypeError(
            "assert_budget() needs at least one limit, e.g. assert_budget(result, p99='2ms')"
        )
    try:
        budget = parse_budget(limits)
        breaches = check(budget, result)
    except BudgetError as exc:
        # Raised again from this (hidden) frame: the test's traceback ends at its own call.
        raise BudgetError(str(exc)) from None
    if breaches:
        checked = len(budget.limits) * len(result.sizes)
        raise BudgetExceeded(format_breaches(result, breaches, checked), breaches)
