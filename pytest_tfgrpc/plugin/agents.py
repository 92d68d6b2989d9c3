"""Node agents, cluster specs and honest paths, for the fixtures and the session.

``--tfgrpc-agents WHERE`` (registered with the other options in :mod:`.options`) says where
the node agents (``tfgrpc-node``) are: ``cluster`` (the ``ps`` and ``worker`` tasks of the
cluster spec are agents), ``slurm`` (an agent on every other node of the allocation), or
``HOST:PORT,...``. With agents, the ``tensor_server`` and ``ps_cluster`` fixtures start their
processes on those hosts (:func:`server_launchers`, :func:`cluster_launchers`), and every
test records where each process ran (``tfgrpc.placement``) and whether its traffic crossed the
fabric or stayed in the host (``tfgrpc.path``): a server and its client on one host talk
through loopback whatever the fabric's name, and the summary says so.

Imported only once a run uses the plugin (it imports grpc): by ``session`` and the fixtures.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict

import pytest

from pytest_tfgrpc.hosts.agent import engine_missing, read_token, tls_mismatch
from pytest_tfgrpc.hosts.agent_client import (
    AGENT_TIMEOUT_S,
    AgentClient,
    AgentError,
    AgentLauncher,
    AgentTLS,
)
from pytest_tfgrpc.hosts.cluster_spec import (
    ClusterLoad,
    ClusterSpecError,
    load_cluster,
    load_cluster_spec,
    route_device,
    server_task_for,
    split_address,
    task_device,
)
from pytest_tfgrpc.hosts.names import HostNotReached, Resolver, listening_address, system_addresses
from pytest_tfgrpc.hosts.slurm import SlurmError, agent_addresses
from pytest_tfgrpc.model.placement import Topology
from pytest_tfgrpc.plugin.options import TLS_HELP, option
from pytest_tfgrpc.report.record import PATH, PLACEMENT, path_value, placement_value
from pytest_tfgrpc.roles.processes import Launcher
from pytest_tfgrpc.wire.fabric import Fabric
from pytest_tfgrpc.wire.security import tls_mode

if TYPE_CHECKING:
    from pytest_tfgrpc.bench.engines import EngineServer

__all__ = [
    "agents_in_use",
    "close_agents",
    "cluster_launchers",
    "cluster_of",
    "header_lines",
    "record_server",
    "server_launchers",
]


class ClusterPlacement(TypedDict, total=False):
    """Where a cluster's processes run (fields of a ``Provision``); empty: all here."""

    ps_launchers: tuple[Launcher, ...]
    worker_launchers: tuple[Launcher, ...]


