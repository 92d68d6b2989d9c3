"""``tfgrpc-ab --pairs N --a "COMMAND" --b "COMMAND"``: B against A, side by side in one job.

Runs two pytest command lines (two virtual environments, two grpcio versions, two servers)
as A B A B ... (``--order random``: a seeded coin decides which side of each pair goes
first), each writing its own JUnit XML (the tool adds ``--junitxml``), then tests every figure
of B against A across the pairs (:func:`pytest_tfgrpc.report.paired.compare_pairs`): what
drifts on a shared machine between pairs hits both sides of a pair alike.

Prints the gate's table and exits as ``tfgrpc-compare`` does: 0 nothing regressed, 1 a
regression (or what ``--inconclusive fail``, ``--mismatch fail``, ``--missing fail`` make
fail), 2 bad input (a bad option, too few usable pairs: one or two are still written to the
outputs) or an interrupted run. Every run is
bounded by ``--timeout``; a run that times out, crashes or writes no usable JUnit breaks its
pair, which is counted, named and left out. Ctrl-C stops the running side and reports the
pairs measured so far; SIGTERM (a CI timeout, a cancelled job) and SIGHUP (a closed terminal)
do the same.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from pytest_tfgrpc.cli.arguments import bounded
from pytest_tfgrpc.cli.compare import (
    EXIT_BAD_INPUT,
    EXIT_OK,
    EXIT_REGRESSION,
    add_gate_options,
    gate_failures,
    parse_gate_command,
)
from pytest_tfgrpc.report.ab_outputs import AbRun, write_html, write_junit, write_results
from pytest_tfgrpc.report.compare import Comparison, format_comparison
from pytest_tfgrpc.report.junit import Baseline, BaselineError, NoFigures, load_baseline
from pytest_tfgrpc.report.paired import Pair, blind_pairs_warnings, compare_pairs
from pytest_tfgrpc.runlock import MeasurementLock, lock_path, lock_wait_s
from pytest_tfgrpc.stats.paired import MIN_PAIRS
from pytest_tfgrpc.turns import ENV_PATH, ENV_SIDE, ENV_TIMEOUT, Turn, Turnstile
from pytest_tfgrpc.units import counted

__all__ = ["Broken", "main", "run_lockstep", "run_side", "write_turns"]

PROG = "tfgrpc-ab"
#: pytest's exit codes that still leave a usable JUnit file: all passed, some failed.
_USABLE_EXITS = (0, 1)
#: How long a side stopped by Ctrl-C or its timeout may take to write its JUnit and exit.
STOP_GRACE_S = 20.0
DEFAULT_TIMEOUT_S = 1800.0
DEFAULT_TURN_S = 120.0
#: Signals that stop tfgrpc-ab as Ctrl-C does. Each side runs in a session of its own (so that
#: its whole process group can be stopped), which no signal to tfgrpc-ab reaches: left at their
#: default, these would end tfgrpc-ab at once and leave the running side measuring on.
_ENDING = (signal.SIGTERM, signal.SIGHUP)
_SIGNAL_NAMES = frozenset(signal.Signals(s).name for s in _ENDING)


@dataclass(frozen=True)
class Broken:
    """A pair left out of the comparison: which pair, which side and why."""

    pair: int
    side: str
    why: str

    def describe(self) -> str:
        return f"pair {self.pair}: side {self.side} {self.why}"


@dataclass(frozen=True)
class _Side:
    name: str
    argv: tuple[str, ...]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "Run two pytest command lines in turn, A B A B ..., and test every tfgrpc figure "
            "of B against A across the pairs (paired t-test on the pairs' log ratios, with a "
            "Wilcoxon signed-rank check): the gate of tfgrpc-compare, for a noisy machine."
        ),
        epilog="exit status: 0 no regression, 1 regression (or a failing policy), "
        "2 bad input, too few usable pairs, or interrupted",
    )
    parser.add_argument(
        "--pairs",
        type=bounded(int, lambda n: n >= 1, "a whole number >= 1"),
        required=True,
        help="pairs of runs",
    )
    parser.add_argument("--a", required=True, metavar="COMMAND", help="side A: a pytest command")
    parser.add_argument("--b", required=True, metavar="COMMAND", help="side B: a pytest command")
    parser.add_argument(
        "--order",
        choices=("alternate", "random"),
        default="alternate",
        help="A before B in every pair (alternate, default), or a seeded coin per pair",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of --order random (default 0)")
    parser.add_argument(
        "--interleave",
        choices=("runs", "rounds"),
        default="runs",
        help="runs: a pair's sides run one after the other (default); rounds: both start "
        "together and their measured rounds take turns A, B, A, B (lockstep, one turn "
        "bounded by --turn-timeout)",
    )
    parser.add_argument(
        "--turn-timeout",
        type=bounded(float, lambda s: s > 0, "a number of seconds > 0"),
        default=DEFAULT_TURN_S,
        metavar="S",
        help=f"with --interleave rounds: longest a side may hold or owe its turn, in seconds "
        f"(default {DEFAULT_TURN_S:g}); past it that side leaves lockstep and the other runs free",
    )
    parser.add_argument(
        "--timeout",
        type=bounded(float, lambda s: s > 0, "a number of seconds > 0"),
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help=f"longest one run may take, in seconds (default {DEFAULT_TIMEOUT_S:g}): a run "
        "past it is stopped and breaks its pair",
    )
    parser.add_argument(
        "--dir",
        default="tfgrpc-ab",
        metavar="DIR",
        help="where each run's JUnit XML and output go (default ./tfgrpc-ab): a-01.xml, "
        "a-01.log, b-01.xml, ...; one tfgrpc-ab at a time (a second one given the same "
        "directory stops at start)",
    )
    add_gate_options(parser)
    parser.add_argument(
        "--junitxml", "--junit-xml", metavar="FILE", help="write the verdicts as JUnit XML"
    )
    parser.add_argument(
        "--results", metavar="FILE", help="append the verdicts to a results file (JSON lines)"
    )
    parser.add_argument("--html", metavar="FILE", help="write an HTML report of the verdicts")
    return parser


def _order(pairs: int, how: str, seed: int) -> list[tuple[str, str]]:
    """Which side runs first in each pair."""
    if how == "alternate":
        return [("A", "B")] * pairs
    coin = random.Random(seed)
    return [("A", "B") if coin.random() < 0.5 else ("B", "A") for _ in range(pairs)]


def _stop(process: subprocess.Popen[bytes], first: int) -> None:
    """Stop a side's whole process group: ``first`` (SIGINT lets pytest write its JUnit),
    then SIGKILL after :data:`STOP_GRACE_S`."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, first)
    try:
        process.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    # Anything of the group still alive (a server the side started) goes too.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def _start(
    command: Sequence[str], junit: Path, log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes] | str:
    junit.unlink(missing_ok=True)
    argv = [*command, f"--junitxml={junit}"]
    with open(log, "wb") as output:
        try:
            return subprocess.Popen(
                argv, stdout=output, stderr=subprocess.STDOUT, start_new_session=True, env=env
            )
        except OSError as error:
            return f"could not start {argv[0]!r}: {error.strerror or error}"


