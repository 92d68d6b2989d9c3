"""A compact, mergeable quantile sketch of duration samples, small enough for one JUnit property.

The sketch is a relative-error histogram in the manner of DDSketch (Masson, Rim and Lee, "DDSketch:
a fast and fully-mergeable quantile sketch with relative-error guarantees", VLDB 2019): with
relative accuracy ``a`` and ``gamma = (1 + a) / (1 - a)``, a sample ``x >= 1`` ns is counted in
bucket ``i = ceil(log_gamma(x))``, which holds the values in ``(gamma**(i-1), gamma**i]``; the
bucket's representative value ``2 * gamma**i / (gamma + 1)`` is within ``a`` of every one of them,
relatively. Zeros have their own count. Buckets are indexed alike in every sketch of the same
accuracy, so two sketches merge by adding counts, and two runs compare bucket by bucket.

At the default 1% accuracy, durations from 1 ns to 1000 s fall in fewer than 1400 buckets
whatever the number of samples; a million latencies serialize to well under a kilobyte.

Serialized form (:meth:`Sketch.to_string`): ``tfs1:`` followed by the URL-safe base64 of the
zlib-compressed payload, which is a sequence of LEB128 varints: accuracy in parts per million,
count, zero count, exact min, exact max and exact sum (integer nanoseconds), the first bucket's
index (zigzag-encoded), the number of buckets, then each bucket's count.
"""

from __future__ import annotations

import base64
import binascii
import math
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

__all__ = ["DEFAULT_ACCURACY", "FORMAT_PREFIX", "Sketch"]

#: Relative accuracy of sketches made by default: every quantile within 1% of the exact one.
DEFAULT_ACCURACY = 0.01
#: Every serialized sketch starts with this; a later format gets a new one.
FORMAT_PREFIX = "tfs1:"

_PPM = 1_000_000
# A payload of 10^5 bytes is hundreds of times larger than any honest sketch: refusing to
# inflate further keeps a hostile or corrupt property from costing memory.
_MAX_PAYLOAD = 100_000
_MAX_BUCKETS = 50_000


def _gamma(accuracy: float) -> float:
    return (1.0 + accuracy) / (1.0 - accuracy)


def _check_accuracy(accuracy: float) -> None:
    if not 0.0 < accuracy < 0.5:
        raise ValueError(f"sketch accuracy must be between 0 and 0.5 (exclusive), got {accuracy!r}")


def _as_samples(samples_ns: npt.ArrayLike) -> npt.NDArray[np.int64]:
    values = np.asarray(samples_ns)
    if values.dtype.kind == "b" or values.dtype.kind not in "iuf":
        raise ValueError(f"samples must be numbers of nanoseconds, got dtype {values.dtype}")
    values = values.reshape(-1)
    if values.dtype.kind == "f":
        if not np.all(np.isfinite(values)):
            raise ValueError("a duration sample is NaN or infinite")
        if not np.all(values == np.round(values)):
            raise ValueError("duration samples must be whole nanoseconds")
    ints = values.astype(np.int64)
    if len(ints) and int(ints.min()) < 0:
        raise ValueError(f"a duration sample is negative ({int(ints.min())} ns)")
    return ints


