"""Parameter-server benchmarks on a :class:`~pytest_tfgrpc.ps.ps_cluster.PSCluster`.

* :func:`ps_throughput` (TF-gRPC-PS-Throughput): every worker calls every PS in a closed loop
  with a payload, the PS acknowledges; aggregate RPCs/s and bytes/s, and per-PS figures. With a
  :class:`~pytest_tfgrpc.model.placement.Placement` as the payload, each PS receives the bytes it
  owns
  and the result carries the load imbalance.
* :func:`sync_sgd_step`: real synchronous SGD steps. Each worker pushes the gradients of the
  shards each PS owns, each PS sums them (numpy, float32) once all workers have pushed and
  updates its weights, each worker pulls the updated weights. One step is the slowest worker's
  push + pull.

Both return a :class:`PSResult`, a :class:`~pytest_tfgrpc.results.BenchmarkResult` like every
benchmark's: one :class:`~pytest_tfgrpc.results.SizeResult` per message size or profile, with
every sample, per-PS bytes and CPU time, and the workers' CPU time.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from pytest_tfgrpc.bench.fit import MachineFit, measure_fit, measure_load
from pytest_tfgrpc.bench.partial import keeping_partial
from pytest_tfgrpc.bench.settings import run_settings
from pytest_tfgrpc.bench.telemetry import ClusterProbe, explained
from pytest_tfgrpc.bench.timing import RunSpec
from pytest_tfgrpc.metrics import PS_THROUGHPUT, SYNC_SGD_STEP
from pytest_tfgrpc.model.analytic import StepPrediction, predict_step, prediction_figures
from pytest_tfgrpc.model.placement import DEFAULT_PARTITION_BYTES, Placement, Topology, placed_on
from pytest_tfgrpc.model.profiles import Profile
from pytest_tfgrpc.native import binaries
from pytest_tfgrpc.ps.jobs import SyncSGDReply, ThroughputJob, ThroughputReply
from pytest_tfgrpc.ps.jobs import samples as jobs_samples
from pytest_tfgrpc.ps.ps_cluster import ClusterError, PSCluster
from pytest_tfgrpc.results import BenchmarkResult, Cluster, CpuTime, PSLoad, SizeResult, Transport
from pytest_tfgrpc.roles.parameter_server import (
    INIT_INDEX,
    INIT_RANDOM,
    apply_update,
    check_gradient,
    initial_weights,
    method,
)
from pytest_tfgrpc.roles.processes import ServerDied
from pytest_tfgrpc.turns import take_turn
from pytest_tfgrpc.units import size_label
from pytest_tfgrpc.wire import grpc_settings
from pytest_tfgrpc.wire._proto import service_pb2
from pytest_tfgrpc.wire.client import BenchmarkError, rpc_timeout
from pytest_tfgrpc.wire.fabric import Fabric
from pytest_tfgrpc.wire.schemes import Payload

__all__ = [
    "PS_THROUGHPUT_RUN",
    "SYNC_SGD_RUN",
    "CpuTime",
    "PSLoad",
    "PSResult",
    "fetch_weights",
    "ps_throughput",
    "sync_sgd_step",
]

PS_THROUGHPUT_RUN = RunSpec(iterations=200, warmup=10, max_seconds=5.0, warmup_seconds=2.0)
SYNC_SGD_RUN = RunSpec(iterations=20, warmup=2, max_seconds=30.0, warmup_seconds=10.0)


@dataclass(frozen=True, eq=False)
class PSResult(BenchmarkResult):
    """A :class:`~pytest_tfgrpc.results.BenchmarkResult` of a PS benchmark, with what the
    model layer knows of it: the ``placement`` measured (None for plain sizes), and
    ``prediction``, the analytic model's step for the same profile, topology and placement on a
    link and host measured just before (``sync_sgd_step(..., model=True)``). Its points,
    figures, CPU times and settings are those of every result."""

    placement: Placement | None = None
    prediction: StepPrediction | None = None
    #: Steps the PS tasks applied, warm-up included (sync-SGD; 0 otherwise): what
    #: :func:`check_aggregate` recomputes.
    applied_steps: int = 0
    #: The learning rate of the steps (sync-SGD).
    learning_rate: float = 0.0

    def model_predictions(self) -> Mapping[str, Sequence[tuple[str, str]]]:
        """The prediction beside each sync-SGD step point, with ``error_pct`` against the
        measured step p50 (recorded as ``tfgrpc.<label>.<key>.model.<name>``)."""
        if self.prediction is None:
            return {}
        return {
            point.label: prediction_figures(self.prediction, measured_s=point.summary.p50_ns / 1e9)
            for point in self.sizes
            if point.step
        }


def _key(text: str) -> str:
    # Keys sit between dots in property names: "resnet50[scale=0.01]" must not add a level.
    return text.replace(".", "_") or "payload"


def _imbalance(loads: Sequence[int]) -> float:
    total = sum(loads)
    return max(loads) * len(loads) / total if total else 1.0


def _loads(
    cluster: PSCluster,
    stats: Sequence[service_pb2.PSJobStats],
    placed: Sequence[int],
    transports: Sequence[Transport | None],
) -> tuple[PSLoad, ...]:
    return tuple(
        PSLoad(
            task=i,
            target=cluster.ps[i].target,
            pid=s.pid,
            placed_bytes=placed[i],
            bytes_in=s.bytes_in,
            bytes_out=s.bytes_out,
            rpcs=s.rpcs,
            steps=s.measured_steps,
            cpu=CpuTime(s.cpu_user_ns, s.cpu_system_ns),
            transport=transports[i] if i < len(transports) else None,
        )
        for i, s in enumerate(stats)
    )


@contextmanager
def _quoting_transport(watch: ClusterProbe) -> Iterator[None]:
    """A job that fails (a worker's call broke or ran past its deadline, the job ran past
    its time), its message followed by what each PS task's connections showed meanwhile, as
    P2P failures quote theirs: ``... (transport: ps0: after 3.1 s; 528 retransmissions, RTT
    210 ms)``. A role's death is its own cause and is left as it is."""
    try:
        yield
    except ServerDied:
        raise
    except (BenchmarkError, ClusterError) as error:
        seen = watch.last_seen()
        if not seen:
            raise
        raise type(error)(f"{error} (transport: {seen})") from None


