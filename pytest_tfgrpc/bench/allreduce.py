"""All-reduce among a cluster's workers over gRPC, beside the parameter-server benchmarks.

:func:`allreduce` runs a ring all-reduce (a reduce-scatter then an all-gather, ``2 (N - 1)``
steps) or a recursive halving-doubling one (Rabenseifner's; ``2 log2 N`` steps, ``N`` a power
of two) of one fused float32 buffer among the ``N`` workers of a
:class:`~pytest_tfgrpc.ps.ps_cluster.PSCluster`: the workers deliver pieces of the buffer to
each other (``tfgrpc.worker.Collective/Deliver``, ``protos/tfgrpc/worker.proto``) on their
hosts' fabric addresses, no PS involved. One sample is one all-reduce, the slowest rank's.

The figures follow nccl-tests (NVIDIA/nccl-tests, ``doc/PERFORMANCE.md``): ``algbw = S / t``
at the median all-reduce and ``busbw = algbw * 2 (N - 1) / N``, comparable with a link's rate
whatever ``N``. ``check=True`` gives rank ``r`` the input ``(r + 1) * (j mod 7 + 1)`` and
verifies every measured result against the exact sum, at every rank.

``model=True`` also measures what the model needs (:func:`probe_round`), in three rounds
interleaved with the measured sizes so that both meet the run's load (a round after each of
three sizes); the inputs are the rounds' medians, each round's value kept beside them
(:func:`costs_from_rounds`, :class:`Spread`). A round: a two-rank ring on workers 0 and 1 at
two piece sizes gives the per-step link (alpha and bandwidth of the workers' own path and
code) and a rank's CPU per step (per step and per byte, from the workers' CPU times); the
run's own ranks all-reduce a small buffer where they run, which tells the machines they
share (each rank's kernel boot id) and, where they share one, a step's fixed cost there; a
probe gives the other sessions' load on this machine's CPUs. The ring and the in-place run
are the cluster's own workers over the channels the run's all-reduces use: the same engine
and the same TLS (each rank reports its setting; its CPU times include its encryption),
recorded as ``model.inputs_tls`` and ``model.inputs_engine``; the whole-buffer probe opens
no channel.
:func:`~pytest_tfgrpc.model.scaling.allreduce_time` then predicts the all-reduce beside
the measurement (``model.*`` figures, ``error_pct`` against the median).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from pytest_tfgrpc.bench.fit import measure_load, nonnegative_fit
from pytest_tfgrpc.bench.settings import run_settings
from pytest_tfgrpc.bench.timing import RunSpec
from pytest_tfgrpc.model.analytic import CpuCost, relative_error
from pytest_tfgrpc.model.scaling import allreduce_pieces, allreduce_time, bus_factor
from pytest_tfgrpc.ps.checked_sum import check_input, verify_sum
from pytest_tfgrpc.ps.jobs import AllReduceReply
from pytest_tfgrpc.ps.jobs import samples as jobs_samples
from pytest_tfgrpc.ps.ps_cluster import PSCluster
from pytest_tfgrpc.results import BenchmarkResult, Cluster, CpuTime, SizeResult
from pytest_tfgrpc.roles.processes import this_machine
from pytest_tfgrpc.turns import take_turn
from pytest_tfgrpc.wire.client import BenchmarkError

__all__ = [
    "ALLREDUCE_RUN",
    "MODEL_ROUNDS",
    "AllReduceCosts",
    "AllReducePrediction",
    "AllReduceResult",
    "ProbeRound",
    "Spread",
    "allreduce",
    "costs_from_rounds",
    "measure_whole_buffer",
    "predict_allreduce",
    "probe_round",
    "security",
    "shared_step",
]

#: The default run: 20 all-reduces after 3 unmeasured, within 10 s.
ALLREDUCE_RUN = RunSpec(iterations=20, warmup=3, max_seconds=10.0, warmup_seconds=5.0)
#: Each probe of a round (the two-rank sweep's sizes, the in-place run): at most 30
#: all-reduces, bounded in time.
_COST_RUN = RunSpec(iterations=30, warmup=2, max_seconds=0.4, warmup_seconds=0.2)
#: The sweep's small piece (a step's fixed cost) and its least large one (its bytes' cost).
_SMALL_PIECE = 1024
_LARGE_PIECE = 256 << 10
#: Timings of :func:`measure_whole_buffer`, the median taken.
_WHOLE_REPEATS = 7
#: Rounds of the model's probes by default, interleaved with the measured sizes
#: (:func:`allreduce`): the inputs are the median of three rounds.
MODEL_ROUNDS = 3


@dataclass(frozen=True)
class Spread:
    """An input of the model as each round of probes found it (``values``, in round order):
    the model takes their ``median``; ``low`` and ``high`` show how far the rounds disagree,
    ``relative`` as a share of the median (0.0 for a median of 0)."""

    name: str
    values: tuple[float, ...]

    @property
    def median(self) -> float:
        return float(statistics.median(self.values))

    @property
    def low(self) -> float:
        return min(self.values)

    @property
    def high(self) -> float:
        return max(self.values)

    @property
    def relative(self) -> float:
        median = self.median
        if median == 0 or not math.isfinite(median):
            return 0.0
        return (self.high - self.low) / abs(median)


@dataclass(frozen=True)
class AllReduceCosts:
    """What the rounds of :func:`probe_round` found, their medians
    (:func:`costs_from_rounds`): a step's link (``alpha_s`` plus bytes at ``link_Bps``;
    infinite when bytes cost nothing measurable), a rank's CPU per step
    (``cpu``: ``rpc_s`` per step, ``byte_s`` per byte sent or taken), a rank's CPU per byte
    of its whole buffer once per all-reduce outside the steps (``whole_byte_s``: copying its
    input in, and verifying the sum with ``check=True``), the CPUs of the machine the most
    ranks share (``cores``; None: each rank has a machine of its own), how many ranks share it
    (``sharing``; 0: all of them) and the other sessions' ``load`` on it, and where ranks
    share one, ``step_s``: a step's fixed seconds among the run's own ranks in their
    placement (:func:`shared_step`). ``tls`` (``off``, ``tls`` or ``mtls``) and ``engine``:
    the security and engine of the workers' channels the two-rank ring and the in-place run
    were measured over, as the ranks reported them. ``spreads``: each input as every round of
    probes found it, by name
    (``alpha_s``, ``beta_s`` = 1 / ``link_Bps``, ``rpc_s``, ``byte_s``, and where ranks share
    a machine ``load``, ``step_s`` and ``step_cpu_s``). ``step_cpu_s``: a rank's CPU per
    step in place, less its pieces' bytes at ``byte_s`` (beside ``step_s``, the wall time; not
    an input of the prediction: it shows whether a shortfall is CPU or idle cores)."""

    alpha_s: float
    link_Bps: float
    cpu: CpuCost
    cores: float | None
    load: float
    whole_byte_s: float = 0.0
    sharing: int = 0
    step_s: float | None = None
    tls: str = "off"
    engine: str = "grpcio"
    spreads: tuple[Spread, ...] = ()
    step_cpu_s: float | None = None

    def spread(self, name: str) -> Spread | None:
        """The rounds' values of input ``name`` (see ``spreads``), None if not measured."""
        return next((s for s in self.spreads if s.name == name), None)

    def rate(self, ranks: int) -> float:
        """The share of a core each rank gets: ``min(1, cores / (sharing + load))``
        (``sharing`` 0: ``ranks``), 1.0 on machines of their own."""
        if self.cores is None:
            return 1.0
        return min(1.0, self.cores / ((self.sharing or ranks) + self.load))


