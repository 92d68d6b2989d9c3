"""The ``tfgrpc_engine`` marker: which engine's tensor server the ``tensor_server`` fixture runs.

``@pytest.mark.tfgrpc_engine(server="native")`` starts the C++ server (``tfgrpc-build-native``
builds it) instead of the Python one; the measuring client's engine is the driver call's
``engine=`` argument, so any mix can be measured.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from pytest_tfgrpc.native import NativeNotBuilt
from pytest_tfgrpc.servers.native_server import ENGINES, check_engine, start_tensor_server
from pytest_tfgrpc.servers.processes import ServerProcess
from pytest_tfgrpc.wire.fabric import Fabric

OPTION_HELP = (
    "the engine of tensor_server fixtures and of the p2p benchmarks' clients where a test does "
    "not say: grpcio (Python, the default) or native (C++; build it with tfgrpc-build-native)"
)

MARKER = (
    "tfgrpc_engine(server='grpcio'): the engine of the tensor_server fixture's server: "
    "'grpcio' (Python) or 'native' (C++, built by tfgrpc-build-native)."
)


def add_option(group: pytest.OptionGroup) -> None:
    """``--tfgrpc-engine``: the run's default engine."""
    group.addoption(
        "--tfgrpc-engine", dest="tfgrpc_engine", choices=ENGINES, default="grpcio", help=OPTION_HELP
    )


def default_engine(config: pytest.Config) -> str:
    """The run's default engine (``--tfgrpc-engine``)."""
    return str(config.getoption("tfgrpc_engine", "grpcio"))


def server_engine(node: pytest.Item) -> str:
    """The server engine the test's ``tfgrpc_engine`` marker asks for, else the run's."""
    marker = node.get_closest_marker("tfgrpc_engine")
    if marker is None:
        return default_engine(node.config)
    unknown = set(marker.kwargs) - {"server"}
    if marker.args or unknown:
        pytest.fail(
            f"{node.nodeid}: tfgrpc_engine takes only server=..., got "
            f"{', '.join([*map(repr, marker.args), *sorted(unknown)])}",
            pytrace=False,
        )
    try:
        server = marker.kwargs.get("server", default_engine(node.config))
        return check_engine(server, "tfgrpc_engine(server")
    except ValueError as exc:
        pytest.fail(f"{node.nodeid}: {exc}", pytrace=False)


def start_server(node: pytest.Item, fabric: Fabric, env: Mapping[str, str] | None) -> ServerProcess:
    """The ``tensor_server`` fixture's server, of the marker's engine; a native engine that is
    not built fails the test with the command that builds it."""
    engine = server_engine(node)
    try:
        return start_tensor_server(fabric, engine=engine, env=env)
    except NativeNotBuilt as exc:
        pytest.fail(f"{node.nodeid}: a native tensor server: {exc}", pytrace=False)
