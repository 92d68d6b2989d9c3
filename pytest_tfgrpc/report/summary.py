"""JUnit properties -> the terminal summary.

Figures travel as ``(name, value)`` pairs of plain strings: they go into the test's
``user_properties`` (which pytest writes into its ``<testcase>``, and which pytest-xdist
forwards from its workers), and the summary is rebuilt from those same pairs (read with
:mod:`pytest_tfgrpc.report.properties`), so the terminal never shows a figure the XML does not
hold.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pytest_tfgrpc.report.properties import (
    FABRIC,
    LIMIT,
    PREFIX,
    SKETCH,
    point_property,
    read_figures,
)
from pytest_tfgrpc.report.telemetry_text import summary_cell
from pytest_tfgrpc.stats.significance import mann_whitney_u_sketches
from pytest_tfgrpc.stats.sketch import Sketch
from pytest_tfgrpc.units import format_duration, format_rate, parse_size

#: The summary's columns, by the metric each shows (a sync-SGD step's where a point has one).
_P50 = ("p50", "step_p50")
_P99 = ("p99", "step_p99")


#: Best and worst are marked only where the difference is beyond noise: a two-sided
#: Mann-Whitney U test of the two fabrics' sketched samples below this p-value, and a gap of
#: the headline figures wider than MARK_MIN_GAP. The U test sees the noise within the run;
#: the gap guards against the drift of a shared machine between the fabrics' turns, which it
#: cannot see (5-10% between back-to-back runs here, under load).
MARK_ALPHA = 0.05
MARK_MIN_GAP = 0.05
#: A verdict's outcome -> the word the "vs baseline" column writes after the change.
_VERDICT_WORDS = {
    "regression": "worse",
    "improvement": "better",
    "pass": "same",
    "inconclusive": "unsure",
}


@dataclass(frozen=True)
class SummaryRow:
    """One line of the terminal summary: one test, benchmark label, size and fabric.

    ``change`` is the baseline comparison's relative change of the headline figure
    (throughput where there is one, else p50): ``current / baseline - 1``, whatever the
    figure's direction; ``verdict`` is the gate's outcome for it (``regression``,
    ``improvement``, ``pass``, ``inconclusive``) and ``detectable`` the smallest change the
    gate could have told from noise, when the gate recorded one. ``sketch`` is the sketch of
    the point's samples as recorded (text), for telling fabrics apart beyond noise.
    ``limit`` is the named limit (``cpu-bound (client)``), ``limit_figures`` the figures the
    verdict used (``client_busy=0.97 server_busy=0.41``), ``transport`` what the transport
    saw that is not nothing (``1,204 retx/GB, 413 qdisc drops``), both empty when not read.
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
    verdict: str | None = None
    detectable: float | None = None
    sketch: str | None = None
    limit: str = ""
    limit_figures: str = ""
    transport: str = ""

    @property
    def group(self) -> tuple[str, str, str]:
        """The test without its fabric parameter, the label and the size: rows of one group
        differ only in their fabric."""
        return (_without_fabric(self.test, self.fabric), self.label, self.size)

    @property
    def headline(self) -> float | None:
        """The figure rows are ranked by: throughput (MB/s) where there is one, else p50."""
        return self.throughput_MBps if self.throughput_MBps is not None else self.p50_us

    def baseline_text(self) -> str:
        """The "vs baseline" cell: the change with one sign convention (``+`` = the figure
        grew) and the gate's word for it (``worse``, ``better``, ``same``, ``unsure``), then
        the smallest change the gate could detect (``±3.0%``) when it recorded one."""
        if self.change is None:
            return "-"
        text = f"{self.change:+.1%}"
        word = _VERDICT_WORDS.get(self.verdict or "")
        if word:
            text += f" {word}"
        if self.detectable is not None:
            text += f" ±{self.detectable:.1%}"
        return text


def _without_fabric(test: str, fabric: str) -> str:
    for suffix, replacement in ((f"[{fabric}]", ""), (f"-{fabric}]", "]")):
        if fabric and test.endswith(suffix):
            return test[: -len(suffix)] + replacement
    return test


def _number(props: dict[str, str], name: str) -> float | None:
    text = props.get(name)
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None


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
        limit = props.get(point_property(label, size, LIMIT), "")
        headline = "throughput" if throughput is not None else _P50["step_p50" in metrics]
        verdict = f"{PREFIX}{label}.{size}.{headline}"
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
                change=_number(props, f"{verdict}.change"),
                verdict=props.get(f"{verdict}.verdict"),
                detectable=_number(props, f"{verdict}.detectable"),
                sketch=props.get(point_property(label, size, SKETCH)),
                limit=limit.partition(":")[0],
                limit_figures=limit.partition(":")[2].strip(),
                transport=summary_cell(metrics),
            )
        )
    return rows


def _size_key(size: str) -> int:
    try:
        return parse_size(size)
    except ValueError:
        return -1


