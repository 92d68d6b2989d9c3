"""The metric registry and the property codec, and what is asked of them: every figure
declared once, every gateable figure gated, every budget metric with a tolerance, one error
for every bad budget, floors marked."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from junitparser.xunit2 import JUnitXml, TestCase, TestSuite

from pytest_tfgrpc.bench.ps import PSResult
from pytest_tfgrpc.cli.compare import main as compare_main
from pytest_tfgrpc.metrics import (
    BUDGET_METRICS,
    GATED,
    METRICS,
    SIGNIFICANT,
    GateTest,
    is_floor,
)
from pytest_tfgrpc.report.budget import BudgetError, parse_budget
from pytest_tfgrpc.report.compare import compare_test
from pytest_tfgrpc.report.gate import BaselineGate, settings_from_options
from pytest_tfgrpc.report.junit import load_baseline
from pytest_tfgrpc.report.record import (
    Outcome,
    TestRecord,
    figure_name,
    read_record,
    result_properties,
)
from pytest_tfgrpc.report.tolerance import DEFAULT_METRICS, ToleranceError, parse_tolerances
from pytest_tfgrpc.results import BenchmarkResult, Cluster, CpuTime, PSLoad, SizeResult

TEST = "test_perf.test_steps[lo]"
NODEID = "test_perf.py::test_steps[lo]"


def _steps(n: int, seed: int, scale: float = 1.0) -> npt.NDArray[np.int64]:
    rng = np.random.default_rng(seed)
    return (rng.lognormal(math.log(40e6), 0.05, n) * scale).astype(np.int64)


def _ps_point(
    samples: npt.NDArray[np.int64], *, step: bool, imbalance: float = 1.25, rate_scale: float = 1
) -> SizeResult:
    total = int(samples.sum())
    load = PSLoad(0, "127.0.0.1:1", 1, 100, 100, 100, 4, 4, CpuTime(1000, 2000))
    return SizeResult.from_samples(
        1_000_000,
        1_000_000,
        samples,
        total,
        key="hep_cnn",
        step=step,
        rate_per_s=len(samples) * 1e9 / total * rate_scale,
        rate_Bps=1e6 * len(samples) * 1e9 / total,
        per_ps=(load,),
        cpu={"workers": CpuTime(5000, 6000)},
        imbalance=imbalance,
        bytes_imbalance=None if step else 1.4,
    )


def _ps_result(point: SizeResult) -> PSResult:
    return PSResult(
        benchmark="sync_sgd_step" if point.step else "ps_throughput",
        label="sync_sgd_step" if point.step else "ps_throughput",
        fabric="lo",
        target="127.0.0.1:1",
        mode="protobuf",
        rpc="stream",
        cluster=Cluster(1, 2, "greedy"),
        sizes=(point,),
    )


def _p2p_result() -> BenchmarkResult:
    samples = _steps(50, 1)
    size = SizeResult.from_samples(
        1024,
        1040,
        samples,
        int(samples.sum()),
        cpu={"client": CpuTime(1, 2), "server": CpuTime(3, 4)},
    )
    return BenchmarkResult("p2p_bandwidth", "p2p_bandwidth", "lo", "t", "raw", "unary", (size,))


def _props(result: PSResult | BenchmarkResult) -> list[tuple[str, str]]:
    return [("tfgrpc.fabric", "lo"), *result_properties(result)]


def _record(result: PSResult | BenchmarkResult) -> TestRecord:
    return read_record(TEST, _props(result))


def figure_value(metric: str, value: float) -> str:
    return METRICS[metric].unit.property_value(value)


def _write_junit(path: Path, properties: list[tuple[str, str]]) -> Path:
    case = TestCase("test_steps[lo]", "test_perf")
    for name, value in properties:
        case.add_property(name, value)
    suite = TestSuite("pytest")  # type: ignore[no-untyped-call]
    suite.add_testcase(case)
    xml = JUnitXml()
    xml.add_testsuite(suite)
    xml.write(str(path))
    return path


# --- the registry and the codec ----------------------------------------------------------------


@pytest.mark.parametrize(
    "result",
    [
        _p2p_result(),
        _ps_result(_ps_point(_steps(20, 1), step=True)),
        _ps_result(_ps_point(_steps(20, 1), step=False)),
    ],
    ids=["p2p", "sync_sgd_step", "ps_throughput"],
)
def test_every_recorded_figure_is_registered_and_reads_back(
    result: PSResult | BenchmarkResult,
) -> None:
    figures = [f for point in result.sizes for f in point.figures(rates=True)]
    assert {f.metric for f in figures} <= set(METRICS.values())
    (point,) = read_record("t", _props(result)).measurements
    for figure in figures:
        scoped = point.scoped[figure.scope] if figure.scope else point.figures
        value = scoped[figure.metric.name]
        # Written with the digits the measurement supports: times to the nanosecond, other
        # figures to SIGNIFICANT significant digits.
        if figure.metric.unit.base == "ns":
            assert value == pytest.approx(figure.value, abs=0.5)
        else:
            assert value == pytest.approx(figure.value, rel=10.0 ** (1 - SIGNIFICANT))


def test_codec_names_follow_the_readme() -> None:
    assert figure_name("p2p_latency", "1KiB", "p99") == "tfgrpc.p2p_latency.1KiB.p99_us"
    assert figure_name("x", "4MiB", "throughput") == "tfgrpc.x.4MiB.throughput_MBps"
    assert figure_name("ps", "64B", "rpc_rate") == "tfgrpc.ps.64B.rpc_rate_per_s"
    assert figure_name("ps", "64B", "imbalance") == "tfgrpc.ps.64B.imbalance"
    assert figure_name("ps", "64B", "bytes_in", "ps1") == "tfgrpc.ps.64B.ps1.bytes_in"
    assert figure_name("ps", "k", "cpu_user", "workers") == "tfgrpc.ps.k.workers.cpu_user_us"
    assert figure_value("p99", 1500.0) == "1.5"
    assert figure_value("samples", 20.0) == "20"
    for name in (
        "tfgrpc.meta.host",
        "tfgrpc.fabric",
        "tfgrpc.x.rpc",
        "tfgrpc.x.1KiB.sketch",
        "tfgrpc.x.1KiB.p99.verdict",
        "tfgrpc.x.1KiB.p99.change",
        "tfgrpc.x.model.step_us",
        "tfgrpc.x.k.model.alpha_us",
        "tfgrpc.x.1KiB.p99",  # a time without its unit is not the registered name
        "other.x.1KiB.p99_us",
    ):
        assert not read_record("t", [(name, "1")]).measurements, name


def test_floor_rows_are_marked_as_floors() -> None:
    record = read_record(
        "t",
        [("tfgrpc.p2p_latency_floor.1KiB.p50_us", "1"), ("tfgrpc.p2p_latency.1KiB.p50_us", "2")],
    )
    assert record.label("p2p_latency_floor").floor
    assert not record.label("p2p_latency").floor
    assert is_floor("p2p_bandwidth_floor") and not is_floor("_floor") and not is_floor("floor")


def test_ps_throughput_records_the_placement_and_the_measured_imbalance_apart() -> None:
    props = dict(_props(_ps_result(_ps_point(_steps(20, 1), step=False, imbalance=1.25))))
    assert props["tfgrpc.ps_throughput.hep_cnn.imbalance"] == "1.25"
    assert props["tfgrpc.ps_throughput.hep_cnn.bytes_imbalance"] == "1.4"
    steps = dict(_props(_ps_result(_ps_point(_steps(20, 1), step=True))))
    assert "tfgrpc.sync_sgd_step.hep_cnn.bytes_imbalance" not in steps


def test_every_metric_says_how_the_gate_treats_it() -> None:
    for metric in METRICS.values():
        assert metric.gated or metric.not_gated, metric.name
        if metric.gate is GateTest.BOOTSTRAP:
            assert metric.quantile is not None and metric.quantile > 0.5
    assert {"step_p50", "step_p99", "rpc_rate", "step_rate", "imbalance"} <= set(DEFAULT_METRICS)
    assert GATED["imbalance"].gate is GateTest.RATIO
    assert "bytes_imbalance" not in GATED


# --- tolerances ----------------------------------------------------------------------------


@pytest.mark.parametrize("metric", sorted(m for m in BUDGET_METRICS if METRICS[m].gated))
def test_every_gated_budget_metric_takes_a_tolerance(metric: str) -> None:
    assert dict(parse_tolerances(f"{metric}:5%")) == {metric: 0.05}


def test_only_single_extreme_samples_are_budget_metrics_without_a_tolerance() -> None:
    ungated = sorted(m for m in BUDGET_METRICS if not METRICS[m].gated)
    assert ungated == ["max", "min", "step_max", "step_min"]
    for metric in ungated:
        with pytest.raises(ToleranceError, match=f"{metric} is a single extreme sample"):
            parse_tolerances(f"{metric}:5%")
    with pytest.raises(ToleranceError, match="bytes_imbalance is one closed-loop value"):
        parse_tolerances("bytes_imbalance:5%")


def test_step_p99_tolerance_is_accepted_by_the_plugin_options_and_tfgrpc_compare(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = settings_from_options("b.xml", ["step_p99:5%"], alpha=None, inconclusive=None,
                                     bad_baseline=None, mismatch=None)  # fmt: skip
    assert settings.tolerances == {"step_p99": 0.05}
    xml = _write_junit(tmp_path / "a.xml", _props(_ps_result(_ps_point(_steps(20, 1), step=True))))
    assert compare_main([str(xml), str(xml), "--max-regression", "step_p99:5%"]) == 0
    assert "step_p50" in capsys.readouterr().out


# --- the gate on a sync-SGD step -------------------------------------------------------------


@pytest.mark.parametrize("steps", [20, 1200])
def test_the_gate_flags_a_sync_sgd_step_50_percent_slower(tmp_path: Path, steps: int) -> None:
    base = _ps_result(_ps_point(_steps(steps, 1), step=True))
    slow = _ps_result(_ps_point(_steps(steps, 2, scale=1.5), step=True))
    baseline = _write_junit(tmp_path / "base.xml", _props(base))
    settings = settings_from_options(str(baseline), ["10%"], alpha=None, inconclusive=None,
                                     bad_baseline=None, mismatch=None)  # fmt: skip
    verdict = BaselineGate(settings, {}, ["lo"]).judge(NODEID, _record(slow))
    assert verdict.failure is not None and verdict.failure.startswith("regression: ")
    recorded = dict(verdict.properties)
    at = "tfgrpc.sync_sgd_step.hep_cnn"
    assert recorded[f"{at}.step_p50.verdict"] == "regression"
    assert recorded[f"{at}.step_rate.verdict"] == "regression"
    assert recorded[f"{at}.throughput.verdict"] == "regression"
    if steps >= 1000:  # a p99 needs 10 samples beyond it
        assert recorded[f"{at}.step_p99.verdict"] == "regression"
    else:
        assert recorded[f"{at}.step_p99.verdict"] == "inconclusive"
        assert "needs >= 1000" in recorded[f"{at}.step_p99.verdict_reason"]
    same = BaselineGate(settings, {}, ["lo"]).judge(NODEID, _record(base))
    assert same.failure is None


def test_the_gate_tests_imbalance_by_its_ratio_and_rpc_rate_by_the_samples(
    tmp_path: Path,
) -> None:
    base = _ps_result(_ps_point(_steps(200, 1), step=False, imbalance=1.2))
    worse = _ps_result(_ps_point(_steps(200, 2, scale=1.5), step=False, imbalance=1.5))
    baseline = load_baseline(_write_junit(tmp_path / "base.xml", _props(base)))
    comparison = compare_test(baseline, _record(worse), parse_tolerances("10%"))
    by_metric = {v.metric: v for v in comparison.verdicts}
    assert by_metric["imbalance"].outcome is Outcome.REGRESSION
    assert by_metric["imbalance"].method == "ratio"
    assert by_metric["rpc_rate"].outcome is Outcome.REGRESSION
    assert by_metric["rpc_rate"].method == "mann-whitney-u"
    assert "bytes_imbalance" not in by_metric


# --- budgets -----------------------------------------------------------------------------------


@pytest.mark.parametrize("metric", list(BUDGET_METRICS))
@pytest.mark.parametrize("value", ["fast", "nan", "NaN", "inf", "-inf", "Infinity", "1e999"])
def test_a_bad_budget_of_any_metric_is_one_error_naming_the_argument(
    metric: str, value: str
) -> None:
    unit = METRICS[metric].unit.base
    text = {"ns": f"{value}ms", "B/s": f"{value} GB/s"}.get(unit, value)
    with pytest.raises(BudgetError, match=rf"^budget {metric}='{text}': "):
        parse_budget({metric: text})


@pytest.mark.parametrize("metric", ["rpc_rate", "step_rate", "imbalance"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_non_finite_number_budget_is_refused(metric: str, value: float) -> None:
    with pytest.raises(BudgetError, match=rf"^budget {metric}={value!r}: "):
        parse_budget({metric: value})


@pytest.mark.parametrize(
    ("metric", "value", "written"),
    [
        ("p50", 558609.1670000001, "558.609"),  # ns -> us, to the nanosecond
        ("p99", 1_000_000.0, "1000"),
        ("throughput", 698_123_456.789, "698.123"),  # B/s -> MBps, 6 significant digits
        ("throughput", 1.5e12, "1500000"),
        ("rpc_rate", 12.3456789, "12.3457"),
        ("imbalance", 1.0000000000002, "1"),
        ("samples", 1000.0, "1000"),
    ],
)
def test_figures_are_written_with_the_digits_they_support(
    metric: str, value: float, written: str
) -> None:
    assert figure_value(metric, value) == written


def test_model_predictions_carry_no_float_noise() -> None:
    class Predicted(BenchmarkResult):
        def model_predictions(self) -> Mapping[str, Sequence[tuple[str, str]]]:
            return {"hep_cnn": [("step_us", "1234.5600000000001"), ("limit", "link")]}

    plain = _ps_result(_ps_point(_steps(20, 1), step=True))
    result = Predicted(**{f.name: getattr(plain, f.name) for f in fields(BenchmarkResult)})
    pairs = [(n, v) for n, v in result_properties(result) if ".model." in n]
    assert pairs == [
        ("tfgrpc.sync_sgd_step.hep_cnn.model.step_us", "1234.56"),
        ("tfgrpc.sync_sgd_step.hep_cnn.model.limit", "link"),
    ]
    (point,) = read_record("t", result_properties(result)).measurements
    assert point.model == {"step_us": "1234.56", "limit": "link"}
    assert "step_us" not in point.figures
