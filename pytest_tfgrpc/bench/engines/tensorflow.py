"""TensorFlow's own gRPC runtime as an engine (the ``tensorflow`` extra: ``tensorflow-cpu``).

Servers are ``tf.distribute.Server`` tasks bound to the fabric's address
(:class:`~pytest_tfgrpc.ps.tf_cluster.TFCluster`: PS tasks and one worker task, each its
own process); the measurements are TensorFlow's own transfers, timed per
``tf.compat.v1.Session`` step on the worker:

- ``pull``: the worker reads a PS variable (``RecvTensor`` from the PS);
- ``push``: the PS adds a gradient held by the worker to its variable (``RecvTensor`` from the
  worker; ``assign_add``), the step ending when the PS is done;
- ``echo``: the tensor goes to the PS and back in one step (latency);
- ``ps_exchange``: one step pulls every placed variable and pushes a gradient to each, with a
  model profile's real tensor shapes.

Each sample is a whole step, so it includes TensorFlow's per-step cost (the session, the
master's ``RunGraph`` call to each task); the result records that cost's median
(``tf_step_overhead_p50_ns``: steps on a one-element variable). ``mode`` and ``rpc`` do not
apply (TensorFlow decides how a tensor crosses); results record ``mode=tensorproto`` and
``rpc=RecvTensor``. Without TensorFlow the engine is unavailable and its tests skip.

With node agents (``--tfgrpc-agents``), its tasks run on the agents' hosts, by each host's
TensorFlow Python (``tfgrpc-node --tf-python``): a P2P test's PS task on the first agent's
host and its worker here (the measuring end, as the other engines' clients); a cluster's PS
tasks and worker each on the hosts ``ps_cluster`` places them on. Results record
``ps_engine`` and ``workers_engine`` (``tensorflow``) and where each task ran (``ends``).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from pytest_tfgrpc.bench.engines.base import (
    Engine,
    EngineCluster,
    EngineError,
    EngineServer,
    Measured,
    Provision,
    PSVariable,
    TensorMove,
)
from pytest_tfgrpc.bench.p2p import BandwidthCall, LatencyCall, Message
from pytest_tfgrpc.bench.ps import PSResult
from pytest_tfgrpc.bench.timing import RunSpec
from pytest_tfgrpc.model.placement import Topology
from pytest_tfgrpc.ps.tf_cluster import TFCluster, find_tf_python
from pytest_tfgrpc.results import BenchmarkResult
from pytest_tfgrpc.roles.processes import LOCAL
from pytest_tfgrpc.roles.tf_task import flat_variable
from pytest_tfgrpc.wire.schemes import Payload
from pytest_tfgrpc.wire.security import tls_mode
from pytest_tfgrpc.wire.tensors import Tensor

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from Python 3.11

__all__ = ["TensorFlowEngine"]

#: Steps of a one-element variable timed before each measurement: TF's own per-step cost.
OVERHEAD_STEPS = 30
MODE = "tensorproto"
RPC = "RecvTensor"
R = TypeVar("R", bound=BenchmarkResult)


class TensorFlowEngine(Engine):
    """TensorFlow's gRPC runtime: ``tf.distribute.Server`` PS and worker tasks."""

    name = "tensorflow"
    agent_roles: ClassVar[str | None] = "tensorflow"

    def __init__(self, tf_python: str | None = None) -> None:
        self._python, self._why = find_tf_python(tf_python)

    def unavailable(self) -> str | None:
        return None if self._python is not None else self._why

    def check_usable(self) -> None:
        """:class:`EngineError` under TLS: ``tf.distribute.Server``'s ``grpc`` protocol has
        no TLS settings, so its tasks would talk plaintext while the run promises TLS."""
        if tls_mode() != "off":
            raise EngineError(
                "engine 'tensorflow': TensorFlow's gRPC server (tf.distribute.Server) has no "
                "TLS settings, and this run uses TLS (--tfgrpc-tls-*): drop one of them"
            )

    def _cluster(self, provision: Provision, topology: Topology, worker_here: bool) -> TFCluster:
        if self._python is None:
            raise EngineError(f"engine 'tensorflow': {self._why}")
        self.check_usable()
        workers = provision.worker_launchers
        try:
            return TFCluster(
                self._python,
                provision.env,
                fabric=provision.fabric,
                topology=topology,
                ps_launchers=provision.ps_launchers or (LOCAL,),
                worker_launcher=LOCAL if worker_here or not workers else workers[0],
            ).start()
        except ValueError as exc:
            raise EngineError(f"engine 'tensorflow': {exc}") from None

    def start_server(self, provision: Provision) -> TFCluster:
        """PS task 0 (the server) where ``provision`` places a tensor server, and the
        worker, which measures, here."""
        return self._cluster(provision, Topology(1, 1), worker_here=True)

    def start_cluster(self, provision: Provision) -> TFCluster:
        return self._cluster(provision, provision.topology, worker_here=False)

    def _measure(
        self,
        cluster: EngineServer | EngineCluster,
        kind: str,
        variables: Sequence[Sequence[Any]],
        run: RunSpec,
    ) -> Measured:
        if not isinstance(cluster, TFCluster):
            raise EngineError(f"engine 'tensorflow' measures its own tasks, not {cluster!r}")
        steps = cluster.run(
            kind,
            variables,
            iterations=run.iterations,
            warmup=run.warmup,
            max_seconds=run.time_limit_s,
            warmup_seconds=run.warmup_seconds,
            overhead_iterations=OVERHEAD_STEPS,
        )
        settings = {"tensorflow": cluster.version, "transfer": kind}
        if steps.overhead_ns:
            settings["tf_step_overhead_p50_ns"] = str(int(statistics.median(steps.overhead_ns)))
        return Measured(steps.samples_ns, steps.elapsed_ns or None, settings=settings)

    def echo(
        self, server: EngineServer, tensor: Tensor, *, mode: str, rpc: str, run: RunSpec
    ) -> Measured:
        return self._measure(server, "echo", [flat_variable(tensor.nbytes, "echo")], run)

    def push(self, server: EngineServer, tensor: Tensor, **move: Unpack[TensorMove]) -> Measured:
        return self._measure(server, "push", [flat_variable(tensor.nbytes, "push")], move["run"])

    def pull(self, server: EngineServer, tensor: Tensor, **move: Unpack[TensorMove]) -> Measured:
        return self._measure(server, "pull", [flat_variable(tensor.nbytes, "pull")], move["run"])

    def ps_exchange(
        self, cluster: EngineCluster, variables: Sequence[PSVariable], *, mode: str, run: RunSpec
    ) -> Measured:
        spec = [[v.name, v.ps, list(v.shape), v.dtype] for v in variables]
        measured = self._measure(cluster, "ps", spec, run)
        roles = {"ps_engine": self.name, "workers_engine": self.name}
        return replace(measured, settings={**measured.settings, **roles})

    def _check_sizes(self, sizes: Sequence[Message]) -> None:
        for message in sizes:
            if isinstance(message, Payload):
                raise EngineError(
                    "engine 'tensorflow' moves whole tensors: give sizes, not a payload scheme"
                )
            if message < 1:
                raise EngineError("engine 'tensorflow' moves tensors of at least 1 byte")

    def p2p_latency(
        self, server: EngineServer, sizes: Sequence[Message], call: LatencyCall
    ) -> BenchmarkResult:
        self._check_sizes(sizes)
        return _as_tf(super().p2p_latency(server, sizes, call))

    def p2p_bandwidth(
        self, server: EngineServer, sizes: Sequence[Message], call: BandwidthCall
    ) -> BenchmarkResult:
        self._check_sizes(sizes)
        return _as_tf(super().p2p_bandwidth(server, sizes, call))

    def ps_throughput(self, cluster: EngineCluster, payload: Any, **kw: Any) -> PSResult:
        if isinstance(payload, Payload):
            raise EngineError("engine 'tensorflow' moves whole tensors: give sizes or a profile")
        return _as_tf(super().ps_throughput(cluster, payload, **kw))


def _as_tf(result: R) -> R:
    """What TensorFlow measured: its own encoding and RPC, not the plugin's ``mode``/``rpc``."""
    settings = {k: v for k, v in result.settings.items() if k != "chunk_bytes"}
    return replace(result, mode=MODE, rpc=RPC, settings=MappingProxyType(settings))
