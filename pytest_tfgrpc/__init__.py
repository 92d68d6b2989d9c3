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
- ``metrics | runlock``: the metric registry: every figure's name, unit, direction and gate
  test; the host's measurement lock (one measurement at a time, across runs and tfgrpc-ab)
- ``stats | units | private_files | suggest | turns``: statistics of samples; units and their
  parsing; files kept in this user's private directory (the measurement lock); "did you
  mean ...?" for a mistyped name; lockstep turns between two runs (tfgrpc-ab)
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_tfgrpc.bench.allreduce import AllReduceResult as AllReduceResult
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


def _exports() -> dict[str, str]:
    """Public name -> the module that defines it: the ``if TYPE_CHECKING:`` imports above,
    read from this file, so that the public API is listed once, for type checkers and for
    :func:`__getattr__`, which resolves each on first use so that this package imports none of
    them at start-up."""
    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If)
        and isinstance(node.test, ast.Name)
        and node.test.id == "TYPE_CHECKING"
    )
    return {
        alias.asname or alias.name: node.module
        for node in block.body
        if isinstance(node, ast.ImportFrom) and node.module is not None
        for alias in node.names
    }


_EXPORTS = _exports()
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