def _explained(point: SizeResult, watch: ClusterProbe) -> SizeResult:
    """``point`` with its PS tasks' telemetry together and the limit the rule names."""
    return explained(point, watch.transport(), cores=watch.cores())


# --- PS throughput ---------------------------------------------------------------------------
def _payloads(
    cluster: PSCluster, payload: Sequence[int] | Placement | Payload
) -> list[tuple[str, list[int]]]:
    ps = cluster.topology.ps
    if isinstance(payload, Placement):
        if payload.ps != ps:
            raise ValueError(f"a placement over {payload.ps} PS tasks for a cluster of {ps}")
        return [(f"placed_{payload.sharding}", list(payload.bytes_per_ps()))]
    if isinstance(payload, Payload):
        return [(payload.description, [payload.total_bytes] * ps)]
    sizes = list(payload)
    if not sizes:
        raise ValueError("no message sizes to measure")
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"message size {size!r} is not a whole number of bytes")
    return [(size_label(size), [size] * ps) for size in sizes]


def ps_throughput(
    cluster: PSCluster,
    payload: Sequence[int] | Placement | Payload,
    *,
    mode: str = "raw",
    run: RunSpec = PS_THROUGHPUT_RUN,
    label: str | None = None,
    key: str | None = None,
) -> PSResult:
    """Every worker calls every PS with the payload in a closed loop (TF-gRPC-PS-Throughput).

    ``payload``: message sizes (one point each; every PS gets the same size), a
    :class:`Payload` of buffers (one message of their total), or a :class:`Placement` (each PS
    gets the bytes it owns; the point carries the placement's imbalance). Each worker keeps one
    call in flight per PS; ``run.iterations`` bounds the calls per worker and PS,
    ``run.time_limit_s`` the measured time. ``key`` names the point (default: the size, the
    payload's key, or ``placed_<sharding>``).
    """
    if mode not in grpc_settings.MODES:
        raise ValueError(f"mode={mode!r}: expected one of {', '.join(grpc_settings.MODES)}")
    settings = run_settings(
        run, **_engine_settings(cluster), method=method("Throughput", raw=mode == "raw")
    )

    def build(points: tuple[SizeResult, ...]) -> PSResult:
        return throughput_result(cluster, payload, mode, label, points, settings)

    points: list[SizeResult] = []
    with keeping_partial(points, build):
        for default_key, per_ps in _payloads(cluster, payload):
            point_key = _key(key or default_key)
            cluster.configure(
                [
                    service_pb2.PSJob(job_id=cluster.next_job_id(), task=i, workers=1)
                    for i in range(cluster.topology.ps)
                ]
            )
            jobs = [
                ThroughputJob(
                    targets=cluster.targets,
                    worker=w,
                    mode=mode,
                    payload_bytes=per_ps,
                    iterations=run.iterations,
                    warmup=run.warmup,
                    warmup_seconds=run.warmup_seconds,
                    seconds=run.time_limit_s,
                )
                for w in range(cluster.topology.workers)
            ]
            take_turn()  # lockstep with another run (tfgrpc-ab --interleave rounds)
            with ClusterProbe(cluster.ps) as watch, _quoting_transport(watch):
                replies = cluster.run(jobs, run.job_timeout_s(), watch)
            stats = cluster.job_stats()
            samples = np.concatenate([jobs_samples(s.ns) for r in replies for s in r.samples])
            rate = 0.0
            rate_bytes = 0.0
            for reply in replies:
                seconds = reply.elapsed_ns / 1e9
                counts = [len(s.ns) for s in reply.samples]
                rate += sum(counts) / seconds
                rate_bytes += sum(c * b for c, b in zip(counts, per_ps, strict=True)) / seconds
            loads = _loads(cluster, stats, per_ps, watch.per_task())
            point = SizeResult.from_samples(
                sum(per_ps),
                sum(per_ps),
                samples,
                max(r.elapsed_ns for r in replies),
                key=point_key,
                rate_per_s=rate,
                rate_Bps=rate_bytes,
                per_ps=loads,
                cpu={"workers": _workers_cpu(replies)},
                imbalance=payload.imbalance if isinstance(payload, Placement) else 1.0,
                bytes_imbalance=_imbalance([load.bytes_in for load in loads]),
            )
            points.append(_explained(point, watch))
    return build(tuple(points))


