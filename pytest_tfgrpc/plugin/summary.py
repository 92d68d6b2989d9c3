"""The end of a run: the summary table (and how many tests went through loopback), the
results file, the plots and the baseline verdicts, gathered from test reports (so
pytest-xdist workers' figures arrive too)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import pytest
from _pytest.junitxml import xml_key

from pytest_tfgrpc.report.gate import BaselineGate, finish_lines, unmatched_figures
from pytest_tfgrpc.report.html import HtmlRun, write_html
from pytest_tfgrpc.report.plot import PlotUnavailableError, write_plots
from pytest_tfgrpc.report.record import (
    LOOPBACK,
    PATH,
    Outcome,
    TestRecord,
    gate_properties,
    read_record,
)
from pytest_tfgrpc.report.results_file import ResultLog
from pytest_tfgrpc.report.summary import (
    SummaryRow,
    format_ps_loads,
    format_summary,
    model_misses,
    summary_rows,
)
from pytest_tfgrpc.stats.replicates import UNSTABLE_CV, instability

REPORTER_NAME = "tfgrpc-summary"

_OUTCOME_RANK = {"passed": 0, "skipped": 1, "error": 2, "failed": 3}
#: Where an outcome another plugin invents ranks (between skipped and error): it is kept,
#: named as the plugin named it, and never outranks a failure.
_UNKNOWN_RANK = 1.5
#: pytest-rerunfailures logs a failed attempt it will run again as ``rerun``: that attempt
#: is over, and the next one starts afresh.
_RERUN = "rerun"


def _outcome_of(report: pytest.TestReport) -> str:
    """The report's outcome as the results name it: ``error`` for a failed setup or
    teardown, ``xfailed``/``xpassed`` for an expected failure, else what the report says
    (whatever a plugin put there)."""
    outcome = str(report.outcome)
    if report.when != "call" and report.failed:
        return "error"
    if hasattr(report, "wasxfail") and outcome in ("skipped", "passed"):
        return "xfailed" if outcome == "skipped" else "xpassed"
    return outcome


def _rank(outcome: str) -> float:
    return _OUTCOME_RANK.get(
        {"xfailed": "skipped", "xpassed": "passed"}.get(outcome, outcome), _UNKNOWN_RANK
    )


#: The test's own metadata key that says it waited for another run's measurements.
_HOST_WAIT = "host_wait"

#: Said once after the ``unstable:`` lines.
UNSTABLE_LEGEND = (
    f"unstable: a figure's rounds vary more than pyperf allows (standard deviation / mean above "
    f"{UNSTABLE_CV:.0%}): the machine was busy or the figure is noisy, and the gate can see "
    "less of a change in it"
)


def unstable_summary(lines: list[str], verbose: bool) -> list[str]:
    """What the summary says of the ``unstable:`` lines: each, then the legend, with ``-v``;
    else one line with their count (a short run on a busy machine has several)."""
    if not lines:
        return []
    if verbose:
        return [*lines, UNSTABLE_LEGEND]
    return [
        f"unstable: {len(lines)} measured point(s) whose rounds vary more than pyperf allows "
        f"(standard deviation / mean above {UNSTABLE_CV:.0%}): the machine was busy or the "
        "figures are noisy, and the gate can see less of a change in them (-v lists them)"
    ]


def unstable_rounds(record: TestRecord) -> list[str]:
    """One warning per point whose rounds' p50 or throughput varies more than pyperf allows
    (standard deviation above :data:`UNSTABLE_CV` of the mean), naming each figure that
    does; :data:`UNSTABLE_LEGEND` says what that means."""
    out = []
    for m in record.measurements:
        varying = []
        for metric in ("p50", "throughput"):
            cv = instability(m.rounds.get(metric, ()))
            if math.isfinite(cv) and cv > UNSTABLE_CV:
                varying.append(f"{metric} {cv:.0%}")
        if varying:
            out.append(
                f"unstable: {record.test} {m.key.figure}: {', '.join(varying)} between rounds (CV)"
            )
    return out


def _notes(record: TestRecord) -> list[str]:
    """A line per verdict: why, for each one other than a pass; what it could see, for a pass."""
    out = []
    for v in record.verdicts:
        if v.outcome is Outcome.PASS:
            moved = v.change_text() if math.isfinite(v.change) else "change n/a"
            could = (
                f"could detect >= {v.threshold:.1%}"
                if math.isfinite(v.threshold)
                else "no test ran"
            )
            out.append(f"pass: {record.test} {v.figure} {moved}, {could}")
        else:
            out.append(f"{v.outcome.value}: {record.test} {v.figure} {v.reason}")
    return out


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
        junit_name: Callable[[str], str] = str,
        html_path: str | None = None,
        meta: Mapping[str, str] | None = None,
    ) -> None:
        self.fabrics = tuple(fabrics)
        self.junit_name = junit_name
        #: JUnit id -> the record of every test that reported, and the deselected tests' ids.
        self.ran: dict[str, TestRecord] = {}
        self.deselected: set[str] = set()
        self.compared = 0
        self.coverage: list[str] = []
        self.unstable: list[str] = []
        self.waits: list[str] = []
        self.misses: list[str] = []
        self.gate_failure: str | None = None
        self.gate = gate
        self.results = results
        self.plot_dir = plot_dir
        self.html_path = html_path
        self.meta = dict(meta or {})
        self.outcomes: dict[str, str] = {}
        self.rows: list[SummaryRow] = []
        self.verdicts: dict[str, int] = {}
        self.notes: list[str] = []
        #: Node id -> the record of every test that recorded anything.
        self.records: dict[str, TestRecord] = {}
        self._outcomes: dict[str, tuple[str, float]] = {}
        #: Attempts another plugin (pytest-rerunfailures) dropped and ran again, per test.
        self.reruns: dict[str, int] = {}
        #: The first failure to write each output (results file, plots), one line each.
        self.output_errors: list[str] = []
        self._results_broken = False

    def _track(self, report: pytest.TestReport) -> tuple[str, float]:
        outcome = _outcome_of(report)
        previous, duration = self._outcomes.get(report.nodeid, ("passed", 0.0))
        if outcome == _RERUN:
            # the attempt is dropped: the next one's setup starts the test's state again
            self._outcomes.pop(report.nodeid, None)
            self.reruns[report.nodeid] = self.reruns.get(report.nodeid, 0) + 1
            return outcome, duration + report.duration
        if _rank(outcome) < _rank(previous):
            outcome = previous
        state = (outcome, duration + report.duration)
        self._outcomes[report.nodeid] = state
        return state

    def pytest_deselected(self, items: Sequence[pytest.Item]) -> None:
        self.deselected.update(self.junit_name(item.nodeid) for item in items)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        junit = self.junit_name(report.nodeid)
        if self.gate is not None and (report.when == "teardown" or junit not in self.ran):
            self.ran[junit] = read_record(junit, report.user_properties)
        outcome, duration = self._track(report)
        if report.when != "teardown" or outcome == _RERUN:
            return
        self._outcomes.pop(report.nodeid, None)
        self.outcomes[report.nodeid] = outcome
        if self.results is not None:
            self._append_result(report, outcome, duration, junit)
        if not report.user_properties:
            return
        record = read_record(report.nodeid, report.user_properties)
        self.compared += record.compared
        if _HOST_WAIT in record.meta:
            self.waits.append(f"tfgrpc: {report.nodeid} {record.meta[_HOST_WAIT]}")
        self.records[report.nodeid] = record
        self.unstable.extend(unstable_rounds(record))
        self.rows.extend(summary_rows(record))
        for v in record.verdicts:
            self.verdicts[v.outcome.value] = self.verdicts.get(v.outcome.value, 0) + 1
        if record.unjudged:
            self.verdicts["no baseline"] = self.verdicts.get("no baseline", 0) + len(
                record.unjudged
            )
        self.notes += _notes(record)
        self.misses += model_misses(record)

    def _append_result(
        self, report: pytest.TestReport, outcome: str, duration: float, junit: str
    ) -> None:
        assert self.results is not None
        record = {"reruns": self.reruns[report.nodeid]} if report.nodeid in self.reruns else {}
        try:
            if self._results_broken:
                self.results.end_partial_line()  # what the failed write left is not glued on
            self.results.append(
                report.nodeid,
                outcome=outcome,
                duration=duration,
                properties=report.user_properties,
                worker=getattr(report, "worker_id", None),
                junit=junit,
                extra=record,
            )
        except OSError as exc:
            # The run goes on (its other outputs too); the failure is said once, at the end.
            if not self._results_broken:
                self._output_error(
                    f"results file {self.results.path}: cannot append {report.nodeid}", exc
                )
            self._results_broken = True
        else:
            self._results_broken = False

    def _output_error(self, what: str, exc: OSError) -> None:
        self.output_errors.append(f"tfgrpc: {what}: {exc.strerror or exc}")

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        # Before pytest's JUnit writer (it writes in its own sessionfinish): say in the XML
        # and the exit status what the baseline had that this run did not compare.
        if self.gate is None or self.gate.baseline is None:
            return
        unmatched = unmatched_figures(self.gate.history, self.ran, self.deselected, self.fabrics)
        self.coverage, self.gate_failure = finish_lines(self.gate, unmatched, self.compared)
        logxml = session.config.stash.get(xml_key, None)
        if logxml is not None:
            totals = [u.describe() for u in unmatched]
            for name, value in gate_properties(self.compared, totals, self.gate_failure):
                logxml.add_global_property(name, value)
        if self.gate_failure and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        for line in self.waits:
            terminalreporter.write_line(line, yellow=True)
        if self.rows:
            terminalreporter.write_sep("=", "tfgrpc")  # section() would leave a blank line
            for line in format_summary(self.rows, self.fabrics):
                terminalreporter.write_line(line)
            for line in format_ps_loads(self.rows):
                terminalreporter.write_line(line)
            verbose = terminalreporter.config.get_verbosity() > 0
            for line in unstable_summary(self.unstable, verbose):
                terminalreporter.write_line(line, yellow=True)
        for line in self.misses:
            terminalreporter.write_line(line, yellow=True)
        paths = [record for record in self.records.values() if record.path]
        loopback = sum(record.loopback for record in paths)
        if loopback:
            terminalreporter.write_line(
                f"tfgrpc: {loopback} of {len(paths)} measuring tests went through {LOOPBACK}"
                " (servers and clients on one host), whatever their fabric's name; see the"
                f" {PATH} property",
                yellow=True,
            )
        if self.results is not None:
            terminalreporter.write_line(f"tfgrpc: results appended to {self.results.path}")
        if self.plot_dir is not None and self.records:
            try:
                written = write_plots(self.records, self.plot_dir)
            except PlotUnavailableError as exc:
                terminalreporter.write_line(f"tfgrpc: no plots: {exc}", yellow=True)
            except OSError as exc:
                self._output_error(f"no plots: cannot write into {self.plot_dir}", exc)
            else:
                for path in written:
                    terminalreporter.write_line(f"tfgrpc: plot {path}")
        if self.html_path is not None:
            self._write_html(terminalreporter)
        for line in self.output_errors:
            terminalreporter.write_line(line, red=True)
        if self.gate is None:
            return
        terminalreporter.write_sep("=", "tfgrpc baseline")
        terminalreporter.write_line(f"baseline: {self.gate.settings.baseline_path}")
        for warning in self.gate.warnings:
            terminalreporter.write_line(f"WARNING {warning}", yellow=True, bold=True)
        counts = ", ".join(f"{n} {outcome}" for outcome, n in sorted(self.verdicts.items()))
        terminalreporter.write_line(f"verdicts: {counts or 'none'}")
        for note in self.notes:
            terminalreporter.write_line(note, red=note.startswith(("regression", "invalid")))
        for line in self.coverage:
            terminalreporter.write_line(line, yellow=line.startswith("not compared"))
        if self.gate_failure:
            terminalreporter.write_line(f"FAILED {self.gate_failure}", red=True, bold=True)

    def _write_html(self, terminalreporter: pytest.TerminalReporter) -> None:
        assert self.html_path is not None
        run = HtmlRun(
            records=self.records,
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