#: What pytest's exit statuses other than 0 and 1 mean (pytest.ExitCode).
_PYTEST_EXITS = {
    2: "pytest: interrupted, or errors while collecting",
    3: "pytest: internal error",
    4: "pytest: usage error",
    5: "pytest: no tests collected",
}


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _finish(
    process: subprocess.Popen[bytes], junit: Path, log: Path, timeout: float, limit: float
) -> tuple[Baseline | None, str]:
    try:
        code = process.wait(timeout=max(timeout, 0.0))
    except subprocess.TimeoutExpired:
        _stop(process, signal.SIGINT)
        return None, f"ran past --timeout {limit:g} s and was stopped (output: {log})"
    except KeyboardInterrupt:
        _stop(process, signal.SIGINT)
        raise
    if code < 0:
        return None, f"was killed by {_signal_name(-code)} (output: {log})"
    if code not in _USABLE_EXITS:
        meaning = _PYTEST_EXITS.get(code, "not a pytest exit status")
        return None, f"exited {code} ({meaning}; output: {log})"
    try:
        run = load_baseline(junit, "its file")
    except NoFigures as error:
        return None, (
            f"recorded no tfgrpc figures in {junit} ({error.cases} test cases): its tests ran "
            "no tfgrpc benchmark, or pytest-tfgrpc was not loaded there (-p no:tfgrpc, or not "
            f"installed) (output: {log})"
        )
    except BaselineError as error:
        return None, f"left no usable JUnit: {error} (output: {log})"
    note = f"exited {code}: some tests failed; its figures are used (output: {log})"
    return run, note if code else ""


