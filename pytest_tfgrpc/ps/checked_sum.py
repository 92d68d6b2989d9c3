"""The all-reduce's verifiable input and the check of its sum (``check=True``): used by the
workers (``ps/worker.py``) and by the driver's cost probe (``bench/allreduce.py``), which must not
import the worker's entry module."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from pytest_tfgrpc.wire.client import BenchmarkError

__all__ = ["check_input", "verify_sum"]


def check_input(elements: int, rank: int) -> npt.NDArray[np.float32]:
    """Rank ``rank``'s input with ``check``: ``(rank + 1) * (j mod 7 + 1)`` at element ``j``,
    small integers whose sums float32 holds exactly."""
    return (np.arange(elements, dtype=np.int64) % 7 + 1).astype(np.float32) * (rank + 1)


def verify_sum(
    got: npt.NDArray[np.float32], expected: npt.NDArray[np.float32], rank: int, iteration: int
) -> None:
    """BenchmarkError naming the rank, the all-reduce and the first element where ``got`` is
    not ``expected`` (the exact sum of every rank's :func:`check_input`)."""
    if not np.array_equal(got, expected):
        wrong = int(np.flatnonzero(got != expected)[0])
        raise BenchmarkError(
            f"rank {rank}: all-reduce {iteration} element {wrong} is {float(got[wrong])!r}, "
            f"the sum of every rank's input is {float(expected[wrong])!r}"
        )