@dataclass(frozen=True, eq=False)
class Sketch:
    """A relative-error quantile sketch (DDSketch-style log buckets) of nanosecond durations.

    ``counts[j]`` counts the samples in bucket ``offset + j``; ``zero_count`` the samples of
    0 ns. ``min_ns``, ``max_ns`` and ``sum_ns`` are exact. Make one with :meth:`from_samples`
    or :meth:`from_string`.
    """

    accuracy: float
    offset: int
    counts: npt.NDArray[np.int64] = field(repr=False)
    zero_count: int
    min_ns: int
    max_ns: int
    sum_ns: int

    @classmethod
    def from_samples(cls, samples_ns: npt.ArrayLike, accuracy: float = DEFAULT_ACCURACY) -> Sketch:
        """Sketch whole-nanosecond durations (any shape, any integer dtype, >= 0)."""
        _check_accuracy(accuracy)
        ns = _as_samples(samples_ns)
        if len(ns) == 0:
            return cls._make(accuracy, 0, np.zeros(0, np.int64), 0, 0, 0, 0)
        positive = ns[ns > 0]
        zeros = len(ns) - len(positive)
        if len(positive):
            index = np.ceil(np.log(positive) / math.log(_gamma(accuracy))).astype(np.int64)
            low = int(index.min())
            counts = np.bincount(index - low).astype(np.int64)
        else:
            low, counts = 0, np.zeros(0, np.int64)
        return cls._make(
            accuracy, low, counts, zeros, int(ns.min()), int(ns.max()), int(ns.sum(dtype=np.int64))
        )

    @classmethod
    def _make(
        cls,
        accuracy: float,
        offset: int,
        counts: npt.NDArray[np.int64],
        zero_count: int,
        min_ns: int,
        max_ns: int,
        sum_ns: int,
    ) -> Sketch:
        counts = np.ascontiguousarray(counts, dtype=np.int64)
        nonzero = np.flatnonzero(counts)
        if len(nonzero):  # trim empty buckets at both ends: the form is then canonical
            offset += int(nonzero[0])
            counts = counts[nonzero[0] : nonzero[-1] + 1].copy()
        else:
            offset, counts = 0, np.zeros(0, np.int64)
        counts.setflags(write=False)
        return cls(accuracy, offset, counts, zero_count, min_ns, max_ns, sum_ns)

    @property
    def count(self) -> int:
        """How many samples the sketch holds."""
        return self.zero_count + int(self.counts.sum())

    @property
    def mean_ns(self) -> float:
        """The exact mean of the samples (NaN for an empty sketch)."""
        return self.sum_ns / self.count if self.count else math.nan

    def values(self) -> npt.NDArray[np.float64]:
        """One value per bucket, ascending: 0 for the zero bucket if it holds samples, then each
        log bucket's representative value, clamped to the exact min and max."""
        gamma = _gamma(self.accuracy)
        index = np.arange(self.offset, self.offset + len(self.counts), dtype=np.float64)
        reps = np.clip(2.0 * gamma**index / (gamma + 1.0), self.min_ns, self.max_ns)
        return np.concatenate(([0.0], reps)) if self.zero_count else reps

    def weights(self) -> npt.NDArray[np.int64]:
        """The sample count of each of :meth:`values`."""
        zeros = np.array([self.zero_count] if self.zero_count else [], np.int64)
        return np.concatenate((zeros, self.counts))

    def quantile(self, q: float) -> float:
        """The ``q``-quantile, interpolated between order statistics as ``numpy.quantile``'s
        default (linear) method does, each order statistic replaced by its bucket's
        representative value: the result is within ``accuracy`` of the exact quantile,
        relatively (plus float rounding). Raises ValueError for an empty sketch.
        """
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"a quantile must be between 0 and 1, got {q!r}")
        if self.count == 0:
            raise ValueError("an empty sketch has no quantiles")
        weights = self.weights()
        return float(quantiles_from_counts(self.values(), weights[np.newaxis, :], q)[0])

    def expand(self) -> npt.NDArray[np.float64]:
        """All samples, each replaced by its bucket's representative value, in ascending order:
        the data quantized to the sketch's accuracy (``count`` values)."""
        return np.repeat(self.values(), self.weights())

    def resample(self, rng: np.random.Generator, n: int | None = None) -> npt.NDArray[np.float64]:
        """``n`` (default :attr:`count`) values drawn with replacement from :meth:`expand`,
        i.e. a bootstrap sample of the quantized data, in random order."""
        size = self.count if n is None else n
        if size < 0:
            raise ValueError(f"cannot draw {size} samples")
        if self.count == 0:
            if size:
                raise ValueError("cannot draw samples from an empty sketch")
            return np.zeros(0, np.float64)
        weights = self.weights()
        drawn = rng.multinomial(size, weights / weights.sum())
        out = np.repeat(self.values(), drawn)
        rng.shuffle(out)
        return out

    def merge(self, other: Sketch) -> Sketch:
        """A sketch of both sketches' samples together (same accuracy only)."""
        if other.accuracy != self.accuracy:
            raise ValueError(
                f"cannot merge sketches of accuracy {self.accuracy} and {other.accuracy}"
            )
        if other.count == 0:
            return self
        if self.count == 0:
            return other
        spans = [(s.offset, s.counts) for s in (self, other) if len(s.counts)]
        offset = min((start for start, _ in spans), default=0)
        end = max((start + len(counts) for start, counts in spans), default=0)
        counts = np.zeros(end - offset, np.int64)
        for start, part in spans:
            counts[start - offset : start - offset + len(part)] += part
        return Sketch._make(
            self.accuracy,
            offset,
            counts,
            self.zero_count + other.zero_count,
            min(self.min_ns, other.min_ns),
            max(self.max_ns, other.max_ns),
            self.sum_ns + other.sum_ns,
        )

    def to_string(self) -> str:
        """The sketch as one short ASCII string (see the module docstring for the format)."""
        parts = [
            round(self.accuracy * _PPM),
            self.count,
            self.zero_count,
            self.min_ns,
            self.max_ns,
            self.sum_ns,
            _zigzag(self.offset),
            len(self.counts),
        ]
        payload = bytearray()
        for number in parts:
            _put_varint(payload, number)
        for count in self.counts.tolist():
            _put_varint(payload, count)
        packed = base64.urlsafe_b64encode(zlib.compress(bytes(payload), 9)).decode("ascii")
        return FORMAT_PREFIX + packed

    @classmethod
    def from_string(cls, text: str) -> Sketch:
        """Read a sketch written by :meth:`to_string`.

        Raises ValueError saying what is wrong: another format or version, bad base64, a
        truncated or corrupt payload (zlib's checksum catches altered bytes), or numbers that
        contradict each other.
        """
        if not isinstance(text, str):
            raise ValueError(f"a sketch is a string, not {type(text).__name__}")
        text = text.strip()
        if not text.startswith(FORMAT_PREFIX):
            head = text.split(":", 1)[0] if ":" in text else text[:12]
            raise ValueError(
                f"not a tfgrpc sketch: expected a string starting with {FORMAT_PREFIX!r}, "
                f"got {head!r}"
            )
        body = text[len(FORMAT_PREFIX) :]
        try:
            packed = base64.urlsafe_b64decode(body.encode("ascii"))
        except (binascii.Error, UnicodeEncodeError, ValueError) as error:
            raise ValueError(f"corrupt sketch: bad base64 ({error})") from None
        inflate = zlib.decompressobj()
        try:
            payload = inflate.decompress(packed, _MAX_PAYLOAD)
        except zlib.error as error:
            raise ValueError(f"corrupt sketch: {error}") from None
        if inflate.unconsumed_tail:
            raise ValueError(f"corrupt sketch: payload larger than {_MAX_PAYLOAD} bytes")
        if not inflate.eof:
            raise ValueError("corrupt sketch: truncated (the compressed stream does not end)")
        if inflate.unused_data:
            raise ValueError("corrupt sketch: bytes after the compressed stream")
        numbers = _read_varints(payload)
        try:
            ppm, count, zeros, min_ns, max_ns, sum_ns, offset, buckets = [
                next(numbers) for _ in range(8)
            ]
            counts = [next(numbers) for _ in range(min(buckets, _MAX_BUCKETS + 1))]
        except StopIteration:
            raise ValueError("corrupt sketch: the payload ends early") from None
        if next(numbers, None) is not None:
            raise ValueError("corrupt sketch: numbers after the last bucket")
        if buckets > _MAX_BUCKETS:
            raise ValueError(f"corrupt sketch: {buckets} buckets (at most {_MAX_BUCKETS})")
        accuracy = ppm / _PPM
        try:
            _check_accuracy(accuracy)
        except ValueError as error:
            raise ValueError(f"corrupt sketch: {error}") from None
        if zeros + sum(counts) != count:
            raise ValueError(
                f"corrupt sketch: buckets hold {zeros + sum(counts)} samples, header says {count}"
            )
        if count and not (min_ns <= max_ns and min_ns * count <= sum_ns <= max_ns * count):
            raise ValueError("corrupt sketch: min, max and sum contradict each other")
        if count == 0 and (min_ns or max_ns or sum_ns):
            raise ValueError("corrupt sketch: an empty sketch with a min, max or sum")
        if zeros and min_ns != 0:
            raise ValueError("corrupt sketch: zero samples counted but min is not 0")
        if counts and (counts[0] == 0 or counts[-1] == 0):
            raise ValueError("corrupt sketch: empty buckets at an end")
        return cls(
            accuracy,
            _unzigzag(offset),
            _frozen(np.array(counts, dtype=np.int64)),
            zeros,
            min_ns,
            max_ns,
            sum_ns,
        )


