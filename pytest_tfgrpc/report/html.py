"""One self-contained HTML report of a run (``--tfgrpc-html FILE``).

Everything is inside the one file, so it opens anywhere without network access: the CSS is
inline, the plots are PNG ``data:`` URIs, there is no script. It is built from the same
``tfgrpc.*`` properties as the JUnit XML (:mod:`pytest_tfgrpc.report.summary` reads them), so it
never shows a figure the XML does not hold:

* run metadata (``tfgrpc.meta.*``: host, versions, fabrics) and the outcome counts;
* per test and benchmark, a table with one row per message size (payload, profile) and the
  fabrics side by side (p50, p99, throughput, samples), best and worst marked only when they
  differ beyond noise, and the baseline change with the gate's word for it;
* the baseline verdicts other than a pass, each with its change, the smallest change the gate
  could detect, and its reason;
* the plots of :mod:`pytest_tfgrpc.report.plot` (when matplotlib is installed).
"""

from __future__ import annotations

import base64
import datetime
import html
import io
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pytest_tfgrpc.report.plot import PlotUnavailableError, draw
from pytest_tfgrpc.report.properties import META_PREFIX, PREFIX
from pytest_tfgrpc.report.results_file import atomic_write
from pytest_tfgrpc.report.summary import (
    SummaryRow,
    cells,
    grouped,
    marks,
    summary_rows,
)

