"""One self-contained HTML report of a run (``--tfgrpc-html FILE``).

Everything is inside the one file, so it opens anywhere without network access: the CSS is
inline, the plots are PNG ``data:`` URIs, there is no script. It renders the tests' records
(:class:`~pytest_tfgrpc.report.record.TestRecord`, read from the same properties as the JUnit
XML), so it never shows a figure the XML does not hold:

* run metadata (``tfgrpc.meta.*``: host, versions, fabrics) and the outcome counts;
* per test and benchmark, a table with one row per message size (payload, profile) and, per
  engine, the fabrics side by side (p50, p99, throughput, samples), best and worst marked only
  when they differ beyond noise, and the baseline change with the gate's word for it; with
  several engines, the first engine's figures over each other's per fabric;
* per PS point, each PS task's bytes, RPCs and CPU time, the slowest marked;
* the baseline verdicts other than a pass, each with its change, the smallest change the gate
  could detect, and its reason;
* the plots of :mod:`pytest_tfgrpc.report.plot` (when matplotlib is installed).
"""

from __future__ import annotations

import base64
import datetime
import html
import io
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pytest_tfgrpc.report.plot import PlotUnavailableError, draw
from pytest_tfgrpc.report.record import META_PREFIX, Outcome, TestRecord, Verdict
from pytest_tfgrpc.report.results_file import atomic_write
from pytest_tfgrpc.report.summary import (
    Group,
    SummaryRow,
    cells,
    engine_ratios,
    grouped,
    marks,
    ps_cells,
    ratio_text,
    summary_rows,
)

__all__ = ["HtmlRun", "render_html", "write_html"]

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto;
       max-width: 1200px; color: #1d2125; padding: 0 1em; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; }
