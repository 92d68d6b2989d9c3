"""The terminal summary, rebuilt from the properties a test recorded."""

from __future__ import annotations

from pytest_tfgrpc.report.summary import format_summary, summary_rows


def props(fabric: str, p50_us: float, mbps: float | None = None, change: float | None = None):  # type: ignore[no-untyped-def]
    out = [("tfgrpc.fabric", fabric), ("tfgrpc.p2p_bandwidth.rpc", "stream")]
    out += [("tfgrpc.x.4MiB.p50_us", repr(p50_us)), ("tfgrpc.x.4MiB.p99_us", repr(2 * p50_us))]
    out += [("tfgrpc.x.4MiB.samples", "50"), ("tfgrpc.x.4MiB.sketch", "tfs1:abc")]
    if mbps is not None:
        out.append(("tfgrpc.x.4MiB.throughput_MBps", repr(mbps)))
    if change is not None:
        out.append(("tfgrpc.x.4MiB.throughput.change", repr(change)))
        out.append(("tfgrpc.x.4MiB.throughput.verdict", "pass"))
    return out


def test_fabrics_sit_side_by_side_with_best_and_worst_marked() -> None:
    rows = summary_rows("t.py::test_x[lo]", props("lo", 300.0, 1500.0))
    rows += summary_rows("t.py::test_x[ib0]", props("ib0", 100.0, 5000.0))
    rows += summary_rows("t.py::test_x[eth0]", props("eth0", 200.0, 1100.0))
    lines = format_summary(rows, ["lo", "eth0", "ib0"])
    assert lines[0].split() == [
        "test",
        "benchmark",
        "size",
        "fabric",
        "p50",
        "p99",
        "throughput",
        "samples",
    ]
    assert lines[1].split() == [
        "t.py::test_x",
        "x",
        "4MiB",
        "lo",
        "300us",
        "600us",
        "1.50",
        "GB/s",
        "50",
    ]
    assert lines[2].split() == ["eth0", "200us", "400us", "1.10", "GB/s", "50", "worst"]
    assert lines[3].split() == ["ib0", "100us", "200us", "5.00", "GB/s", "50", "best"]


def test_latency_ranks_by_p50_and_shows_the_baseline_change() -> None:
    rows = summary_rows("t.py::test_x[1-lo]", props("lo", 300.0, None, None))
    rows += summary_rows("t.py::test_x[1-eth0]", props("eth0", 200.0, 1000.0, -0.125))
    lines = format_summary(rows, ["lo", "eth0"])
    assert lines[0].split()[-1] == "baseline"
    assert lines[1].split()[:4] == ["t.py::test_x[1]", "x", "4MiB", "lo"]
    assert lines[2].split()[-2:] == ["-12.5%", "best"]


def test_properties_without_figures_make_no_row() -> None:
    rows = summary_rows(
        "t.py::test_x[lo]", [("tfgrpc.fabric", "lo"), ("tfgrpc.y.1KiB.verdict", "no baseline")]
    )
    assert rows == []
