"""Latency samples to statistics: percentiles from all samples.

Percentiles use linear interpolation between order statistics, as ``numpy.percentile`` does by
default (``method="linear"``): the q-quantile of ``n`` sorted samples ``x[0..n-1]`` is
``x[h] + (h - floor(h)) * (x[floor(h)+1] - x[floor(h)])`` with ``h = (n - 1) * q``. Whether a
quantile moved between runs is :mod:`pytest_tfgrpc.stats.significance`'s to say.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt

__all__ = ["Summary", "min_samples_for", "summarize"]


@dataclass(frozen=True)
class Summary:
    """Statistics of one set of duration samples, in nanoseconds.

    Percentiles interpolate linearly between order statistics (``numpy.percentile``'s default).
    ``stdev_ns`` is the sample standard deviation (``ddof=1``; 0 for a single sample).
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


def _check_level(name: str, value: float) -> None:
    if not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be between 0 and 1 (exclusive), got {value!r}")


def _quantile_sorted(sorted_ns: npt.NDArray[np.int64], q: float) -> float:
    h = (len(sorted_ns) - 1) * q
    low = math.floor(h)
    high = min(low + 1, len(sorted_ns) - 1)
    below, above = float(sorted_ns[low]), float(sorted_ns[high])
    return below + (h - low) * (above - below)


def summarize(samples_ns: npt.NDArray[np.int64]) -> Summary:
    """Summarize every sample (nanosecond durations): one sort, then indexing.

    Raises ValueError when there are no samples or a sample is negative.
    """
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
    )


def min_samples_for(q: float) -> int:
    """The fewest samples at which the ``q``-quantile is resolved at all: ``ceil(1 / (1 - q))``.

    Below it, the q-quantile is only an interpolation towards the maximum (p99 of 40 samples
    says nothing the maximum does not), so budgets refuse to pass it.
    """
    _check_level("q", q)
    # Exact in the decimal q is written in: in binary floating point 1 / (1 - 0.9) is
    # 10.000000000000002, which would ask for 11.
    return math.ceil(1 / (1 - Fraction(repr(float(q)))))