def quantiles_from_counts(
    values: npt.NDArray[np.float64], counts: npt.NDArray[np.int64], q: float
) -> npt.NDArray[np.float64]:
    """The ``q``-quantile of each row of ``counts`` (samples per value of ascending ``values``),
    by linear interpolation between order statistics like ``numpy.quantile``'s default.

    Vectorised over rows so that a bootstrap of a sketch costs O(resamples * buckets), whatever
    the number of samples.
    """
    cumulative = np.cumsum(counts, axis=1)
    total = cumulative[:, -1]
    h = (total - 1) * q
    low = np.floor(h).astype(np.int64)
    high = np.minimum(low + 1, total - 1)
    # The 0-based order statistic r sits in the first value whose cumulative count exceeds r.
    at_low = (cumulative <= low[:, np.newaxis]).sum(axis=1)
    at_high = (cumulative <= high[:, np.newaxis]).sum(axis=1)
    below, above = values[at_low], values[at_high]
    result: npt.NDArray[np.float64] = below + (h - low) * (above - below)
    return result


def _frozen(array: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    array.setflags(write=False)
    return array


def _zigzag(n: int) -> int:
    return 2 * n if n >= 0 else -2 * n - 1


def _unzigzag(n: int) -> int:
    return n // 2 if n % 2 == 0 else -(n + 1) // 2


def _put_varint(out: bytearray, n: int) -> None:
    if n < 0:
        raise ValueError(f"cannot write {n} as an unsigned varint")
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return


def _read_varints(data: bytes) -> Iterator[int]:
    n = shift = 0
    for byte in data:
        n |= (byte & 0x7F) << shift
        if byte & 0x80:
            shift += 7
            if shift > 70:  # no honest field needs more than 64 bits
                raise ValueError("corrupt sketch: a number longer than 64 bits")
        else:
            yield n
            n = shift = 0
    if shift:
        raise ValueError("corrupt sketch: the payload ends inside a number")
