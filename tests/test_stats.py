from __future__ import annotations

import math
import time

import numpy as np
import numpy.typing as npt
import pytest

from pytest_tfgrpc.stats import summary as stats
from pytest_tfgrpc.stats.summary import Summary, min_samples_for, quantile_ci, summarize


def _ns(values: list[int]) -> npt.NDArray[np.int64]:
    return np.array(values, dtype=np.int64)


def test_summarize_small_sample_by_hand() -> None:
    s = summarize(_ns([40, 10, 30, 20]))
    assert s.count == 4
    assert (s.min_ns, s.max_ns) == (10.0, 40.0)
    assert s.mean_ns == 25.0
    assert s.stdev_ns == pytest.approx(math.sqrt(500 / 3))  # ddof=1
    # Linear interpolation: h = (n - 1) * q = 1.5 -> halfway between 20 and 30.
    assert s.p50_ns == 25.0
    assert s.p90_ns == pytest.approx(37.0)  # h = 2.7
    assert s.p99_ns == pytest.approx(39.7)
    assert s.confidence == 0.95
    assert s.p50_ci_ns is None  # four samples cannot bracket the median at 95%
    assert s.p99_ci_ns is None


def test_summarize_single_sample() -> None:
    s = summarize(_ns([7]))
    assert (s.count, s.min_ns, s.p50_ns, s.p999_ns, s.max_ns, s.stdev_ns) == (1, 7, 7, 7, 7, 0)


def test_summarize_matches_numpy_linear_percentiles() -> None:
    rng = np.random.default_rng(7)
    samples = rng.lognormal(11, 0.6, 12_345).astype(np.int64)
    s = summarize(samples)
    expected = np.percentile(samples, [50, 90, 99, 99.9], method="linear")
    assert [s.p50_ns, s.p90_ns, s.p99_ns, s.p999_ns] == pytest.approx(list(expected), rel=1e-12)
    assert s.mean_ns == pytest.approx(float(samples.mean()))
    assert s.stdev_ns == pytest.approx(float(samples.std(ddof=1)))
    assert s.count == 12_345
    assert s.p50_ci_ns is not None and s.p99_ci_ns is not None
    assert s.p50_ci_ns[0] <= s.p50_ns <= s.p50_ci_ns[1]
    assert s.p99_ci_ns[0] <= s.p99_ns <= s.p99_ci_ns[1]


def test_summarize_does_not_reorder_the_callers_samples() -> None:
    samples = _ns([3, 1, 2])
    samples.setflags(write=False)
    summarize(samples)
    assert samples.tolist() == [3, 1, 2]


def test_summarize_a_million_samples_quickly() -> None:
    samples = np.random.default_rng(1).exponential(1e5, 1_000_000).astype(np.int64)
    start = time.perf_counter()
    s = summarize(samples)
    assert time.perf_counter() - start < 1.0
    assert s.count == 1_000_000
    assert s.p50_ci_ns is not None and s.p50_ci_ns[1] - s.p50_ci_ns[0] < 0.01 * s.p50_ns


@pytest.mark.parametrize(
    ("samples", "confidence", "message"),
    [
        ([], 0.95, "cannot summarize no samples"),
        ([5, -1], 0.95, r"a duration sample is negative \(-1 ns\)"),
        ([5], 1.0, "confidence must be between 0 and 1"),
        ([5], 0.0, "confidence must be between 0 and 1"),
    ],
)
def test_summarize_rejects(samples: list[int], confidence: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        summarize(_ns(samples), confidence)


def test_summary_is_frozen() -> None:
    s = summarize(_ns([1, 2]))
    assert isinstance(s, Summary)
    with pytest.raises(AttributeError):
        s.count = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("n", "q", "ranks"),
    [
        # Textbook ranks of the 95% distribution-free interval for the median.
        (6, 0.5, (1, 6)),
        (10, 0.5, (2, 9)),
        (100, 0.5, (40, 61)),
    ],
)
def test_quantile_ci_exact_ranks(n: int, q: float, ranks: tuple[int, int]) -> None:
    ordered = np.arange(1, n + 1, dtype=np.int64) * 10  # rank r holds 10 * r
    ci = quantile_ci(ordered, q, 0.95)
    assert ci == (10.0 * ranks[0], 10.0 * ranks[1])


