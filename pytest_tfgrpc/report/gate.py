"""The baseline gate: each finished test's figures against an earlier run's, as the plugin
applies it. The verdicts are :mod:`pytest_tfgrpc.report.compare`'s; this module decides what a
verdict costs a test, and what an unusable baseline or a different setup costs the run."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pytest_tfgrpc.report.compare import (
    blind_history_warnings,
    compare_test,
    format_comparison,
    short_history_warning,
    typical_run_spread,
)
from pytest_tfgrpc.report.junit import Baseline, BaselineError, load_history
from pytest_tfgrpc.report.record import (
    Key,
    Outcome,
    TestRecord,
    unusable_baseline_properties,
    verdict_properties,
)
from pytest_tfgrpc.report.setup_check import Mismatch, check_metadata, split_by_setup
from pytest_tfgrpc.report.tolerance import parse_tolerances
from pytest_tfgrpc.stats.significance import DEFAULT_ALPHA

MISSING_POLICIES = ("fail", "warn")


class GateSetupError(ValueError):
    """The gate cannot run as asked: the baseline is unusable or the setups differ, and the
    policy says that fails the run."""


@dataclass(frozen=True)
class GateSettings:
    """How the gate judges: the baseline runs (files, directories or results files, oldest
    first), tolerances per metric, significance level, and policies (``missing``: whether a
    baseline figure this run did not compare fails the run)."""

    baseline_paths: tuple[str, ...]
    tolerances: Mapping[str, float]
    alpha: float = DEFAULT_ALPHA
    inconclusive: str = "pass"
    bad_baseline: str = "fail"
    mismatch: str = "warn"
    missing: str = "fail"

    @property
    def baseline_path(self) -> str:
        """The baseline paths as one string, for messages."""
        return ", ".join(self.baseline_paths)


def settings_from_options(
    baseline_path: str | Sequence[str],
    tolerances: Sequence[str],
    *,
    alpha: float | None,
    inconclusive: str | None,
    bad_baseline: str | None,
    mismatch: str | None,
    missing: str | None = None,
) -> GateSettings:
    """Read the gate's options; ValueError naming the bad one."""
    parsed = parse_tolerances(list(tolerances) or ["10%"])
    if alpha is not None and not 0.0 < alpha < 1.0:
        raise ValueError(f"--tfgrpc-alpha {alpha}: a significance level between 0 and 1")
    if missing is not None and missing not in MISSING_POLICIES:
        raise ValueError(f"--tfgrpc-missing {missing!r}: one of {', '.join(MISSING_POLICIES)}")
    paths = (baseline_path,) if isinstance(baseline_path, str) else tuple(baseline_path)
    return GateSettings(
        baseline_paths=paths,
        missing=missing or "fail",
        tolerances=parsed,
        alpha=alpha if alpha is not None else DEFAULT_ALPHA,
        inconclusive=inconclusive or "pass",
        bad_baseline=bad_baseline or "fail",
        mismatch=mismatch or "warn",
    )


@dataclass(frozen=True)
class TestVerdict:
    """What the gate concluded for one test: properties to record, and why it fails if so."""

    properties: tuple[tuple[str, str], ...]
    failure: str | None


class BaselineGate:
    """Judges finished tests against a baseline loaded once per run.

    ``warnings`` collects what the run must be told (an unusable baseline under ``warn``, setup
    mismatches under ``warn``); with no usable baseline the gate judges nothing and says so in
    every test's properties, so a missing baseline is never a silent pass.
    """

    def __init__(self, settings: GateSettings, meta: Mapping[str, str], fabrics: Iterable[str]):
        self.settings = settings
        self.warnings: list[str] = []
        self.baseline: Baseline | None = None
        self.history: tuple[Baseline, ...] = ()
        self.mismatches: tuple[Mismatch, ...] = ()
        self._spread_floor: float | None = None
        try:
            duplicates: list[str] = []
            loaded = load_history(settings.baseline_paths, skipped=duplicates)
            self.warnings += [f"baseline: {note}: counted once" for note in duplicates]
            split = split_by_setup(loaded, meta, fabrics)
            self.history = split.runs
            if split.note:
                self.warnings.append(split.note)
            self.baseline = self.history[-1]
            short = short_history_warning(len(self.history))
            if short:
                self.warnings.append(short)
            self.warnings += blind_history_warnings(
                self.history, settings.tolerances, alpha=settings.alpha
            )
        except BaselineError as exc:
            if settings.bad_baseline == "fail":
                raise GateSetupError(f"{exc} (--tfgrpc-bad-baseline=fail)") from None
            self.warnings.append(f"no baseline gate: {exc}")
            return
        self.mismatches = check_metadata(self.baseline, meta, fabrics)
        if self.mismatches:
            described = "; ".join(m.describe() for m in self.mismatches)
            if settings.mismatch == "fail":
                raise GateSetupError(
                    f"baseline {settings.baseline_path} comes from another setup: {described} "
                    "(--tfgrpc-baseline-mismatch=fail)"
                )
            self.warnings.append(f"baseline setup differs: {described}")

    def judge(self, nodeid: str, record: TestRecord) -> TestVerdict:
        """Compare one finished test's record (read under its JUnit name, ``classname.name``:
        :func:`~pytest_tfgrpc.report.record.junit_test_id`) with the baseline's."""
        if self.baseline is None:
            return TestVerdict(tuple(unusable_baseline_properties()), None)
        if self._spread_floor is None:  # once per run: it depends on the history only
            self._spread_floor = typical_run_spread(self.history, self.settings.tolerances)
        comparison = compare_test(
            self.history,
            record,
            self.settings.tolerances,
            alpha=self.settings.alpha,
            spread_floor=self._spread_floor,
        )
        recorded = tuple(verdict_properties(comparison.verdicts, comparison.new))
        failing = [*comparison.regressions, *comparison.with_outcome(Outcome.INVALID)]
        if self.settings.inconclusive == "fail":
            failing += comparison.inconclusive
        if not failing:
            return TestVerdict(recorded, None)
        what = (
            "regression"
            if comparison.regressions
            else "invalid figures"
            if comparison.with_outcome(Outcome.INVALID)
            else "inconclusive"
        )
        figures = ", ".join(v.figure for v in failing)
        table = "\n".join(format_comparison(comparison))
        # The cause first: pytest's one-line summary cuts long messages from the right.
        headline = (
            f"{what}: {figures} against baseline {self.settings.baseline_path} "
            f"({comparison.summary()}) in {nodeid}"
        )
        return TestVerdict(recorded, f"{headline}\n{table}")


