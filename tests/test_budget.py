from __future__ import annotations

import math

import numpy as np
import pytest

from pytest_tfgrpc.report.budget import (
    METRICS,
    PER_SECOND,
    RATE,
    RATIO,
    TIME,
    Breach,
    Budget,
    BudgetError,
    BudgetExceeded,
    Limit,
    assert_budget,
    check,
    format_breaches,
    parse_budget,
    parse_limit,
)
from pytest_tfgrpc.results import BenchmarkResult, SizeResult


def _size(size_bytes: int, samples: list[int]) -> SizeResult:
    array = np.array(samples, dtype=np.int64)
    return SizeResult.from_samples(size_bytes, size_bytes + 8, array, int(array.sum()))


def _result(benchmark: str, *sizes: SizeResult, label: str | None = None) -> BenchmarkResult:
    return BenchmarkResult(
        benchmark=benchmark,
        label=label or benchmark,
        fabric="lo",
        target="127.0.0.1:40123",
        mode="raw",
        rpc="unary",
        sizes=sizes,
    )


def _latency() -> BenchmarkResult:
    return _result(
        "p2p_latency",
        # 4B: p99 interpolates into five 3 ms outliers -> 3.00ms.
        _size(4, [1_000_000] * 150 + [3_000_000] * 5),
        # 1KiB: fast, but 40 samples cannot resolve a p99.
        _size(1024, [1_500_000] * 40),
        # 64KiB: uniformly 2.62 ms.
        _size(65536, [2_620_000] * 200),
    )


def _bandwidth() -> BenchmarkResult:
    # 1 MB per 1 ms = 1 GB/s; 10 MB per 20 ms = 0.5 GB/s.
    return _result(
        "p2p_bandwidth",
        _size(1_000_000, [1_000_000] * 20),
        _size(10_000_000, [20_000_000] * 20),
    )


def test_budget_metrics_are_the_registry_budget_entries() -> None:
    assert list(METRICS) == [
        "min",
        "mean",
        "p50",
        "p90",
        "p99",
        "p999",
        "max",
        "throughput",
        "throughput_p50",
        "step_min",
        "step_mean",
        "step_p50",
        "step_p90",
        "step_p99",
        "step_p999",
        "step_max",
        "algbw",
        "busbw",
        "rpc_rate",
        "step_rate",
        "imbalance",
        "efficiency",
    ]
    assert METRICS["efficiency"].kind is RATIO and METRICS["efficiency"].higher_is_better
    assert METRICS["p999"].kind is TIME and METRICS["p999"].quantile == 0.999
    assert METRICS["throughput"].kind is RATE
    assert METRICS["imbalance"].kind is RATIO
    assert METRICS["rpc_rate"].kind is PER_SECOND
    assert METRICS["step_p99"].kind is TIME and METRICS["step_p99"].quantile == 0.99
    assert all(metric.budget for metric in METRICS.values())


def test_budget_metrics_are_read_only() -> None:
    with pytest.raises(TypeError):
        METRICS["x"] = METRICS["p99"]  # type: ignore[index]


@pytest.mark.parametrize(
    ("metric", "text", "op", "value"),
    [
        ("p99", "2ms", "<=", 2e6),
        ("p99", "<=2ms", "<=", 2e6),
        ("p50", "< 500us", "<", 5e5),
        ("min", ">= 10us", ">=", 1e4),
        ("max", ">1s", ">", 1e9),
        ("throughput", "2 GB/s", ">=", 2e9),
        ("throughput", ">= 2 GB/s", ">=", 2e9),
        ("throughput_p50", "<=10 Gbit/s", "<=", 1.25e9),
    ],
)
def test_parse_limit_default_and_explicit_operators(
    metric: str, text: str, op: str, value: float
) -> None:
    limit = parse_limit(metric, text)
    assert (limit.metric, limit.op, limit.text) == (metric, op, text)
    assert limit.value == pytest.approx(value)
    assert limit.kind is METRICS[metric].kind


def test_parse_limit_accepts_numbers_for_a_ratio_metric_only() -> None:
    metrics = METRICS
    assert parse_limit("imbalance", 1.2, metrics) == Limit("imbalance", "<=", 1.2, "1.2", RATIO)
    assert parse_limit("imbalance", 2, metrics).value == 2.0
    limit = parse_limit("imbalance", ">= 0.5", metrics)
    assert (limit.op, limit.value, limit.describe()) == (">=", 0.5, ">= 0.5")
    with pytest.raises(BudgetError, match="budget imbalance='lots': cannot read 'lots' as a ratio"):
        parse_limit("imbalance", "lots", metrics)
    with pytest.raises(BudgetError, match="budget imbalance=True: expected a string"):
        parse_limit("imbalance", True, metrics)