@pytest.mark.parametrize(
    ("n", "q", "confidence"),
    [(5, 0.5, 0.95), (50, 0.99, 0.95), (0, 0.5, 0.95), (10, 0.5, 0.999)],
)
def test_quantile_ci_none_when_too_few_samples(n: int, q: float, confidence: float) -> None:
    assert quantile_ci(np.arange(n, dtype=np.int64), q, confidence) is None


def test_quantile_ci_p99_needs_368_samples_at_95_percent() -> None:
    # The upper bound needs P(all samples below the p99) = 0.99**n <= 2.5%: n >= 367.04.
    assert quantile_ci(np.arange(367, dtype=np.int64), 0.99, 0.95) is None
    # Lower rank 360: P(B <= 359) = 0.013 <= 2.5% < P(B <= 360) = 0.034.
    assert quantile_ci(np.arange(368, dtype=np.int64), 0.99, 0.95) == (359.0, 367.0)


@pytest.mark.parametrize("n", [1001, 2000, 5000, 20_000, 200_000])
@pytest.mark.parametrize("q", [0.5, 0.9, 0.99])
def test_normal_ranks_stay_within_one_of_exact(n: int, q: float) -> None:
    exact = stats._exact_ranks(n, q, 0.025)
    normal = stats._normal_ranks(n, q, 0.025)
    assert exact is not None and normal is not None
    assert abs(exact[0] - normal[0]) <= 1 and abs(exact[1] - normal[1]) <= 1


@pytest.mark.parametrize(
    ("n", "q", "trials"),
    [
        (200, 0.5, 1000),  # exact binomial
        (1000, 0.99, 600),  # exact binomial (n*q*(1-q) too small for the normal)
        (5000, 0.5, 300),  # normal approximation
        (20_000, 0.99, 300),  # normal approximation
    ],
)
def test_quantile_ci_covers_the_true_quantile(n: int, q: float, trials: int) -> None:
    rng = np.random.default_rng(12345 + n)
    scale = 1e9  # exponential with a 1 s mean, in ns: ties are negligible
    true_quantile = -math.log1p(-q) * scale
    covered = 0
    widths = []
    for _ in range(trials):
        ordered = np.sort(rng.exponential(scale, n).astype(np.int64))
        ci = quantile_ci(ordered, q, 0.95)
        assert ci is not None
        covered += ci[0] <= true_quantile <= ci[1]
        widths.append(ci[1] - ci[0])
    coverage = covered / trials
    # At least the nominal 95%, with room for sampling noise; an interval so wide that it
    # always covers (say the whole sample) would fail the upper bound.
    assert 0.92 <= coverage <= 0.995, coverage
    assert float(np.median(widths)) < 0.5 * true_quantile


@pytest.mark.parametrize(("q", "confidence"), [(0.0, 0.95), (1.0, 0.95), (0.5, 1.5)])
def test_quantile_ci_rejects_levels_outside_0_1(q: float, confidence: float) -> None:
    with pytest.raises(ValueError, match="must be between 0 and 1"):
        quantile_ci(np.arange(10, dtype=np.int64), q, confidence)


@pytest.mark.parametrize(
    ("q", "n"), [(0.5, 2), (0.9, 10), (0.99, 100), (0.999, 1000), (0.9999, 10_000), (0.75, 4)]
)
def test_min_samples_for(q: float, n: int) -> None:
    assert min_samples_for(q) == n


def test_min_samples_for_rejects_q_of_one() -> None:
    with pytest.raises(ValueError, match="q must be between 0 and 1"):
        min_samples_for(1.0)