def _beyond_noise(best: SummaryRow, worst: SummaryRow) -> bool:
    """Whether two fabrics' figures differ beyond noise: their sketched samples differ by the
    U test (:data:`MARK_ALPHA`) and their headline figures by more than :data:`MARK_MIN_GAP`.
    Without sketches to test, no difference is taken as beyond noise."""
    if best.sketch is None or worst.sketch is None:
        return False
    high, low = best.headline, worst.headline
    if high is None or low is None or min(high, low) <= 0:
        return False
    if abs(high / low - 1.0) <= MARK_MIN_GAP:
        return False
    try:
        test = mann_whitney_u_sketches(
            Sketch.from_string(best.sketch), Sketch.from_string(worst.sketch)
        )
    except ValueError:
        return False
    return test.p_value < MARK_ALPHA


def marks(rows: Sequence[SummaryRow]) -> dict[int, str]:
    """``best``/``worst`` per row index of a group measured on more than one fabric, by
    throughput when every row has one, else by p50; only when best and worst differ beyond
    noise (:func:`_beyond_noise`)."""
    by_rate = all(row.throughput_MBps is not None for row in rows)
    ranked = [
        (i, value)
        for i, row in enumerate(rows)
        if (value := row.throughput_MBps if by_rate else row.p50_us) is not None
    ]
    if len({rows[i].fabric for i, _ in ranked}) < 2:
        return {}
    ordered = sorted(ranked, key=lambda item: item[1], reverse=by_rate)
    best, worst = ordered[0][0], ordered[-1][0]
    if not _beyond_noise(rows[best], rows[worst]):
        return {}
    return {best: "best", worst: "worst"}


def grouped(
    rows: Sequence[SummaryRow], fabrics: Sequence[str] = ()
) -> list[tuple[tuple[str, str, str], list[SummaryRow]]]:
    """Rows by group (test without its fabric, label, size), groups sorted by test, label and
    size, each group's rows in the order of ``fabrics`` (the command line's)."""
    order = {name: i for i, name in enumerate(fabrics)}
    groups: dict[tuple[str, str, str], list[SummaryRow]] = {}
    for row in rows:
        groups.setdefault(row.group, []).append(row)
    return [
        (key, sorted(groups[key], key=lambda r: (order.get(r.fabric, len(order)), r.fabric)))
        for key in sorted(groups, key=lambda g: (g[0], g[1], _size_key(g[2]), g[2]))
    ]


def cells(row: SummaryRow) -> list[str]:
    """A row's figures as the table writes them: p50, p99, throughput, samples."""
    return [
        format_duration(row.p50_us * 1e3) if row.p50_us is not None else "-",
        format_duration(row.p99_us * 1e3) if row.p99_us is not None else "-",
        format_rate(row.throughput_MBps * 1e6) if row.throughput_MBps is not None else "-",
        str(row.samples) if row.samples is not None else "-",
    ]


def format_summary(rows: Sequence[SummaryRow], fabrics: Sequence[str] = ()) -> list[str]:
    """An aligned table: test, benchmark, size, then one line per fabric side by side with
    p50, p99, throughput and samples; with several fabrics, the best and worst of each group
    (by throughput, else p50) are marked when they differ beyond noise; with a baseline, the
    change of that figure with the gate's word for it. A legend line under the table says
    how to read the marks."""
    with_change = any(row.change is not None for row in rows)
    with_limit = any(row.limit for row in rows)
    with_transport = any(row.transport for row in rows)
    header = ["test", "benchmark", "size", "fabric", "p50", "p99", "throughput", "samples"]
    if with_change:
        header.append("vs baseline")
    if with_limit:
        header.append("limit")
    if with_transport:
        header.append("transport")
    table = [header]
    marks_column = False
    for key, members in grouped(rows, fabrics):
        marked = marks(members)
        marks_column = marks_column or bool(marked)
        for i, row in enumerate(members):
            line = [
                key[0] if i == 0 else "",
                key[1] if i == 0 else "",
                key[2] if i == 0 else "",
                row.fabric,
                *cells(row),
            ]
            if with_change:
                line.append(row.baseline_text())
            if with_limit:
                line.append(row.limit or "-")
            if with_transport:
                line.append(row.transport or "-")
            line.append(marked.get(i, ""))
            table.append(line)
    if marks_column:
        header.append("")
    width = len(header)
    table = [line[:width] + [""] * (width - len(line)) for line in table]
    widths = [max(len(line[i]) for line in table) for i in range(width)]
    left = 4  # test, benchmark, size, fabric
    lines = []
    for line in table:
        cells_ = [cell.ljust(w) for cell, w in zip(line[:left], widths[:left], strict=True)]
        cells_ += [cell.rjust(w) for cell, w in zip(line[left:], widths[left:], strict=True)]
        lines.append("  ".join(cells_).rstrip())
    legend = []
    if marks_column:
        legend.append(
            "best/worst: by throughput, else p50, where the fabrics differ beyond noise "
            f"(U test p < {MARK_ALPHA:g}, gap > {MARK_MIN_GAP:.0%})"
        )
    if with_limit:
        legend.append(
            "limit: what bounded the point, by the rule of the README's \"What limited a "
            'figure" (the figures it used are in the tfgrpc.<label>.<size>.limit property)'
        )
    if with_transport:
        legend.append("transport: TCP retransmissions per GB sent and drops, where not zero")
    if with_change:
        detectable = any(row.detectable is not None for row in rows)
        legend.append(
            "vs baseline: current/baseline - 1 of throughput, else p50 (+ = grew); "
            "worse/better/same/unsure as the gate judged it"
            + ("; ± the smallest change it could detect" if detectable else "")
        )
    return lines + legend
