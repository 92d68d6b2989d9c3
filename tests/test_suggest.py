"""The one rule for "did you mean ...?" (pytest_tfgrpc.suggest)."""

from __future__ import annotations

import pytest

from pytest_tfgrpc.suggest import closest, did_you_mean

ENGINES = ("grpcio", "native", "tensorflow")
P2P_BUDGETS = ("p50", "p99", "throughput", "throughput_p50", "efficiency")


@pytest.mark.parametrize(
    ("name", "known", "meant"),
    [
        ("nativ", ENGINES, "native"),  # a letter short
        ("GRPCIO", ENGINES, "grpcio"),  # another case
        ("Native", ENGINES, "native"),
        ("tensorflw", ENGINES, "tensorflow"),
        ("step_p50", P2P_BUDGETS, "p50"),  # a word too many
        ("step_throughput", P2P_BUDGETS, "throughput"),
        ("sclae", ("scale", "sizes", "name"), "scale"),  # letters swapped
        ("rust", ENGINES, None),  # nothing like it
        ("", ENGINES, None),  # empty
        ("   ", ENGINES, None),
        ("grpcio", ENGINES, None),  # known already: nothing to suggest
    ],
)
def test_closest_suggests_the_name_meant_or_none(
    name: str, known: tuple[str, ...], meant: str | None
) -> None:
    assert closest(name, known) == meant
    assert did_you_mean(name, known) == (f"; did you mean {meant!r}?" if meant else "")


def test_two_names_an_affix_away_fall_back_to_likeness() -> None:
    # throughput_p50 is p50 and throughput with a word added: the likelier by letters wins.
    assert closest("throughput_p50", ("p50", "throughput", "rpc_rate")) == "throughput"


def test_a_high_cutoff_suggests_only_close_names() -> None:
    assert closest("budgit", ("budget",), cutoff=0.75) == "budget"
    assert closest("bdg", ("budget",), cutoff=0.75) is None
