"""Baseline gates: read two runs' JUnit XML, and say per figure whether it regressed.

A run's figures are the ``tfgrpc.<label>.<size>.<metric>_<unit>`` properties of its test cases;
``tfgrpc.<label>.<size>.sketch`` holds a :class:`~pytest_tfgrpc.stats.sketch.Sketch` of the same
samples, which is what makes a significance test possible after the fact.

A comparison of one figure has four outcomes (:class:`Outcome`). A **regression** is a change
for the worse that is both larger than the metric's tolerance and statistically significant at
level ``alpha``; an **improvement** is the same for the better. A change within the tolerance
**passes**, significant or not. A change beyond the tolerance that is not significant, or too
few samples to test at all, is **inconclusive**. The tests, on the sketched samples:

- ``p50``, ``mean``, ``throughput``, ``throughput_p50``: the Mann-Whitney U test (two-sided,
  normal approximation with tie and continuity corrections, as ``scipy.stats.mannwhitneyu``
  with ``method="asymptotic"``), which needs at least :data:`MIN_SAMPLES_U` samples per run,
  the rule Google Benchmark's ``compare.py`` uses.
- ``p90``, ``p99``, ``p999``: a percentile bootstrap confidence interval, at level
  ``1 - alpha``, of the ratio of the current quantile to the baseline's. A tail quantile is
  an order statistic, for which no t-test holds; the bootstrap needs no model of it, but does
  need samples beyond it: at least :data:`MIN_TAIL_SAMPLES` per run (p99: 1000 samples).

Throughput is size over duration, so it is tested on the same duration samples with the
direction reversed. ``min`` and ``max`` are not gated: a single extreme sample has no sampling
distribution worth testing.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from fractions import Fraction
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from pytest_tfgrpc.stats.sketch import Sketch, quantiles_from_counts
from pytest_tfgrpc.units import format_duration, format_rate, parse_size

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_METRICS",
    "DEFAULT_RESAMPLES",
    "DEFAULT_TOLERANCE",
    "GATED_METRICS",
    "META_CHECKED",
    "MIN_SAMPLES_U",
    "MIN_TAIL_SAMPLES",
    "Baseline",
    "BaselineError",
    "Comparison",
    "GatedMetric",
    "Key",
    "Measurement",
    "Mismatch",
    "Outcome",
    "ToleranceError",
    "UTest",
    "Verdict",
    "bootstrap_quantile_ratio",
    "check_metadata",
    "compare_figure",
    "compare_runs",
    "compare_test",
    "format_comparison",
    "gated_metrics",
    "junit_test_id",
    "load_baseline",
    "mann_whitney_u",
    "mann_whitney_u_sketches",
    "measurements_from_properties",
    "min_samples",
    "parse_tolerances",
    "tolerance_for",
    "verdict_properties",
]

PREFIX = "tfgrpc."
META_PREFIX = "tfgrpc.meta."
SKETCH_METRIC = "sketch"

DEFAULT_ALPHA = 0.05
#: The tolerance of every metric that ``--tfgrpc-max-regression`` does not name.
DEFAULT_TOLERANCE = 0.10
#: The key of :func:`parse_tolerances`' result that holds a bare ``10%``.
ANY_METRIC = "*"
#: Google Benchmark's compare.py: "at least 9 repetitions" for its U test.
MIN_SAMPLES_U = 9
#: Samples beyond a tail quantile that its bootstrap needs in each run (p99: 10 of 1000).
MIN_TAIL_SAMPLES = 10
DEFAULT_RESAMPLES = 2000
MAX_RESAMPLES = 100_000
_RESAMPLE_BLOCK = 500  # bootstrap rows drawn at once: bounds memory at 500 x buckets counts

#: Run metadata (``tfgrpc.meta.<key>``) that must agree between baseline and current run;
#: ``fabric.<name>.<attribute>`` keys are checked too for every fabric both runs used.
META_CHECKED = ("host", "grpcio", "protobuf", "python", "cpus")


class BaselineError(ValueError):
    """A run's JUnit XML that cannot serve for a comparison; the message says which and why."""


class ToleranceError(ValueError):
    """A ``--tfgrpc-max-regression`` value that cannot be read; the message quotes the item."""


# ---------------------------------------------------------------------------------------------
# Metrics and tolerances


