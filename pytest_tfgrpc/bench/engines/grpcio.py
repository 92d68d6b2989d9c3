"""The plugin's own engine: its grpcio tensor service (``tfgrpc-server``) and PS processes,
measured by the loops of :mod:`pytest_tfgrpc.bench.p2p` and :mod:`pytest_tfgrpc.bench.ps`.

It registers through the same hook as any other engine; it overrides the benchmark-level
methods because its loops also read both ends' CPU time, verify every echo and take payload
schemes, which the per-exchange interface does not need to know about.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any, ClassVar

from pytest_tfgrpc.bench import p2p, ps
from pytest_tfgrpc.bench.allreduce import AllReduceResult, allreduce
from pytest_tfgrpc.bench.engines.base import (
    Engine,
    EngineCluster,
    EngineError,
    EngineServer,
    Provision,
)
from pytest_tfgrpc.bench.fit import MAX_SWEEP_BYTES
from pytest_tfgrpc.bench.p2p import BandwidthCall, LatencyCall, Message
from pytest_tfgrpc.bench.ps import PSResult
from pytest_tfgrpc.bench.streams import StreamsResult, check_streams, p2p_bandwidth_streams
from pytest_tfgrpc.ps.ps_cluster import PSCluster
from pytest_tfgrpc.results import BenchmarkResult
from pytest_tfgrpc.roles.native_server import start_tensor_server
from pytest_tfgrpc.roles.processes import LOCAL, ServerProcess
from pytest_tfgrpc.wire.client import Server

__all__ = ["GrpcioEngine", "LoopEngine"]


class LoopEngine(Engine):
    """An engine of the plugin's own processes, of one :attr:`implementation`: its tensor
    server, the client loops of :attr:`loops` (``p2p_latency``, ``p2p_bandwidth``), its
    parallel streams (:func:`~pytest_tfgrpc.bench.streams.p2p_bandwidth_streams`) and the
    workers of its PS benchmarks, which run on the plugin's Python PS tasks
    (:class:`PSCluster`; their results record the workers' engine). The grpcio and native
    engines; a subclass sets those two attributes (and :attr:`~Engine.agent_roles` to the
    implementation), and :meth:`~Engine.check_usable` if the run's settings can rule it out."""

    loops: ClassVar[ModuleType]
    #: What its tensor server, stream clients and PS workers are: ``grpcio`` (Python) or
    #: ``native`` (C++), as :data:`pytest_tfgrpc.native.ENGINES` names them.
    implementation: ClassVar[str] = "grpcio"

    def start_server(self, provision: Provision) -> ServerProcess:
        """The engine's tensor server as ``provision`` asks (:func:`start_tensor_server`), on
        its first PS launcher's host. The Python server refuses tensors over
        ``provision.max_tensor_bytes`` (None: the largest gRPC carries); the C++ server keeps
        gRPC's own message limit.

        :raises EngineError: :meth:`check_usable`'s.
        """
        self.check_usable()
        return start_tensor_server(
            provision.fabric,
            engine=self.implementation,
            env=provision.env,
            max_tensor_bytes=provision.max_tensor_bytes,
            launcher=provision.server_launcher,
            delay_s=provision.delay_s,
        )

    def p2p_latency(
        self, server: EngineServer, sizes: Sequence[Message], call: LatencyCall
    ) -> BenchmarkResult:
        self.check_usable()
        result: BenchmarkResult = self.loops.p2p_latency(server, sizes, call)
        return result

    def p2p_bandwidth(
        self, server: EngineServer, sizes: Sequence[Message], call: BandwidthCall
    ) -> BenchmarkResult:
        self.check_usable()
        result: BenchmarkResult = self.loops.p2p_bandwidth(server, sizes, call)
        return result

    def p2p_bandwidth_streams(
        self, server: Server, sizes: Sequence[Message], *, streams: int, **options: Any
    ) -> StreamsResult:
        self.check_usable()
        check_streams(streams)
        call = BandwidthCall(**options)
        return p2p_bandwidth_streams(
            server, sizes, call, streams=streams, engine=self.implementation
        )

    def start_cluster(self, provision: Provision) -> PSCluster:
        """The plugin's PS tasks and workers, both of :attr:`implementation`, as ``provision``
        asks, on its launchers' hosts. The PS tasks refuse tensor messages over
        ``provision.max_tensor_bytes`` (None: the largest gRPC carries); with a placed
        profile, never under what ``sync_sgd_step``'s fit pushes to PS 0
        (:data:`~pytest_tfgrpc.bench.fit.MAX_SWEEP_BYTES`)."""
        limit = provision.max_tensor_bytes
        if limit is not None and provision.placement is not None:
            limit = max(limit, MAX_SWEEP_BYTES)
        return PSCluster(
            provision.fabric,
            provision.topology,
            env=provision.env,
            max_tensor_bytes=limit,
            workers_engine=self.implementation,
            ps_engine=self.implementation,
            ps_launchers=provision.ps_launchers or (LOCAL,),
            worker_launchers=provision.worker_launchers or (LOCAL,),
        )

    def ps_throughput(
        self, cluster: EngineCluster, payload: Any, *, profile: Any = None, **kw: Any
    ) -> PSResult:
        return ps.ps_throughput(self._own(cluster), payload, **kw)

    def allreduce(self, cluster: EngineCluster, sizes: Sequence[int], **kw: Any) -> AllReduceResult:
        """The all-reduce in the plugin's Python workers; the native engine's C++ workers do
        not run it (:class:`EngineError`)."""
        self.check_usable()
        if self.implementation != "grpcio":
            raise self._unsupported("all-reduce (its C++ workers do not run it)")
        return allreduce(self._own(cluster), sizes, **kw)

    def _own(self, cluster: EngineCluster) -> PSCluster:
        if not isinstance(cluster, PSCluster):
            raise EngineError(
                f"engine {self.name!r} measures the plugin's own PS cluster, not {cluster!r}"
            )
        return cluster


class GrpcioEngine(LoopEngine):
    """The plugin's Python gRPC service (``tfgrpc-server``) and PS processes (the default
    engine)."""

    name = "grpcio"
    loops: ClassVar[ModuleType] = p2p
    agent_roles: ClassVar[str | None] = "grpcio"
    injects_delay: ClassVar[bool] = True
