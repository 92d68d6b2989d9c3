"""The gate across rounds and runs: the replicate test, rounds in the measuring loop and the
JUnit properties, histories of runs, what a run did not compare, change points, and the JUnit
reader with lxml and large text nodes."""

from __future__ import annotations

import io
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from pytest_tfgrpc.bench.timing import RunSpec
from pytest_tfgrpc.cli import history as history_cli
from pytest_tfgrpc.report.compare import compare_figure, compare_runs
from pytest_tfgrpc.report.gate import unmatched_figures
from pytest_tfgrpc.report.history import format_trends, trends
from pytest_tfgrpc.report.junit import (
    Baseline,
    BaselineError,
    load_baseline,
    load_history,
    read_junit,
)
from pytest_tfgrpc.report.record import Key, Measurement, Outcome, read_record, result_properties
from pytest_tfgrpc.results import BenchmarkResult, SizeResult
from pytest_tfgrpc.stats.replicates import invalid_values, replicate_test

KEY = Key("t.test_a[lo]", "lo", "p2p_latency", "1KiB")


def format_rounds(rounds: dict[str, tuple[float, ...]]) -> str:
    """A ``.rounds`` property's value, as docs/reference/junit.md documents it."""
    return ";".join(f"{m}={','.join(repr(v) for v in values)}" for m, values in rounds.items())


def rounds(level: float, spread: float, seed: int, n: int = 10) -> tuple[float, ...]:
    rng = np.random.default_rng(seed)
    return tuple(float(v) for v in level * np.exp(rng.normal(0.0, spread, n)))


def measurement(values: tuple[float, ...], key: Key = KEY) -> Measurement:
    return Measurement(key, {"p50": float(np.median(values))}, None, rounds={"p50": values})


# --- the replicate test -----------------------------------------------------------------------


def test_history_of_runs_uses_the_spread_between_runs() -> None:
    # Runs whose levels differ by ~8 % while rounds within a run agree to 1 %: a test across
    # samples or rounds would call a 10 % shift significant; across runs it is not.
    levels = [300e3 * math.exp(0.08 * z) for z in (-1.0, 0.5, 1.2, -0.7, 0.1, -0.2)]
    history = [rounds(level, 0.01, seed) for seed, level in enumerate(levels)]
    shifted = rounds(330e3, 0.01, 99)
    test = replicate_test(shifted, history, alpha=0.05)
    assert test.runs == 6 and "across 6 baseline runs" in test.method
    assert test.direction == 0 and test.detectable > 0.15
    slowed = replicate_test(rounds(600e3, 0.01, 98), history, alpha=0.05)
    assert slowed.direction == 1 and slowed.change == pytest.approx(0.99, abs=0.1)


def test_few_runs_take_the_spread_of_a_round() -> None:
    one = [rounds(300e3, 0.05, 1)]
    test = replicate_test(rounds(310e3, 0.05, 2), one, alpha=0.05)
    assert test.runs == 1 and "run spread taken as a round's" in test.method
    # A round's spread (5 %), not its standard error: a 3 % shift is not detectable.
    assert test.direction == 0 and test.detectable > 0.1
    assert replicate_test(rounds(450e3, 0.05, 2), one, alpha=0.05).direction == 1


@pytest.mark.parametrize(
    ("values", "why"),
    [((1.0, 0.0, 2.0), "not positive"), ((1.0, -1.0, 2.0), "not positive"),
     ((1.0, math.nan, 2.0), "nan"), ((1.0, math.inf, 2.0), "inf")],
)  # fmt: skip
def test_degenerate_rounds_are_refused(values: tuple[float, ...], why: str) -> None:
    assert why in invalid_values(values)
    with pytest.raises(ValueError, match="invalid"):
        replicate_test(values, [(1.0, 2.0, 3.0)], alpha=0.05)
    verdict = compare_figure(measurement((1.0, 2.0, 3.0)), measurement(values), "p50", 0.1)
    assert verdict.outcome is Outcome.INVALID and "not a measurement" in verdict.reason


