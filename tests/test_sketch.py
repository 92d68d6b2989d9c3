"""The quantile sketch: accuracy against exact quantiles, size, merging, the string form."""

from __future__ import annotations

import base64
import zlib

import numpy as np
import numpy.typing as npt
import pytest

from pytest_tfgrpc.stats.sketch import FORMAT_PREFIX, Sketch

QUANTILES = (0.0, 0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 1.0)


def _distributions() -> dict[str, npt.NDArray[np.int64]]:
    rng = np.random.default_rng(20240607)
    return {
        "lognormal": rng.lognormal(np.log(80_000), 0.6, 50_000).astype(np.int64),
        "bimodal": np.concatenate(
            (rng.normal(20_000, 500, 30_000), rng.normal(2_000_000, 90_000, 3_000))
        ).astype(np.int64),
        "exponential tail": (15_000 + rng.exponential(4_000, 20_000)).astype(np.int64),
        "small integers with zeros": rng.integers(0, 60, 5_000),
        "few samples": np.array([12_345, 99_000, 31_000, 31_001, 250_000]),
        "one sample": np.array([777]),
    }


def _write(numbers: list[int]) -> str:
    """A sketch string from raw payload numbers, to make well-formed but wrong payloads."""
    out = bytearray()
    for n in numbers:
        while True:
            out.append((n & 0x7F) | (0x80 if n >> 7 else 0))
            n >>= 7
            if not n:
                break
    return FORMAT_PREFIX + base64.urlsafe_b64encode(zlib.compress(bytes(out))).decode()


@pytest.mark.parametrize("accuracy", [0.01, 0.05])
@pytest.mark.parametrize("name", list(_distributions()))
def test_quantiles_are_within_the_relative_accuracy(name: str, accuracy: float) -> None:
    samples = _distributions()[name]
    sketch = Sketch.from_samples(samples, accuracy=accuracy)
    for q in QUANTILES:
        exact = float(np.quantile(samples, q))
        estimate = sketch.quantile(q)
        assert abs(estimate - exact) <= accuracy * exact * (1 + 1e-9), (q, exact, estimate)


def test_a_coarser_sketch_is_measurably_worse() -> None:
    # The accuracy bound is tight enough to matter: at 5% some quantile is off by more than 1%.
    samples = _distributions()["lognormal"]
    sketch = Sketch.from_samples(samples, accuracy=0.05)
    errors = [abs(sketch.quantile(q) / np.quantile(samples, q) - 1) for q in QUANTILES]
    assert max(errors) > 0.01


def test_count_min_max_sum_are_exact() -> None:
    samples = _distributions()["bimodal"]
    sketch = Sketch.from_samples(samples)
    assert sketch.count == len(samples)
    assert (sketch.min_ns, sketch.max_ns) == (int(samples.min()), int(samples.max()))
    assert sketch.sum_ns == int(samples.sum())
    assert sketch.mean_ns == pytest.approx(float(samples.mean()), rel=1e-12)


def test_a_million_samples_fit_in_a_few_kilobytes() -> None:
    rng = np.random.default_rng(7)
    # Five decades of latencies: 1 us to 100 ms.
    samples = np.exp(rng.uniform(np.log(1e3), np.log(1e8), 1_000_000)).astype(np.int64)
    text = Sketch.from_samples(samples).to_string()
    assert len(text) < 4096
    assert text.isascii() and "<" not in text and '"' not in text and "&" not in text


def test_round_trip_keeps_everything() -> None:
    for samples in _distributions().values():
        sketch = Sketch.from_samples(samples)
        back = Sketch.from_string(sketch.to_string())
        assert back.accuracy == sketch.accuracy
        assert back.offset == sketch.offset
        assert back.counts.tolist() == sketch.counts.tolist()
        assert (back.zero_count, back.min_ns, back.max_ns, back.sum_ns) == (
            sketch.zero_count,
            sketch.min_ns,
            sketch.max_ns,
            sketch.sum_ns,
        )
        assert [back.quantile(q) for q in QUANTILES] == [sketch.quantile(q) for q in QUANTILES]
        assert back.to_string() == sketch.to_string()


def test_empty_sketch_round_trips_and_has_no_quantiles() -> None:
    sketch = Sketch.from_samples(np.zeros(0, np.int64))
    back = Sketch.from_string(sketch.to_string())
    assert back.count == 0
    with pytest.raises(ValueError, match="empty sketch"):
        back.quantile(0.5)


def test_merge_equals_the_sketch_of_all_samples() -> None:
    rng = np.random.default_rng(3)
    a = rng.lognormal(10, 0.3, 4_000).astype(np.int64)
    b = np.concatenate((rng.lognormal(13, 0.3, 2_000).astype(np.int64), [0, 0]))
    merged = Sketch.from_samples(a).merge(Sketch.from_samples(b))
    assert merged.to_string() == Sketch.from_samples(np.concatenate((a, b))).to_string()
    empty = Sketch.from_samples(np.zeros(0, np.int64))
    assert empty.merge(Sketch.from_samples(a)).to_string() == Sketch.from_samples(a).to_string()