@dataclass
class _Agents:
    """The agents of the run: addresses for PS (and tensor servers) and for workers; clients
    are made on first use (a run that needs none never connects)."""

    source: str
    ps: tuple[str, ...]
    workers: tuple[str, ...]
    token_file: str | None
    problem: str | None = None
    tls_files: tuple[str | None, str | None, str | None] = (None, None, None)
    clients: dict[str, AgentClient] = field(default_factory=dict)
    routes: dict[str, str | None] = field(default_factory=dict)
    #: How agents' names become addresses (tests inject one).
    resolver: Resolver = system_addresses

    def client(self, address: str) -> AgentClient:
        client = self.clients.get(address)
        if client is not None and client.lost is None:
            return client
        if client is not None:
            client.close()
        where = f"agent {address} (from {self.source})"
        try:
            host, zone, port = split_address(address, where)
        except ClusterSpecError as exc:
            raise AgentError(f"{where}: {exc}") from None
        token = read_token(self.token_file, os.environ, "--tfgrpc-agent-token-file")
        ca, cert, key = self.tls_files
        tls = AgentTLS.from_files(ca, cert, key) if ca else None
        if tls is None and cert:
            raise ValueError("--tfgrpc-agent-tls-cert needs --tfgrpc-agent-tls-ca")
        try:
            # Every address of the name, waiting (as AgentClient waits for an agent that does
            # not listen yet) for a name that does not resolve yet.
            scoped = listening_address(
                f"{host}%{zone}" if zone else host, port, AGENT_TIMEOUT_S, resolver=self.resolver
            )
        except HostNotReached as exc:
            raise AgentError(f"{where}: {exc}; is tfgrpc-node running there?") from None
        ip = scoped.partition("%")[0]
        target = f"[{ip}{'%' + zone if zone else ''}]:{port}" if ":" in ip else f"{ip}:{port}"
        client = AgentClient(target, token, tls=tls)
        self.clients[address] = client
        self.routes[address] = zone or route_device(ip)
        return client

    def reachable(
        self, addresses: Sequence[str], fabric: Fabric, needed: int | None = None
    ) -> list[AgentClient]:
        """Clients of ``addresses`` this host reaches through ``fabric``, in order: the first
        ``needed`` of them (all when ``None``). Agents after those are not contacted, so an
        agent that died earlier in the run fails only the tests that need its host."""
        found: list[AgentClient] = []
        for address in addresses:
            if needed is not None and len(found) >= needed:
                break
            client = self.client(address)
            if self.routes[address] == fabric.name:
                found.append(client)
        if not found:
            seen = ", ".join(f"{a} via {self.routes.get(a) or 'no route'}" for a in addresses)
            raise AgentError(f"no agent from {self.source} is reached through fabric "
                             f"{fabric.name!r} ({seen})")  # fmt: skip
        return found

    def close(self) -> None:
        for client in self.clients.values():
            client.close()
        self.clients.clear()


_cluster_key = pytest.StashKey[ClusterLoad]()
_agents_key = pytest.StashKey["_Agents | None"]()


def _option(config: pytest.Config, name: str) -> str | None:
    value = option(config, name)
    return str(value) if value else None


def cluster_of(config: pytest.Config) -> ClusterLoad:
    """The run's cluster spec of tensor servers (``--tfgrpc-cluster``, else ``TF_CONFIG``), read
    once, leniently; none when the spec names agents instead (``--tfgrpc-agents=cluster``)."""
    if _cluster_key not in config.stash:
        if _option(config, "tfgrpc_agents") == "cluster":
            load = ClusterLoad()  # its tasks are agents: see _agents_of
        else:
            load = load_cluster(_option(config, "tfgrpc_cluster"), os.environ)
        config.stash[_cluster_key] = load
    return config.stash[_cluster_key]


def _agents_of(config: pytest.Config) -> _Agents | None:
    if _agents_key in config.stash:
        return config.stash[_agents_key]
    where = _option(config, "tfgrpc_agents")
    token_file = _option(config, "tfgrpc_agent_token_file")
    agents: _Agents | None = None
    if where == "cluster":
        # Unresolved: agents' names (a TFJob's services) are resolved when first dialled.
        spec, problem = None, None
        try:
            spec = load_cluster_spec(_option(config, "tfgrpc_cluster"), os.environ, resolve=False)
        except ClusterSpecError as exc:
            problem = f"--tfgrpc-agents=cluster: {exc}"
        if spec is None and problem is None:
            problem = "--tfgrpc-agents=cluster: no cluster spec (--tfgrpc-cluster or TF_CONFIG)"
        ps = tuple(t.address for t in spec.job("ps")) if spec else ()
        workers = tuple(t.address for t in spec.job("worker")) if spec else ()
        agents = _Agents(spec.source if spec else "cluster", ps, workers or ps, token_file, problem)
    elif where == "slurm":
        try:
            pool = agent_addresses(os.environ)
        except SlurmError as exc:
            agents = _Agents("SLURM", (), (), token_file, f"--tfgrpc-agents=slurm: {exc}")
        else:
            agents = _Agents("SLURM", pool, pool, token_file)
    elif where:
        pool = tuple(part.strip() for part in where.split(",") if part.strip())
        agents = _Agents("--tfgrpc-agents", pool, pool, token_file)
    if agents is not None:
        agents.tls_files = agent_tls_files(config)
    config.stash[_agents_key] = agents
    return agents


