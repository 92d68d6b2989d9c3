"""The tool's own cost per sample: timing and storing, next to a bare loop, in one run.

    python benchmarks/overhead.py [--samples 1000000] [--rounds 7] [--json out.json]

What is measured, each over ``--rounds`` rounds (the figure is the median round):

- per-sample bookkeeping of :func:`pytest_tfgrpc.bench.timing.measure` (two clock reads, one
  store into the int64 sample array, the deadline check): the wall time of ``measure(op)``
  minus that of a bare ``for`` loop calling the same ``op`` as many times, divided by the
  count. ``op`` is a no-op and a trivial operation (``bytes(64)``); the coroutine twin
  :func:`~pytest_tfgrpc.bench.timing.measure_async` is measured against a bare ``await`` loop;
- memory: the bytes ``tracemalloc`` sees held by the samples of one size after
  :meth:`pytest_tfgrpc.results.SizeResult.from_samples` (the int64 array and the
  :class:`~pytest_tfgrpc.stats.summary.Summary`), and the peak while building it;
- the time :func:`pytest_tfgrpc.stats.summary.summarize` takes on 10^6 samples.

Nothing here asserts: it prints the figures and the project's speed targets
(benchmarks/RESULTS.md) next to them.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from pytest_tfgrpc.bench.timing import RunSpec, measure, measure_async
from pytest_tfgrpc.results import SizeResult
from pytest_tfgrpc.stats.summary import summarize

TARGET_NS_PER_SAMPLE = 1000.0
TARGET_BYTES = 10 * 2**20


@dataclass(frozen=True)
class LoopCost:
    """Per-operation wall time of a bare loop and of ``measure`` over the same op."""

    op: str
    samples: int
    bare_ns: float  # per op, median round
    measured_ns: float  # per op, median round
    overhead_ns: float  # measured - bare, per sample, median of per-round differences
    ratio: float  # measured / bare, median round
    rounds: tuple[float, ...]  # per-round overhead, ns per sample


@dataclass(frozen=True)
class MemoryCost:
    """What one size's samples and summary hold, and the peak while they were made."""

    samples: int
    held_bytes: int
    peak_bytes: int
    array_nbytes: int
    held_per_sample: float


@dataclass(frozen=True)
class SummarizeCost:
    samples: int
    median_ms: float
    rounds_ms: tuple[float, ...]


def _noop() -> None:
    return None


def _trivial() -> bytes:
    return bytes(64)


async def _anoop() -> None:
    return None


def _bare(op: Callable[[], object], n: int) -> int:
    clock = time.perf_counter_ns
    t0 = clock()
    for _ in range(n):
        op()
    return clock() - t0


async def _abare(n: int) -> int:
    clock = time.perf_counter_ns
    t0 = clock()
    for _ in range(n):
        await _anoop()
    return clock() - t0


def _spec(n: int) -> RunSpec:
    # Count-bound: the deadline is far enough never to cut a round short.
    return RunSpec(iterations=n, warmup=0, max_seconds=600.0, warmup_seconds=1.0)


def _measured(op: Callable[[], object], n: int) -> int:
    clock = time.perf_counter_ns
    t0 = clock()
    samples, _ = measure(op, _spec(n))
    elapsed = clock() - t0
    assert len(samples) == n
    return elapsed


async def _ameasured(n: int) -> int:
    clock = time.perf_counter_ns
    t0 = clock()
    samples, _ = await measure_async(_anoop, _spec(n))
    elapsed = clock() - t0
    assert len(samples) == n
    return elapsed


def loop_cost(
    name: str, bare: Callable[[], int], timed: Callable[[], int], n: int, rounds: int
) -> LoopCost:
    """Alternate bare and timed loops ``rounds`` times, so drift hits both alike."""
    bare_ns: list[float] = []
    timed_ns: list[float] = []
    gc.collect()
    for _ in range(rounds):
        bare_ns.append(bare() / n)
        timed_ns.append(timed() / n)
    diffs = tuple(t - b for t, b in zip(timed_ns, bare_ns, strict=True))
    return LoopCost(
        op=name,
        samples=n,
        bare_ns=statistics.median(bare_ns),
        measured_ns=statistics.median(timed_ns),
        overhead_ns=statistics.median(diffs),
        ratio=statistics.median(t / b for t, b in zip(timed_ns, bare_ns, strict=True)),
        rounds=diffs,
    )


