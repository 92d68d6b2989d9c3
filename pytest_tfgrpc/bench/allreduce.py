"""All-reduce among a cluster's workers over gRPC, beside the parameter-server benchmarks.

:func:`allreduce` runs a ring (reduce-scatter then all-gather, ``2 (N - 1)`` steps) or a
recursive halving-doubling all-reduce (Rabenseifner; ``2 log2 N`` steps, a power-of-two
``N``) of one fused float32 buffer among the ``N`` workers of a
:class:`~pytest_tfgrpc.ps.ps_cluster.PSCluster`; the workers send each other raw frames
(``tfgrpc.Collective/Deliver``) on the cluster's fabric, no PS involved. A step's time is the
slowest rank's. The figures follow nccl-tests (NVIDIA/nccl-tests, ``doc/PERFORMANCE.md``):
``algbw = S / t`` (the result's throughput) and ``busbw = algbw * 2 (N - 1) / N``, comparable
with a link's bandwidth whatever ``N``. ``check=True`` gives rank ``r`` the input
``(r + 1) * (j % 7 + 1)`` and verifies every measured result against the exact sum.

With ``model=True`` the link to PS 0 is fitted first (a short P2P sweep) and the ring or
halving-doubling model of :mod:`pytest_tfgrpc.model.scaling` predicts the step beside the
measurement (``tfgrpc.<label>.<key>.model.step_us`` and ``error_pct``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pytest_tfgrpc.bench.p2p import BandwidthCall, LatencyCall, p2p_bandwidth, p2p_latency
from pytest_tfgrpc.bench.settings import run_settings
from pytest_tfgrpc.bench.timing import RunSpec
from pytest_tfgrpc.model.analytic import LinkFit, fit_from_results
from pytest_tfgrpc.model.profiles import Profile, TensorSpec
from pytest_tfgrpc.model.scaling import ALLREDUCE_ALGORITHMS, ClusterTerms, allreduce_step
from pytest_tfgrpc.ps.ps_cluster import PSCluster
from pytest_tfgrpc.report.properties import model_properties
from pytest_tfgrpc.results import BenchmarkResult, Cluster, CpuTime, SizeResult

__all__ = ["ALLREDUCE_RUN", "AllReduceResult", "allreduce", "bus_factor"]

#: The default run: 20 all-reduces after 3 unmeasured, within 10 s.
ALLREDUCE_RUN = RunSpec(iterations=20, warmup=3, max_seconds=10.0, warmup_seconds=5.0)

#: A short sweep for the model's link: small echoes for alpha, a chunk-sized push for beta.
_FIT_RUN = RunSpec(iterations=30, warmup=3, max_seconds=2.0, warmup_seconds=1.0)


def bus_factor(ranks: int) -> float:
    """nccl-tests' all-reduce bus factor ``2 (n - 1) / n``."""
    return 2 * (ranks - 1) / ranks


@dataclass(frozen=True)
class AllReduceResult(BenchmarkResult):
    """An all-reduce result: one point of ``nbytes``; ``predicted_s`` the model's step (None
    without ``model=True``), ``link`` the link it used."""

    ranks: int = 2
    algorithm: str = "ring"
    predicted_s: float | None = None
    link: LinkFit | None = None

    @property
    def algbw_Bps(self) -> float:
        """nccl-tests' algorithm bandwidth at the median step: ``S / t``."""
        point = self.sizes[0]
        return point.size_bytes * 1e9 / point.summary.p50_ns

    @property
    def busbw_Bps(self) -> float:
        """nccl-tests' bus bandwidth: ``algbw * 2 (n - 1) / n``."""
        return self.algbw_Bps * bus_factor(self.ranks)

    def extra_properties(self) -> list[tuple[str, str]]:
        point = self.sizes[0]
        figures = [
            ("algbw_MBps", repr(self.algbw_Bps / 1e6)),
            ("busbw_MBps", repr(self.busbw_Bps / 1e6)),
        ]
        out = [(f"tfgrpc.{self.label}.{point.label}.{name}", value) for name, value in figures]
        if self.predicted_s is not None and self.link is not None:
            measured = point.summary.p50_ns / 1e9
            prediction = [
                ("step_us", repr(self.predicted_s * 1e6)),
                ("alpha_us", repr(self.link.alpha * 1e6)),
                ("bandwidth_MBps", repr(self.link.bandwidth_Bps / 1e6)),
                ("error_pct", repr(100 * (self.predicted_s - measured) / measured)),
            ]
            out += model_properties(self.label, point.label, prediction)
        return out


