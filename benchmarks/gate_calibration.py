"""Calibrate the baseline gate: how often it fails unchanged code, how often it catches a
real slowdown (the two figures the gate is accepted on).

Runs the small suite in ``benchmarks/gate_suite`` (1 KiB and 64 KiB echo latency, 1 MiB push
bandwidth) again and again, back to back, at the default gate settings, each run against a
fresh ``tfgrpc-server`` on loopback (named to the suite by a cluster spec, pinned as the
plugin pins the servers it starts):

1. ``--runs`` (20) runs with no change; run i is gated against runs 1..i-1 (all earlier ones).
   A failing run is a false failure.
2. ``--runs`` runs with ``tfgrpc-server --delay`` chosen so that the 1 KiB echo's p50 is
   ``--slowdown`` (1.5x) the unchanged runs' (the delay is calibrated once, then checked);
   each is gated against the unchanged runs. A failing run is a detection.
3. ``--history-runs`` (10) runs slowed by ``--small-slowdown`` (1.2x), each gated against a
   history of only the last ``--history`` (5) unchanged runs.

Prints the rates and the machine's load (``uptime``) before and after, and writes them to
``--out`` (default ``benchmarks/results/gate_calibration.txt``). Every pytest run and the
server are bounded in time; the server is stopped whatever happens.

    .venv/bin/python benchmarks/gate_calibration.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUITE = HERE / "gate_suite"
BIN = Path(sys.executable).parent
RUN_TIMEOUT_S = 300.0
#: The code of a run that ended without a gate verdict (exit status other than 0 or 1).
BROKEN = -2


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


#: ``--tfgrpc-cpus`` of every run (``--cpus``): ``auto`` (the default) or ``off``.
CPUS = {"placement": "auto"}


def server_cpus() -> list[str]:
    """``--cpus`` for the suite's server: the server side of the placement the runs measure
    under (``--tfgrpc-cpus``), as the tensor_server fixture would pin a server it started
    itself; nothing under ``off``."""
    from pytest_tfgrpc.tuning.cpus import format_cpu_list, resolve_placement

    placement = resolve_placement(CPUS["placement"])
    return [] if placement is None else ["--cpus", format_cpu_list(placement.server)]


class Server:
    """``tfgrpc-server`` on loopback with a per-call delay, and a cluster spec naming it."""

    def __init__(self, delay_us: float, workdir: Path) -> None:
        self.proc = subprocess.Popen(
            [
                str(BIN / "tfgrpc-server"),
                "--fabric",
                "lo",
                "--delay",
                f"{delay_us:.0f}us",
                *server_cpus(),
                "--exit-on-stdin-eof",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.stop()
            raise RuntimeError("tfgrpc-server did not start")
        self.target = json.loads(line)["target"]
        self.spec = workdir / f"cluster-{self.proc.pid}.json"
        self.spec.write_text(json.dumps({"cluster": {"ps": [self.target]}}))

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def run_suite(server: Server, junit: Path, baselines: list[Path]) -> tuple[int, str]:
    """One pytest run of the suite at default gate settings; (exit code, gate lines)."""
    command = [
        str(BIN / "pytest"),
        "-q",
        "-p",
        "no:cacheprovider",
        f"--tfgrpc-cpus={CPUS['placement']}",
        "--tfgrpc-cluster",
        str(server.spec),
        "--junitxml",
        str(junit),
        *(f"--tfgrpc-baseline={path}" for path in baselines),
        str(SUITE),
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False, cwd=HERE
    )
    notes = [
        line
        for line in done.stdout.splitlines()
        if line.startswith(("regression:", "invalid:", "FAILED", "not compared", "inconclusive"))
    ]
    if done.returncode not in (0, 1):
        notes.append(f"exit {done.returncode}: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done.returncode, "\n".join(notes)


def p50_1kib(junit: Path) -> float:
    """The 1 KiB echo's p50 (ns) from a run's JUnit file."""
    from pytest_tfgrpc.report.junit import load_baseline

    for key, measurement in load_baseline(junit).measurements.items():
        if key.label == "p2p_latency" and key.size == "1KiB":
            return measurement.figures["p50"]
    raise RuntimeError(f"{junit} has no 1 KiB echo")


def phase(
    name: str,
    runs: int,
    delay_us: float,
    workdir: Path,
    baselines_for: object,
    log: list[str],
) -> tuple[list[Path], list[int], list[float]]:
    """``runs`` runs with ``delay_us``, each against a server of its own (as a CI job starts
    its servers afresh); ``baselines_for(i, files)`` names run i's baselines."""
    files: list[Path] = []
    codes: list[int] = []
    p50s: list[float] = []
    for i in range(runs):
        junit = workdir / f"{name}-{i + 1:03d}.xml"
        baselines = baselines_for(i, files)  # type: ignore[operator]
        server = Server(delay_us, workdir)
        try:
            code, notes = run_suite(server, junit, baselines)
        finally:
            server.stop()
        if code not in (0, 1) or not junit.exists():
            # Not a verdict of the gate: said, kept out of the baselines and the rates.
            line = f"{name} {i + 1:2d}: BROKEN    (exit {code}; not counted)"
            print(line, flush=True)
            log.append(line)
            log.extend("    " + note for note in notes.splitlines())
            codes.append(BROKEN)
            continue
        files.append(junit)
        codes.append(code if baselines else -1)
        p50s.append(p50_1kib(junit))
        verdict = "not gated" if not baselines else "FAIL" if code else "pass"
        line = (
            f"{name} {i + 1:2d}: {verdict:9s} (baseline runs: {len(baselines)}; "
            f"1KiB p50 {p50s[-1] / 1e3:.0f} us)"
        )
        print(line, flush=True)
        log.append(line)
        if code and notes:
            log.extend("    " + note for note in notes.splitlines())
    return files, codes, p50s