def run_side(
    command: Sequence[str], junit: Path, log: Path, timeout: float
) -> tuple[Baseline | None, str]:
    """Run one side's pytest ``command`` once, in a session of its own, with
    ``--junitxml=junit`` added and its output in ``log``, stopped past ``timeout`` seconds.
    Returns its run, or None and why it is unusable (with a run: a note, or ""). Ctrl-C
    stops the side and propagates."""
    process = _start(command, junit, log)
    if isinstance(process, str):
        return None, process
    return _finish(process, junit, log, timeout, timeout)


def run_lockstep(
    commands: Mapping[str, Sequence[str]],
    stems: Mapping[str, Path],
    timeout: float,
    turn_s: float,
) -> tuple[dict[str, tuple[Baseline | None, str]], list[Turn]]:
    """Run both sides (``commands`` by side, ``A`` and ``B``) at once, their measured rounds
    in lockstep through a :class:`~pytest_tfgrpc.turns.Turnstile` (turns bounded by
    ``turn_s``); each side's JUnit and output go to ``stems[side]`` + ``.xml`` / ``.log``,
    both stopped past ``timeout`` seconds. Returns each side's :func:`run_side` answer and
    the turns granted, in order. The pair holds the host's measurement lock
    (:mod:`pytest_tfgrpc.runlock`), each side one of its own. Ctrl-C stops both sides
    and propagates."""
    try:
        # Each side measures under a lock of its own (below): the host's lock, held here for
        # the pair, keeps every other run's measurement on this host from the pair's.
        host = MeasurementLock(lock_path(), PROG, wait_s=lock_wait_s())
        host.__enter__()
    except (OSError, ValueError) as error:
        why = f"did not start: no measurement lock on this host: {error}"
        return {side: (None, why) for side in commands}, []
    try:
        return _lockstep(commands, stems, timeout, turn_s)
    finally:
        host.__exit__(None, None, None)


def _lockstep(
    commands: Mapping[str, Sequence[str]],
    stems: Mapping[str, Path],
    timeout: float,
    turn_s: float,
) -> tuple[dict[str, tuple[Baseline | None, str]], list[Turn]]:
    answers: dict[str, tuple[Baseline | None, str]] = {}
    with Turnstile(turn_s) as turnstile:
        processes: dict[str, subprocess.Popen[bytes]] = {}
        try:
            for side, command in commands.items():
                env = dict(os.environ)
                env.update(
                    {ENV_PATH: turnstile.path, ENV_SIDE: side, ENV_TIMEOUT: f"{turn_s + 30:g}"}
                )
                # The turnstile keeps the sides apart; the host's measurement lock
                # (runlock's $TFGRPC_HOST_LOCK) would let one side's whole run go first.
                env["TFGRPC_HOST_LOCK"] = str(Path(turnstile.path).parent / f"{side}.lock")
                stem = stems[side]
                started = _start(command, stem.with_suffix(".xml"), stem.with_suffix(".log"), env)
                if isinstance(started, str):
                    answers[side] = (None, started)
                else:
                    processes[side] = started
            deadline = time.monotonic() + timeout
            for side, process in processes.items():
                stem = stems[side]
                answers[side] = _finish(
                    process,
                    stem.with_suffix(".xml"),
                    stem.with_suffix(".log"),
                    deadline - time.monotonic(),
                    timeout,
                )
        except KeyboardInterrupt:
            for process in processes.values():
                if process.poll() is None:
                    _stop(process, signal.SIGINT)
            raise
        turns = turnstile.turns()
    return {side: answers[side] for side in commands}, turns


def write_turns(turns: Sequence[Turn], path: Path) -> None:
    """One line per turn: side, granted and released (monotonic seconds)."""
    path.write_text("".join(f"{t.side} {t.granted:.6f} {t.released:.6f}\n" for t in turns))


