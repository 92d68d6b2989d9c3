"""Interop as a table: every client engine against every server engine on every call (echo,
push, pull), every PS engine with every workers' engine on the PS calls (gradient push and
weight pull, the aggregate checked), plaintext and mutual TLS, the servers started here
(``local``, on loopback) and through an agent on an emulated host (``agent``).

The engines are ``grpcio`` and ``native``. TensorFlow's engine is not a row: it serves its
own service (``GrpcWorkerService``), not the plugin's, so its interop is TensorProto both ways
with TensorFlow itself (``tests/test_tensorflow_engine.py``, where TensorFlow is installed).

Kept fast: each server is started once per module (one per place, security and engine) and
every case measures a few iterations of two sizes (one byte and a multi-chunk tensor).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType

import pytest
from test_native import MULTI_CHUNK, pki  # noqa: F401  (pki: the local PKI fixture)
from test_native_workers import assert_numpy_weights

from pytest_tfgrpc import native
from pytest_tfgrpc.bench import native_p2p, p2p
from pytest_tfgrpc.bench.p2p import BandwidthCall, LatencyCall
from pytest_tfgrpc.bench.ps import fetch_weights, sync_sgd_step
from pytest_tfgrpc.bench.timing import RunSpec
from pytest_tfgrpc.hosts.agent_client import AgentClient, AgentTLS
from pytest_tfgrpc.model.placement import Topology
from pytest_tfgrpc.model.profiles import Profile, TensorSpec
from pytest_tfgrpc.plugin.emulated import build_emulated_hosts
from pytest_tfgrpc.ps.ps_cluster import PSCluster
from pytest_tfgrpc.roles.native_server import start_tensor_server
from pytest_tfgrpc.roles.processes import LOCAL, Launcher, ServerProcess
from pytest_tfgrpc.wire.fabric import Fabric, resolve_fabric
from pytest_tfgrpc.wire.security import TlsFiles, load_tls, use_tls

pytest.importorskip("trustme")  # mutual TLS: certificates for loopback and each host
NOT_BUILT = native.unavailable_reason()
pytestmark = pytest.mark.skipif(NOT_BUILT is not None, reason=NOT_BUILT or "")

ENGINES = ("grpcio", "native")
WHERE = ("local", "agent")
SECURITY = ("plaintext", "mtls")
RUN = RunSpec(iterations=3, warmup=1, max_seconds=2.0, warmup_seconds=1.0)
SIZES = [1, MULTI_CHUNK]
CHUNK = 64 << 10  # streamed tensors in several chunks
#: Each call in both modes and both RPC shapes between its two forms.
CALLS: dict[str, tuple[LatencyCall | BandwidthCall, ...]] = {
    "echo": (
        LatencyCall(mode="raw", rpc="unary", run=RUN),
        LatencyCall(mode="protobuf", rpc="stream", run=RUN),
    ),
    "push": (
        BandwidthCall(mode="raw", rpc="stream", direction="push", chunk_bytes=CHUNK, run=RUN),
        BandwidthCall(mode="protobuf", rpc="unary", direction="push", run=RUN),
    ),
    "pull": (
        BandwidthCall(mode="raw", rpc="unary", direction="pull", run=RUN),
        BandwidthCall(mode="protobuf", rpc="stream", direction="pull", chunk_bytes=CHUNK, run=RUN),
    ),
}
STEPS = RunSpec(iterations=2, warmup=1, max_seconds=10.0, warmup_seconds=5.0)
PROFILE = Profile("tiny", (TensorSpec("w", (10, 7)), TensorSpec("b", (3,))))
LOOPS: dict[str, ModuleType] = {"grpcio": p2p, "native": native_p2p}


@dataclass(frozen=True)
class Site:
    """Where roles run: the fabric they bind, the launchers of the PS and worker hosts (the
    tensor server runs on the first), and the files of a mutual-TLS run (the client's; a
    role's environment names them, and a role on an agent's host serves its host's own)."""

    fabric: Fabric
    ps_launcher: Launcher
    worker_launcher: Launcher
    tls: TlsFiles

    def env(self, security: str) -> dict[str, str]:
        return {**os.environ, **(self.tls.env() if security == "mtls" else {})}

    @contextlib.contextmanager
    def security(self, security: str) -> Iterator[None]:
        """This process's channels (the clients, the driver's job control) for the block."""
        use_tls(load_tls(self.tls) if security == "mtls" else None)
        try:
            yield
        finally:
            use_tls(None)


@pytest.fixture(scope="module")
def sites(
    pki: dict[str, str],  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[[str], Site]]:
    """``local``: loopback, this host; ``agent``: the PS and tensor server on ``nhi0``, the
    workers on ``nhi1``, each started by its host's agent (built on first use)."""
    local = TlsFiles(cert=pki["cert"], key=pki["key"], ca=pki["ca"])
    built: dict[str, Site] = {"local": Site(resolve_fabric("lo"), LOCAL, LOCAL, local)}
    with contextlib.ExitStack() as stack:

        def site(where: str) -> Site:
            if where not in built:
                hosts = build_emulated_hosts(stack, tmp_path_factory, "nhi0,nhi1", tls=True)
                assert hosts.tls is not None and hosts.tls.ca is not None
                mine = AgentTLS.from_files(hosts.tls.ca, hosts.tls.cert, hosts.tls.key)
                ps, workers = (
                    stack.enter_context(AgentClient(target, hosts.token, tls=mine))
                    for target in hosts.agent_targets()
                )
                built[where] = Site(
                    resolve_fabric(hosts.fabric.bridge),
                    ps.launcher(),
                    workers.launcher(),
                    hosts.tls,
                )
            return built[where]

        yield site


@pytest.fixture(scope="module")
def servers(sites: Callable[[str], Site]) -> Iterator[Callable[[str, str, str], ServerProcess]]:
    """A tensor server per (place, security, engine), started on first use."""
    started: dict[tuple[str, str, str], ServerProcess] = {}
    with contextlib.ExitStack() as stack:

        def server(where: str, security: str, engine: str) -> ServerProcess:
            key = (where, security, engine)
            if key not in started:
                site = sites(where)
                started[key] = stack.enter_context(
                    start_tensor_server(
                        site.fabric,
                        engine=engine,
                        env=site.env(security),
                        launcher=site.ps_launcher,
                    )
                )
            return started[key]

        yield server


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("security", SECURITY)
@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("server_engine", ENGINES)
@pytest.mark.parametrize("client_engine", ENGINES)
def test_p2p(
    sites: Callable[[str], Site],
    servers: Callable[[str, str, str], ServerProcess],
    client_engine: str,
    server_engine: str,
    call: str,
    security: str,
    where: str,
) -> None:
    server = servers(where, security, server_engine)
    loops = LOOPS[client_engine]
    with sites(where).security(security):
        for spec in CALLS[call]:
            if isinstance(spec, LatencyCall):
                result = loops.p2p_latency(server, SIZES, spec)
            else:
                result = loops.p2p_bandwidth(server, SIZES, spec)
            assert [(s.size_bytes, s.count) for s in result.sizes] == [
                (size, RUN.iterations) for size in SIZES
            ], spec
            assert result.settings["engine"] == client_engine
            assert result.settings["tls"] == ("mtls" if security == "mtls" else "off")


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("security", SECURITY)
@pytest.mark.parametrize("ps_engine", ENGINES)
@pytest.mark.parametrize("workers_engine", ENGINES)
def test_ps_push_and_pull(
    sites: Callable[[str], Site], workers_engine: str, ps_engine: str, security: str, where: str
) -> None:
    """Two workers push their gradients and pull the new weights each step; the weights the
    PS task holds after are the sum numpy makes of the same gradients."""
    site = sites(where)
    with (
        site.security(security),
        PSCluster(
            site.fabric,
            Topology(ps=1, workers=2),
            env=site.env(security),
            ps_launchers=(site.ps_launcher,),
            worker_launchers=(site.worker_launcher,),
            ps_engine=ps_engine,
            workers_engine=workers_engine,
        ) as cluster,
    ):
        result = sync_sgd_step(cluster, PROFILE, run=STEPS, learning_rate=0.25, check=True)
        assert result.placement is not None
        weights = fetch_weights(cluster, result.placement)
    assert (result.settings["ps_engine"], result.settings["workers_engine"]) == (
        ps_engine,
        workers_engine,
    )
    assert result.settings["tls"] == ("mtls" if security == "mtls" else "off")
    assert_numpy_weights(weights, PROFILE, STEPS, 2, 0.25)