@dataclass(frozen=True)
class GatedMetric:
    """A figure that baselines gate, and how: ``quantile`` set means a bootstrap of that
    quantile, None a Mann-Whitney U test of the durations. ``higher_is_better`` for rates."""

    name: str
    unit: str  # "ns" or "B/s"
    quantile: float | None = None
    higher_is_better: bool = False


GATED_METRICS: Mapping[str, GatedMetric] = MappingProxyType(
    {
        m.name: m
        for m in (
            GatedMetric("p50", "ns"),
            GatedMetric("mean", "ns"),
            GatedMetric("p90", "ns", 0.9),
            GatedMetric("p99", "ns", 0.99),
            GatedMetric("p999", "ns", 0.999),
            GatedMetric("throughput", "B/s", higher_is_better=True),
            GatedMetric("throughput_p50", "B/s", higher_is_better=True),
        )
    }
)
#: Compared whenever a run has them; other gated metrics only when a tolerance names them.
DEFAULT_METRICS = ("p50", "p99", "throughput")

_TOLERANCE = re.compile(r"^(?:(?P<metric>[A-Za-z_][A-Za-z0-9_]*)\s*:\s*)?(?P<value>.*?)\s*$")


def parse_tolerances(spec: str | Iterable[str]) -> Mapping[str, float]:
    """Read ``--tfgrpc-max-regression`` values: ``10%``, ``p99:10%``, ``throughput:5%``.

    ``spec`` is one string (items separated by commas or spaces) or several. A bare percentage
    is the tolerance of every metric not named; the result holds it under ``"*"``. Tolerances
    are fractions (10% -> 0.1) of the baseline value. Raises :class:`ToleranceError` quoting
    the bad item: an unknown or ungated metric, a number without ``%``, a negative or non-finite
    percentage, or a metric given twice.
    """
    items = [spec] if isinstance(spec, str) else list(spec)
    out: dict[str, float] = {}
    for raw in items:
        if not isinstance(raw, str):
            raise ToleranceError(
                f"cannot read {raw!r} as a tolerance: expected text like 'p99:10%'"
            )
        # "p99: 10%" is one item: join around colons before splitting on spaces.
        text = re.sub(r"\s*:\s*", ":", raw.strip())
        for item in re.split(r"\s*,\s*|\s+", text):
            _parse_tolerance_item(item, out)
    return MappingProxyType(out)


def _parse_tolerance_item(item: str, out: dict[str, float]) -> None:
    if not item:
        raise ToleranceError("empty tolerance: expected '10%' or 'METRIC:10%', e.g. 'p99:10%'")
    match = _TOLERANCE.match(item)
    assert match is not None  # the pattern matches any string
    metric = match["metric"] or ANY_METRIC
    text = match["value"]
    if metric != ANY_METRIC and metric not in GATED_METRICS:
        why = f"unknown metric {metric!r}"
        if metric in ("min", "max"):
            why = f"{metric} is a single extreme sample, which no test can gate"
        message = (
            f"cannot read tolerance {item!r}: {why}; gated metrics are {', '.join(GATED_METRICS)}"
        )
        close = difflib.get_close_matches(metric, list(GATED_METRICS), n=1)
        if close and metric not in ("min", "max"):
            message += f"; did you mean {close[0]!r}?"
        raise ToleranceError(message)
    if not text.endswith("%"):
        raise ToleranceError(
            f"cannot read tolerance {item!r}: expected a percentage such as '10%' "
            "(relative to the baseline value)"
        )
    try:
        percent = float(text[:-1])
    except ValueError:
        percent = math.nan
    if not math.isfinite(percent) or percent < 0:
        raise ToleranceError(
            f"cannot read tolerance {item!r}: the percentage must be a finite number >= 0"
        )
    if metric in out:
        which = "the default tolerance" if metric == ANY_METRIC else f"metric {metric!r}"
        raise ToleranceError(f"cannot read tolerance {item!r}: {which} is given twice")
    out[metric] = percent / 100.0


def tolerance_for(tolerances: Mapping[str, float], metric: str) -> float:
    """The tolerance of ``metric``: its own, else the bare one, else :data:`DEFAULT_TOLERANCE`."""
    return tolerances.get(metric, tolerances.get(ANY_METRIC, DEFAULT_TOLERANCE))