def _fit_link(cluster: PSCluster, chunk: int) -> LinkFit:
    server = cluster.ps[0]
    echoes = p2p_latency(
        server, (64, 1024), LatencyCall(mode="raw", rpc="unary", run=_FIT_RUN, label="ar_fit")
    )
    sizes = sorted({max(1024, chunk // 4), max(2048, chunk)})
    pushes = p2p_bandwidth(
        server, sizes, BandwidthCall(mode="raw", rpc="unary", run=_FIT_RUN, label="ar_fit_bw")
    )
    return fit_from_results((echoes, pushes))


def allreduce(
    cluster: PSCluster,
    nbytes: int,
    *,
    run: RunSpec,
    algorithm: str = "ring",
    check: bool = False,
    model: bool = True,
    label: str | None = None,
    key: str | None = None,
) -> AllReduceResult:
    """All-reduce ``nbytes`` (rounded down to whole float32 elements) among the cluster's
    workers, ``run.warmup`` times unmeasured then at most ``run.iterations`` times within
    ``run.max_seconds``; see the module docstring. Raises ValueError for a bad algorithm or
    size, BenchmarkError (its subclass) for a wrong sum with ``check=True``."""
    if algorithm not in ALLREDUCE_ALGORITHMS:
        raise ValueError(
            f"algorithm={algorithm!r}: known all-reduce algorithms: "
            + ", ".join(ALLREDUCE_ALGORITHMS)
        )
    ranks = len(cluster.workers)
    nbytes = nbytes // 4 * 4
    if nbytes < 4 * ranks:
        raise ValueError(f"nbytes={nbytes}: at least one float32 per rank ({4 * ranks} bytes)")
    link = _fit_link(cluster, nbytes // ranks) if model else None
    replies = cluster.allreduce(
        nbytes,
        algorithm=algorithm,
        warmup=run.warmup,
        iterations=run.iterations,
        seconds=run.max_seconds,
        check=check,
    )
    counts = {len(r.samples_ns) for r in replies}
    if len(counts) != 1 or 0 in counts:
        raise ValueError(f"ranks measured different numbers of all-reduces: {sorted(counts)}")
    steps = np.max(np.vstack([r.samples_ns for r in replies]), axis=0)
    total_ns = int(steps.sum())
    wire = int(nbytes * bus_factor(ranks)) * ranks  # what every rank sends, all ranks
    point = SizeResult.from_samples(
        nbytes,
        wire,
        steps,
        total_ns,
        key=key,
        step=True,
        rate_per_s=len(steps) * 1e9 / total_ns,
        rate_Bps=nbytes * len(steps) * 1e9 / total_ns,
        cpu={
            "workers": CpuTime(
                sum(r.cpu_user_ns for r in replies), sum(r.cpu_system_ns for r in replies)
            )
        },
    )
    predicted = None
    if link is not None:
        terms = ClusterTerms(compute_s=1.0, bandwidth_Bps=link.bandwidth_Bps, alpha_s=link.alpha)
        # The model's communication time (compute_s plays no part in it): the step measured.
        buffer = Profile("buffer", (TensorSpec("buffer", (nbytes // 4,)),))
        predicted = allreduce_step(buffer, ranks, terms, algorithm=algorithm).comm_s
    return AllReduceResult(
        benchmark="allreduce",
        label=label or "allreduce",
        fabric=cluster.fabric.name,
        target=",".join(cluster.targets),
        mode="raw",
        rpc="unary",
        cluster=Cluster(cluster.topology.ps, ranks, cluster.topology.sharding),
        sizes=(point,),
        settings=run_settings(
            run,
            algorithm=algorithm,
            ranks=str(ranks),
            check=str(check),
            checked=str(min(r.checked for r in replies)),
            bus_factor=f"{bus_factor(ranks):g}",
        ),
        ranks=ranks,
        algorithm=algorithm,
        predicted_s=predicted,
        link=link,
    )
