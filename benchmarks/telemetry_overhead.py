"""The cost of transport telemetry per size: reads between timed loops, against the figures.

    python benchmarks/telemetry_overhead.py [--rounds 5] [--engines grpcio,native] [--json out.json]
        [--compare REV]

Per engine (``grpcio``, and ``native`` where it is built: its own server and its C++ client,
which pauses with its connections open while telemetry is read), a local tensor server on
``lo``; per round, the 1 KiB echo (``p2p_latency``, unary, the default run: 1000 iterations in
each of 10 interleaved rounds for grpcio, one client run for native) and the 64 MiB push
(``p2p_bandwidth``, 50 iterations) are measured twice, in turn: with telemetry (the plugin as
it is) and without (a probe that reads nothing), the order alternating per round. For each
engine and size it reports:

- the wall time telemetry took per size: the probe's making (the host's counters) and
  closing, the window's two readings (the measured connections' ``tcp_info``, looked up by
  their ends, and the fabric's link and qdisc: at the first round's start and the last
  round's end), and every round's readings of the sides' run-queue waits (``/proc``), with
  what the native client's own telemetry took it at its pauses (its threads' run-queue wait
  and its connections' ends, timed by itself), against the size's measured time (the sum of
  its timed loops' wall time, the figure's own denominator): the target is under 1%;
- the p50 (echo) and throughput (push) with and without telemetry, median over rounds: reads
  happen outside the timed loops, so the figures should not move beyond the round-to-round
  spread, which is printed beside them.

``--compare REV`` measures, in the same run and rounds, a third arm with the telemetry reader
(:mod:`pytest_tfgrpc.wire.telemetry`, and the Python engine's ``own_connections``) as it was
at git revision ``REV`` (e.g. ``main``; it finds connections as it did then: by the ends it is
told where it took them), and prints its read time beside this tree's: a before/after whose
ratio the machine's load touches alike. The probe (:mod:`pytest_tfgrpc.bench.telemetry`) is
this tree's in both arms.

It prints whether the machine looked loaded (the 1-minute load average against the CPUs this
process may use) and labels the figures "under load" when it did: such figures are no evidence
for the target. Nothing here asserts.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest_tfgrpc.bench.native_p2p as native_p2p
import pytest_tfgrpc.bench.p2p as p2p
from pytest_tfgrpc import native
from pytest_tfgrpc.bench import telemetry
from pytest_tfgrpc.bench.p2p import BandwidthCall, LatencyCall
from pytest_tfgrpc.roles.native_server import start_tensor_server
from pytest_tfgrpc.roles.processes import ServerProcess
from pytest_tfgrpc.wire.fabric import resolve_fabric

TARGET_SHARE = 0.01


@dataclass(frozen=True)
class Arm:
    """One size measured once by one engine, with or without telemetry."""

    engine: str
    size: str
    telemetry: bool
    #: Whose telemetry reader: ``now`` (this tree's), a git revision (``--compare``), or "".
    reader: str
    figure: str
    value: float
    measured_s: float
    read_s: float
    reads: int


class _NoProbe(telemetry.TransportProbe):
    """A probe that reads nothing: the run as it was before telemetry."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.windows = []
        self.errors = []
        self.cpu_wait = {}

    def watch(self, side: str, pid: int, connections: Any = None) -> None: ...

    def reported(self, side: str, waited_ns: int | None, *, read_ns: int = 0) -> None: ...

    def told(self, connections: Any) -> None: ...

    def begin_round(self, *, window: bool) -> None: ...

    def end_round(self, *, window: bool) -> None: ...

    def transport(self) -> None:
        return None

    def close(self) -> None: ...


#: The measuring loops of each engine: each looks its probe up as ``probe_for`` at run time.
LOOPS = {"grpcio": p2p, "native": native_p2p}