@pytest.mark.parametrize(
    ("metric", "value", "message"),
    [
        (
            "p99",
            "abc",
            "budget p99='abc': cannot read 'abc' as a duration: "
            "expected a number >= 0 and one of ns, us, \u00b5s, ms, s",
        ),
        ("p99", 2, "budget p99=2: a time limit needs a unit, e.g. p99='2ms'"),
        (
            "throughput",
            2e9,
            "budget throughput=2000000000.0: a rate limit needs a unit, e.g. throughput='>=1 GB/s'",
        ),
        ("p99", "==2ms", "budget p99='==2ms': operator '==' is not one of <=, <, >=, >"),
        ("p99", "=<2ms", "budget p99='=<2ms': operator '=<' is not one of <=, <, >=, >"),
        ("p99", None, "budget p99=None: expected a string such as '2ms'"),
        ("throughput", "2 GB", "budget throughput='2 GB': cannot read '2 GB' as a rate"),
        ("p99", "<=", "budget p99='<=': cannot read '' as a duration"),
    ],
)
def test_parse_limit_errors_name_the_argument(metric: str, value: object, message: str) -> None:
    with pytest.raises(BudgetError) as info:
        parse_limit(metric, value)
    assert str(info.value).startswith(message)


def test_unknown_metric_lists_the_known_ones() -> None:
    with pytest.raises(BudgetError) as info:
        parse_budget({"p98": "1ms"})
    assert str(info.value) == (
        "unknown budget metric 'p98': known metrics are min, mean, p50, p90, p99, p999, max, "
        "throughput, throughput_p50, step_min, step_mean, step_p50, step_p90, step_p99, "
        "step_p999, step_max, algbw, busbw, rpc_rate, step_rate, imbalance, efficiency; "
        "did you mean 'p99'?"
    )


def test_parse_budget_and_merge_later_limits_win() -> None:
    marker = parse_budget({"p99": "2ms", "p50": "1ms"})
    explicit = parse_budget({"p99": "500us", "max": "10ms"})
    merged = marker.merged(explicit)
    assert [(limit.metric, limit.text) for limit in merged.limits] == [
        ("p99", "500us"),
        ("p50", "1ms"),
        ("max", "10ms"),
    ]
    assert marker.merged(Budget()) == marker
    assert Budget().merged(marker) == marker


def test_budget_holds_one_limit_per_metric() -> None:
    limit = parse_limit("p99", "2ms")
    with pytest.raises(ValueError, match="one limit per metric; 'p99' has several"):
        Budget((limit, limit))


@pytest.mark.parametrize(
    ("text", "measured", "holds", "margin"),
    [
        ("<=2ms", 2e6, True, 0.0),
        ("<2ms", 2e6, False, 0.0),
        ("<=2ms", 2.62e6, False, 0.31),
        ("<=2ms", 1e6, True, -0.5),
        (">=2ms", 1.5e6, False, 0.25),
        (">2ms", 3e6, True, -0.5),
        ("<=2ms", math.nan, False, math.nan),
    ],
)
def test_limit_holds_and_margin(text: str, measured: float, holds: bool, margin: float) -> None:
    limit = parse_limit("p99", text)
    assert limit.holds(measured) is holds
    assert limit.margin(measured) == pytest.approx(margin, nan_ok=True)


def test_margin_against_a_zero_limit() -> None:
    limit = parse_limit("min", "<=0ns")
    assert limit.margin(0.0) == 0.0
    assert limit.margin(5.0) == math.inf


def test_check_reports_each_breach_per_size_with_figures_in_base_units() -> None:
    result = _latency()
    budget = parse_budget({"p99": "2ms", "p50": "<1.6ms"})
    breaches = check(budget, result)
    assert [(b.size, b.metric, b.reason) for b in breaches] == [
        ("4B", "p99", ""),
        ("1KiB", "p99", "needs >= 100 samples, has 40"),
        ("64KiB", "p99", ""),
        ("64KiB", "p50", ""),
    ]
    first = breaches[0]
    assert first == Breach(
        size="4B",
        metric="p99",
        measured=pytest.approx(3e6),  # type: ignore[arg-type]
        limit=budget.limits[0],
        margin=pytest.approx(0.5),  # type: ignore[arg-type]
        samples=155,
        fabric="lo",
    )
    assert breaches[2].margin == pytest.approx(0.31)
    # The 1KiB p99 (1.5 ms) is within 2 ms, yet 40 samples cannot vouch for a p99.
    assert breaches[1].measured == pytest.approx(1.5e6)
    assert breaches[1].margin == pytest.approx(-0.25)


def test_check_passes_a_result_within_budget() -> None:
    assert check(parse_budget({"p90": "3ms", "p50": "3ms", "max": "5ms"}), _latency()) == ()