__all__ = ["HtmlRun", "Verdict", "render_html", "write_html"]

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
.worst { color: #a40e26; font-weight: 600; }
.worse, .regression { color: #a40e26; font-weight: 600; }
.better, .improvement { color: #116329; font-weight: 600; }
.unsure, .inconclusive { color: #9a6700; }
.outcome-passed { color: #116329; } .outcome-failed, .outcome-error { color: #a40e26; }
.note { color: #57606a; font-size: 0.9em; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #e4e8eb; }
figcaption { font-family: ui-monospace, monospace; font-size: 0.85em; color: #57606a; }
"""


@dataclass(frozen=True)
class Verdict:
    """One baseline verdict read from a test's properties."""

    test: str
    figure: str  # <label>.<size>.<metric>
    outcome: str
    change: str = ""
    detectable: str = ""
    reason: str = ""


@dataclass
class HtmlRun:
    """What the report shows: per-test properties (``(name, value)`` pairs), outcomes, the
    fabrics in command-line order, run metadata (``tfgrpc.meta.*`` names or unprefixed) and
    notes (the gate's warnings)."""

    figures: Mapping[str, Sequence[tuple[str, object]]]
    outcomes: Mapping[str, str] = field(default_factory=dict)
    fabrics: Sequence[str] = ()
    meta: Mapping[str, str] = field(default_factory=dict)
    notes: Sequence[str] = ()
    title: str = "pytest-tfgrpc run"


def verdicts(figures: Mapping[str, Sequence[tuple[str, object]]]) -> list[Verdict]:
    """Every baseline verdict in the run's properties (``....<metric>.verdict`` with its
    ``.change``, ``.detectable`` and ``.verdict_reason`` when recorded)."""
    out = []
    for test, pairs in figures.items():
        props = {str(n): str(v) for n, v in pairs}
        for name, value in props.items():
            if not name.startswith(PREFIX) or not name.endswith(".verdict"):
                continue
            stem = name.removesuffix(".verdict")
            out.append(
                Verdict(
                    test=test,
                    figure=stem.removeprefix(PREFIX),
                    outcome=value,
                    change=props.get(f"{stem}.change", ""),
                    detectable=props.get(f"{stem}.detectable", ""),
                    reason=props.get(f"{stem}.verdict_reason", ""),
                )
            )
    return out


def _percent(text: str) -> str:
    try:
        return f"{float(text):+.1%}"
    except ValueError:
        return html.escape(text)


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
    word = next((w for w in ("worse", "better", "same", "unsure") if f" {w}" in text), "")
    return f'<span class="{word}">{_e(text)}</span>' if word else _e(text)


def _summary_section(rows: Sequence[SummaryRow], fabrics: Sequence[str]) -> str:
    """Per test and benchmark, one table: a row per size (payload, profile), the fabrics side
    by side in column groups (p50, p99, throughput where the benchmark has one, samples, and
    the baseline change), best and worst marked only beyond noise."""
    by_benchmark: dict[tuple[str, str], list[tuple[str, list[SummaryRow]]]] = {}
    for (test, label, size), members in grouped(rows, fabrics):
        by_benchmark.setdefault((test, label), []).append((size, members))
    order = {name: i for i, name in enumerate(fabrics)}
    parts = []
    for (test, label), sizes in by_benchmark.items():
        members_all = [row for _, members in sizes for row in members]
        seen = sorted({r.fabric for r in members_all}, key=lambda f: (order.get(f, len(order)), f))
        rate = any(r.throughput_MBps is not None for r in members_all)
        change = any(r.change is not None for r in members_all)
        columns = ["p50", "p99", *(["throughput"] if rate else []), "samples"]
        columns += ["vs baseline"] if change else []
        limits = any(r.limit for r in members_all)
        transport = any(r.transport for r in members_all)
        columns += (["limit"] if limits else []) + (["transport"] if transport else [])
        out = ["<table>", '<tr><th class="l" rowspan="2">size</th>']
        out += [f'<th colspan="{len(columns)}">{_e(f)}</th>' for f in seen]
        out.append("</tr><tr>")
        out += [f"<th>{c}</th>" for _ in seen for c in columns]
        out.append("</tr>")
        for size, members in sizes:
            marked = {members[i].fabric: m for i, m in marks(members).items()}
            by_fabric = {r.fabric: r for r in members}
            out.append(f'<tr><td class="l">{_e(size)}</td>')
            for fabric in seen:
                row = by_fabric.get(fabric)
                if row is None:
                    out += ["<td>-</td>"] * len(columns)
                    continue
                p50, p99, throughput, samples = cells(row)
                values = [p50, p99, *([throughput] if rate else []), samples]
                mark = marked.get(fabric, "")
                headline = 2 if rate else 0  # the figure best/worst ranks by
                for i, value in enumerate(values):
                    if mark and i == headline:
                        out.append(f'<td class="{mark}">{_e(value)} <small>{mark}</small></td>')
                    else:
                        out.append(f"<td>{_e(value)}</td>")
                if change:
                    out.append(f"<td>{_baseline_cell(row)}</td>")
                if limits:
                    used = _e(row.limit_figures)
                    out.append(
                        f'<td title="{used}">{_e(row.limit or "-")}<br><small>{used}</small></td>'
                    )
                if transport:
                    out.append(f"<td>{_e(row.transport or '-')}</td>")
            out.append("</tr>")
        out.append("</table>")
        parts.append(f"<h3>{_e(test)} &middot; {_e(label)}</h3>")
        parts.append("\n".join(out))
    if not parts:
        return '<p class="note">No tfgrpc figures were recorded in this run.</p>'
    legend = (
        '<p class="note">best/worst: by throughput, else p50, only where the fabrics differ '
        "beyond noise (U test on the sketched samples). vs baseline: current/baseline - 1 "
        "(+ = the figure grew), with the gate's word for it and &plusmn; the smallest change "
        "it could detect. limit: what bounded the size (the README's &quot;What limited a "
        "figure&quot;), with the figures the rule used; transport: TCP retransmissions per GB "
        "and drops, where not zero.</p>"
    )
    return "\n".join(parts) + legend


def _verdict_section(found: Sequence[Verdict]) -> str:
    if not found:
        return '<p class="note">No baseline was given: no verdicts.</p>'
    counts: dict[str, int] = {}
    for v in found:
        counts[v.outcome] = counts.get(v.outcome, 0) + 1
    summary = ", ".join(f"{n} {_e(outcome)}" for outcome, n in sorted(counts.items()))
    shown = [v for v in found if v.outcome not in ("pass",)]
    rows = [
        [
            _e(v.test),
            _e(v.figure),
            f'<span class="{_e(v.outcome)}">{_e(v.outcome)}</span>',
            _percent(v.change) if v.change else "-",
            f"&plusmn;{_percent(v.detectable).lstrip('+')}" if v.detectable else "-",
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


def _plots_section(figures: Mapping[str, Sequence[tuple[str, object]]]) -> str:
    try:
        drawn = draw(figures)
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
    rows = [row for test, pairs in run.figures.items() for row in summary_rows(test, pairs)]
    made = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    notes = "".join(f'<p class="worse">{_e(n)}</p>' for n in run.notes)
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{_e(run.title)}</title><style>{_CSS}</style></head><body>",
            f"<h1>{_e(run.title)}</h1>",
            f'<p class="note">Written {made} by pytest-tfgrpc from the JUnit properties '
            "of the run.</p>",
            '<h2 id="summary">Summary</h2>',
            _summary_section(rows, run.fabrics),
            '<h2 id="baseline">Baseline verdicts</h2>',
            notes,
            _verdict_section(verdicts(run.figures)),
            '<h2 id="plots">Plots</h2>',
            _plots_section(run.figures),
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
