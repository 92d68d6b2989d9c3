"""Cluster-scale projection of sync-SGD efficiency: parameter servers and all-reduce, with
calibration from measured scaling points.

This is the model ``tfgrpc-model`` projects to hundreds of workers with. It has the link terms
of :mod:`~pytest_tfgrpc.model.analytic` (no host CPU terms: those describe one machine) and the
terms published scaling curves need. Every term is a field of :class:`ClusterTerms` and can be
switched off (0, False) to see what it contributes.

A step with ``W`` workers and ``P`` PS tasks. PS ``p`` owns ``B_p`` bytes in ``m_p`` tensors
(the placement: :mod:`~pytest_tfgrpc.model.placement`), ``S`` and ``M`` the model's bytes and
tensors. Every worker pushes its gradients, every PS waits for all ``W`` pushes, updates, and
every worker pulls the new weights (synchronous SGD with a PS, as TensorFlow's
``SyncReplicasOptimizer`` and tf_cnn_benchmarks' ``parameter_server`` mode run it)::

    t_ps(p)   = 2 * (W * B_p / B_fanin + W * m_p * alpha)   push phase + pull phase at PS p
    t_worker  = 2 * (S / B_link + M * alpha)                a worker's own link
    t_comm    = max(max_p t_ps(p), t_worker, t_core)

``B_fanin`` (``bandwidth_Bps``) is the rate at which one PS takes in the pushes of many workers
at once: an aggregate, as ``ps_throughput`` measures it with many workers, not one P2P
stream's rate (Mathuriya et al., arXiv:1712.09388, blame the low bandwidth a PS reaches over
gRPC for the collapse at 512 workers). ``B_link`` (``link_Bps``) is a worker's own link,
``B_fanin`` when not given.

**Colocation** (``colocated``): PS tasks run on worker hosts (PS ``p`` on host ``p mod W``), as
the CSCS runs did ("nodes running Workers also run Parameter Servers as this leads to higher
performance": e-bug/distributed-tensorflow-benchmarks, report/source/benchmarks.tex). The
host's own worker then reaches its PS tasks without the network, and the host's link carries
its PS tasks' traffic and its worker's in each phase. For a host with PS set ``Q`` owning
``B_Q`` bytes: in the push phase ``in = (W - 1) B_Q`` and ``out = S - B_Q``; the pull phase
mirrors it. **Full duplex** (``duplex``, the default; Ethernet, InfiniBand and Aries links
are): a phase takes ``max(in, out) / B_fanin``; half duplex: ``(in + out) / B_fanin``. Without
colocation each phase moves data one way through each link, and duplex changes nothing.

**Overlap** (``overlap``, ``o``): a fraction of the pushes hides behind the backward pass
(gradients are sent as they are produced) and a fraction of the pulls behind the forward pass
(a layer's weights are needed only when the forward pass reaches it). With ``t_b =
backward_share * t_c`` and ``t_f = t_c - t_b``::

    hidden = o * (min(t_b, t_comm / 2) + min(t_f, t_comm / 2))

**Fixed loss** (``fixed``, ``f``): a per-step cost of distribution that does not grow with the
bytes (synchronisation barrier, ``global_step`` update, token queues), as a fraction of
``t_c``, with more than one worker. **Stragglers** (``straggler``, ``s``): each worker's
compute time varies with relative standard deviation ``s`` and a synchronous step waits for
the slowest; the expected maximum of ``W`` such times is at most ``t_c (1 + s sqrt(2 ln W))``
(the Gaussian maximal inequality), used as its estimate::

    t_iter     = t_c (1 + s sqrt(2 ln W) + f [W > 1]) + t_comm - hidden
    efficiency = t_c / t_iter            (weak scaling: each worker keeps its batch)

**Network core** (``core_Bps``, ``C``; None: never congests): the network's aggregate
(bisection) capacity, which every byte that leaves a host crosses. A fabric whose core is
oversubscribed (a fat tree with fewer uplinks than hosts, cloud instances outside a cluster
placement group) caps the whole cluster's rate, so its time grows with ``W`` however many PS
tasks share the load: ``t_core = 2 * X / C`` with ``X = W S`` bytes per phase (``(W - 1) S``
colocated: each host's worker reaches its own PS tasks locally; ``2 (N - 1) S`` for a ring
all-reduce). A curve whose throughput stops growing (e-bug/distributed-tensorflow-benchmarks,
p2.xlarge: 826, 996, 1078 images/s at 32, 64, 128 workers) shows it.

**All-reduce** (:func:`allreduce_step`): the workers reduce the gradients among themselves, no
PS. A ring of ``N`` workers moves ``2 (N - 1) / N`` of ``S`` through each link in ``2 (N - 1)``
steps (reduce-scatter, then all-gather), each paying ``alpha`` per fused buffer; recursive
halving and doubling (Rabenseifner; Thakur, Rabenseifner and Gropp, IJHPCA 2005) moves the same
bytes in ``2 log2 N`` steps::

    ring:               t_comm = 2 (N - 1) / N * S / B_link + 2 (N - 1) * alpha * buffers
    halving_doubling:   t_comm = 2 (N - 1) / N * S / B_link + 2 ceil(log2 N) * alpha * buffers

``buffers`` is 1 when the tensors are fused into one buffer (Horovod's Tensor Fusion), ``M``
otherwise. ``S / t_comm`` is nccl-tests' ``algbw`` and ``algbw * 2 (N - 1) / N`` its
``busbw`` (NVIDIA/nccl-tests, doc/PERFORMANCE.md). The bytes and step counts are Thakur,
Rabenseifner and Gropp's (IJHPCA 19(1), 2005, section 4: ring for the reduce-scatter and the
all-gather, Rabenseifner's recursive halving then doubling). The same overlap, fixed and
straggler terms apply.

**A worker's CPU per all-reduce step** (``worker_cpu``, a
:class:`~pytest_tfgrpc.model.analytic.CpuCost`; None: off): at every step a rank sends one
piece of ``n_k`` bytes, takes one and sums it in, and its process spends ``c(n_k) = rpc_s +
2 n_k byte_s`` of CPU on it (serialising, the RPC, parsing, the sum). A step cannot take less
than that, and on a host whose ``cores`` CPUs the ``N`` ranks share with ``load`` other runnable
sessions each rank runs at ``rate = min(1, cores / (N + load))`` of a core
(:func:`allreduce_time`)::

    t_comm = sum_k max(buffers alpha + n_k / B_link, (buffers rpc_s + 2 n_k byte_s) / rate)

with ``n_k = S / N`` at each of the ring's ``2 (N - 1)`` steps, and ``S / 2, S / 4, ..., S /
N, ..., S / 4, S / 2`` at halving-doubling's (``N`` not a power of two: the same bytes in ``2
ceil(log2 N)`` equal pieces). On a cluster each rank has a host of its own (``rate`` 1); on
one machine the CPU term is what sets the step (a loopback's link is that machine's memory).

**Ranks sharing cores** (``step_s``): where several ranks share a machine's cores, a step costs
more than each rank's CPU at its share. Every step ends with each rank blocked on a peer's
piece; its wake-up waits in the run queue behind the ranks that run, and the context switches
and cold caches make each rank's CPU per step larger than with a core of its own (4 ranks on 2
cores against 2 ranks, this machine, quiet: +48% CPU per step, 1.3-1.5 of 2 cores busy;
``benchmarks/experiments/allreduce_sharing.py``). No model of a scheduler is fitted for it: the
run's own ranks, in their own placement, all-reduce a small buffer, and its step, less its
pieces' bytes, is the fixed part of every step::

    t_comm = sum_k max(buffers alpha + n_k / B_link, buffers step_s + 2 n_k byte_s / rate)

:func:`calibrate` fits the free terms to measured ``(W, P, efficiency)`` points by
``scipy.optimize.least_squares``, with the uncertainty of each from the Jacobian at the
solution (``cov = s^2 (J^T J)^-1``, ``s^2`` the residual variance) and says which terms the
points could not pin down.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from pytest_tfgrpc.model.analytic import CpuCost
from pytest_tfgrpc.model.placement import Placement, place_profile
from pytest_tfgrpc.model.profiles import Profile, load_profile

__all__ = [
    "ALLREDUCE_ALGORITHMS",
    "FITTABLE",
    "Calibration",
    "ClusterTerms",
    "FittedTerm",
    "MeasuredPoint",
    "ScalingPoint",
    "allreduce_pieces",
    "allreduce_step",
    "allreduce_time",
    "bus_factor",
    "calibrate",
    "describe_allreduce_cpu",
    "ps_step",
]

ALLREDUCE_ALGORITHMS = ("ring", "halving_doubling")

#: The terms :func:`calibrate` can fit, and the bounds it keeps them in.
FITTABLE: dict[str, tuple[float, float]] = {
    "bandwidth": (1e3, 1e13),  # bytes/s (fitted as log10)
    "overlap": (0.0, 1.0),
    "fixed": (0.0, 10.0),
    "straggler": (0.0, 2.0),
    "alpha": (0.0, 1.0),  # seconds
    "core": (1e3, 1e15),  # bytes/s (fitted as log10)
}
_LOG_TERMS = ("bandwidth", "core")
#: Where :func:`calibrate` starts besides the caller's values, for each term (log10 for the
#: bandwidths); the terms in ``_CROSSED`` start at every combination with the starts before
#: them, the others one at a time. The model has kinks (a max over PS tasks, hiding that
#: saturates), and a bandwidth traded against the overlap gives local minima: fitted to Piz
#: Daint's W <= 32 points from overlap 0 it stopped at overlap 0.87 (rms 1.6 points), from
#: 0.9 it reached overlap 0.99 (rms 1.45).
_STARTS: dict[str, tuple[float, ...]] = {
    "bandwidth": (6.0, 7.0, 8.0, 9.0, 10.0, 11.0),
    "core": (6.0, 7.0, 8.0, 9.0, 10.0, 11.0),
    "overlap": (0.5, 0.95),
}
_CROSSED = ("overlap",)


def _fraction(name: str, value: float) -> None:
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise ValueError(f"{name}={value!r}: must be a fraction between 0 and 1")


@dataclass(frozen=True)
class ClusterTerms:
    """The inputs of a cluster-scale step (see the module docstring for each).

    ``compute_s``: compute time of one worker's step, seconds (> 0). ``bandwidth_Bps``: a PS's
    fan-in bandwidth, bytes/s. ``alpha_s``: seconds per message. ``link_Bps``: a worker's own
    link (None: ``bandwidth_Bps``). ``overlap``, ``backward_share``: fractions. ``fixed``:
    per-step loss with more than one worker, a fraction of ``compute_s`` (>= 0).
    ``straggler``: relative standard deviation of a worker's compute time (>= 0).
    ``colocated``: PS tasks share hosts with workers. ``duplex``: links carry both directions
    at full rate. ``worker_cpu``: a worker's CPU per all-reduce step (None: not counted).
    ValueError names a bad field.
    """

    compute_s: float
    bandwidth_Bps: float
    alpha_s: float = 0.0
    link_Bps: float | None = None
    overlap: float = 0.0
    fixed: float = 0.0
    straggler: float = 0.0
    backward_share: float = 2.0 / 3.0
    colocated: bool = False
    duplex: bool = True
    core_Bps: float | None = None
    worker_cpu: CpuCost | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.compute_s) and self.compute_s > 0):
            raise ValueError(f"compute_s={self.compute_s!r}: must be a time > 0 seconds")
        for name in ("bandwidth_Bps", "link_Bps", "core_Bps"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name}={value!r}: a bandwidth must be finite and > 0")
        for name in ("alpha_s", "fixed", "straggler"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}={value!r}: must be finite and >= 0")
        _fraction("overlap", self.overlap)
        _fraction("backward_share", self.backward_share)

    @property
    def worker_link_Bps(self) -> float:
        return self.link_Bps if self.link_Bps is not None else self.bandwidth_Bps

    def describe(self) -> str:
        """The terms in one line, bandwidths in MB/s."""
        text = (
            f"compute {self.compute_s * 1e3:.4g} ms/step, fan-in bandwidth "
            f"{self.bandwidth_Bps / 1e6:.4g} MB/s, alpha {self.alpha_s * 1e6:.4g} us"
        )
        if self.link_Bps is not None:
            text += f", worker link {self.link_Bps / 1e6:.4g} MB/s"
        if self.core_Bps is not None:
            text += f", network core {self.core_Bps / 1e6:.4g} MB/s"
        text += (
            f", overlap {self.overlap:.3g}, fixed loss {self.fixed:.3g}, straggler sd "
            f"{self.straggler:.3g}, {'colocated' if self.colocated else 'separate'} PS hosts, "
            f"{'full' if self.duplex else 'half'} duplex"
        )
        if self.worker_cpu is not None:
            text += f", {describe_allreduce_cpu(self.worker_cpu)}"
        return text


def describe_allreduce_cpu(cpu: CpuCost) -> str:
    """A worker's CPU per all-reduce step in words: per step, and the bytes it sends or takes
    per CPU second."""
    rate = f", bytes at {1 / cpu.byte_s / 1e6:.4g} MB/s of CPU" if cpu.byte_s > 0 else ""
    return f"a worker's CPU {cpu.rpc_s * 1e6:.4g} us per all-reduce step{rate}"


@dataclass(frozen=True)
class ScalingPoint:
    """One predicted step: ``pattern`` ``"ps"`` or an all-reduce algorithm; times in seconds;
    ``limit`` names the term that sets ``comm_s`` (``ps <p>``, ``host <h>``, ``worker link``,
    ``ring``, ...); ``imbalance`` the placement's (1.0 for all-reduce)."""

    workers: int
    ps: int
    pattern: str
    efficiency: float
    step_s: float
    comm_s: float
    hidden_s: float
    limit: str
    imbalance: float = 1.0

    def as_dict(self) -> dict[str, object]:
        return {
            "workers": self.workers,
            "ps": self.ps,
            "pattern": self.pattern,
            "efficiency": self.efficiency,
            "step_s": self.step_s,
            "comm_s": self.comm_s,
            "hidden_s": self.hidden_s,
            "limit": self.limit,
            "imbalance": self.imbalance,
        }