@dataclass(frozen=True)
class AllReducePrediction:
    """The model's all-reduce (:func:`~pytest_tfgrpc.model.scaling.allreduce_time`) for
    ``ranks`` ranks on ``costs``: seconds in all (``step_s``), on the link alone and on the
    CPU alone, and ``rate``, the share of a core each rank was taken to have."""

    costs: AllReduceCosts
    ranks: int
    step_s: float
    link_s: float
    host_s: float
    rate: float

    def figures(self, measured_s: float) -> list[tuple[str, str]]:
        """``(name, value)`` pairs beside a measured all-reduce of ``measured_s`` seconds,
        recorded as ``model.<name>``: ``step_us``, ``link_us``, ``cpu_us``, ``limit``
        (``link`` or ``cpu``), ``alpha_us``, ``bandwidth_MBps``, ``cpu_step_us``,
        ``cpu_MBps`` (a rank's bytes per CPU second), ``whole_MBps`` (a rank's whole-buffer
        bytes per CPU second, :func:`measure_whole_buffer`), ``rate``, ``links`` (whose path the
        link terms are), with shared cores ``cores``, ``load``, ``sharing`` (ranks on the
        busiest machine) and ``shared_step_us`` (:func:`shared_step`), ``inputs_tls`` and
        ``inputs_engine`` (the channels the inputs were measured over), ``inputs_rounds`` (the
        rounds of probes whose medians the inputs are), for ``shared_step`` and ``cpu_MBps``
        ``<name>_spread_pct`` (the rounds' highest less lowest value, in percent of their
        median, :class:`Spread`) and ``load_low`` and ``load_high``, and ``error_pct``."""
        costs = self.costs
        cpu_rate = 1 / costs.cpu.byte_s / 1e6 if costs.cpu.byte_s > 0 else math.inf
        whole_rate = 1 / costs.whole_byte_s / 1e6 if costs.whole_byte_s > 0 else math.inf
        pairs = [
            ("step_us", repr(self.step_s * 1e6)),
            ("link_us", repr(self.link_s * 1e6)),
            ("cpu_us", repr(self.host_s * 1e6)),
            ("limit", "link" if self.link_s >= self.host_s else "cpu"),
            ("alpha_us", repr(costs.alpha_s * 1e6)),
            ("bandwidth_MBps", repr(costs.link_Bps / 1e6)),
            ("cpu_step_us", repr(costs.cpu.rpc_s * 1e6)),
            ("cpu_MBps", repr(cpu_rate)),
            ("whole_MBps", repr(whole_rate)),
            ("rate", repr(self.rate)),
            ("links", "ranks 0 and 1's two-rank ring, for every pair"),
            ("inputs_tls", costs.tls),
            ("inputs_engine", costs.engine),
        ]
        if costs.cores is not None:
            pairs += [("cores", repr(costs.cores)), ("load", repr(costs.load))]
            pairs.append(("sharing", str(costs.sharing or self.ranks)))
        if costs.step_s is not None:
            pairs.append(("shared_step_us", repr(costs.step_s * 1e6)))
        if costs.spreads:
            pairs.append(("inputs_rounds", str(len(costs.spreads[0].values))))
        for name, figure in (("step_s", "shared_step"), ("byte_s", "cpu_MBps")):
            spread = costs.spread(name)
            if spread is not None:
                pairs.append((f"{figure}_spread_pct", repr(100 * spread.relative)))
        load = costs.spread("load")
        if load is not None:
            pairs += [("load_low", repr(load.low)), ("load_high", repr(load.high))]
        pairs.append(("error_pct", repr(100 * relative_error(self.step_s, measured_s))))
        return pairs


