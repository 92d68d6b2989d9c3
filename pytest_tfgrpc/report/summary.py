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
from pytest_tfgrpc.stats.sketch import Sketch
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
    """One line of the terminal summary: one test, benchmark label, size and fabric.

    ``change`` is the baseline comparison's relative change of the headline figure
    (throughput where there is one, else p50), when a baseline was given.
    """

    test: str
    fabric: str
    label: str
    size: str
    p50_us: float | None
    p99_us: float | None
    throughput_MBps: float | None
    samples: int | None
    change: float | None = None

    @property
    def group(self) -> tuple[str, str, str]:
        """The test without its fabric parameter, the label and the size: rows of one group
        differ only in their fabric."""
        return (_without_fabric(self.test, self.fabric), self.label, self.size)


def _without_fabric(test: str, fabric: str) -> str:
    for suffix, replacement in ((f"[{fabric}]", ""), (f"-{fabric}]", "]")):
        if fabric and test.endswith(suffix):
            return test[: -len(suffix)] + replacement
    return test


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
        if len(parts) == 4 and parts[3] == "change":  # a baseline verdict's relative change
            keyed.setdefault((parts[0], parts[1]), {})[f"{parts[2]}.change"] = value
            continue
        if len(parts) != 3:
            continue
        label, size, metric = parts
        if metric in _NOT_FIGURES or size == "model":
            continue
        keyed.setdefault((label, size), {})[metric] = value
    rows = []
    for (label, size), metrics in keyed.items():
        if not any(m.endswith("_us") or m.endswith("_MBps") for m in metrics):
            continue
        samples = _float(metrics.get("samples"))
        throughput = _float(metrics.get("throughput_MBps"))
        change_of = "throughput.change" if throughput is not None else "p50.change"
        rows.append(
            SummaryRow(
                test=test,
                fabric=fabric,
                label=label,
                size=size,
                p50_us=_float(metrics.get("p50_us", metrics.get("step_p50_us"))),
                p99_us=_float(metrics.get("p99_us", metrics.get("step_p99_us"))),
                throughput_MBps=throughput,
                samples=int(samples) if samples is not None else None,
                change=_float(metrics.get(change_of)),
            )
        )
    return rows


def _size_key(size: str) -> int:
    try:
        return parse_size(size)
    except ValueError:
        return -1


def _marks(rows: Sequence[SummaryRow]) -> dict[int, str]:
    """``best``/``worst`` per row index of a group measured on more than one fabric: by
    throughput when every row has one, else by p50."""
    by_rate = all(row.throughput_MBps is not None for row in rows)
    ranked = [
        (i, value)
        for i, row in enumerate(rows)
        if (value := row.throughput_MBps if by_rate else row.p50_us) is not None
    ]
    if len({rows[i].fabric for i, _ in ranked}) < 2:
        return {}
    ordered = sorted(ranked, key=lambda item: item[1], reverse=by_rate)
    return {ordered[0][0]: "best", ordered[-1][0]: "worst"}


def format_summary(rows: Sequence[SummaryRow], fabrics: Sequence[str] = ()) -> list[str]:
    """An aligned table: test, benchmark, size, then one line per fabric side by side with
    p50, p99, throughput and samples; with several fabrics, the best and worst of each group
    (by throughput, else p50) are marked; with a baseline, the change of that figure."""
    order = {name: i for i, name in enumerate(fabrics)}
    groups: dict[tuple[str, str, str], list[SummaryRow]] = {}
    for row in rows:
        groups.setdefault(row.group, []).append(row)
    with_change = any(row.change is not None for row in rows)
    header = ["test", "benchmark", "size", "fabric", "p50", "p99", "throughput", "samples"]
    if with_change:
        header.append("vs baseline")
    table = [header]
    marks_column = False
    for key in sorted(groups, key=lambda g: (g[0], g[1], _size_key(g[2]), g[2])):
        members = sorted(groups[key], key=lambda r: (order.get(r.fabric, len(order)), r.fabric))
        marks = _marks(members)
        marks_column = marks_column or bool(marks)
        for i, row in enumerate(members):
            line = [
                key[0] if i == 0 else "",
                key[1] if i == 0 else "",
                key[2] if i == 0 else "",
                row.fabric,
                format_duration(row.p50_us * 1e3) if row.p50_us is not None else "-",
                format_duration(row.p99_us * 1e3) if row.p99_us is not None else "-",
                format_rate(row.throughput_MBps * 1e6) if row.throughput_MBps is not None else "-",
                str(row.samples) if row.samples is not None else "-",
            ]
            if with_change:
                line.append(f"{row.change:+.1%}" if row.change is not None else "-")
            line.append(marks.get(i, ""))
            table.append(line)
    if marks_column:
        header.append("")
    width = len(header)
    table = [line[:width] + [""] * (width - len(line)) for line in table]
    widths = [max(len(line[i]) for line in table) for i in range(width)]
    left = 4  # test, benchmark, size, fabric
    lines = []
    for line in table:
        cells = [cell.ljust(w) for cell, w in zip(line[:left], widths[:left], strict=True)]
        cells += [cell.rjust(w) for cell, w in zip(line[left:], widths[left:], strict=True)]
        lines.append("  ".join(cells).rstrip())
    return lines