def _finish(
    workers: int, ps: int, pattern: str, comm: float, limit: str, terms: ClusterTerms, imb: float
) -> ScalingPoint:
    t_c = terms.compute_s
    backward = terms.backward_share * t_c
    forward = t_c - backward
    hidden = terms.overlap * (min(backward, comm / 2) + min(forward, comm / 2))
    spread = terms.straggler * math.sqrt(2 * math.log(workers)) if workers > 1 else 0.0
    fixed = terms.fixed if workers > 1 else 0.0
    step = t_c * (1 + spread + fixed) + comm - hidden
    return ScalingPoint(workers, ps, pattern, t_c / step, step, comm, hidden, limit, imb)


def _check_counts(workers: int, ps: int) -> None:
    for name, value in (("workers", workers), ("ps", ps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r}: must be a whole number >= 1")


def ps_step(
    profile: Profile | str,
    workers: int,
    ps: int,
    terms: ClusterTerms,
    *,
    sharding: str = "round_robin",
    placement: Placement | None = None,
) -> ScalingPoint:
    """A sync-SGD step with ``ps`` PS tasks and ``workers`` workers (module docstring).

    ``placement``: the profile already placed on ``ps`` tasks (saves placing it again)."""
    _check_counts(workers, ps)
    model = load_profile(profile)
    placed = placement if placement is not None else place_profile(model, ps, sharding)
    if placed.ps != ps:
        raise ValueError(f"placement over {placed.ps} PS tasks for a step with {ps}")
    owned = placed.bytes_per_ps()
    tensors = [0] * ps
    for shard in placed.shards:
        tensors[shard.ps] += 1
    total, messages = sum(owned), sum(tensors)
    fanin, alpha = terms.bandwidth_Bps, terms.alpha_s
    worker = 2 * (total / terms.worker_link_Bps + messages * alpha)
    candidates: dict[str, float] = {"worker link": worker}
    if terms.colocated:
        hosts = min(workers, ps)
        host_bytes = [0] * hosts
        host_messages = [0] * hosts
        for p in range(ps):
            host_bytes[p % hosts] += owned[p]
            host_messages[p % hosts] += tensors[p]
        for h in range(hosts):
            inbound = (workers - 1) * host_bytes[h]
            outbound = total - host_bytes[h]
            moved = max(inbound, outbound) if terms.duplex else inbound + outbound
            calls = (workers - 1) * host_messages[h] + (messages - host_messages[h])
            candidates[f"host {h}"] = 2 * (moved / fanin + calls * alpha)
    else:
        for p in range(ps):
            candidates[f"ps {p}"] = 2 * workers * (owned[p] / fanin + tensors[p] * alpha)
    if terms.core_Bps is not None:
        crossing = (workers - 1 if terms.colocated else workers) * total
        candidates["network core"] = 2 * crossing / terms.core_Bps
    limit = max(candidates, key=candidates.__getitem__)
    return _finish(workers, ps, "ps", candidates[limit], limit, terms, placed.imbalance)


def allreduce_step(
    profile: Profile | str,
    workers: int,
    terms: ClusterTerms,
    *,
    algorithm: str = "ring",
    fused: bool = True,
) -> ScalingPoint:
    """An all-reduce step among ``workers`` workers (module docstring); ``fused``: one buffer
    per step (Horovod's Tensor Fusion), else one all-reduce per tensor. ``ps`` is 0."""
    _check_counts(workers, 1)
    if algorithm not in ALLREDUCE_ALGORITHMS:
        raise ValueError(
            f"algorithm={algorithm!r}: known all-reduce algorithms: "
            f"{', '.join(ALLREDUCE_ALGORITHMS)}"
        )
    model = load_profile(profile)
    n = workers
    buffers = 1 if fused else model.num_tensors
    if n == 1:
        return _finish(1, 0, algorithm, 0.0, algorithm, terms, 1.0)
    comm, link, _ = allreduce_time(
        model.total_bytes,
        n,
        algorithm,
        alpha_s=terms.alpha_s,
        link_Bps=terms.worker_link_Bps,
        cpu=terms.worker_cpu,
        buffers=buffers,
    )
    limit = algorithm if comm <= link else "worker cpu"
    if terms.core_Bps is not None:
        core = 2 * (n - 1) * model.total_bytes / terms.core_Bps
        if core > comm:
            comm, limit = core, "network core"
    return _finish(n, 0, algorithm, comm, limit, terms, 1.0)


def bus_factor(ranks: int) -> float:
    """nccl-tests' all-reduce bus factor ``2 (n - 1) / n``: ``busbw = algbw * bus_factor``
    (NVIDIA/nccl-tests, doc/PERFORMANCE.md)."""
    return 2 * (ranks - 1) / ranks


def allreduce_pieces(nbytes: float, ranks: int, algorithm: str) -> tuple[float, ...]:
    """The bytes one rank sends (and takes) at each step of an all-reduce of ``nbytes`` among
    ``ranks`` ranks (module docstring); they add up to ``bus_factor(ranks) * nbytes``. Raises
    ValueError for an unknown algorithm or fewer than two ranks."""
    if algorithm not in ALLREDUCE_ALGORITHMS:
        raise ValueError(
            f"algorithm={algorithm!r}: known all-reduce algorithms: "
            f"{', '.join(ALLREDUCE_ALGORITHMS)}"
        )
    if ranks < 2:
        raise ValueError(f"ranks={ranks!r}: an all-reduce needs two or more")
    if algorithm == "ring":
        return (nbytes / ranks,) * (2 * (ranks - 1))
    levels = math.ceil(math.log2(ranks))
    if ranks & (ranks - 1):
        return (bus_factor(ranks) * nbytes / (2 * levels),) * (2 * levels)
    halving = tuple(nbytes / 2**k for k in range(1, levels + 1))
    return halving + halving[::-1]


def allreduce_time(
    nbytes: float,
    ranks: int,
    algorithm: str,
    *,
    alpha_s: float,
    link_Bps: float,
    cpu: CpuCost | None = None,
    rate: float = 1.0,
    buffers: int = 1,
    whole_s: float = 0.0,
    step_s: float | None = None,
) -> tuple[float, float, float]:
    """Seconds of one all-reduce (module docstring): ``(t_comm, link, host)``, ``link`` the
    sum of the steps' link times alone, ``host`` of their CPU times at ``rate`` of a core
    (0 without ``cpu``) plus ``whole_s / rate``; ``t_comm`` takes the larger of the two at
    each step, plus ``whole_s / rate``. ``whole_s``: a rank's CPU seconds per all-reduce on
    its whole buffer outside the steps (copying its input in, verifying the sum), which the
    ranks sharing the cores pay between steps. ``buffers`` all-reduces of the pieces' total
    run one after the other (unfused tensors). ``step_s``: a step's fixed seconds measured
    where the ranks share cores (among the run's own ranks, in their own placement, at a small
    size), which then replaces ``cpu.rpc_s / rate`` (module docstring: ranks sharing cores);
    None: each rank's fixed CPU per step at ``rate``."""
    if not 0 < rate <= 1:
        raise ValueError(f"rate={rate!r}: a share of a core, in (0, 1]")
    if not (math.isfinite(whole_s) and whole_s >= 0):
        raise ValueError(f"whole_s={whole_s!r}: CPU seconds, finite and >= 0")
    if step_s is not None and not (math.isfinite(step_s) and step_s >= 0):
        raise ValueError(f"step_s={step_s!r}: seconds per step, finite and >= 0")
    total = host = whole_s / rate
    link = 0.0
    for piece in allreduce_pieces(nbytes, ranks, algorithm):
        on_link = buffers * alpha_s + piece / link_Bps
        on_host = 0.0
        if cpu is not None:
            fixed = buffers * step_s if step_s is not None else cpu.time(buffers, 0, 0) / rate
            on_host = fixed + cpu.time(0, 0, 2 * piece) / rate
        total += max(on_link, on_host)
        link += on_link
        host += on_host
    return total, link, host


# --- calibration -------------------------------------------------------------------------------


@dataclass(frozen=True)
class MeasuredPoint:
    """A measured scaling point: ``efficiency`` a fraction (1.0 = linear scaling); ``source``
    says where it comes from (a file's line, a paper's table). ``placement``: where this
    point's run put the tensors, when it differs from the calibration's ``sharding`` (points
    run in several modes, each with its own placement); None: placed by that sharding."""

    workers: int
    ps: int
    efficiency: float
    source: str = ""
    placement: Placement | None = None

    def __post_init__(self) -> None:
        _check_counts(self.workers, self.ps)
        if self.placement is not None and self.placement.ps != self.ps:
            raise ValueError(
                f"placement over {self.placement.ps} PS tasks for a point with {self.ps}"
            )
        if not (math.isfinite(self.efficiency) and self.efficiency > 0):
            raise ValueError(
                f"efficiency={self.efficiency!r} at {self.workers} workers: must be > 0"
            )


@dataclass(frozen=True)
class FittedTerm:
    """A fitted term: ``value`` (bandwidth in bytes/s, alpha in seconds), ``sd`` its standard
    uncertainty (None where it cannot be estimated), ``pinned`` whether the points determine
    it, and ``why`` not."""

    name: str
    value: float
    sd: float | None
    pinned: bool
    why: str = ""

    def as_dict(self) -> dict[str, object]:
        return {
            "value": self.value,
            "sd": self.sd,
            "pinned": self.pinned,
            **({"why": self.why} if self.why else {}),
        }


@dataclass(frozen=True)
class Calibration:
    """:func:`calibrate`'s result: ``terms`` with the fitted values put in, each fitted term,
    the points with their predictions and residuals (predicted - measured efficiency)."""

    terms: ClusterTerms
    fitted: tuple[FittedTerm, ...]
    points: tuple[MeasuredPoint, ...]
    predicted: tuple[float, ...]
    sharding: str
    profile: str
    rms: float
    warnings: tuple[str, ...] = field(default=())

    @property
    def residuals(self) -> tuple[float, ...]:
        return tuple(p - m.efficiency for p, m in zip(self.predicted, self.points, strict=True))

    def unpinned(self) -> tuple[str, ...]:
        return tuple(term.name for term in self.fitted if not term.pinned)


def _apply(terms: ClusterTerms, names: Sequence[str], x: np.ndarray) -> ClusterTerms:
    values: dict[str, float] = {}
    for name, value in zip(names, x, strict=True):
        if name == "bandwidth":
            values["bandwidth_Bps"] = float(10.0**value)
        elif name == "core":
            values["core_Bps"] = float(10.0**value)
        elif name == "alpha":
            values["alpha_s"] = float(value)
        else:
            values[name] = float(value)
    return replace(terms, **values)  # type: ignore[arg-type]


def _start(terms: ClusterTerms, name: str) -> float:
    if name == "bandwidth":
        return math.log10(terms.bandwidth_Bps)
    if name == "core":
        return math.log10(terms.core_Bps) if terms.core_Bps is not None else 12.0
    if name == "alpha":
        return terms.alpha_s
    return float(getattr(terms, name))


def calibrate(
    points: Iterable[MeasuredPoint],
    profile: Profile | str,
    terms: ClusterTerms,
    *,
    free: Sequence[str] = ("bandwidth", "overlap", "fixed"),
    sharding: str = "round_robin",
) -> Calibration:
    """Fit the ``free`` terms (names in :data:`FITTABLE`) of ``terms`` to measured points.

    Minimises the squared differences of predicted and measured efficiency with
    ``scipy.optimize.least_squares`` (trust-region reflective, within :data:`FITTABLE`'s
    bounds; the bandwidth as its log10 so that its scale does not matter), started from
    ``terms`` and from a spread of bandwidths crossed with a spread of overlaps
    (``_STARTS``), keeping the best. The model has kinks (a
    ``max`` over PS tasks), so finite-difference Jacobians are used, as least_squares does by
    default. Uncertainties: ``cov = s^2 pinv(J^T J)`` with ``s^2 = SSR / (n - k)`` for ``n``
    points and ``k`` free terms. A term is not pinned down when no point's prediction moves
    with it, when it ends at a bound, when there are no more points than free terms, or when
    its uncertainty exceeds its value (the bandwidth: a factor of 2). A point with its own
    ``placement`` is predicted with it, the others with ``sharding``. Raises ValueError for
    an unknown term, no points, or a point's placement of other bytes than the profile's.
    """
    from scipy.optimize import least_squares  # heavy import, only where a fit runs

    measured = tuple(points)
    if not measured:
        raise ValueError("no measured points to calibrate on")
    names = tuple(free)
    for name in names:
        if name not in FITTABLE:
            raise ValueError(f"cannot fit {name!r}; fittable terms: {', '.join(FITTABLE)}")
    if len(set(names)) != len(names):
        raise ValueError(f"free terms {names!r} repeat a term")
    model = load_profile(profile)
    by_ps = {p.ps: place_profile(model, p.ps, sharding) for p in measured if p.placement is None}
    placements = [by_ps[p.ps] if p.placement is None else p.placement for p in measured]
    for point, placed in zip(measured, placements, strict=True):
        if placed.total_bytes != model.total_bytes:
            raise ValueError(
                f"the placement at {point.workers} workers holds {placed.total_bytes} bytes; "
                f"profile {model.name!r} has {model.total_bytes}"
            )
    target = np.array([p.efficiency for p in measured])

    def predict(current: ClusterTerms) -> np.ndarray:
        return np.array(
            [
                ps_step(model, p.workers, p.ps, current, placement=placed).efficiency
                for p, placed in zip(measured, placements, strict=True)
            ]
        )

    if not names:
        predicted = predict(terms)
        rms = float(np.sqrt(np.mean((predicted - target) ** 2)))
        return Calibration(
            terms, (), measured, tuple(float(v) for v in predicted), sharding, model.name, rms
        )
    lower = np.array(
        [math.log10(FITTABLE[n][0]) if n in _LOG_TERMS else FITTABLE[n][0] for n in names]
    )
    upper = np.array(
        [math.log10(FITTABLE[n][1]) if n in _LOG_TERMS else FITTABLE[n][1] for n in names]
    )

    def residuals(x: np.ndarray) -> np.ndarray:
        difference: np.ndarray = predict(_apply(terms, names, x)) - target
        return difference

    first = np.clip([_start(terms, n) for n in names], lower, upper)
    starts = [first]
    for term, spread in _STARTS.items():
        if term in names:
            index = names.index(term)
            crossed = list(starts) if term in _CROSSED else [first]
            for value in spread:
                for start in crossed:
                    moved = start.copy()
                    moved[index] = value
                    starts.append(moved)
    best = None
    for x0 in starts:
        # Start strictly inside the bounds: trf needs an interior point.
        x0 = np.clip(x0, lower + 1e-9 * (upper - lower), upper - 1e-9 * (upper - lower))
        result = least_squares(residuals, x0, bounds=(lower, upper), diff_step=1e-4)
        if best is None or result.cost < best.cost:
            best = result
    assert best is not None
    x = best.x
    jac = np.asarray(best.jac)
    n, k = len(measured), len(names)
    ssr = float(2 * best.cost)
    dof = n - k
    cov = None
    if dof > 0:
        cov = (ssr / dof) * np.linalg.pinv(jac.T @ jac)
    sensitivity = np.abs(jac).max(axis=0)
    at_bound = np.asarray(best.active_mask) != 0
    fitted: list[FittedTerm] = []
    for i, name in enumerate(names):
        sd_x = float(math.sqrt(max(cov[i, i], 0.0))) if cov is not None else None
        why = ""
        inside = (
            lower[i] + 1e-6 * (upper[i] - lower[i]) < x[i] < upper[i] - 1e-6 * (upper[i] - lower[i])
        )
        # A bound first: least_squares hands back no slope for a term held at a bound (its
        # Jacobian column is zero there), which would read as no point depending on it.
        if at_bound[i] or not inside:
            why = f"ends at its bound ({_shown(name, x[i])})"
        elif sensitivity[i] < 1e-6:
            why = "no point's efficiency depends on it"
        elif cov is None:
            why = f"{n} points for {k} free terms: no residual left to judge it"
        elif name in _LOG_TERMS:
            if sd_x is not None and sd_x > math.log10(2):
                factor = f"{10**sd_x:.3g}" if sd_x < 6 else "more than 1e6"
                why = f"uncertain by more than a factor of 2 (x/{factor})"
        elif sd_x is not None and sd_x > abs(x[i]):
            why = "its uncertainty exceeds its value"
        if name in _LOG_TERMS:
            value = float(10.0 ** x[i])
            # The relative sd of a log-normal estimate, for small sd_x about ln(10) sd_x.
            sd = value * (10.0 ** min(sd_x, 6.0) - 1) if sd_x is not None else None
        else:
            value, sd = float(x[i]), sd_x
        fitted.append(FittedTerm(name, value, sd, not why, why))
    final = _apply(terms, names, x)
    predicted = predict(final)
    warnings = []
    if n < 4:
        warnings.append(f"fitted on {n} points (fewer than 4): the fit cannot be judged")
    return Calibration(
        final,
        tuple(fitted),
        measured,
        tuple(float(v) for v in predicted),
        sharding,
        model.name,
        float(np.sqrt(np.mean((predicted - target) ** 2))),
        tuple(warnings),
    )


def _shown(name: str, x: float) -> str:
    if name in _LOG_TERMS:
        return f"{10**x / 1e6:.4g} MB/s"
    if name == "alpha":
        return f"{x * 1e6:.4g} us"
    return f"{x:.4g}"
