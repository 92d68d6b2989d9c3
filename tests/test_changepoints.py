"""Change points over synthetic histories (pytest_tfgrpc.stats.changepoints): the same jump is
found at every message size, unchanged noisy runs show none, and a significant shift smaller
than the minimum change is no change point."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest

from pytest_tfgrpc.stats.changepoints import MIN_RUNS, change_points

pytest.importorskip("ruptures", reason="needs the history extra (ruptures; in dev)")

ALPHA, MIN_CHANGE = 0.001, 0.10

#: A figure's level at each size (p50 of an echo, ns) and its run-to-run noise (the standard
#: deviation of log values; docs/concepts/gate-statistics.md measured 1.6 % pinned, 4 %
#: unpinned): small messages are noisier than large ones, 64 MiB noisier again.
SIZES = {"64B": (45e3, 0.04), "1KiB": (60e3, 0.03), "1MiB": (2.1e6, 0.02), "64MiB": (150e6, 0.04)}


def history(level: float, noise: float, runs: int, seed: int) -> npt.NDArray[np.float64]:
    """``runs`` values around ``level`` with log-normal noise of ``noise``, seeded."""
    return level * np.exp(np.random.default_rng(seed).normal(0.0, noise, runs))


#: Jumps up and down. The newest run alone must stand out more than a level of several runs:
#: in 12 runs, by about 6.3 times the runs' noise (Student's t with 10 degrees of freedom,
#: Bonferroni over 11 places), which a 1.5x jump in 4 % noise does not always reach.
JUMPS = (1.5, 2.0, 4.0, 1 / 1.5, 1 / 4.0)
LARGE_JUMPS = (2.0, 4.0, 1 / 2.0, 1 / 4.0)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize(
    ("runs", "at", "jump"),
    [
        *((runs, at, jump) for runs, at in ((12, 6), (30, 20), (30, 29)) for jump in JUMPS),
        *((12, 11, jump) for jump in LARGE_JUMPS),
    ],
)
def test_the_same_jump_is_found_at_every_size(size: str, runs: int, at: int, jump: float) -> None:
    level, noise = SIZES[size]
    for seed in range(10):
        values = history(level, noise, runs, seed)
        values[at:] *= jump
        (shift,) = change_points(values, alpha=ALPHA, min_change=MIN_CHANGE)
        assert shift.index == at, (seed, values)
        # the change is measured between the levels' geometric means: within their noise
        assert math.log1p(shift.change) == pytest.approx(math.log(jump), abs=4 * noise), seed
        assert shift.after / shift.before == pytest.approx(1 + shift.change)


@pytest.mark.parametrize("noise", [0.02, 0.05, 0.08])
@pytest.mark.parametrize("runs", [4, 8, 14, 30])
def test_unchanged_noisy_runs_show_no_change_point(noise: float, runs: int) -> None:
    for size, (level, _) in SIZES.items():
        for seed in range(10):
            values = history(level, noise, runs, 100 + seed)
            assert change_points(values, alpha=ALPHA, min_change=MIN_CHANGE) == (), (size, seed)


def test_a_significant_shift_below_the_minimum_change_is_no_change_point() -> None:
    # A quiet history moved by 8 %: far outside its 1 % noise, but under the 10 % that matters.
    values = history(300e3, 0.01, 14, 7)
    values[7:] *= 1.08
    assert change_points(values, alpha=ALPHA, min_change=0.10) == ()
    (shift,) = change_points(values, alpha=ALPHA, min_change=0.05)
    assert shift.index == 7 and shift.change == pytest.approx(0.08, abs=0.01)


def test_a_one_run_spike_is_two_change_points_and_identical_runs_none() -> None:
    values = [300e3] * 6 + [600e3] + [300e3] * 6
    assert [
        (s.index, round(s.change, 3)) for s in change_points(values, alpha=ALPHA, min_change=0.1)
    ] == [
        (6, 1.0),
        (7, -0.5),
    ]
    assert change_points([300e3] * 10, alpha=ALPHA, min_change=0.0) == ()


def test_too_short_a_history_has_no_change_point_and_bad_input_is_refused() -> None:
    assert change_points([1.0, 4.0][: MIN_RUNS - 1], alpha=ALPHA, min_change=0.1) == ()
    for values, alpha, least, message in (
        ([1.0, 0.0, 1.0], ALPHA, 0.1, "positive figures"),
        ([1.0, math.nan, 1.0], ALPHA, 0.1, "positive figures"),
        ([1.0, 1.0, 1.0], 1.0, 0.1, "alpha 1.0: between 0 and 1"),
        ([1.0, 1.0, 1.0], ALPHA, -0.1, "minimum change -0.1: at least 0"),
    ):
        with pytest.raises(ValueError, match=message):
            change_points(values, alpha=alpha, min_change=least)


def test_a_history_reads_the_same_at_every_level() -> None:
    # The same relative noise and jump at 45 us, 2.1 ms, 150 ms and 1.2 GB/s: the same verdict.
    for seed in range(10):
        shape = history(1.0, 0.05, 14, 200 + seed)
        shape[9:] *= 4.0
        found = {
            level: [(s.index, round(s.change, 9)) for s in change_points(
                shape * level, alpha=ALPHA, min_change=MIN_CHANGE)]
            for level in (45e3, 2.1e6, 150e6, 1.2e9)
        }  # fmt: skip
        assert len({tuple(f) for f in found.values()}) == 1, found
        assert [i for i, _ in found[45e3]] == [9], found
