"""Frozen results of a benchmark run: raw samples, their statistics, named figures.

One family for every benchmark (P2P, PS throughput, sync-SGD steps): a
:class:`BenchmarkResult` holds one :class:`SizeResult` per point (message size, payload or
profile), CPU time is a :class:`CpuTime` per process role, and every figure a result reports
(for JUnit, the terminal summary and budgets) comes from :meth:`SizeResult.figures`, so that
they never disagree about a name or a value. Names and units are declared in
:mod:`pytest_tfgrpc.metrics`.
"""

from __future__ import annotations

import resource
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
import numpy.typing as npt

from pytest_tfgrpc.metrics import METRICS, Metric
from pytest_tfgrpc.stats.summary import Summary, summarize
from pytest_tfgrpc.units import size_label

#: Time figures of every point, from its summary (``step_`` before each for sync-SGD steps).
TIME_FIGURES = ("min", "mean", "p50", "p90", "p99", "p999", "max")
#: The figures a round of a point reports (:meth:`SizeResult.round_figures`).
ROUND_FIGURES = ("mean", "p50", "p90", "p99", "p999", "throughput", "throughput_p50")


@dataclass(frozen=True)
class CpuTime:
    """User and system CPU time of one process (or the sum over a group of processes) over a
    measured phase, in nanoseconds."""

    user_ns: int
    system_ns: int

    @property
    def total_ns(self) -> int:
        return self.user_ns + self.system_ns