def _engine_settings(cluster: PSCluster) -> dict[str, str]:
    """The engine of each role of ``cluster``: ``engine`` the workers' (they measure),
    ``workers_engine`` and ``ps_engine`` each role's, ``grpcio`` (Python) or ``native``
    (C++, with the gRPC C++ version it was built against as ``grpc_cpp``)."""
    workers = getattr(cluster, "workers_engine", "grpcio")
    ps = getattr(cluster, "ps_engine", "grpcio")
    out = {"engine": workers, "workers_engine": workers, "ps_engine": ps}
    if "native" in (workers, ps):
        out["grpc_cpp"] = binaries().grpc_version
    return out


def throughput_result(
    cluster: _ClusterLike,
    payload: object,
    mode: str,
    label: str | None,
    points: Sequence[SizeResult],
    settings: Mapping[str, str],
) -> PSResult:
    """The :class:`PSResult` of a PS throughput run on ``cluster`` (any engine's): its fabric,
    targets and topology, the placement when ``payload`` is one."""
    topology = cluster.topology
    placement = payload if isinstance(payload, Placement) else None
    return PSResult(
        benchmark=PS_THROUGHPUT,
        label=label or "ps_throughput",
        fabric=cluster.fabric.name,
        target=",".join(cluster.targets),
        mode=mode,
        rpc="unary",
        cluster=Cluster(
            topology.ps,
            topology.workers,
            placement.sharding if placement is not None else topology.sharding,
        ),
        sizes=tuple(points),
        placement=placement,
        settings=MappingProxyType(dict(settings)),
    )


class _ClusterLike(Protocol):
    @property
    def fabric(self) -> Fabric: ...

    @property
    def topology(self) -> Topology: ...

    @property
    def targets(self) -> tuple[str, ...]: ...


def _workers_cpu(replies: Sequence[ThroughputReply | SyncSGDReply]) -> CpuTime:
    """The CPU time of all workers together."""
    return CpuTime(
        sum(r.cpu_user_ns for r in replies),
        sum(r.cpu_system_ns for r in replies),
    )


