"""Plots are drawn from the properties the benchmarks really record, as JUnit or results log."""

from __future__ import annotations

import dataclasses
import itertools
import math
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from pytest_tfgrpc.bench.ps import PSResult
from pytest_tfgrpc.report.plot import (
    LABEL_SHARE,
    MIN_DECADES,
    PlotUnavailableError,
    draw,
    log_ticks,
    measurement_rows,
    per_test_properties,
    plot_available,
    properties_from_junit,
    write_plots,
)
from pytest_tfgrpc.report.record import result_properties
from pytest_tfgrpc.report.results_file import ResultLog, read_results
from pytest_tfgrpc.results import BenchmarkResult, Cluster, SizeResult

SIZES = (4, 1024, 65536)


def _samples(base_ns: int, count: int = 200) -> np.ndarray[Any, np.dtype[np.int64]]:
    # A spread with a tail, so p50 and p99 differ.
    return base_ns + np.arange(count, dtype=np.int64) ** 2


def _p2p(benchmark: str, fabric: str, scale: int, label: str | None = None) -> BenchmarkResult:
    sizes = tuple(
        SizeResult.from_samples(size, size + 16, _samples(scale * (1000 + size)), 10**9)
        for size in SIZES
    )
    return BenchmarkResult(
        benchmark=benchmark,
        label=label or benchmark,
        fabric=fabric,
        target=f"{fabric}:5000",
        mode="raw",
        rpc="unary",
        sizes=sizes,
    )


def _properties(result: BenchmarkResult) -> list[tuple[str, str]]:
    props = result_properties(result)
    return [("tfgrpc.fabric", result.fabric), ("tfgrpc.target", result.target), *props]


def _ps(fabric: str, sharding: str, step_ns: int) -> PSResult:
    samples = _samples(step_ns, 20)
    point = SizeResult.from_samples(
        1 << 20,
        1 << 20,
        samples,
        int(samples.sum()),
        key="hep_cnn-scale_0p05",
        step=True,
        rate_per_s=100.0,
        rate_Bps=5e7,
        imbalance=1.25,
    )
    return PSResult(
        benchmark="sync_sgd_step",
        label="sync_sgd_step",
        fabric=fabric,
        target=f"{fabric}:6000",
        mode="protobuf",
        rpc="stream",
        cluster=Cluster(2, 2, sharding),
        sizes=(point,),
    )


def _run() -> dict[str, list[tuple[str, str]]]:
    """A run as its tests record it: latency and bandwidth on two fabrics, three PS tests."""
    run = {}
    for fabric, scale in (("lo", 1), ("eth0", 3)):
        run[f"t.py::test_latency[{fabric}]"] = _properties(_p2p("p2p_latency", fabric, scale))
        run[f"t.py::test_bandwidth[{fabric}]"] = _properties(_p2p("p2p_bandwidth", fabric, scale))
        for sharding, step in (("round_robin", 4_000_000), ("greedy", 5_000_000)):
            result = _ps(fabric, sharding, step * scale)
            run[f"t.py::test_sgd[{fabric}-{sharding}]"] = _properties(result)
    return run


def _latency(props: list[tuple[str, str]], size: str, metric: str) -> float:
    return float(dict(props)[f"tfgrpc.p2p_latency.{size}.{metric}"])


# ---------------------------------------------------------------------------------------------
# Reading properties (no matplotlib needed)


def test_rows_hold_every_size_of_every_result() -> None:
    run = _run()
    rows = measurement_rows(run)
    latency = sorted(
        (r.fabric, r.size_bytes) for r in rows if r.label == "p2p_latency" and r.size_bytes
    )
    assert latency == sorted((f, s) for f in ("lo", "eth0") for s in SIZES)
    row = next(r for r in rows if r.test == "t.py::test_latency[lo]" and r.key == "1KiB")
    assert row.metrics["p99_us"] == _latency(run["t.py::test_latency[lo]"], "1KiB", "p99_us")
    assert row.metrics["samples"] == 200
    assert (row.rpc, row.mode, row.topology) == ("unary", "raw", "")
    ps = next(r for r in rows if r.test == "t.py::test_sgd[eth0-greedy]")
    assert ps.is_ps and ps.topology == "2ps_2workers_greedy" and ps.size_bytes is None
    assert ps.metrics["step_p50_us"] > 0 and ps.metrics["imbalance"] == 1.25


