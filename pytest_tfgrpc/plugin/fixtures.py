"""The fixtures: ``tfgrpc_fabric`` (and ``fabric``), ``tfgrpc_engine``, ``tfgrpc_streams``,
``tensor_server``, ``ps_cluster``, ``tfgrpc``. Defined in every run (pytest must know them to
collect), they import the machinery they hand out only when a test requests them."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, NoReturn

import pytest

from pytest_tfgrpc.plugin.activation import activate

if TYPE_CHECKING:
    from pytest_tfgrpc.bench.driver import Driver
    from pytest_tfgrpc.bench.engines import Engine, EngineCluster, EngineServer
    from pytest_tfgrpc.hosts.cluster_spec import RemoteServer
    from pytest_tfgrpc.results import BenchmarkResult
    from pytest_tfgrpc.wire.fabric import Fabric

#: Long sweeps say where they are: a line once a test has run this long, then as often.
PROGRESS_EVERY_S = 5.0


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
def tfgrpc_engine(request: pytest.FixtureRequest) -> Engine:
    """The engine this test measures with (see ``tfgrpc_engines``); an engine that cannot run
    here (its library missing, the native engine not built) skips the test with the engine's
    reason."""
    from pytest_tfgrpc.plugin.engines import engine_for, engines_of

    session = activate(request.config)
    name = getattr(request, "param", None)
    if name is None:
        name = engines_of(request.config, request.node)[0]
    return engine_for(session.registry(request.config), name, request.node.nodeid)


@pytest.fixture
def tfgrpc_streams(request: pytest.FixtureRequest) -> int:
    """The test's default stream count: its ``tfgrpc_streams(n)`` marker, else
    ``--tfgrpc-streams``, else 1."""
    from pytest_tfgrpc.plugin.streams import streams_of

    activate(request.config)
    return streams_of(request)


@pytest.fixture
def fabric(tfgrpc_fabric: Fabric) -> Fabric:
    """The fabric of this test run: interface name, the address it binds to, its family.
    A project's own ``fabric`` fixture overrides this one; the plugin then uses
    ``tfgrpc_fabric`` and parametrizes only that."""
    return tfgrpc_fabric


def _engine_failed(nodeid: str, name: str, error: Exception) -> NoReturn:
    """Fail the test's setup with ``error`` of engine ``name``: one line, the engine named
    once, without the chain of the exception being handled."""
    detail = str(error).removeprefix(f"engine {name!r}: ")
    raise pytest.fail.Exception(f"{nodeid}: engine {name!r}: {detail}", pytrace=False) from None


@pytest.fixture
def tensor_server(
    request: pytest.FixtureRequest, tfgrpc_fabric: Fabric, tfgrpc_engine: Engine
) -> Iterator[EngineServer | RemoteServer]:
    """A server of the test's engine in its own process(es), bound to ``fabric``: ``.target``,
    ``.fabric``, ``.pid``. Stopped when the test ends; if it dies during the test, the test
    fails. Its engine is the test's (``tfgrpc_engine``), or the ``tfgrpc_engines`` marker's
    ``server=``. With node agents (``--tfgrpc-agents``; grpcio engine), started on the first
    agent's host reached through ``fabric``; with a cluster spec (grpcio engine), the spec's
    server reached through ``fabric`` on another host. The plugin's own servers take no
    tensor larger than the test's ``message_profile`` sizes."""
    from pytest_tfgrpc.bench.engines import EngineError
    from pytest_tfgrpc.bench.engines.grpcio import LoopEngine
    from pytest_tfgrpc.hosts.cluster_spec import ClusterSpecError, RemoteServer, server_task_for
    from pytest_tfgrpc.plugin.agents import placed_tensor_server
    from pytest_tfgrpc.plugin.engines import engine_for, server_engine_of
    from pytest_tfgrpc.plugin.markers import item_specs, watched_key
    from pytest_tfgrpc.roles.processes import ServerError
    from pytest_tfgrpc.tuning.cpus import CpuError, pin_server, release_server

    fabric = tfgrpc_fabric
    session = activate(request.config)
    try:
        name = server_engine_of(request.node, tfgrpc_engine.name)
    except pytest.UsageError as exc:
        pytest.fail(str(exc), pytrace=False)
    engine = tfgrpc_engine
    if name != engine.name:
        engine = engine_for(session.registry(request.config), name, request.node.nodeid)
    # The server takes no tensor larger than the test needs (its message_profile marker's
    # largest size; without one, the largest gRPC carries): a stray request cannot make it
    # allocate more.
    messages = item_specs(request.node).messages
    need = max(messages.sizes) if messages is not None and messages.sizes else None
    with placed_tensor_server(request, fabric, session.server_env, engine.name, need) as placed:
        if placed is not None:
            request.node.stash.setdefault(watched_key, []).append(placed)
            yield placed
            return
    if session.cluster is not None and engine.name == "grpcio":
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
    try:
        if isinstance(engine, LoopEngine):  # the plugin's own servers take the limit
            server: EngineServer = engine.start_server(fabric, session.server_env, need)
        else:
            server = engine.start_server(fabric, session.server_env)
    except (EngineError, ServerError) as exc:
        _engine_failed(request.node.nodeid, engine.name, exc)
    started.append(server)
    # On the server side of the run's CPU placement (--tfgrpc-cpus), for its lifetime, when it
    # is a local process (.pid); results record whether it was.
    pid = getattr(server, "pid", None)
    try:
        pin_server(pid, who=f"the {engine.name} tensor server")
    except CpuError as exc:
        server.stop()
        started.remove(server)
        pytest.fail(f"{request.node.nodeid}: {exc}", pytrace=False)
    request.node.stash.setdefault(watched_key, []).append(server)
    try:
        yield server
    finally:
        release_server(pid)
        server.stop()
        if server in started:
            started.remove(server)