@dataclass(frozen=True, eq=False)
class AllReduceResult(BenchmarkResult):
    """An all-reduce result: a point per buffer size (step figures, ``algbw``, ``busbw``);
    ``ranks`` and ``algorithm``; ``predictions``, the model's per point, with ``model=True``."""

    ranks: int = 2
    algorithm: str = "ring"
    predictions: tuple[AllReducePrediction | None, ...] = ()

    def model_predictions(self) -> Mapping[str, Sequence[tuple[str, str]]]:
        """Each point's prediction beside it, with ``error_pct`` against its median."""
        return {
            point.label: prediction.figures(point.summary.p50_ns / 1e9)
            for point, prediction in zip(self.sizes, self.predictions, strict=False)
            if prediction is not None
        }


def _busiest_machine(replies: Sequence[AllReduceReply]) -> tuple[str, int, int]:
    """(boot id, ranks, CPUs) of the machine the most ranks reported; a rank that reported
    no machine has one of its own."""
    ranks: dict[str, list[AllReduceReply]] = {}
    for reply in replies:
        ranks.setdefault(reply.machine or f"rank {id(reply)}", []).append(reply)
    machine, on_it = max(ranks.items(), key=lambda item: len(item[1]))
    return machine, len(on_it), min(r.cpus for r in on_it) or 1


