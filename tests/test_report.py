"""The terminal summary, rebuilt from the properties a test recorded."""

from __future__ import annotations

import numpy as np

from pytest_tfgrpc.report.record import read_record
from pytest_tfgrpc.report.summary import SummaryRow, format_summary, summary_rows
from pytest_tfgrpc.stats.sketch import Sketch


def rows_of(test: str, properties: list[tuple[str, str]]) -> list[SummaryRow]:
    return summary_rows(read_record(test, properties))


def sketch(p50_us: float, seed: int, n: int = 200, spread: float = 0.05) -> str:
    """A sketch of ``n`` samples spread +-``spread`` around ``p50_us``."""
    rng = np.random.default_rng(seed)
    samples = p50_us * 1e3 * rng.uniform(1 - spread, 1 + spread, n)
    return Sketch.from_samples(samples.astype(np.int64)).to_string()


def props(  # type: ignore[no-untyped-def]
    fabric: str,
    p50_us: float,
    mbps: float | None = None,
    change: float | None = None,
    *,
    verdict: str = "pass",
    detectable: float | None = None,
    seed: int = 0,
    spread: float = 0.05,
):
    out = [("tfgrpc.fabric", fabric), ("tfgrpc.p2p_bandwidth.rpc", "stream")]
    out += [("tfgrpc.x.4MiB.p50_us", repr(p50_us)), ("tfgrpc.x.4MiB.p99_us", repr(2 * p50_us))]
    out += [
        ("tfgrpc.x.4MiB.samples", "50"),
        ("tfgrpc.x.4MiB.sketch", sketch(p50_us, seed, spread=spread)),
    ]
    headline = "p50"
    if mbps is not None:
        out.append(("tfgrpc.x.4MiB.throughput_MBps", repr(mbps)))
        headline = "throughput"
    if change is not None:
        out.append((f"tfgrpc.x.4MiB.{headline}.change", repr(change)))
        out.append((f"tfgrpc.x.4MiB.{headline}.verdict", verdict))
    if detectable is not None:
        out.append((f"tfgrpc.x.4MiB.{headline}.detectable", repr(detectable)))
    return out


def test_fabrics_sit_side_by_side_with_best_and_worst_marked() -> None:
    rows = rows_of("t.py::test_x[lo]", props("lo", 300.0, 1500.0))
    rows += rows_of("t.py::test_x[ib0]", props("ib0", 100.0, 5000.0))
    rows += rows_of("t.py::test_x[eth0]", props("eth0", 200.0, 1100.0))
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
    assert lines[4].startswith("best/worst: by throughput, else p50, among one engine's fabrics")


def test_fabrics_within_noise_get_no_best_or_worst() -> None:
    # 8% apart (beyond the gap), with +-90% spread on 200 samples each: the U test sees noise.
    rows = rows_of("t.py::test_x[lo]", props("lo", 300.0, seed=1, spread=0.9))
    rows += rows_of("t.py::test_x[eth0]", props("eth0", 324.0, seed=2, spread=0.9))
    lines = format_summary(rows, ["lo", "eth0"])
    assert not any("best" in line or "worst" in line for line in lines), lines
    # Figures without sketches cannot be told apart either.
    bare = [p for p in props("lo", 300.0) if not p[0].endswith(".sketch")]
    rows = rows_of("t.py::test_x[lo]", bare)
    rows += rows_of("t.py::test_x[eth0]", [p for p in props("eth0", 100.0) if "sketch" not in p[0]])
    assert not any("best" in line for line in format_summary(rows, ["lo", "eth0"]))


def test_baseline_changes_use_one_sign_convention_and_say_better_or_worse() -> None:
    # Latency grew 12.5%: worse. Throughput grew 12.5%: better. Same sign, opposite words.
    latency = rows_of(
        "t.py::test_l[lo]", props("lo", 300.0, None, 0.125, verdict="regression", detectable=0.03)
    )
    rate = rows_of("t.py::test_r[lo]", props("lo", 300.0, 1000.0, 0.125, verdict="improvement"))
    same = rows_of("t.py::test_s[lo]", props("lo", 300.0, None, -0.004))
    lines = format_summary(latency + rate + same, ["lo"])
    assert lines[0].split()[-2:] == ["vs", "baseline"]
    assert lines[1].endswith("+12.5% worse ±3.0%")
    assert lines[2].endswith("+12.5% better")
    assert lines[3].endswith("-0.4% same")
    assert lines[-1].startswith("vs baseline: current/baseline - 1")


def test_properties_without_figures_make_no_row() -> None:
    rows = rows_of(
        "t.py::test_x[lo]", [("tfgrpc.fabric", "lo"), ("tfgrpc.y.1KiB.verdict", "no baseline")]
    )
    assert rows == []