def test_replicate_test_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="rounds"):
        replicate_test((1.0, 2.0), [(1.0, 2.0, 3.0)], alpha=0.05)
    with pytest.raises(ValueError, match="no baseline"):
        replicate_test((1.0, 2.0, 3.0), [], alpha=0.05)
    with pytest.raises(ValueError, match="alpha"):
        replicate_test((1.0, 2.0, 3.0), [(1.0, 2.0, 3.0)], alpha=1.0)


def test_every_verdict_says_what_it_could_detect() -> None:
    history = [measurement(rounds(300e3, 0.03, s)) for s in range(5)]
    verdict = compare_figure(
        history[-1], measurement(rounds(305e3, 0.03, 9)), "p50", 0.1, earlier=history[:-1]
    )
    assert verdict.outcome is Outcome.PASS and verdict.runs == 5
    assert verdict.threshold == max(0.1, verdict.detectable)
    assert "could detect >=" in verdict.reason
    assert verdict.detection().startswith("could detect >=")


def test_a_family_of_figures_is_tested_at_a_stricter_level() -> None:
    history = [measurement(rounds(300e3, 0.03, s)) for s in range(5)]
    current = measurement(rounds(330e3, 0.03, 9))
    alone = compare_figure(history[-1], current, "p50", 0.0, earlier=history[:-1])
    of_ten = compare_figure(history[-1], current, "p50", 0.0, earlier=history[:-1], family=10)
    assert of_ten.detectable > alone.detectable


PS_KEY = Key("t.test_ps[lo]", "lo", "ps_throughput", "1MiB")


def ps_run(throughput: float, step: float, key: Key = PS_KEY) -> Measurement:
    """A PS measurement as PS benchmarks record it: figures, no rounds (no sketch here)."""
    return Measurement(key, {"throughput": throughput, "step_p50": step}, None)


@pytest.mark.parametrize("k", [3, 5, 10])
def test_figures_without_rounds_are_tested_across_runs_from_three_on(k: int) -> None:
    # PS throughput drifts ~8 % between runs: unchanged drift passes, a halving fails.
    rng = np.random.default_rng(k)
    levels = 1e9 * np.exp(rng.normal(0, 0.08, k))
    history = [ps_run(float(level), 2e6) for level in levels]
    typical = float(np.exp(np.mean(np.log(levels))))
    # Three runs (t with 2 degrees of freedom, a spread guessed from 3 values) see only very
    # large changes: this history's halving is inconclusive (said, with what could be
    # detected); from five runs on it is a regression.
    halved = Outcome.INCONCLUSIVE if k == 3 else Outcome.REGRESSION
    for current, outcome in ((typical * 0.95, Outcome.PASS), (typical / 2, halved)):
        verdict = compare_figure(
            history[-1], ps_run(current, 2e6), "throughput", 0.1, earlier=history[:-1]
        )
        assert verdict.outcome is outcome, verdict.reason
        assert f"across {k} baseline runs' figures (no rounds)" in verdict.reason
        assert verdict.runs == k and verdict.detectable > 0.1  # the runs' spread, not 0


def test_a_drift_between_runs_that_fails_a_sample_test_passes_across_runs() -> None:
    # The new user's case: +13.8 % on a PS figure with p=5e-24 on samples, from run drift.
    from pytest_tfgrpc.stats.replicates import run_test

    values = [1.00e9, 1.12e9, 0.93e9, 1.05e9]
    test = run_test(1.00e9 / 1.138, values, alpha=0.05)
    assert test.direction == 0 and test.p_value > 0.05
    assert run_test(0.4e9, values, alpha=0.05).direction == -1


