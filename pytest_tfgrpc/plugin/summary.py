"""The end of a run: the summary table (and how many tests went through loopback), the
results file, the plots and the baseline verdicts, gathered from test reports (so
pytest-xdist workers' figures arrive too)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from pytest_tfgrpc.report.gate import BaselineGate
from pytest_tfgrpc.report.html import HtmlRun, write_html
from pytest_tfgrpc.report.plot import PlotUnavailableError, write_plots
from pytest_tfgrpc.report.properties import LOOPBACK, PATH, PREFIX
from pytest_tfgrpc.report.results_file import ResultLog
from pytest_tfgrpc.report.summary import SummaryRow, format_summary, summary_rows

REPORTER_NAME = "tfgrpc-summary"

_OUTCOME_RANK = {"passed": 0, "skipped": 1, "error": 2, "failed": 3}


class SummaryReporter:
    """Collects the figures and baseline verdicts of every finished test (from its reports,
    so it works under pytest-xdist too): appends each test to the results file as it ends,
    and prints the tables and writes the plots at the end of the run."""

    def __init__(
        self,
        fabrics: Sequence[str],
        gate: BaselineGate | None,
        results: ResultLog | None,
        plot_dir: str | None,
        html_path: str | None = None,
        meta: Mapping[str, str] | None = None,
    ) -> None:
        self.fabrics = tuple(fabrics)
        self.gate = gate
        self.results = results
        self.plot_dir = plot_dir
        self.html_path = html_path
        self.meta = dict(meta or {})
        self.outcomes: dict[str, str] = {}
        self.rows: list[SummaryRow] = []
        self.verdicts: dict[str, int] = {}
        self.notes: list[str] = []
        self.figures: dict[str, list[tuple[str, object]]] = {}
        #: ``tfgrpc.path`` of every measuring test: did its traffic cross the fabric?
        self.paths: dict[str, str] = {}
        self._outcomes: dict[str, tuple[str, float]] = {}

    def _track(self, report: pytest.TestReport) -> tuple[str, float]:
        outcome: str = report.outcome
        if report.when != "call" and report.failed:
            outcome = "error"
        previous, duration = self._outcomes.get(report.nodeid, ("passed", 0.0))
        if _OUTCOME_RANK[outcome] < _OUTCOME_RANK[previous]:
            outcome = previous
        state = (outcome, duration + report.duration)
        self._outcomes[report.nodeid] = state
        return state

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        outcome, duration = self._track(report)
        if report.when != "teardown":
            return
        del self._outcomes[report.nodeid]
        self.outcomes[report.nodeid] = outcome
        if self.results is not None:
            self.results.append(
                report.nodeid,
                outcome=outcome,
                duration=duration,
                properties=report.user_properties,
                worker=getattr(report, "worker_id", None),
            )
        if not report.user_properties:
            return
        self.figures[report.nodeid] = list(report.user_properties)
        self.rows.extend(summary_rows(report.nodeid, report.user_properties))
        properties = dict(report.user_properties)
        if PATH in properties:
            self.paths[report.nodeid] = str(properties[PATH])
        for name, value in report.user_properties:
            if not str(name).endswith(".verdict"):
                continue
            self.verdicts[str(value)] = self.verdicts.get(str(value), 0) + 1
            if value not in ("pass", "no baseline"):
                reason = properties.get(f"{name}_reason", "")
                figure = str(name).removeprefix(PREFIX).removesuffix(".verdict")
                self.notes.append(f"{value}: {report.nodeid} {figure} {reason}")

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.rows:
            terminalreporter.write_sep("=", "tfgrpc")  # section() would leave a blank line
            for line in format_summary(self.rows, self.fabrics):
                terminalreporter.write_line(line)
        loopback = sum(path.startswith(LOOPBACK) for path in self.paths.values())
        if loopback:
            terminalreporter.write_line(
                f"tfgrpc: {loopback} of {len(self.paths)} measuring tests went through loopback"
                " (servers and clients on one host), whatever their fabric's name; see the"
                f" {PATH} property",
                yellow=True,
            )
        if self.results is not None:
            terminalreporter.write_line(f"tfgrpc: results appended to {self.results.path}")
        if self.plot_dir is not None and self.figures:
            try:
                written = write_plots(self.figures, self.plot_dir)
            except PlotUnavailableError as exc:
                terminalreporter.write_line(f"tfgrpc: no plots: {exc}", yellow=True)
            else:
                for path in written:
                    terminalreporter.write_line(f"tfgrpc: plot {path}")
        if self.html_path is not None:
            self._write_html(terminalreporter)
        if self.gate is None:
            return
        terminalreporter.write_sep("=", "tfgrpc baseline")
        terminalreporter.write_line(f"baseline: {self.gate.settings.baseline_path}")
        for warning in self.gate.warnings:
            terminalreporter.write_line(f"WARNING {warning}", yellow=True, bold=True)
        counts = ", ".join(f"{n} {outcome}" for outcome, n in sorted(self.verdicts.items()))
        terminalreporter.write_line(f"figures compared: {counts or 'none'}")
        for note in self.notes:
            terminalreporter.write_line(note, red=note.startswith("regression"))

    def _write_html(self, terminalreporter: pytest.TerminalReporter) -> None:
        assert self.html_path is not None
        run = HtmlRun(
            figures=self.figures,
            outcomes=self.outcomes,
            fabrics=self.fabrics,
            meta=self.meta,
            notes=list(self.gate.warnings) if self.gate is not None else [],
        )
        try:
            path = write_html(run, self.html_path)
        except OSError as exc:
            terminalreporter.write_line(
                f"tfgrpc: no HTML report: cannot write {self.html_path}: {exc.strerror or exc}",
                red=True,
            )
            return
        terminalreporter.write_line(f"tfgrpc: HTML report {path}")

    def close(self) -> None:
        if self.results is not None:
            self.results.close()
