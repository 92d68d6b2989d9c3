"""The timed loops every figure goes through: bounds, warm-up, GC and phase rules."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Awaitable, Callable

import pytest

from pytest_tfgrpc.bench.timing import RunSpec, Samples, measure, measure_async


class Recorder:
    def __init__(self) -> None:
        self.events: list[str] = []

    def start(self) -> None:
        self.events.append(f"start gc={gc.isenabled()}")

    def stop(self) -> None:
        self.events.append(f"stop gc={gc.isenabled()}")


def _sync(op: Callable[[], object], run: RunSpec, phase: Recorder | None) -> tuple[Samples, int]:
    return measure(op, run, phase)


def _async(op: Callable[[], object], run: RunSpec, phase: Recorder | None) -> tuple[Samples, int]:
    async def aop() -> object:
        return op()

    return asyncio.run(measure_async(aop, run, phase))


LOOPS = [pytest.param(_sync, id="sync"), pytest.param(_async, id="async")]
Loop = Callable[[Callable[[], object], RunSpec, "Recorder | None"], tuple[Samples, int]]


@pytest.mark.parametrize("loop", LOOPS)
def test_count_bound_and_warm_up_calls(loop: Loop) -> None:
    calls: list[bool] = []
    samples, elapsed = loop(lambda: calls.append(gc.isenabled()), RunSpec(7, 3, 30.0, 30.0), None)
    assert len(samples) == 7 and len(calls) == 10 and elapsed >= int(samples.sum())
    assert calls[:3] == [gc.isenabled()] * 3  # the warm-up runs with GC as it was
    assert calls[3:] == [False] * 7  # the measured operations never with cyclic GC


@pytest.mark.parametrize("loop", LOOPS)
def test_time_bound_stops_early_but_keeps_one_sample(loop: Loop) -> None:
    samples, _ = loop(lambda: time.sleep(0.002), RunSpec(10_000, 0, 0.02, 1.0), None)
    assert 1 <= len(samples) < 100 and samples.flags.owndata


@pytest.mark.parametrize("loop", LOOPS)
def test_warm_up_has_its_own_bound_outside_the_measured_time(loop: Loop) -> None:
    counter = [0]

    def op() -> None:
        counter[0] += 1
        time.sleep(0.001)

    samples, _ = loop(op, RunSpec(5, 10_000, max_seconds=0.5, warmup_seconds=0.03), None)
    assert len(samples) == 5 and 5 < counter[0] < 200


@pytest.mark.parametrize("loop", LOOPS)
def test_phase_is_told_outside_the_timed_operations(loop: Loop) -> None:
    phase = Recorder()
    was = gc.isenabled()
    loop(lambda: None, RunSpec(3, 1, 5.0, 5.0), phase)
    assert phase.events == ["start gc=False", "stop gc=False"]
    assert gc.isenabled() == was


@pytest.mark.parametrize("loop", LOOPS)
def test_a_failing_operation_restores_gc_and_skips_the_stop(loop: Loop) -> None:
    phase = Recorder()
    calls = [0]

    def op() -> None:
        calls[0] += 1
        if calls[0] > 2:
            raise RuntimeError("boom")

    gc.enable()
    with pytest.raises(RuntimeError, match="boom"):
        loop(op, RunSpec(5, 1, 5.0, 5.0), phase)
    assert gc.isenabled() and phase.events == ["start gc=False"]


def test_async_operations_are_awaited_once_per_sample() -> None:
    awaited = [0]

    async def op() -> None:
        await asyncio.sleep(0)
        awaited[0] += 1

    coroutine_op: Callable[[], Awaitable[object]] = op
    samples, _ = asyncio.run(measure_async(coroutine_op, RunSpec(2, 0, 5.0, 5.0)))
    assert len(samples) == 2 and awaited[0] == 2
