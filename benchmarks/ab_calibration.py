"""Calibrate ``tfgrpc-ab`` on a busy machine, beside the history gate on the same runs.

A CPU-bound neighbour process (one Python busy loop, started here, stopped at the end; it
runs the whole time) shares this machine with every run, as another CI job shares a runner.
Each trial runs ``tfgrpc-ab`` on the one-test suite ``benchmarks/ab_suite`` (1 KiB echo, p50
gated at the default 10 % tolerance):

1. ``--trials`` (20) A/A trials of ``--pairs`` (5) pairs: both sides unchanged. A failing trial
   is a false failure (target: at most 1 of 20).
2. ``--trials`` trials with side B's server slowed (``--tfgrpc-server-delay``) so that the 1 KiB
   p50 is 1.2x A's (the delay: 0.2x the median p50 of the A/A phase's A runs). A failing trial
   is a detection (target: at least 16 of 20).
3. ``--trials`` trials of ``--long-pairs`` (10) pairs at 1.1x (moonshot: at least 16 of 20).

Every trial is also judged by the history gate (``tfgrpc-compare``'s verdicts), with the
trial's first 5 A runs as the history and its last B run as the current run. Those histories
were made minutes before, interleaved with B: a real history is older and has drifted more,
so this favours the history gate.

Last, the total time of one ``--pairs``-pair ``tfgrpc-ab`` of ``example_suites/test_p2p.py``.

``--quick`` is a smoke run for CI (2 trials of 3 pairs per phase, 1 of 4 at 1.1x, the example
with 3 pairs and few iterations); its figures say nothing about the targets. Writes
``--out`` (default ``benchmarks/results/ab_calibration.txt``, ``..._quick.txt`` with
``--quick``) as it goes, with the load (``uptime``) before and after. Every run is bounded in
time; the neighbour and every run are stopped whatever happens.

    .venv/bin/python benchmarks/ab_calibration.py            # the full run (~30 min)
    .venv/bin/python benchmarks/ab_calibration.py --quick    # the smoke run (~3 min)
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SUITE = HERE / "ab_suite"
BIN = Path(sys.executable).parent
#: A run of the one-test suite; its figures stay real, with 10 rounds of ~30 echoes.
RUN_OPTIONS = ("--tfgrpc-iterations=300", "--tfgrpc-warmup=30", "--tfgrpc-max-time=3")
RUN_TIMEOUT_S = 120.0
#: The neighbour stops itself after this long, should this script be killed outright.
NEIGHBOUR_LIMIT_S = 3 * 3600
HISTORY = 5


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


class Neighbour:
    """A CPU-bound busy loop in its own process: another job on the runner."""

    def __init__(self) -> None:
        loop = (
            "import time\n"
            f"end = time.monotonic() + {NEIGHBOUR_LIMIT_S}\n"
            "while time.monotonic() < end:\n"
            "    sum(range(1000))\n"
        )
        self.proc = subprocess.Popen([sys.executable, "-c", loop])

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def side(
    extra: Sequence[str] = (), suite: Path = SUITE, options: Sequence[str] = RUN_OPTIONS
) -> str:
    words = [str(BIN / "pytest"), "-p", "no:cacheprovider", "-q", str(suite), *options, *extra]
    return " ".join(words)


@dataclass(frozen=True)
class Trial:
    """One tfgrpc-ab trial and the history gate's verdict on the same runs."""

    phase: str
    index: int
    ab_exit: int
    ab_change: float
    ab_detectable: float
    ab_verdict: str
    history_failed: bool
    history_change: float
    history_detectable: float
    history_verdict: str
    seconds: float

    def line(self) -> str:
        def pct(x: float) -> str:
            return f"{x:+.1%}" if math.isfinite(x) else "n/a"

        return (
            f"{self.phase} trial {self.index:2d}: tfgrpc-ab exit {self.ab_exit} "
            f"{self.ab_verdict:<12} change {pct(self.ab_change):>7} detectable "
            f">={pct(self.ab_detectable):>7} | history gate "
            f"{'FAIL' if self.history_failed else 'pass'} {self.history_verdict:<12} change "
            f"{pct(self.history_change):>7} detectable >={pct(self.history_detectable):>7} "
            f"| {self.seconds:.0f} s"
        )