def test_fewer_than_three_runs_without_rounds_keep_the_sample_test() -> None:
    history = [ps_run(1e9, 2e6), ps_run(1.05e9, 2e6)]
    verdict = compare_figure(
        history[-1], ps_run(0.5e9, 2e6), "throughput", 0.1, earlier=history[:-1]
    )
    assert "no rounds" not in verdict.reason  # no sketch here: inconclusive, saying why
    assert verdict.outcome is Outcome.INCONCLUSIVE and "sketch" in verdict.reason


def test_runs_that_agree_by_chance_do_not_claim_more_precision_than_the_machine_has() -> None:
    # Three runs of one figure agree to the digit; the machine's other figures move ~10 %
    # between runs: a +15 % shift of the first is within that, not "certain".
    lucky, other = PS_KEY, PS_KEY._replace(size="4MiB")
    levels = (1.0, 1.12, 0.9, 1.05)
    history = [
        Baseline(
            f"run-{i}",
            {lucky: ps_run(1e9, 2e6), other: ps_run(level * 1e9, 2e6 / level, other)},
        )
        for i, level in enumerate(levels)
    ]
    current = Baseline("new", {lucky: ps_run(1e9 / 1.15, 2e6), other: ps_run(1e9, 2e6, other)})
    verdicts = {(v.key.size, v.metric): v for v in compare_runs(history, current, {}).verdicts}
    shifted = verdicts[("1MiB", "throughput")]
    assert shifted.outcome is Outcome.INCONCLUSIVE, shifted.reason
    assert shifted.detectable > 0.15
    # Alone (no other figure to learn the machine's drift from), the same shift is certain.
    alone = compare_figure(
        history[-1].measurements[lucky],
        current.measurements[lucky],
        "throughput",
        0.1,
        earlier=[h.measurements[lucky] for h in history[:-1]],
    )
    assert alone.outcome is Outcome.REGRESSION


def test_the_floor_comes_from_the_whole_history_whatever_test_is_judged() -> None:
    # The in-pytest gate judges one test at a time: the floor must still be the history's
    # (every test's figures), the same as tfgrpc-compare uses for the whole run.
    from pytest_tfgrpc.report.compare import typical_run_spread

    steady, moving = PS_KEY, PS_KEY._replace(test="t.test_other[lo]")
    levels = (1.0, 1.2, 0.85, 1.1)
    history = [
        Baseline(f"run-{i}", {steady: ps_run(1e9, 2e6), moving: ps_run(v * 1e9, 2e6 / v, moving)})
        for i, v in enumerate(levels)
    ]
    spread = float(np.std(np.log(levels), ddof=1))
    # Four figures tested across runs: two steady (0), two moving by `spread`; the median.
    assert typical_run_spread(history) == pytest.approx(spread / 2)
    assert typical_run_spread(history[:2]) == 0.0  # two runs: nothing is tested across runs


@pytest.mark.parametrize(
    ("values", "current", "match"),
    [
        ([1.0, 2.0], 1.0, "a test across runs needs 3"),
        ([1.0, 2.0, 0.0], 1.0, "baseline runs' figure is invalid"),
        ([1.0, 2.0, 3.0], math.nan, "current run's figure is invalid"),
        ([1.0, 2.0, math.inf], 1.0, "invalid: a value is inf"),
    ],
)
def test_run_test_refuses_what_is_no_history(
    values: list[float], current: float, match: str
) -> None:
    from pytest_tfgrpc.stats.replicates import run_test

    with pytest.raises(ValueError, match=match):
        run_test(current, values, alpha=0.05)


# --- rounds in the loop and the properties ----------------------------------------------------


