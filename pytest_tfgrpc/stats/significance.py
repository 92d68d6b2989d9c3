"""Significance tests of a change between two runs' samples, on their sketches.

- :func:`mann_whitney_u` / :func:`mann_whitney_u_sketches`: the two-sided Mann-Whitney U test
  (normal approximation with tie and continuity corrections, as ``scipy.stats.mannwhitneyu``
  with ``method="asymptotic"``), which needs at least :data:`MIN_SAMPLES_U` samples per run,
  the rule Google Benchmark's ``compare.py`` uses.
- :func:`bootstrap_quantile_ratio`: a percentile bootstrap confidence interval of the ratio of
  two runs' q-quantiles. A tail quantile is an order statistic, for which no t-test holds; the
  bootstrap needs no model of it, but does need samples beyond it: at least
  :data:`MIN_TAIL_SAMPLES` per run (:func:`min_samples`; p99: 1000 samples).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from pytest_tfgrpc.stats.sketch import Sketch, quantiles_from_counts

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_RESAMPLES",
    "MAX_RESAMPLES",
    "MIN_SAMPLES_U",
    "MIN_TAIL_SAMPLES",
    "UTest",
    "bootstrap_quantile_ratio",
    "mann_whitney_u",
    "mann_whitney_u_sketches",
    "min_samples",
]

DEFAULT_ALPHA = 0.05
#: Google Benchmark's compare.py: "at least 9 repetitions" for its U test.
MIN_SAMPLES_U = 9
#: Samples beyond a tail quantile that its bootstrap needs in each run (p99: 10 of 1000).
MIN_TAIL_SAMPLES = 10
DEFAULT_RESAMPLES = 2000
MAX_RESAMPLES = 100_000
_RESAMPLE_BLOCK = 500  # bootstrap rows drawn at once: bounds memory at 500 x buckets counts


def min_samples(quantile: float | None) -> int:
    """Samples each run needs for a test: :data:`MIN_SAMPLES_U` for the U test (``quantile``
    None); for a quantile q, enough that :data:`MIN_TAIL_SAMPLES` lie beyond it
    (``10 / (1 - q)``)."""
    if quantile is None:
        return MIN_SAMPLES_U
    # Fraction of the decimal q, so that 10 / (1 - 0.99) is 1000 and not 1000.0000000000009.
    beyond = 1 - Fraction(repr(quantile))
    return max(MIN_SAMPLES_U, math.ceil(MIN_TAIL_SAMPLES / beyond))


@dataclass(frozen=True)
class UTest:
    """A two-sided Mann-Whitney U test of samples x against y.

    ``u`` is the statistic of x (the number of pairs with x > y, ties counting one half);
    ``p_value`` is two-sided, from the normal approximation with tie and continuity
    corrections. ``x_larger`` says on which side the evidence lies: ``u`` above its null mean
    ``n_x * n_y / 2``.
    """

    u: float
    p_value: float
    n_x: int
    n_y: int

    @property
    def x_larger(self) -> bool:
        return self.u > self.n_x * self.n_y / 2.0


def _u_from_counts(x_counts: npt.NDArray[np.float64], y_counts: npt.NDArray[np.float64]) -> UTest:
    """The U test from the counts of each sample at each distinct value (same value order)."""
    n_x, n_y = float(x_counts.sum()), float(y_counts.sum())
    together = x_counts + y_counts
    # Tied values share the mean of the ranks they span.
    mean_rank = np.cumsum(together) - together + (together + 1.0) / 2.0
    u = float(np.dot(x_counts, mean_rank)) - n_x * (n_x + 1.0) / 2.0
    n = n_x + n_y
    ties = float(np.sum(together**3 - together))
    variance = n_x * n_y / 12.0 * ((n + 1.0) - ties / (n * (n - 1.0))) if n > 1 else 0.0
    if variance <= 0.0:
        p_value = 1.0  # every sample ties: no evidence of a shift either way
    else:
        z = (abs(u - n_x * n_y / 2.0) - 0.5) / math.sqrt(variance)
        p_value = min(1.0, math.erfc(z / math.sqrt(2.0)))
    return UTest(u, p_value, int(n_x), int(n_y))


def mann_whitney_u(x: npt.ArrayLike, y: npt.ArrayLike) -> UTest:
    """The two-sided Mann-Whitney U test of samples ``x`` against ``y`` (see :class:`UTest`)."""
    xs = np.asarray(x, dtype=np.float64).reshape(-1)
    ys = np.asarray(y, dtype=np.float64).reshape(-1)
    if len(xs) == 0 or len(ys) == 0:
        raise ValueError("the Mann-Whitney U test needs samples on both sides")
    if not (np.all(np.isfinite(xs)) and np.all(np.isfinite(ys))):
        raise ValueError("the Mann-Whitney U test needs finite samples")
    _, inverse = np.unique(np.concatenate((xs, ys)), return_inverse=True)
    distinct = int(inverse.max()) + 1
    x_counts = np.bincount(inverse[: len(xs)], minlength=distinct).astype(np.float64)
    y_counts = np.bincount(inverse[len(xs) :], minlength=distinct).astype(np.float64)
    return _u_from_counts(x_counts, y_counts)


def _aligned_counts(
    x: Sketch, y: Sketch
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    if x.accuracy != y.accuracy:
        raise ValueError(f"cannot compare sketches of accuracy {x.accuracy} and {y.accuracy}")
    spans = [s.offset for s in (x, y) if len(s.counts)]
    low = min(spans, default=0)
    high = max((s.offset + len(s.counts) for s in (x, y) if len(s.counts)), default=0)
    out = []
    for sketch in (x, y):
        counts = np.zeros(1 + high - low, np.float64)  # slot 0: the zero bucket
        counts[0] = sketch.zero_count
        start = 1 + sketch.offset - low
        counts[start : start + len(sketch.counts)] = sketch.counts
        out.append(counts)
    return out[0], out[1]


def mann_whitney_u_sketches(x: Sketch, y: Sketch) -> UTest:
    """The U test of sketch ``x``'s samples against ``y``'s, from their bucket counts.

    Both sketches bucket alike, so the samples are ranked by bucket and tie exactly when they
    share one (a tie within 1% at the default accuracy): the test costs O(buckets) whatever the
    number of samples.
    """
    if x.count == 0 or y.count == 0:
        raise ValueError("the Mann-Whitney U test needs samples on both sides")
    return _u_from_counts(*_aligned_counts(x, y))


def _bootstrap_quantiles(
    sketch: Sketch, q: float, resamples: int, rng: np.random.Generator
) -> npt.NDArray[np.float64]:
    values, weights = sketch.values(), sketch.weights()
    probabilities = weights / weights.sum()
    out = []
    for start in range(0, resamples, _RESAMPLE_BLOCK):
        rows = min(_RESAMPLE_BLOCK, resamples - start)
        # Resampling n values with replacement is a multinomial draw over the buckets.
        counts = rng.multinomial(sketch.count, probabilities, size=rows)
        out.append(quantiles_from_counts(values, counts, q))
    return np.concatenate(out)


def bootstrap_quantile_ratio(
    baseline: Sketch,
    current: Sketch,
    q: float,
    *,
    confidence: float = 1 - DEFAULT_ALPHA,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float]:
    """A percentile bootstrap confidence interval for ``Q_q(current) / Q_q(baseline)``.

    Each of ``resamples`` rounds redraws every run's samples with replacement (a multinomial
    draw over its sketch's buckets, so a round costs O(buckets)) and takes the ratio of the two
    q-quantiles; the interval is the ``(1 - confidence) / 2`` and ``(1 + confidence) / 2``
    quantiles of those ratios. Seeded: the same inputs give the same interval. NaN bounds when a
    resampled baseline quantile is 0.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be between 0 and 1 (exclusive), got {confidence!r}")
    if not 1 <= resamples <= MAX_RESAMPLES:
        raise ValueError(f"resamples must be between 1 and {MAX_RESAMPLES}, got {resamples!r}")
    if baseline.count == 0 or current.count == 0:
        raise ValueError("a bootstrap needs samples in both runs")
    rng = np.random.default_rng(seed)
    base = _bootstrap_quantiles(baseline, q, resamples, rng)
    now = _bootstrap_quantiles(current, q, resamples, rng)
    if np.any(base <= 0):
        return math.nan, math.nan
    ratios = now / base
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(ratios, [tail, 1.0 - tail])
    return float(low), float(high)
