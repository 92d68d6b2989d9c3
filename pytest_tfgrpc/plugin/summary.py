"""The end of a run: the summary table (and how many tests went through loopback), the
results file, the plots and the baseline verdicts, gathered from test reports (so
pytest-xdist workers' figures arrive too)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import pytest
from _pytest.junitxml import xml_key

from pytest_tfgrpc.report.gate import (
    BaselineGate,
    compared_count,
    finish_lines,
    unmatched_figures,
)
from pytest_tfgrpc.report.html import HtmlRun, write_html
from pytest_tfgrpc.report.plot import PlotUnavailableError, write_plots
from pytest_tfgrpc.report.properties import (
    LOOPBACK,
    META_PREFIX,
    PATH,
    PREFIX,
    ROUNDS,
    parse_rounds,
)
from pytest_tfgrpc.report.results_file import ResultLog
from pytest_tfgrpc.report.summary import SummaryRow, format_summary, summary_rows
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


def _detection(properties: dict[str, object], verdict: str) -> str:
    base = verdict.removesuffix(".verdict")
    try:
        change = float(str(properties.get(f"{base}.change", "nan")))
        detectable = float(str(properties.get(f"{base}.detectable", "nan")))
    except ValueError:
        return ""
    moved = f"{change:+.1%}" if math.isfinite(change) else "change n/a"
    could = f"could detect >= {detectable:.1%}" if math.isfinite(detectable) else "no test ran"
    return f"{moved}, {could}"


#: Said once after the ``unstable:`` lines.
UNSTABLE_LEGEND = (
    f"unstable: a figure's rounds vary more than pyperf allows (standard deviation / mean above "
    f"{UNSTABLE_CV:.0%}): the machine was busy or the figure is noisy, and the gate can see "
    "less of a change in it"
)


def unstable_rounds(nodeid: str, properties: Sequence[tuple[str, object]]) -> list[str]:
    """One warning per point whose rounds' p50 or throughput varies more than pyperf allows
    (standard deviation above :data:`UNSTABLE_CV` of the mean), naming each figure that
    does; :data:`UNSTABLE_LEGEND` says what that means."""
    out = []
    for name, value in properties:
        if not str(name).startswith(PREFIX) or not str(name).endswith(f".{ROUNDS}"):
            continue
        try:
            rounds = parse_rounds(str(value))
        except ValueError:
            continue
        varying = []
        for metric in ("p50", "throughput"):
            cv = instability(rounds.get(metric, ()))
            if math.isfinite(cv) and cv > UNSTABLE_CV:
                varying.append(f"{metric} {cv:.0%}")
        if varying:
            point = str(name).removeprefix(PREFIX).removesuffix(f".{ROUNDS}")
            out.append(f"unstable: {nodeid} {point}: {', '.join(varying)} between rounds (CV)")
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
        #: JUnit id -> properties of every test that reported, and the deselected tests' ids.
        self.ran: dict[str, list[tuple[str, object]]] = {}
        self.deselected: set[str] = set()
        self.compared = 0
        self.coverage: list[str] = []
        self.unstable: list[str] = []
        self.waits: list[str] = []
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
        self.figures: dict[str, list[tuple[str, object]]] = {}
        #: ``tfgrpc.path`` of every measuring test: did its traffic cross the fabric?
        self.paths: dict[str, str] = {}
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
        props = self.ran.setdefault(self.junit_name(report.nodeid), [])
        if report.when in ("call", "teardown"):
            props[:] = list(report.user_properties)
        outcome, duration = self._track(report)
        if report.when != "teardown" or outcome == _RERUN:
            return
        self._outcomes.pop(report.nodeid, None)
        self.outcomes[report.nodeid] = outcome
        if self.results is not None:
            self._append_result(report, outcome, duration)
        self.compared += compared_count(report.user_properties)
        self.waits += [
            f"tfgrpc: {report.nodeid} {value}"
            for name, value in report.user_properties
            if name == f"{META_PREFIX}host_wait"
        ]
        if not report.user_properties:
            return
        self.figures[report.nodeid] = list(report.user_properties)
        self.unstable.extend(unstable_rounds(report.nodeid, report.user_properties))
        self.rows.extend(summary_rows(report.nodeid, report.user_properties))
        properties = dict(report.user_properties)
        if PATH in properties:
            self.paths[report.nodeid] = str(properties[PATH])
        for name, value in report.user_properties:
            if not str(name).endswith(".verdict"):
                continue
            self.verdicts[str(value)] = self.verdicts.get(str(value), 0) + 1
            figure = str(name).removeprefix(PREFIX).removesuffix(".verdict")
            if value not in ("pass", "no baseline"):
                reason = properties.get(f"{name}_reason", "")
                self.notes.append(f"{value}: {report.nodeid} {figure} {reason}")
            elif value == "pass":
                self.notes.append(f"pass: {report.nodeid} {figure} {_detection(properties, name)}")

    def _append_result(self, report: pytest.TestReport, outcome: str, duration: float) -> None:
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
            logxml.add_global_property(f"{PREFIX}gate.compared", str(self.compared))
            logxml.add_global_property(f"{PREFIX}gate.not_compared", str(len(unmatched)))
            for u in unmatched:
                logxml.add_global_property(f"{PREFIX}gate.not_compared.item", u.describe())
            if self.gate_failure:
                logxml.add_global_property(f"{PREFIX}gate.failure", self.gate_failure)
        if self.gate_failure and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        for line in self.waits:
            terminalreporter.write_line(line, yellow=True)
        if self.rows:
            terminalreporter.write_sep("=", "tfgrpc")  # section() would leave a blank line
            for line in format_summary(self.rows, self.fabrics):
                terminalreporter.write_line(line)
            for line in self.unstable:
                terminalreporter.write_line(line, yellow=True)
            if self.unstable:
                terminalreporter.write_line(UNSTABLE_LEGEND, yellow=True)
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
        terminalreporter.write_line(f"figures compared: {counts or 'none'}")
        for note in self.notes:
            terminalreporter.write_line(note, red=note.startswith(("regression", "invalid")))
        for line in self.coverage:
            terminalreporter.write_line(line, yellow=line.startswith("not compared"))
        if self.gate_failure:
            terminalreporter.write_line(f"FAILED {self.gate_failure}", red=True, bold=True)

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