def test_check_needs_samples_for_p90_and_p999_too() -> None:
    result = _result("p2p_latency", _size(4, [1000] * 500))
    breaches = check(parse_budget({"p90": "1ms", "p999": "1ms", "max": "1ms"}), result)
    assert [(b.metric, b.reason) for b in breaches] == [("p999", "needs >= 1000 samples, has 500")]


def test_check_rates_on_a_bandwidth_result() -> None:
    breaches = check(parse_budget({"throughput": "800 MB/s"}), _bandwidth())
    assert [b.size for b in breaches] == ["10MB"]
    assert breaches[0].measured == pytest.approx(5e8)
    assert breaches[0].margin == pytest.approx(0.375)  # 500 MB/s is 37.5% short of 800


def test_check_refuses_a_rate_budget_on_a_latency_result() -> None:
    with pytest.raises(BudgetError) as info:
        check(parse_budget({"p99": "2ms", "throughput": "1 GB/s"}), _latency())
    assert str(info.value).startswith("budget throughput='1 GB/s': p2p_latency reports no rates")


def test_check_refuses_a_metric_the_result_does_not_report() -> None:
    budget = Budget((Limit("imbalance", "<=", 1.2, "1.2", RATIO),))
    result = _result("ps_throughput", _size(4, [1000] * 10), label="resnet50_step")
    with pytest.raises(BudgetError) as info:
        check(budget, result)
    assert str(info.value) == (
        "budget imbalance='1.2': resnet50_step (ps_throughput) reports no figure 'imbalance'"
    )


def test_format_breaches_is_an_aligned_table() -> None:
    result = _latency()
    budget = parse_budget({"p99": "2ms", "p50": "<1.6ms"})
    text = format_breaches(result, check(budget, result), checked=6)
    assert text.splitlines() == [
        "p2p_latency on fabric lo (127.0.0.1:40123): 4 of 6 budget checks failed",
        "size  | metric | measured | budget    | margin                       | samples | fabric",
        "4B    | p99    | 3.00ms   | <= 2.00ms | +50.0%                       | 155     | lo",
        "1KiB  | p99    | 1.50ms   | <= 2.00ms | needs >= 100 samples, has 40 | 40      | lo",
        "64KiB | p99    | 2.62ms   | <= 2.00ms | +31.0%                       | 200     | lo",
        "64KiB | p50    | 2.62ms   | < 1.60ms  | +63.7%                       | 200     | lo",
    ]


def test_format_breaches_shows_rates_in_rate_units() -> None:
    result = _bandwidth()
    text = format_breaches(result, check(parse_budget({"throughput": ">1 GB/s"}), result), 2)
    assert text.splitlines() == [
        "p2p_bandwidth on fabric lo (127.0.0.1:40123): 2 of 2 budget checks failed",
        "size | metric     | measured  | budget      | margin | samples | fabric",
        # Exactly at a strict limit: no excess, still a breach.
        "1MB  | throughput | 1.00 GB/s | > 1.00 GB/s | +0.0%  | 20      | lo",
        "10MB | throughput | 500 MB/s  | > 1.00 GB/s | +50.0% | 20      | lo",
    ]


def test_assert_budget_raises_the_table() -> None:
    result = _latency()
    with pytest.raises(BudgetExceeded) as info:
        assert_budget(result, p99="2ms")
    assert isinstance(info.value, AssertionError)
    assert str(info.value).splitlines()[0] == (
        "p2p_latency on fabric lo (127.0.0.1:40123): 3 of 3 budget checks failed"
    )
    assert [b.size for b in info.value.breaches] == ["4B", "1KiB", "64KiB"]


def test_assert_budget_passes_quietly_within_budget() -> None:
    assert_budget(_latency(), p50="3ms", max="5ms")
    assert_budget(_bandwidth(), throughput=">=400 MB/s", p50="<=25ms")


def test_assert_budget_one_check_is_singular() -> None:
    result = _result("p2p_latency", _size(4, [5_000_000] * 10))
    with pytest.raises(BudgetExceeded, match="1 of 1 budget check failed"):
        assert_budget(result, max="1ms")


def test_assert_budget_guards_against_misuse() -> None:
    with pytest.raises(TypeError, match=r"takes the result a tfgrpc benchmark returned.*not str"):
        assert_budget("127.0.0.1:40123", p99="2ms")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="needs at least one limit"):
        assert_budget(_latency())
    with pytest.raises(BudgetError, match="unknown budget metric 'p98'"):
        assert_budget(_latency(), p98="2ms")


def test_assert_budget_hides_itself_from_tracebacks() -> None:
    with pytest.raises(BudgetExceeded) as info:
        assert_budget(_latency(), p99="2ms")
    frames = [entry for entry in info.traceback if entry.name == "assert_budget"]
    assert frames and all(entry.ishidden(info) for entry in frames)
