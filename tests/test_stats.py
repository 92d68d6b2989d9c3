from __future__ import annotations

import math
import time

import numpy as np
import numpy.typing as npt
import pytest

from pytest_tfgrpc.stats.summary import Summary, min_samples_for, summarize


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


@pytest.mark.parametrize(
    ("samples", "message"),
    [
        ([], "cannot summarize no samples"),
        ([5, -1], r"a duration sample is negative \(-1 ns\)"),
    ],
)
def test_summarize_rejects(samples: list[int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        summarize(_ns(samples))


def test_summary_is_frozen() -> None:
    s = summarize(_ns([1, 2]))
    assert isinstance(s, Summary)
    with pytest.raises(AttributeError):
        s.count = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("q", "n"), [(0.5, 2), (0.9, 10), (0.99, 100), (0.999, 1000), (0.9999, 10_000), (0.75, 4)]
)
def test_min_samples_for(q: float, n: int) -> None:
    assert min_samples_for(q) == n


def test_min_samples_for_rejects_q_of_one() -> None:
    with pytest.raises(ValueError, match="q must be between 0 and 1"):
        min_samples_for(1.0)