# --- sync SGD --------------------------------------------------------------------------------
def sync_sgd_step(
    cluster: PSCluster,
    profile: Profile,
    *,
    run: RunSpec = SYNC_SGD_RUN,
    learning_rate: float = 0.1,
    check: bool = False,
    chunk_bytes: int = grpc_settings.DEFAULT_CHUNK_BYTES,
    partition_bytes: int = DEFAULT_PARTITION_BYTES,
    barrier_timeout: float = 30.0,
    label: str | None = None,
    model: bool = False,
    placement: Placement | None = None,
) -> PSResult:
    """Synchronous SGD steps of ``profile`` on the cluster, its tensors placed by its sharding.

    ``placement``: the profile's placement on the cluster when the caller already made it
    (the driver does, once per test); it is handed to the fit and the model as is. Without
    it the profile is placed here, once.

    Per step every worker pushes, to every PS, the gradients of the shards that PS owns (in
    slices of ``chunk_bytes``), then pulls the weights the PS updated once all workers pushed.
    One sample is one step: the slowest worker's push + pull. ``run.warmup`` steps come first;
    then at most ``run.iterations`` measured steps, and none started after
    ``run.time_limit_s``. ``check=True`` uses predictable weights and gradients
    (:func:`~pytest_tfgrpc.roles.parameter_server.initial_weights`,
    :func:`~pytest_tfgrpc.roles.parameter_server.check_gradient`) so :func:`fetch_weights` can be
    compared
    with a numpy computation of the same steps. ``model=True`` first fits the link and the
    host on PS 0 and worker 0 (:func:`~pytest_tfgrpc.bench.fit.measure_fit`, 2-4 s) and the
    result carries the model's prediction of the step (:attr:`PSResult.prediction`), with the
    other sessions' load on the machine taken as the mean of a probe before and one after
    them.
    """
    if chunk_bytes < 64 or chunk_bytes % 4:
        raise ValueError(f"chunk_bytes={chunk_bytes}: a multiple of 4 bytes, at least 64")
    if not barrier_timeout > 0:
        raise ValueError(f"barrier_timeout={barrier_timeout}: must be positive")
    topology = cluster.topology
    placement = placed_on(profile, topology, placement, partition_bytes=partition_bytes)
    shards = [placement.shards_of(ps) for ps in range(topology.ps)]
    machine: MachineFit | None = None
    if model:
        take_turn()  # lockstep with another run (tfgrpc-ab --interleave rounds)
        machine = measure_fit(cluster, placement, chunk_bytes=chunk_bytes)
    take_turn()
    with ClusterProbe(cluster.ps) as watch, _quoting_transport(watch):
        replies, stats = cluster.sync_sgd(
            [[(s.tensor, s.offset, s.nbytes) for s in mine] for mine in shards],
            **run.step_bounds(barrier_timeout),
            workers=topology.workers,
            chunk_bytes=chunk_bytes,
            learning_rate=learning_rate,
            init=INIT_INDEX if check else INIT_RANDOM,
            barrier_timeout=barrier_timeout,
            check=check,
            window=watch,
        )
    prediction = None
    if machine is not None:
        # The machine is shared and its load moves: the other sessions' load during the
        # steps is taken as the mean of what a probe found before them (in the fit) and
        # finds after them.
        after = measure_load(topology.ps + topology.workers)
        host = replace(machine.host, load=(machine.host.load + after) / 2)
        prediction = predict_step(
            profile,
            topology,
            machine.link,
            placement=placement,
            host=host,
            ps_links=machine.ps_links or None,
            chunk_bytes=chunk_bytes,
            partition_bytes=partition_bytes,
        )
    per_worker = [jobs_samples(r.samples_ns) for r in replies]
    counts = {len(s) for s in per_worker}
    if len(counts) != 1 or 0 in counts:
        raise BenchmarkError(f"workers measured different numbers of steps: {sorted(counts)}")
    steps = np.max(np.vstack(per_worker), axis=0)
    per_step = placement.total_bytes * topology.workers * 2  # every worker pushes and pulls
    loads = _loads(cluster, stats, list(placement.bytes_per_ps()), watch.per_task())
    total_ns = int(steps.sum())
    point = SizeResult.from_samples(
        per_step,
        per_step,
        steps,
        total_ns,
        key=profile.key,
        step=True,
        rate_per_s=len(steps) * 1e9 / total_ns if total_ns else 0.0,
        rate_Bps=per_step * len(steps) * 1e9 / total_ns if total_ns else 0.0,
        per_ps=loads,
        cpu={"workers": _workers_cpu(replies)},
        imbalance=placement.imbalance,
    )
    point = _explained(point, watch)
    result = PSResult(
        benchmark=SYNC_SGD_STEP,
        label=label or "sync_sgd_step",
        fabric=cluster.fabric.name,
        target=",".join(cluster.targets),
        mode="protobuf",
        rpc="stream",
        cluster=Cluster(topology.ps, topology.workers, topology.sharding),
        sizes=(point,),
        placement=placement,
        settings=run_settings(
            run,
            **_engine_settings(cluster),
            profile=profile.key,
            learning_rate=f"{learning_rate:g}",
            chunk_bytes=str(chunk_bytes),
            partition_bytes=str(partition_bytes),
            check=str(check),
        ),
        prediction=prediction,
        applied_steps=replies[0].steps,
        learning_rate=learning_rate,
    )
    if check:
        check_aggregate(cluster, result)
    return result


