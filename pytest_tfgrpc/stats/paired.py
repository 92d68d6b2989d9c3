"""A paired test of two versions measured side by side: B against A across pairs of runs.

Each pair is one run of A and one of B made back to back (``tfgrpc-ab``), or one round of two
servers measured size by size in turn (``Driver.p2p_latency_ab``): whatever drifted on the
machine between pairs hit both sides of a pair alike. The replicate is the **pair**; its value
is the log of B's figure over A's, so that a change is a ratio whichever the unit, and the
drift common to both sides cancels.

The test is a one-sample Student t on the pairs' log ratios (``n - 1`` degrees of freedom):
its detectable change is ``expm1(t * sd / sqrt(n))`` (gRPC's ``bm_diff`` and Google
Benchmark's repetitions report the same idea). With few pairs it is the only test that can
see anything: the Wilcoxon signed-rank test's smallest two-sided p with ``n`` pairs is
``2 / 2**n`` (0.0625 at 5 pairs), so it can never reject at 5 %. The signed-rank test
runs beside it as a **check**: where it can reach the level at all (enough pairs) and does not
confirm a change the t calls significant, one pair is driving the mean, and the change is not
called significant.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pytest_tfgrpc.stats.replicates import ChangeTest, invalid_values

__all__ = [
    "MAX_PAIRS_SAID",
    "MIN_PAIRS",
    "PairedTest",
    "paired_test",
    "pairs_to_detect",
    "signed_rank_floor",
]

#: Pairs a paired test needs (a spread with 2 degrees of freedom).
MIN_PAIRS = 3
#: The most pairs :func:`pairs_to_detect` counts up to.
MAX_PAIRS_SAID = 1000


@dataclass(frozen=True)
class PairedTest(ChangeTest):
    """The outcome of :func:`paired_test`, a :class:`~pytest_tfgrpc.stats.replicates.ChangeTest`.

    ``baseline`` and ``current`` are the geometric means of A's and B's values; ``change`` is
    the geometric mean of the pairs' ratios minus one (B over A); ``detectable``,
    ``direction`` and ``p_value`` are the t test's. ``signed_rank_p`` is the Wilcoxon
    signed-rank test's p (NaN when all ratios are 1), and ``vetoed`` says the signed-rank test
    could have confirmed a significant t and did not. ``pairs`` counts the pairs.
    """

    signed_rank_p: float
    vetoed: bool
    pairs: int

    @property
    def method(self) -> str:
        if math.isfinite(self.signed_rank_p):
            check = f"signed-rank p={self.signed_rank_p:.2g}"
        else:
            check = "signed-rank: all pairs equal"
        veto = ", does not confirm" if self.vetoed else ""
        return f"paired t-test on log ratios, {self.pairs} pairs ({check}{veto})"


def signed_rank_floor(pairs: int) -> float:
    """The smallest two-sided p the exact Wilcoxon signed-rank test can give with ``pairs``
    pairs, all of one sign: ``2 / 2**pairs``."""
    return 2.0 / 2.0**pairs


def paired_test(a: Sequence[float], b: Sequence[float], *, alpha: float) -> PairedTest:
    """Test whether B's values differ from A's, pair by pair (``a[i]`` and ``b[i]`` were
    measured side by side), as the module docstring says.

    :raises ValueError: fewer than :data:`MIN_PAIRS` pairs, ``a`` and ``b`` of different
        lengths, a value that is not a positive finite number
        (:func:`~pytest_tfgrpc.stats.replicates.invalid_values`), or ``alpha`` outside (0, 1).
    """
    from scipy import stats

    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be between 0 and 1 (exclusive), got {alpha!r}")
    if len(a) != len(b):
        raise ValueError(f"{len(a)} values of A and {len(b)} of B: a paired test needs pairs")
    if len(a) < MIN_PAIRS:
        raise ValueError(f"{len(a)} pairs: a paired test needs {MIN_PAIRS}")
    for side, values in (("A", a), ("B", b)):
        why = invalid_values(values)
        if why:
            raise ValueError(f"side {side}'s figures are invalid: {why}")
    log_a = np.log(np.asarray(a, dtype=np.float64))
    log_b = np.log(np.asarray(b, dtype=np.float64))
    ratios = log_b - log_a
    n = len(ratios)
    shift = float(np.mean(ratios))
    se = float(np.std(ratios, ddof=1)) / math.sqrt(n)
    df = n - 1.0
    critical = float(stats.t.ppf(1.0 - alpha / 2.0, df))
    # Every pair moved by exactly the same ratio (se 0): any move at all is certain.
    certain = 0.0 if shift else 1.0
    p_value = float(2.0 * stats.t.sf(abs(shift / se), df)) if se > 0 else certain
    if np.any(ratios != 0.0):
        signed_rank_p = float(stats.wilcoxon(ratios, alternative="two-sided").pvalue)
    else:
        signed_rank_p = math.nan
    significant = p_value < alpha
    vetoed = (
        significant
        and signed_rank_floor(n) < alpha
        and not (math.isfinite(signed_rank_p) and signed_rank_p < alpha)
    )
    return PairedTest(
        baseline=float(np.exp(np.mean(log_a))),
        current=float(np.exp(np.mean(log_b))),
        change=math.expm1(shift),
        detectable=math.expm1(critical * se),
        direction=(1 if shift > 0 else -1) if significant and not vetoed else 0,
        p_value=p_value,
        signed_rank_p=signed_rank_p,
        vetoed=vetoed,
        pairs=n,
    )


def pairs_to_detect(detectable: float, pairs: int, change: float, *, alpha: float) -> int | None:
    """The fewest pairs whose t test would detect ``change`` (a fraction, > 0), at the
    spread of the pairs' log ratios that made ``detectable`` over ``pairs`` pairs at level
    ``alpha`` (as :func:`paired_test` reports it): the smallest ``m`` with
    ``expm1(t(1 - alpha/2, m - 1) * sd / sqrt(m)) <= change``. None when more than
    :data:`MAX_PAIRS_SAID` would be needed or the inputs say nothing (a detectable change
    that is not a positive finite number, fewer than :data:`MIN_PAIRS` pairs)."""
    from scipy import stats

    if not (math.isfinite(detectable) and detectable > 0 and change > 0 and 0 < alpha < 1):
        return None
    if pairs < MIN_PAIRS:
        return None
    sd = (
        math.log1p(detectable) / float(stats.t.ppf(1.0 - alpha / 2.0, pairs - 1)) * math.sqrt(pairs)
    )
    m = np.arange(MIN_PAIRS, MAX_PAIRS_SAID + 1)
    seen = np.expm1(stats.t.ppf(1.0 - alpha / 2.0, m - 1) * sd / np.sqrt(m))
    enough = np.flatnonzero(seen <= change)
    return int(m[enough[0]]) if enough.size else None