def gated_metrics(tolerances: Mapping[str, float]) -> tuple[str, ...]:
    """The metrics a comparison covers: :data:`DEFAULT_METRICS` and those ``tolerances`` name."""
    return tuple(m for m in GATED_METRICS if m in DEFAULT_METRICS or m in tolerances)


def min_samples(metric: str) -> int:
    """Samples each run needs for a verdict on ``metric``: :data:`MIN_SAMPLES_U` for the U test;
    for a quantile q, enough that :data:`MIN_TAIL_SAMPLES` lie beyond it (``10 / (1 - q)``)."""
    gated = GATED_METRICS[metric]
    if gated.quantile is None:
        return MIN_SAMPLES_U
    # Fraction of the decimal q, so that 10 / (1 - 0.99) is 1000 and not 1000.0000000000009.
    beyond = 1 - Fraction(repr(gated.quantile))
    return max(MIN_SAMPLES_U, math.ceil(MIN_TAIL_SAMPLES / beyond))


# ---------------------------------------------------------------------------------------------
# Statistics


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


# ---------------------------------------------------------------------------------------------
# Runs as recorded in JUnit XML


class Key(NamedTuple):
    """What identifies a set of figures across runs: test id, fabric, label and size label."""

    test: str
    fabric: str
    label: str
    size: str

    def describe(self) -> str:
        fabric = f" on {self.fabric}" if self.fabric else ""
        return f"{self.test}{fabric}: {self.label} {self.size}"


def _sort_key(key: Key) -> tuple[str, str, int, str, str]:
    try:
        size = parse_size(key.size)
    except ValueError:
        size = -1
    return (key.test, key.label, size, key.size, key.fabric)


@dataclass(frozen=True)
class Measurement:
    """The figures of one benchmark label and message size of one test, as a run recorded them.

    ``figures`` are in base units (ns, B/s; ``samples`` a count), keyed by metric name without
    its unit (``p99``, ``throughput``); ``sketch`` is the sketch of the duration samples, or
    None when the run recorded none.
    """

    key: Key
    figures: Mapping[str, float]
    sketch: Sketch | None = None
    rpc: str = ""
    mode: str = ""

    @property
    def samples(self) -> int:
        """The sample count: the sketch's, else the ``samples`` figure, else 0."""
        if self.sketch is not None:
            return self.sketch.count
        count = self.figures.get("samples", 0.0)
        return int(count) if math.isfinite(count) else 0


@dataclass(frozen=True)
class Baseline:
    """A recorded run: its measurements by :class:`Key`, and its run metadata.

    ``meta`` maps ``tfgrpc.meta.<key>`` properties by ``<key>`` (``host``, ``grpcio``,
    ``fabric.eth0.mtu``); ``hostname`` is the ``<testsuite hostname>`` pytest writes, which
    stands in for ``host`` where the run recorded no metadata. The current run, loaded the same
    way, is a Baseline too.
    """

    source: str
    measurements: Mapping[Key, Measurement]
    meta: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    hostname: str = ""

    def setup(self) -> dict[str, str]:
        """``meta``, with ``hostname`` as ``host`` where it records no host."""
        out = dict(self.meta)
        if self.hostname:
            out.setdefault("host", self.hostname)
        return out

    @property
    def fabrics(self) -> frozenset[str]:
        """The fabrics the run measured on."""
        return frozenset(key.fabric for key in self.measurements if key.fabric)

    def for_test(self, test: str) -> dict[Key, Measurement]:
        """The measurements of one test id."""
        return {k: m for k, m in self.measurements.items() if k.test == test}


#: How a property's unit suffix converts to the base unit: (suffix, base unit, multiplier).
_SUFFIXES = (("_us", "ns", 1e3), ("_MBps", "B/s", 1e6))


def _metric_of(name: str) -> tuple[str, float] | None:
    """The metric and multiplier to base units of a figure property's last part."""
    if name == "samples":
        return name, 1.0
    for suffix, _, multiplier in _SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)], multiplier
    return None