def security(replies: Sequence[AllReduceReply]) -> str:
    """The TLS setting (``off``, ``tls``, ``mtls``) every rank of ``replies`` reported for
    its Collective channels.

    :raises BenchmarkError: ranks that reported different settings.
    """
    modes = sorted({r.tls for r in replies})
    if len(modes) != 1:
        raise BenchmarkError(f"the ranks reported different TLS settings: {', '.join(modes)}")
    return modes[0]


def _per_step(replies: Sequence[AllReduceReply], steps: int) -> tuple[float, float]:
    """(wall seconds, a rank's mean CPU seconds) per step of a two-rank ring's replies."""
    walls = np.max(np.vstack([jobs_samples(r.samples_ns) for r in replies]), axis=0)
    count = sum(len(r.samples_ns) for r in replies)
    cpu = sum(r.cpu_user_ns + r.cpu_system_ns for r in replies)
    return float(np.median(walls)) / steps / 1e9, cpu / count / steps / 1e9


def measure_whole_buffer(nbytes: int, *, check: bool, repeats: int = _WHOLE_REPEATS) -> float:
    """A rank's CPU seconds per byte of an ``nbytes`` buffer for what it does once per
    all-reduce outside the steps (the worker processes' loop): copy its input into
    the buffer and, with ``check``, :func:`~pytest_tfgrpc.ps.checked_sum.verify_sum` the result.
    Timed here with the workers' own functions, on this thread's CPU clock, the median of
    ``repeats``; 0.0 for a buffer of no whole float32 element.

    :raises ValueError: ``repeats`` below 1.
    """
    if repeats < 1:
        raise ValueError(f"repeats={repeats!r}: at least one timing")
    elements = nbytes // 4
    if elements == 0:
        return 0.0
    start = check_input(elements, 0)
    expected = start.copy()
    timings = []
    for _ in range(repeats):
        t0 = time.thread_time_ns()
        buffer = start.copy()
        if check:
            verify_sum(buffer, expected, 0, 0)
        timings.append(time.thread_time_ns() - t0)
    return float(np.median(timings)) / 1e9 / (4 * elements)


def shared_step(
    wall_s: float, nbytes: int, ranks: int, algorithm: str, cpu: CpuCost, rate: float
) -> float:
    """A step's fixed seconds where ranks share cores, from ``wall_s``, the median
    all-reduce of ``nbytes`` (a small size) by ``algorithm`` among the run's own ``ranks``
    ranks in their placement: less its pieces' bytes at ``cpu.byte_s / rate``, per step;
    never negative. A two-rank sweep does not see what ranks sharing cores pay at every
    step: each step ends with every rank blocked on a peer's piece, and its wake-up queues
    behind the ranks that run (run-queue wait), with the context switches and cold caches
    that brings (``benchmarks/experiments/allreduce_sharing.py`` measures both).

    :raises ValueError: ``wall_s`` not finite and >= 0; as
        :func:`~pytest_tfgrpc.model.scaling.allreduce_pieces` raises.
    """
    if not (math.isfinite(wall_s) and wall_s >= 0):
        raise ValueError(f"wall_s={wall_s!r}: seconds, finite and >= 0")
    pieces = allreduce_pieces(nbytes, ranks, algorithm)
    on_bytes = sum(cpu.time(0, 0, 2 * piece) for piece in pieces) / rate
    return max(0.0, (wall_s - on_bytes) / len(pieces))


