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


def _usable_or_fail(request: pytest.FixtureRequest, engine: Engine) -> str:
    """Fail the test before any agent is dialled or process started when the run's settings
    rule ``engine`` out, or the run starts its processes through node agents and no agent
    program runs them; the agents' programs it needs (its :attr:`~Engine.agent_roles`)."""
    from pytest_tfgrpc.bench.engines import EngineError
    from pytest_tfgrpc.plugin.agents import agents_in_use

    if agents_in_use(request.config) and engine.agent_roles is None:
        pytest.fail(
            f"{request.node.nodeid}: engine {engine.name!r} cannot start its servers through "
            "node agents (they run only the plugin's own roles and TensorFlow's tasks: the "
            "grpcio, native and tensorflow engines); drop --tfgrpc-agents or the engine",
            pytrace=False,
        )
    try:
        engine.check_usable()
    except EngineError as exc:
        _engine_failed(request.node.nodeid, engine.name, exc)
    return engine.agent_roles or ""


@pytest.fixture
def tensor_server(
    request: pytest.FixtureRequest, tfgrpc_fabric: Fabric, tfgrpc_engine: Engine
) -> Iterator[EngineServer | RemoteServer]:
    """A server of the test's engine in its own process(es), bound to ``fabric``: ``.target``,
    ``.fabric``, ``.pid``. Stopped when the test ends; if it dies during the test, the test
    fails. Its engine is the test's (``tfgrpc_engine``), or the ``tfgrpc_engines`` marker's
    ``server=``. With node agents (``--tfgrpc-agents``; grpcio, native and tensorflow engines),
    started on the first agent's host reached through ``fabric``; with a cluster spec (grpcio
    and native engines),
    the spec's server reached through ``fabric`` on another host. The plugin's own servers
    take no tensor larger than the test's ``message_profile`` sizes."""
    from pytest_tfgrpc.bench.engines import EngineError, Provision
    from pytest_tfgrpc.hosts.cluster_spec import ClusterSpecError, RemoteServer, server_task_for
    from pytest_tfgrpc.native import ENGINES
    from pytest_tfgrpc.plugin.agents import record_server, server_launchers
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
    roles = _usable_or_fail(request, engine)
    delay = session.server_delay
    if delay and not engine.injects_delay:
        pytest.fail(
            f"{request.node.nodeid}: --tfgrpc-server-delay {delay}: engine {engine.name!r}'s "
            "servers take no injected delay (the plugin's grpcio and native servers do)",
            pytrace=False,
        )
    launchers = server_launchers(request, fabric, roles)
    if not launchers and session.cluster is not None and roles in ENGINES:
        # A cluster spec names tfgrpc-server processes already running on other hosts.
        if delay:
            pytest.fail(
                f"{request.node.nodeid}: --tfgrpc-server-delay {delay}: the cluster spec's "
                "servers run elsewhere and were started without it; start them with "
                "tfgrpc-server --delay instead",
                pytrace=False,
            )
        try:
            remote = RemoteServer(server_task_for(session.cluster, fabric), fabric)
            remote.check_reachable()
        except ClusterSpecError as exc:
            problem = str(exc)
        else:
            yield remote
            return
        pytest.fail(problem, pytrace=False)
    provision = Provision(
        fabric,
        env=session.server_env,
        max_tensor_bytes=item_specs(request.node).largest_tensor,
        ps_launchers=launchers,
        delay_s=session.server_delay_s,
    )
    started = session.servers
    try:
        server = engine.start_server(provision)
    except (EngineError, ServerError) as exc:
        _engine_failed(request.node.nodeid, engine.name, exc)
    started.append(server)
    record_server(request, server)
    # On the server side of the run's CPU placement (--tfgrpc-cpus), for its lifetime, when it
    # is a process of this host (.pid); results record whether it was.
    pid = getattr(server, "pid", None) if not launchers else None
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
    (``--tfgrpc-agents``; grpcio, native and tensorflow engines), on the agents' hosts.
    Stopped when the test ends; if one of its processes dies during the test, the test fails.
    The plugin's own PS tasks take no message larger than the test needs."""
    from pytest_tfgrpc.bench.engines import EngineError, Provision
    from pytest_tfgrpc.plugin.agents import cluster_launchers
    from pytest_tfgrpc.plugin.markers import item_specs, watched_key
    from pytest_tfgrpc.roles.processes import ServerError

    session = activate(request.config)
    specs = item_specs(request.node)
    roles = _usable_or_fail(request, tfgrpc_engine)
    provision = Provision(
        tfgrpc_fabric,
        env=session.server_env,
        max_tensor_bytes=specs.largest_ps_message,
        topology=specs.topology,
        placement=specs.placement,
        **cluster_launchers(request, tfgrpc_fabric, specs.topology, roles),
    )
    try:
        cluster = tfgrpc_engine.start_cluster(provision)
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
    ``ps_throughput(cluster, ...)``, ``sync_sgd_step(cluster, ...)``,
    ``allreduce(cluster, ...)``."""
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
        run=(*session.run, specs.run),
        record=record,
        progress=_progress_lines(request.config, item.nodeid),
        server_env=session.server_env,
        engine=tfgrpc_engine,
        streams=tfgrpc_streams,
        on_result=on_result,
        engines=session.registry(request.config).get,
        test_placement=lambda: specs.placement,
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