def _ending_as_interrupt(signum: int, frame: FrameType | None) -> None:
    for ending in _ENDING:
        signal.signal(ending, signal.SIG_DFL)  # a second signal ends tfgrpc-ab at once
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextlib.contextmanager
def _ending_signals_interrupt() -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP raise KeyboardInterrupt (named by the signal), as
    Ctrl-C does, where no one else handles them; their handlers are restored after."""
    taken: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in _ENDING:
            if signal.getsignal(signum) is signal.SIG_DFL:  # someone else's handler: theirs wins
                taken[signum] = signal.signal(signum, _ending_as_interrupt)
    try:
        yield
    finally:
        for signum, handler in taken.items():
            signal.signal(signum, handler)


@dataclass
class _Progress:
    pairs: list[Pair]
    broken: list[Broken]
    sources: list[tuple[Path, Path]]
    notes: list[str] = field(default_factory=list)
    #: What interrupted the pairs ("Ctrl-C", "SIGTERM", "SIGHUP"), or "".
    interrupted: str = ""
    #: Pairs not run: too few were left to make the paired test's pairs usable.
    unrun: int = 0
    #: Lockstep pairs in which a side took no turn, by side ("A", "B", "A and B").
    no_turns: dict[str, list[int]] = field(default_factory=dict)
    #: The number of each pair of ``pairs`` (1-based, as the progress lines count them).
    numbers: list[int] = field(default_factory=list)


def _run_pairs(
    sides: dict[str, _Side],
    order: Sequence[tuple[str, str]],
    directory: Path,
    timeout: float,
    out: TextIO,
    turn_s: float | None = None,
) -> _Progress:
    """Run the pairs; with ``turn_s``, each pair's sides at once in lockstep rounds."""
    done = _Progress([], [], [])
    total = len(order)
    try:
        for index, first_second in enumerate(order, start=1):
            got: dict[str, Baseline] = {}
            took: list[str] = []
            if turn_s is not None:
                started = time.monotonic()
                stems = {name: directory / f"{name.lower()}-{index:02d}" for name in first_second}
                answers, turns = run_lockstep(
                    {name: sides[name].argv for name in first_second}, stems, timeout, turn_s
                )
                write_turns(turns, directory / f"turns-{index:02d}.txt")
                took.append(f"A+B {time.monotonic() - started:.1f} s, {len(turns)} turns")
                for name, (run, why) in answers.items():
                    if run is None:
                        done.broken.append(Broken(index, name, why))
                        continue
                    if why:
                        done.notes.append(f"pair {index}: side {name} {why}")
                    got[name] = run
                idle = _took_no_turns(turns) if len(got) == 2 else ""  # of the pairs used
                if idle:
                    took[-1] += f", none by {idle}"
                    done.no_turns.setdefault(idle, []).append(index)
            for name in first_second if turn_s is None else ():
                stem = f"{name.lower()}-{index:02d}"
                started = time.monotonic()
                run, why = run_side(
                    sides[name].argv, directory / f"{stem}.xml", directory / f"{stem}.log", timeout
                )
                took.append(f"{name} {time.monotonic() - started:.1f} s")
                if run is None:
                    done.broken.append(Broken(index, name, why))
                    break
                if why:
                    done.notes.append(f"pair {index}: side {name} {why}")
                got[name] = run
            state = "broken" if len(got) < 2 else "ok"
            print(f"{PROG}: pair {index}/{total}: {', '.join(took)}: {state}", file=out, flush=True)
            if len(got) == 2:
                done.pairs.append(Pair(got["A"], got["B"]))
                done.numbers.append(index)
                done.sources.append(
                    (directory / f"a-{index:02d}.xml", directory / f"b-{index:02d}.xml")
                )
            left = total - index
            if left and len(done.pairs) + left < MIN_PAIRS:
                done.unrun = left  # a side that breaks every run is not run on in vain
                break
    except KeyboardInterrupt as stop:
        done.interrupted = str(stop) if str(stop) in _SIGNAL_NAMES else "Ctrl-C"
    return done


def _failed_in_b(done: _Progress) -> list[str]:
    """One line per test that failed in B's run of a pair while it passed in A's: B broke it.
    A test that failed on both sides is not B's doing (each such run has its note)."""
    broke: dict[str, list[int]] = {}
    for number, pair in zip(done.numbers, done.pairs, strict=True):
        for test in sorted(pair.b.failed - pair.a.failed):
            broke.setdefault(test, []).append(number)
    return [
        f"{test} failed in B where it passed in A (pairs {', '.join(map(str, numbers))})"
        for test, numbers in broke.items()
    ]


def _took_no_turns(turns: Sequence[Turn]) -> str:
    """Which sides of a lockstep pair took no turn: "A", "B", "A and B", or ""."""
    took = {turn.side for turn in turns}
    return " and ".join(side for side in ("A", "B") if side not in took)


