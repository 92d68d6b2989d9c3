"""The fixtures: ``fabric``, ``tensor_server``, ``ps_cluster`` and ``tfgrpc``. Defined in
every run (pytest must know them to collect), they import the machinery they hand out only
when a test requests them."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

from pytest_tfgrpc.plugin.activation import activate

if TYPE_CHECKING:
    from pytest_tfgrpc.bench.driver import Driver
    from pytest_tfgrpc.servers.cluster_spec import RemoteServer
    from pytest_tfgrpc.servers.processes import ServerProcess
    from pytest_tfgrpc.servers.ps_cluster import PSCluster
    from pytest_tfgrpc.wire.fabric import Fabric

#: Long sweeps say where they are: a line once a test has run this long, then as often.
PROGRESS_EVERY_S = 10.0


@pytest.fixture
def tfgrpc_fabric(request: pytest.FixtureRequest) -> Fabric:
    """The fabric of this test run (the plugin's own name for ``fabric``, which a project
    may define for itself): interface name, the address it binds to, its family."""
    from pytest_tfgrpc.wire.fabric import Fabric

    param = getattr(request, "param", None)
    if isinstance(param, Fabric):
        return param
    return activate(request.config).fabrics[0]


@pytest.fixture
def fabric(tfgrpc_fabric: Fabric) -> Fabric:
    """The fabric of this test run: interface name, the address it binds to, its family.
    A project's own ``fabric`` fixture overrides this one; the plugin then uses
    ``tfgrpc_fabric`` and parametrizes only that."""
    return tfgrpc_fabric


@pytest.fixture
def tensor_server(
    request: pytest.FixtureRequest, tfgrpc_fabric: Fabric
) -> Iterator[ServerProcess | RemoteServer]:
    """A tensor server in its own process, bound to ``fabric``: ``.target``, ``.fabric``,
    ``.pid``. Stopped when the test ends; if it dies during the test, the test fails.
    With a cluster spec, the spec's server reached through ``fabric`` on another host."""
    from pytest_tfgrpc.plugin.markers import item_specs, watched_key
    from pytest_tfgrpc.servers.cluster_spec import ClusterSpecError, RemoteServer, server_task_for
    from pytest_tfgrpc.servers.processes import ServerProcess

    fabric = tfgrpc_fabric
    session = activate(request.config)
    if session.cluster is not None:
        try:
            remote = RemoteServer(server_task_for(session.cluster, fabric), fabric)
            remote.check_reachable()
        except ClusterSpecError as exc:
            problem = str(exc)
        else:
            yield remote
            return
        pytest.fail(problem, pytrace=False)
    started = session.servers
    # The server takes no tensor larger than the test needs (its message_profile marker's
    # largest size; without one, the largest gRPC carries): a stray request cannot make it
    # allocate more.
    messages = item_specs(request.node).messages
    need = max(messages.sizes) if messages is not None and messages.sizes else None
    server = ServerProcess.start(fabric, env=session.server_env, max_tensor_bytes=need)
    started.append(server)
    request.node.stash.setdefault(watched_key, []).append(server)
    try:
        yield server
    finally:
        server.stop()
        if server in started:
            started.remove(server)


@pytest.fixture
def ps_cluster(request: pytest.FixtureRequest, tfgrpc_fabric: Fabric) -> Iterator[PSCluster]:
    """Parameter-server processes and worker processes bound to ``fabric``, as the test's
    ``ps_topology`` marker declares (default: 1 PS, 1 worker). Stopped when the test ends;
    if one of its processes dies during the test, the test fails."""
    from pytest_tfgrpc.bench.fit import MAX_SWEEP_BYTES
    from pytest_tfgrpc.model.placement import placed_on
    from pytest_tfgrpc.plugin.markers import item_specs, watched_key
    from pytest_tfgrpc.servers.ps_cluster import PSCluster

    fabric = tfgrpc_fabric
    session = activate(request.config)
    specs = item_specs(request.node)
    topology = specs.topology
    # PS tasks take no message larger than the test needs: its largest size, or with a model
    # profile the most bytes one PS owns (a throughput call sends them in one message).
    need = None
    if specs.messages is not None and specs.messages.profile is not None:
        # sync_sgd_step's fit pushes up to MAX_SWEEP_BYTES to PS 0, whatever the profile
        placed = placed_on(specs.messages.profile, topology).bytes_per_ps()
        need = max(*placed, MAX_SWEEP_BYTES)
    elif specs.messages is not None and specs.messages.sizes:
        need = max(specs.messages.sizes)
    with PSCluster(fabric, topology, env=session.server_env, max_tensor_bytes=need) as cluster:
        request.node.stash.setdefault(watched_key, []).append(cluster)
        yield cluster


@pytest.fixture
def tfgrpc(request: pytest.FixtureRequest) -> Driver:
    """The benchmark driver: ``p2p_latency(server, ...)``, ``p2p_bandwidth(server, ...)``,
    ``ps_throughput(cluster, ...)``, ``sync_sgd_step(cluster, ...)``."""
    from pytest_tfgrpc.bench.driver import Driver
    from pytest_tfgrpc.plugin.markers import item_specs

    item = request.node
    session = activate(request.config)
    specs = item_specs(item)

    def record(name: str, value: str) -> None:
        item.user_properties.append((name, value))

    return Driver(
        test=item.nodeid,
        messages=specs.messages,
        budget=specs.budget,
        options=session.options.merged(specs.run),
        record=record,
        progress=_progress_lines(request.config, item.nodeid),
        server_env=session.server_env,
    )


def _progress_lines(config: pytest.Config, test: str) -> Callable[[str], None] | None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or hasattr(config, "workerinput"):
        return None
    last = time.monotonic()

    def progress(message: str) -> None:
        nonlocal last
        now = time.monotonic()
        if now - last >= PROGRESS_EVERY_S:
            reporter.write_line(f"tfgrpc: {test}: {message}")
            last = now

    return progress