def agents_source(config: pytest.Config) -> str | None:
    """Where the run's agents come from, as the user named them (``--tfgrpc-agents``, a
    cluster spec, ``SLURM``), or None when the run uses none."""
    agents = _agents_of(config)
    return agents.source if agents is not None else None


def agent_tls_files(config: pytest.Config) -> tuple[str | None, str | None, str | None]:
    """The (CA, certificate, key) files for talking to the agents: the
    ``--tfgrpc-agent-tls-*`` options when any is given; else the run's own
    ``--tfgrpc-tls-*`` files when they name a CA (what the agents are verified with), so one
    set of files secures the servers and the agents alike; else none (plaintext)."""
    own = tuple(_option(config, f"tfgrpc_agent_tls_{name}") for name in TLS_HELP)
    if any(own):
        return own  # type: ignore[return-value]
    general = tuple(_option(config, f"tfgrpc_tls_{name}") for name in TLS_HELP)
    return general if general[0] else (None, None, None)  # type: ignore[return-value]


def close_agents(config: pytest.Config) -> None:
    """Close the run's connections to agents (their leases then end the processes left)."""
    agents = config.stash.get(_agents_key, None)
    if agents is not None:
        agents.close()


def header_lines(config: pytest.Config) -> list[str]:
    """The header lines about the cluster spec (ignored TF_CONFIG forms, a spec that cannot
    be used) and the agents (where they are, or why tests that need them will fail)."""
    lines = [f"tfgrpc: TF_CONFIG {note}" for note in cluster_of(config).notes]
    problem = cluster_of(config).problem
    if problem is not None:
        lines.append(f"tfgrpc: tests that need the cluster will fail: {problem}")
    agents = _agents_of(config)
    if agents is not None:
        if agents.problem:
            lines.append(f"tfgrpc: agents: tests that need them will fail: {agents.problem}")
        else:
            pool = ", ".join(dict.fromkeys((*agents.ps, *agents.workers)))
            lines.append(f"tfgrpc: agents from {agents.source}: {pool}")
    return lines


def _record(request: pytest.FixtureRequest, name: str, value: str) -> None:
    request.node.user_properties.append((name, value))


def _fail_without(agents: _Agents) -> None:
    if agents.problem:
        pytest.fail(agents.problem, pytrace=False)


def _check_hosts(clients: Sequence[AgentClient], engine: str, roles: str) -> None:
    """Fail the test, before anything starts, when a host cannot run ``roles`` as the run
    asks: ``engine`` (grpcio or native) is not built there, or the run uses TLS and the
    agent's roles would get another mode (a role serving plaintext to a TLS client fails
    mid-test as a handshake)."""
    run_tls = tls_mode()
    for client in dict.fromkeys(clients):
        info = client.info
        if engine not in info.engines:
            pytest.fail(engine_missing(info.host, engine, roles), pytrace=False)
        if run_tls != "off" and info.tls != run_tls:
            pytest.fail(tls_mismatch(info.host, info.tls, run_tls), pytrace=False)