@dataclass(frozen=True)
class Unmatched:
    """A baseline measurement the run did not compare, and why."""

    key: Key
    why: str

    def describe(self) -> str:
        return f"{self.key.describe()}: {self.why}"


def _looks_like(baseline_test: str, tests: Iterable[str]) -> str:
    """A test of this run whose name differs from ``baseline_test`` only by leading
    components (a --junit-prefix, another rootdir, a package moved): the same last two
    components and parameters."""
    tail = ".".join(baseline_test.split("[")[0].split(".")[-2:])
    params = baseline_test.partition("[")[1:]
    for test in tests:
        same_tail = ".".join(test.split("[")[0].split(".")[-2:]) == tail
        if test != baseline_test and test.partition("[")[1:] == params and same_tail:
            return test
    return ""


def unmatched_figures(
    history: Sequence[Baseline],
    ran: Mapping[str, TestRecord],
    deselected: Iterable[str],
    fabrics: Iterable[str],
) -> tuple[Unmatched, ...]:
    """Every measurement of the most recent baseline run that this run did not compare, with
    why: its test was deselected, is not in this run (renamed, removed, or named differently:
    then the look-alike is named), ran on no fabric of this run, ran but recorded no figure
    (failed or skipped first), or recorded other points. ``ran`` maps each JUnit test id of
    this run to its record."""
    if not history:
        return ()
    latest = history[-1]
    off = set(deselected)
    run_fabrics = set(fabrics)
    recorded: dict[str, set[Key]] = {test: set(record.by_key()) for test, record in ran.items()}
    out = []
    for key in sorted(latest.measurements, key=Key.order):
        if key.test in recorded and key in recorded[key.test]:
            continue
        if key.test in off:
            why = "deselected in this run"
        elif key.test not in ran:
            alike = _looks_like(key.test, ran)
            why = (
                f"no test of that name in this run; this run's {alike} looks like it: the "
                "JUnit names differ (another rootdir, --junit-prefix or package?)"
                if alike
                else "no test of that name in this run (renamed or removed?)"
            )
        elif key.fabric and run_fabrics and key.fabric not in run_fabrics:
            why = f"fabric {key.fabric} is not measured in this run"
        elif not recorded[key.test]:
            why = "the test ran but recorded no figure (it failed or was skipped first)"
        else:
            why = "the test did not measure this point in this run"
        out.append(Unmatched(key, why))
    return tuple(out)


def finish_lines(
    gate: BaselineGate, unmatched: Sequence[Unmatched], compared: int
) -> tuple[list[str], str | None]:
    """What the end of a gated run says about coverage, and why it fails (None when it does
    not): baseline figures not compared fail under ``missing=fail``; a run that compared
    nothing at all fails under ``bad_baseline=fail``."""
    if gate.baseline is None:
        return [], None
    lines = [f"not compared: {u.describe()}" for u in unmatched]
    runs = len(gate.history)
    lines.insert(0, f"baseline runs: {runs}; figures compared: {compared}")
    failure = None
    if compared == 0:
        failure = (
            f"baseline {gate.settings.baseline_path} matched no figure of this run: nothing was "
            "gated (--tfgrpc-bad-baseline=fail)"
        )
        if gate.settings.bad_baseline != "fail":
            lines.append(f"WARNING {failure.replace('=fail', '=warn')}")
            failure = None
    if unmatched and failure is None and gate.settings.missing == "fail":
        failure = (
            f"{len(unmatched)} baseline figure{'s' if len(unmatched) > 1 else ''} not compared "
            "(--tfgrpc-missing=fail; warn lists them only)"
        )
    return lines, failure