def junit_test_id(nodeid: str) -> str:
    """A pytest node id as the JUnit XML names its test case, ``<classname>.<name>``.

    This is how pytest's junitxml mangles ids (``tests/test_x.py::TestA::test_b[lo]`` ->
    ``tests.test_x.TestA.test_b[lo]``), so that a live test and a baseline's test case share a
    key.
    """
    path, bracket, params = nodeid.partition("[")
    names = path.split("::")
    names[0] = re.sub(r"\.py$", "", names[0].replace("/", "."))
    names[-1] += bracket + params
    return ".".join(names)


def measurements_from_properties(
    test: str, properties: Iterable[tuple[str, object]], source: str = "current run"
) -> dict[Key, Measurement]:
    """The measurements of one test from its ``(name, value)`` properties (``test`` is its
    JUnit id, see :func:`junit_test_id`). Raises :class:`BaselineError` for a figure that is
    not a number or a sketch that does not decode, naming ``source``, the test and property."""
    props = [(str(name), str(value)) for name, value in properties]
    fabric = next((v for n, v in props if n == f"{PREFIX}fabric"), "")
    figures: dict[tuple[str, str], dict[str, float]] = {}
    sketches: dict[tuple[str, str], Sketch] = {}
    how: dict[str, dict[str, str]] = {}
    for name, value in props:
        if not name.startswith(PREFIX) or name.startswith(META_PREFIX):
            continue
        parts = name[len(PREFIX) :].split(".")
        if len(parts) == 2 and parts[1] in ("rpc", "mode"):
            how.setdefault(parts[0], {})[parts[1]] = value
            continue
        if len(parts) != 3:
            continue
        label, size, last = parts
        where = f"{source}: test {test}: property {name}"
        if last == SKETCH_METRIC:
            try:
                sketches[(label, size)] = Sketch.from_string(value)
            except ValueError as error:
                raise BaselineError(f"{where}: {error}") from None
            continue
        metric = _metric_of(last)
        if metric is None:
            continue
        try:
            number = float(value)
        except ValueError:
            raise BaselineError(f"{where}: {value!r} is not a number") from None
        figures.setdefault((label, size), {})[metric[0]] = number * metric[1]
    out = {}
    for label, size in sorted(figures.keys() | sketches.keys()):
        key = Key(test, fabric, label, size)
        out[key] = Measurement(
            key,
            MappingProxyType(figures.get((label, size), {})),
            sketches.get((label, size)),
            how.get(label, {}).get("rpc", ""),
            how.get(label, {}).get("mode", ""),
        )
    return out


def load_baseline(path: str | os.PathLike[str]) -> Baseline:
    """Read a run from its JUnit XML (any ``junit_family``; test cases without a name, as an
    interrupted run leaves, are skipped).

    Raises :class:`BaselineError` when the file is missing or unreadable, is not well-formed
    XML (a truncated file is not), is not JUnit XML, holds a figure that is not a number or a
    sketch that does not decode, or holds no tfgrpc figure at all: a comparison never passes
    for want of a baseline.
    """
    from junitparser import JUnitXmlError
    from junitparser.xunit2 import JUnitXml

    where = f"baseline {os.fspath(path)}"
    try:
        xml = JUnitXml.fromfile(os.fspath(path))
    except FileNotFoundError:
        raise BaselineError(f"{where} does not exist") from None
    except OSError as error:
        raise BaselineError(f"{where} cannot be read: {error.strerror or error}") from None
    except SyntaxError as error:  # ElementTree's ParseError (and lxml's) derive from it
        raise BaselineError(
            f"{where} is not well-formed XML, truncated or corrupt? ({error})"
        ) from None
    except JUnitXmlError:
        raise BaselineError(
            f"{where} is not JUnit XML: its root element is neither <testsuites> nor <testsuite>"
        ) from None
    meta: dict[str, str] = {}
    measurements: dict[Key, Measurement] = {}
    cases = 0
    hostname = ""
    for suite in xml:
        for name, value in _properties(suite):
            _add_meta(meta, name, value)
        hostname = hostname or str(suite.hostname or "")
        case: Any
        for case in suite:
            if not case.name:
                continue
            cases += 1
            properties = _properties(case)
            for name, value in properties:
                _add_meta(meta, name, value)
            test = f"{case.classname}.{case.name}" if case.classname else str(case.name)
            measurements.update(measurements_from_properties(test, properties, where))
    if not measurements:
        raise BaselineError(
            f"{where} holds no tfgrpc figures ({cases} named test cases): was it written by "
            "pytest --junitxml with pytest-tfgrpc benchmarks?"
        )
    return Baseline(
        os.fspath(path), MappingProxyType(measurements), MappingProxyType(meta), hostname
    )


