"""Calibrate ``tfgrpc-ab`` on a busy machine, beside the history gate on the same runs.

A CPU-bound neighbour process (one Python busy loop, started here, stopped at the end; it
runs the whole time) shares this machine with every run, as another CI job shares a runner.
Every run is one of ``benchmarks/ab_suite`` (one test: the 1 KiB echo, p50 gated at the default
10 % tolerance), made by ``tfgrpc-ab``'s own run function
(:func:`pytest_tfgrpc.cli.ab.run_side`) and judged by its own comparison
(:func:`~pytest_tfgrpc.report.paired.compare_pairs`, and
:func:`~pytest_tfgrpc.cli.compare.gate_failures` at its default policies): a comparison
"fails" where ``tfgrpc-ab`` would exit 1.

**The comparisons of a trial share its runs.** Each pair of a trial runs, in an order a
seeded coin shuffles, the sides it needs out of:

- ``A`` and ``A'``: the suite unchanged, twice;
- ``x1.2``: the suite with its server slowed (``--tfgrpc-server-delay``) so that the 1 KiB
  p50 is 1.2x A's. A delay adds more than itself beside a busy neighbour (the full run of the
  earlier design sized 76 us as 0.2x A's p50 and its pairs ran at 1.28x), and pairs of whole
  runs are too noisy to size it from, so each delay is probed side by side with a plain
  server, round by round, in ``SIZING_PROCESSES`` fresh processes, and read off a line fitted
  to every delay probed (``Calibration.size``); the trials' own pairs report the ratio they
  got;
- ``x1.1``: slowed so that the p50 is 1.1x A's, sized the same way (only in the first
  ``--long-trials`` trials).

and the trial's comparisons, over the same runs, are:

1. A/A: ``A'`` against ``A`` over ``--pairs`` (5) pairs; a failure is a false failure
   (target: at most 1 of 20 trials);
2. 1.2x: ``x1.2`` against ``A`` over the same pairs; a failure is a detection (target: at
   least 16 of 20);
3. in the first ``--long-trials`` trials, 1.1x: ``x1.1`` against ``A`` over ``--long-pairs``
   (10) pairs, the pairs after the 5th running only ``A`` and ``x1.1`` (moonshot: at least 16
   of 20). A change of 1.1x is not *beyond* a 10 % tolerance about half the time however
   precisely it is measured, so 1.1x is also judged at ``--max-regression 5%``, and A/A at 5 %
   beside it (in every trial, over the ``--pairs`` pairs that run ``A'``).

So a trial's A/A and A/B verdicts share their A runs (they are not independent within a
trial; each rate is still one verdict per trial), and the order within a pair is random, not
tfgrpc-ab's default A-then-B: a pair's runs lie up to 3 runs apart, which if anything widens
the pairs' spread against tfgrpc-ab's back-to-back pairs. The full run's 2 long trials are
what fits its ~25 minutes with the example (330 runs at ~3.9 s beside the neighbour, the
sizing ~1.5 min, the example ~3 min: ~26 min; the script prints its own projection after
sizing); ``--long-trials 6`` runs the earlier design's 6 (~4 min more), ``--long-trials 20`` the
moonshot in full (~16 min more).

Each run measures ~0.7 s of echoes (``RUN_OPTIONS``): under load, A/A pairs of 300-iteration
runs (~0.1 s of echoes) spread by ~28 % (log ratios), of 2000-3000 by ~21 %
(``benchmarks/experiments/ab_noise.py``, ``results/ab_noise_under_load_*.txt``); most of the
spread is the run's, not its rounds', and pytest's start-up (~2 s) costs more than the echoes.

Every comparison is also judged by the history gate (``tfgrpc-compare``'s verdicts), with the
trial's first 5 ``A`` runs as the history and the compared side's last run as the current
run. Those histories were made minutes before, interleaved with the other sides: a real
history is older and has drifted more, so this favours the history gate.

Last, the total time of one ``--pairs``-pair ``tfgrpc-ab`` of ``example_suites/test_p2p.py``
(its default options).

``--quick`` is a smoke run for CI (2 trials of 3 pairs, one of them at 1.1x over 4 pairs,
the example with 3 pairs and few iterations); its figures say nothing about the targets.
Writes ``--out`` (default ``benchmarks/results/ab_calibration.txt``, ``..._quick.txt`` with
``--quick``) as it goes, with the load (``uptime``) before and after. Every run is bounded in
time; the neighbour and every run are stopped whatever happens.

    .venv/bin/python benchmarks/ab_calibration.py            # the full run (~25 min)
    .venv/bin/python benchmarks/ab_calibration.py --quick    # the smoke run (~3 min)
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO

from pytest_tfgrpc.bench.timing import RunSpec
from pytest_tfgrpc.cli.ab import DEFAULT_TURN_S, run_lockstep, run_side
from pytest_tfgrpc.cli.compare import gate_failures
from pytest_tfgrpc.report.compare import Comparison as Verdicts
from pytest_tfgrpc.report.compare import compare_runs
from pytest_tfgrpc.report.junit import Baseline
from pytest_tfgrpc.report.paired import Pair, compare_pairs, pair_value
from pytest_tfgrpc.stats.paired import MIN_PAIRS

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SUITE = HERE / "ab_suite"
BIN = Path(sys.executable).parent
#: A run of the one-test suite: 10 rounds of 200 echoes (~0.7 s of echoes beside the
#: neighbour); the run's start-up (~2 s) costs more than that.
RUN_OPTIONS = ("--tfgrpc-iterations=2000", "--tfgrpc-warmup=100", "--tfgrpc-max-seconds=10")
#: Only the tfgrpc plugin: the environment's other pytest plugins (xdist, benchmark, ...)
#: cost start-up time in every run and measure nothing here.
#: ``-o addopts=``: the project's own ``--dist worksteal`` needs xdist.
PLUGINS = (
    "-o",
    "addopts=",
    *(
        word
        for name in ("cacheprovider", "xdist", "benchmark", "rerunfailures")
        for word in ("-p", f"no:{name}")
    ),
)
RUN_TIMEOUT_S = 120.0
#: The neighbour stops itself after this long, should this script be killed outright.
NEIGHBOUR_LIMIT_S = 3 * 3600
HISTORY = 5
SIZING_RUNS = 4
#: Fresh processes per probed delay (:func:`probe_delay`), each ~6 s beside the neighbour.
SIZING_PROCESSES = 4
#: The probe's run: as a trial's run of the suite measures (RUN_OPTIONS, 10 rounds).
PROBE_RUN = RunSpec(iterations=2000, warmup=100, max_seconds=10.0, warmup_seconds=1.0, rounds=10)
PROBE_TIMEOUT_S = 120.0
#: Trials that also run the 1.1x moonshot (10 pairs): 2 fit the full run in ~25 min beside the
#: neighbour (6 took 29.5 min with the example); each one more costs 15 runs (~1 min).
LONG_TRIALS = 2
STEM = "tfgrpc.p2p_latency.1KiB.p50"


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


def probe_child(delay_us: float) -> int:
    """``--probe-child DELAY``: in this process, a plain tensor server and one delayed by
    ``delay_us``, both started and placed as the ``tensor_server`` fixture starts and places
    one under the default ``--tfgrpc-cpus=auto``, their 1 KiB echo measured side by side
    round by round (:func:`~pytest_tfgrpc.bench.p2p.p2p_latency_pair`, ``PROBE_RUN``);
    prints ``{"ratios": [...]}``, each round's p50 of the delayed server over the plain
    one's."""
    from pytest_tfgrpc.bench.p2p import LatencyCall, p2p_latency_pair
    from pytest_tfgrpc.roles.native_server import start_tensor_server
    from pytest_tfgrpc.tuning.cpus import (
        measuring_cpus,
        pin_server,
        resolve_placement,
        use_placement,
    )
    from pytest_tfgrpc.wire.fabric import resolve_fabric

    use_placement(resolve_placement("auto"))
    fabric = resolve_fabric("lo")
    servers = []
    try:
        for delay_s in (0.0, delay_us / 1e6):
            servers.append(start_tensor_server(fabric, max_tensor_bytes=1024, delay_s=delay_s))
            pin_server(servers[-1].pid)
        with measuring_cpus():
            a, b = p2p_latency_pair((servers[0], servers[1]), [1024], LatencyCall(run=PROBE_RUN))
    finally:
        for server in servers:
            server.stop()
    (pa,), (pb,) = a.sizes, b.sizes
    ratios = [
        y / x for x, y in zip(pa.round_figures()["p50"], pb.round_figures()["p50"], strict=True)
    ]
    print(json.dumps({"ratios": ratios}))
    return 0