def test_round_spec_shares_count_and_time() -> None:
    run = RunSpec(iterations=1000, warmup=50, max_seconds=5.0, warmup_seconds=1.0, rounds=10)
    first, later = run.round_spec(0), run.round_spec(3)
    assert (first.iterations, first.warmup, first.max_seconds) == (100, 50, 0.5)
    assert (later.iterations, later.warmup, later.warmup_seconds) == (100, 5, 0.1)
    assert RunSpec(10, 0, 1.0, 1.0).round_spec(0) == RunSpec(10, 0, 1.0, 1.0)
    seven = RunSpec(7, 0, 1.0, 1.0, rounds=10)
    assert seven.round_count == 7 and [seven.round_spec(i).iterations for i in range(7)] == [1] * 7
    odd = RunSpec(23, 0, 1.0, 1.0, rounds=10)
    assert sum(odd.round_spec(i).iterations for i in range(10)) == 23
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="rounds"):
            RunSpec(10, 0, 1.0, 1.0, rounds=bad)  # type: ignore[arg-type]


def test_rounds_are_recorded_and_read_back() -> None:
    samples = np.concatenate([np.full(5, 1000 * (i + 1), dtype=np.int64) for i in range(4)])
    point = SizeResult.from_samples(1024, 1040, samples, int(samples.sum()), rounds=(5,) * 4)
    assert point.round_figures(rates=False)["p50"] == (1000.0, 2000.0, 3000.0, 4000.0)
    result = BenchmarkResult("p2p_latency", "p2p_latency", "lo", "x:1", "raw", "unary", (point,))
    (read,) = read_record("t", result_properties(result)).measurements
    assert read.rounds["p50"] == (1e3, 2e3, 3e3, 4e3)
    again = read_record("t", [("tfgrpc.x.1KiB.rounds", format_rounds({"p99": (1.5, 2.25)}))])
    assert again.measurements[0].rounds == {"p99": (1.5, 2.25)}
    for bad in ("p50", "p50=a,b", "=1,2"):
        with pytest.raises(ValueError, match="round figures"):
            read_record("t", [("tfgrpc.x.1KiB.rounds", bad)], strict=True)
        assert not read_record("t", [("tfgrpc.x.1KiB.rounds", bad)]).measurements


# --- histories and what was not compared ------------------------------------------------------


def write_run(path: Path, tests: dict[str, dict[str, str]], meta: dict[str, str]) -> Path:
    cases = "".join(
        f'<testcase classname="{t.rpartition(".")[0]}" name="{t.rpartition(".")[2]}">'
        "<properties>"
        + "".join(f'<property name="{n}" value="{v}"/>' for n, v in props.items())
        + "</properties></testcase>"
        for t, props in tests.items()
    )
    suite_props = "".join(
        f'<property name="tfgrpc.meta.{k}" value="{v}"/>' for k, v in meta.items()
    )
    path.write_text(
        f'<?xml version="1.0"?><testsuites><testsuite name="pytest" hostname="h">'
        f"<properties>{suite_props}</properties>{cases}</testsuite></testsuites>"
    )
    return path


def props_of(level: float, seed: int) -> dict[str, str]:
    values = rounds(level, 0.02, seed)
    return {
        "tfgrpc.fabric": "lo",
        "tfgrpc.p2p_latency.1KiB.p50_us": f"{np.median(values) / 1e3:.3f}",
        "tfgrpc.p2p_latency.1KiB.rounds": format_rounds({"p50": values}),
    }