def _properties(element: Any) -> list[tuple[str, str]]:
    """The named properties of a junitparser xunit2 test suite or test case."""
    return [(p.name, p.value or "") for p in element.properties() if p.name is not None]


def _add_meta(meta: dict[str, str], name: str, value: str) -> None:
    if name.startswith(META_PREFIX):
        meta.setdefault(name[len(META_PREFIX) :], value)


@dataclass(frozen=True)
class Mismatch:
    """Something that differs between the baseline's setup and the current run's."""

    what: str
    baseline: str
    current: str

    def describe(self) -> str:
        return f"{self.what}: baseline {self.baseline}, current {self.current}"


_NOT_RECORDED = "(not recorded)"


def check_metadata(
    baseline: Baseline, meta: Mapping[str, str], fabrics: Iterable[str]
) -> tuple[Mismatch, ...]:
    """How the current run's setup (``meta`` as in :attr:`Baseline.meta`, and the fabrics it
    measured on) differs from the baseline's: a fabric the baseline never measured, and any of
    :data:`META_CHECKED` or ``fabric.<name>.*`` (MTU, speed, IPoIB mode) that differs or is
    recorded by one run only. A baseline without metadata is itself a mismatch (only its
    host, from pytest's ``hostname``, can then be checked): nothing says it comes from the same
    setup. The caller decides what a mismatch costs."""
    out = []
    fabrics = frozenset(fabrics)
    for fabric in sorted(fabrics - baseline.fabrics):
        known = ", ".join(sorted(baseline.fabrics)) or "none"
        out.append(Mismatch("fabric", f"measured on {known}", f"measures on {fabric}"))
    old_setup = baseline.setup()
    keys = {"host"}
    if baseline.meta:
        keys.update(META_CHECKED)
        # Match by known names: a fabric name may hold dots itself (IPoIB child ib0.8001).
        prefixes = tuple(f"fabric.{name}." for name in fabrics & baseline.fabrics)
        keys.update(key for key in old_setup.keys() | meta.keys() if key.startswith(prefixes))
    else:
        recorded = "recorded" if set(meta) - {"host"} else _NOT_RECORDED
        out.append(Mismatch("run metadata", _NOT_RECORDED, recorded))
    for key in sorted(keys):
        old, new = old_setup.get(key), meta.get(key)
        if old != new:
            out.append(Mismatch(key, old or _NOT_RECORDED, new or _NOT_RECORDED))
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# Verdicts


class Outcome(str, Enum):
    """What a comparison of one figure concluded."""

    PASS = "pass"
    REGRESSION = "regression"
    IMPROVEMENT = "improvement"
    INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True)
class Verdict:
    """The outcome of one figure's comparison, with the numbers behind it.

    ``baseline`` and ``current`` are in the metric's base unit (``unit``: ns or B/s); ``change``
    is ``current / baseline - 1`` (NaN when undefined). ``method`` names the test
    (``mann-whitney-u`` or ``bootstrap``, empty when none ran); ``p_value`` is the U test's,
    ``ci`` the bootstrap interval of the relative change at level ``1 - alpha``. ``reason`` is
    one line for people.
    """

    key: Key
    metric: str
    outcome: Outcome
    baseline: float
    current: float
    change: float
    tolerance: float
    unit: str
    baseline_samples: int
    current_samples: int
    reason: str
    method: str = ""
    p_value: float | None = None
    ci: tuple[float, float] | None = None
    alpha: float = DEFAULT_ALPHA


def _pct(x: float) -> str:
    return f"{x:+.1%}" if math.isfinite(x) else "n/a"


def _figure(measurement: Measurement, metric: str) -> float | None:
    return measurement.figures.get(metric)


