"""The plugin's hooks: what a ``conftest.py`` or another package can add to a tfgrpc run.

Registered with ``pytest_addhooks``; implement them as functions named like these in a
conftest or a plugin module. Nothing here is called until a run uses the plugin.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pytest_tfgrpc.bench.engines import EngineRegistry
    from pytest_tfgrpc.results import BenchmarkResult


def pytest_tfgrpc_add_engines(registry: EngineRegistry, config: pytest.Config) -> None:
    """Register engines: ``registry.add(MyEngine())``, or ``registry.add(factory, "name")`` to
    build it only when a test selects it. Called once, after collection (so any conftest may
    implement it); the plugin's own ``grpcio``, ``native`` and ``tensorflow`` engines are
    registered here too. A name registered twice is a usage error naming it.
    """


@pytest.hookspec(firstresult=True)
def pytest_tfgrpc_engines(config: pytest.Config, item: pytest.Item) -> Sequence[str] | None:
    """The names of the engines a test runs with, in order; the first non-None answer wins.

    The plugin's own answer (called last) is the test's ``tfgrpc_engines(...)`` marker, else
    ``--tfgrpc-engines``, else ``["grpcio"]``. With several engines the test runs once per
    engine, the name a test id part (``test_x[lo-grpcio]``, ``test_x[lo-tensorflow]``).
    ``item`` is the test's definition at collection.
    """


def pytest_tfgrpc_run_metadata(config: pytest.Config) -> Mapping[str, str] | None:
    """Run metadata to record, ``{key: value}`` strings (e.g. ``{"commit": "4f2a9c1",
    "nic_firmware": "20.31.1014"}``). Each lands in the JUnit suite properties as
    ``tfgrpc.meta.extra.<key>``, and the baseline gate checks it like the host and the grpcio
    version: a baseline recorded with another value is a setup mismatch. Keys are
    identifiers or dotted identifiers; two implementations giving one key is a usage error.
    Called when the run first uses the plugin, which may be before collection: implement it in
    a plugin or the rootdir's ``conftest.py`` (as ``pytest_addoption``), not a subdirectory's.
    """


def pytest_tfgrpc_result(item: pytest.Item, result: BenchmarkResult) -> None:
    """Called with every result a test records, once its JUnit properties are written and
    before its budget is checked (so a result over budget is seen too). The engine that
    measured it is ``result.settings["engine"]``; its figures are
    ``point.figures()`` for each ``point`` in ``result.sizes``. E.g. push it to a dashboard.
    """