def process_cpu_ns() -> tuple[int, int]:
    """This process's user and system CPU time so far (``getrusage``), in nanoseconds."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return int(usage.ru_utime * 1e9), int(usage.ru_stime * 1e9)


@dataclass(frozen=True)
class PSLoad:
    """What one PS task carried during the measured phase.

    ``placed_bytes`` is what the payload or placement gives this PS per RPC or per step;
    ``bytes_in``/``bytes_out`` are the tensor bytes the PS itself counted; ``transport`` what
    the kernel saw of its connections from the job's start to its end (warm-up included;
    None where nothing was read).
    """

    task: int
    target: str
    pid: int
    placed_bytes: int
    bytes_in: int
    bytes_out: int
    rpcs: int
    steps: int
    cpu: CpuTime
    transport: Transport | None = None


@dataclass(frozen=True)
class Cluster:
    """The parameter-server topology a result was measured on."""

    ps: int
    workers: int
    sharding: str

    def describe(self) -> str:
        """``2ps_3workers_round_robin``, as the ``topology`` property records it."""
        return f"{self.ps}ps_{self.workers}workers_{self.sharding}"


@dataclass(frozen=True)
class Figure:
    """One named figure of one point, in its metric's base unit (ns, B/s, 1/s, a ratio, a
    count or bytes; :mod:`pytest_tfgrpc.metrics` declares each name and unit).

    ``scope`` is empty for a figure of the whole point, ``ps<i>`` for one PS task's, ``workers``
    for all workers'.
    """

    metric: Metric
    value: float
    scope: str = ""

    @classmethod
    def of(cls, name: str, value: float, scope: str = "") -> Figure:
        """The figure of the registered metric ``name``; KeyError for an unknown name."""
        return cls(METRICS[name], value, scope)


@dataclass(frozen=True)
class Transport:
    """What the kernel saw of a point's connections over its measured windows (between
    timed loops, never inside them: :mod:`pytest_tfgrpc.wire.telemetry`), both ends where
    they could be read (here, and on a server's host through its node agent).

    Counts are sums of each window's change: ``retransmits`` (TCP segments retransmitted,
    both ends, for segments lost: less ``spurious_retransmits``, those the receiver reported
    as duplicates with D-SACK, sent again when an ack was late), ``data_segs_out``,
    ``bytes_sent``, ``bytes_acked`` (of the connections'
    sockets), ``link_bytes``, ``link_drops``, ``link_errors`` (the fabric interfaces' bytes,
    drops and errors, both directions), ``qdisc_drops`` (their root qdiscs'); None where
    nothing was read. ``rtt_ns``, ``rttvar_ns``, ``cwnd`` and ``delivery_rate_Bps`` are the
    data sender's (the socket that sent most) smoothed RTT, its mean deviation, congestion
    window (segments) and delivery rate, one reading at the end of each window.
    ``nominal_Bps`` is the path's nominal rate (bytes/s: the lowest ``tbf`` rate, reported
    speed or named rate of the links read; None where none is known) and ``nominal_source``
    says where it came from. ``sides`` names where telemetry was read (``local``, a host).
    """

    connections: int
    retransmits: int
    data_segs_out: int
    bytes_sent: int
    bytes_acked: int
    rtt_ns: tuple[float, ...] = ()
    rttvar_ns: tuple[float, ...] = ()
    cwnd: tuple[float, ...] = ()
    delivery_rate_Bps: tuple[float, ...] = ()
    link_bytes: int | None = None
    link_drops: int | None = None
    link_errors: int | None = None
    qdisc_drops: int | None = None
    nominal_Bps: float | None = None
    nominal_source: str = ""
    sides: tuple[str, ...] = ()
    spurious_retransmits: int = 0

    @property
    def retransmits_per_MB(self) -> float:
        """Retransmitted segments per MB (1e6 bytes) sent."""
        return self.retransmits * 1e6 / self.bytes_sent if self.bytes_sent else 0.0

    @property
    def loss_share(self) -> float:
        """Retransmitted segments / data segments sent."""
        return self.retransmits / self.data_segs_out if self.data_segs_out else 0.0


def _median(values: Sequence[float]) -> float | None:
    return float(np.median(values)) if values else None


def _tcp_figures(tcp: Transport, scope: str = "") -> list[Figure]:
    """The counts, medians and link counters of ``tcp``, as figures of ``scope``."""
    out = [
        Figure.of("retransmits", float(tcp.retransmits), scope),
        Figure.of("spurious_retransmits", float(tcp.spurious_retransmits), scope),
        Figure.of("retransmits_per_MB", tcp.retransmits_per_MB, scope),
        Figure.of("tcp_bytes_sent", float(tcp.bytes_sent), scope),
        Figure.of("tcp_bytes_acked", float(tcp.bytes_acked), scope),
    ]
    for name, values in (
        ("rtt_p50", tcp.rtt_ns),
        ("rttvar_p50", tcp.rttvar_ns),
        ("cwnd_p50", tcp.cwnd),
        ("delivery_rate_p50", tcp.delivery_rate_Bps),
    ):
        median = _median(values)
        if median is not None:
            out.append(Figure.of(name, median, scope))
    for name, count in (
        ("link_drops", tcp.link_drops),
        ("link_errors", tcp.link_errors),
        ("qdisc_drops", tcp.qdisc_drops),
    ):
        if count is not None:
            out.append(Figure.of(name, float(count), scope))
    return out


@dataclass(frozen=True)
class Limit:
    """What bounded a point, by the rule of :mod:`pytest_tfgrpc.report.limits`: ``kind`` is
    ``link``, ``loss``, ``cpu``, ``latency`` or ``unknown``; ``side`` the role a CPU limit
    names (``client``, ``server``, ``ps<i>``, ``workers``); ``used`` the figures the verdict
    was drawn from, by name (``efficiency``, ``loss_share``, ``client_cpu_share``, ...)."""

    kind: str
    side: str = ""
    used: tuple[tuple[str, float], ...] = ()

    def describe(self) -> str:
        """``cpu-bound (client): client_cpu_share=0.97 server_cpu_share=0.41``."""
        name = "unknown" if self.kind == "unknown" else f"{self.kind}-bound"
        if self.side:
            name += f" ({self.side})"
        used = " ".join(f"{key}={value:.3g}" for key, value in self.used)
        return f"{name}: {used}" if used else name


def find_figure(figures: Sequence[Figure], metric: str) -> Figure | None:
    """The figure of the metric named ``metric`` (a whole point's), or None."""
    return next((fig for fig in figures if fig.metric.name == metric and not fig.scope), None)


def _no_cpu() -> Mapping[str, CpuTime]:
    return MappingProxyType({})


def _no_wait() -> Mapping[str, int]:
    return MappingProxyType({})


@dataclass(frozen=True, eq=False)
class SizeResult:
    """The samples and figures of one point of a result: a message size, a payload, a placed
    profile (PS throughput) or a profile's sync-SGD steps.

    ``samples_ns`` holds the duration of every timed operation (an echo round trip, a push
    until its acknowledgement, an RPC to a PS, or a step: the slowest worker's push and pull),
    warm-up excluded; ``summary`` is computed from all of them. ``cpu`` holds the CPU time of
    each process role over the measured phase: ``client`` and ``server`` (P2P), ``workers``
    (PS benchmarks, summed over the workers); each PS task's is in its ``per_ps`` load.

    Parameter-server points also carry: ``key`` (the point's name when it is not a size),
    ``step`` (samples are sync-SGD steps: time figures are named ``step_*``), ``rate_per_s``
    (RPCs or steps per second over all workers), ``rate_Bps`` (bytes per second over all
    workers), ``per_ps``, ``imbalance`` (the placement's: busiest PS bytes / mean) and
    ``bytes_imbalance`` (the same ratio of the bytes each PS received in a closed loop).

    An all-reduce point is a ``step`` point with ``bus_factor`` (nccl-tests' ``2 (n - 1) /
    n`` for ``n`` ranks): its figures add ``algbw`` (``size_bytes`` over the median) and
    ``busbw`` (``algbw * bus_factor``).

    ``transport`` is what the kernel saw of the point's connections (:class:`Transport`),
    ``cpu_wait`` the time each local side's threads waited on a run queue for a CPU (ns, by
    role), ``limit`` what bounded the point (:class:`Limit`); None or empty where not read.

    ``rounds`` holds, when the point was measured in several rounds interleaved in time with
    the other points (P2P), the sample count of each round, in order: ``samples_ns`` is the
    rounds one after the other (see :meth:`round_figures`).
    """

    size_bytes: int
    wire_bytes: int
    samples_ns: npt.NDArray[np.int64] = field(repr=False)
    summary: Summary
    elapsed_ns: int
    payload: str = ""
    buffers: tuple[int, ...] = ()
    cpu: Mapping[str, CpuTime] = field(default_factory=_no_cpu)
    key: str = ""
    step: bool = False
    rate_per_s: float | None = None
    rate_Bps: float | None = None
    per_ps: tuple[PSLoad, ...] = ()
    imbalance: float | None = None
    bytes_imbalance: float | None = None
    rounds: tuple[int, ...] = ()
    transport: Transport | None = None
    cpu_wait: Mapping[str, int] = field(default_factory=_no_wait)
    limit: Limit | None = None
    bus_factor: float | None = None

    @classmethod
    def from_samples(
        cls,
        size_bytes: int,
        wire_bytes: int,
        samples_ns: npt.NDArray[np.int64],
        elapsed_ns: int,
        **extra: Any,
    ) -> SizeResult:
        """Freeze the samples of one point (read-only) with their statistics; ``extra`` sets
        the other fields (``payload`` names a generated payload, ``skew-10x``, and ``buffers``
        lists the exact sizes of the buffers it is made of; a plain size has neither)."""
        samples = np.ascontiguousarray(samples_ns, dtype=np.int64)
        samples.setflags(write=False)
        cpu = extra.pop("cpu", None)
        return cls(
            size_bytes,
            wire_bytes,
            samples,
            summarize(samples),
            elapsed_ns,
            cpu=MappingProxyType(dict(cpu or {})),
            **extra,
        )

    @property
    def label(self) -> str:
        """The point as named in JUnit properties: its key, the payload's name (``skew-10x``),
        or its size as people write it (``64KiB``)."""
        return self.key or self.payload or size_label(self.size_bytes)

    @property
    def count(self) -> int:
        return self.summary.count

    @property
    def throughput_Bps(self) -> float:
        """Payload bytes moved per second: over all workers for a PS point, else over all timed
        operations."""
        if self.rate_Bps is not None:
            return self.rate_Bps
        total_ns = int(self.samples_ns.sum())
        return self.size_bytes * self.count * 1e9 / total_ns if total_ns else 0.0

    @property
    def throughput_p50_Bps(self) -> float:
        """Payload bytes per second of the median operation."""
        return self.size_bytes * 1e9 / self.summary.p50_ns if self.summary.p50_ns else 0.0

    def figures(self, *, rates: bool = True) -> tuple[Figure, ...]:
        """Every figure of this point; ``rates`` adds the throughput figures. Per-PS figures
        carry the scope ``ps<i>``, the workers' CPU time the scope ``workers``."""
        s = self.summary
        times = (s.min_ns, s.mean_ns, s.p50_ns, s.p90_ns, s.p99_ns, s.p999_ns, s.max_ns)
        prefix = "step_" if self.step else ""
        out = [
            Figure.of(prefix + name, float(v)) for name, v in zip(TIME_FIGURES, times, strict=True)
        ]
        if rates:
            out.append(Figure.of("throughput", self.throughput_Bps))
            if self.rate_Bps is None:  # one operation's bytes over its time: P2P only
                out.append(Figure.of("throughput_p50", self.throughput_p50_Bps))
        if self.rate_per_s is not None:
            out.append(Figure.of("step_rate" if self.step else "rpc_rate", self.rate_per_s))
            per_op = "bytes_per_step" if self.step else "bytes_per_rpc_round"
            out.append(Figure.of(per_op, float(self.size_bytes)))
        if self.bus_factor is not None:
            out.append(Figure.of("algbw", self.throughput_p50_Bps))
            out.append(Figure.of("busbw", self.throughput_p50_Bps * self.bus_factor))
        if self.imbalance is not None:
            out.append(Figure.of("imbalance", self.imbalance))
        if self.bytes_imbalance is not None:
            out.append(Figure.of("bytes_imbalance", self.bytes_imbalance))
        for role, cpu in self.cpu.items():
            scoped = role not in ("client", "server")
            metric = "cpu" if scoped else f"{role}_cpu"
            scope = role if scoped else ""
            out.append(Figure.of(f"{metric}_user", float(cpu.user_ns), scope))
            out.append(Figure.of(f"{metric}_system", float(cpu.system_ns), scope))
        for role, waited in self.cpu_wait.items():
            out.append(Figure.of(f"{role}_cpu_wait", float(waited)))
        out.append(Figure.of("samples", float(s.count)))
        out.extend(self._transport_figures(rates))
        for load in self.per_ps:
            where = f"ps{load.task}"
            out.append(Figure.of("bytes_in", float(load.bytes_in), where))
            out.append(Figure.of("bytes_out", float(load.bytes_out), where))
            out.append(Figure.of("rpcs", float(load.rpcs), where))
            out.append(Figure.of("cpu_user", float(load.cpu.user_ns), where))
            out.append(Figure.of("cpu_system", float(load.cpu.system_ns), where))
            if load.transport is not None:
                out.extend(_tcp_figures(load.transport, where))
        return tuple(out)

    def _transport_figures(self, rates: bool) -> list[Figure]:
        tcp = self.transport
        if tcp is None:
            return []
        out = _tcp_figures(tcp)
        if tcp.nominal_Bps:
            out.append(Figure.of("link_rate", tcp.nominal_Bps))
            if rates and self.rate_Bps is None:
                out.append(Figure.of("efficiency", self.throughput_Bps / tcp.nominal_Bps))
        return out

    def round_figures(self, *, rates: bool = True) -> dict[str, tuple[float, ...]]:
        """Per round (:attr:`rounds`), the figures that replicate: mean, p50, p90, p99, p999
        (ns) and, with ``rates``, throughput and throughput_p50 (B/s); empty when the point
        was measured in one round."""
        if len(self.rounds) < 2:
            return {}
        out: dict[str, list[float]] = {}
        start = 0
        for count in self.rounds:
            part = SizeResult.from_samples(
                self.size_bytes, self.wire_bytes, self.samples_ns[start : start + count], 0
            )
            start += count
            for fig in part.figures(rates=rates):
                if fig.metric.name in ROUND_FIGURES:
                    out.setdefault(fig.metric.name, []).append(fig.value)
        return {metric: tuple(values) for metric, values in out.items()}

    def figure(self, metric: str, *, rates: bool = True) -> Figure | None:
        return find_figure(self.figures(rates=rates), metric)


@dataclass(frozen=True)
class End:
    """One end of a measured path: the role that ran there (``client``, ``server``, ``ps0``,
    ``worker1``), the host it ran on, and the address its traffic used (the server's listening
    address; a client's source address toward the server)."""

    role: str
    host: str
    address: str

    def describe(self) -> str:
        """``role=host@address``, as ``tfgrpc.placement`` writes a role."""
        return f"{self.role}={self.host}@{self.address}"


@dataclass(frozen=True, eq=False)
class BenchmarkResult:
    """What one benchmark call measured, over one or more message sizes.

    ``label`` names the result in JUnit (``tfgrpc.<label>.<size>.<metric>``); it is the
    benchmark's name unless the test gave another. ``rpc`` and ``mode`` say which RPC shape
    and encoding were measured; ``settings`` records everything else that shapes the figures
    (warm-up, chunk size, allocator settings, grpcio and Python versions). ``cluster`` is the
    parameter-server topology of a PS benchmark, None for P2P. ``ends`` says where the figures
    came from: the host and address of each end (client and server; every PS task and worker),
    empty where no one recorded them.
    """

    benchmark: str
    label: str
    fabric: str
    target: str
    mode: str
    rpc: str
    sizes: tuple[SizeResult, ...]
    settings: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    cluster: Cluster | None = None
    ends: tuple[End, ...] = ()

    @property
    def reports_rates(self) -> bool:
        """Latency benchmarks (an echo, a ping-pong) have no meaningful rate."""
        return not self.benchmark.endswith("latency")

    @property
    def topology(self) -> str:
        """``2ps_3workers_round_robin`` for a PS result, ``""`` for P2P."""
        return self.cluster.describe() if self.cluster is not None else ""

    def point(self, label: str) -> SizeResult:
        """The point named ``label`` (a size label, payload or profile key)."""
        for point in self.sizes:
            if point.label == label:
                return point
        raise KeyError(f"{self.label} measured no payload {label!r}")

    def model_predictions(self) -> Mapping[str, Sequence[tuple[str, str]]]:
        """The analytic model's prediction beside each point that has one: point label ->
        ``(name, value)`` pairs (:func:`~pytest_tfgrpc.model.analytic.prediction_figures`);
        none here."""
        return {}