@dataclass(frozen=True)
class ProbeRound:
    """One round of the model's probes (:func:`probe_round`). The two-rank ring on workers 0
    and 1 at each of ``pieces`` bytes: ``walls_s``, its median wall seconds per step, and
    ``cpus_s``, a rank's mean CPU seconds per step less the copy of its input. The run's own
    ranks all-reducing ``in_place_bytes`` by the run's algorithm where they run:
    ``in_place_s``, the median all-reduce (the slowest rank's) of ``in_place_count``, and
    ``in_place_cpu_s``, a rank's mean CPU seconds per all-reduce. ``machine``, ``sharing`` and
    ``cpus``: the machine the most ranks reported, how many, and the CPUs each may use there;
    ``load``: the other sessions probed there (0.0 elsewhere, or where ranks share nothing);
    ``tls``: the security every rank of both runs reported."""

    pieces: tuple[int, int]
    walls_s: tuple[float, float]
    cpus_s: tuple[float, float]
    in_place_bytes: int
    in_place_s: float
    in_place_cpu_s: float
    in_place_count: int
    machine: str
    sharing: int
    cpus: int
    load: float
    tls: str


def probe_round(
    cluster: PSCluster,
    nbytes: int,
    ranks: int,
    algorithm: str,
    *,
    copy_byte_s: float,
    load: float | None = None,
) -> ProbeRound:
    """One round of the model's probes for ``nbytes`` among ``ranks`` ranks.

    A two-rank ring on workers 0 and 1 at a small piece and at the run's largest piece (at
    least 256 KiB): each size's median step is a point of the link (``alpha + n / B``), and
    the workers' CPU times one of a rank's CPU per step (``rpc_s + 2 n byte_s``, less the copy
    of its input that the sweep's workers paid per all-reduce, at ``copy_byte_s`` per byte,
    :func:`measure_whole_buffer`). Then the run's own ranks all-reduce a small size where they
    run: ranks share a machine's CPUs when they report the same kernel boot id
    (:func:`~pytest_tfgrpc.roles.processes.this_machine`: local workers, and emulated hosts,
    which are namespaces of one machine); the most ranks on one machine set the share of a
    core each gets, with ``load`` other runnable sessions there (None: probed now with that
    many busy processes when it is this machine, :func:`~pytest_tfgrpc.bench.fit.measure_load`,
    else 0), and the median of these small all-reduces gives a step's fixed cost among them
    (:func:`shared_step`, in :func:`costs_from_rounds`). Ranks on machines of their own share
    nothing. Each probe is at most 30 all-reduces within 0.4 s.

    :raises BenchmarkError: probes that ran under different TLS settings.
    """
    pieces = _sweep_pieces(nbytes, ranks, algorithm)
    walls, cpus, modes = [], [], []
    for piece in pieces:
        replies = cluster.allreduce(
            2 * piece,
            algorithm="ring",
            warmup=_COST_RUN.warmup,
            iterations=_COST_RUN.iterations,
            seconds=_COST_RUN.time_limit_s,
            check=False,
            ranks=2,
        )
        modes.append(security(replies))
        wall, cpu = _per_step(replies, steps=2)
        walls.append(wall)
        # each of the sweep's all-reduces (two steps) copied its 2-piece input in once
        cpus.append(max(0.0, cpu - copy_byte_s * piece))
    small = ranks * _SMALL_PIECE
    in_place = cluster.allreduce(
        small,
        algorithm=algorithm,
        warmup=_COST_RUN.warmup,
        iterations=_COST_RUN.iterations,
        seconds=_COST_RUN.time_limit_s,
        check=False,
        ranks=ranks,
    )
    modes.append(security(in_place))
    if len(set(modes)) != 1:
        raise BenchmarkError(f"the model's probes ran under different TLS settings: {modes}")
    in_place_s, in_place_cpu_s = _per_step(in_place, steps=1)
    machine, sharing, cpus_there = _busiest_machine(in_place)
    if sharing < 2:
        load = 0.0
    elif load is None:
        load = measure_load(sharing) if machine == this_machine() else 0.0
    return ProbeRound(
        pieces=pieces,
        walls_s=(walls[0], walls[1]),
        cpus_s=(cpus[0], cpus[1]),
        in_place_bytes=small,
        in_place_s=in_place_s,
        in_place_cpu_s=in_place_cpu_s,
        in_place_count=min(len(r.samples_ns) for r in in_place),
        machine=machine,
        sharing=sharing,
        cpus=cpus_there,
        load=load,
        tls=modes[0],
    )