def _is_local(address: str) -> bool:
    """Whether ``address`` is one of this host's own (then traffic to it is loopback)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((address, 0))
        except OSError:
            return False
    return True


def agents_in_use(config: pytest.Config) -> bool:
    """Whether this run starts its servers and clusters through node agents."""
    return _agents_of(config) is not None


def server_launchers(
    request: pytest.FixtureRequest, fabric: Fabric, engine: str = "grpcio"
) -> tuple[Launcher, ...]:
    """With agents, the launcher of the first agent reached through ``fabric`` (where the
    tensor server runs; :func:`record_server` records it once started); otherwise ``()``,
    this host, and the path is recorded now. The agent's host must run ``engine``'s server
    (grpcio or native) and the run's TLS, or the test fails naming the host."""
    load = cluster_of(request.config)
    if load.problem is not None:
        pytest.fail(str(load.problem), pytrace=False)
    agents = _agents_of(request.config)
    if agents is None:
        spec = load.spec
        if spec is not None and spec.job("ps"):
            with contextlib.suppress(ClusterSpecError):
                task = server_task_for(spec, fabric)
                local = task_device(task) == "lo" or _is_local(task.host)
                path = path_value(
                    fabric.name,
                    source="this host",
                    destination=task.target,
                    loopback="" if local else None,
                )
                _record(request, PATH, path)
        else:
            why = f"(server and client on this host; {fabric.name} not crossed)"
            _record(request, PATH, path_value(fabric.name, loopback=why))
        return ()
    _fail_without(agents)
    try:
        client = agents.reachable(agents.ps, fabric, needed=1)[0]
    except (AgentError, ValueError) as exc:
        pytest.fail(str(exc), pytrace=False)
    _check_hosts([client], engine, "tensor server")
    return (client.launcher(),)


def record_server(request: pytest.FixtureRequest, server: EngineServer) -> None:
    """Record where a tensor server started through an agent runs, and its path."""
    launcher = getattr(server, "launcher", None)
    if not isinstance(launcher, AgentLauncher):
        return
    info = launcher.client.info
    _record(request, PLACEMENT, placement_value([("server", info.host, server.target)]))
    local = _is_local(info.address)
    path = path_value(
        info.fabric, source="driver", destination=info.host, loopback="" if local else None
    )
    _record(request, PATH, path)


def cluster_launchers(
    request: pytest.FixtureRequest, fabric: Fabric, topology: Topology, engine: str = "grpcio"
) -> ClusterPlacement:
    """With agents, where each PS and worker of ``topology`` runs (fields of the engine's
    :class:`~pytest_tfgrpc.bench.engines.Provision`); otherwise ``{}``, all here.

    PS ``i`` runs on the ``i``-th PS agent (cyclically), worker ``j`` on the worker agents
    after those the PS tasks took when both come from one pool, so that P + W agents give
    every process a host of its own. Records placement and path. Every host must run
    ``engine``'s PS tasks or workers and the run's TLS (see :func:`server_launchers`).
    """
    agents = _agents_of(request.config)
    if agents is None:
        why = f"(PS tasks and workers on this host; {fabric.name} not crossed)"
        _record(request, PATH, path_value(fabric.name, loopback=why))
        return {}
    _fail_without(agents)
    try:
        offset = topology.ps if agents.workers == agents.ps else 0
        ps_agents = agents.reachable(agents.ps, fabric, needed=topology.ps)
        worker_agents = agents.reachable(agents.workers, fabric, needed=offset + topology.workers)
    except (AgentError, ValueError) as exc:
        pytest.fail(str(exc), pytrace=False)
    ps = [ps_agents[i % len(ps_agents)] for i in range(topology.ps)]
    workers = [worker_agents[(offset + j) % len(worker_agents)] for j in range(topology.workers)]
    _check_hosts(ps, engine, "PS task")
    _check_hosts(workers, engine, "worker")
    placed = [(f"ps{i}", c.info.host, c.info.address) for i, c in enumerate(ps)]
    placed += [(f"worker{j}", c.info.host, c.info.address) for j, c in enumerate(workers)]
    _record(request, PLACEMENT, placement_value(placed))
    shared = sorted({c.info.host for c in ps} & {c.info.host for c in workers})
    if shared:
        why = f"between PS and workers on {', '.join(shared)}; {fabric.name} otherwise"
        path = path_value(fabric.name, loopback=why)
    else:
        path = path_value(
            ps[0].info.fabric, source="every worker", destination="PS call crosses hosts"
        )
    _record(request, PATH, path)
    return {
        "ps_launchers": tuple(c.launcher() for c in ps),
        "worker_launchers": tuple(c.launcher() for c in workers),
    }
