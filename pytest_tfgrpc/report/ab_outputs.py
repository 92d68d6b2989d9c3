"""What ``tfgrpc-ab`` writes besides its table: JUnit XML, a results file, an HTML report.

Each is what a gated pytest run writes, made from side B's most recent run: per test, B's
tfgrpc properties as that run recorded them, with the paired verdicts
(:func:`~pytest_tfgrpc.report.compare.verdict_properties`) beside them, so every reader of a
gated run (the HTML report, ``tfgrpc-compare``, a results-file history) reads these too. Run
properties ``tfgrpc.ab.*`` say how many pairs were used, which broke, the two commands, how the
pairs ran (interleave, order), why the run failed and what it noted and warned of; the HTML
report shows these last as the lines the run printed after its table.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_tfgrpc.report import html
from pytest_tfgrpc.report.compare import Comparison
from pytest_tfgrpc.report.junit import read_junit
from pytest_tfgrpc.report.record import PREFIX, Outcome, read_record, verdict_properties
from pytest_tfgrpc.report.results_file import ResultLog, atomic_write

__all__ = ["AbRun", "write_html", "write_junit", "write_results"]

AB_PREFIX = f"{PREFIX}ab."
#: The run properties that hold one line each (repeated), shown as the report's notes.
_LINES = {
    f"{AB_PREFIX}failure": "FAILED",
    f"{AB_PREFIX}broken.item": "broken",
    f"{AB_PREFIX}note": "note",
    f"{AB_PREFIX}warning": "warning",
}


@dataclass(frozen=True)
class AbRun:
    """A finished ``tfgrpc-ab``: its comparison, the pairs used and broken, the commands,
    side B's most recent JUnit file (whose figures the outputs carry) and why it fails."""

    comparison: Comparison
    pairs: int
    broken: tuple[str, ...]
    a_command: str
    b_command: str
    latest_b: Path
    failures: tuple[str, ...] = ()
    #: How the pairs ran: ``runs`` (one side after the other) or ``rounds`` (lockstep).
    interleave: str = "runs"
    #: Which side went first: ``alternate`` (A) or ``random`` (a seeded coin).
    order: str = "alternate"
    #: What the run warned of: a side that took no lockstep turns, pairs too few to see a
    #: figure's tolerance at their spread.
    warnings: tuple[str, ...] = ()
    #: What the run noted (a side's run whose tests failed, its figures used).
    notes: tuple[str, ...] = ()

    def run_properties(self) -> list[tuple[str, str]]:
        """The ``tfgrpc.ab.*`` properties, then side B's latest run metadata."""
        latest = read_junit(self.latest_b, "side B's JUnit file")
        out = [
            (f"{AB_PREFIX}pairs", str(self.pairs)),
            (f"{AB_PREFIX}broken", str(len(self.broken))),
            (f"{AB_PREFIX}a", self.a_command),
            (f"{AB_PREFIX}b", self.b_command),
            (f"{AB_PREFIX}interleave", self.interleave),
            (f"{AB_PREFIX}order", self.order),
        ]
        out += [(f"{AB_PREFIX}broken.item", b) for b in self.broken]
        out += [(f"{AB_PREFIX}failure", f) for f in self.failures]
        out += [(f"{AB_PREFIX}note", n) for n in self.notes]
        out += [(f"{AB_PREFIX}warning", w) for w in self.warnings]
        out += [(n, v) for n, v in latest.suite_properties if n.startswith(PREFIX)]
        return out

    def tests(self) -> dict[str, list[tuple[str, str]]]:
        """JUnit test id -> B's tfgrpc properties and the test's verdicts, for every test B's
        latest run recorded or the comparison judged."""
        latest = read_junit(self.latest_b, "side B's JUnit file")
        out: dict[str, list[tuple[str, str]]] = {}
        for case in latest.cases:
            kept = [(n, v) for n, v in case.properties if n.startswith(PREFIX)]
            if kept:
                out[case.test] = kept
        for test in sorted({v.key.test for v in self.comparison.verdicts}):
            out.setdefault(test, []).extend(
                verdict_properties(
                    [v for v in self.comparison.verdicts if v.key.test == test],
                    [k for k in self.comparison.new if k.test == test],
                )
            )
        return out

    def outcome(self, test: str) -> str:
        failing = (Outcome.REGRESSION, Outcome.INVALID)
        bad = any(v.key.test == test and v.outcome in failing for v in self.comparison.verdicts)
        return "failed" if bad else "passed"


def _split(test: str) -> tuple[str, str]:
    """A JUnit id as (classname, name): the name is the last dotted component before any
    parameters."""
    path, bracket, params = test.partition("[")
    classname, _, name = path.rpartition(".")
    return classname, name + bracket + params


def write_junit(run: AbRun, path: str | os.PathLike[str]) -> Path:
    """Write the verdicts as JUnit XML (one test case per test, a ``<failure>`` where a
    figure regressed or is invalid), atomically."""
    from junitparser import Failure
    from junitparser.xunit2 import JUnitXml, TestCase, TestSuite

    make_suite: Any = TestSuite  # junitparser's constructors are untyped
    xml: Any
    suite = make_suite("tfgrpc-ab")
    for name, value in run.run_properties():
        suite.add_property(name, value)
    for test, properties in run.tests().items():
        classname, name = _split(test)
        case = TestCase(name, classname=classname)
        for prop, value in properties:
            case.add_property(prop, value)
        if run.outcome(test) == "failed":
            reasons = [
                f"{v.key.label}.{v.key.size}.{v.reason}"
                for v in run.comparison.verdicts
                if v.key.test == test and v.outcome in (Outcome.REGRESSION, Outcome.INVALID)
            ]
            case.result = [Failure("; ".join(reasons))]
        suite.add_testcase(case)
    suite.update_statistics()
    xml = JUnitXml("tfgrpc-ab")
    xml.add_testsuite(suite)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(target, xml.tostring())


def write_results(run: AbRun, path: str | os.PathLike[str]) -> Path:
    """Append one record per test (B's figures and the verdicts) to a results file."""
    run_id = f"tfgrpc-ab-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:8]}"
    with ResultLog(path, run_id=run_id) as log:
        for test, properties in run.tests().items():
            log.append(test, outcome=run.outcome(test), duration=0.0, properties=properties)
    return Path(path)


def write_html(run: AbRun, path: str | os.PathLike[str], notes: Sequence[str] = ()) -> Path:
    """The HTML report of a gated run, with B's figures and the paired verdicts, and above
    them what the run printed after its table: why it failed, its broken pairs, notes and
    warnings (then ``notes``)."""
    tests = run.tests()
    properties = run.run_properties()
    said = [f"{_LINES[name]}: {value}" for name, value in properties if name in _LINES]
    return html.write_html(
        html.HtmlRun(
            records={test: read_record(test, props) for test, props in tests.items()},
            outcomes={test: run.outcome(test) for test in tests},
            notes=[*said, *notes],
            meta={name: value for name, value in properties if name not in _LINES},
            title="tfgrpc-ab: B against A",
        ),
        path,
    )
