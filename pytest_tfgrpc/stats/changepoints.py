"""Change points of one figure over a history of runs: where its level moved, and by how much.

The rule, the same at every message size and in every unit:

1. **Log values.** Each run's value is taken as its logarithm, so a jump is a ratio: 4x reads
   the same at 64 B (tens of microseconds) as at 64 MiB (tens of milliseconds), and the noise
   of a figure is relative, as run-to-run noise is.
2. **PELT with a penalty that is a significance level.** The log values are split into levels
   by PELT (Killick, Fearnhead & Eckley 2012), as ruptures' ``KernelCPD`` with the linear
   kernel (a least-squares cost) computes it. Each new level pays ``sigma**2 * q``: one change
   among the ``n - 1`` places it could start is kept only if unchanged runs of that noise would
   show as large a one with probability at most ``alpha`` (Bonferroni over the places).
3. **The noise from the history itself.** First ``sigma`` is the median absolute difference
   between consecutive runs, scaled to a normal standard deviation (a level shift moves one
   difference, not their median), and ``q`` the chi-squared (1 degree of freedom) quantile at
   ``1 - alpha / (n - 1)``. Then, while the levels found change (at most 5 times), ``sigma`` is
   the standard deviation of the runs within their levels, with ``n - levels`` degrees of
   freedom ``df``, and ``q`` the F(1, ``df``) quantile (the square of Student's t): a noise
   estimated from few runs widens the test, as the gate's t prediction interval does.
4. **A minimum relative size beside the test.** A change of less than ``min_change`` either
   way (a ratio below ``1 + min_change``) is no change: the two levels around the smallest
   such change are merged, and the changes recomputed, until every change left is at least that
   large. A quiet history finds tiny but significant shifts; the gate's tolerance says which
   matter.

A level that is one run long is allowed, so the newest run can start a level of its own.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import stats

__all__ = ["MIN_RUNS", "ChangePointsUnavailableError", "Shift", "change_points"]

#: The fewest runs in which a figure can show a change point.
MIN_RUNS = 3

#: A normal variable's median absolute difference of two draws, in standard deviations.
_MEDIAN_ABS_DIFFERENCE = math.sqrt(2.0) * 0.6744897501960817

#: The noise never taken below this (log units, 1e-6 = 0.0001 %): rounds are recorded to 6
#: significant digits, so identical runs have no measurable spread, not a spread of zero.
_NOISE_FLOOR = 1e-6

#: How often the noise is estimated again from the levels found.
_REESTIMATES = 5


class ChangePointsUnavailableError(RuntimeError):
    """ruptures (the ``history`` extra) is not installed."""


@dataclass(frozen=True)
class Shift:
    """A run at which a figure's level changed: ``index`` of the first run of the new level
    (from 0, in the values given), the levels before and after (geometric means of the runs in
    each, in the values' unit), and ``change``, their ratio less one (``0.5`` = +50 %)."""

    index: int
    before: float
    after: float

    @property
    def change(self) -> float:
        return self.after / self.before - 1.0


def _levels(logs: npt.NDArray[np.float64], penalty: float) -> list[int]:
    """PELT's level starts (the runs, from 1, that start a level) at ``penalty``."""
    import ruptures

    found = ruptures.KernelCPD(kernel="linear", min_size=1).fit(logs).predict(pen=penalty)
    return [int(end) for end in found[:-1]]


def _means(logs: npt.NDArray[np.float64], starts: Sequence[int]) -> list[float]:
    return [float(logs[a:b].mean()) for a, b in itertools.pairwise([0, *starts, len(logs)])]


def _segment(logs: npt.NDArray[np.float64], alpha: float) -> list[int]:
    n = len(logs)
    place = alpha / (n - 1)
    spread = float(np.median(np.abs(np.diff(logs)))) / _MEDIAN_ABS_DIFFERENCE
    starts = _levels(logs, max(spread, _NOISE_FLOOR) ** 2 * float(stats.chi2.isf(place, 1)))
    for _ in range(_REESTIMATES):
        df = n - len(starts) - 1
        if df < 2:
            break
        fitted = np.repeat(_means(logs, starts), np.diff([0, *starts, n]))
        spread = math.sqrt(float(np.sum((logs - fitted) ** 2)) / df)
        again = _levels(logs, max(spread, _NOISE_FLOOR) ** 2 * float(stats.f.isf(place, 1, df)))
        if again == starts:
            break
        starts = again
    return starts


def change_points(
    values: Sequence[float] | npt.NDArray[np.float64], *, alpha: float, min_change: float
) -> tuple[Shift, ...]:
    """The level shifts of ``values`` (one positive figure per run, oldest first), by the rule
    of this module. Fewer than :data:`MIN_RUNS` values have none. Raises
    :class:`ChangePointsUnavailableError` without ruptures, ValueError for a value that is not
    positive and finite, an ``alpha`` outside (0, 1) or a negative ``min_change``."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha {alpha!r}: between 0 and 1 (exclusive)")
    if not min_change >= 0.0:
        raise ValueError(f"minimum change {min_change!r}: at least 0")
    if any(not (math.isfinite(v) and v > 0.0) for v in values):
        raise ValueError(f"change points need positive figures; got {list(values)!r}")
    try:
        import ruptures  # noqa: F401 (imported where used; here to fail before any work)
    except ImportError:
        raise ChangePointsUnavailableError(
            "change points need ruptures: pip install -e '.[history]' in the checkout"
        ) from None
    if len(values) < MIN_RUNS:
        return ()
    logs = np.log(np.asarray(values, dtype=np.float64))
    starts = _segment(logs, alpha)
    smallest = math.log1p(min_change)
    while True:
        levels = _means(logs, starts)
        steps = [abs(after - before) for before, after in itertools.pairwise(levels)]
        if not steps or min(steps) >= smallest:
            break
        del starts[steps.index(min(steps))]
    return tuple(
        Shift(start, math.exp(before), math.exp(after))
        for start, (before, after) in zip(starts, itertools.pairwise(levels), strict=True)
    )
