"""Baseline gates: reading runs from JUnit XML, the tests behind a verdict, tfgrpc-compare."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from junitparser.xunit2 import JUnitXml, TestCase, TestSuite

from pytest_tfgrpc.cli.compare import main
from pytest_tfgrpc.report.compare import (
    compare_figure,
    compare_runs,
    compare_test,
    format_comparison,
    min_samples,
)
from pytest_tfgrpc.report.junit import Baseline, BaselineError, load_baseline
from pytest_tfgrpc.report.record import (
    Key,
    Measurement,
    Outcome,
    Verdict,
    junit_test_id,
    read_record,
    result_properties,
    verdict_properties,
)
from pytest_tfgrpc.report.setup_check import check_metadata
from pytest_tfgrpc.report.tolerance import (
    ToleranceError,
    gated_metrics,
    parse_tolerances,
    tolerance_for,
)
from pytest_tfgrpc.results import BenchmarkResult, SizeResult
from pytest_tfgrpc.stats.significance import (
    MIN_SAMPLES_U,
    bootstrap_quantile_ratio,
    mann_whitney_u,
    mann_whitney_u_sketches,
)
from pytest_tfgrpc.stats.sketch import Sketch

Props = list[tuple[str, str]]

META = {
    "tfgrpc.meta.host": "node1",
    "tfgrpc.meta.grpcio": "1.85.3",
    "tfgrpc.meta.protobuf": "7.36.2",
    "tfgrpc.meta.python": "3.11.7",
    "tfgrpc.meta.cpus": "2",
    "tfgrpc.meta.plugin": "0.1.0",
    "tfgrpc.meta.fabric.lo.mtu": "65536",
}


def latencies(
    n: int, seed: int, scale: float = 1.0, median_ns: float = 50_000
) -> npt.NDArray[np.int64]:
    """Round-trip times: a lognormal body around ``median_ns``, ``scale``d."""
    rng = np.random.default_rng(seed)
    return (rng.lognormal(math.log(median_ns), 0.25, n) * scale).astype(np.int64)


def properties(
    samples: Mapping[int, npt.NDArray[np.int64]],
    *,
    benchmark: str = "p2p_latency",
    fabric: str = "lo",
    sketch: bool = True,
) -> Props:
    """A test's properties as the plugin records them (``sketch=False``: as a run that recorded
    no sketches)."""
    sizes = tuple(
        SizeResult.from_samples(size, size + 16, ns, int(ns.sum())) for size, ns in samples.items()
    )
    result = BenchmarkResult(benchmark, benchmark, fabric, "127.0.0.1:1", "raw", "unary", sizes)
    props = [("tfgrpc.fabric", fabric), ("tfgrpc.target", "127.0.0.1:1")]
    props += result_properties(result)  # the plugin records a sketch of every size
    if not sketch:
        props = [(name, value) for name, value in props if not name.endswith(".sketch")]
    return props


def write_junit(
    path: Path,
    tests: Mapping[str, Props],
    meta: Mapping[str, str] | None = None,
    *,
    nameless: bool = False,
) -> Path:
    """A JUnit XML file as pytest writes it: classname and name per test, meta as suite props."""
    suite = TestSuite("pytest")  # type: ignore[no-untyped-call]
    for name, value in (META if meta is None else meta).items():
        suite.add_property(name, value)
    for test_id, props in tests.items():
        classname, _, name = test_id.rpartition(".")
        case = TestCase(name, classname)
        for prop_name, value in props:
            case.add_property(prop_name, value)
        suite.add_testcase(case)
    if nameless:  # an interrupted run leaves a test case without a name
        suite.add_testcase(TestCase())
    xml = JUnitXml()
    xml.add_testsuite(suite)
    xml.write(str(path))
    return path


TEST = "tests.test_perf.test_latency[lo]"


def run(tmp_path: Path, name: str, tests: Mapping[str, Props], **kwargs: object) -> Baseline:
    return load_baseline(write_junit(tmp_path / name, tests, **kwargs))  # type: ignore[arg-type]


def verdicts_by_metric(
    baseline: Baseline, current: Baseline, **tolerances: float
) -> dict[tuple[str, str], Verdict]:
    tol = {"*": 0.10, "p99": 0.10, **tolerances}  # p99 is gated when named
    comparison = compare_runs(baseline, current, tol)
    return {(v.key.size, v.metric): v for v in comparison.verdicts}


# --- reading runs ------------------------------------------------------------------------------


def test_load_reads_figures_sketches_and_meta(tmp_path: Path) -> None:
    samples = latencies(2000, 1)
    baseline = run(tmp_path, "a.xml", {TEST: properties({1024: samples})}, nameless=True)
    key = Key(TEST, "lo", "p2p_latency", "1KiB")
    assert set(baseline.measurements) == {key}
    measurement = baseline.measurements[key]
    # Times are written to the nanosecond.
    assert measurement.figures["p99"] == pytest.approx(float(np.quantile(samples, 0.99)), abs=0.5)
    assert measurement.figures["samples"] == 2000
    assert measurement.sketch is not None and measurement.sketch.count == 2000
    assert (measurement.rpc, measurement.mode) == ("unary", "raw")
    assert baseline.meta["grpcio"] == "1.85.3"
    assert baseline.meta["fabric.lo.mtu"] == "65536"
    assert baseline.fabrics == {"lo"}


def test_meta_written_per_test_case_is_read_too(tmp_path: Path) -> None:
    # Under xdist, suite properties are lost; the plugin may write meta on test cases instead.
    props = [*properties({1024: latencies(100, 1)}), ("tfgrpc.meta.grpcio", "1.99.0")]
    baseline = run(tmp_path, "a.xml", {TEST: props}, meta={})
    assert baseline.meta["grpcio"] == "1.99.0"


@pytest.mark.parametrize("prefix", ["", "ci.run"])
def test_junit_test_id_matches_what_pytest_writes(pytester: pytest.Pytester, prefix: str) -> None:
    pytester.makepyfile(
        test_ids="""
        import pytest
        class TestA:
            @pytest.mark.parametrize("x", ["lo", "a.b::c", "\\x1b"])
            def test_b(self, x):
                pass
        def test_c():
            pass
        """
    )
    result = pytester.runpytest("--junitxml=out.xml", "-p", "no:tfgrpc", "--collect-only", "-q")
    nodeids = [line for line in result.outlines if "::" in line]
    given = [f"--junit-prefix={prefix}"] if prefix else []
    pytester.runpytest("--junitxml=out.xml", "-p", "no:tfgrpc", *given)
    xml = JUnitXml.fromfile(str(pytester.path / "out.xml"))
    written = {f"{case.classname}.{case.name}" for suite in xml for case in suite}
    assert len(nodeids) == 4
    assert {junit_test_id(nodeid, prefix) for nodeid in nodeids} == written


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "does not exist"),
        ("", "not well-formed XML"),
        ("<testsuites><testsuite><testcase name='a'>", "not well-formed XML, truncated"),
        ("\x00\x01binary", "not well-formed XML"),
        ("<html><body>oops</body></html>", "not JUnit XML"),
        ("<testsuites><testsuite><testcase name='a'/></testsuite></testsuites>", "no tfgrpc"),
    ],
)
def test_unusable_files_raise_baseline_error(
    tmp_path: Path, content: str | None, message: str
) -> None:
    path = tmp_path / "baseline.xml"
    if content is not None:
        path.write_text(content)
    with pytest.raises(BaselineError, match=message) as error:
        load_baseline(path)
    assert str(path) in str(error.value)


def test_a_truncated_real_file_raises_baseline_error(tmp_path: Path) -> None:
    path = write_junit(tmp_path / "a.xml", {TEST: properties({1024: latencies(500, 1)})})
    text = path.read_text()
    path.write_text(text[: len(text) * 2 // 3])
    with pytest.raises(BaselineError, match="not well-formed XML"):
        load_baseline(path)


def test_a_directory_raises_baseline_error(tmp_path: Path) -> None:
    with pytest.raises(BaselineError, match="cannot be read"):
        load_baseline(tmp_path)


def test_a_corrupt_sketch_or_figure_names_the_test_and_property(tmp_path: Path) -> None:
    props = properties({1024: latencies(100, 1)})
    broken = [(n, v[:-6] if n.endswith(".sketch") else v) for n, v in props]
    with pytest.raises(BaselineError, match=r"test tests\.test_perf.*1KiB\.sketch: corrupt"):
        run(tmp_path, "a.xml", {TEST: broken})
    broken = [(n, "fast" if n.endswith("p99_us") else v) for n, v in props]
    with pytest.raises(BaselineError, match=r"p99_us: 'fast' is not a number"):
        run(tmp_path, "b.xml", {TEST: broken})


# --- statistics -------------------------------------------------------------------------------

# Computed with scipy 1.17.1: scipy.stats.mannwhitneyu(x, y, method="asymptotic").
SCIPY_REFERENCE = [
    (
        [1.2, 3.4, 3.4, 5.0, 7.1, 8.8, 9.0, 12.5, 15.0],
        [0.9, 2.2, 3.4, 4.1, 4.1, 5.5, 6.0, 6.3, 7.0, 8.1],
        60.0,
        0.2354150622476946,
    ),
    ([5] * 6 + [6] * 4 + [7] * 3, [4] * 3 + [5] * 5 + [6] * 6, 119.0, 0.15487549083742821),
    (list(range(0, 200, 3)), list(range(10, 210, 2)), 3024.0, 0.2878649114090608),
]


@pytest.mark.parametrize(("x", "y", "u", "p"), SCIPY_REFERENCE)
def test_u_test_matches_scipy_reference_values(
    x: list[float], y: list[float], u: float, p: float
) -> None:
    test = mann_whitney_u(x, y)
    assert test.u == u
    assert test.p_value == pytest.approx(p, rel=1e-12)


def test_u_test_matches_scipy_on_random_data() -> None:
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(5)
    for n_x, n_y, shift in [(9, 9, 0.0), (30, 20, 0.4), (500, 700, 0.02), (12, 15, 2.0)]:
        x = np.round(rng.lognormal(0, 1, n_x) * (1 + shift), 1)  # rounded: ties
        y = np.round(rng.lognormal(0, 1, n_y), 1)
        reference = stats.mannwhitneyu(x, y, method="asymptotic")
        test = mann_whitney_u(x, y)
        assert test.u == pytest.approx(float(reference.statistic))
        assert test.p_value == pytest.approx(float(reference.pvalue), rel=1e-9)


def test_u_test_from_sketches_equals_the_test_on_bucket_indices() -> None:
    a, b = latencies(3000, 1), latencies(2000, 2, scale=1.05)
    sa, sb = Sketch.from_samples(a), Sketch.from_samples(b)
    gamma = 1.01 / 0.99
    # Two samples tie in the sketch exactly when they share a bucket index.
    index_a, index_b = np.ceil(np.log(a) / np.log(gamma)), np.ceil(np.log(b) / np.log(gamma))
    direct = mann_whitney_u(index_a, index_b)
    from_sketch = mann_whitney_u_sketches(sa, sb)
    assert from_sketch.u == direct.u
    assert from_sketch.p_value == pytest.approx(direct.p_value, rel=1e-12)
    assert not from_sketch.x_larger and from_sketch.p_value < 0.05


def test_u_test_of_identical_samples_is_not_significant() -> None:
    assert mann_whitney_u([5, 5, 5], [5, 5]).p_value == 1.0
    with pytest.raises(ValueError, match="both sides"):
        mann_whitney_u([], [1.0])


def test_bootstrap_is_seeded_and_brackets_a_known_ratio() -> None:
    base = Sketch.from_samples(latencies(5000, 1))
    slow = Sketch.from_samples(latencies(5000, 2, scale=1.3))
    low, high = bootstrap_quantile_ratio(base, slow, 0.99, seed=3)
    assert (low, high) == bootstrap_quantile_ratio(base, slow, 0.99, seed=3)
    assert low < 1.3 < high
    assert low > 1.1
    same_low, same_high = bootstrap_quantile_ratio(
        base, Sketch.from_samples(latencies(5000, 3)), 0.99
    )
    assert same_low < 1.0 < same_high


def test_bootstrap_intervals_cover_the_truth_about_as_often_as_they_claim() -> None:
    # 40 pairs of runs from one distribution: a 90% interval should miss 1.0 about 4 times.
    misses = 0
    for seed in range(40):
        base = Sketch.from_samples(latencies(2000, 100 + seed))
        cur = Sketch.from_samples(latencies(2000, 200 + seed))
        low, high = bootstrap_quantile_ratio(base, cur, 0.9, confidence=0.9, resamples=500)
        misses += not low <= 1.0 <= high
    assert misses <= 10


def test_min_samples_per_metric() -> None:
    assert min_samples("p50") == MIN_SAMPLES_U == 9
    assert min_samples("throughput") == 9
    assert min_samples("p90") == 100
    assert min_samples("p99") == 1000
    assert min_samples("p999") == 10_000


# --- verdicts ---------------------------------------------------------------------------------


def test_clear_slowdown_with_enough_samples_is_a_regression(tmp_path: Path) -> None:
    base = run(tmp_path, "a.xml", {TEST: properties({1024: latencies(2000, 1)})})
    cur = run(tmp_path, "b.xml", {TEST: properties({1024: latencies(2000, 2, scale=1.3)})})
    verdicts = verdicts_by_metric(base, cur)
    p50, p99 = verdicts[("1KiB", "p50")], verdicts[("1KiB", "p99")]
    assert p50.outcome is Outcome.REGRESSION and p99.outcome is Outcome.REGRESSION
    assert p50.method == "mann-whitney-u" and p50.p_value is not None and p50.p_value < 1e-10
    assert p99.method == "bootstrap" and p99.ci is not None and p99.ci[0] > 0.0
    assert p50.change == pytest.approx(0.3, abs=0.03)
    assert "worse than the 10% tolerance" in p50.reason and "p=" in p50.reason
    assert "CI" in p99.reason
    assert set(verdicts) == {("1KiB", "p50"), ("1KiB", "p99")}  # latency: no throughput


def test_same_distribution_passes(tmp_path: Path) -> None:
    base = run(tmp_path, "a.xml", {TEST: properties({1024: latencies(2000, 1)})})
    cur = run(tmp_path, "b.xml", {TEST: properties({1024: latencies(2000, 2)})})
    comparison = compare_runs(base, cur, parse_tolerances("10%, p99:10%"))
    assert [v.outcome for v in comparison.verdicts] == [Outcome.PASS, Outcome.PASS]
    assert not comparison.missing and not comparison.new and not comparison.mismatches


def test_slowdown_with_five_samples_is_inconclusive(tmp_path: Path) -> None:
    base = run(tmp_path, "a.xml", {TEST: properties({1024: latencies(5, 1)})})
    cur = run(tmp_path, "b.xml", {TEST: properties({1024: latencies(5, 2, scale=1.3)})})
    verdicts = verdicts_by_metric(base, cur)
    p50 = verdicts[("1KiB", "p50")]
    assert p50.outcome is Outcome.INCONCLUSIVE
    assert "has 5 samples" in p50.reason and ">= 9" in p50.reason
    assert verdicts[("1KiB", "p99")].outcome is Outcome.INCONCLUSIVE
    assert ">= 1000" in verdicts[("1KiB", "p99")].reason


def test_speedup_is_an_improvement(tmp_path: Path) -> None:
    base = run(tmp_path, "a.xml", {TEST: properties({1024: latencies(2000, 1)})})
    cur = run(tmp_path, "b.xml", {TEST: properties({1024: latencies(2000, 2, scale=0.7)})})
    verdicts = verdicts_by_metric(base, cur)
    assert verdicts[("1KiB", "p50")].outcome is Outcome.IMPROVEMENT
    assert verdicts[("1KiB", "p99")].outcome is Outcome.IMPROVEMENT


def test_small_significant_slowdown_within_tolerance_passes(tmp_path: Path) -> None:
    base = run(tmp_path, "a.xml", {TEST: properties({1024: latencies(20_000, 1)})})
    cur = run(tmp_path, "b.xml", {TEST: properties({1024: latencies(20_000, 2, scale=1.03)})})
    p50 = verdicts_by_metric(base, cur)[("1KiB", "p50")]
    assert p50.p_value is not None and p50.p_value < 1e-6  # significant ...
    assert p50.outcome is Outcome.PASS  # ... but within the 10% tolerance
    assert "within the 10% tolerance (significant" in p50.reason
    # With a 2% tolerance the same change is a regression.
    tight = verdicts_by_metric(base, cur, p50=0.02)[("1KiB", "p50")]
    assert tight.outcome is Outcome.REGRESSION


def test_large_but_noisy_change_is_inconclusive() -> None:
    rng = np.random.default_rng(9)
    base_ns = (rng.lognormal(math.log(50_000), 1.0, 9)).astype(np.int64)
    cur_ns = (base_ns * 1.25).astype(np.int64)[rng.permutation(9)]
    key = Key("t", "lo", "p2p_latency", "1KiB")
    base = Measurement(key, {"p50": float(np.median(base_ns))}, Sketch.from_samples(base_ns))
    cur = Measurement(key, {"p50": float(np.median(cur_ns))}, Sketch.from_samples(cur_ns))
    verdict = compare_figure(base, cur, "p50", 0.10)
    assert verdict.change == pytest.approx(0.25, abs=0.01)
    assert verdict.p_value is not None and verdict.p_value > 0.05
    assert verdict.outcome is Outcome.INCONCLUSIVE
    assert "beyond the 10% tolerance but is not significant" in verdict.reason


def test_figures_and_test_disagreeing_is_not_a_verdict_either_way() -> None:
    key = Key("t", "lo", "p2p_latency", "1KiB")
    base = Sketch.from_samples(latencies(2000, 1))
    faster, same = (
        Sketch.from_samples(latencies(2000, 2, 0.7)),
        Sketch.from_samples(latencies(2000, 2)),
    )
    # The figures say 30% slower, the samples say significantly faster: no regression claimed.
    verdict = compare_figure(
        Measurement(key, {"p50": 100.0}, base), Measurement(key, {"p50": 130.0}, faster), "p50", 0.1
    )
    assert verdict.outcome is Outcome.INCONCLUSIVE
    assert "finds the opposite" in verdict.reason
    # The figures say 30% faster, the samples show no significant change: nothing to fail.
    verdict = compare_figure(
        Measurement(key, {"p50": 100.0}, base), Measurement(key, {"p50": 70.0}, same), "p50", 0.025
    )
    assert verdict.outcome is Outcome.PASS
    assert "better but not significantly" in verdict.reason
    assert verdict.tolerance == 0.025


def test_tail_change_within_a_wide_bootstrap_interval_is_inconclusive() -> None:
    rng = np.random.default_rng(0)
    base_ns = rng.lognormal(math.log(50_000), 1.0, 1000).astype(np.int64)
    cur_ns = (rng.lognormal(math.log(50_000), 1.0, 1000) * 1.2).astype(np.int64)
    key = Key("t", "lo", "p2p_latency", "1KiB")
    base = Measurement(
        key, {"p99": float(np.quantile(base_ns, 0.99))}, Sketch.from_samples(base_ns)
    )
    cur = Measurement(key, {"p99": float(np.quantile(cur_ns, 0.99))}, Sketch.from_samples(cur_ns))
    verdict = compare_figure(base, cur, "p99", 0.10)
    assert verdict.change > 0.10
    assert verdict.ci is not None and verdict.ci[0] < 0.0 < verdict.ci[1]
    assert verdict.outcome is Outcome.INCONCLUSIVE
    assert "not significant (bootstrap 95% CI [-" in verdict.reason


def test_throughput_drop_is_a_regression_and_p99_of_50_is_inconclusive(tmp_path: Path) -> None:
    test = "tests.test_perf.test_bandwidth[lo]"
    size = 4 * 2**20
    old = properties({size: latencies(50, 1, median_ns=2e6)}, benchmark="p2p_bandwidth")
    new = properties({size: latencies(50, 2, 1.4, median_ns=2e6)}, benchmark="p2p_bandwidth")
    base, cur = run(tmp_path, "a.xml", {test: old}), run(tmp_path, "b.xml", {test: new})
    verdicts = verdicts_by_metric(base, cur, throughput=0.05, mean=0.10)
    throughput = verdicts[("4MiB", "throughput")]
    assert throughput.outcome is Outcome.REGRESSION
    assert throughput.change < -0.2 and throughput.tolerance == 0.05
    assert throughput.unit == "B/s"
    # The U test runs on durations; a rate's detectable change is on the rate's scale, as its
    # change is: the drop a detectably longer duration means (+x in time is -x/(1+x) in rate).
    rate, time = throughput.detectable, verdicts[("4MiB", "mean")].detectable
    assert 0 < rate < time
    assert rate == pytest.approx(1 - 1 / (1 + time), rel=1e-9)
    assert verdicts[("4MiB", "p99")].outcome is Outcome.INCONCLUSIVE
    # Throughput up is an improvement, not a regression.
    faster = properties({size: latencies(50, 2, 0.6, median_ns=2e6)}, benchmark="p2p_bandwidth")
    better = verdicts_by_metric(base, run(tmp_path, "c.xml", {test: faster}))
    assert better[("4MiB", "throughput")].outcome is Outcome.IMPROVEMENT


def test_without_sketches_there_is_no_verdict(tmp_path: Path) -> None:
    base = run(tmp_path, "a.xml", {TEST: properties({1024: latencies(2000, 1)}, sketch=False)})
    cur = run(tmp_path, "b.xml", {TEST: properties({1024: latencies(2000, 2, 1.5)})})
    p50 = verdicts_by_metric(base, cur)[("1KiB", "p50")]
    assert p50.outcome is Outcome.INCONCLUSIVE
    assert "baseline has no sketch" in p50.reason
    assert "tfgrpc.p2p_latency.1KiB.sketch" in p50.reason


def test_a_missing_figure_is_inconclusive_a_degenerate_one_invalid() -> None:
    key = Key("t", "lo", "p2p_latency", "1KiB")
    sketch = Sketch.from_samples(latencies(100, 1))
    good = Measurement(key, {"p50": 5.0}, sketch)
    missing = compare_figure(Measurement(key, {}, sketch), good, "p50", 0.1)
    assert missing.outcome is Outcome.INCONCLUSIVE and "no p50 figure" in missing.reason
    bad_values = [(math.nan, "is nan"), (0.0, "is 0"), (-3.0, "is -3"), (math.inf, "is inf")]
    for value, reason in bad_values:
        for old, new in [(Measurement(key, {"p50": value}, sketch), good),
                         (good, Measurement(key, {"p50": value}, sketch))]:  # fmt: skip
            verdict = compare_figure(old, new, "p50", 0.1)
            assert verdict.outcome is Outcome.INVALID, (value, verdict)
            assert reason in verdict.reason and "not a measurement" in verdict.reason


def test_missing_and_new_measurements_are_listed(tmp_path: Path) -> None:
    base = run(tmp_path, "a.xml", {TEST: properties({1024: latencies(100, 1)})})
    cur = run(tmp_path, "b.xml", {TEST: properties({4096: latencies(100, 1)})})
    comparison = compare_runs(base, cur, {})
    assert comparison.verdicts == ()
    assert [k.size for k in comparison.missing] == ["1KiB"]
    assert [k.size for k in comparison.new] == ["4KiB"]


def test_compare_test_takes_live_properties(tmp_path: Path) -> None:
    base = run(tmp_path, "a.xml", {TEST: properties({1024: latencies(2000, 1)})})
    nodeid = "tests/test_perf.py::test_latency[lo]"
    live = properties({1024: latencies(2000, 2, 1.3), 2048: latencies(2000, 3)})
    record = read_record(junit_test_id(nodeid), live)
    measured = record.by_key()
    assert set(measured) == {Key(TEST, "lo", "p2p_latency", s) for s in ("1KiB", "2KiB")}
    comparison = compare_test(base, record, {"*": 0.1, "p99": 0.1})
    assert {v.outcome for v in comparison.verdicts} == {Outcome.REGRESSION}
    assert [k.size for k in comparison.new] == ["2KiB"]
    recorded = dict(verdict_properties(comparison.verdicts, comparison.new))
    assert recorded["tfgrpc.p2p_latency.1KiB.p99.verdict"] == "regression"
    assert recorded["tfgrpc.p2p_latency.1KiB.p50.verdict_reason"].startswith("p50: +")
    assert recorded["tfgrpc.p2p_latency.2KiB.verdict"] == "no baseline"
    # Verdicts recorded on a test do not read back as figures of a later run.
    again = read_record(TEST, [*live, *recorded.items()])
    assert again.by_key().keys() == measured.keys()
    assert all(set(m.figures) == set(measured[m.key].figures) for m in again.measurements)
    # ... and read back as the verdicts they are.
    judged = {v.figure: v for v in again.verdicts}
    assert judged["p2p_latency.1KiB.p99"].outcome is Outcome.REGRESSION
    assert judged["p2p_latency.1KiB.p50"].reason.startswith("p50: +")
    assert [k.size for k in again.unjudged] == ["2KiB"]


# --- setup mismatches -------------------------------------------------------------------------


def test_baseline_from_another_fabric_is_a_mismatch(tmp_path: Path) -> None:
    base = run(tmp_path, "a.xml", {TEST: properties({1024: latencies(100, 1)})})
    eth = "tests.test_perf.test_latency[eth0]"
    meta = {**META, "tfgrpc.meta.fabric.eth0.mtu": "1500"}
    cur = run(
        tmp_path, "b.xml", {eth: properties({1024: latencies(100, 1)}, fabric="eth0")}, meta=meta
    )
    comparison = compare_runs(base, cur, {})
    assert [m.what for m in comparison.mismatches] == ["fabric"]
    assert "eth0" in comparison.mismatches[0].describe()
    assert "lo" in comparison.mismatches[0].describe()


def test_setup_differences_are_mismatches() -> None:
    key = Key("t", "lo", "p2p_latency", "1KiB")
    base = Baseline("a.xml", {key: Measurement(key, {})}, {"host": "n1", "grpcio": "1.85.3",
                                                           "fabric.lo.mtu": "65536"})  # fmt: skip
    meta = {"host": "n1", "grpcio": "1.86.0", "fabric.lo.mtu": "1500", "protobuf": "7.36.2"}
    found = {m.what: m for m in check_metadata(base, meta, ["lo"])}
    assert set(found) == {"grpcio", "fabric.lo.mtu", "protobuf"}
    assert found["grpcio"].describe() == "grpcio: baseline 1.85.3, current 1.86.0"
    assert found["protobuf"].baseline == "(not recorded)"
    assert check_metadata(base, dict(base.meta), ["lo"]) == ()


def test_fabric_names_with_dots_have_their_metadata_checked() -> None:
    key = Key("t", "ib0.8001", "p2p_latency", "1KiB")
    meta = {"fabric.ib0.8001.mtu": "2044", "fabric.ib0.8001.mode": "datagram"}
    base = Baseline("a.xml", {key: Measurement(key, {})}, meta)
    connected = {"fabric.ib0.8001.mtu": "65520", "fabric.ib0.8001.mode": "connected"}
    found = check_metadata(base, connected, ["ib0.8001"])
    assert [m.what for m in found] == ["fabric.ib0.8001.mode", "fabric.ib0.8001.mtu"]
    assert check_metadata(base, meta, ["ib0.8001"]) == ()


def test_baseline_without_metadata_is_a_mismatch() -> None:
    key = Key("t", "lo", "p2p_latency", "1KiB")
    base = Baseline("a.xml", {key: Measurement(key, {})}, hostname="n1")
    (mismatch,) = check_metadata(base, {"host": "n1", "grpcio": "1.85.3"}, ["lo"])
    assert mismatch.describe() == "run metadata: baseline (not recorded), current recorded"
    # Neither run recorded any: still said, never silently taken as the same setup.
    (mismatch,) = check_metadata(base, {"host": "n1"}, ["lo"])
    assert mismatch.describe() == "run metadata: baseline (not recorded), current (not recorded)"
    # pytest's hostname still tells another host apart.
    found = check_metadata(base, {"host": "n2"}, ["lo"])
    assert [m.describe() for m in found][1] == "host: baseline n1, current n2"


def test_hostname_stands_in_for_host(tmp_path: Path) -> None:
    base = run(tmp_path, "a.xml", {TEST: properties({1024: latencies(100, 1)})}, meta={})
    assert base.meta == {} and base.hostname == "" and base.setup() == {}
    path = tmp_path / "b.xml"
    write_junit(path, {TEST: properties({1024: latencies(100, 1)})}, meta={})
    path.write_text(path.read_text().replace("<testsuite ", '<testsuite hostname="n7" ', 1))
    assert load_baseline(path).setup() == {"host": "n7"}


def test_another_rpc_shape_is_a_mismatch(tmp_path: Path) -> None:
    props = properties({1024: latencies(100, 1)})
    stream = [(n, "stream" if n.endswith(".rpc") else v) for n, v in props]
    comparison = compare_runs(
        run(tmp_path, "a.xml", {TEST: props}), run(tmp_path, "b.xml", {TEST: stream}), {}
    )
    assert [m.describe() for m in comparison.mismatches] == [
        f"{TEST} p2p_latency.rpc: baseline unary, current stream"
    ]


# --- tolerances -------------------------------------------------------------------------------


def test_parse_tolerances() -> None:
    assert dict(parse_tolerances("10%")) == {"*": 0.10}
    assert dict(parse_tolerances(["p99:10%", "throughput: 5%"])) == {
        "p99": 0.10,
        "throughput": 0.05,
    }
    assert dict(parse_tolerances("p50:2.5%, p999:20% 7%")) == {
        "p50": 0.025,
        "p999": 0.20,
        "*": 0.07,
    }
    tolerances = parse_tolerances("p99:12%")
    assert tolerance_for(tolerances, "p99") == 0.12
    assert tolerance_for(tolerances, "p50") == 0.10  # the built-in default
    named = ("p50", "p99", "throughput", "step_p50", "step_p99", "rpc_rate", "step_rate")
    assert gated_metrics(tolerances) == (*named, "imbalance")  # p99 named, the rest default
    assert gated_metrics(parse_tolerances("mean:5%"))[:3] == ("mean", "p50", "throughput")
    assert "p99" not in gated_metrics({}) and "p99" in gated_metrics(parse_tolerances("p99:5%"))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("p98:10%", "'p98:10%'.*unknown metric 'p98'.*did you mean 'p99'"),
        ("max:10%", "single extreme sample"),
        ("p99:10", "'p99:10'.*percentage"),
        ("0.1", "'0.1'.*percentage"),
        ("p99:-5%", "finite number >= 0"),
        ("p99:nan%", "finite number >= 0"),
        ("p99:abc%", "'p99:abc%'"),
        ("p99:10%,p99:5%", "'p99:5%'.*given twice"),
        ("5%,6%", "default tolerance is given twice"),
        (",", "empty tolerance"),
    ],
)
def test_bad_tolerances_name_the_item(spec: str, message: str) -> None:
    with pytest.raises(ToleranceError, match=message):
        parse_tolerances(spec)


# --- the table and the command ----------------------------------------------------------------


def test_format_comparison_is_an_aligned_table_with_reasons(tmp_path: Path) -> None:
    base = run(tmp_path, "a.xml", {TEST: properties({1024: latencies(2000, 1)})})
    cur = run(tmp_path, "b.xml", {TEST: properties({1024: latencies(2000, 2, 1.3)})})
    lines = format_comparison(compare_runs(base, cur, {"p99": 0.1}))
    header, *rows = lines[:3]
    assert header.split() == [
        "test", "benchmark", "fabric", "size", "metric", "baseline", "current", "change",
        "detectable", "verdict",
    ]  # fmt: skip
    assert all(row.split()[-1] == "REGRESSION" for row in rows)
    assert all(row.split()[-2].startswith(">=") for row in rows)
    assert len({row.index("1KiB") for row in rows}) == 1
    assert header.index("change") + len("change") == rows[0].index("%") + 1
    assert lines[3].startswith(f"regression: {TEST} on lo: p2p_latency 1KiB p50: +")


def _files(
    tmp_path: Path, scale: float, n: int = 2000, meta: Mapping[str, str] | None = None
) -> tuple[str, str]:
    old = write_junit(tmp_path / "old.xml", {TEST: properties({1024: latencies(n, 1)})})
    new = write_junit(
        tmp_path / "new.xml",
        {TEST: properties({1024: latencies(n, 2, scale)})},
        meta={**META, **(meta or {})},
    )
    return str(old), str(new)


def test_cli_passes_on_the_same_distribution(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*_files(tmp_path, 1.0)]) == 0
    out = capsys.readouterr().out
    assert "0 regressed" in out and out.rstrip().endswith(": OK")


def test_cli_fails_on_a_regression(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*_files(tmp_path, 1.3), "--max-regression", "p99:10%"]) == 1
    out = capsys.readouterr().out
    assert "REGRESSION" in out and "FAILED: 2 regressed" in out
    # A tolerance above the change lets it pass.
    assert main([*_files(tmp_path, 1.3), "--max-regression", "50%"]) == 0


@pytest.mark.parametrize(("policy", "status"), [("pass", 0), ("fail", 1)])
def test_cli_inconclusive_policy(tmp_path: Path, policy: str, status: int) -> None:
    assert main([*_files(tmp_path, 1.3, n=5), "--inconclusive", policy]) == status


@pytest.mark.parametrize(("policy", "status"), [("warn", 0), ("fail", 1)])
def test_cli_mismatch_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], policy: str, status: int
) -> None:
    old, new = _files(tmp_path, 1.0, meta={"tfgrpc.meta.grpcio": "1.90.0"})
    assert main([old, new, "--mismatch", policy]) == status
    assert "setup mismatch: grpcio: baseline 1.85.3, current 1.90.0" in capsys.readouterr().out


def test_cli_bad_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old, new = _files(tmp_path, 1.0)
    assert main([str(tmp_path / "absent.xml"), new]) == 2
    assert "absent.xml does not exist" in capsys.readouterr().err
    Path(new).write_text(Path(new).read_text()[:200])
    assert main([old, new]) == 2
    assert "not well-formed XML" in capsys.readouterr().err
    for bad in (["--max-regression", "p98:5%"], ["--alpha", "1.5"]):
        with pytest.raises(SystemExit) as exit_info:
            main([old, old, *bad])
        assert exit_info.value.code == 2


def test_cli_reads_comma_separated_and_repeated_tolerances(tmp_path: Path) -> None:
    old, new = _files(tmp_path, 1.05)
    args: Sequence[str] = [old, new, "--max-regression", "p50:2%,p99:50%", "--max-regression", "1%"]
    assert main(args) == 1


@pytest.mark.parametrize(("runs", "warned"), [(1, True), (2, True), (3, False), (4, False)])
def test_cli_says_when_the_history_is_too_short_to_know_the_spread(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], runs: int, warned: bool
) -> None:
    olds = [
        str(write_junit(tmp_path / f"old{i}.xml", {TEST: properties({1024: latencies(200, i)})}))
        for i in range(runs)
    ]
    _, new = _files(tmp_path, 1.0, n=200)
    assert main([*olds, new]) == 0
    err = capsys.readouterr().err
    expected = f"tfgrpc-compare: warning: the baseline holds {runs} run"
    assert (expected in err) is warned
    if warned:
        assert "the spread between runs is unknown below 3" in err