def test_a_directory_and_a_results_file_are_histories(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    for i in range(4):
        write_run(runs / f"run-{i:03d}.xml", {"t.test_a[lo]": props_of(300e3, i)}, {"host": "h"})
    history = load_history([runs])
    assert [Path(r.source).name for r in history] == [f"run-{i:03d}.xml" for i in range(4)]
    new = write_run(tmp_path / "new.xml", {"t.test_a[lo]": props_of(600e3, 9)}, {"host": "h"})
    current = load_baseline(new)
    comparison = compare_runs(history, current, {})
    assert [v.outcome for v in comparison.verdicts] == [Outcome.REGRESSION]
    assert comparison.verdicts[0].runs == 4
    results = tmp_path / "results.jsonl"
    results.write_text(
        "".join(
            json.dumps({"test": "t.py::test_a[lo]", "run": f"r{i}", "properties": props_of(3e5, i)})
            + "\n"
            for i in range(3)
        )
    )
    assert [r.source.rpartition("#")[2] for r in load_history([results])] == ["r0", "r1", "r2"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(BaselineError, match="holds no"):
        load_history([tmp_path / "empty"])


def test_a_run_given_twice_counts_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    for i in range(3):
        meta = {"host": "h", "run_id": f"id{i}"}
        write_run(runs / f"run-{i}.xml", {"t.test_a[lo]": props_of(300e3, i)}, meta)
    (runs / "z-latest.xml").symlink_to(runs / "run-2.xml")  # a link beside its target
    copy = tmp_path / "copy-of-run-1.xml"  # another file, the same run id
    copy.write_bytes((runs / "run-1.xml").read_bytes())
    untagged = write_run(tmp_path / "untagged.xml", {"t.test_a[lo]": props_of(3e5, 7)}, {})
    skipped: list[str] = []
    history = load_history([runs, runs / "run-0.xml", copy, untagged, untagged], skipped=skipped)
    assert [Path(r.source).name for r in history] == [
        "run-0.xml", "run-1.xml", "run-2.xml", "untagged.xml"
    ]  # fmt: skip
    assert len(skipped) == 4
    assert any("z-latest.xml is the run" in note and "run-2.xml" in note for note in skipped)
    assert any(note.startswith(str(copy)) for note in skipped)
    # A results file's runs are told apart by their run ids, and match a JUnit file's.
    results = tmp_path / "results.jsonl"
    results.write_text(
        "".join(
            json.dumps({"test": "t.py::test_a[lo]", "run": run, "properties": props_of(3e5, 1)})
            + "\n"
            for run in ("id0", "id5", "id5")
        )
    )
    skipped.clear()
    again = load_history([runs / "run-0.xml", results], skipped=skipped)
    assert [r.source.rpartition("#")[2] for r in again] == [str(runs / "run-0.xml"), "id5"]
    assert len(skipped) == 1 and "#id0" in skipped[0]
    # tfgrpc-compare says so, and counts the run once.
    new = write_run(tmp_path / "new.xml", {"t.test_a[lo]": props_of(300e3, 9)}, {"host": "h"})
    from pytest_tfgrpc.cli.compare import main

    main([str(runs / "run-0.xml")] * 3 + [str(new)])
    err = capsys.readouterr().err
    assert err.count("counted once") == 2
    assert "the baseline holds 1 run:" in err


def test_every_unmatched_baseline_figure_says_why(tmp_path: Path) -> None:
    tests = {
        name: props_of(300e3, 1)
        for name in ("t.test_kept[lo]", "t.test_renamed[lo]", "t.test_off[lo]",
                     "t.test_failed[lo]", "ci.t.test_prefixed[lo]")
    }  # fmt: skip
    eth = dict(props_of(300e3, 2), **{"tfgrpc.fabric": "eth0"})
    base = load_baseline(write_run(tmp_path / "b.xml", {**tests, "t.test_eth[eth0]": eth}, {}))
    keys = {k.test: k for k in base.measurements}
    base = Baseline(
        base.source,
        {**base.measurements, Key("t.test_kept[lo]", "eth0", "p2p_latency", "1KiB"):
         base.measurements[keys["t.test_kept[lo]"]]},
    )  # fmt: skip
    ran = {
        test: read_record(test, props)
        for test, props in {
            "t.test_kept[lo]": list(props_of(300e3, 1).items()),
            "t.test_failed[lo]": [],
            "t.test_prefixed[lo]": list(props_of(300e3, 1).items()),
            "t.test_eth[eth0]": [],
        }.items()
    }
    why = {
        (u.key.test, u.key.fabric): u.why
        for u in unmatched_figures([base], ran, {"t.test_off[lo]"}, ["lo"])
    }
    assert "renamed or removed" in why["t.test_renamed[lo]", "lo"]
    assert why["t.test_off[lo]", "lo"] == "deselected in this run"
    assert "recorded no figure" in why["t.test_failed[lo]", "lo"]
    assert "t.test_prefixed[lo] looks like it" in why["ci.t.test_prefixed[lo]", "lo"]
    assert "fabric eth0 is not measured" in why["t.test_kept[lo]", "eth0"]
    assert ("t.test_kept[lo]", "lo") not in why


#: Why the change-point tests skip without the history extra (it is in dev).
NEEDS_RUPTURES = "needs the history extra (ruptures; in dev)"


def write_levels(directory: Path, levels: list[float]) -> list[Path]:
    """One run per level (p50 of the 1 KiB echo, in ns), oldest first by name."""
    directory.mkdir(exist_ok=True)
    return [
        write_run(directory / f"r{i:02d}.xml", {"t.a[lo]": props_of(level, i)}, {})
        for i, level in enumerate(levels)
    ]


def test_trends_find_a_change_point(tmp_path: Path) -> None:
    pytest.importorskip("ruptures", reason=NEEDS_RUPTURES)
    runs = [load_baseline(path) for path in write_levels(tmp_path, [3e5] * 8 + [4.5e5] * 6)]
    (trend,) = trends(runs, ["p50"])
    assert [p.index for p in trend.change_points] == [8]
    assert trend.change_points[0].change == pytest.approx(0.5, abs=0.05)
    assert "change point at run 9 (" in "\n".join(format_trends([trend]))
    assert re.search(r": \+(49|50)\.\d% \(300us -> 450us\)$", format_trends([trend])[1])
    with pytest.raises(ValueError, match="not gated"):
        trends(runs, ["max"])


def test_the_history_command_shows_trends_and_plots_them(tmp_path: Path) -> None:
    pytest.importorskip("ruptures", reason=NEEDS_RUPTURES)
    write_levels(tmp_path / "runs", [3e5] * 8 + [4.5e5] * 6)
    plots, out = tmp_path / "plots", io.StringIO()
    assert history_cli.main([str(tmp_path / "runs"), "--plot", str(plots)], out) == 0
    text = out.getvalue()
    assert re.search(r"change point at run 9 \(\S*r08\.xml\): \+(49|50)\.\d%", text), text
    assert "tfgrpc-history: 14 runs, 1 figures, 1 change points" in text
    (png,) = plots.iterdir()
    assert f"plot {png}" in text and png.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize(
    ("levels", "status", "changes"),
    [
        ([3e5] * 13 + [4.5e5], 1, 1),  # the last run is 50 % slower: fail
        ([3e5] * 13 + [2e5], 0, 1),  # faster: a change, not a failure
        ([3e5] * 8 + [4.5e5] * 6, 0, 1),  # slower, but since run 9: the history's level now
        ([3e5] * 14, 0, 0),
    ],
)
def test_the_history_command_fails_on_change_only_when_the_last_run_starts_a_worse_level(
    tmp_path: Path, levels: list[float], status: int, changes: int
) -> None:
    pytest.importorskip("ruptures", reason=NEEDS_RUPTURES)
    write_levels(tmp_path, levels)
    out = io.StringIO()
    assert history_cli.main([str(tmp_path), "--fail-on-change"], out) == status, out.getvalue()
    lines = out.getvalue().splitlines()
    assert f"tfgrpc-history: 14 runs, 1 figures, {changes} change points" in lines
    worse = "tfgrpc-history: the last run starts a worse level for 1 figures"
    assert (worse in lines) == (status == 1)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{runs}"], "change points need ruptures: pip install -e '.[history]' in the checkout"),
        (["{runs}", "--alpha", "1.5"], "alpha 1.5: between 0 and 1"),
        (["{tmp}/nowhere"], "nowhere"),
    ],
)
def test_the_history_command_refuses_in_one_line_what_it_cannot_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    # As without the history extra, whether or not this environment has it.
    monkeypatch.setitem(sys.modules, "ruptures", None)
    runs = tmp_path / "runs"
    write_levels(runs, [3e5] * 4)
    out = io.StringIO()
    argv = [a.format(runs=runs, tmp=tmp_path) for a in args]
    assert history_cli.main(argv, out) == 2
    (line,) = out.getvalue().splitlines()
    assert line.startswith("tfgrpc-history: error: ") and message in line