def test_rows_skip_metadata_verdicts_predictions_and_text() -> None:
    props = [
        ("tfgrpc.fabric", "lo"),
        ("tfgrpc.meta.fabric.lo.mtu", "65536"),
        ("tfgrpc.p2p_latency.1KiB.p50_us", "20.5"),
        ("tfgrpc.p2p_latency.1KiB.verdict", "pass"),
        ("tfgrpc.p2p_latency.1KiB.p99_us", "nan"),
        ("tfgrpc.p2p_latency.model.p50_us", "3.0"),
        ("tfgrpc.p2p_latency.skew-10x.p50_us", "40.0"),
        ("tfgrpc.p2p_latency.skew-10x.bytes", "5000"),
        ("tfgrpc.p2p_latency.resnet50.p50_us", "50.0"),
    ]
    rows = {r.key: r for r in measurement_rows({"t::a": props})}
    assert set(rows) == {"1KiB", "skew-10x", "resnet50"}
    assert dict(rows["1KiB"].metrics) == {"p50_us": 20.5}
    assert rows["skew-10x"].size_bytes == 5000  # a payload is placed by its recorded size
    assert rows["resnet50"].size_bytes is None


def test_properties_come_from_pairs_mappings_and_the_results_file(tmp_path: Path) -> None:
    run = _run()
    log_path = tmp_path / "results.jsonl"
    with ResultLog(log_path) as log:
        for test, props in run.items():
            log.append(test, outcome="passed", duration=1.0, properties=props)
    from_log = per_test_properties(read_results(log_path))
    from_pairs = per_test_properties(run)
    from_dicts = per_test_properties({test: dict(props) for test, props in run.items()})
    assert from_log == from_pairs == from_dicts
    assert measurement_rows(read_results(log_path)) == measurement_rows(run)
    # A name given twice keeps its first value, as the results file does.
    assert per_test_properties({"t": [("a", "1"), ("a", "2")]}) == {"t": {"a": "1"}}


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="2">
<properties><property name="tfgrpc.meta.host" value="node1"/></properties>
<testcase classname="t" name="test_latency[lo]" time="1.0"><properties>
<property name="tfgrpc.fabric" value="lo"/>
<property name="tfgrpc.p2p_latency.1KiB.p50_us" value="20.5"/>
<property name="tfgrpc.p2p_latency.1KiB.p99_us" value="31.0"/>
</properties></testcase>
<testcase time="0.000"/>
</testsuite></testsuites>
"""


def test_properties_from_junit_xml(tmp_path: Path) -> None:
    path = tmp_path / "run.xml"
    path.write_text(JUNIT)
    props = properties_from_junit(path)
    assert props == {
        "t.test_latency[lo]": {
            "tfgrpc.fabric": "lo",
            "tfgrpc.p2p_latency.1KiB.p50_us": "20.5",
            "tfgrpc.p2p_latency.1KiB.p99_us": "31.0",
        }
    }
    path.write_text(JUNIT[:200])
    with pytest.raises(ValueError, match=r"JUnit file .* is not well-formed XML"):
        properties_from_junit(path)


def test_importing_plot_does_not_import_matplotlib() -> None:
    code = "import sys, pytest_tfgrpc.report.plot; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_without_matplotlib_plots_say_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    available, why = plot_available()
    assert not available
    assert "pip install -e '.[plot]'" in why
    with pytest.raises(PlotUnavailableError, match=r"pip install -e .\.\[plot\]."):
        write_plots(_run(), tmp_path / "plots")
    assert not (tmp_path / "plots").exists()


# ---------------------------------------------------------------------------------------------
# Drawing (matplotlib)


@pytest.fixture
def figures() -> dict[str, Any]:
    pytest.importorskip("matplotlib")
    return dict(draw(_run()))


def test_one_plot_per_benchmark_label(figures: dict[str, Any]) -> None:
    assert sorted(figures) == [
        "bandwidth_p2p_bandwidth.png",
        "latency_p2p_latency.png",
        "ps_sync_sgd_step.png",
    ]
    available, why = plot_available()
    assert available and why.startswith("matplotlib ")


def test_latency_plot_has_p50_solid_and_p99_dashed_per_fabric(figures: dict[str, Any]) -> None:
    [ax] = figures["latency_p2p_latency.png"].axes
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert sorted(lines) == [
        "eth0, gRPC unary raw: p50",
        "eth0, gRPC unary raw: p99",
        "lo, gRPC unary raw: p50",
        "lo, gRPC unary raw: p99",
    ]
    run = _run()
    for fabric in ("lo", "eth0"):
        p50 = lines[f"{fabric}, gRPC unary raw: p50"]
        p99 = lines[f"{fabric}, gRPC unary raw: p99"]
        assert p50.get_linestyle() == "-" and p99.get_linestyle() == "--"
        assert p50.get_color() == p99.get_color()
        assert list(p50.get_xdata()) == list(SIZES)
        props = run[f"t.py::test_latency[{fabric}]"]
        expected = [_latency(props, size, "p99_us") * 1e3 for size in ("4B", "1KiB", "64KiB")]
        assert list(p99.get_ydata()) == pytest.approx(expected)
    assert (
        lines["lo, gRPC unary raw: p50"].get_color()
        != lines["eth0, gRPC unary raw: p50"].get_color()
    )
    assert [t.get_text() for t in ax.get_xticklabels()] == ["4B", "1KiB", "64KiB"]
    # The spread: a p10-p90 band per fabric, read from the sketch, around the p50.
    bands = [c for c in ax.collections if str(c.get_label()).endswith("p10-p90 of each operation")]
    assert len(bands) == 2
    # Every decade and 2x, 5x between are labelled, in people's units.
    low, high = ax.get_ylim()
    assert math.log10(high / low) >= MIN_DECADES
    shown = [t.get_text() for t in ax.get_yticklabels() if low <= t.get_position()[1] <= high]
    assert len(shown) >= 4 and all(t.endswith("s") for t in shown)


def test_the_floor_is_drawn_on_the_axes_of_the_figure_it_bounds() -> None:
    pytest.importorskip("matplotlib")
    run = {
        "t.py::test_latency[lo]": _properties(_p2p("p2p_latency", "lo", 3))
        + result_properties(_p2p("p2p_latency", "lo", 1, label="p2p_latency_floor"))
    }
    figures = dict(draw(run))
    assert sorted(figures) == ["latency_p2p_latency.png"]
    [ax] = figures["latency_p2p_latency.png"].axes
    lines = {line.get_label(): line for line in ax.get_lines()}
    floor = lines["lo, raw-TCP floor: p50"]
    assert floor.get_linestyle() == ":"
    assert floor.get_color() == lines["lo, gRPC unary raw: p50"].get_color()


def test_bandwidth_plot_has_one_throughput_line_per_fabric(figures: dict[str, Any]) -> None:
    [ax] = figures["bandwidth_p2p_bandwidth.png"].axes
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert sorted(lines) == [
        "eth0, gRPC unary raw: p99",
        "eth0, gRPC unary raw: throughput",
        "lo, gRPC unary raw: p99",
        "lo, gRPC unary raw: throughput",
    ]
    props = dict(_run()["t.py::test_bandwidth[lo]"])
    expected = [
        float(props[f"tfgrpc.p2p_bandwidth.{s}.throughput_MBps"]) * 1e6
        for s in ("4B", "1KiB", "64KiB")
    ]
    assert list(lines["lo, gRPC unary raw: throughput"].get_ydata()) == pytest.approx(expected)


def test_ps_plot_has_step_p50_and_p99_bars_per_sharding_and_fabric(
    figures: dict[str, Any],
) -> None:
    ax, hist = figures["ps_sync_sgd_step.png"].axes
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert [label.splitlines()[-1] for label in labels] == ["greedy", "round_robin"]
    assert all("2 PS, 2 workers" in label for label in labels)
    bars = {c.get_label(): [p.get_height() for p in c.patches] for c in ax.containers}
    engine = "gRPC stream protobuf"
    assert sorted(bars) == [f"{f}, {engine}: {q}" for f in ("eth0", "lo") for q in ("p50", "p99")]
    run = _run()
    for fabric in ("lo", "eth0"):
        for quantile in ("p50", "p99"):
            expected = [
                float(
                    dict(run[f"t.py::test_sgd[{fabric}-{s}]"])[
                        f"tfgrpc.sync_sgd_step.hep_cnn-scale_0p05.step_{quantile}_us"
                    ]
                )
                * 1e3
                for s in ("greedy", "round_robin")
            ]
            assert bars[f"{fabric}, {engine}: {quantile}"] == pytest.approx(expected)
    # Beside the bars, a step-time histogram per fabric and sharding, from the sketches.
    steps = [str(line.get_label()) for line in hist.patches]
    assert len(steps) == 4
    assert all(label.endswith("(n=20)") for label in steps)


def test_a_label_measured_by_two_tests_gets_a_plot_per_test() -> None:
    pytest.importorskip("matplotlib")
    run = {
        f"t.py::{test}[{fabric}]": _properties(_p2p("p2p_latency", fabric, 1))
        for test in ("test_unary", "test_stream")
        for fabric in ("lo", "eth0")
    }
    names = dict(draw(run))
    assert sorted(names) == [
        "latency_p2p_latency__test_stream.png",
        "latency_p2p_latency__test_unary.png",
    ]
    [ax] = names["latency_p2p_latency__test_unary.png"].axes
    assert sorted(str(line.get_label()) for line in ax.get_lines()) == [
        "eth0, gRPC unary raw: p50",
        "eth0, gRPC unary raw: p99",
        "lo, gRPC unary raw: p50",
        "lo, gRPC unary raw: p99",
    ]


def test_write_plots_writes_pngs(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    written = write_plots(_run(), tmp_path / "plots")
    assert [p.name for p in written] == [
        "bandwidth_p2p_bandwidth.png",
        "latency_p2p_latency.png",
        "ps_sync_sgd_step.png",
    ]
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        image = imread(path)
        wide = path.name.startswith("ps_")  # bars and a histogram side by side
        assert image.shape[:2] == (550, 1320 if wide else 880)  # 8 (12) x 5 inches at 110 dpi
        assert image.std() > 0.05  # something is drawn
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [p.name for p in written]


def test_nothing_to_plot_writes_nothing(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    assert write_plots({"t::a": [("tfgrpc.meta.host", "x")]}, tmp_path / "plots") == []
    assert not (tmp_path / "plots").exists()


# ---------------------------------------------------------------------------------------------
# Readable at a glance: labels that never overlap, legends that never cover the data


def _wide_run(sizes: tuple[int, ...], step_ns: tuple[int, ...]) -> dict[str, list[tuple[str, str]]]:
    """A run with every size of ``sizes`` and a PS test per step time of ``step_ns``."""
    run: dict[str, list[tuple[str, str]]] = {}
    for fabric, scale in (("lo", 1), ("eth0", 3)):
        for benchmark in ("p2p_latency", "p2p_bandwidth"):
            points = tuple(
                SizeResult.from_samples(size, size + 16, _samples(scale * (1000 + size)), 10**9)
                for size in sizes
            )
            result = dataclasses.replace(_p2p(benchmark, fabric, scale), sizes=points)
            run[f"t.py::test_{benchmark}[{fabric}]"] = _properties(result)
        for i, step in enumerate(step_ns):
            sharding = ("round_robin", "greedy")[i % 2]
            result = _ps(fabric, sharding, step * scale)
            run[f"t.py::test_sgd{i}[{fabric}-{sharding}]"] = _properties(result)
    return run


def _shown_labels(axis: Any, renderer: Any) -> list[tuple[str, Any]]:
    """The tick labels ``axis`` draws (text, display box): those inside the view interval."""
    low, high = sorted(axis.get_view_interval())
    shown = []
    for tick in axis.get_major_ticks():
        label = tick.label1
        where = tick.get_loc()
        if (
            label.get_visible()
            and label.get_text()
            and low * (1 - 1e-9) <= where <= high * (1 + 1e-9)
        ):
            shown.append((label.get_text(), label.get_window_extent(renderer)))
    return shown


def _overlap(a: Any, b: Any, slack_px: float = 0.5) -> bool:
    return bool(
        a.x0 + slack_px < b.x1 and b.x0 + slack_px < a.x1
        and a.y0 + slack_px < b.y1 and b.y0 + slack_px < a.y1
    )  # fmt: skip


WIDE_SIZES = tuple(4 << (2 * k) for k in range(14))  # 4 B .. 256 MiB, 14 sizes
STEP_RANGES = {
    "narrow": (4_000_000,),  # one payload: the histogram spans ~2x
    "a decade": (1_000_000, 9_000_000),
    "wide": (200_000, 5_000_000, 900_000_000),
}


@pytest.mark.parametrize("steps", sorted(STEP_RANGES))
@pytest.mark.parametrize("sizes", [SIZES, WIDE_SIZES], ids=["3 sizes", "14 sizes"])
def test_tick_labels_never_overlap_and_legends_never_cover_the_histogram(
    sizes: tuple[int, ...], steps: str
) -> None:
    """Issue 26: the PS histogram's ticks read ``5.00ms7.50ms10.0ms`` and it had one tick, its
    legend covered the bars. Every plot kind, rendered, has no two tick labels of an axis
    overlapping, at least two labelled ticks per axis, no legend over a tick label, and no
    histogram bar's top under the histogram's legend."""
    pytest.importorskip("matplotlib")
    for name, figure in draw(_wide_run(sizes, STEP_RANGES[steps])):
        canvas: Any = figure.canvas  # an Agg canvas (draw() makes one): it has a renderer
        canvas.draw()
        renderer = canvas.get_renderer()
        inner = [ax.get_legend() for ax in figure.axes]
        legends = [legend.get_window_extent(renderer) for legend in figure.legends]
        legends += [legend.get_window_extent(renderer) for legend in inner if legend is not None]
        for ax in figure.axes:
            for axis in (ax.xaxis, ax.yaxis):
                shown = _shown_labels(axis, renderer)
                where = f"{name}, {ax.get_xlabel() or ax.get_ylabel()}, {axis.axis_name} axis"
                if axis.get_scale() == "log" or axis is ax.yaxis:  # values, not categories
                    assert len(shown) >= 2, f"{where}: labelled ticks {[t for t, _ in shown]}"
                for (text_a, a), (text_b, b) in itertools.combinations(shown, 2):
                    assert not _overlap(a, b), f"{where}: {text_a!r} overlaps {text_b!r}"
                for text, box in shown:
                    for legend in legends:
                        assert not _overlap(box, legend), f"{where}: a legend covers {text!r}"
        if not name.startswith("ps_"):
            continue
        histogram = figure.axes[1]
        key = histogram.get_legend()
        box = key.get_window_extent(renderer) if key is not None else None
        for patch in histogram.patches:
            data = cast(Any, patch).get_data()  # a StepPatch: (values, edges, baseline)
            for count, (left, right) in zip(
                data.values, itertools.pairwise(data.edges), strict=True
            ):
                if count <= 0 or box is None:
                    continue
                x, y = histogram.transData.transform((math.sqrt(left * right), count))
                assert not box.contains(x, y), f"{name}: the legend covers a bar at {count}"


@pytest.mark.parametrize(
    ("low", "high"),
    [(1e3, 1e4), (4.0e6, 4.4e6), (4.000e6, 4.001e6), (2e5, 9e8), (1.0, 1e12), (9.9e4, 1.01e5)],
)
def test_log_ticks_are_ordered_inside_the_axis_and_never_closer_than_a_label(
    low: float, high: float
) -> None:
    ticks = log_ticks(low, high)
    assert len(ticks) >= 2 and ticks == sorted(set(ticks))
    assert all(low <= t <= high for t in ticks)
    gaps = [math.log10(b / a) for a, b in itertools.pairwise(ticks)]
    assert min(gaps) >= LABEL_SHARE * math.log10(high / low) * 0.99


@pytest.mark.parametrize(("low", "high"), [(0.0, 1.0), (2.0, 1.0), (1.0, math.inf), (-1.0, 1.0)])
def test_log_ticks_refuse_an_axis_that_is_not_a_positive_range(low: float, high: float) -> None:
    with pytest.raises(ValueError, match="a log axis needs 0 < low < high"):
        log_ticks(low, high)