class AggregateError(BenchmarkError):
    """``sync_sgd_step(check=True)``: the weights the PS tasks hold are not the numpy
    aggregate of every worker's gradients."""

    __module__ = "pytest_tfgrpc"  # its public path: pytest's one-line summary keeps more cause


#: The check mode's weights repeat with this period in the element index: the initial value
#: is ``j % 251`` and every gradient depends on ``j % 16`` only.
_CHECK_PERIOD = 251 * 16


def expected_check_weights(
    workers: int, steps: int, learning_rate: float
) -> npt.NDArray[np.float32]:
    """One period (:data:`_CHECK_PERIOD` elements) of the weights the check mode must leave
    after ``steps`` steps of ``workers`` workers: the initial weights minus, per step, the
    learning rate over the workers times the float32 sum of their gradients, as each PS
    computes it (:func:`~pytest_tfgrpc.roles.parameter_server.apply_update`)."""
    weights = initial_weights(0, 4 * _CHECK_PERIOD, init=INIT_INDEX)
    for step in range(steps):
        total = np.sum(
            [check_gradient(w, step, 0, 4 * _CHECK_PERIOD) for w in range(workers)], axis=0
        )
        apply_update(weights, total.astype(np.float32), learning_rate, workers)
    return weights


def check_aggregate(cluster: PSCluster, result: PSResult) -> None:
    """Check that the PS tasks of ``cluster`` hold, for every tensor of ``result``'s
    placement, exactly the weights a numpy computation of the same steps gives: every
    worker's gradients summed, scaled and applied (a result of ``sync_sgd_step(check=True)``,
    whose gradients are predictable). Raises :class:`AggregateError` naming the tensor, how
    many elements differ and the first of them, with the expected and the held value."""
    __tracebackhide__ = True
    placement = result.placement
    if placement is None or not result.applied_steps:
        raise ValueError("check_aggregate() takes a sync_sgd_step result (it has a placement)")
    if result.settings.get("check") != "True":
        raise ValueError(
            "check_aggregate() needs a result of sync_sgd_step(check=True): other runs push "
            "random gradients that cannot be recomputed"
        )
    workers = cluster.topology.workers
    period = expected_check_weights(workers, result.applied_steps, result.learning_rate)
    held = fetch_weights(cluster, placement)
    placed: dict[str, int] = {}
    for shard in placement.shards:
        placed[shard.tensor] = placed.get(shard.tensor, 0) + shard.nbytes
    for name, nbytes in placed.items():
        got = held.get(name)
        if got is None or got.nbytes != nbytes:
            size = "nothing" if got is None else f"{got.nbytes} B"
            raise AggregateError(
                f"sync-SGD check failed: tensor {name!r} should hold {nbytes} B of "
                f"weights, the PS tasks hold {size}"
            )
        expected = np.resize(period, got.shape)
        wrong = np.flatnonzero(got != expected)
        if wrong.size:
            first = int(wrong[0])
            raise AggregateError(
                f"sync-SGD check failed: tensor {name!r}: {wrong.size} of {got.size} "
                f"weights differ from the numpy aggregate of {workers} workers' gradients over "
                f"{result.applied_steps} steps; first at element {first}: expected "
                f"{expected[first]!r}, the PS holds {got[first]!r}"
            )


def fetch_weights(cluster: PSCluster, placement: Placement) -> dict[str, npt.NDArray[np.float32]]:
    """The current weights of every tensor, reassembled from the shards on every PS."""
    parts: dict[str, list[tuple[int, bytes]]] = {}
    for ps in range(placement.ps):
        owned = placement.shards_of(ps)
        channel = cluster.channel(ps)
        call = channel.unary_stream(
            method("PullWeights"),
            request_serializer=service_pb2.PullWeightsRequest.SerializeToString,
            response_deserializer=service_pb2.WeightChunk.FromString,
        )
        pieces: dict[int, list[Any]] = {}
        timeout = rpc_timeout(sum(shard.nbytes for shard in owned), 60.0)
        request = service_pb2.PullWeightsRequest(step=-1)
        for chunk in call(request, timeout=timeout, metadata=cluster.credentials):
            pieces.setdefault(chunk.shard, []).append((chunk.offset, chunk.data))
        for index, shard in enumerate(owned):
            data = b"".join(d for _, d in sorted(pieces.get(index, [])))
            parts.setdefault(shard.tensor, []).append((shard.offset, data))
    return {
        name: np.frombuffer(b"".join(d for _, d in sorted(pieces)), dtype=np.float32)
        for name, pieces in parts.items()
    }
