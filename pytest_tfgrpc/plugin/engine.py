"""Which measuring engine a test uses: the ``tfgrpc_engine`` marker, fixture and option
(the option and markers are registered in ``options``, the fixtures in ``fixtures``; this
module is imported only once the plugin is awake).

* ``--tfgrpc-engine=native``: the run's default engine, for the ``tensor_server`` fixture's
  server and the P2P benchmarks' clients (default ``grpcio``).
* ``@pytest.mark.tfgrpc_engine(engines=["grpcio", "native"])``: the test runs once per engine,
  the engine a part of its id (``test_x[lo-native]``), both sides on that engine.
* ``@pytest.mark.tfgrpc_engine(server="native")``: pins the fixture's server, whatever the
  client; a driver call's ``engine=`` pins its client. Any mix can be measured.
* The ``tfgrpc_engine`` fixture: the engine of this test (run).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from pytest_tfgrpc.bench.streams import check_streams
from pytest_tfgrpc.native import ENGINES, NativeNotBuilt
from pytest_tfgrpc.plugin.options import option
from pytest_tfgrpc.servers.native_server import check_engine, start_tensor_server
from pytest_tfgrpc.servers.processes import ServerProcess
from pytest_tfgrpc.wire.fabric import Fabric


def default_streams(config: pytest.Config) -> int:
    """The run's default stream count: ``--tfgrpc-streams`` (checked as it is parsed), else
    its ini twin, else 1."""
    raw = option(config, "tfgrpc_streams")
    if raw is None:
        return 1
    try:
        return check_streams(int(raw))
    except ValueError as exc:
        pytest.fail(f"tfgrpc_streams (ini) = {raw!r}: {exc}", pytrace=False)


def streams_of(request: pytest.FixtureRequest) -> int:
    """The test's default stream count: its ``tfgrpc_streams(n)`` marker, else the run's."""
    marker = request.node.get_closest_marker("tfgrpc_streams")
    if marker is None:
        return default_streams(request.config)
    if len(marker.args) != 1 or marker.kwargs:
        pytest.fail(
            f"{request.node.nodeid}: tfgrpc_streams takes one count, e.g. tfgrpc_streams(2)", False
        )
    try:
        return check_streams(marker.args[0])
    except ValueError as exc:
        pytest.fail(f"{request.node.nodeid}: tfgrpc_streams: {exc}", pytrace=False)


def default_engine(config: pytest.Config) -> str:
    """The run's default engine: ``--tfgrpc-engine``, else its ini twin, else grpcio."""
    raw = option(config, "tfgrpc_engine")
    if raw is None:
        return "grpcio"
    try:
        return check_engine(raw)
    except ValueError as exc:
        pytest.fail(f"tfgrpc_engine (ini) = {raw!r}: {exc}", pytrace=False)


def _marker_kwargs(marker: pytest.Mark, where: str) -> Mapping[str, object]:
    unknown = set(marker.kwargs) - {"server", "engines"}
    if marker.args or unknown:
        given = ", ".join([*map(repr, marker.args), *sorted(unknown)])
        raise ValueError(
            f"{where}: tfgrpc_engine takes only engines=... and server=..., got {given}"
        )
    return marker.kwargs


def _engines(value: object, where: str) -> list[str]:
    if isinstance(value, str) or not isinstance(value, Sequence) or not value:
        raise ValueError(
            f"{where}: tfgrpc_engine(engines={value!r}): a non-empty list such as {list(ENGINES)!r}"
        )
    try:
        engines = [check_engine(engine, "tfgrpc_engine(engines=[...]) entry") for engine in value]
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    if len(set(engines)) != len(engines):
        raise ValueError(f"{where}: tfgrpc_engine(engines={value!r}) names an engine twice")
    return engines


def parametrize_engines(metafunc: pytest.Metafunc) -> None:
    """Run a test marked ``tfgrpc_engine(engines=[...])`` once per engine.

    A bad marker is a collection error naming the test and the value.
    """
    marker = metafunc.definition.get_closest_marker("tfgrpc_engine")
    if marker is None:
        return
    where = metafunc.definition.nodeid
    kwargs = _marker_kwargs(marker, where)
    if "engines" not in kwargs:
        return
    engines = _engines(kwargs["engines"], where)
    if "tfgrpc_engine" in metafunc.fixturenames:
        metafunc.parametrize("tfgrpc_engine", engines, ids=engines, indirect=True)


def engine_of(request: pytest.FixtureRequest) -> str:
    """The engine of this test: its ``tfgrpc_engine(engines=...)`` run's, or the run's default."""
    param = getattr(request, "param", None)
    return str(param) if param is not None else default_engine(request.config)


def server_engine(node: pytest.Item, engine: str) -> str:
    """The fixture server's engine: the marker's ``server=``, else the test's ``engine``."""
    marker = node.get_closest_marker("tfgrpc_engine")
    if marker is None:
        return engine
    try:
        server = _marker_kwargs(marker, node.nodeid).get("server")
        return engine if server is None else check_engine(server, "tfgrpc_engine(server")
    except ValueError as exc:
        pytest.fail(f"{node.nodeid}: {exc}" if node.nodeid not in str(exc) else str(exc), False)


def start_server(
    node: pytest.Item,
    fabric: Fabric,
    env: Mapping[str, str] | None,
    engine: str,
    max_tensor_bytes: int | None = None,
) -> ServerProcess:
    """The ``tensor_server`` fixture's server on this host, of ``engine`` (the test's, or its
    marker's ``server=``: :func:`server_engine`), refusing tensors over ``max_tensor_bytes``
    (None: gRPC's largest); a native engine that is not built fails the test with the
    command that builds it."""
    try:
        return start_tensor_server(
            fabric, engine=engine, env=env, max_tensor_bytes=max_tensor_bytes
        )
    except NativeNotBuilt as exc:
        pytest.fail(f"{node.nodeid}: a native tensor server: {exc}", pytrace=False)
