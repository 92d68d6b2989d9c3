"""The timed loops: warm-up, then one sample per operation, bounded in count and time."""

from __future__ import annotations

import gc
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

Samples = npt.NDArray[np.int64]


@dataclass(frozen=True)
class RunSpec:
    """How long to warm up and measure one message size.

    Iteration-based by default: ``iterations`` timed operations after ``warmup`` untimed
    ones. With ``duration`` set it is time-based, as TF-gRPC-Bench is (2 s warm-up, 10 s
    run): operations are timed for ``duration`` seconds, and ``iterations`` only caps the
    count. Either way the measurement stops at ``max_seconds``, and the warm-up at
    ``warmup_seconds``: every loop is bounded in count and in time.

    ``rounds`` splits the measurement into that many rounds, interleaved in time with the other
    sizes of the same call (:meth:`round_spec`): the unit of replication the baseline gate tests
    across, as Google Benchmark's repetitions are.
    """

    iterations: int
    warmup: int
    max_seconds: float
    warmup_seconds: float
    duration: float | None = None
    rounds: int = 1

    def __post_init__(self) -> None:
        if self.iterations < 1:
            raise ValueError(f"iterations must be at least 1, not {self.iterations}")
        if self.warmup < 0:
            raise ValueError(f"warmup must not be negative, not {self.warmup}")
        for name in ("max_seconds", "warmup_seconds"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, not {getattr(self, name)}")
        if self.duration is not None and not self.duration > 0:
            raise ValueError(f"duration must be positive, not {self.duration}")
        if isinstance(self.rounds, bool) or not isinstance(self.rounds, int) or self.rounds < 1:
            raise ValueError(f"rounds must be a whole number >= 1, not {self.rounds!r}")

    @property
    def round_count(self) -> int:
        """The rounds actually measured: :attr:`rounds`, but never more than the operations."""
        return max(1, min(self.rounds, self.iterations))

    def round_spec(self, index: int) -> RunSpec:
        """The spec of round ``index`` (from 0) of :attr:`round_count`: the count shared out
        so that the rounds add up to ``iterations`` exactly, a share of the time; the first
        round warms up in full, later ones (on a warm channel) briefly."""
        share = self.round_count
        if share == 1:
            return self
        count, extra = divmod(self.iterations, share)
        return RunSpec(
            iterations=count + (1 if index < extra else 0),
            warmup=self.warmup if index == 0 else min(self.warmup, max(1, self.warmup // share)),
            max_seconds=self.max_seconds / share,
            warmup_seconds=self.warmup_seconds if index == 0 else self.warmup_seconds / share,
            duration=None if self.duration is None else self.duration / share,
        )

    @property
    def time_limit_s(self) -> float:
        if self.duration is None:
            return self.max_seconds
        return min(self.duration, self.max_seconds)

    def job_timeout_s(self, barrier_s: float = 0.0) -> float:
        """The most a cluster job of this run may take: the warm-up and measured time, two
        barrier waits of ``barrier_s``, and a minute for starting and reporting."""
        return self.warmup_seconds + self.time_limit_s + 2 * barrier_s + 60.0

    def step_bounds(self, barrier_s: float) -> dict[str, Any]:
        """The bounds of a cluster's sync-SGD job of this run, as
        :meth:`~pytest_tfgrpc.ps.ps_cluster.PSCluster.sync_sgd` takes them."""
        return {
            "warmup": self.warmup,
            "steps": self.iterations,
            "warmup_seconds": self.warmup_seconds,
            "max_seconds": self.time_limit_s,
            "timeout_s": self.job_timeout_s(barrier_s),
        }

    def describe(self) -> dict[str, str]:
        out = {
            "iterations": str(self.iterations),
            "warmup": str(self.warmup),
            "max_seconds": f"{self.max_seconds:g}",
            "warmup_seconds": f"{self.warmup_seconds:g}",
        }
        if self.duration is not None:
            out["duration_s"] = f"{self.duration:g}"
        if self.rounds > 1:
            out["rounds"] = str(self.rounds)
        return out


class Phase(Protocol):
    """Told when the measured phase starts and when it ends (e.g. to read CPU times)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


class _Window:
    """The measured phase of one loop: ``phase`` told when it starts and ends, and no cyclic
    garbage collection in this process meanwhile (its pauses are the tool's, not the
    transport's). Inside, ``samples`` (capped at ``run.iterations``) and ``deadline`` (ns on
    the perf counter) are ready for the loop; both loops take them into locals, so the
    window costs nothing per sample."""

    def __init__(self, run: RunSpec, phase: Phase | None) -> None:
        self.run = run
        self.phase = phase
        self.samples: Samples = np.empty(run.iterations, dtype=np.int64)
        self.start = self.deadline = self.elapsed = 0
        self._gc = gc.isenabled()

    def __enter__(self) -> _Window:
        gc.disable()
        try:
            if self.phase is not None:
                self.phase.start()
        except BaseException:
            self._restore_gc()
            raise
        self.start = time.perf_counter_ns()
        self.deadline = self.start + int(self.run.time_limit_s * 1e9)
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        self.elapsed = time.perf_counter_ns() - self.start
        try:
            if kind is None and self.phase is not None:
                self.phase.stop()
        finally:
            self._restore_gc()

    def _restore_gc(self) -> None:
        if self._gc:
            gc.enable()

    def result(self, count: int) -> tuple[Samples, int]:
        """The ``count`` samples taken (a run that stopped early keeps only those, not the
        whole capped array) and the measured phase's wall time (ns)."""
        samples = self.samples
        return (samples if count == len(samples) else samples[:count].copy()), self.elapsed


def _warm_up(op: Callable[[], object], run: RunSpec) -> None:
    clock = time.perf_counter_ns
    warm_end = clock() + int(run.warmup_seconds * 1e9)
    for _ in range(run.warmup):
        op()
        if clock() >= warm_end:
            return


async def _warm_up_async(op: Callable[[], Awaitable[object]], run: RunSpec) -> None:
    clock = time.perf_counter_ns
    warm_end = clock() + int(run.warmup_seconds * 1e9)
    for _ in range(run.warmup):
        await op()
        if clock() >= warm_end:
            return


def measure(
    op: Callable[[], object], run: RunSpec, phase: Phase | None = None
) -> tuple[Samples, int]:
    """Warm up, then time ``op`` until the spec's count or time runs out.

    Returns the samples (ns) and the wall time of the measured phase (ns). ``phase`` is told
    when the measured phase starts and ends, outside the timed operations.
    """
    _warm_up(op, run)
    clock = time.perf_counter_ns
    with _Window(run, phase) as window:
        samples, deadline = window.samples, window.deadline
        for count in range(1, run.iterations + 1):
            t0 = clock()
            op()
            t1 = clock()
            samples[count - 1] = t1 - t0
            if t1 >= deadline:
                break
    return window.result(count)


async def measure_async(
    op: Callable[[], Awaitable[object]], run: RunSpec, phase: Phase | None = None
) -> tuple[Samples, int]:
    """:func:`measure` for operations that are coroutines."""
    await _warm_up_async(op, run)
    clock = time.perf_counter_ns
    with _Window(run, phase) as window:
        samples, deadline = window.samples, window.deadline
        for count in range(1, run.iterations + 1):
            t0 = clock()
            await op()
            t1 = clock()
            samples[count - 1] = t1 - t0
            if t1 >= deadline:
                break
    return window.result(count)
