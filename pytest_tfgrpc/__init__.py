"""pytest-tfgrpc: communication-performance checks for gRPC tensor traffic, as pytest tests.

The names in :data:`__all__` are the public API, imported lazily: ``import pytest_tfgrpc``
(done by pytest at start-up through the plugin entry point) stays cheap and pulls in neither
numpy nor grpc.

The subpackages are layered, top first; a layer imports only the layers below it, and layers on
one line (``a | b``) import nothing of each other (import-linter's contract in ``pyproject.toml``,
checked by ``tests/test_layers.py``; each subpackage's docstring says what it holds):

- ``plugin``: pytest glue, the only code that imports pytest
- ``cli | bench``: the console scripts; the benchmarks, their timing, driver and engines
- ``hosts | ps | report``: other hosts (agents, cluster specs, SLURM, emulated fabrics); PS
  clusters and workers; figures after the run (JUnit properties, gate, views)
- ``roles``: the local processes the plugin starts (tensor, floor, native servers, TF tasks)
- ``tuning | native | model | wire``: CPU placement and allocator; the C++ engine's build and
  runner; model profiles, placement and the analytic model; what travels on the wire
- ``results``: the result types
- ``stats | units``: statistics of samples; units and their parsing
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: Public name -> the module that defines it. Resolved on first use, by name, so that this
#: package imports none of them at start-up.
_EXPORTS = {
    # results
    "BenchmarkResult": "pytest_tfgrpc.results",
    "SizeResult": "pytest_tfgrpc.results",
    "CpuTime": "pytest_tfgrpc.results",
    "Figure": "pytest_tfgrpc.results",
    "PSResult": "pytest_tfgrpc.bench.ps",
    "check_aggregate": "pytest_tfgrpc.bench.ps",
    "AggregateError": "pytest_tfgrpc.bench.ps",
    "Summary": "pytest_tfgrpc.stats.summary",
    "Sketch": "pytest_tfgrpc.stats.sketch",
    # budgets
    "assert_budget": "pytest_tfgrpc.report.budget",
    "Budget": "pytest_tfgrpc.report.budget",
    "BudgetError": "pytest_tfgrpc.report.budget",
    "BudgetExceeded": "pytest_tfgrpc.report.budget",
    # model profiles, placement, the analytic model
    "load_profile": "pytest_tfgrpc.model.profiles",
    "list_profiles": "pytest_tfgrpc.model.profiles",
    "Profile": "pytest_tfgrpc.model.profiles",
    "TensorSpec": "pytest_tfgrpc.model.profiles",
    "Topology": "pytest_tfgrpc.model.placement",
    "Placement": "pytest_tfgrpc.model.placement",
    "place_profile": "pytest_tfgrpc.model.placement",
    "HostCosts": "pytest_tfgrpc.model.analytic",
    "LinkFit": "pytest_tfgrpc.model.analytic",
    "StepPrediction": "pytest_tfgrpc.model.analytic",
    # what the fixtures hand out
    "Driver": "pytest_tfgrpc.bench.driver",
    "RunSpec": "pytest_tfgrpc.bench.timing",
    "Fabric": "pytest_tfgrpc.wire.fabric",
    "FabricError": "pytest_tfgrpc.wire.fabric",
    "ServerProcess": "pytest_tfgrpc.roles.processes",
    "RemoteServer": "pytest_tfgrpc.hosts.cluster_spec",
    "PSCluster": "pytest_tfgrpc.ps.ps_cluster",
    # engines (write one: see the README's "Engines" section)
    "Engine": "pytest_tfgrpc.bench.engines.base",
    "EngineError": "pytest_tfgrpc.bench.engines.base",
    "Measured": "pytest_tfgrpc.bench.engines.base",
    "PSVariable": "pytest_tfgrpc.bench.engines.base",
    "Provision": "pytest_tfgrpc.bench.engines.base",
    "EngineRegistry": "pytest_tfgrpc.bench.engines.registry",
    # payloads
    "Payload": "pytest_tfgrpc.wire.schemes",
    "Tensor": "pytest_tfgrpc.wire.tensors",
}

if TYPE_CHECKING:
    from pytest_tfgrpc.bench.driver import Driver as Driver
    from pytest_tfgrpc.bench.engines.base import Engine as Engine
    from pytest_tfgrpc.bench.engines.base import EngineError as EngineError
    from pytest_tfgrpc.bench.engines.base import Measured as Measured
    from pytest_tfgrpc.bench.engines.base import Provision as Provision
    from pytest_tfgrpc.bench.engines.base import PSVariable as PSVariable
    from pytest_tfgrpc.bench.engines.registry import EngineRegistry as EngineRegistry
    from pytest_tfgrpc.bench.ps import AggregateError as AggregateError
    from pytest_tfgrpc.bench.ps import PSResult as PSResult
    from pytest_tfgrpc.bench.ps import check_aggregate as check_aggregate
    from pytest_tfgrpc.bench.timing import RunSpec as RunSpec
    from pytest_tfgrpc.hosts.cluster_spec import RemoteServer as RemoteServer
    from pytest_tfgrpc.model.analytic import HostCosts as HostCosts
    from pytest_tfgrpc.model.analytic import LinkFit as LinkFit
    from pytest_tfgrpc.model.analytic import StepPrediction as StepPrediction
    from pytest_tfgrpc.model.placement import Placement as Placement
    from pytest_tfgrpc.model.placement import Topology as Topology
    from pytest_tfgrpc.model.placement import place_profile as place_profile
    from pytest_tfgrpc.model.profiles import Profile as Profile
    from pytest_tfgrpc.model.profiles import TensorSpec as TensorSpec
    from pytest_tfgrpc.model.profiles import list_profiles as list_profiles
    from pytest_tfgrpc.model.profiles import load_profile as load_profile
    from pytest_tfgrpc.ps.ps_cluster import PSCluster as PSCluster
    from pytest_tfgrpc.report.budget import Budget as Budget
    from pytest_tfgrpc.report.budget import BudgetError as BudgetError
    from pytest_tfgrpc.report.budget import BudgetExceeded as BudgetExceeded
    from pytest_tfgrpc.report.budget import assert_budget as assert_budget
    from pytest_tfgrpc.results import BenchmarkResult as BenchmarkResult
    from pytest_tfgrpc.results import CpuTime as CpuTime
    from pytest_tfgrpc.results import Figure as Figure
    from pytest_tfgrpc.results import SizeResult as SizeResult
    from pytest_tfgrpc.roles.processes import ServerProcess as ServerProcess
    from pytest_tfgrpc.stats.sketch import Sketch as Sketch
    from pytest_tfgrpc.stats.summary import Summary as Summary
    from pytest_tfgrpc.wire.fabric import Fabric as Fabric
    from pytest_tfgrpc.wire.fabric import FabricError as FabricError
    from pytest_tfgrpc.wire.schemes import Payload as Payload
    from pytest_tfgrpc.wire.tensors import Tensor as Tensor

    __version__: str

__all__ = ["__version__", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            value: Any = version("pytest-tfgrpc")
        except PackageNotFoundError:  # a source tree that is not installed
            value = "0.0.0"
    elif name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
