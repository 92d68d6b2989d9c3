"""Analytic model: a link's latency and bandwidth, a sync-SGD step's time, scaling projections.

Link (Hockney's alpha-beta model): moving one message of ``n`` bytes costs
``time(n) = alpha + n * beta``; ``alpha`` is the per-message cost (seconds), ``beta`` the cost of
a byte (seconds per byte) and ``1 / beta`` the bandwidth. :func:`fit` finds both from measured
``(size, time)`` points; :func:`fit_from_results` takes them from P2P benchmark results.

Step (synchronous SGD with ``P`` parameter servers and ``W`` workers): every worker pushes the
gradient of every shard to the PS that owns it, then pulls the updated weights back. PS ``p``
owning ``B_p`` bytes in ``m_p`` shards receives ``W * B_p`` bytes in ``W * m_p`` messages and
sends as much back, one after the other, through its one link::

    t_ps(p)  = 2 * W * (m_p * alpha + B_p * beta)
    t_worker = 2 * (M * alpha + S * beta)        (M = sum m_p shards, S = sum B_p bytes)
    t_comm   = max(max_p t_ps(p), t_worker)

With a compute time ``t_c`` per step of which ``t_b = backward_share * t_c`` is the backward
pass, and an ``overlap`` fraction ``o`` in [0, 1] of the backward pass that communication can
hide behind (Shi, Wang and Chu, arXiv:1711.05979)::

    t_iter     = t_c + t_comm - o * min(t_b, t_comm)
    efficiency = t_c / t_iter

``o = 0`` gives ``t_f + t_b + t_comm``, ``o = 1`` gives ``t_f + max(t_b, t_comm)``. The
efficiency is weak scaling's, as Mathuriya et al. (arXiv:1712.09388) report it: each worker
keeps its batch, so ``W`` workers would ideally run ``W`` times the single worker's throughput
at one step per ``t_c``; it is the fraction of that ideal the predicted step reaches.

:func:`project` tabulates predictions over grids of ``W`` and ``P``, for scales that cannot run
on one machine.

Host (optional, :class:`HostCosts`): where Python, protobuf and numpy cost more than the wire
(always, on a loopback), each process's CPU work is a floor of its own. A process spends
``rpc_s`` per call, ``message_s`` per stream message and ``byte_s`` per byte it sends or
receives; ``k_p`` is the number of stream messages (chunks) each way between a worker and PS
``p``, and one exchange is a push (``k_p + 1`` messages, the header included) and a pull::

    x_ps(p)    = ps.time(2, 2 k_p + 1, 2 B_p) + B_p * aggregate   a worker's exchange, at PS p
    x_w(p)     = worker.time(2, 2 k_p + 1, 2 B_p)                 the same exchange, at the worker
    h(p)       = min(hidden.time(2, 2 k_p + 1, 2 B_p), x_w(p), x_ps(p))   its ends at once
    u(p)       = (x_w(p) + x_ps(p)) / (2 (x_w(p) + x_ps(p) - h(p)))       busy share of 2 cores
    cpu_ps(p)  = W * x_ps(p) + B_p * update                      PS p per step (one GIL)
    cpu_worker = sum_p x_w(p)                                     a worker per step
    chain      = (cpu_worker + cpu_ps(b) - h(b)) / rate(1)        b: the busiest PS by CPU
    shared     = max(ps_makespan(cpu_ps(0..P-1), W times cpu_worker; rate),
                     (sum_p cpu_ps(p) + W cpu_worker) / (u(b) * (P + W) * rate(P + W)))
    t_comm     = max(link's t_comm, chain, shared)

``chain``: a worker's push must be made before a PS can sum it, and the PS must have summed
every worker's push and served the pulls before the last worker has its weights, so the
worker's and the busiest PS's work of a step mostly follow each other; streaming lets one
exchange's ends work at once for ``h``, which ``hidden`` gives per call, per message and per
byte as measured (more slices, more of them pipelined). As ``h`` is at most either end's
work, ``chain`` is never below ``cpu_worker`` nor ``max_p cpu_ps(p)``, the floors each
process's own work sets.

``shared`` applies when the tasks share ``cores`` CPUs (one machine) with ``load`` other
runnable sessions: Linux shares CPU fairly between sessions, and a task's Python runs on one
core at most, so with ``k`` of the cluster's tasks runnable each runs at ``rate(k) = min(1,
cores / (k + load))``. ``ps_makespan`` is the time to finish every task's work of a step under
that processor sharing (:func:`sharing_makespan`), never below the largest work nor below
``sum(work) / cores``. But the tasks hand work to each other (a slice sent is a slice to
receive) and every hand-off waits for a wake-up, so the cores they share are not kept busy
all the time: an exchange's two ends keep ``u`` of two cores busy, and all the step's work
cannot take less than its total over that share of the cores the ``P + W`` tasks can have.
A chain's processes mostly run one at a time, at ``rate(1)``; its hand-offs are in ``h``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from pytest_tfgrpc.model.placement import (
    DEFAULT_PARTITION_BYTES,
    Placement,
    Topology,
    place_profile,
    placed_on,
)
from pytest_tfgrpc.model.profiles import Profile, load_profile
from pytest_tfgrpc.results import BenchmarkResult
from pytest_tfgrpc.units import align_columns, format_duration, format_rate, format_size

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from Python 3.11

__all__ = [
    "DEFAULT_BACKWARD_SHARE",
    "DEFAULT_PS",
    "DEFAULT_WORKERS",
    "LIMITS",
    "CpuCost",
    "HostCosts",
    "LinkFit",
    "Projection",
    "StepOptions",
    "StepPrediction",
    "StepTerms",
    "fit",
    "fit_from_results",
    "link_point",
    "predict_step",
    "prediction_figures",
    "project",
    "relative_error",
    "sharing_makespan",
]

DEFAULT_WORKERS = tuple(2**i for i in range(10))  # 1 .. 512
DEFAULT_PS = tuple(2**i for i in range(7))  # 1 .. 64

#: The backward pass's share of a step's compute: it runs two products per layer (the gradient
#: of the input and of the weights) to the forward pass's one, so about 2/3.
DEFAULT_BACKWARD_SHARE = 2.0 / 3.0

#: P2P benchmarks whose samples are one message's time, and how many times the payload crosses
#: the link in one sample: an echo carries it there and back in one RPC.
_LINK_BENCHMARKS = {"p2p_latency": 2, "p2p_bandwidth": 1}


# --- the link ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LinkFit:
    """A fabric's alpha-beta model: ``time(n) = alpha + n * beta`` for a message of ``n`` bytes.

    ``alpha`` is in seconds, ``beta`` in seconds per byte. ``points`` are the ``(bytes,
    seconds)`` points it was fitted to (empty when the figures were given, see :meth:`given`),
    ``relative_residuals`` each point's ``(time(n) - t) / t``, and ``r_squared`` the coefficient
    of determination of the weighted fit (None without points).
    """

    fabric: str
    alpha: float
    beta: float
    points: tuple[tuple[int, float], ...] = ()
    relative_residuals: tuple[float, ...] = ()
    r_squared: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.alpha) and self.alpha >= 0):
            raise ValueError(f"alpha={self.alpha!r}: a per-message time must be finite and >= 0")
        if not (math.isfinite(self.beta) and self.beta > 0):
            raise ValueError(f"beta={self.beta!r}: a time per byte must be finite and > 0")
        if len(self.relative_residuals) != len(self.points):
            raise ValueError("relative_residuals must have one entry per point")

    @classmethod
    def given(cls, alpha: float, bandwidth_Bps: float, fabric: str = "given") -> LinkFit:
        """A model from known figures: ``alpha`` seconds per message, ``bandwidth_Bps`` bytes/s."""
        if not (math.isfinite(bandwidth_Bps) and bandwidth_Bps > 0):
            raise ValueError(f"bandwidth {bandwidth_Bps!r} B/s: must be finite and > 0")
        return cls(fabric=fabric, alpha=alpha, beta=1.0 / bandwidth_Bps)

    @property
    def bandwidth_Bps(self) -> float:
        """Bytes per second: ``1 / beta``."""
        return 1.0 / self.beta

    def time(self, nbytes: float, messages: float = 1.0) -> float:
        """Seconds to move ``nbytes`` in ``messages`` messages: ``messages * alpha + nbytes *
        beta``."""
        return messages * self.alpha + nbytes * self.beta

    @property
    def max_relative_error(self) -> float | None:
        """The largest ``|time(n) - t| / t`` over the points, or None without points."""
        if not self.relative_residuals:
            return None
        return max(abs(r) for r in self.relative_residuals)

    def describe(self) -> str:
        """One line: fabric, alpha, bandwidth and, for a fit, its quality."""
        text = (
            f"{self.fabric}: alpha {format_duration(self.alpha * 1e9)}, "
            f"bandwidth {format_rate(self.bandwidth_Bps)}"
        )
        sizes = len({size for size, _ in self.points})
        if self.points and sizes <= 2:
            # Two parameters through two sizes: the line passes through them, r^2 says nothing.
            text += (
                f" (fitted to {len(self.points)} points at {sizes} sizes: an exact fit, "
                "nothing left to judge it by)"
            )
        elif self.r_squared is not None and self.max_relative_error is not None:
            text += (
                f" (fitted to {len(self.points)} points, r^2 {self.r_squared:.4f}, "
                f"worst point off by {self.max_relative_error:.1%})"
            )
        return text


def _check_points(points: Sequence[tuple[int, float]]) -> tuple[tuple[int, float], ...]:
    checked: list[tuple[int, float]] = []
    for index, point in enumerate(points):
        try:
            size, seconds = point
        except (TypeError, ValueError):
            raise ValueError(f"point #{index} {point!r}: expected (bytes, seconds)") from None
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
            raise ValueError(f"point #{index} {point!r}: size must be a whole number of bytes")
        if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"point #{index} {point!r}: time must be finite and > 0 seconds")
        checked.append((int(size), float(seconds)))
    if len({size for size, _ in checked}) < 2:
        raise ValueError(
            "an alpha-beta fit needs points at two or more message sizes "
            f"(got {len(checked)} points at {len({s for s, _ in checked})} sizes)"
        )
    return tuple(checked)


def fit(points: Sequence[tuple[int, float]], fabric: str) -> LinkFit:
    """Fit ``time(n) = alpha + n * beta`` to ``(bytes, seconds)`` points by relative error.

    Minimises ``sum(((alpha + n_i * beta) - t_i) / t_i) ** 2)``: least squares weighted by
    ``1 / t_i ** 2``. Message times span several decades (a few microseconds at 4 B, tens of
    milliseconds at 64 MiB) and their noise grows with them, so plain least squares would fit
    the largest sizes to a fraction of a percent and leave ``alpha`` to their noise, often
    negative. Weighted by relative error, every point counts alike: small messages settle
    ``alpha`` and large ones ``beta``. If the fit still gives ``alpha < 0`` (sizes too large
    to see it), ``alpha`` is 0 and ``beta`` is refitted alone.

    ``r_squared`` is ``1 - sum(w r^2) / sum(w (t - t_w)^2)`` with ``w = 1 / t^2``, residuals
    ``r`` and ``t_w`` the weighted mean time. Raises ValueError for fewer than two sizes, a
    negative size, a time that is not finite and positive, or times that do not grow with size.
    """
    checked = _check_points(points)
    sizes = np.array([size for size, _ in checked], dtype=np.float64)
    times = np.array([seconds for _, seconds in checked], dtype=np.float64)
    # Dividing each equation alpha + n beta = t by t makes its residual the relative error.
    design = np.column_stack((1.0 / times, sizes / times))
    (alpha, beta), *_ = np.linalg.lstsq(design, np.ones_like(times), rcond=None)
    if alpha < 0:
        x = sizes / times
        alpha, beta = 0.0, float(x.sum() / (x @ x))
    if not beta > 0:
        raise ValueError(
            f"cannot fit a bandwidth for {fabric!r}: the measured times do not grow with "
            "message size (measure sizes large enough that bytes, not messages, cost the time)"
        )
    predicted = alpha + beta * sizes
    residuals = predicted - times
    weights = 1.0 / times**2
    mean = float((weights * times).sum() / weights.sum())
    spread = float((weights * (times - mean) ** 2).sum())
    r_squared = 1.0 - float((weights * residuals**2).sum()) / spread if spread > 0 else 1.0
    return LinkFit(
        fabric=fabric,
        alpha=float(alpha),
        beta=float(beta),
        points=checked,
        relative_residuals=tuple(float(r) for r in residuals / times),
        r_squared=r_squared,
    )


def link_point(benchmark: str, size_bytes: int, seconds: float) -> tuple[int, float] | None:
    """A P2P sample as one message's ``(bytes, seconds)``, or None if ``benchmark`` is no P2P one.

    ``benchmark`` is the benchmark's name or a label starting with it. A ``p2p_latency`` sample
    is an echo: one RPC that carries the payload there and back, so ``2 * size_bytes`` bytes.
    A ``p2p_bandwidth`` sample (push until acknowledged, or pull) carries it once.
    """
    for name, crossings in _LINK_BENCHMARKS.items():
        if benchmark == name or benchmark.startswith(name):
            return crossings * size_bytes, seconds
    return None


def fit_from_results(results: Iterable[BenchmarkResult], fabric: str | None = None) -> LinkFit:
    """Fit a fabric's link from P2P results (``p2p_latency`` and/or ``p2p_bandwidth``).

    Each message size contributes its median time in seconds, as :func:`link_point` counts its
    bytes. Other benchmarks are skipped. With ``fabric`` given, only that fabric's results
    count; without it, all results must be from one fabric. Raises ValueError when no result is
    usable or the results span several fabrics and none was chosen.
    """
    by_fabric: dict[str, list[tuple[int, float]]] = {}
    for result in results:
        for size in result.sizes:
            point = link_point(result.benchmark, size.size_bytes, size.summary.p50_ns / 1e9)
            if point is not None:
                by_fabric.setdefault(result.fabric, []).append(point)
    if fabric is None:
        if len(by_fabric) > 1:
            raise ValueError(
                f"P2P results from several fabrics ({', '.join(sorted(by_fabric))}): "
                "choose one with fabric="
            )
        if not by_fabric:
            raise ValueError("no p2p_latency or p2p_bandwidth result to fit a link to")
        fabric = next(iter(by_fabric))
    if fabric not in by_fabric:
        known = f" (fabrics measured: {', '.join(sorted(by_fabric))})" if by_fabric else ""
        raise ValueError(f"no p2p_latency or p2p_bandwidth result on fabric {fabric!r}{known}")
    return fit(by_fabric[fabric], fabric)


# --- the host --------------------------------------------------------------------------------


def _check_seconds(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise ValueError(f"{name}={value!r}: must be a finite number of seconds >= 0")


@dataclass(frozen=True)
class CpuCost:
    """CPU seconds one process spends moving tensors: per call, per stream message, per byte.

    ``time(rpcs, messages, nbytes) = rpcs * rpc_s + messages * message_s + nbytes * byte_s``;
    ``nbytes`` counts what the process sends and what it receives.
    """

    rpc_s: float
    message_s: float
    byte_s: float

    def __post_init__(self) -> None:
        for name in ("rpc_s", "message_s", "byte_s"):
            _check_seconds(name, getattr(self, name))

    def time(self, rpcs: float, messages: float, nbytes: float) -> float:
        """CPU seconds for ``rpcs`` calls carrying ``messages`` messages and ``nbytes`` bytes."""
        return rpcs * self.rpc_s + messages * self.message_s + nbytes * self.byte_s


@dataclass(frozen=True)
class HostCosts:
    """The CPU side of a step, as measured on one machine (see :mod:`pytest_tfgrpc.bench.fit`).

    ``worker`` and ``ps`` are the transport's costs in a worker and in a PS process.
    ``aggregate_byte_s`` is a PS's cost per byte of adding one worker's gradient into its
    accumulator, ``update_byte_s`` its cost per byte owned of applying the step's update and
    keeping the new weights to serve. ``cores``: the CPUs that every task of the cluster
    shares (one machine), or None when each task has a host of its own; ``load``: how many
    other sessions compete for them, runnable on average. ``hidden``: the CPU time of one
    exchange during which both its ends work (streamed messages let a PS sum one slice while
    the worker sends the next), per call, per stream message and per byte; none by default.
    """

    worker: CpuCost
    ps: CpuCost
    aggregate_byte_s: float = 0.0
    update_byte_s: float = 0.0
    cores: float | None = None
    hidden: CpuCost = CpuCost(0.0, 0.0, 0.0)
    load: float = 0.0

    def __post_init__(self) -> None:
        _check_seconds("aggregate_byte_s", self.aggregate_byte_s)
        _check_seconds("update_byte_s", self.update_byte_s)
        if self.cores is not None and not (math.isfinite(self.cores) and self.cores > 0):
            raise ValueError(f"cores={self.cores!r}: must be a finite number > 0, or None")
        if not (math.isfinite(self.load) and self.load >= 0):
            raise ValueError(f"load={self.load!r}: must be a finite number of sessions >= 0")

    def rate(self, runnable: int) -> float:
        """The share of a core each of ``runnable`` tasks gets: ``min(1, cores / (runnable +
        load))``; 1.0 when each task has a host of its own."""
        if self.cores is None:
            return 1.0
        return min(1.0, self.cores / (max(1, runnable) + self.load))

    def exchange(
        self, messages: int, nbytes: int, aggregate_bytes: int
    ) -> tuple[float, float, float]:
        """One worker-PS exchange of 2 calls, ``messages`` stream messages and ``nbytes`` bytes
        (sent plus received, the PS summing ``aggregate_bytes``): the worker's CPU seconds,
        the PS's, and the seconds both work at once."""
        worker = self.worker.time(2, messages, nbytes)
        ps = self.ps.time(2, messages, nbytes) + aggregate_bytes * self.aggregate_byte_s
        return worker, ps, min(self.hidden.time(2, messages, nbytes), worker, ps)

    def describe(self) -> str:
        """One line: the per-call, per-message and per-byte costs, and the shared cores."""

        def side(name: str, cost: CpuCost) -> str:
            return (
                f"{name} {format_duration(cost.rpc_s * 1e9)}/call, "
                f"{format_duration(cost.message_s * 1e9)}/message, "
                f"{format_rate(1 / cost.byte_s) if cost.byte_s > 0 else 'free'} per CPU"
            )

        text = f"CPU: {side('worker', self.worker)}; {side('ps', self.ps)}"
        if self.aggregate_byte_s > 0 or self.update_byte_s > 0:
            text += (
                f"; sum {self.aggregate_byte_s * 1e9:.3g} ns/B, "
                f"update {self.update_byte_s * 1e9:.3g} ns/B"
            )
        hidden = self.hidden
        if hidden.rpc_s or hidden.message_s or hidden.byte_s:
            text += (
                f"; an exchange's ends at once {format_duration(hidden.rpc_s * 1e9)}/call, "
                f"{format_duration(hidden.message_s * 1e9)}/message, "
                f"{hidden.byte_s * 1e9:.3g} ns/B"
            )
        if self.cores is not None:
            text += f"; {self.cores:.3g} cores shared with {self.load:.2g} other sessions"
        return text