def _trial_ratio(
    delay_us: float, base_p50: float, workdir: Path, name: str, runs: int = 3
) -> float:
    """The 1 KiB p50 with ``delay_us`` over ``base_p50`` (the unchanged runs'): the median of
    ``runs`` runs against one server, as the phases run (a trial paired with a fresh
    undelayed server instead overshot: its first runs are slower than the phase's)."""
    server = Server(delay_us, workdir)
    try:
        p50s = []
        for run in range(runs):
            junit = workdir / f"{name}-{run}.xml"
            run_suite(server, junit, [])
            p50s.append(p50_1kib(junit))
    finally:
        server.stop()
    return statistics.median(p50s) / base_p50


def calibrate_delay(target_ratio: float, base_p50: float, workdir: Path) -> tuple[float, float]:
    """The server delay (us) that makes the 1 KiB p50 ``target_ratio`` times ``base_p50``
    (the unchanged runs' median), and the ratio trials measured with it: from a first guess
    (the difference to ``base_p50``), up to four trials (each the median of three runs)
    each correcting the delay in proportion; the tried delay nearest the target is
    returned, never an untried one."""
    want = (target_ratio - 1.0) * base_p50 / 1e3  # us to add
    delay, tried = want, []
    for trial in range(4):
        ratio = _trial_ratio(delay, base_p50, workdir, f"trial-{target_ratio}-{trial}")
        tried.append((abs(ratio - target_ratio), delay, ratio))
        if abs(ratio - target_ratio) < 0.02:
            break
        added = (ratio - 1.0) * base_p50 / 1e3  # us the delay actually added
        delay = delay * want / added if added > 0 else delay * 2
    _, delay, ratio = min(tried)
    return delay, ratio


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--slowdown", type=float, default=1.5)
    parser.add_argument("--small-slowdown", type=float, default=1.2)
    parser.add_argument("--history", type=int, default=5)
    parser.add_argument("--history-runs", type=int, default=10)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "gate_calibration.txt")
    parser.add_argument("--keep", type=Path, help="keep every run's JUnit file in this directory")
    parser.add_argument(
        "--cpus",
        choices=("auto", "off"),
        default="auto",
        help="--tfgrpc-cpus of every run, and the server pinned to match (default: auto)",
    )
    args = parser.parse_args()
    for name in ("runs", "history", "history_runs"):
        if getattr(args, name) < 2:
            parser.error(f"--{name.replace('_', '-')} must be at least 2")
    if not (args.slowdown > 1 and args.small_slowdown > 1):
        parser.error("slowdowns are ratios above 1")
    CPUS["placement"] = args.cpus
    log = [f"gate calibration, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"]
    log.append(f"load before: {uptime()}")
    log.append(
        f"cpus: {os.cpu_count()}; suite: {SUITE.relative_to(HERE.parent)}; "
        f"server {' '.join(server_cpus()) or 'unpinned'} (client: --tfgrpc-cpus={args.cpus})"
    )
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tfgrpc-calib-") as tmp:
        workdir = Path(tmp)
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            workdir = args.keep
        unchanged, codes, p50s = phase(
            "unchanged", args.runs, 0, workdir, lambda i, files: list(files), log
        )
        gated = [c for c in codes if c >= 0]
        false_failures = sum(1 for c in gated if c != 0)
        base = statistics.median(p50s)
        delay, trial = calibrate_delay(args.slowdown, base, workdir)
        log.append(
            f"delay for {args.slowdown}x: {delay:.0f} us (trial: 1KiB p50 ratio {trial:.2f})"
        )
        _, slow_codes, slow_p50s = phase(
            "slowed", args.runs, delay, workdir, lambda i, files: list(unchanged), log
        )
        broken = codes.count(BROKEN) + slow_codes.count(BROKEN)
        slow_codes = [c for c in slow_codes if c != BROKEN]
        detected = sum(1 for c in slow_codes if c != 0)
        # Against what the gate compares these runs with: the history's level, which may have
        # moved since the first unchanged runs.
        history_base = statistics.median(p50s[-args.history :])
        small_delay, small_trial = calibrate_delay(args.small_slowdown, history_base, workdir)
        log.append(
            f"delay for {args.small_slowdown}x: {small_delay:.0f} us "
            f"(trial: 1KiB p50 ratio {small_trial:.2f})"
        )
        history = unchanged[-args.history :]
        _, small_codes, small_p50s = phase(
            "small", args.history_runs, small_delay, workdir, lambda i, files: list(history), log
        )
        broken += small_codes.count(BROKEN)
        small_codes = [c for c in small_codes if c != BROKEN]
        small_detected = sum(1 for c in small_codes if c != 0)
    minutes = (time.monotonic() - started) / 60
    achieved = statistics.median(slow_p50s) / base
    small_achieved = statistics.median(small_p50s) / history_base
    summary = [
        f"false failures: {false_failures} of {len(gated)} gated unchanged runs "
        f"(run 1 has no baseline; target <= 1 of 20)",
        f"detected {args.slowdown}x (achieved {achieved:.2f}x over the unchanged runs' 1KiB "
        f"p50): {detected} of "
        f"{len(slow_codes)} runs, against {len(unchanged)} unchanged runs (target >= 19 of 20)",
        f"detected {args.small_slowdown}x (achieved {small_achieved:.2f}x over the history's "
        f"1KiB p50) with a history of "
        f"{len(history)} runs: {small_detected} of {len(small_codes)} "
        f"(target >= 80%)",
        f"broken runs (ended without a verdict, not counted above): {broken}",
        f"total {minutes:.1f} min",
        f"load after: {uptime()}",
    ]
    log += summary
    for line in summary:
        print(line)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(log) + "\n")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
