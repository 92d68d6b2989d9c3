"""A test's markers read into specs, once per test, and the processes a test watches."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

import pytest

from pytest_tfgrpc.bench.specs import (
    MessageSpec,
    RunLayer,
    SpecError,
    budget_spec,
    message_spec,
    run_layer,
    run_marker_spec,
    topology_spec,
)
from pytest_tfgrpc.metrics import (
    ALLREDUCE,
    P2P_BANDWIDTH,
    P2P_LATENCY,
    PS_THROUGHPUT,
    SYNC_SGD_STEP,
    budget_metrics_of,
)
from pytest_tfgrpc.model.placement import Placement, Topology, placed_on
from pytest_tfgrpc.plugin.options import MARKERS, usage_error_key
from pytest_tfgrpc.report.budget import Budget
from pytest_tfgrpc.suggest import closest, did_you_mean


class Watched(Protocol):
    """Processes a test uses: a death among them fails the test."""

    def died(self, grace: float = 0.5) -> BaseException | None: ...


@dataclass(frozen=True)
class ItemSpecs:
    """What a test's markers declare, validated once at setup."""

    messages: MessageSpec | None
    budget: Budget | None
    topology: Topology
    run: RunLayer

    @cached_property
    def placement(self) -> Placement | None:
        """The test's model profile placed on its topology: made once per test, on first
        use, and handed to its cluster and its driver (None without a profile)."""
        if self.messages is None or self.messages.profile is None:
            return None
        return placed_on(self.messages.profile, self.topology)

    @property
    def largest_tensor(self) -> int | None:
        """The largest tensor the test's P2P calls send (None: not declared): a tensor
        server takes nothing larger."""
        messages = self.messages
        return max(messages.sizes) if messages is not None and messages.sizes else None

    @property
    def largest_ps_message(self) -> int | None:
        """The largest message the test's PS calls send: with a model profile the most bytes
        one PS owns (a throughput call sends them in one message), else its largest tensor."""
        placement = self.placement
        return max(placement.bytes_per_ps()) if placement is not None else self.largest_tensor


watched_key = pytest.StashKey[list[Watched]]()
_specs_key = pytest.StashKey[ItemSpecs]()


def item_specs(item: pytest.Item) -> ItemSpecs:
    """The specs of ``item``'s markers (closest marker wins; budgets merge, closest last).

    Raises :class:`SpecError` naming the marker and the argument."""
    cached = item.stash.get(_specs_key, None)
    if cached is not None:
        return cached
    messages: MessageSpec | None = None
    budget: Budget | None = None
    mark = item.get_closest_marker("message_profile")
    if mark is not None:
        messages = message_spec(mark.args, mark.kwargs)
    for mark in reversed(list(item.iter_markers("budget"))):  # closest last: it wins
        spec = budget_spec(mark.args, mark.kwargs)
        budget = spec if budget is None else budget.merged(spec)
    mark = item.get_closest_marker("ps_topology")
    topology = topology_spec(mark.args, mark.kwargs) if mark is not None else Topology(1, 1)
    mark = item.get_closest_marker("tfgrpc_run")
    run = run_marker_spec(mark.args, mark.kwargs) if mark is not None else run_layer("", {})
    specs = ItemSpecs(messages, budget, topology, run)
    item.stash[_specs_key] = specs
    return specs


_SUGGESTED = sorted(MARKERS)


def misspelled_marker(item: pytest.Item) -> str:
    """Why one of ``item``'s markers looks like a misspelled tfgrpc marker ("" when none
    does): a marker no plugin or ini file registered whose name is close to one of ours.
    pytest only warns of an unknown marker and ignores it, so a misspelled ``budget`` would
    let every figure pass unchecked."""
    registered = {
        line.split(":", 1)[0].split("(", 1)[0].strip() for line in item.config.getini("markers")
    }
    for mark in item.iter_markers():
        if mark.name in registered:
            continue
        close = closest(mark.name, _SUGGESTED, cutoff=0.75)
        if close:
            return (
                f"unknown marker @pytest.mark.{mark.name}: did you mean "
                f"@pytest.mark.{close}? (pytest ignores an unknown marker, so what it "
                "declares would not apply)"
            )
    return ""


#: The benchmarks a test can run, by the one server fixture it uses: P2P calls take a tensor
#: server, PS calls a cluster. A test with both, or neither (a remote target, a cluster of
#: its own), may run any.
_BENCHMARKS_BY_FIXTURE = {
    "tensor_server": (P2P_LATENCY, P2P_BANDWIDTH),
    "ps_cluster": (PS_THROUGHPUT, SYNC_SGD_STEP, ALLREDUCE),
}


def unrecorded_budget(item: pytest.Item, budget: Budget | None) -> str:
    """Why ``item``'s budget names a metric its benchmarks never record ("" when it names
    none): ``budget(step_p50="5ms")`` on a test that only has a ``tensor_server`` would
    otherwise fail after measuring. Suggests the metric those benchmarks record that it
    looks like."""
    fixtures = set(getattr(item, "fixturenames", ())) & set(_BENCHMARKS_BY_FIXTURE)
    if budget is None or len(fixtures) != 1:
        return ""
    (fixture,) = fixtures
    benchmarks = _BENCHMARKS_BY_FIXTURE[fixture]
    recorded = budget_metrics_of(benchmarks)
    for limit in budget.limits:
        if limit.metric not in recorded:
            return (
                f"@pytest.mark.budget {limit.metric}={limit.text!r}: no benchmark of this test "
                f"records {limit.metric!r} (it uses {fixture}: {', '.join(benchmarks)} record "
                f"{', '.join(recorded)}){did_you_mean(limit.metric, recorded)}"
            )
    return ""


def marker_problem(item: pytest.Item) -> str:
    """Why ``item`` cannot run as its markers say ("" when it can): the run's usage error
    under pytest-xdist, one of them is malformed or a misspelled tfgrpc marker, or its budget
    names a metric its benchmarks never record. Such a test measures nothing, so it fails at
    setup without waiting for the host's measurement lock. The message leads with the cause
    (the marker, the argument, the value): pytest's one-line summary already names the test,
    and would cut a cause after the test's id."""
    problem = item.stash.get(usage_error_key, "") or misspelled_marker(item)
    if not problem:
        try:
            problem = unrecorded_budget(item, item_specs(item).budget)
        except SpecError as exc:
            problem = str(exc)
    return problem


def check_markers(item: pytest.Item) -> None:
    """Fail ``item`` at setup with :func:`marker_problem`'s answer, if any."""
    problem = marker_problem(item)
    if problem:
        pytest.fail(problem, pytrace=False)