# --- one step --------------------------------------------------------------------------------

#: What can limit a step, as :attr:`StepPrediction.limit` names it.
LIMITS = ("ps link", "worker link", "chain", "cores")


@dataclass(frozen=True)
class StepPrediction:
    """The model's prediction for one sync-SGD step of ``profile`` on ``topology`` over ``link``.

    Per PS task ``p`` (indexed as in the placement): ``bytes_per_ps[p]`` it owns, which each
    worker pushes to it and pulls from it; ``shards_per_ps[p]`` shards it owns and
    ``messages_per_ps[p]`` messages each worker sends it each way (the shards, or their
    ``chunk_bytes`` slices); ``bytes_in_per_ps[p] = bytes_out_per_ps[p] = workers *
    bytes_per_ps[p]``; ``ps_link_s[p] = 2 * workers * (calls * alpha + bytes * beta)``, with
    a call per shard, or one per direction when streamed (``chunk_bytes``).
    ``worker_link_s`` is one worker's ``2 * (all calls * alpha + all bytes * beta)``.
    ``bottleneck`` is ``"ps"`` or ``"worker"``, whichever link is slower; ``bottleneck_ps``
    is the busiest PS either way; ``link_s`` the slower link's time.

    With ``host`` costs: ``ps_cpu_s[p]``, ``worker_cpu_s``, ``chain_s``, ``shared_s`` and
    ``utilization`` (``u(b)``) as in the module docstring (0.0, and 1.0, without ``host``;
    ``shared_s`` also without its cores).
    ``comm_s`` is the largest of the busiest PS link, the worker link, ``chain_s`` and
    ``shared_s``; ``limit`` says which (one of :data:`LIMITS`). ``iter_s`` and ``efficiency``
    are as in the module docstring; ``efficiency`` is None when no compute time was given.
    ``imbalance`` is the placement's busiest PS bytes over the mean.
    """

    profile: str
    topology: Topology
    link: LinkFit
    bytes_per_ps: tuple[int, ...]
    shards_per_ps: tuple[int, ...]
    bytes_in_per_ps: tuple[int, ...]
    bytes_out_per_ps: tuple[int, ...]
    ps_link_s: tuple[float, ...]
    worker_link_s: float
    bottleneck: str
    bottleneck_ps: int
    comm_s: float
    compute_s: float
    overlap: float
    backward_share: float
    iter_s: float
    efficiency: float | None
    imbalance: float
    messages_per_ps: tuple[int, ...] = ()
    link_s: float = 0.0
    host: HostCosts | None = None
    ps_cpu_s: tuple[float, ...] = ()
    worker_cpu_s: float = 0.0
    chain_s: float = 0.0
    shared_s: float = 0.0
    limit: str = "ps link"
    utilization: float = 1.0
    ps_links: tuple[LinkFit, ...] | None = None