def _turn_warnings(done: _Progress) -> list[str]:
    """One line per side (or both) that took no lockstep turns, naming the pairs."""
    lines = []
    for idle, pairs in sorted(done.no_turns.items()):
        which = ", ".join(map(str, pairs))
        if idle in ("A", "B"):
            other = "B" if idle == "A" else "A"
            what = (
                f"side {idle} took no turns in pairs {which} while side {other} did: its "
                f"rounds ran beside {other}'s, not in turn"
            )
        else:
            what = f"neither side took a turn in pairs {which}: their rounds ran at once"
        lines.append(
            f"{what} (a pytest-tfgrpc older than --interleave rounds takes none); "
            "--interleave runs keeps the sides apart"
        )
    return lines


def _report(comparison: Comparison, done: _Progress, warnings: Sequence[str], out: TextIO) -> None:
    for line in format_comparison(comparison):
        print(line, file=out)
    for broken in done.broken:
        print(f"broken: {broken.describe()}", file=out)
    for note in done.notes:
        print(f"note: {note}", file=out)
    for line in warnings:
        print(f"warning: {line}", file=out)


#: The output options, each with its writer.
_OUTPUTS: tuple[tuple[str, Callable[[AbRun, str], object]], ...] = (
    ("junitxml", write_junit),
    ("results", write_results),
    ("html", write_html),
)


#: In --dir: held (flock) by the tfgrpc-ab writing its runs there, with its pid inside.
DIR_LOCK = ".tfgrpc-ab.lock"