def probe_delay(delay_us: float, work: Path) -> float | None:
    """The 1 KiB p50 ratio of a server delayed ``delay_us`` to a plain one, measured side by
    side in a fresh process (:func:`probe_child`): the median of its rounds' ratios; None
    where the probe broke (its output kept in ``work``)."""
    log = work / f"probe-{delay_us:.0f}us-{time.monotonic_ns()}.log"
    try:
        done = subprocess.run(
            [sys.executable, __file__, "--probe-child", f"{delay_us:.0f}"],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None
    log.write_text(done.stdout + done.stderr)
    try:
        ratios = json.loads(done.stdout.strip().splitlines()[-1])["ratios"]
    except (IndexError, KeyError, ValueError):
        return None
    return math.exp(statistics.median(math.log(r) for r in ratios)) if ratios else None


def excess_line(probed: Mapping[float, float]) -> tuple[float, float] | None:
    """The least-squares line ``r - 1 = intercept + slope * delay_us`` through the probed
    ``{delay_us: ratio}`` (a line through the origin for one delay); None for none."""
    if not probed:
        return None
    xs, ys = list(probed), [r - 1.0 for r in probed.values()]
    if len(xs) == 1 or max(xs) == min(xs):
        return 0.0, statistics.mean(ys) / statistics.mean(xs)
    slope, intercept = statistics.linear_regression(xs, ys)
    return intercept, slope


def delay_for(fit: tuple[float, float], ratio: float) -> float:
    """The delay (us) the fitted line gives ``ratio``; never below 1 us."""
    intercept, slope = fit
    if slope <= 0:
        return 1.0
    return max(1.0, (ratio - 1.0 - intercept) / slope)


def side(
    extra: Sequence[str] = (), suite: Path = SUITE, options: Sequence[str] = RUN_OPTIONS
) -> list[str]:
    return [str(BIN / "pytest"), *PLUGINS, "-q", str(suite), *options, *extra]


@dataclass(frozen=True)
class Comparison:
    """One comparison of a trial: what it compares, and how."""

    name: str
    side: str
    pairs: int
    tolerance: float
    expect_fail: bool


def comparisons(pairs: int, long_pairs: int) -> tuple[Comparison, ...]:
    """A trial's comparisons; with ``long_pairs`` (else 0) also those at 1.1x."""
    short = (
        Comparison(f"A/A/{pairs} pairs", "A'", pairs, 0.10, False),
        Comparison(f"1.2x/{pairs} pairs", "x1.2", pairs, 0.10, True),
        Comparison(f"A/A/{pairs} pairs at 5%", "A'", pairs, 0.05, False),
    )
    if not long_pairs:
        return short
    return (
        *short,
        Comparison(f"1.1x/{long_pairs} pairs", "x1.1", long_pairs, 0.10, True),
        Comparison(f"1.1x/{long_pairs} pairs at 5%", "x1.1", long_pairs, 0.05, True),
    )


@dataclass(frozen=True)
class Judged:
    """One comparison of one trial: tfgrpc-ab's verdict and the history gate's."""

    comparison: str
    trial: int
    pairs: int
    ab_failed: bool
    ab_verdict: str
    ab_change: float
    ab_detectable: float
    history_failed: bool
    history_verdict: str
    history_change: float
    history_detectable: float

    def line(self) -> str:
        def pct(x: float) -> str:
            return f"{x:+.1%}" if math.isfinite(x) else "n/a"

        return (
            f"trial {self.trial:2d} {self.comparison:<22} {self.pairs:2d} pairs: tfgrpc-ab "
            f"{'FAIL' if self.ab_failed else 'pass'} {self.ab_verdict:<12} change "
            f"{pct(self.ab_change):>7} detectable >={pct(self.ab_detectable):>7} | history gate "
            f"{'FAIL' if self.history_failed else 'pass'} {self.history_verdict:<12} change "
            f"{pct(self.history_change):>7} detectable >={pct(self.history_detectable):>7}"
        )


Runs = dict[str, list[Baseline | None]]
#: A verdict as this script reports it: failed (tfgrpc-ab would exit 1, the gate fail the
#: run), the p50's outcome, change and detectable change.
Found = tuple[bool, str, float, float]


def _p50(verdicts: Verdicts) -> Found:
    failures = gate_failures(verdicts, missing="fail", inconclusive="pass", mismatch="warn")
    failed = bool(verdicts.regressions or failures)
    for v in verdicts.verdicts:
        if v.metric == "p50":
            return failed, v.outcome.value, v.change, v.threshold
    return failed, "none", math.nan, math.nan


def judge(comparison: Comparison, trial: int, runs: Runs, history: Sequence[Baseline]) -> Judged:
    """``comparison`` over a trial's ``runs`` (per side, per pair; None where the run broke)
    and its ``history`` (the first 5 A runs): tfgrpc-ab's verdict, as its ``main`` reaches
    it, and the history gate's on the compared side's last run."""
    tolerances = {"*": comparison.tolerance}
    compared = runs[comparison.side][: comparison.pairs]
    both = [
        Pair(a, b)
        for a, b in zip(runs.get(partner(comparison.side), runs["A"]), compared, strict=False)
        if a is not None and b is not None
    ]
    ab: Found = (False, "too few pairs", math.nan, math.nan)
    if len(both) >= MIN_PAIRS:
        ab = _p50(compare_pairs(both, tolerances))
    current = [r for r in compared if r is not None]
    gate: Found = (False, "no history", math.nan, math.nan)
    if len(history) >= 2 and current:
        gate = _p50(compare_runs(list(history), current[-1], tolerances))
    return Judged(comparison.name, trial, len(both), *ab, *gate)


def partner(label: str) -> str:
    """Under ``--interleave rounds``, the key of the A runs that ran in lockstep with
    ``label``'s (each compared side gets its own A runs)."""
    return f"A|{label}"


def run_value(run: Baseline | None) -> float | None:
    """A run's 1 KiB p50 (ns) as tfgrpc-ab takes it (the median of its rounds)."""
    for m in run.measurements.values() if run is not None else ():
        return pair_value(m, "p50")
    return None


def summary(comparison: Comparison, found: Sequence[Judged]) -> str:
    word = "caught" if comparison.expect_fail else "failed (false failures)"
    ab = sum(j.ab_failed for j in found)
    history = sum(j.history_failed for j in found)
    median = statistics.median

    def pct(get: Callable[[Judged], float]) -> str:
        xs = [get(j) for j in found if math.isfinite(get(j))]
        return f"{median(xs):+.1%}" if xs else "n/a"

    short = sum(j.pairs < comparison.pairs for j in found)
    return (
        f"{comparison.name} (tolerance {comparison.tolerance:.0%}): tfgrpc-ab {word} {ab} of "
        f"{len(found)} ({short} trials with broken pairs); history gate {word} {history} of "
        f"{len(found)}; median measured change {pct(lambda j: j.ab_change)}, median detectable: "
        f"tfgrpc-ab >={pct(lambda j: j.ab_detectable)}, "
        f"history >={pct(lambda j: j.history_detectable)}"
    )


class Calibration:
    """The runs of one calibration and what it says, in ``work``; every line said goes to
    ``out`` and stdout."""

    def __init__(
        self,
        work: Path,
        out: TextIO,
        seed: int,
        interleave: str = "runs",
        fixed_delays: Mapping[str, str] | None = None,
    ) -> None:
        self.work, self.out, self.interleave = work, out, interleave
        self.fixed_delays = dict(fixed_delays or {})
        self.coin = random.Random(seed)
        self.walls: list[float] = []
        self.commands: dict[str, list[str]] = {"A": side(), "A'": side()}
        #: Per side: the log ratio to A of every pair that has both.
        self.ratios: dict[str, list[float]] = {}

    def say(self, line: str) -> None:
        print(line, file=self.out, flush=True)
        print(line, flush=True)

    def run(self, label: str, stem: str) -> Baseline | None:
        started = time.monotonic()
        xml, log = self.work / f"{stem}.xml", self.work / f"{stem}.log"
        got, why = run_side(self.commands[label], xml, log, RUN_TIMEOUT_S)
        self.walls.append(time.monotonic() - started)
        if got is None:
            self.say(f"# run {stem} ({label}) broke: {why}")
        return got

    def lockstep(self, label: str, stem: str) -> tuple[Baseline | None, Baseline | None]:
        """A and ``label`` at once, their rounds in lockstep (tfgrpc-ab --interleave rounds)."""
        started = time.monotonic()
        stems = {"A": self.work / f"{stem}-A", "B": self.work / f"{stem}-{label}".replace("'", "2")}
        commands = {"A": self.commands["A"], "B": self.commands[label]}
        answers, _ = run_lockstep(commands, stems, RUN_TIMEOUT_S, DEFAULT_TURN_S)
        self.walls.append(time.monotonic() - started)
        for side, (got, why) in answers.items():
            if got is None:
                self.say(f"# run {stems[side].name} ({'A' if side == 'A' else label}) broke: {why}")
        return answers["A"][0], answers["B"][0]

    def size(self, ratios: Sequence[float], processes: int) -> bool:
        """Give each slowed side (``x1.2``, ...) its server delay (``--tfgrpc-server-delay``).

        A delay adds more than itself to an echo (the spin shares the server's CPU with the
        neighbour; the earlier design's full run sized 76 us for 1.2x as ``0.2 x p50`` and its
        pairs ran at 1.28x), and pairs of whole runs are too noisy to size it from (a pair's
        log ratio spreads ~21 %: 4 probe pairs have a standard error of ~10 %). So each delay
        is probed in ``processes`` fresh processes, each measuring a plain server and the
        delayed one side by side round by round (:func:`probe_delay`: both in the same
        scheduler modes); the excess ratio ``r - 1`` is fitted as a line in the delay (least
        squares over every delay probed), first at ``0.2`` and ``0.1`` times the median p50
        of ``SIZING_RUNS`` unchanged runs, then once more at the fitted delay of the first
        ratio (kept within half the shortest and 1.5x the longest delay probed), and each
        delay read off the fit over all probes. The trials' own pairs report the ratio they
        got."""
        sized = [self.run("A", f"sizing-{i}") for i in range(SIZING_RUNS)]
        values = [v for v in map(run_value, sized) if v is not None]
        if not values:
            self.say("# no sizing run measured a p50: cannot size the slowdowns")
            return False
        p50_us = statistics.median(values) / 1e3
        if self.fixed_delays:
            missing = [f"x{r}" for r in ratios if f"x{r}" not in self.fixed_delays]
            if missing:
                self.say(f"# --delay given for some sides only: none for {', '.join(missing)}")
                return False
            for label, delay in self.fixed_delays.items():
                self.commands[label] = side((f"--tfgrpc-server-delay={delay}",))
            self.say(
                f"# sizing: median 1 KiB p50 of {len(values)} unchanged runs {p50_us:.1f} us; "
                "delays given (--delay), not probed: "
                + ", ".join(
                    f"{label}'s server delayed {d}" for label, d in self.fixed_delays.items()
                )
            )
            return True
        probed: dict[float, float] = {}

        def probe(delay_us: float) -> None:
            got = [probe_delay(delay_us, self.work) for _ in range(processes)]
            logs = [math.log(r) for r in got if r is not None]
            if logs:
                probed[delay_us] = math.exp(statistics.mean(logs))
                spread = statistics.stdev(logs) if len(logs) > 1 else math.nan
                self.say(
                    f"# sizing probe: server delayed {delay_us:.0f}us measured "
                    f"{probed[delay_us]:.3f}x side by side ({len(logs)} processes, sd of their "
                    f"log ratios {spread:.1%})"
                )

        for ratio in (1.2, 1.1):
            probe(round((ratio - 1.0) * p50_us))
        fit = excess_line(probed)
        if fit is None:
            self.say("# the sizing probes measured nothing usable: cannot size the slowdowns")
            return False
        # A noisy first fit may give a delay far off (or none): the second probe stays between
        # half the shortest and 1.5x the longest delay probed.
        probe(min(max(delay_for(fit, ratios[0]), min(probed) / 2), max(probed) * 1.5))
        fit = excess_line(probed) or fit
        delays = {f"x{r}": f"{delay_for(fit, r):.0f}us" for r in ratios}
        for label, delay in delays.items():
            self.commands[label] = side((f"--tfgrpc-server-delay={delay}",))
        intercept, slope = fit
        self.say(
            f"# sizing: median 1 KiB p50 of {len(values)} unchanged runs {p50_us:.1f} us; "
            f"excess ratio fitted over {len(probed)} probed delays: {intercept:+.3f} "
            f"{slope * 1e3:+.3f} per ms of delay; "
            + ", ".join(f"{label}'s server delayed {d}" for label, d in delays.items())
            + " (--tfgrpc-server-delay)"
        )
        return True

    def trial(self, index: int, plan: Sequence[Comparison]) -> list[Judged]:
        """One trial: as many pairs as ``plan`` needs, each pair's sides in a shuffled order,
        then every comparison of ``plan`` over them."""
        runs: Runs = {label: [] for label in self.commands}
        if self.interleave == "rounds":
            runs |= {partner(label): [] for label in self.commands if label != "A"}
        for pair in range(1, max(c.pairs for c in plan) + 1):
            sides = ["A", *dict.fromkeys(c.side for c in plan if pair <= c.pairs)]
            self.coin.shuffle(sides)
            got: dict[str, Baseline | None] = {}
            if self.interleave == "rounds":
                for s in sides:
                    if s != "A":
                        stem = f"t{index}-p{pair}-{s}".replace("'", "2")
                        got[partner(s)], got[s] = self.lockstep(s, stem)
                got["A"] = got.get(partner("A'"))
            else:
                got = {s: self.run(s, f"t{index}-p{pair}-{s}".replace("'", "2")) for s in sides}
            for label, made in runs.items():
                made.append(got.get(label))
        for label, made in runs.items():
            if label.startswith("A|"):
                continue
            for a, b in zip(runs.get(partner(label), runs["A"]), made, strict=True):
                va, vb = run_value(a), run_value(b)
                if label != "A" and va and vb:
                    self.ratios.setdefault(label, []).append(math.log(vb / va))
        history = [r for r in runs["A"][:HISTORY] if r is not None]
        return [judge(c, index, runs, history) for c in plan]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run for CI")
    parser.add_argument("--trials", type=int, default=None, help="trials (20)")
    parser.add_argument("--pairs", type=int, default=None, help="pairs of A/A and 1.2x (5)")
    parser.add_argument("--long-trials", type=int, default=None, help="trials at 1.1x (6)")
    parser.add_argument("--long-pairs", type=int, default=None, help="pairs at 1.1x (10)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the order within pairs")
    parser.add_argument(
        "--interleave",
        choices=("runs", "rounds"),
        default="runs",
        help="runs: a pair's sides one after the other; rounds: each compared side at once "
        "with an A run of its own, rounds in lockstep (tfgrpc-ab --interleave rounds)",
    )
    parser.add_argument(
        "--delay",
        action="append",
        default=[],
        metavar="LABEL=DELAY",
        help="give a slowed side its server delay instead of probing for it (x1.2=52us); the "
        "trials' pairs still report the ratio they got",
    )
    parser.add_argument("--no-example", action="store_true", help="skip the example's timing")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--probe-child", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    fixed_delays = dict(given.partition("=")[::2] for given in args.delay)
    for label, delay in fixed_delays.items():
        if label not in ("x1.2", "x1.1") or not delay:
            parser.error(f"--delay {label}={delay}: LABEL is x1.2 or x1.1, DELAY as 52us")
    if args.probe_child is not None:
        return probe_child(args.probe_child)
    trials = args.trials or (2 if args.quick else 20)
    pairs = args.pairs or (3 if args.quick else 5)
    long_trials = min(trials, LONG_TRIALS if args.long_trials is None else args.long_trials)
    long_pairs = max(pairs, args.long_pairs or (4 if args.quick else 10))
    if args.quick and args.long_trials is None:
        long_trials = 1
    name = "ab_calibration_quick.txt" if args.quick else "ab_calibration.txt"
    out_path = args.out or HERE / "results" / name
    out_path.parent.mkdir(parents=True, exist_ok=True)
    neighbour = Neighbour()
    with open(out_path, "w") as out, tempfile.TemporaryDirectory(prefix="tfgrpc-ab-cal-") as tmp:
        cal = Calibration(Path(tmp), out, args.seed, args.interleave, fixed_delays)
        say = cal.say
        try:
            say(f"# benchmarks/ab_calibration.py {' '.join(argv or sys.argv[1:])}".rstrip())
            say(f"# load before (neighbour just started): {uptime()}")
            say(f"# neighbour: one CPU-bound Python loop, pid {neighbour.proc.pid}, all along")
            say(f"# suite: {SUITE.relative_to(ROOT)} with {' '.join((*PLUGINS, *RUN_OPTIONS))}")
            say(
                f"# {trials} trials of {pairs} pairs (A, A', x1.2); the first {long_trials} "
                f"also run x1.1, over {long_pairs} pairs (A, x1.1 in pairs {pairs + 1}-"
                f"{long_pairs}); the A/A and A/B comparisons of a trial share its A runs, and "
                "each pair's sides run in a seeded random order"
                + (
                    "; --interleave rounds: each compared side runs at once with an A run of "
                    "its own, rounds in lockstep (the A/A pairs' A runs are the history)"
                    if args.interleave == "rounds"
                    else ""
                )
            )
            started = time.monotonic()
            if not cal.size(
                (1.2, 1.1) if long_trials else (1.2,), SIZING_PROCESSES if not args.quick else 2
            ):
                return 2
            planned = trials * pairs * 3 + long_trials * (pairs + 2 * (long_pairs - pairs))
            wall = statistics.median(cal.walls)
            say(
                f"# planned: {planned} runs; at the sizing runs' median {wall:.1f} s a run, "
                f"~{planned * wall / 60:.0f} min"
            )
            found: dict[str, tuple[Comparison, list[Judged]]] = {}
            for index in range(1, trials + 1):
                plan = comparisons(pairs, long_pairs if index <= long_trials else 0)
                for comparison, judged in zip(plan, cal.trial(index, plan), strict=True):
                    found.setdefault(comparison.name, (comparison, []))[1].append(judged)
                    say(judged.line())
                say(f"# {index} trials done, {time.monotonic() - started:.0f} s")
            say(
                f"# trials took {time.monotonic() - started:.0f} s, {len(cal.walls)} runs, "
                f"median run {statistics.median(cal.walls):.1f} s (start-up included)"
            )
            for label, logs in cal.ratios.items():
                if len(logs) > 1:
                    say(
                        f"# {label} against A, all pairs of all trials: median ratio "
                        f"{math.exp(statistics.median(logs)):.3f}, sd of the pairs' log ratios "
                        f"{statistics.stdev(logs):.1%} ({len(logs)} pairs)"
                    )
            for comparison, verdicts in found.values():
                say(summary(comparison, verdicts))
            if not args.no_example:
                say(example(args.quick, pairs, cal.work))
            say("# json " + json.dumps({k: [asdict(j) for j in v] for k, (_, v) in found.items()}))
        finally:
            neighbour.stop()
            say(f"# load after (neighbour stopped): {uptime()}")
    return 0


def example(quick: bool, pairs: int, work: Path) -> str:
    """One ``pairs``-pair tfgrpc-ab of example_suites/test_p2p.py, timed."""
    suite = ROOT / "example_suites" / "test_p2p.py"
    options = ("--tfgrpc-iterations=30", "--tfgrpc-warmup=3") if quick else ()
    command = shlex.join(side((), suite, options))
    started = time.monotonic()
    done = subprocess.run(
        [
            *(str(BIN / "tfgrpc-ab"), "--pairs", str(pairs), "--dir", str(work / "example")),
            *("--a", command, "--b", command),
        ],
        capture_output=True,
        text=True,
        timeout=pairs * 2 * 900,
    )
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr
    quick_note = " (quick options)" if quick else ""
    return (
        f"example_suites/test_p2p.py, {pairs} pairs{quick_note}: "
        f"{time.monotonic() - started:.0f} s in all, tfgrpc-ab exit {done.returncode}; {last}"
    )


if __name__ == "__main__":
    sys.exit(main())