def memory_cost(n: int, spec: RunSpec | None = None) -> MemoryCost:
    """``tracemalloc`` (numpy reports its buffers to it) around one size's result.

    With ``spec`` cutting the run short by time, this shows what a result keeps alive of the
    sample array sized for the run's iteration cap.
    """
    gc.collect()
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        # As measure() returns them: an int64 array of the run's iteration cap, cut to count.
        samples, elapsed = measure(_noop, spec or _spec(n))
        result = SizeResult.from_samples(1024, 1024, samples, elapsed)
        del samples
        gc.collect()
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return MemoryCost(
        samples=result.count,
        held_bytes=held - base,
        peak_bytes=peak - base,
        array_nbytes=int(result.samples_ns.nbytes),
        held_per_sample=(held - base) / result.count,
    )


def summarize_cost(n: int, rounds: int) -> SummarizeCost:
    rng = np.random.default_rng(1)
    # Latency-like: a lognormal body around 300 us with a long tail.
    samples = (rng.lognormal(mean=np.log(300e3), sigma=0.4, size=n)).astype(np.int64)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        summarize(samples)
        times.append((time.perf_counter_ns() - t0) / 1e6)
    return SummarizeCost(samples=n, median_ms=statistics.median(times), rounds_ms=tuple(times))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--samples", type=int, default=1_000_000, help="samples per round")
    p.add_argument("--rounds", type=int, default=7, help="rounds (median is reported)")
    p.add_argument("--json", default=None, help="write the figures here")
    args = p.parse_args(argv)
    n, rounds = args.samples, args.rounds
    load_start = os.getloadavg()
    costs = [
        loop_cost("no-op", lambda: _bare(_noop, n), lambda: _measured(_noop, n), n, rounds),
        loop_cost(
            "bytes(64)", lambda: _bare(_trivial, n), lambda: _measured(_trivial, n), n, rounds
        ),
        loop_cost(
            "async no-op",
            lambda: asyncio.run(_abare(n)),
            lambda: asyncio.run(_ameasured(n)),
            n,
            rounds,
        ),
    ]
    memory = memory_cost(n)
    # Time-bound run: cap n, deadline 1 ms, so far fewer samples than the cap are taken.
    cut = memory_cost(n, RunSpec(iterations=n, warmup=0, max_seconds=0.001, warmup_seconds=1.0))
    summary = summarize_cost(n, rounds)
    load_end = os.getloadavg()
    print(f"{n} samples per round, {rounds} rounds; load average {load_start} -> {load_end}")
    print(f"{'op':<12} {'bare ns/op':>11} {'measure ns/op':>14} {'overhead ns':>12} {'ratio':>6}")
    for c in costs:
        print(
            f"{c.op:<12} {c.bare_ns:>11.1f} {c.measured_ns:>14.1f} {c.overhead_ns:>12.1f} "
            f"{c.ratio:>6.2f}   rounds: {', '.join(f'{r:.1f}' for r in c.rounds)}"
        )
    worst = max(c.overhead_ns for c in costs)
    verdict = "met" if worst < TARGET_NS_PER_SAMPLE else "NOT met"
    print(f"bookkeeping per sample: at most {worst:.1f} ns (target < 1000 ns): {verdict}")
    print(
        f"memory of {memory.samples} samples + Summary: held {memory.held_bytes} B "
        f"({memory.held_bytes / 2**20:.2f} MiB, {memory.held_per_sample:.2f} B/sample; array "
        f"{memory.array_nbytes} B), peak {memory.peak_bytes} B "
        f"({memory.peak_bytes / 2**20:.2f} MiB) (target < 10 MiB held): "
        + ("met" if memory.held_bytes < TARGET_BYTES else "NOT met")
    )
    print(
        f"time-bound run (cap {n}, 1 ms): {cut.samples} samples hold {cut.held_bytes} B "
        f"({cut.held_per_sample:.0f} B/sample): "
        + (
            "the result keeps the whole capped array"
            if cut.held_bytes > 4 * n
            else "only the samples taken are kept"
        )
    )
    print(
        f"summarize() on {summary.samples} samples: median {summary.median_ms:.1f} ms "
        f"(rounds: {', '.join(f'{r:.1f}' for r in summary.rounds_ms)})"
    )
    if args.json:
        doc = {
            "loadavg": [load_start, load_end],
            "loops": [asdict(c) for c in costs],
            "memory": asdict(memory),
            "memory_time_bound": asdict(cut),
            "summarize": asdict(summary),
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