def _verdict(xml: Path) -> tuple[str, float, float]:
    """The p50 verdict, change and detectable change tfgrpc-ab recorded."""
    from pytest_tfgrpc.report.junit import read_junit

    if not xml.exists():
        return "no output", math.nan, math.nan
    props = {n: v for case in read_junit(xml).cases for n, v in case.properties}
    stem = "tfgrpc.p2p_latency.1KiB.p50"
    return (
        props.get(f"{stem}.verdict", "none"),
        float(props.get(f"{stem}.change", "nan")),
        float(props.get(f"{stem}.detectable", "nan")),
    )


def _history_gate(runs: Path, pairs: int) -> tuple[bool, str, float, float]:
    """The history gate on the trial's runs: the first 5 A runs, against the last B run."""
    from pytest_tfgrpc.cli.compare import gate_failures
    from pytest_tfgrpc.report.compare import compare_runs
    from pytest_tfgrpc.report.junit import BaselineError, load_baseline, load_history
    from pytest_tfgrpc.report.tolerance import parse_tolerances

    try:
        history = load_history([runs / f"a-{i:02d}.xml" for i in range(1, min(HISTORY, pairs) + 1)])
        current = load_baseline(runs / f"b-{pairs:02d}.xml")
    except BaselineError as error:
        return True, f"unusable: {error}", math.nan, math.nan
    comparison = compare_runs(history, current, parse_tolerances([]))
    failed = bool(gate_failures(comparison, missing="fail", inconclusive="pass", mismatch="warn"))
    p50 = [v for v in comparison.verdicts if v.metric == "p50"]
    if not p50:
        return failed, "none", math.nan, math.nan
    return failed, p50[0].outcome.value, p50[0].change, p50[0].threshold


def trial(phase: str, index: int, pairs: int, b_extra: Sequence[str], work: Path) -> Trial:
    runs = work / f"{phase}-{index:02d}"
    xml = runs / "ab.xml"
    started = time.monotonic()
    argv = [
        str(BIN / "tfgrpc-ab"),
        *("--pairs", str(pairs), "--a", side(), "--b", side(b_extra)),
        *("--dir", str(runs), "--junitxml", str(xml), "--timeout", str(RUN_TIMEOUT_S)),
    ]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=pairs * 2 * (RUN_TIMEOUT_S + 30)
        )
        code = done.returncode
    except subprocess.TimeoutExpired:
        code = -1
    seconds = time.monotonic() - started
    verdict, change, detectable = _verdict(xml)
    failed, h_verdict, h_change, h_detectable = _history_gate(runs, pairs)
    return Trial(
        phase, index, code, change, detectable, verdict, failed, h_change, h_detectable,
        h_verdict, seconds,
    )  # fmt: skip


def a_p50s(work: Path, phase: str) -> list[float]:
    """The 1 KiB p50 (ns) of every A run of a phase."""
    from pytest_tfgrpc.report.junit import BaselineError, load_baseline

    out = []
    for xml in sorted(work.glob(f"{phase}-*/a-*.xml")):
        try:
            run = load_baseline(xml)
        except BaselineError:
            continue
        out += [m.figures["p50"] for m in run.measurements.values() if "p50" in m.figures]
    return out