def costs_from_rounds(
    rounds: Sequence[ProbeRound],
    ranks: int,
    algorithm: str,
    *,
    whole_byte_s: float,
    engine: str,
) -> AllReduceCosts:
    """The model's inputs from ``rounds`` of probes: each round's own link (``alpha + n / B``
    through its two pieces' steps), CPU per step (``rpc_s + 2 n byte_s``), load and in-place
    step (:func:`shared_step`, at that round's ``byte_s`` and share of a core), then the
    median of each over the rounds, every round's value kept in ``spreads``.

    :raises ValueError: no rounds.
    :raises BenchmarkError: rounds under different TLS settings or on different machines.
    """
    if not rounds:
        raise ValueError("no rounds of probes to take the model's inputs from")
    if len({r.tls for r in rounds}) != 1:
        raise BenchmarkError(
            f"the model's probes ran under different TLS settings: {[r.tls for r in rounds]}"
        )
    if len({(r.machine, r.sharing, r.cpus) for r in rounds}) != 1:
        raise BenchmarkError("the model's rounds of probes found the ranks on different machines")
    first = rounds[0]
    values: dict[str, list[float]] = {}
    for r in rounds:
        alpha, beta = nonnegative_fit(
            [((1.0, float(p)), wall) for p, wall in zip(r.pieces, r.walls_s, strict=True)]
        )
        rpc_s, byte_s = nonnegative_fit(
            [((1.0, 2.0 * p), cpu) for p, cpu in zip(r.pieces, r.cpus_s, strict=True)]
        )
        row = {"alpha_s": alpha, "beta_s": beta, "rpc_s": rpc_s, "byte_s": byte_s}
        if first.sharing >= 2:
            round_costs = AllReduceCosts(
                alpha, math.inf, CpuCost(rpc_s, 0.0, byte_s), float(r.cpus), r.load,
                sharing=r.sharing,
            )  # fmt: skip
            rate = round_costs.rate(ranks)
            row["load"] = r.load
            row["step_s"] = shared_step(
                r.in_place_s, r.in_place_bytes, ranks, algorithm, round_costs.cpu, rate
            )
            pieces = allreduce_pieces(r.in_place_bytes, ranks, algorithm)
            on_bytes = sum(2 * piece for piece in pieces) * byte_s
            row["step_cpu_s"] = max(0.0, (r.in_place_cpu_s - on_bytes) / len(pieces))
        for name, value in row.items():
            values.setdefault(name, []).append(value)
    spreads = tuple(Spread(name, tuple(found)) for name, found in values.items())
    median = {s.name: s.median for s in spreads}
    costs = AllReduceCosts(
        alpha_s=median["alpha_s"],
        link_Bps=1 / median["beta_s"] if median["beta_s"] > 0 else math.inf,
        cpu=CpuCost(median["rpc_s"], 0.0, median["byte_s"]),
        cores=None,
        load=0.0,
        whole_byte_s=whole_byte_s,
        tls=first.tls,
        engine=engine,
        spreads=spreads,
    )
    if first.sharing < 2:
        return costs
    return replace(
        costs,
        cores=float(first.cpus),
        load=median["load"],
        sharing=first.sharing,
        step_s=median["step_s"],
        step_cpu_s=median["step_cpu_s"],
    )