@pytest.fixture
def ps_cluster(
    request: pytest.FixtureRequest, tfgrpc_fabric: Fabric, tfgrpc_engine: Engine
) -> Iterator[EngineCluster]:
    """Parameter-server tasks (and workers) of the test's engine bound to ``fabric``, as the
    test's ``ps_topology`` marker declares (default: 1 PS, 1 worker); with node agents
    (``--tfgrpc-agents``; grpcio engine), on the agents' hosts. Stopped when the test ends; if
    one of its processes dies during the test, the test fails. The plugin's own PS tasks take
    no message larger than the test needs."""
    from pytest_tfgrpc.bench.engines import EngineError
    from pytest_tfgrpc.bench.engines.grpcio import LoopEngine
    from pytest_tfgrpc.bench.fit import MAX_SWEEP_BYTES
    from pytest_tfgrpc.model.placement import placed_on
    from pytest_tfgrpc.plugin.agents import cluster_launchers
    from pytest_tfgrpc.plugin.markers import item_specs, watched_key
    from pytest_tfgrpc.ps.ps_cluster import PSCluster
    from pytest_tfgrpc.roles.processes import ServerError

    fabric = tfgrpc_fabric
    session = activate(request.config)
    specs = item_specs(request.node)
    topology = specs.topology
    # PS tasks take no message larger than the test needs: its largest size, or with a model
    # profile the most bytes one PS owns (a throughput call sends them in one message).
    need = None
    if specs.messages is not None and specs.messages.profile is not None:
        # sync_sgd_step's fit pushes up to MAX_SWEEP_BYTES to PS 0, whatever the profile
        by_ps = placed_on(specs.messages.profile, topology).bytes_per_ps()
        need = max(*by_ps, MAX_SWEEP_BYTES)
    elif specs.messages is not None and specs.messages.sizes:
        need = max(specs.messages.sizes)
    placed = cluster_launchers(request, fabric, topology, tfgrpc_engine.name)
    if placed and not isinstance(tfgrpc_engine, LoopEngine):
        pytest.fail(
            f"{request.node.nodeid}: engine {tfgrpc_engine.name!r}: node agents run only the "
            "plugin's own PS tasks; drop --tfgrpc-agents or the engine",
            pytrace=False,
        )
    try:
        if placed:
            cluster: EngineCluster = PSCluster(
                fabric,
                topology,
                env=session.server_env,
                max_tensor_bytes=need,
                workers_engine="native" if tfgrpc_engine.name == "native" else "grpcio",
                **placed,
            )
        elif isinstance(tfgrpc_engine, LoopEngine):
            cluster = tfgrpc_engine.start_cluster(fabric, topology, session.server_env, need)
        else:
            cluster = tfgrpc_engine.start_cluster(fabric, topology, session.server_env)
    except (EngineError, ServerError) as exc:
        _engine_failed(request.node.nodeid, tfgrpc_engine.name, exc)
    try:
        request.node.stash.setdefault(watched_key, []).append(cluster)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def tfgrpc(request: pytest.FixtureRequest, tfgrpc_engine: Engine, tfgrpc_streams: int) -> Driver:
    """The benchmark driver: ``p2p_latency(server, ...)``, ``p2p_bandwidth(server, ...)``,
    ``ps_throughput(cluster, ...)``, ``sync_sgd_step(cluster, ...)``."""
    from pytest_tfgrpc.bench.driver import Driver
    from pytest_tfgrpc.plugin.markers import item_specs

    item = request.node
    session = activate(request.config)
    specs = item_specs(item)

    def record(name: str, value: str) -> None:
        item.user_properties.append((name, value))

    def on_result(result: BenchmarkResult) -> None:
        request.config.hook.pytest_tfgrpc_result(item=item, result=result)

    return Driver(
        test=item.nodeid,
        messages=specs.messages,
        budget=specs.budget,
        options=session.options.merged(specs.run),
        record=record,
        progress=_progress_lines(request.config, item.nodeid),
        server_env=session.server_env,
        engine=tfgrpc_engine,
        streams=tfgrpc_streams,
        on_result=on_result,
        engines=session.registry(request.config).get,
    )


def _progress_lines(config: pytest.Config, test: str) -> Callable[[str], None] | None:
    """Where a long sweep says how far it is: a line at most every :data:`PROGRESS_EVERY_S`,
    written with output capture suspended (as pytest's live logging does) so that it shows
    whatever ``-s``/``--capture`` say: through pytest's terminal reporter, or, in a
    pytest-xdist worker (whose reporter no one sees), on the worker's stderr, which reaches the
    terminal, prefixed with the worker's id. None (no lines) under ``-q``."""
    if config.get_verbosity() < 0:
        return None
    workerinput = getattr(config, "workerinput", None)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if workerinput is None and reporter is None:
        return None
    capture = config.pluginmanager.get_plugin("capturemanager")
    last = time.monotonic()

    def write(line: str) -> None:
        if reporter is None or workerinput is not None:
            worker = workerinput.get("workerid", "?") if workerinput is not None else "?"
            os.write(2, f"tfgrpc [{worker}]: {line}\n".encode())
        else:
            reporter.write_line(f"tfgrpc: {line}")

    def progress(message: str) -> None:
        nonlocal last
        now = time.monotonic()
        if now - last < PROGRESS_EVERY_S:
            return
        last = now
        suspended = capture.global_and_fixture_disabled() if capture else contextlib.nullcontext()
        with suspended:
            write(f"{test}: {message}")

    return progress
