"""JUnit properties -> the terminal summary.

Figures travel as ``(name, value)`` pairs of plain strings: they go into the test's
``user_properties`` (which pytest writes into its ``<testcase>``, and which pytest-xdist
forwards from its workers), and the summary is rebuilt from those same pairs (read with
:mod:`pytest_tfgrpc.report.properties`), so the terminal never shows a figure the XML does not
hold.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pytest_tfgrpc.report.properties import FABRIC, PREFIX, read_figures
from pytest_tfgrpc.units import format_duration, format_rate, parse_size

#: The summary's columns, by the metric each shows (a sync-SGD step's where a point has one).
_P50 = ("p50", "step_p50")
_P99 = ("p99", "step_p99")


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


def _change(props: dict[str, str], label: str, size: str, metric: str) -> float | None:
    """A baseline verdict's relative change (``tfgrpc.<label>.<size>.<metric>.change``)."""
    text = props.get(f"{PREFIX}{label}.{size}.{metric}.change")
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def summary_rows(test: str, properties: Iterable[tuple[str, object]]) -> list[SummaryRow]:
    """Rebuild summary rows of one test from its properties: one per label and point with a
    time or rate figure, in the units the table shows."""
    props = {str(name): str(value) for name, value in properties}
    keyed: dict[tuple[str, str], dict[str, float]] = {}
    for figure in read_figures(props.items(), strict=False):
        if figure.at.scope:
            continue
        keyed.setdefault((figure.at.label, figure.at.key), {})[figure.at.metric.name] = figure.value
    rows = []
    for (label, size), metrics in keyed.items():
        p50 = next((metrics[m] for m in _P50 if m in metrics), None)
        p99 = next((metrics[m] for m in _P99 if m in metrics), None)
        throughput = metrics.get("throughput")
        if p50 is None and p99 is None and throughput is None:
            continue
        samples = metrics.get("samples")
        headline = "throughput" if throughput is not None else _P50["step_p50" in metrics]
        rows.append(
            SummaryRow(
                test=test,
                fabric=props.get(FABRIC, ""),
                label=label,
                size=size,
                p50_us=p50 / 1e3 if p50 is not None else None,
                p99_us=p99 / 1e3 if p99 is not None else None,
                throughput_MBps=throughput / 1e6 if throughput is not None else None,
                samples=int(samples) if samples is not None else None,
                change=_change(props, label, size, headline),
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