def test_merge_refuses_another_accuracy() -> None:
    with pytest.raises(ValueError, match="accuracy"):
        Sketch.from_samples([5]).merge(Sketch.from_samples([5], accuracy=0.02))


def test_expand_is_the_sorted_data_quantized_to_the_accuracy() -> None:
    samples = _distributions()["exponential tail"]
    expanded = Sketch.from_samples(samples).expand()
    assert len(expanded) == len(samples)
    assert np.all(np.diff(expanded) >= 0)
    exact = np.sort(samples).astype(np.float64)
    assert np.all(np.abs(expanded - exact) <= 0.01 * exact * (1 + 1e-9))


def test_resample_draws_from_the_buckets_reproducibly() -> None:
    sketch = Sketch.from_samples(_distributions()["lognormal"])
    first = sketch.resample(np.random.default_rng(11))
    again = sketch.resample(np.random.default_rng(11))
    other = sketch.resample(np.random.default_rng(12))
    assert len(first) == sketch.count
    assert np.array_equal(first, again)
    assert not np.array_equal(first, other)
    assert set(np.unique(first)) <= set(sketch.values())
    assert float(np.median(first)) == pytest.approx(sketch.quantile(0.5), rel=0.03)
    assert len(sketch.resample(np.random.default_rng(1), 10)) == 10


@pytest.mark.parametrize(
    ("samples", "message"),
    [
        ([5, -1], "negative"),
        ([1.5, 2.0], "whole nanoseconds"),
        ([float("nan")], "NaN"),
        (["5"], "dtype"),
    ],
)
def test_bad_samples_are_refused(samples: list[object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Sketch.from_samples(np.array(samples))


def test_bad_accuracy_is_refused() -> None:
    with pytest.raises(ValueError, match="accuracy"):
        Sketch.from_samples([1], accuracy=0.0)


def _valid() -> str:
    return Sketch.from_samples(_distributions()["lognormal"]).to_string()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "not a tfgrpc sketch"),
        ("tfs2:" + _valid()[5:], "not a tfgrpc sketch.*'tfs2'"),
        ("12.5", "not a tfgrpc sketch"),
        (FORMAT_PREFIX + "!!!not base64!!!", "bad base64"),
        (FORMAT_PREFIX + base64.urlsafe_b64encode(b"plain bytes").decode(), "corrupt sketch"),
        (_valid()[: len(_valid()) // 2 // 4 * 4], "truncated|corrupt"),
        (_write([10_000, 3, 0, 5, 9, 21, 0, 1, 4]), "buckets hold 4 samples, header says 3"),
        (_write([10_000, 2, 0, 5, 9, 14, 0, 1]), "ends early"),
        (_write([10_000, 2, 0, 5, 9, 14, 0, 1, 2, 7]), "after the last bucket"),
        (_write([10_000, 2, 0, 9, 5, 14, 0, 1, 2]), "min, max and sum contradict"),
        (_write([900_000, 2, 0, 5, 9, 14, 0, 1, 2]), "accuracy"),
        (_write([10_000, 2, 0, 5, 9, 14, 0, 2, 0, 2]), "empty buckets at an end"),
        (_write([10_000, 1, 1, 5, 5, 5, 0, 0]), "min is not 0"),
    ],
)
def test_corrupt_strings_raise_a_clear_value_error(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Sketch.from_string(text)


def test_a_flipped_character_is_caught() -> None:
    text = _valid()
    # Flip one character in the middle of the compressed body: zlib's checksum or the payload's
    # own consistency checks must notice; a silently different sketch is not acceptable.
    for position in range(len(FORMAT_PREFIX) + 4, len(text) - 4, 7):
        replacement = "A" if text[position] != "A" else "B"
        altered = text[:position] + replacement + text[position + 1 :]
        with pytest.raises(ValueError, match="corrupt"):
            Sketch.from_string(altered)


def test_a_hand_written_sketch_decodes_as_specified() -> None:
    # accuracy 1%, three samples: one of 0 ns, two in bucket 0 (1 ns), min 0, max 1, sum 2.
    sketch = Sketch.from_string(_write([10_000, 3, 1, 0, 1, 2, 0, 1, 2]))
    assert sketch.count == 3
    # Bucket 0's representative value is 2 / (gamma + 1) = 0.99 for gamma = 1.01 / 0.99.
    assert sketch.values().tolist() == pytest.approx([0.0, 0.99])
    assert sketch.weights().tolist() == [1, 2]
    assert sketch.to_string() == Sketch.from_samples([0, 1, 1]).to_string()
