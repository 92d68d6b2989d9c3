"""Results -> JUnit properties, and JUnit properties -> the terminal summary.

Figures travel as ``(name, value)`` pairs of plain strings: they go into the test's
``user_properties`` (which pytest writes into its ``<testcase>``, and which pytest-xdist
forwards from its workers), and the summary is rebuilt from those same pairs, so the
terminal never shows a figure the XML does not hold.

Names: ``tfgrpc.<label>.<size>.<metric>_<unit>``, e.g. ``tfgrpc.p2p_latency.1KiB.p99_us``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pytest_tfgrpc.results import BenchmarkResult, Figure
from pytest_tfgrpc.sketch import Sketch
from pytest_tfgrpc.units import format_duration, format_rate, parse_size

PREFIX = "tfgrpc."

#: How a figure's base unit is written in a property: (suffix, divisor).
_UNITS = {"ns": ("us", 1e3), "B/s": ("MBps", 1e6), "count": ("", 1.0)}


_NOT_FIGURES = frozenset(("rpc", "mode", "settings", "bytes", "buffers", "topology", "sketch"))
_NOT_FIGURES |= {"verdict", "verdict_reason"}


def property_name(label: str, size_label: str, figure: Figure) -> str:
    suffix, _ = _UNITS[figure.unit]
    metric = f"{figure.metric}_{suffix}" if suffix else figure.metric
    return f"{PREFIX}{label}.{size_label}.{metric}"


def property_value(figure: Figure) -> str:
    _, divisor = _UNITS[figure.unit]
    if figure.unit == "count":
        return str(int(figure.value))
    return repr(figure.value / divisor)  # repr: every digit measured, none rounded away


def result_properties(result: BenchmarkResult) -> list[tuple[str, str]]:
    """The properties of one result: its figures per size, and how it was measured."""
    settings = ";".join(f"{key}={value}" for key, value in sorted(result.settings.items()))
    out = [
        (f"{PREFIX}{result.label}.rpc", result.rpc),
        (f"{PREFIX}{result.label}.mode", result.mode),
        (f"{PREFIX}{result.label}.settings", settings),
    ]
    for size in result.sizes:
        if size.payload:
            key = f"{PREFIX}{result.label}.{size.label}"
            out.append((f"{key}.bytes", str(size.size_bytes)))
            out.append((f"{key}.buffers", ",".join(map(str, size.buffers))))
        for figure in size.figures(rates=result.reports_rates):
            out.append((property_name(result.label, size.label, figure), property_value(figure)))
        # A compact sketch of every sample: what a later run's baseline gate tests against.
        sketch = Sketch.from_samples(size.samples_ns).to_string()
        out.append((f"{PREFIX}{result.label}.{size.label}.sketch", sketch))
    return out


@dataclass(frozen=True)
class SummaryRow:
    """One line of the terminal summary."""

    test: str
    fabric: str
    label: str
    size: str
    p50_us: float | None
    p99_us: float | None
    throughput_MBps: float | None
    samples: int | None


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def summary_rows(test: str, properties: Iterable[tuple[str, object]]) -> list[SummaryRow]:
    """Rebuild summary rows of one test from its properties."""
    props = {str(name): str(value) for name, value in properties}
    fabric = props.get(f"{PREFIX}fabric", "")
    keyed: dict[tuple[str, str], dict[str, str]] = {}
    for name, value in props.items():
        if not name.startswith(PREFIX):
            continue
        parts = name[len(PREFIX) :].split(".")
        if len(parts) != 3:
            continue
        label, size, metric = parts
        if metric in _NOT_FIGURES or size == "model":
            continue
        keyed.setdefault((label, size), {})[metric] = value
    rows = []
    for (label, size), metrics in keyed.items():
        samples = _float(metrics.get("samples"))
        rows.append(
            SummaryRow(
                test=test,
                fabric=fabric,
                label=label,
                size=size,
                p50_us=_float(metrics.get("p50_us", metrics.get("step_p50_us"))),
                p99_us=_float(metrics.get("p99_us", metrics.get("step_p99_us"))),
                throughput_MBps=_float(metrics.get("throughput_MBps")),
                samples=int(samples) if samples is not None else None,
            )
        )
    return rows


def _size_key(size: str) -> int:
    try:
        return parse_size(size)
    except ValueError:
        return -1


def format_summary(rows: Sequence[SummaryRow]) -> list[str]:
    """An aligned table: test, benchmark, fabric, size, p50, p99, throughput, samples."""
    header = ("test", "benchmark", "fabric", "size", "p50", "p99", "throughput", "samples")
    ordered = sorted(rows, key=lambda r: (r.test, r.label, _size_key(r.size), r.fabric))
    table = [header]
    for row in ordered:
        table.append(
            (
                row.test,
                row.label,
                row.fabric,
                row.size,
                format_duration(row.p50_us * 1e3) if row.p50_us is not None else "-",
                format_duration(row.p99_us * 1e3) if row.p99_us is not None else "-",
                format_rate(row.throughput_MBps * 1e6) if row.throughput_MBps is not None else "-",
                str(row.samples) if row.samples is not None else "-",
            )
        )
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    lines = []
    for line in table:
        cells = [cell.ljust(width) for cell, width in zip(line[:3], widths[:3], strict=True)]
        cells += [cell.rjust(width) for cell, width in zip(line[3:], widths[3:], strict=True)]
        lines.append("  ".join(cells).rstrip())
    return lines
