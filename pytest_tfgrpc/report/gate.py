"""The baseline gate: each finished test's figures against an earlier run's, as the plugin
applies it. The verdicts are :mod:`pytest_tfgrpc.report.compare`'s; this module decides what a
verdict costs a test, and what an unusable baseline or a different setup costs the run."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pytest_tfgrpc.report.compare import compare_test, format_comparison, verdict_properties
from pytest_tfgrpc.report.junit import Baseline, BaselineError, junit_test_id, load_baseline
from pytest_tfgrpc.report.properties import PREFIX
from pytest_tfgrpc.report.setup_check import Mismatch, check_metadata
from pytest_tfgrpc.report.tolerance import parse_tolerances
from pytest_tfgrpc.stats.significance import DEFAULT_ALPHA

POLICIES = ("fail", "warn")
INCONCLUSIVE_POLICIES = ("fail", "pass")


class GateSetupError(ValueError):
    """The gate cannot run as asked: the baseline is unusable or the setups differ, and the
    policy says that fails the run."""


@dataclass(frozen=True)
class GateSettings:
    """How the gate judges: tolerances per metric, significance level, and policies."""

    baseline_path: str
    tolerances: Mapping[str, float]
    alpha: float = DEFAULT_ALPHA
    inconclusive: str = "pass"
    bad_baseline: str = "fail"
    mismatch: str = "warn"


def settings_from_options(
    baseline_path: str,
    tolerances: Sequence[str],
    *,
    alpha: float | None,
    inconclusive: str | None,
    bad_baseline: str | None,
    mismatch: str | None,
) -> GateSettings:
    """Read the gate's options; ValueError naming the bad one."""
    parsed = parse_tolerances(list(tolerances) or ["10%"])
    if alpha is not None and not 0.0 < alpha < 1.0:
        raise ValueError(f"--tfgrpc-alpha {alpha}: a significance level between 0 and 1")
    return GateSettings(
        baseline_path=baseline_path,
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
        self.mismatches: tuple[Mismatch, ...] = ()
        try:
            self.baseline = load_baseline(settings.baseline_path)
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

    def judge(self, nodeid: str, properties: Sequence[tuple[str, object]]) -> TestVerdict:
        """Compare one finished test's recorded figures with the baseline's."""
        if self.baseline is None:
            return TestVerdict(((f"{PREFIX}baseline", "unusable"),), None)
        comparison = compare_test(
            self.baseline,
            junit_test_id(nodeid),
            properties,
            self.settings.tolerances,
            alpha=self.settings.alpha,
        )
        recorded = tuple(verdict_properties(comparison))
        failing = list(comparison.regressions)
        if self.settings.inconclusive == "fail":
            failing += comparison.inconclusive
        if not failing:
            return TestVerdict(recorded, None)
        what = "regressed" if comparison.regressions else "was inconclusive"
        table = "\n".join(format_comparison(comparison))
        headline = (
            f"{nodeid} {what} against baseline {self.settings.baseline_path} "
            f"({comparison.summary()})"
        )
        return TestVerdict(recorded, f"{headline}\n{table}")