def _check_fraction(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and 0.0 <= value <= 1.0):
        raise ValueError(f"{name}={value!r}: must be a fraction between 0 and 1")


def _messages(placement: Placement, chunk_bytes: int | None) -> tuple[int, ...]:
    counts = [0] * placement.ps
    for shard in placement.shards:
        counts[shard.ps] += 1 if chunk_bytes is None else max(1, -(-shard.nbytes // chunk_bytes))
    return tuple(counts)


class StepOptions(TypedDict, total=False):
    """The keyword arguments :func:`predict_step` and :func:`project` take besides their
    grid: the fields of :class:`StepTerms`."""

    compute_s: float
    overlap: float
    backward_share: float
    host: HostCosts | None
    chunk_bytes: int | None
    partition_bytes: int
    ps_links: tuple[LinkFit, ...] | None


@dataclass(frozen=True)
class StepTerms:
    """What a step prediction takes besides the profile, the topology and the link.

    ``compute_s``: a step's compute time (input, forward and backward), seconds >= 0;
    ``overlap``: the fraction of the backward pass communication can hide behind;
    ``backward_share``: the backward pass's share of ``compute_s``; ``host``: the CPU
    costs (None: the link alone); ``chunk_bytes``: streams travel in slices of this size
    (None: one message per shard each way); ``partition_bytes``: the ``partitioned``
    sharding cuts tensors above this size; ``ps_links``: each PS task's own link, in task
    order (None: the one link for every PS; a worker's own link is always that one). Bad
    values raise ValueError naming the field.
    """

    compute_s: float = 0.0
    overlap: float = 0.0
    backward_share: float = DEFAULT_BACKWARD_SHARE
    host: HostCosts | None = None
    chunk_bytes: int | None = None
    partition_bytes: int = DEFAULT_PARTITION_BYTES
    ps_links: tuple[LinkFit, ...] | None = None

    def __post_init__(self) -> None:
        compute_s, chunk_bytes = self.compute_s, self.chunk_bytes
        if not (
            isinstance(compute_s, (int, float)) and math.isfinite(compute_s) and compute_s >= 0
        ):
            raise ValueError(f"compute_s={compute_s!r}: must be a finite number of seconds >= 0")
        _check_fraction("overlap", self.overlap)
        _check_fraction("backward_share", self.backward_share)
        if chunk_bytes is not None and (
            isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 1
        ):
            raise ValueError(f"chunk_bytes={chunk_bytes!r}: must be a whole number of bytes >= 1")


def _step(
    profile: Profile,
    topology: Topology,
    placement: Placement,
    link: LinkFit,
    inputs: StepTerms,
) -> StepPrediction:
    compute_s, overlap, backward_share = inputs.compute_s, inputs.overlap, inputs.backward_share
    host, chunk_bytes = inputs.host, inputs.chunk_bytes
    workers = topology.workers
    owned = placement.bytes_per_ps()
    shards = [0] * placement.ps
    for shard in placement.shards:
        shards[shard.ps] += 1
    messages = _messages(placement, chunk_bytes)
    # Streamed, an exchange is two calls whose messages follow each other without waiting:
    # alpha is paid per call. Otherwise every shard is a call of its own, as RecvTensor is.
    calls = tuple(min(m, 1) for m in messages) if chunk_bytes is not None else messages
    links = inputs.ps_links or (link,) * placement.ps
    if len(links) != placement.ps:
        raise ValueError(f"ps_links: {len(links)} links for {placement.ps} PS tasks")
    ps_link = tuple(
        2 * workers * each.time(b, c) for each, b, c in zip(links, owned, calls, strict=True)
    )
    worker_link = 2 * link.time(sum(owned), sum(calls))
    busiest = max(range(placement.ps), key=ps_link.__getitem__)
    link_s = max(ps_link[busiest], worker_link)
    terms = {"ps link": ps_link[busiest], "worker link": worker_link}
    ps_cpu: tuple[float, ...] = ()
    worker_cpu = chain = shared = 0.0
    utilization = 1.0
    if host is not None:
        exchanges = [
            host.exchange(2 * m + 1, 2 * b, b) for b, m in zip(owned, messages, strict=True)
        ]
        ps_cpu = tuple(
            workers * x_ps + b * host.update_byte_s
            for (_, x_ps, _), b in zip(exchanges, owned, strict=True)
        )
        worker_cpu = sum(x_w for x_w, _, _ in exchanges)
        heaviest = max(range(placement.ps), key=ps_cpu.__getitem__)
        x_w, x_ps, hidden = exchanges[heaviest]
        chain = (worker_cpu + ps_cpu[heaviest] - hidden) / host.rate(1)
        utilization = (x_w + x_ps) / (2 * (x_w + x_ps - hidden)) if x_w + x_ps > 0 else 1.0
        if host.cores is not None:
            work = [*ps_cpu, *[worker_cpu] * workers]
            tasks = len(work)
            shared = max(
                sharing_makespan(work, host.rate),
                sum(work) / (utilization * tasks * host.rate(tasks)),
            )
        terms |= {"chain": chain, "cores": shared}
        if ps_cpu[heaviest] > ps_link[busiest]:
            busiest = heaviest
    limit = max(LIMITS[: len(terms)], key=terms.__getitem__)
    comm = terms[limit]
    backward = backward_share * compute_s
    step = compute_s + comm - overlap * min(backward, comm)
    return StepPrediction(
        profile=profile.name,
        topology=topology,
        link=link,
        bytes_per_ps=owned,
        shards_per_ps=tuple(shards),
        bytes_in_per_ps=tuple(workers * b for b in owned),
        bytes_out_per_ps=tuple(workers * b for b in owned),
        ps_link_s=ps_link,
        worker_link_s=worker_link,
        bottleneck="ps" if max(ps_link) >= worker_link else "worker",
        bottleneck_ps=busiest,
        comm_s=comm,
        compute_s=compute_s,
        overlap=overlap,
        backward_share=backward_share,
        iter_s=step,
        efficiency=compute_s / step if compute_s > 0 else None,
        imbalance=placement.imbalance,
        messages_per_ps=messages,
        link_s=link_s,
        host=host,
        ps_cpu_s=ps_cpu,
        worker_cpu_s=worker_cpu,
        chain_s=chain,
        shared_s=shared,
        limit=limit,
        utilization=utilization,
        ps_links=inputs.ps_links,
    )


def sharing_makespan(work: Sequence[float], rate: Callable[[int], float]) -> float:
    """Seconds until every task has done its ``work`` (seconds of one core), when each of the
    ``k`` tasks still running progresses at ``rate(k)`` (egalitarian processor sharing).

    The smallest work finishes first; then the others share what it leaves. With ``rate(k) =
    min(1, cores / k)`` this is at least ``max(work)`` and ``sum(work) / cores``.
    """
    elapsed = done = 0.0
    remaining = sorted(w for w in work if w > 0)
    for index, amount in enumerate(remaining):
        elapsed += (amount - done) / rate(len(remaining) - index)
        done = amount
    return elapsed


def predict_step(
    profile: Profile | str,
    topology: Topology,
    fit: LinkFit,
    *,
    placement: Placement | None = None,
    **options: Unpack[StepOptions],
) -> StepPrediction:
    """Predict one sync-SGD step: the formulas are in the module docstring.

    ``profile`` is a :class:`Profile` or anything :func:`load_profile` reads. The tensors are
    placed on ``topology.ps`` tasks by ``topology.sharding`` (``partitioned`` cuts tensors
    above ``partition_bytes``), as :func:`~pytest_tfgrpc.model.placement.place_profile` does. Every
    message costs ``alpha`` at the link it crosses; a PS's link carries its ``W`` workers'
    messages one after the other, push before pull (the pull waits for the update). A shard
    is one message each way, or, with ``chunk_bytes``, one per slice of that size (as
    :func:`~pytest_tfgrpc.bench.ps.sync_sgd_step` streams them). ``placement``: the profile's
    placement on ``topology`` when the caller already has it (a measured step's own), used as
    is instead of placing again; ValueError if it is over other PS tasks or another sharding.
    ``host`` adds the CPU terms. ``compute_s`` is the compute time of a step (input, forward
    and backward), ``overlap`` the fraction of the backward pass that communication can hide
    behind, ``backward_share`` the backward pass's share of ``compute_s`` (the keyword
    arguments are the fields of :class:`StepTerms`, with its defaults).
    """
    terms = StepTerms(**options)
    model = load_profile(profile)
    placed = placed_on(model, topology, placement, partition_bytes=terms.partition_bytes)
    return _step(model, topology, placed, fit, terms)


def relative_error(predicted_s: float, measured_s: float) -> float:
    """``(predicted - measured) / measured``: positive when the model is pessimistic."""
    if not measured_s > 0:
        raise ValueError(f"measured_s={measured_s!r}: a measured time must be > 0")
    return (predicted_s - measured_s) / measured_s


def prediction_figures(
    prediction: StepPrediction, *, measured_s: float | None = None
) -> list[tuple[str, str]]:
    """``(name, value)`` pairs that put ``prediction`` beside a measured step; the property
    record (:func:`pytest_tfgrpc.report.record.result_properties`) names them
    ``tfgrpc.<label>.<key>.model.<name>``.

    Names: ``step_comm_us``, ``step_us``, ``limit``, ``imbalance``,
    ``bottleneck_ps``, ``busiest_ps_in_bytes``, ``alpha_us``, ``bandwidth_MBps`` (PS 0's
    link), ``links`` (``each PS`` or ``PS 0 for all``: whose links the PS terms use) and, with
    a link per PS, ``busiest_ps_bandwidth_MBps``; with host
    costs ``link_us``, ``chain_us``, ``ps_cpu_us``, ``worker_cpu_us`` and, with cores,
    ``cores``, ``load``, ``utilization`` and ``shared_us``; with a compute time,
    ``efficiency``; with ``measured_s`` (the measured step's median, in seconds),
    ``error_pct``: ``100 * (step - measured) / measured``.
    """
    busiest = prediction.bottleneck_ps
    pairs = [
        ("step_comm_us", repr(prediction.comm_s * 1e6)),
        ("step_us", repr(prediction.iter_s * 1e6)),
        ("limit", prediction.limit),
        ("imbalance", repr(prediction.imbalance)),
        ("bottleneck_ps", str(busiest)),
        ("busiest_ps_in_bytes", str(prediction.bytes_in_per_ps[busiest])),
        ("alpha_us", repr(prediction.link.alpha * 1e6)),
        ("bandwidth_MBps", repr(prediction.link.bandwidth_Bps / 1e6)),
        ("links", "each PS" if prediction.ps_links is not None else "PS 0 for all"),
    ]
    if prediction.ps_links is not None:
        busiest_link = prediction.ps_links[busiest]
        pairs.append(("busiest_ps_bandwidth_MBps", repr(busiest_link.bandwidth_Bps / 1e6)))
    host = prediction.host
    if host is not None:
        pairs += [
            ("link_us", repr(prediction.link_s * 1e6)),
            ("chain_us", repr(prediction.chain_s * 1e6)),
            ("ps_cpu_us", repr(max(prediction.ps_cpu_s) * 1e6)),
            ("worker_cpu_us", repr(prediction.worker_cpu_s * 1e6)),
        ]
        if host.cores is not None:
            pairs += [("cores", repr(host.cores)), ("load", repr(host.load))]
            pairs.append(("utilization", repr(prediction.utilization)))
            pairs.append(("shared_us", repr(prediction.shared_s * 1e6)))
    if prediction.efficiency is not None:
        pairs.append(("efficiency", repr(prediction.efficiency)))
    if measured_s is not None:
        pairs.append(("error_pct", repr(100 * relative_error(prediction.iter_s, measured_s))))
    return pairs


# --- projections ------------------------------------------------------------------------------


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], left: int) -> str:
    """Aligned columns: the first ``left`` to the left, the rest to the right."""
    return "\n".join(align_columns([header, *rows], left))