def _lock_dir(directory: Path) -> int | str:
    """Take ``directory``'s :data:`DIR_LOCK`: its open descriptor (close it to let go), or
    who holds it (``pid N``). Two runs in one directory would delete and read each other's
    runs. Raises OSError where the file cannot be opened."""
    fd = os.open(directory / DIR_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
        os.close(fd)
        return f"pid {holder}" if holder.isdigit() else "its pid unknown"
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _dir_error(directory: Path, error: OSError) -> str:
    """Why ``directory`` could not be made or locked, in words."""
    if directory.is_file():
        return "not a directory: a file of that name is there"
    if isinstance(error, FileExistsError):
        return "not a directory: something of that name is there (a broken link?)"
    if isinstance(error, NotADirectoryError):
        file = next((p for p in reversed(directory.parents) if p.is_file()), None)
        if file is not None:
            return f"not a directory: {file} is a file"
    return str(error.strerror or error)


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run the command; returns the exit status (argparse exits 2 itself on a bad option)."""
    command = parse_gate_command(build_parser(), argv, out)
    parser, args, tolerances = command.parser, command.args, command.tolerances
    stdout, stderr = command.stdout, command.stderr
    sides = {}
    for name, command in (("A", args.a), ("B", args.b)):
        try:
            words = tuple(shlex.split(command))
        except ValueError as error:
            parser.error(f"--{name.lower()} {command!r}: {error}")
        if not words:
            parser.error(f"--{name.lower()}: an empty command")
        if shutil.which(words[0]) is None:
            parser.error(
                f"--{name.lower()}: no command {words[0]!r} (not a file, or not executable)"
            )
        if any(w.split("=")[0] in ("--junitxml", "--junit-xml") for w in words):
            parser.error(f"--{name.lower()}: leave --junitxml out: {PROG} adds its own per run")
        sides[name] = _Side(name, words)
    for option in (*(name for name, _ in _OUTPUTS), "dir"):
        if getattr(args, option) == "":  # an unset CI variable: nothing written, or into ./
            parser.error(f"--{option} '': an empty path")
    for option, _ in _OUTPUTS:
        path = getattr(args, option)
        if path and Path(path).is_dir():
            parser.error(f"--{option} {path}: a directory, not a file")
    if args.pairs < MIN_PAIRS:
        parser.error(f"--pairs {args.pairs}: a paired test needs {MIN_PAIRS} or more")
    directory = Path(args.dir)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        lock = _lock_dir(directory)
    except OSError as error:
        print(f"{PROG}: error: --dir {directory}: {_dir_error(directory, error)}", file=stderr)
        return EXIT_BAD_INPUT
    if isinstance(lock, str):
        print(
            f"{PROG}: error: --dir {directory}: in use by another {PROG} ({lock}); "
            "give each run its own --dir",
            file=stderr,
        )
        return EXIT_BAD_INPUT
    try:
        return _run(args, tolerances, sides, directory, stdout, stderr)
    finally:
        os.close(lock)


def _run(
    args: argparse.Namespace,
    tolerances: Mapping[str, float],
    sides: dict[str, _Side],
    directory: Path,
    stdout: TextIO,
    stderr: TextIO,
) -> int:
    # An older run's outputs go first, as the plugin removes an older JUnit when it wakes:
    # a run that ends with nothing to write (no usable pair) leaves none that looks current.
    # One that cannot be removed is left to its write, which names it after the verdict.
    for option, _ in _OUTPUTS:
        path = getattr(args, option)
        if path:
            with contextlib.suppress(OSError):
                Path(path).unlink(missing_ok=True)
    order = _order(args.pairs, args.order, args.seed)
    print(
        f"{PROG}: {args.pairs} pairs ({args.order} order, interleaved by "
        f"{args.interleave}), each run bounded by "
        f"{args.timeout:g} s; A is the baseline, B the current run",
        file=stdout,
    )
    print(f"{PROG}: A = {shlex.join(sides['A'].argv)}", file=stdout)
    print(f"{PROG}: B = {shlex.join(sides['B'].argv)}", file=stdout, flush=True)
    started = time.monotonic()
    turn_s = args.turn_timeout if args.interleave == "rounds" else None
    with _ending_signals_interrupt():
        done = _run_pairs(sides, order, directory, args.timeout, stdout, turn_s)
    elapsed = time.monotonic() - started
    measured = f"{len(done.pairs)} of {args.pairs} pairs usable, {len(done.broken)} broken"
    if done.interrupted:
        measured += f", interrupted after pair {len(done.pairs) + len(done.broken)}"
    if done.unrun:
        measured += f", stopped: {done.unrun} pairs left could not make {MIN_PAIRS} usable"
    print(f"{PROG}: {measured}; {elapsed:.1f} s", file=stdout)
    too_few = ""
    if len(done.pairs) < MIN_PAIRS:
        if done.interrupted:
            cause = f"interrupted ({done.interrupted})"
        elif done.broken:
            more = len(done.broken) - 1
            cause = done.broken[0].describe() + (
                f" (and {counted(more, 'more broken pair')})" if more else ""
            )
        else:  # pragma: no cover - every pair is usable, broken or interrupted
            cause = "no pairs"
        too_few = (
            f"{cause}: {counted(len(done.pairs), 'usable pair')}, a paired test needs {MIN_PAIRS}"
        )
        if not done.pairs:  # nothing measured to write; else the report names them
            for broken in done.broken:
                print(f"broken: {broken.describe()}", file=stdout)
        print(f"{PROG}: error: {too_few}", file=stderr)
        if not done.pairs:
            return EXIT_BAD_INPUT
    comparison = compare_pairs(done.pairs, tolerances, alpha=args.alpha)
    if too_few:
        # The pairs measured are kept (the outputs carry them), judged by nothing but this.
        failures = [too_few]
    else:
        failures = gate_failures(
            comparison, missing=args.missing, inconclusive=args.inconclusive, mismatch=args.mismatch
        )
    failures += _failed_in_b(done)
    warnings = [*_turn_warnings(done), *blind_pairs_warnings(comparison)]
    _report(comparison, done, warnings, stdout)
    if done.interrupted:
        failures.append(f"interrupted ({done.interrupted}): the pairs measured so far are reported")
    run = AbRun(
        comparison=comparison,
        pairs=len(done.pairs),
        broken=tuple(b.describe() for b in done.broken),
        a_command=shlex.join(sides["A"].argv),
        b_command=shlex.join(sides["B"].argv),
        latest_b=done.sources[-1][1],
        failures=tuple(failures),
        interleave=args.interleave,
        order=args.order,
        warnings=tuple(warnings),
        notes=tuple(done.notes),
    )
    lost = f"; {counted(len(done.broken), 'broken pair')}" if done.broken else ""
    verdict = f"FAILED: {'; '.join(failures)}" if failures else "OK"
    print(f"{PROG}: {comparison.summary()}{lost}: {verdict}", file=stdout)
    for option, write in _OUTPUTS:
        path = getattr(args, option)
        if not path:
            continue
        try:
            write(run, path)
        except (OSError, BaselineError) as error:
            why = error.strerror if isinstance(error, OSError) and error.strerror else error
            print(f"{PROG}: error: --{option} {path}: cannot write it: {why}", file=stderr)
            return EXIT_BAD_INPUT
    if too_few:
        return EXIT_BAD_INPUT
    if comparison.regressions or (failures and not done.interrupted):
        return EXIT_REGRESSION
    return EXIT_BAD_INPUT if done.interrupted else EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