# --- the JUnit reader -------------------------------------------------------------------------


def test_an_11_mb_junit_file_reads_with_lxml(tmp_path: Path) -> None:
    from junitparser import junitparser as implementation

    pytest.importorskip("lxml")
    picked = getattr(implementation, "etree")  # noqa: B009 (not re-exported)
    assert picked.__name__ == "lxml.etree"  # junitparser picked lxml
    big = "x" * (11 * 1024 * 1024)
    path = write_run(tmp_path / "big.xml", {"t.test_a[lo]": props_of(3e5, 1)}, {"host": "h"})
    out = f"</properties><system-out>{big}</system-out></testcase>"
    path.write_text(path.read_text().replace("</properties></testcase>", out))
    assert path.stat().st_size > 11 * 1024 * 1024
    assert [c.test for c in read_junit(path).cases] == ["t.test_a[lo]"]
    assert load_baseline(path).measurements


def test_a_resource_limit_is_not_called_corruption(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_tfgrpc.report import junit

    path = write_run(tmp_path / "b.xml", {"t.test_a[lo]": props_of(3e5, 1)}, {})

    def limited(_: str) -> None:
        raise SyntaxError("Resource limit exceeded: Text node too long, try XML_PARSE_HUGE")

    monkeypatch.setattr(junit, "_parse_xml", limited)
    with pytest.raises(BaselineError, match="resource limits") as error:
        read_junit(path)
    assert "corrupt" not in str(error.value).replace("not known to be corrupt", "")


def test_unstable_rounds_are_warned_as_pyperf_does() -> None:
    from pytest_tfgrpc.plugin.summary import unstable_rounds
    from pytest_tfgrpc.stats.replicates import instability

    assert instability((1.0, 1.0, 1.0)) == 0.0
    assert math.isnan(instability((1.0,)))
    steady = format_rounds({"p50": (100.0, 101.0, 99.0)})
    shaky = format_rounds({"p50": (100.0, 150.0, 60.0), "throughput": (1.0, 1.0, 1.0)})
    props = [
        ("tfgrpc.p2p_latency.1KiB.rounds", steady),
        ("tfgrpc.p2p_latency.64KiB.rounds", shaky),
        ("tfgrpc.p2p_latency.4KiB.rounds", "not rounds"),
    ]
    (line,) = unstable_rounds(read_record("t.py::test_a", props))
    assert line == "unstable: t.py::test_a p2p_latency.64KiB: p50 44% between rounds (CV)"
    both = format_rounds({"p50": (100.0, 150.0, 60.0), "throughput": (1.0, 2.0, 1.0)})
    (line,) = unstable_rounds(
        read_record("t.py::test_b", [("tfgrpc.p2p_bandwidth.1MiB.rounds", both)])
    )
    assert (
        line
        == "unstable: t.py::test_b p2p_bandwidth.1MiB: p50 44%, throughput 43% between rounds (CV)"
    )


def test_unstable_lines_are_one_counted_line_unless_verbose() -> None:
    from pytest_tfgrpc.plugin.summary import UNSTABLE_LEGEND, unstable_summary

    lines = [f"unstable: t.py::test_{i} p2p_latency.1KiB: p50 30% between rounds" for i in "ab"]
    assert unstable_summary([], verbose=False) == unstable_summary([], verbose=True) == []
    assert unstable_summary(lines, verbose=True) == [*lines, UNSTABLE_LEGEND]
    (short,) = unstable_summary(lines, verbose=False)
    assert short.startswith("unstable: 2 measured point(s) whose rounds vary more than pyperf")
    assert short.endswith("(-v lists them)")