@dataclass(frozen=True)
class Projection:
    """Predictions over a grid of worker and PS counts, one sharding, one link.

    ``rows`` hold one :class:`StepPrediction` per (workers, ps), workers outermost, in the
    order given to :func:`project`.
    """

    profile: str
    sharding: str
    link: LinkFit
    compute_s: float
    overlap: float
    workers: tuple[int, ...]
    ps: tuple[int, ...]
    rows: tuple[StepPrediction, ...]
    host: HostCosts | None = None

    def row(self, workers: int, ps: int) -> StepPrediction:
        """The prediction for ``workers`` workers and ``ps`` PS tasks."""
        for prediction in self.rows:
            if (prediction.topology.workers, prediction.topology.ps) == (workers, ps):
                return prediction
        raise KeyError(f"the projection has no row for {workers} workers and {ps} PS")

    def describe(self) -> str:
        """The inputs, in one line."""
        text = f"{self.profile}, sharding {self.sharding}, link {self.link.describe()}"
        if self.host is not None:
            text += f"; {self.host.describe()}"
        if self.compute_s > 0:
            text += f", compute {format_duration(self.compute_s * 1e9)}/step"
            text += f", overlap {self.overlap:g} of backward"
        return text

    def format(self) -> str:
        """An aligned table, one line per (workers, ps): the busiest PS's bytes in per step,
        its shards per worker, the placement's imbalance, which link limits the step, the
        communication time, the step time and the efficiency."""
        header = (
            *("workers", "ps", "busiest ps in", "shards", "imbalance", "limit"),
            *("comm", "step", "efficiency"),
        )
        body = []
        for p in self.rows:
            busiest = p.bottleneck_ps
            limit = (
                p.limit.replace("ps", f"ps {busiest}", 1) if p.limit.startswith("ps") else p.limit
            )
            body.append(
                (
                    str(p.topology.workers),
                    str(p.topology.ps),
                    format_size(p.bytes_in_per_ps[busiest]),
                    str(p.shards_per_ps[busiest]),
                    f"{p.imbalance:.2f}",
                    limit,
                    format_duration(p.comm_s * 1e9),
                    format_duration(p.iter_s * 1e9),
                    f"{p.efficiency:.1%}" if p.efficiency is not None else "-",
                )
            )
        return _table(header, body, left=0)

    def format_grid(self) -> str:
        """Workers down, PS tasks across: the efficiency when a compute time was given, else
        the communication time of a step."""
        header = ("workers \\ ps", *(str(ps) for ps in self.ps))
        body = []
        for workers in self.workers:
            cells = [str(workers)]
            for ps in self.ps:
                p = self.row(workers, ps)
                if p.efficiency is not None:
                    cells.append(f"{p.efficiency:.1%}")
                else:
                    cells.append(format_duration(p.comm_s * 1e9))
            body.append(cells)
        return _table(header, body, left=1)