def _sweep_pieces(nbytes: int, ranks: int, algorithm: str) -> tuple[int, int]:
    """The two-rank sweep's pieces: a small one and the run's largest (at least 256 KiB)."""
    largest = max(allreduce_pieces(nbytes, ranks, algorithm))
    return _SMALL_PIECE, max(_LARGE_PIECE, int(largest) // 4 * 4)


def _copy_byte_s(nbytes: int, ranks: int, algorithm: str) -> float:
    """A rank's CPU per byte of copying in the two-rank sweep's largest input."""
    return measure_whole_buffer(2 * _sweep_pieces(nbytes, ranks, algorithm)[1], check=False)


def allreduce(
    cluster: PSCluster,
    sizes: Sequence[int],
    *,
    run: RunSpec = ALLREDUCE_RUN,
    algorithm: str = "ring",
    check: bool = False,
    model: bool = True,
    label: str | None = None,
    key: str | None = None,
    model_rounds: int = MODEL_ROUNDS,
) -> AllReduceResult:
    """All-reduce a buffer of each of ``sizes`` bytes (whole float32 elements, at least one
    per rank) among every worker of ``cluster``, one point per size: ``run.warmup``
    all-reduces unmeasured, then at most ``run.iterations`` within ``run.time_limit_s``; see
    the module docstring. ``key`` names a single size's point (a profile's key; default: the
    size).

    With ``model``, the model's inputs are measured in ``model_rounds`` rounds of probes
    (:func:`probe_round`) interleaved with the measured sizes, so that they meet the load the
    run meets: spread evenly after the sizes (three sizes, three rounds: one after each; one
    size: all three after it), each size measured in one job as without ``model``; the
    inputs are the rounds' medians (:func:`costs_from_rounds`). (Splitting each size into
    shares with a round between them, tried, lengthened the measured all-reduces themselves:
    under load, three jobs of 6, 7 and 7 had medians 8-19% above one job of 20.)

    :raises ValueError: no sizes, fewer than two workers, a size that is no whole float32
        elements or too small, an unknown algorithm, halving-doubling on a number of ranks
        that is no power of two (the worker protocol's
        :class:`~pytest_tfgrpc.ps.jobs.MessageError`), ``model_rounds`` below 1.
    :raises BenchmarkError: a wrong sum with ``check=True`` (naming the rank and element),
        native workers, ranks that measured different counts; as
        :meth:`~pytest_tfgrpc.ps.ps_cluster.PSCluster.allreduce` raises otherwise.
    """
    if not sizes:
        raise ValueError("no buffer sizes to all-reduce")
    if model_rounds < 1:
        raise ValueError(f"model_rounds={model_rounds!r}: at least one round of probes")
    ranks = len(cluster.workers)
    points = []
    checked = []
    modes = set()
    rounds: list[ProbeRound] = []
    copy_byte_s = 0.0
    for i, nbytes in enumerate(sizes):
        take_turn()  # lockstep with another run (tfgrpc-ab --interleave rounds)
        replies = cluster.allreduce(
            nbytes,
            algorithm=algorithm,
            warmup=run.warmup,
            iterations=run.iterations,
            seconds=run.time_limit_s,
            check=check,
        )
        points.append(_point(replies, nbytes, ranks, key if len(sizes) == 1 else None))
        checked.append(min(r.checked for r in replies))
        modes.add(security(replies))
        # after a size: a bad request fails before anything is probed
        for _ in range(_rounds_after(i, len(sizes), model_rounds if model else 0)):
            take_turn()
            if not rounds:
                copy_byte_s = _copy_byte_s(max(sizes), ranks, algorithm)
            rounds.append(
                probe_round(cluster, max(sizes), ranks, algorithm, copy_byte_s=copy_byte_s)
            )
    predictions: tuple[AllReducePrediction | None, ...] = (None,) * len(points)
    if model:
        costs = costs_from_rounds(
            rounds,
            ranks,
            algorithm,
            whole_byte_s=measure_whole_buffer(max(sizes), check=check),
            engine=cluster.workers_engine,
        )
        if modes != {costs.tls}:
            raise BenchmarkError(
                f"the all-reduces ran with TLS {', '.join(sorted(modes))} and the model's "
                f"inputs with {costs.tls}: they must share the run's channels"
            )
        predictions = tuple(predict_allreduce(costs, n, ranks, algorithm) for n in sizes)
    topology = cluster.topology
    return AllReduceResult(
        benchmark="allreduce",
        label=label or "allreduce",
        fabric=cluster.fabric.name,
        target=",".join(cluster.targets),
        mode="protobuf",
        rpc="unary",
        cluster=Cluster(topology.ps, ranks, topology.sharding),
        sizes=tuple(points),
        settings=run_settings(
            run,
            algorithm=algorithm,
            ranks=str(ranks),
            check=str(check),
            checked=str(min(checked)),
            bus_factor=f"{bus_factor(ranks):g}",
        ),
        ranks=ranks,
        algorithm=algorithm,
        predictions=predictions,
    )


def _rounds_after(index: int, sizes: int, rounds: int) -> int:
    """How many of ``rounds`` rounds of probes follow the ``index``-th of ``sizes`` sizes:
    spread evenly, the last size followed by at least one."""
    return rounds * (index + 1) // sizes - rounds * index // sizes


def _point(
    replies: Sequence[AllReduceReply], nbytes: int, ranks: int, key: str | None
) -> SizeResult:
    """One size's point: each all-reduce the slowest rank's."""
    per_rank = [jobs_samples(r.samples_ns) for r in replies]
    counts = {len(s) for s in per_rank}
    if len(counts) != 1 or 0 in counts:
        raise BenchmarkError(f"ranks measured different numbers of all-reduces: {sorted(counts)}")
    if any(0 < r.checked != len(r.samples_ns) for r in replies):
        raise BenchmarkError("check=True: a rank verified fewer all-reduces than it measured")
    steps = np.max(np.vstack(per_rank), axis=0)
    total_ns = int(steps.sum())
    factor = bus_factor(ranks)
    return SizeResult.from_samples(
        nbytes,
        int(nbytes * factor) * ranks,  # what every rank sends, all ranks together
        steps,
        total_ns,
        key=key or "",
        step=True,
        rate_per_s=len(steps) * 1e9 / total_ns if total_ns else 0.0,
        rate_Bps=nbytes * len(steps) * 1e9 / total_ns if total_ns else 0.0,
        cpu={
            "workers": CpuTime(
                sum(r.cpu_user_ns for r in replies), sum(r.cpu_system_ns for r in replies)
            )
        },
        bus_factor=factor,
    )


def predict_allreduce(
    costs: AllReduceCosts, nbytes: int, ranks: int, algorithm: str
) -> AllReducePrediction:
    """The model's all-reduce of ``nbytes`` among ``ranks`` ranks on ``costs``."""
    rate = costs.rate(ranks)
    total, link, host = allreduce_time(
        nbytes,
        ranks,
        algorithm,
        alpha_s=costs.alpha_s,
        link_Bps=costs.link_Bps,
        cpu=costs.cpu,
        rate=rate,
        whole_s=costs.whole_byte_s * nbytes,
        step_s=costs.step_s,
    )
    return AllReducePrediction(costs, ranks, total, link, host, rate)