h2 { font-size: 1.25em; margin-top: 1.8em; border-bottom: 1px solid #d0d7de; }
h3 { font-size: 1.02em; margin: 1.2em 0 0.3em; font-family: ui-monospace, monospace; }
table { border-collapse: collapse; margin: 0.4em 0 1em; }
th, td { padding: 0.25em 0.7em; border-bottom: 1px solid #e4e8eb; text-align: right; }
th { background: #f4f6f8; }
td.l, th.l { text-align: left; }
.meta td, .meta th { text-align: left; font-family: ui-monospace, monospace; font-size: 0.9em; }
.best { color: #116329; font-weight: 600; }
.slowest { color: #a40e26; font-weight: 600; }
.worst { color: #a40e26; font-weight: 600; }
.worse, .regression { color: #a40e26; font-weight: 600; }
.better, .improvement { color: #116329; font-weight: 600; }
.unsure, .inconclusive { color: #9a6700; }
.outcome-passed { color: #116329; } .outcome-failed, .outcome-error { color: #a40e26; }
.note { color: #57606a; font-size: 0.9em; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #e4e8eb; }
figcaption { font-family: ui-monospace, monospace; font-size: 0.85em; color: #57606a; }
"""


@dataclass
class HtmlRun:
    """What the report shows: per-test records, outcomes, the fabrics in command-line order,
    run metadata (``tfgrpc.meta.*`` names or unprefixed) and notes (the gate's warnings)."""

    records: Mapping[str, TestRecord]
    outcomes: Mapping[str, str] = field(default_factory=dict)
    fabrics: Sequence[str] = ()
    meta: Mapping[str, str] = field(default_factory=dict)
    notes: Sequence[str] = ()
    title: str = "pytest-tfgrpc run"


def _e(text: object) -> str:
    return html.escape(str(text))


def _table(
    head: Iterable[str], rows: Iterable[Iterable[str]], css: str = "", text_last: bool = False
) -> str:
    """An HTML table; cells are given already escaped (they may carry a span). The first two
    columns are text (left-aligned), and the last too with ``text_last``; the others figures."""
    heads = list(head)

    def left(i: int) -> bool:
        return i < 2 or (text_last and i == len(heads) - 1)

    out = [f'<table class="{css}">' if css else "<table>", "<tr>"]
    out += [f'<th class="l">{h}</th>' if left(i) else f"<th>{h}</th>" for i, h in enumerate(heads)]
    out.append("</tr>")
    for row in rows:
        out.append("<tr>")
        out += [
            f'<td class="l">{c}</td>' if left(i) else f"<td>{c}</td>" for i, c in enumerate(row)
        ]
        out.append("</tr>")
    out.append("</table>")
    return "\n".join(out)


def _baseline_cell(row: SummaryRow) -> str:
    text = row.baseline_text()
    word = row.verdict.outcome.word if row.verdict is not None and text != "-" else ""
    return f'<span class="{word}">{_e(text)}</span>' if word else _e(text)


def _figure_cells(
    row: SummaryRow, mark: str, rate: bool, change: bool, limits: bool = False, tcp: bool = False
) -> list[str]:
    p50, p99, throughput, samples = cells(row)
    values = [p50, p99, *([throughput] if rate else []), samples]
    headline = 2 if rate else 0  # the figure best/worst ranks by
    out = [
        f'<td class="{mark}">{_e(value)} <small>{mark}</small></td>'
        if mark and i == headline
        else f"<td>{_e(value)}</td>"
        for i, value in enumerate(values)
    ]
    out += [f"<td>{_baseline_cell(row)}</td>"] if change else []
    if limits:  # the limit, and the figures its verdict used
        out.append(f"<td>{_e(row.limit or '-')}<br><small>{_e(row.limit_figures)}</small></td>")
    return out + ([f"<td>{_e(row.transport or '-')}</td>"] if tcp else [])


def _summary_section(rows: Sequence[SummaryRow], fabrics: Sequence[str]) -> str:
    """Per test and benchmark, one table: a row per size (payload, profile); per engine the
    fabrics side by side in column groups (p50, p99, throughput where the benchmark has one,
    samples, and the baseline change), best and worst marked among an engine's fabrics only
    beyond noise; with several engines, column groups of the first engine's figures over each
    other's per fabric (``grpcio/native on lo``)."""
    by_benchmark: dict[tuple[str, str], list[Group]] = {}
    for group in grouped(rows, fabrics):
        by_benchmark.setdefault((group.test, group.label), []).append(group)
    order = {name: i for i, name in enumerate(fabrics)}
    parts = []
    for (test, label), groups in by_benchmark.items():
        members = [row for g in groups for row in g.rows]
        columns_of: dict[tuple[str, str], None] = {}
        for row in sorted(members, key=lambda r: (order.get(r.fabric, len(order)), r.fabric)):
            columns_of.setdefault((row.engine, row.fabric), None)
        engines = list(dict.fromkeys(engine for g in groups for engine, _ in g.engines))
        columns = sorted(columns_of, key=lambda c: engines.index(c[0]))
        ratios = list(dict.fromkeys((r.name, r.fabric) for g in groups for r in engine_ratios(g)))
        rate = any(r.throughput_Bps is not None for r in members)
        change = any(r.verdict is not None for r in members)
        heads = ["p50", "p99", *(["throughput"] if rate else []), "samples"]
        heads += ["vs baseline"] if change else []
        limits = any(r.limit for r in members)
        tcp = any(r.transport for r in members)
        heads += (["limit"] if limits else []) + (["transport"] if tcp else [])
        ratio_heads = ["p50", "p99", *(["throughput"] if rate else [])]
        several = len(engines) > 1
        out = ["<table>", '<tr><th class="l" rowspan="2">size</th>']
        out += [
            f'<th colspan="{len(heads)}">{_e(f"{e} on {f}" if several else f)}</th>'
            for e, f in columns
        ]
        out += [f'<th colspan="{len(ratio_heads)}">{_e(n)} on {_e(f)}</th>' for n, f in ratios]
        out.append("</tr><tr>")
        out += [f"<th>{c}</th>" for _ in columns for c in heads]
        out += [f"<th>{c}</th>" for _ in ratios for c in ratio_heads]
        out.append("</tr>")
        for group in groups:
            out.append(f'<tr><td class="l">{_e(group.size)}</td>')
            found: dict[tuple[str, str], tuple[SummaryRow, str]] = {}
            for engine, engine_rows in group.engines:
                marked = marks(engine_rows)
                for i, row in enumerate(engine_rows):
                    found[(engine, row.fabric)] = (row, marked.get(i, ""))
            for column in columns:
                if column not in found:
                    out += ["<td>-</td>"] * len(heads)
                    continue
                row, mark = found[column]
                out += _figure_cells(row, mark, rate, change, limits, tcp)
            by_ratio = {(r.name, r.fabric): r for r in engine_ratios(group)}
            for column in ratios:
                ratio = by_ratio.get(column)
                values = (
                    [ratio.p50, ratio.p99, *([ratio.throughput] if rate else [])]
                    if ratio is not None
                    else [None] * len(ratio_heads)
                )
                out += [f"<td>{_e(ratio_text(v))}</td>" for v in values]
            out.append("</tr>")
        out.append("</table>")
        parts.append(f"<h3>{_e(test)} &middot; {_e(label)}</h3>")
        parts.append("\n".join(out))
        parts += _ps_tables([row for g in groups for row in g.rows])
    if not parts:
        return '<p class="note">No tfgrpc figures were recorded in this run.</p>'
    legend = (
        '<p class="note">best/worst: by throughput, else p50, only where one engine\'s fabrics '
        "differ beyond noise (U test on the sketched samples). a/b: engine a's figure over "
        "engine b's on that fabric. vs baseline: current/baseline - 1 (+ = the figure grew), "
        "with the gate's word for it and &plusmn; the smallest change it could detect. PS "
        "load: the slowest task carried the most bytes in (then CPU). limit: what bounded the "
        "size (the docs' &quot;What limited a figure&quot;), with the figures the rule used; "
        "transport: TCP retransmissions per GB and drops, where not zero.</p>"
    )
    return "\n".join(parts) + legend


def _ps_tables(rows: Sequence[SummaryRow]) -> list[str]:
    """A table of each PS point's per-task load, the slowest task marked."""
    out = []
    for row in rows:
        loads = row.measurement.ps_rows()
        if not loads:
            continue
        body = [
            [
                f'<span class="slowest">{_e(load.task)} <small>slowest</small></span>'
                if load.slowest
                else _e(load.task),
                *(_e(c) for c in ps_cells(load)),
            ]
            for load in loads
        ]
        where = f"{row.size} on {row.fabric}" + (f" ({row.engine})" if row.engine else "")
        out.append(f'<p class="note">PS load per task: {_e(where)}</p>')
        out.append(_table(["ps", "bytes in", "bytes out", "rpcs", "cpu"], body, css="ps"))
    return out


def _verdict_section(found: Sequence[Verdict]) -> str:
    if not found:
        return '<p class="note">No baseline was given: no verdicts.</p>'
    counts: dict[str, int] = {}
    for v in found:
        counts[v.outcome.value] = counts.get(v.outcome.value, 0) + 1
    summary = ", ".join(f"{n} {_e(outcome)}" for outcome, n in sorted(counts.items()))
    shown = [v for v in found if v.outcome is not Outcome.PASS]
    rows = [
        [
            _e(v.key.test),
            _e(v.figure),
            f'<span class="{_e(v.outcome.value)}">{_e(v.outcome.value)}</span>',
            _e(v.change_text()) if math.isfinite(v.change) else "-",
            f"&plusmn;{v.threshold:.1%}" if math.isfinite(v.threshold) else "-",
            _e(v.reason),
        ]
        for v in shown
    ]
    if not rows:
        return f"<p>Figures compared: {summary}.</p>"
    table = _table(
        ["test", "figure", "verdict", "change", "detectable", "reason"], rows, text_last=True
    )
    regressions = counts.get("regression", 0)
    # Folded (no script needed) so that a long list does not push the plots away; open when
    # something regressed.
    return (
        f"<p>Figures compared: {summary}.</p>\n"
        f"<details{' open' if regressions else ''}><summary>{len(rows)} verdicts other than "
        f"pass</summary>\n{table}\n</details>"
    )


def _plots_section(records: Mapping[str, TestRecord]) -> str:
    try:
        drawn = draw(records)
    except PlotUnavailableError as exc:
        return f'<p class="note">No plots: {_e(exc)}</p>'
    if not drawn:
        return '<p class="note">Nothing to plot.</p>'
    parts = []
    for name, fig in drawn:
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
        data = base64.b64encode(buffer.getvalue()).decode("ascii")
        parts.append(
            f'<figure><img alt="{_e(name)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{_e(name)}</figcaption></figure>"
        )
    return "\n".join(parts)


def _meta_section(run: HtmlRun) -> str:
    meta = {k.removeprefix(META_PREFIX): v for k, v in run.meta.items()}
    outcomes: dict[str, int] = {}
    for outcome in run.outcomes.values():
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    rows = [["fabrics", _e(", ".join(run.fabrics) or "-")]]
    rows.append(
        [
            "tests",
            ", ".join(
                f'<span class="outcome-{_e(o)}">{n} {_e(o)}</span>'
                for o, n in sorted(outcomes.items())
            )
            or "-",
        ]
    )
    rows += [[_e(k), _e(v)] for k, v in sorted(meta.items())]
    return _table(["", ""], rows, css="meta")


def render_html(run: HtmlRun) -> str:
    """The report as one HTML document (str), self-contained."""
    rows = [row for record in run.records.values() for row in summary_rows(record)]
    made = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    notes = "".join(f'<p class="worse">{_e(n)}</p>' for n in run.notes)
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{_e(run.title)}</title><style>{_CSS}</style></head><body>",
            f"<h1>{_e(run.title)}</h1>",
            f'<p class="note">Written {made} by pytest-tfgrpc from the records of the run '
            "(its JUnit properties).</p>",
            '<h2 id="summary">Summary</h2>',
            _summary_section(rows, run.fabrics),
            '<h2 id="baseline">Baseline verdicts</h2>',
            notes,
            _verdict_section([v for record in run.records.values() for v in record.verdicts]),
            '<h2 id="plots">Plots</h2>',
            _plots_section(run.records),
            '<h2 id="run">Run</h2>',
            _meta_section(run),
            "</body></html>",
        ]
    )


def write_html(run: HtmlRun, path: str | os.PathLike[str]) -> Path:
    """Write :func:`render_html` to ``path`` atomically (its directory made if missing)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(target, render_html(run).encode("utf-8"))
