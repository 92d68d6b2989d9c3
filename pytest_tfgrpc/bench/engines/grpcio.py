"""The plugin's own engine: its grpcio tensor service (``tfgrpc-server``) and PS processes,
measured by the loops of :mod:`pytest_tfgrpc.bench.p2p` and :mod:`pytest_tfgrpc.bench.ps`.

It registers through the same hook as any other engine; it overrides the benchmark-level
methods because its loops also read both ends' CPU time, verify every echo and take payload
schemes, which the per-exchange interface does not need to know about.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pytest_tfgrpc.bench import p2p, ps
from pytest_tfgrpc.bench.engines.base import Engine, EngineCluster, EngineError, EngineServer
from pytest_tfgrpc.bench.ps import PSResult
from pytest_tfgrpc.model.placement import Topology
from pytest_tfgrpc.results import BenchmarkResult
from pytest_tfgrpc.servers.processes import ServerProcess
from pytest_tfgrpc.servers.ps_cluster import PSCluster
from pytest_tfgrpc.wire.fabric import Fabric

__all__ = ["GrpcioEngine"]


class GrpcioEngine(Engine):
    """The plugin's Python gRPC service and PS processes (the default engine)."""

    name = "grpcio"

    def start_server(self, fabric: Fabric, env: Mapping[str, str] | None) -> ServerProcess:
        return ServerProcess.start(fabric, env=env)

    def start_cluster(
        self, fabric: Fabric, topology: Topology, env: Mapping[str, str] | None
    ) -> PSCluster:
        return PSCluster(fabric, topology, env=env)

    def p2p_latency(self, server: EngineServer, sizes: Sequence[Any], **kw: Any) -> BenchmarkResult:
        return p2p.p2p_latency(server, sizes, **kw)

    def p2p_bandwidth(
        self, server: EngineServer, sizes: Sequence[Any], **kw: Any
    ) -> BenchmarkResult:
        return p2p.p2p_bandwidth(server, sizes, **kw)

    def ps_throughput(
        self, cluster: EngineCluster, payload: Any, *, profile: Any = None, **kw: Any
    ) -> PSResult:
        if not isinstance(cluster, PSCluster):
            raise EngineError(f"engine 'grpcio' measures its own PS cluster, not {cluster!r}")
        return ps.ps_throughput(cluster, payload, **kw)