def reader_at(rev: str) -> type[telemetry.TelemetryReader]:
    """The ``TelemetryReader`` of ``pytest_tfgrpc/wire/telemetry.py`` as it was at git
    revision ``rev``, taking this tree's calls (what its ``read`` does not take is dropped:
    the client ends, before it looked connections up by them)."""
    root = Path(__file__).resolve().parent.parent
    path = "pytest_tfgrpc/wire/telemetry.py"
    shown = subprocess.run(
        ["git", "show", f"{rev}:{path}"], cwd=root, capture_output=True, text=True, check=False
    )
    if shown.returncode:
        raise SystemExit(f"--compare {rev}: git show failed: {shown.stderr.strip()}")
    module = types.ModuleType(f"telemetry_at_{rev}")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(shown.stdout, f"{rev}:{path}", "exec"), module.__dict__)
    old: Any = module.TelemetryReader

    takes = set(inspect.signature(old.read).parameters)

    class Legacy(old):  # type: ignore[misc, valid-type]
        def read(self, address: str, port: int, *, discover: bool = True, **more: Any) -> Any:
            # What that revision's read takes of this tree's (the clients' ends since
            # they were told, the host's counters since it reads them on request).
            kept = {name: value for name, value in more.items() if name in takes}
            return old.read(self, address, port, discover=discover, **kept)

        def run_queue_wait_ns(self, pid: int) -> int | None:
            if hasattr(old, "run_queue_wait_ns"):  # its own, with files kept open
                kept: int | None = old.run_queue_wait_ns(self, pid)
                return kept
            waited: int | None = module.run_queue_wait_ns(pid)
            return waited

        def counters(self, *, host: bool = True) -> Any:
            if hasattr(old, "counters"):
                return old.counters(self, host=host)
            at = time.monotonic_ns()
            retransmits = module.host_retransmits() if host else None
            link = self.link(self.interface) if self.interface else None
            return module.Reading(at, (), link, retransmits)

    Legacy.own_connections = staticmethod(getattr(module, "own_connections", None))
    return Legacy


@contextmanager
def with_reader(reader: type[telemetry.TelemetryReader] | None) -> Iterator[None]:
    """The probe reads through ``reader`` (None: this tree's TelemetryReader), and the
    Python engine finds its own connections with that revision's ``own_connections``."""
    saved, saved_own = telemetry.TelemetryReader, p2p.own_connections
    if reader is not None:
        telemetry.TelemetryReader = reader  # type: ignore[misc]
        p2p.own_connections = getattr(reader, "own_connections", None) or saved_own
    try:
        yield
    finally:
        telemetry.TelemetryReader = saved  # type: ignore[misc]
        p2p.own_connections = saved_own


@contextmanager
def timed_reads(engine: str, enabled: bool) -> Iterator[tuple[list[float], list[float]]]:
    """Patch ``engine``'s P2P loop's probe: timed (enabled) or a no-op one; yields each
    reading's time (the probe's making, which reads the host's counters once, and each
    round's start and end: the run-queue waits, and at the window's opening and closing the
    measured connections and link counters too) and each probe's closing time, with what
    the probed processes' own reads took (the native client's at its pauses, as it reports)."""
    spent: list[float] = []
    closing: list[float] = []
    probes: list[telemetry.TransportProbe] = []
    loops = LOOPS[engine]
    original = loops.probe_for
    if not enabled:
        loops.probe_for = lambda *a, **k: _NoProbe()  # type: ignore[assignment]
    else:

        def made(*args: Any, **kwargs: Any) -> telemetry.TransportProbe:
            began = time.perf_counter()
            probe = original(*args, **kwargs)
            spent.append(time.perf_counter() - began)
            probes.append(probe)
            reads = (("begin_round", spent), ("end_round", spent), ("close", closing))
            for name, into in reads:
                inner = getattr(probe, name)

                def wrapped(
                    *a: Any, inner: Any = inner, into: list[float] = into, **k: Any
                ) -> None:
                    began = time.perf_counter()
                    inner(*a, **k)
                    into.append(time.perf_counter() - began)

                setattr(probe, name, wrapped)
            return probe

        loops.probe_for = made  # type: ignore[assignment]
    try:
        yield spent, closing
    finally:
        loops.probe_for = original
        # What the probed processes' own reads took (the native client's, at its pauses).
        closing.extend(probe.reported_read_ns / 1e9 for probe in probes)


