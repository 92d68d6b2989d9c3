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
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from pytest_tfgrpc.profiles import Profile, load_profile
from pytest_tfgrpc.results import BenchmarkResult
from pytest_tfgrpc.topology import Placement, Topology, place
from pytest_tfgrpc.units import format_duration, format_rate, format_size

__all__ = [
    "DEFAULT_BACKWARD_SHARE",
    "DEFAULT_PS",
    "DEFAULT_WORKERS",
    "LinkFit",
    "Projection",
    "StepPrediction",
    "fit",
    "fit_from_results",
    "link_point",
    "predict_step",
    "prediction_properties",
    "project",
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
        if self.r_squared is not None and self.max_relative_error is not None:
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


# --- one step --------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepPrediction:
    """The model's prediction for one sync-SGD step of ``profile`` on ``topology`` over ``link``.

    Per PS task ``p`` (indexed as in the placement): ``bytes_per_ps[p]`` it owns, which each
    worker pushes to it and pulls from it; ``shards_per_ps[p]`` messages each worker sends it
    each way; ``bytes_in_per_ps[p] = bytes_out_per_ps[p] = workers * bytes_per_ps[p]``;
    ``ps_link_s[p] = 2 * workers * (shards * alpha + bytes * beta)``. ``worker_link_s`` is one
    worker's ``2 * (all shards * alpha + all bytes * beta)``. ``bottleneck`` is ``"ps"`` or
    ``"worker"``, whichever link is slower; ``bottleneck_ps`` is the busiest PS either way.
    ``comm_s``, ``iter_s`` and ``efficiency`` are as in the module docstring; ``efficiency`` is
    None when no compute time was given. ``imbalance`` is the placement's busiest PS bytes over
    the mean.
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


def _check_fraction(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and 0.0 <= value <= 1.0):
        raise ValueError(f"{name}={value!r}: must be a fraction between 0 and 1")


def _step(
    profile: Profile,
    topology: Topology,
    placement: Placement,
    link: LinkFit,
    compute_s: float,
    overlap: float,
    backward_share: float,
) -> StepPrediction:
    workers = topology.workers
    owned = placement.bytes_per_ps()
    shards = [0] * placement.ps
    for shard in placement.shards:
        shards[shard.ps] += 1
    ps_link = tuple(2 * workers * link.time(b, m) for b, m in zip(owned, shards, strict=True))
    worker_link = 2 * link.time(sum(owned), sum(shards))
    busiest = max(range(placement.ps), key=ps_link.__getitem__)
    comm = max(ps_link[busiest], worker_link)
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
        bottleneck="ps" if ps_link[busiest] >= worker_link else "worker",
        bottleneck_ps=busiest,
        comm_s=comm,
        compute_s=compute_s,
        overlap=overlap,
        backward_share=backward_share,
        iter_s=step,
        efficiency=compute_s / step if compute_s > 0 else None,
        imbalance=placement.imbalance,
    )


def _check_step_inputs(compute_s: float, overlap: float, backward_share: float) -> None:
    if not (isinstance(compute_s, (int, float)) and math.isfinite(compute_s) and compute_s >= 0):
        raise ValueError(f"compute_s={compute_s!r}: must be a finite number of seconds >= 0")
    _check_fraction("overlap", overlap)
    _check_fraction("backward_share", backward_share)


def _placement(profile: Profile, ps: int, sharding: str) -> Placement:
    return place([(spec.name, spec.nbytes) for spec in profile.tensors], ps, sharding)


def predict_step(
    profile: Profile | str,
    topology: Topology,
    fit: LinkFit,
    *,
    compute_s: float = 0.0,
    overlap: float = 0.0,
    backward_share: float = DEFAULT_BACKWARD_SHARE,
) -> StepPrediction:
    """Predict one sync-SGD step: the formulas are in the module docstring.

    ``profile`` is a :class:`Profile` or anything :func:`load_profile` reads. The tensors are
    placed on ``topology.ps`` tasks by ``topology.sharding``. Every message costs ``alpha`` at
    the link it crosses; a PS's link carries its ``W`` workers' messages one after the other,
    push before pull (the pull waits for the update). ``compute_s`` is the compute time of a
    step (input, forward and backward), ``overlap`` the fraction of the backward pass that
    communication can hide behind, ``backward_share`` the backward pass's share of
    ``compute_s``.
    """
    _check_step_inputs(compute_s, overlap, backward_share)
    model = load_profile(profile)
    placement = _placement(model, topology.ps, topology.sharding)
    return _step(model, topology, placement, fit, compute_s, overlap, backward_share)


def prediction_properties(prediction: StepPrediction, label: str) -> list[tuple[str, str]]:
    """JUnit properties that put ``prediction`` beside a measured result labelled ``label``.

    ``tfgrpc.<label>.model.<metric>`` for ``step_comm_us``, ``step_us``, ``imbalance``,
    ``bottleneck_ps``, ``busiest_ps_in_bytes``, ``alpha_us``, ``bandwidth_MBps`` and, with a
    compute time, ``efficiency``.
    """
    prefix = f"tfgrpc.{label}.model."
    busiest = prediction.bottleneck_ps
    pairs = [
        ("step_comm_us", repr(prediction.comm_s * 1e6)),
        ("step_us", repr(prediction.iter_s * 1e6)),
        ("imbalance", repr(prediction.imbalance)),
        ("bottleneck_ps", str(busiest)),
        ("busiest_ps_in_bytes", str(prediction.bytes_in_per_ps[busiest])),
        ("alpha_us", repr(prediction.link.alpha * 1e6)),
        ("bandwidth_MBps", repr(prediction.link.bandwidth_Bps / 1e6)),
    ]
    if prediction.efficiency is not None:
        pairs.append(("efficiency", repr(prediction.efficiency)))
    return [(prefix + name, value) for name, value in pairs]


# --- projections ------------------------------------------------------------------------------


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], left: int) -> str:
    """Aligned columns: the first ``left`` to the left, the rest to the right."""
    lines = [tuple(header), *(tuple(row) for row in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = []
    for line in lines:
        cells = [
            cell.ljust(width) if i < left else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(line, widths, strict=True))
        ]
        out.append("  ".join(cells).rstrip())
    return "\n".join(out)


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

    def row(self, workers: int, ps: int) -> StepPrediction:
        """The prediction for ``workers`` workers and ``ps`` PS tasks."""
        for prediction in self.rows:
            if (prediction.topology.workers, prediction.topology.ps) == (workers, ps):
                return prediction
        raise KeyError(f"the projection has no row for {workers} workers and {ps} PS")

    def describe(self) -> str:
        """The inputs, in one line."""
        text = f"{self.profile}, sharding {self.sharding}, link {self.link.describe()}"
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
            limit = f"ps {busiest}" if p.bottleneck == "ps" else "worker"
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
    compute_s: float = 0.0,
    overlap: float = 0.0,
    backward_share: float = DEFAULT_BACKWARD_SHARE,
) -> Projection:
    """:func:`predict_step` for every combination of ``workers`` and ``ps`` counts.

    The default grid is 1, 2, 4, ..., 512 workers by 1, 2, 4, ..., 64 PS tasks: scales that
    cannot run on one machine, from a link measured on it.
    """
    _check_step_inputs(compute_s, overlap, backward_share)
    model = load_profile(profile)
    worker_counts, ps_counts = _counts("workers", workers), _counts("ps", ps)
    placements = {p: _placement(model, p, sharding) for p in ps_counts}
    rows = tuple(
        _step(
            model, Topology(p, w, sharding), placements[p], fit, compute_s, overlap, backward_share
        )
        for w in worker_counts
        for p in ps_counts
    )
    return Projection(
        profile=model.name,
        sharding=sharding,
        link=fit,
        compute_s=compute_s,
        overlap=overlap,
        workers=worker_counts,
        ps=ps_counts,
        rows=rows,
    )