def _counts(name: str, values: Iterable[int]) -> tuple[int, ...]:
    counts = tuple(values)
    if not counts:
        raise ValueError(f"{name}: no counts to project")
    for value in counts:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: {value!r} is not a positive whole number")
    if len(set(counts)) != len(counts):
        raise ValueError(f"{name}: {counts!r} repeats a count")
    return counts


def project(
    profile: Profile | str,
    fit: LinkFit,
    *,
    workers: Iterable[int] = DEFAULT_WORKERS,
    ps: Iterable[int] = DEFAULT_PS,
    sharding: str = "round_robin",
    **options: Unpack[StepOptions],
) -> Projection:
    """:func:`predict_step` for every combination of ``workers`` and ``ps`` counts.

    The default grid is 1, 2, 4, ..., 512 workers by 1, 2, 4, ..., 64 PS tasks: scales that
    cannot run on one machine, from a link measured on it. The other keyword arguments are
    the fields of :class:`StepTerms`.
    """
    terms = StepTerms(**options)
    model = load_profile(profile)
    worker_counts, ps_counts = _counts("workers", workers), _counts("ps", ps)
    placements = {
        p: place_profile(model, p, sharding, partition_bytes=terms.partition_bytes)
        for p in ps_counts
    }
    rows = tuple(
        _step(model, Topology(p, w, sharding), placements[p], fit, terms)
        for w in worker_counts
        for p in ps_counts
    )
    return Projection(
        profile=model.name,
        sharding=sharding,
        link=fit,
        compute_s=terms.compute_s,
        overlap=terms.overlap,
        workers=worker_counts,
        ps=ps_counts,
        rows=rows,
        host=terms.host,
    )
