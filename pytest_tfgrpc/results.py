"""Frozen results of a benchmark run: raw samples, their statistics, named figures.

A :class:`BenchmarkResult` holds one :class:`SizeResult` per message size. Every figure a
result reports (for JUnit, the terminal summary and budgets) comes from :meth:`SizeResult.figures`,
so that the three never disagree about a name, a unit or a value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from pytest_tfgrpc.stats.summary import Summary, summarize
from pytest_tfgrpc.units import size_label

#: Figure names, with the unit each is reported in (the unit ends the JUnit metric name).
TIME_FIGURES = ("min", "mean", "p50", "p90", "p99", "p999", "max")
RATE_FIGURES = ("throughput", "throughput_p50")


@dataclass(frozen=True)
class CpuUsage:
    """User and system CPU time (ns) of the client process and the server process over a
    measured phase."""

    client_user_ns: int
    client_system_ns: int
    server_user_ns: int
    server_system_ns: int


@dataclass(frozen=True)
class Figure:
    """One named figure of one point, in its metric's base unit (ns, B/s, 1/s, a ratio, a
    count or bytes; :mod:`pytest_tfgrpc.report.metrics` declares each name and unit).

    ``scope`` is empty for a figure of the whole point, ``ps<i>`` for one PS task's, ``workers``
    for all workers'.
    """

    metric: str
    value: float
    scope: str = ""


def find_figure(figures: Sequence[Figure], metric: str) -> Figure | None:
    """The figure named ``metric``, or None."""
    return next((fig for fig in figures if fig.metric == metric and not fig.scope), None)


@dataclass(frozen=True, eq=False)
class SizeResult:
    """The samples and statistics of one message size.

    ``samples_ns`` holds the duration of every timed operation (an echo round trip, or a push
    until its acknowledgement), warm-up excluded; ``summary`` is computed from all of them.
    """

    size_bytes: int
    wire_bytes: int
    samples_ns: npt.NDArray[np.int64] = field(repr=False)
    summary: Summary
    elapsed_ns: int
    payload: str = ""
    buffers: tuple[int, ...] = ()
    cpu: CpuUsage | None = None

    @classmethod
    def from_samples(
        cls,
        size_bytes: int,
        wire_bytes: int,
        samples_ns: npt.NDArray[np.int64],
        elapsed_ns: int,
        *,
        payload: str = "",
        buffers: tuple[int, ...] = (),
        cpu: CpuUsage | None = None,
    ) -> SizeResult:
        """Freeze the samples of one message (read-only) with their statistics.

        ``payload`` names a generated payload (``skew-10x``) and ``buffers`` lists the exact
        sizes of the buffers it is made of; a plain size has neither.
        """
        samples = np.ascontiguousarray(samples_ns, dtype=np.int64)
        samples.setflags(write=False)
        summary = summarize(samples)
        return cls(size_bytes, wire_bytes, samples, summary, elapsed_ns, payload, buffers, cpu)

    @property
    def label(self) -> str:
        """The message as named in JUnit properties: its size as people write it (``64KiB``),
        or the payload's name (``skew-10x``)."""
        return self.payload or size_label(self.size_bytes)

    @property
    def count(self) -> int:
        return self.summary.count

    @property
    def throughput_Bps(self) -> float:
        """Payload bytes moved per second over all timed operations."""
        total_ns = int(self.samples_ns.sum())
        return self.size_bytes * self.count * 1e9 / total_ns if total_ns else 0.0

    @property
    def throughput_p50_Bps(self) -> float:
        """Payload bytes per second of the median operation."""
        return self.size_bytes * 1e9 / self.summary.p50_ns if self.summary.p50_ns else 0.0

    def figures(self, *, rates: bool) -> tuple[Figure, ...]:
        """Every figure of this size; ``rates`` adds the throughput figures."""
        s = self.summary
        times = (s.min_ns, s.mean_ns, s.p50_ns, s.p90_ns, s.p99_ns, s.p999_ns, s.max_ns)
        out = [Figure(name, float(v)) for name, v in zip(TIME_FIGURES, times, strict=True)]
        if rates:
            out.append(Figure("throughput", self.throughput_Bps))
            out.append(Figure("throughput_p50", self.throughput_p50_Bps))
        if self.cpu is not None:
            cpu = self.cpu
            out.append(Figure("client_cpu_user", float(cpu.client_user_ns)))
            out.append(Figure("client_cpu_system", float(cpu.client_system_ns)))
            out.append(Figure("server_cpu_user", float(cpu.server_user_ns)))
            out.append(Figure("server_cpu_system", float(cpu.server_system_ns)))
        out.append(Figure("samples", float(s.count)))
        return tuple(out)

    def figure(self, metric: str, *, rates: bool = True) -> Figure | None:
        return find_figure(self.figures(rates=rates), metric)


class MeasuredPoint(Protocol):
    """One measured message size, payload or step of a result, as budgets and the property
    writer read it."""

    @property
    def label(self) -> str: ...

    @property
    def count(self) -> int: ...

    @property
    def samples_ns(self) -> npt.NDArray[np.int64]: ...

    @property
    def size_bytes(self) -> int: ...

    @property
    def payload(self) -> str: ...

    @property
    def buffers(self) -> tuple[int, ...]: ...

    def figures(self, *, rates: bool) -> tuple[Figure, ...]: ...

    def figure(self, metric: str, *, rates: bool = True) -> Figure | None: ...


@runtime_checkable
class Measured(Protocol):
    """What every benchmark returns: named points with figures, on one fabric."""

    @property
    def benchmark(self) -> str: ...

    @property
    def label(self) -> str: ...

    @property
    def fabric(self) -> str: ...

    @property
    def target(self) -> str: ...

    @property
    def reports_rates(self) -> bool: ...

    @property
    def rpc(self) -> str: ...

    @property
    def mode(self) -> str: ...

    @property
    def topology(self) -> str: ...

    @property
    def settings(self) -> Mapping[str, str]: ...

    @property
    def sizes(self) -> Sequence[MeasuredPoint]: ...


@dataclass(frozen=True, eq=False)
class BenchmarkResult:
    """What one benchmark call measured, over one or more message sizes.

    ``label`` names the result in JUnit (``tfgrpc.<label>.<size>.<metric>``); it is the
    benchmark's name unless the test gave another. ``rpc`` and ``mode`` say which RPC shape
    and encoding were measured; ``settings`` records everything else that shapes the figures
    (warm-up, chunk size, allocator settings, grpcio version).
    """

    benchmark: str
    label: str
    fabric: str
    target: str
    mode: str
    rpc: str
    sizes: tuple[SizeResult, ...]
    settings: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def reports_rates(self) -> bool:
        """Latency benchmarks (an echo, a ping-pong) have no meaningful rate."""
        return not self.benchmark.endswith("latency")

    @property
    def topology(self) -> str:
        """A P2P result has no cluster topology."""
        return ""

    def size(self, size_bytes: int) -> SizeResult:
        for result in self.sizes:
            if result.size_bytes == size_bytes:
                return result
        raise KeyError(f"{self.label} measured no message of {size_bytes} bytes")
