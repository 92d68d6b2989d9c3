"""The metric registry: every figure the plugin records, declared once.

Each :class:`Metric` says what a figure is called, in which :class:`Unit` it is held and written
(the unit's suffix ends its JUnit property name: ``p99_us``, ``throughput_MBps``,
``rpc_rate_per_s``), which direction is better, whether a budget may limit it, and whether and
how the baseline gate tests it (:class:`GateTest`). Budgets, the JUnit writer and reader
(:mod:`pytest_tfgrpc.report.record`), the terminal summary, plots, the gate,
``tfgrpc-compare`` and ``tfgrpc-model`` all look figures up here, so that none of them can know
a name, a unit or a direction the others do not.

Layer: below ``results`` (a figure's name is a :class:`Metric`), above ``stats`` and
``units``; may import only ``units``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType

from pytest_tfgrpc.units import (
    UnitError,
    format_duration,
    format_rate,
    parse_duration_ns,
    parse_rate_Bps,
)

__all__ = [
    "BENCHMARKS",
    "BUDGET_METRICS",
    "BYTES",
    "COUNT",
    "FLOOR_SUFFIX",
    "GATED",
    "METRICS",
    "PER_SECOND",
    "RATE",
    "RATIO",
    "SIGNIFICANT",
    "TIME",
    "GateTest",
    "Metric",
    "Unit",
    "budget_metrics_of",
    "is_floor",
    "plain_number",
    "significant",
    "stream_label",
]

#: The benchmarks, by the name their results carry (``BenchmarkResult.benchmark``).
P2P_LATENCY, P2P_BANDWIDTH, PS_THROUGHPUT, SYNC_SGD_STEP, ALLREDUCE = BENCHMARKS = (
    "p2p_latency",
    "p2p_bandwidth",
    "ps_throughput",
    "sync_sgd_step",
    "allreduce",
)

#: A transport floor's label is its gRPC result's label with this suffix (``p2p_latency_floor``).
FLOOR_SUFFIX = "_floor"


def is_floor(label: str) -> bool:
    """Whether a result label names a raw-TCP transport floor rather than a gRPC measurement."""
    return label.endswith(FLOOR_SUFFIX) and len(label) > len(FLOOR_SUFFIX)


def stream_label(label: str, stream: int) -> str:
    """The label of stream ``stream`` (from 0) of a ``streams=N`` result labelled ``label``
    (``p2p_bandwidth_stream0``); the aggregate keeps ``label``."""
    return f"{label}_stream{stream}"


def _number(text: str, what: str, example: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise UnitError(
            f"cannot read {text!r} as {what}: expected a finite number such as {example}"
        )
    return value


def _parse_ratio(text: str) -> float:
    return _number(text.strip(), "a ratio", "1.2")


def _parse_per_second(text: str) -> float:
    return _number(text.strip().removesuffix("/s").strip(), "a rate per second", "'>=500'")


def _not_a_limit(text: str) -> float:
    raise UnitError(f"cannot read {text!r}: this figure takes no budget")


@dataclass(frozen=True)
class Unit:
    """How figures of one kind are held, written into properties, read from budgets and shown.

    ``base`` is the unit values are held in (``ns``, ``B/s``, ``1/s``, ``ratio``, ``count``,
    ``B``); a property value is ``value / scale`` followed in its name by ``_<suffix>`` (none
    when ``suffix`` is empty). ``integer`` figures are written as whole numbers. ``parse`` reads a
    budget limit's text into the base unit (raising :class:`~pytest_tfgrpc.units.UnitError`),
    ``format`` shows a base value; ``default_op`` is a budget's direction when none is written,
    ``numbers`` whether a budget may be a bare int or float, ``example`` a limit for messages.
    """

    name: str
    base: str
    suffix: str
    scale: float
    integer: bool
    parse: Callable[[str], float]
    format: Callable[[float], str]
    default_op: str
    numbers: bool
    example: str

    def property_value(self, value: float) -> str:
        """``value`` (base unit) as a property writes it, with the digits its precision
        supports and no binary-float noise (``558.609167``, not ``558.6091670000001``): times
        to the nanosecond the clock reads, other figures to :data:`SIGNIFICANT` significant
        digits, counts as whole numbers."""
        if self.integer:
            return str(int(value))
        if self.base == "ns":
            return plain_number(value / self.scale, decimals=round(math.log10(self.scale)))
        return significant(value / self.scale)

    def read_value(self, text: str) -> float:
        """A property value back in the base unit; ValueError when it is not a number."""
        return float(text) * self.scale


#: Significant digits of a figure that is not a time: a rate or a ratio of times read to the
#: nanosecond over operations of microseconds or more carries no more.
SIGNIFICANT = 6


def plain_number(value: float, decimals: int) -> str:
    """``value`` with at most ``decimals`` decimals, no trailing zeros, never an exponent."""
    text = f"{value:.{max(decimals, 0)}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def significant(value: float, digits: int = SIGNIFICANT) -> str:
    """``value`` to ``digits`` significant digits, written without an exponent
    (``698.123``, ``1234570``, ``0.000123457``)."""
    if value == 0 or not math.isfinite(value):
        return repr(value) if not math.isfinite(value) else "0"
    magnitude = math.floor(math.log10(abs(value)))
    decimals = digits - 1 - magnitude
    if decimals < 0:
        scale = 10 ** (-decimals)
        return str(int(round(value / scale) * scale))
    return plain_number(value, decimals)


def _format_count(value: float) -> str:
    return f"{value:.0f}"


TIME = Unit(
    "time", "ns", "us", 1e3, False, parse_duration_ns, format_duration, "<=", False, "'2ms'"
)
RATE = Unit(
    "rate", "B/s", "MBps", 1e6, False, parse_rate_Bps, format_rate, ">=", False, "'>=1 GB/s'"
)
PER_SECOND = Unit(
    "per second", "1/s", "per_s", 1.0, False, _parse_per_second, "{:.4g}/s".format, ">=", True,
    "'>=500'",
)  # fmt: skip
RATIO = Unit("ratio", "ratio", "", 1.0, False, _parse_ratio, "{:.3g}".format, "<=", True, "'<=1.2'")
COUNT = Unit("count", "count", "", 1.0, True, _not_a_limit, _format_count, "<=", True, "")
BYTES = Unit("bytes", "B", "", 1.0, True, _not_a_limit, _format_count, "<=", True, "")


class GateTest(str, Enum):
    """How the baseline gate tests a figure's change for significance.

    ``U``: the Mann-Whitney U test on the sketched duration samples (central figures and rates,
    a rate being work over those durations). ``BOOTSTRAP``: a bootstrap confidence interval of a
    tail quantile's ratio. ``RATIO``: a figure the run fixes rather than samples (a placement's
    imbalance): any change beyond the tolerance counts, no significance test is needed.
    ``NONE``: not gated; :attr:`Metric.not_gated` says why.
    """

    U = "mann-whitney-u"
    BOOTSTRAP = "bootstrap"
    RATIO = "ratio"
    NONE = "none"


@dataclass(frozen=True)
class Metric:
    """One figure the plugin can record.

    ``quantile`` is set for percentiles (0.99 for p99): budgets need enough samples for it and
    the gate bootstraps it. ``higher_is_better`` for rates. ``budget``: a budget may limit it.
    ``gate``: how the baseline gate tests it; ``by_default``: gated whether or not a tolerance
    names it. ``not_gated`` says why a figure with ``gate=NONE`` is not. ``scoped``: recorded
    per PS task or for the workers (``tfgrpc.<label>.<key>.ps<i>.<metric>``), not per point;
    ``per_ps``: recorded per point and also per PS task (a PS task's transport telemetry).
    ``recorded_by``: the benchmarks (:data:`BENCHMARKS`) whose results carry a budget
    metric, so that a budget a test's benchmarks can never meet is refused before measuring.
    """

    name: str
    unit: Unit
    description: str
    quantile: float | None = None
    higher_is_better: bool = False
    budget: bool = False
    gate: GateTest = GateTest.NONE
    by_default: bool = False
    not_gated: str = ""
    scoped: bool = False
    per_ps: bool = False
    recorded_by: tuple[str, ...] = ()

    @property
    def kind(self) -> Unit:
        """The unit, as budgets call it (a time, a rate, a ratio, per second)."""
        return self.unit

    @property
    def property_suffix(self) -> str:
        """The last part of the figure's property name: ``p99_us``, ``imbalance``."""
        return f"{self.name}_{self.unit.suffix}" if self.unit.suffix else self.name

    @property
    def gated(self) -> bool:
        return self.gate is not GateTest.NONE


_EXTREME = "a single extreme sample, which no test can gate"
_CPU = "one CPU-time reading per run: no samples to test a change against"
_FIXED = "fixed by the payload and topology, not measured"
_COUNT = "a count set by the run settings"
_TOTAL = "one PS task's total over the run: no samples to test a change against"
_TCP = "transport telemetry read between timed loops: context for the gated figures"


def _times(prefix: str, what: str, recorded_by: tuple[str, ...]) -> list[Metric]:
    def t(name: str, q: float | None, gate: GateTest, default: bool, why: str = "") -> Metric:
        return Metric(
            prefix + name,
            TIME,
            f"{name} {what}",
            quantile=q,
            budget=True,
            gate=gate,
            by_default=default,
            not_gated=why,
            recorded_by=recorded_by,
        )

    return [
        t("min", None, GateTest.NONE, False, _EXTREME),
        t("mean", None, GateTest.U, False),
        t("p50", 0.5, GateTest.U, True),
        t("p90", 0.9, GateTest.BOOTSTRAP, False),
        # A P2P p99 is not gated unless a tolerance names it: tested across runs, a round's p99
        # (the 2nd-largest of ~100 samples) is heavy-tailed on a shared machine, and failed
        # 2 of 19 unchanged runs in benchmarks/gate_calibration.py where p50 failed none.
        t("p99", 0.99, GateTest.BOOTSTRAP, prefix == "step_"),
        t("p999", 0.999, GateTest.BOOTSTRAP, False),
        t("max", None, GateTest.NONE, False, _EXTREME),
    ]


def _tcp(name: str, unit: Unit, description: str, *, higher_is_better: bool = False) -> Metric:
    """A transport-telemetry figure: context for the gated ones, recorded per point and per
    PS task."""
    return Metric(
        name, unit, description, higher_is_better=higher_is_better, not_gated=_TCP, per_ps=True
    )


def _cpu(who: str, scoped: bool = False) -> list[Metric]:
    return [
        Metric(f"{who}cpu_{part}", TIME, f"{part} CPU time", not_gated=_CPU, scoped=scoped)
        for part in ("user", "system")
    ]


_ALL: list[Metric] = [
    *_times("", "time per operation", (P2P_LATENCY, P2P_BANDWIDTH, PS_THROUGHPUT)),
    Metric(
        "throughput",
        RATE,
        "payload bytes moved / time measured",
        higher_is_better=True,
        budget=True,
        gate=GateTest.U,
        by_default=True,
        recorded_by=(P2P_BANDWIDTH, PS_THROUGHPUT, SYNC_SGD_STEP, ALLREDUCE),
    ),
    Metric(
        "throughput_p50",
        RATE,
        "payload bytes / median time",
        higher_is_better=True,
        budget=True,
        gate=GateTest.U,
        recorded_by=(P2P_BANDWIDTH,),
    ),
    *_times("step_", "time per sync-SGD step or all-reduce", (SYNC_SGD_STEP, ALLREDUCE)),
    # nccl-tests' all-reduce figures (NVIDIA/nccl-tests, doc/PERFORMANCE.md), at the median.
    Metric(
        "algbw",
        RATE,
        "all-reduce algorithm bandwidth: buffer bytes / median all-reduce time",
        higher_is_better=True,
        budget=True,
        gate=GateTest.U,
        recorded_by=(ALLREDUCE,),
    ),
    Metric(
        "busbw",
        RATE,
        "all-reduce bus bandwidth: algbw * 2 (n - 1) / n, comparable with a link's rate",
        higher_is_better=True,
        budget=True,
        gate=GateTest.U,
        recorded_by=(ALLREDUCE,),
    ),
    Metric(
        "rpc_rate",
        PER_SECOND,
        "PS throughput: RPCs per second over all workers",
        higher_is_better=True,
        budget=True,
        gate=GateTest.U,
        by_default=True,
        recorded_by=(PS_THROUGHPUT,),
    ),
    Metric(
        "step_rate",
        PER_SECOND,
        "sync-SGD steps (or all-reduces) per second",
        higher_is_better=True,
        budget=True,
        gate=GateTest.U,
        by_default=True,
        recorded_by=(SYNC_SGD_STEP, ALLREDUCE),
    ),
    Metric(
        "imbalance",
        RATIO,
        "the placement's load imbalance: busiest PS bytes / mean PS bytes",
        budget=True,
        gate=GateTest.RATIO,
        by_default=True,
        recorded_by=(PS_THROUGHPUT, SYNC_SGD_STEP),
    ),
    Metric(
        "bytes_imbalance",
        RATIO,
        "measured: bytes the busiest PS received / mean, in a closed loop",
        not_gated="one closed-loop value per run, which moves between runs: no samples to test",
    ),
    Metric(
        "bytes_per_step",
        BYTES,
        "bytes pushed and pulled per step (an all-reduce: its buffer)",
        not_gated=_FIXED,
    ),
    Metric("bytes_per_rpc_round", BYTES, "bytes of one RPC to every PS", not_gated=_FIXED),
    Metric("samples", COUNT, "operations timed", not_gated=_COUNT),
    *_cpu("client_"),
    *_cpu("server_"),
    *(
        Metric(f"{who}_cpu_wait", TIME, "time its threads waited for a CPU", not_gated=_CPU)
        for who in ("client", "server")
    ),
    *_cpu("", scoped=True),
    Metric("bytes_in", BYTES, "tensor bytes a PS received", not_gated=_TOTAL, scoped=True),
    Metric("bytes_out", BYTES, "tensor bytes a PS sent", not_gated=_TOTAL, scoped=True),
    Metric("rpcs", COUNT, "RPCs a PS served", not_gated=_TOTAL, scoped=True),
    # Transport telemetry (pytest_tfgrpc.wire.telemetry): what the kernel saw meanwhile.
    _tcp(
        "retransmits",
        COUNT,
        "TCP segments retransmitted for loss, both ends (spurious ones not counted)",
    ),
    _tcp(
        "spurious_retransmits",
        COUNT,
        "TCP retransmissions the receiver reported as duplicates (D-SACK): no loss",
    ),
    _tcp("retransmits_per_MB", RATIO, "TCP segments retransmitted per MB sent"),
    _tcp("tcp_bytes_sent", BYTES, "bytes the connections' sockets sent"),
    _tcp("tcp_bytes_acked", BYTES, "bytes the connections' sockets had acked"),
    _tcp("rtt_p50", TIME, "the data sender's smoothed TCP RTT, median reading"),
    _tcp("rttvar_p50", TIME, "that RTT's mean deviation, median reading"),
    _tcp("cwnd_p50", RATIO, "the sender's congestion window (segments)"),
    _tcp(
        "delivery_rate_p50",
        RATE,
        "the sender's TCP delivery rate, median reading",
        higher_is_better=True,
    ),
    _tcp("link_drops", COUNT, "packets the fabric interfaces dropped"),
    _tcp("link_errors", COUNT, "receive and send errors of the fabric interfaces"),
    _tcp("qdisc_drops", COUNT, "packets the fabric interfaces' qdiscs dropped"),
    Metric("link_rate", RATE, "the path's nominal rate", higher_is_better=True, not_gated=_FIXED),
    Metric(
        "efficiency",
        RATIO,
        "link efficiency: throughput / the path's nominal rate",
        higher_is_better=True,
        budget=True,
        gate=GateTest.U,
        recorded_by=(P2P_BANDWIDTH,),
    ),
]

#: Every figure, by name.
METRICS: Mapping[str, Metric] = MappingProxyType({m.name: m for m in _ALL})
#: The figures a budget may limit, in the order error messages list them.
BUDGET_METRICS: Mapping[str, Metric] = MappingProxyType({m.name: m for m in _ALL if m.budget})
#: The figures the baseline gate can test.
GATED: Mapping[str, Metric] = MappingProxyType({m.name: m for m in _ALL if m.gated})

assert len(METRICS) == len(_ALL), "a metric is declared twice"
assert all(m.recorded_by for m in BUDGET_METRICS.values()), "a budget metric says who records it"
assert all(m.gated or m.not_gated for m in _ALL), "an ungated metric must say why"
assert all(m.gated for m in BUDGET_METRICS.values() if m.not_gated != _EXTREME), (
    "every budget metric but a single extreme sample takes a tolerance"
)


def budget_metrics_of(benchmarks: tuple[str, ...]) -> Mapping[str, Metric]:
    """The budget metrics that results of any of ``benchmarks`` carry, in registry order."""
    return MappingProxyType(
        {n: m for n, m in BUDGET_METRICS.items() if set(m.recorded_by) & set(benchmarks)}
    )