def phase_summary(phase: str, trials: Sequence[Trial], expect_fail: bool) -> str:
    ab = sum(t.ab_exit == 1 for t in trials)
    broken = sum(t.ab_exit not in (0, 1) for t in trials)
    history = sum(t.history_failed for t in trials)
    word = "caught" if expect_fail else "failed (false failures)"
    changes = [t.ab_change for t in trials if math.isfinite(t.ab_change)]
    seen = [t.ab_detectable for t in trials if math.isfinite(t.ab_detectable)]
    seen_h = [t.history_detectable for t in trials if math.isfinite(t.history_detectable)]
    median = statistics.median

    def pct(xs: list[float]) -> str:
        return f"{median(xs):+.1%}" if xs else "n/a"

    return (
        f"{phase}: tfgrpc-ab {word} {ab} of {len(trials)} ({broken} trials without a verdict); "
        f"history gate {word} {history} of {len(trials)}; median measured change {pct(changes)}, "
        f"median detectable: tfgrpc-ab >={pct(seen)}, history >={pct(seen_h)}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run for CI")
    parser.add_argument("--trials", type=int, default=None, help="trials per phase (20)")
    parser.add_argument("--pairs", type=int, default=None, help="pairs per trial (5)")
    parser.add_argument("--long-pairs", type=int, default=None, help="pairs at 1.1x (10)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    trials = args.trials or (2 if args.quick else 20)
    pairs = args.pairs or (3 if args.quick else 5)
    long_pairs = args.long_pairs or (4 if args.quick else 10)
    long_trials = 1 if args.quick else trials
    name = "ab_calibration_quick.txt" if args.quick else "ab_calibration.txt"
    out_path = args.out or HERE / "results" / name
    out_path.parent.mkdir(parents=True, exist_ok=True)
    neighbour = Neighbour()
    with open(out_path, "w") as out, tempfile.TemporaryDirectory(prefix="tfgrpc-ab-cal-") as tmp:
        work = Path(tmp)

        def say(line: str, stream: TextIO = out) -> None:
            print(line, file=stream, flush=True)
            print(line, flush=True)

        try:
            say(f"# benchmarks/ab_calibration.py{' --quick' if args.quick else ''}")
            say(f"# load before (neighbour just started): {uptime()}")
            say(f"# neighbour: one CPU-bound Python loop, pid {neighbour.proc.pid}, all along")
            say(f"# suite: {SUITE.relative_to(ROOT)} with {' '.join(RUN_OPTIONS)}")
            results: dict[str, list[Trial]] = {}
            started = time.monotonic()
            aa = results.setdefault("A/A", [])
            for i in range(1, trials + 1):
                aa.append(trial("aa", i, pairs, (), work))
                say(aa[-1].line())
            base = a_p50s(work, "aa")
            p50 = statistics.median(base) if base else math.nan
            say(f"# A/A: median 1 KiB p50 of the A runs {p50 / 1e3:.1f} us ({len(base)} runs)")
            if not math.isfinite(p50):
                say("# no A run measured a p50: cannot size the slowdowns")
                return 2
            for ratio, count, n_pairs in ((1.2, trials, pairs), (1.1, long_trials, long_pairs)):
                delay = f"{(ratio - 1.0) * p50 / 1e3:.0f}us"
                phase = f"{ratio}x/{n_pairs} pairs"
                say(f"# {phase}: side B's servers delayed {delay} (--tfgrpc-server-delay)")
                found = results.setdefault(phase, [])
                for i in range(1, count + 1):
                    found.append(
                        trial(f"x{ratio}", i, n_pairs, (f"--tfgrpc-server-delay={delay}",), work)
                    )
                    say(found[-1].line())
            say(f"# trials took {time.monotonic() - started:.0f} s")
            for phase, found in results.items():
                say(phase_summary(phase, found, expect_fail=phase != "A/A"))
            example = ROOT / "example_suites" / "test_p2p.py"
            options = ("--tfgrpc-iterations=30", "--tfgrpc-warmup=3") if args.quick else ()
            ex_started = time.monotonic()
            done = subprocess.run(
                [
                    str(BIN / "tfgrpc-ab"),
                    *("--pairs", str(pairs), "--dir", str(work / "example")),
                    *("--a", side((), example, options), "--b", side((), example, options)),
                ],
                capture_output=True,
                text=True,
                timeout=pairs * 2 * 900,
            )
            quick = " (quick options)" if args.quick else ""
            say(
                f"example_suites/test_p2p.py, {pairs} pairs{quick}: "
                f"{time.monotonic() - ex_started:.0f} s in all, tfgrpc-ab exit {done.returncode}; "
                f"{done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr}"
            )
            say(
                "# json "
                + json.dumps(
                    {phase: [t.__dict__ for t in found] for phase, found in results.items()},
                    default=str,
                )
            )
        finally:
            neighbour.stop()
            say(f"# load after (neighbour stopped): {uptime()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
