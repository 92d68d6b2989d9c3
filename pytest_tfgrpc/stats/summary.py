"""Latency samples to statistics: percentiles from all samples, and their confidence intervals.

Percentiles use linear interpolation between order statistics, as ``numpy.percentile`` does by
default (``method="linear"``): the q-quantile of ``n`` sorted samples ``x[0..n-1]`` is
``x[h] + (h - floor(h)) * (x[floor(h)+1] - x[floor(h)])`` with ``h = (n - 1) * q``.

Confidence intervals are distribution-free: they bracket the true quantile between two order
statistics, chosen from the binomial distribution of how many samples fall below it
(:func:`quantile_ci`). They hold whatever the shape of the latency distribution, which is
rarely normal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

__all__ = ["Summary", "min_samples_for", "quantile_ci", "summarize"]

#: Above this many samples, the interval's ranks come from the normal approximation to the
#: binomial, provided that approximation is good (see _NORMAL_MIN_VARIANCE).
EXACT_MAX_SAMPLES = 1000
# n*q*(1-q) is the binomial's variance; at 100 its skew is below 0.1, so the normal ranks are
# within one of the exact ones. Below it (p999 of a few thousand samples), stay exact.
_NORMAL_MIN_VARIANCE = 100.0


@dataclass(frozen=True)
class Summary:
    """Statistics of one set of duration samples, in nanoseconds.

    Percentiles interpolate linearly between order statistics (``numpy.percentile``'s default).
    ``stdev_ns`` is the sample standard deviation (``ddof=1``; 0 for a single sample).
    ``p50_ci_ns`` and ``p99_ci_ns`` are distribution-free confidence intervals at level
    ``confidence`` (see :func:`quantile_ci`), or None when there are too few samples for one.
    """

    count: int
    min_ns: float
    mean_ns: float
    stdev_ns: float
    p50_ns: float
    p90_ns: float
    p99_ns: float
    p999_ns: float
    max_ns: float
    p50_ci_ns: tuple[float, float] | None
    p99_ci_ns: tuple[float, float] | None
    confidence: float


def _check_level(name: str, value: float) -> None:
    if not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be between 0 and 1 (exclusive), got {value!r}")


def _quantile_sorted(sorted_ns: npt.NDArray[np.int64], q: float) -> float:
    h = (len(sorted_ns) - 1) * q
    low = math.floor(h)
    high = min(low + 1, len(sorted_ns) - 1)
    below, above = float(sorted_ns[low]), float(sorted_ns[high])
    return below + (h - low) * (above - below)


def summarize(samples_ns: npt.NDArray[np.int64], confidence: float = 0.95) -> Summary:
    """Summarize every sample (nanosecond durations): one sort, then indexing.

    Raises ValueError when there are no samples, a sample is negative, or ``confidence`` is
    not between 0 and 1.
    """
    _check_level("confidence", confidence)
    ordered = np.sort(np.asarray(samples_ns, dtype=np.int64), axis=None)
    n = len(ordered)
    if n == 0:
        raise ValueError("cannot summarize no samples")
    if ordered[0] < 0:
        raise ValueError(f"a duration sample is negative ({int(ordered[0])} ns)")
    return Summary(
        count=n,
        min_ns=float(ordered[0]),
        mean_ns=float(np.mean(ordered, dtype=np.float64)),
        stdev_ns=float(np.std(ordered, dtype=np.float64, ddof=1)) if n > 1 else 0.0,
        p50_ns=_quantile_sorted(ordered, 0.5),
        p90_ns=_quantile_sorted(ordered, 0.9),
        p99_ns=_quantile_sorted(ordered, 0.99),
        p999_ns=_quantile_sorted(ordered, 0.999),
        max_ns=float(ordered[-1]),
        p50_ci_ns=quantile_ci(ordered, 0.5, confidence),
        p99_ci_ns=quantile_ci(ordered, 0.99, confidence),
        confidence=confidence,
    )


def _exact_ranks(n: int, q: float, tail: float) -> tuple[int, int] | None:
    """1-based ranks (j, k) with P(B < j) <= tail and P(B >= k) <= tail, B ~ Binomial(n, q)."""
    # log pmf(i+1) - log pmf(i) = log((n - i) / (i + 1)) + log(q / (1 - q)): summing these steps
    # gives the whole pmf without factorials of n, and normalising absorbs rounding.
    i = np.arange(n, dtype=np.float64)
    steps = np.log(n - i) - np.log(i + 1) + (math.log(q) - math.log1p(-q))
    log_pmf = np.concatenate(([0.0], np.cumsum(steps)))
    pmf = np.exp(log_pmf - log_pmf.max())
    pmf /= pmf.sum()
    cdf = np.cumsum(pmf)  # cdf[m] = P(B <= m)
    sf = np.cumsum(pmf[::-1])[::-1]  # sf[m] = P(B >= m), summed from the small end for accuracy
    # Largest j with P(B <= j - 1) <= tail; smallest k with P(B >= k) <= tail.
    lower = int(np.searchsorted(cdf, tail, side="right"))  # count of m with cdf[m] <= tail
    upper_candidates = np.flatnonzero(sf <= tail)
    if lower < 1 or len(upper_candidates) == 0:
        return None
    j, k = lower, int(upper_candidates[0])
    if k > n:
        return None
    return j, k


def _normal_ranks(n: int, q: float, tail: float) -> tuple[int, int] | None:
    """The ranks of :func:`_exact_ranks` from the normal approximation, continuity-corrected."""
    z = NormalDist().inv_cdf(1.0 - tail)
    mean, sd = n * q, math.sqrt(n * q * (1.0 - q))
    j = math.floor(mean - z * sd + 0.5)
    k = math.ceil(mean + z * sd + 0.5)
    if j < 1 or k > n:
        return None
    return j, k


def quantile_ci(
    sorted_ns: npt.NDArray[np.int64], q: float, confidence: float
) -> tuple[float, float] | None:
    """A distribution-free confidence interval for the ``q``-quantile, from order statistics.

    The number B of samples below the true quantile is Binomial(n, q), so the j-th and k-th
    smallest samples (1-based, j < k) bracket it with probability P(j <= B < k). The ranks are
    chosen with equal tails: j as large as possible with P(B < j) <= (1 - confidence) / 2 and
    k as small as possible with P(B >= k) <= (1 - confidence) / 2, so the coverage is at least
    ``confidence`` for any continuous distribution. Probabilities are exact binomial ones up to
    1000 samples (and beyond, while n*q*(1-q) < 100), else from the normal approximation with a
    continuity correction.

    ``sorted_ns`` must be sorted ascending. Returns None when no such ranks exist, i.e. there
    are too few samples for an interval at this confidence (p99 of 50 samples, or the median
    of 5 at 95%).
    """
    _check_level("q", q)
    _check_level("confidence", confidence)
    n = len(sorted_ns)
    if n == 0:
        return None
    tail = (1.0 - confidence) / 2.0
    if n > EXACT_MAX_SAMPLES and n * q * (1.0 - q) >= _NORMAL_MIN_VARIANCE:
        ranks = _normal_ranks(n, q, tail)
    else:
        ranks = _exact_ranks(n, q, tail)
    if ranks is None:
        return None
    j, k = ranks
    return float(sorted_ns[j - 1]), float(sorted_ns[k - 1])


def min_samples_for(q: float) -> int:
    """The fewest samples at which the ``q``-quantile is resolved at all: ``ceil(1 / (1 - q))``.

    Below it, the q-quantile is only an interpolation towards the maximum (p99 of 40 samples
    says nothing the maximum does not), so budgets refuse to pass it.
    """
    _check_level("q", q)
    # Exact in the decimal q is written in: in binary floating point 1 / (1 - 0.9) is
    # 10.000000000000002, which would ask for 11.
    return math.ceil(1 / (1 - Fraction(repr(float(q)))))