def compare_figure(
    baseline: Measurement,
    current: Measurement,
    metric: str,
    tolerance: float,
    *,
    alpha: float = DEFAULT_ALPHA,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> Verdict:
    """Compare one figure of one test, fabric, label and size between two runs.

    The change is taken from the recorded figures; its significance from the sketches (see
    the module docstring: Mann-Whitney U for p50, mean and throughput; a bootstrap CI of the
    quantile ratio for p90, p99 and p999). Regression: worse by more than ``tolerance`` and
    significant at ``alpha``; improvement: the same for the better. Inconclusive: no sketch,
    too few samples (:func:`min_samples`), a figure missing, NaN or zero, or a change beyond
    the tolerance that is not significant.
    """
    if metric not in GATED_METRICS:
        raise ValueError(f"metric {metric!r} is not gated; gated are {', '.join(GATED_METRICS)}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be between 0 and 1 (exclusive), got {alpha!r}")
    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise ValueError(f"a tolerance must be a finite fraction >= 0, got {tolerance!r}")
    gated = GATED_METRICS[metric]
    old, new = _figure(baseline, metric), _figure(current, metric)
    base_value = old if old is not None else math.nan
    cur_value = new if new is not None else math.nan
    change = cur_value / base_value - 1.0 if base_value else math.nan

    p_value: float | None = None
    ci: tuple[float, float] | None = None
    method = ""

    def verdict(outcome: Outcome, reason: str) -> Verdict:
        return Verdict(
            key=current.key,
            metric=metric,
            outcome=outcome,
            baseline=base_value,
            current=cur_value,
            change=change,
            tolerance=tolerance,
            unit=gated.unit,
            baseline_samples=baseline.samples,
            current_samples=current.samples,
            reason=f"{metric}: {reason}",
            method=method,
            p_value=p_value,
            ci=ci,
            alpha=alpha,
        )

    inconclusive = Outcome.INCONCLUSIVE
    for name, value in (("baseline", old), ("current run", new)):
        if value is None:
            return verdict(inconclusive, f"the {name} has no {metric} figure")
        if not math.isfinite(value):
            return verdict(inconclusive, f"the {name}'s {metric} is {value}")
    if not base_value:
        return verdict(inconclusive, f"the baseline's {metric} is 0: no relative change")
    for name, m in (("baseline", baseline), ("current run", current)):
        if m.sketch is None:
            return verdict(
                inconclusive,
                f"the {name} has no sketch of its samples to test significance "
                f"(property tfgrpc.{m.key.label}.{m.key.size}.{SKETCH_METRIC})",
            )
    assert baseline.sketch is not None and current.sketch is not None
    needed = min_samples(metric)
    for name, m in (("baseline", baseline), ("current run", current)):
        if m.samples < needed:
            what = "a Mann-Whitney U test" if gated.quantile is None else f"resolving {metric}"
            return verdict(
                inconclusive,
                f"{_pct(change)}, but the {name} has {m.samples} samples: {what} needs >= {needed}",
            )
    # `direction` is +1 when the test finds the current run significantly worse, -1 better, and
    # 0 not significant; durations that grew are worse for every metric (throughput is size
    # over duration).
    if gated.quantile is None:
        test = mann_whitney_u_sketches(current.sketch, baseline.sketch)
        method, p_value = "mann-whitney-u", test.p_value
        direction = (1 if test.x_larger else -1) if test.p_value < alpha else 0
        evidence = f"Mann-Whitney U p={test.p_value:.2g}"
    else:
        low, high = bootstrap_quantile_ratio(
            baseline.sketch,
            current.sketch,
            gated.quantile,
            confidence=1.0 - alpha,
            resamples=resamples,
            seed=seed,
        )
        method = "bootstrap"
        if not (math.isfinite(low) and math.isfinite(high)):
            return verdict(inconclusive, "the bootstrap is undefined (a resampled value of 0)")
        ci = (low - 1.0, high - 1.0)
        direction = 1 if low > 1.0 else -1 if high < 1.0 else 0
        evidence = f"bootstrap {1 - alpha:.0%} CI [{_pct(ci[0])}, {_pct(ci[1])}]"
    limit = f"{_percent(tolerance)} tolerance"
    moved = _pct(change)
    # Positive `worse` is a change for the worse, whichever way the metric runs.
    worse = -change if gated.higher_is_better else change
    if abs(worse) > tolerance:
        bad = worse > 0
        if direction == (1 if bad else -1):
            outcome = Outcome.REGRESSION if bad else Outcome.IMPROVEMENT
            side = "worse" if bad else "better"
            return verdict(outcome, f"{moved} is {side} than the {limit}, significant ({evidence})")
        if direction == 0 and not bad:
            return verdict(Outcome.PASS, f"{moved} is better but not significantly ({evidence})")
        why = "is not significant" if direction == 0 else "the test finds the opposite"
        return verdict(inconclusive, f"{moved} is beyond the {limit} but {why} ({evidence})")
    significance = "significant" if direction else "not significant"
    return verdict(Outcome.PASS, f"{moved} is within the {limit} ({significance}: {evidence})")


def _percent(fraction: float) -> str:
    """A tolerance as written: 10%, 2.5%."""
    return f"{fraction * 100:g}%"


@dataclass(frozen=True)
class Comparison:
    """A whole run against its baseline: a verdict per test, fabric, label, size and metric;
    the measurements only the baseline has (``missing``) or only the current run (``new``);
    and how the two setups differ (``mismatches``)."""

    verdicts: tuple[Verdict, ...]
    missing: tuple[Key, ...] = ()
    new: tuple[Key, ...] = ()
    mismatches: tuple[Mismatch, ...] = ()

    def with_outcome(self, outcome: Outcome) -> tuple[Verdict, ...]:
        return tuple(v for v in self.verdicts if v.outcome is outcome)

    @property
    def regressions(self) -> tuple[Verdict, ...]:
        return self.with_outcome(Outcome.REGRESSION)

    @property
    def improvements(self) -> tuple[Verdict, ...]:
        return self.with_outcome(Outcome.IMPROVEMENT)

    @property
    def inconclusive(self) -> tuple[Verdict, ...]:
        return self.with_outcome(Outcome.INCONCLUSIVE)

    def summary(self) -> str:
        """One line: how many of each outcome, missing, new, mismatches."""
        words = {
            Outcome.PASS: "passed",
            Outcome.REGRESSION: "regressed",
            Outcome.IMPROVEMENT: "improved",
            Outcome.INCONCLUSIVE: "inconclusive",
        }
        counts = ", ".join(f"{len(self.with_outcome(o))} {words[o]}" for o in Outcome)
        mismatches = len(self.mismatches)
        return (
            f"{counts}; {len(self.missing)} missing, {len(self.new)} new; {mismatches} setup "
            f"{'mismatch' if mismatches == 1 else 'mismatches'}"
        )


def _compare_measurements(
    old: Mapping[Key, Measurement],
    new: Mapping[Key, Measurement],
    tolerances: Mapping[str, float],
    alpha: float,
    resamples: int,
    seed: int,
) -> tuple[list[Verdict], list[Mismatch]]:
    verdicts: list[Verdict] = []
    mismatches: list[Mismatch] = []
    metrics = gated_metrics(tolerances)
    for key in sorted(old.keys() & new.keys(), key=_sort_key):
        base, cur = old[key], new[key]
        for attribute in ("rpc", "mode"):
            was, now = getattr(base, attribute), getattr(cur, attribute)
            if was and now and was != now:
                what = f"{key.test} {key.label}.{attribute}"
                if not any(m.what == what for m in mismatches):
                    mismatches.append(Mismatch(what, was, now))
        for metric in metrics:
            if metric not in base.figures and metric not in cur.figures:
                continue
            verdicts.append(
                compare_figure(
                    base,
                    cur,
                    metric,
                    tolerance_for(tolerances, metric),
                    alpha=alpha,
                    resamples=resamples,
                    seed=seed,
                )
            )
    return verdicts, mismatches


def compare_runs(
    baseline: Baseline,
    current: Baseline,
    tolerances: Mapping[str, float],
    *,
    alpha: float = DEFAULT_ALPHA,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> Comparison:
    """Compare every figure of every measurement both runs have (see :func:`compare_figure`;
    the metrics are :func:`gated_metrics`), and list what only one run has and how the setups
    differ (:func:`check_metadata`, and a label measured with another rpc or mode)."""
    verdicts, mismatches = _compare_measurements(
        baseline.measurements, current.measurements, tolerances, alpha, resamples, seed
    )
    setup = check_metadata(baseline, current.setup(), current.fabrics)
    return Comparison(
        tuple(verdicts),
        tuple(sorted(baseline.measurements.keys() - current.measurements.keys(), key=_sort_key)),
        tuple(sorted(current.measurements.keys() - baseline.measurements.keys(), key=_sort_key)),
        (*setup, *mismatches),
    )


def compare_test(
    baseline: Baseline,
    test: str,
    properties: Iterable[tuple[str, object]],
    tolerances: Mapping[str, float],
    *,
    alpha: float = DEFAULT_ALPHA,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> Comparison:
    """Compare one finished test, from its properties, with its baseline measurements
    (``test`` is its JUnit id, :func:`junit_test_id`). ``missing`` lists what the baseline
    measured for this test and the test no longer did; ``new`` what has no baseline.
    Setup mismatches are the caller's to check once per run (:func:`check_metadata`)."""
    current = measurements_from_properties(test, properties)
    old = baseline.for_test(test)
    verdicts, mismatches = _compare_measurements(old, current, tolerances, alpha, resamples, seed)
    return Comparison(
        tuple(verdicts),
        tuple(sorted(old.keys() - current.keys(), key=_sort_key)),
        tuple(sorted(current.keys() - old.keys(), key=_sort_key)),
        tuple(mismatches),
    )


def verdict_properties(comparison: Comparison) -> list[tuple[str, str]]:
    """JUnit properties of a test's verdicts: ``tfgrpc.<label>.<size>.<metric>.verdict`` (the
    outcome: pass, regression, improvement or inconclusive), ``...<metric>.verdict_reason``
    (its one-line reason) and ``...<metric>.change`` (current / baseline - 1, when defined);
    and ``tfgrpc.<label>.<size>.verdict`` = ``no baseline`` for each measurement the baseline
    lacks."""
    out = []
    for v in comparison.verdicts:
        name = f"{PREFIX}{v.key.label}.{v.key.size}.{v.metric}"
        out.append((f"{name}.verdict", v.outcome.value))
        out.append((f"{name}.verdict_reason", v.reason))
        if math.isfinite(v.change):
            out.append((f"{name}.change", repr(v.change)))
    for key in comparison.new:
        out.append((f"{PREFIX}{key.label}.{key.size}.verdict", "no baseline"))
    return out


def _format_value(value: float, unit: str) -> str:
    if not math.isfinite(value):
        return "-"
    return format_duration(value) if unit == "ns" else format_rate(value)


def format_comparison(comparison: Comparison, *, reasons: bool = True) -> list[str]:
    """An aligned table (test, benchmark, fabric, size, metric, baseline, current, change,
    verdict), then, with ``reasons``, one line per verdict other than pass saying why, the
    measurements only one run has, and the setup mismatches."""
    header = (
        "test", "benchmark", "fabric", "size", "metric", "baseline", "current", "change", "verdict"
    )  # fmt: skip
    table = [header]
    for v in comparison.verdicts:
        table.append(
            (
                v.key.test,
                v.key.label,
                v.key.fabric or "-",
                v.key.size,
                v.metric,
                _format_value(v.baseline, v.unit),
                _format_value(v.current, v.unit),
                _pct(v.change) if math.isfinite(v.change) else "-",
                v.outcome.value.upper() if v.outcome is Outcome.REGRESSION else v.outcome.value,
            )
        )
    lines = []
    if comparison.verdicts:
        widths = [max(len(row[i]) for row in table) for i in range(len(header))]
        for row in table:
            cells = [c.ljust(w) for c, w in zip(row[:5], widths[:5], strict=True)]
            cells += [c.rjust(w) for c, w in zip(row[5:8], widths[5:8], strict=True)]
            cells.append(row[8])
            lines.append("  ".join(cells).rstrip())
    else:
        lines.append("no figure in common to compare")
    if not reasons:
        return lines
    for v in comparison.verdicts:
        if v.outcome is not Outcome.PASS:
            lines.append(f"{v.outcome.value}: {v.key.describe()} {v.reason}")
    for key in comparison.missing:
        lines.append(f"missing: {key.describe()} is in the baseline, not in the current run")
    for key in comparison.new:
        lines.append(f"new: {key.describe()} has no baseline")
    for mismatch in comparison.mismatches:
        lines.append(f"setup mismatch: {mismatch.describe()}")
    return lines