def one(
    engine: str,
    server: ServerProcess,
    size: str,
    reader: str,
    legacy: type[telemetry.TelemetryReader] | None = None,
) -> Arm:
    """``size`` measured once: without telemetry (``reader`` empty), with this tree's reader
    (``now``) or with ``legacy`` (named ``reader``)."""
    loops = LOOPS[engine]
    enabled = bool(reader)
    with with_reader(legacy), timed_reads(engine, enabled) as (spent, closing):
        if size == "1KiB":
            result = loops.p2p_latency(server, [1024], LatencyCall())
            figure, value = "p50_us", result.sizes[0].summary.p50_ns / 1e3
        else:
            result = loops.p2p_bandwidth(server, [64 * 2**20], BandwidthCall())
            figure, value = "throughput_MBps", result.sizes[0].throughput_Bps / 1e6
    point = result.sizes[0]
    measured = point.elapsed_ns / 1e9
    read_s = sum(spent) + sum(closing)
    return Arm(engine, size, enabled, reader, figure, value, measured, read_s, len(spent))


def loaded() -> tuple[bool, str]:
    cpus = len(os.sched_getaffinity(0))
    load = os.getloadavg()[0]
    return load > 0.5 * cpus, f"load average {load:.2f} on {cpus} CPUs"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--engines",
        default="grpcio,native",
        help="comma-separated engines (default grpcio,native; native is left out, with a "
        "note, where it is not built)",
    )
    parser.add_argument("--json", help="write every arm's figures here")
    parser.add_argument(
        "--compare",
        metavar="REV",
        help="also measure the telemetry reader as it was at git revision REV (e.g. main)",
    )
    args = parser.parse_args(argv)
    legacy = reader_at(args.compare) if args.compare else None
    readers = ["now", ""] + ([args.compare] if args.compare else [])
    engines = [name.strip() for name in args.engines.split(",") if name.strip()]
    unknown = sorted(set(engines) - set(LOOPS))
    if unknown:
        parser.error(f"--engines: unknown {', '.join(unknown)}; choose from grpcio, native")
    if "native" in engines and (why := native.unavailable_reason()) is not None:
        print(f"native left out: {why}", file=sys.stderr)
        engines.remove("native")
    busy, load_text = loaded()
    arms: list[Arm] = []
    for engine in engines:
        with start_tensor_server(resolve_fabric("lo"), engine=engine) as server:
            for r in range(args.rounds):
                for size in ("1KiB", "64MiB"):
                    # The arms' order turns each round: none is always first after a change.
                    turn = r % len(readers)
                    for reader in readers[turn:] + readers[:turn]:
                        old = legacy if reader == args.compare else None
                        arms.append(one(engine, server, size, reader, old))
                        print(f"round {r + 1}: {arms[-1]}", file=sys.stderr)
    # The load after counts this benchmark's own server and client (about 2 on 2 CPUs), so only
    # the load before says whether something else was running; both are quoted.
    after = loaded()[1].removeprefix("load average ")
    label = f" ({'UNDER LOAD: ' if busy else ''}{load_text} before, {after} after)"
    print(f"telemetry overhead per size, median of {args.rounds} rounds{label}")
    for engine, size in ((e, s) for e in engines for s in ("1KiB", "64MiB")):
        on = [a for a in arms if (a.engine, a.size, a.reader) == (engine, size, "now")]
        off = [a for a in arms if (a.engine, a.size) == (engine, size) and not a.telemetry]
        share = statistics.median(a.read_s / a.measured_s for a in on)
        read_ms = statistics.median(a.read_s for a in on) * 1e3
        reads = on[0].reads
        with_, without = (statistics.median(a.value for a in arms_) for arms_ in (on, off))
        spread = statistics.pstdev(a.value for a in off) / without if len(off) > 1 else 0.0
        verdict = "meets" if share < TARGET_SHARE else "misses"
        print(
            f"{engine} {size}: {reads} reads, {read_ms:.2f} ms per size = {share:.3%} of the "
            f"measured time ({verdict} the {TARGET_SHARE:.0%} target); {on[0].figure} with "
            f"{with_:.4g}, without {without:.4g} ({with_ / without - 1:+.1%}; rounds spread "
            f"{spread:.1%})"
        )
        was = [a for a in arms if (a.engine, a.size, a.reader) == (engine, size, args.compare)]
        if was:
            was_ms = statistics.median(a.read_s for a in was) * 1e3
            was_share = statistics.median(a.read_s / a.measured_s for a in was)
            print(
                f"  reader at {args.compare}: {was[0].reads} reads, {was_ms:.2f} ms per size = "
                f"{was_share:.3%}; this tree's reads take {read_ms / was_ms:.2f}x its time"
            )
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"load": load_text, "under_load": busy, "arms": [asdict(a) for a in arms]},
                      out, indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
