"""A quick fit of the link and the host a PS cluster runs on: the inputs of the analytic model.

:func:`measure_fit` measures, in two to four seconds, what
:func:`pytest_tfgrpc.model.analytic.predict_step` needs to predict a sync-SGD step on the machine at
hand:

* the links: a short P2P sweep against each PS task of the cluster (a PS also serves the
  tensor service), as each may sit behind a link of its own: unary echoes of small tensors
  and streamed pushes of sizes spanning the placement's messages, in protobuf mode as the
  step's messages are. Their medians give each link's alpha-beta fit
  (:func:`pytest_tfgrpc.model.analytic.fit_from_results`);
* the CPU costs of the step's own exchange: worker 0's push and pull of four shard layouts
  (one small shard, two larger ones, many small ones) against a one-worker job on PS 0, the
  step's own code in the step's own processes, with the CPU time of both ends
  (:func:`measure_exchanges`, :func:`exchange_costs`): per call, per stream message and per
  byte;
* the PS's numpy costs per byte, timed here (:func:`measure_numpy_costs`): summing one
  worker's gradient into an accumulator (``W`` times a step) and applying the update (once
  a step); a one-worker exchange includes each once, so they are taken off its PS time;
* how much of one exchange's work its two ends do at the same time (:func:`exchange_hidden`);
* the load of other sessions on the machine's CPUs (:func:`measure_load`): the machine may be
  shared, and a cluster's tasks get only their fair share of it.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from pytest_tfgrpc.bench.p2p import BandwidthCall, LatencyCall, p2p_bandwidth, p2p_latency
from pytest_tfgrpc.bench.timing import RunSpec
from pytest_tfgrpc.model.analytic import CpuCost, HostCosts, LinkFit, fit_from_results
from pytest_tfgrpc.model.placement import Placement
from pytest_tfgrpc.ps.jobs import samples as jobs_samples
from pytest_tfgrpc.ps.ps_cluster import PSCluster
from pytest_tfgrpc.results import BenchmarkResult
from pytest_tfgrpc.roles.parameter_server import INIT_RANDOM, apply_update
from pytest_tfgrpc.roles.processes import available_cpus
from pytest_tfgrpc.units import format_duration
from pytest_tfgrpc.wire import grpc_settings
from pytest_tfgrpc.wire.client import BenchmarkError
from pytest_tfgrpc.wire.security import child_environ

__all__ = [
    "FIT_BANDWIDTH_RUN",
    "FIT_EXCHANGE_ROUNDS",
    "FIT_EXCHANGE_RUN",
    "FIT_LATENCY_RUN",
    "LATENCY_SIZES",
    "Exchange",
    "MachineFit",
    "exchange_costs",
    "exchange_hidden",
    "exchange_layouts",
    "measure_cores",
    "measure_exchanges",
    "measure_fit",
    "measure_load",
    "measure_numpy_costs",
    "median_exchanges",
    "nonnegative_fit",
    "other_load",
    "sweep_sizes",
]

#: Each size of the sweep is bounded in count and in time: the whole fit takes 2-4 s.
FIT_LATENCY_RUN = RunSpec(iterations=60, warmup=3, max_seconds=0.12, warmup_seconds=0.05)
FIT_BANDWIDTH_RUN = RunSpec(iterations=30, warmup=2, max_seconds=0.15, warmup_seconds=0.1)
FIT_EXCHANGE_RUN = RunSpec(iterations=16, warmup=2, max_seconds=0.2, warmup_seconds=0.1)
#: Passes over the exchange layouts, one after the other: costs drift with the machine's other
#: work from second to second, and the median of three moments per layout shrugs off one
#: burst that a single pass would fit as a cost.
FIT_EXCHANGE_ROUNDS = 3
#: A fit's one-worker job never waits on other workers: its barrier is short.
EXCHANGE_BARRIER_S = 10.0
#: Echo sizes for the per-call cost: small enough that bytes cost next to nothing.
LATENCY_SIZES = (64, 1024)
#: The sweep's largest push: the per-byte costs are linear, and larger pushes cost time.
MAX_SWEEP_BYTES = 8 << 20
MIN_SWEEP_BYTES = 64
MIN_LARGEST_PUSH = 1 << 20


@dataclass(frozen=True)
class MachineFit:
    """The link and the host as measured by :func:`measure_fit`, with what it measured: the
    P2P sweep's results and the exchanges."""

    link: LinkFit
    host: HostCosts
    results: tuple[BenchmarkResult, ...]
    exchanges: tuple[Exchange, ...]
    elapsed_s: float
    #: Each PS task's link, PS 0's first (``link``): a PS behind a slower link than PS 0's
    #: sets the step, and PS 0's fit alone would not see it.
    ps_links: tuple[LinkFit, ...] = ()

    def describe(self) -> str:
        """Two lines: the link, then the host's costs."""
        took = format_duration(self.elapsed_s * 1e9)
        return f"{self.link.describe()}, measured in {took}\n{self.host.describe()}"


def sweep_sizes(
    placement: Placement,
    chunk_bytes: int = grpc_settings.DEFAULT_CHUNK_BYTES,
    *,
    count: int = 4,
    largest: int = MAX_SWEEP_BYTES,
) -> tuple[int, ...]:
    """``count`` push sizes, geometric from the placement's smallest message (a shard, or a
    ``chunk_bytes`` slice of one) to the most bytes one PS owns (at least 1 MiB), capped at
    ``largest``.

    Sizes are multiples of 4 bytes (float32) and at least 64 bytes; there are always at
    least two distinct sizes, which an alpha-beta fit needs.
    """
    if count < 2:
        raise ValueError(f"count={count}: a fit needs at least two sizes")
    owned = [b for b in placement.bytes_per_ps() if b > 0]
    messages = [min(s.nbytes, chunk_bytes) for s in placement.shards if s.nbytes > 0]
    low = max(MIN_SWEEP_BYTES, min(messages, default=MIN_SWEEP_BYTES))
    high = min(largest, max(owned, default=low))
    # Wide enough that bytes, not messages, cost the largest pushes' time, however small the
    # profile: else noise on a loaded machine can leave no bandwidth to fit.
    high = max(high, 16 * low, min(largest, MIN_LARGEST_PUSH))
    sizes = {
        max(MIN_SWEEP_BYTES, round(low * (high / low) ** (i / (count - 1)) / 4) * 4)
        for i in range(count)
    }
    return tuple(sorted(sizes))


@dataclass(frozen=True)
class Exchange:
    """One worker's push and pull of ``shards`` shards of ``shard_bytes`` each, on one PS.

    ``calls`` (2), ``messages`` (the push's header and slices, and the pull's slices) and
    ``nbytes`` (pushed plus pulled) are what the model counts; ``worker_s`` and ``ps_s`` the
    CPU seconds per exchange of the calling process and of the PS; ``wall_s`` the median
    time of one exchange; ``count`` the exchanges measured.
    """

    shards: int
    shard_bytes: int
    messages: int
    nbytes: int
    worker_s: float
    ps_s: float
    wall_s: float
    count: int
    calls: int = 2


def exchange_layouts(
    placement: Placement,
    chunk_bytes: int = grpc_settings.DEFAULT_CHUNK_BYTES,
    *,
    largest: int = MAX_SWEEP_BYTES,
    most_shards: int = 64,
) -> tuple[tuple[int, int], ...]:
    """``(shards, shard_bytes)`` layouts that tell calls, messages and bytes apart: one
    small shard; one shard of the most bytes a PS owns (capped at ``largest``) and one of a
    quarter of that; as many shards as the PS with the most messages has messages (at most
    ``most_shards``, at least 8), each of that PS's mean message size (at least 64 bytes).

    The last one prices messages of the sizes the step sends: tiny shards cost more per
    message than the mixed sizes of a real profile (fitted on 64-byte shards, resnet50 at 2%
    on 2 PS was predicted 15-60% slow, its 80 messages per PS priced at 64-byte rates)."""
    owned = max(placement.bytes_per_ps(), default=0)
    big = max(MIN_SWEEP_BYTES * 64, min(largest, owned) // 4 * 4)
    messages: dict[int, int] = {}
    for shard in placement.shards:
        messages[shard.ps] = messages.get(shard.ps, 0) + max(1, -(-shard.nbytes // chunk_bytes))
    busiest = max(messages, key=messages.__getitem__, default=None)
    count = messages[busiest] if busiest is not None else 1
    many = min(most_shards, max(8, count))
    mean = placement.bytes_per_ps()[busiest] // count if busiest is not None else 0
    sized = max(MIN_SWEEP_BYTES, min(chunk_bytes, mean) // 4 * 4)
    return ((1, MIN_SWEEP_BYTES), (1, big // 16 * 4), (1, big), (many, sized))


def nonnegative_fit(rows: Sequence[tuple[Sequence[float], float]]) -> tuple[float, ...]:
    """Coefficients ``c >= 0`` minimising the relative error of ``y = x . c`` over ``(x, y)``
    rows; a coefficient the data would make negative is 0 and the others are refitted."""
    width = len(rows[0][0])
    free = list(range(width))
    coefficients = [0.0] * width
    for _ in range(width):
        design = np.array([[x[i] / y for i in free] for x, y in rows], dtype=np.float64)
        solution, *_ = np.linalg.lstsq(design, np.ones(len(rows)), rcond=None)
        if all(value >= 0 for value in solution) or len(free) == 1:
            for i, value in zip(free, solution, strict=True):
                coefficients[i] = max(0.0, float(value))
            break
        free = [i for i, value in zip(free, solution, strict=True) if value >= 0] or free[:1]
    return tuple(coefficients)


def exchange_costs(
    exchanges: Sequence[Exchange], aggregate_byte_s: float = 0.0, update_byte_s: float = 0.0
) -> tuple[CpuCost, CpuCost]:
    """(worker, PS) :class:`CpuCost` fitted to measured exchanges, by relative error.

    Each end's CPU time per exchange is ``calls * rpc + messages * message + bytes * byte``;
    at the PS, the numpy work the exchange included (summing ``nbytes / 2``, applying the
    update to as many) is taken off first, at ``aggregate_byte_s`` and ``update_byte_s``.
    No cost is negative. Raises ValueError for fewer than three layouts.
    """
    if len({(x.shards, x.shard_bytes) for x in exchanges}) < 3:
        raise ValueError("fitting calls, messages and bytes needs three or more layouts")
    numpy_s = aggregate_byte_s + update_byte_s
    costs = []
    for end in ("worker", "ps"):
        rows = []
        for x in exchanges:
            y = x.worker_s if end == "worker" else x.ps_s - x.nbytes / 2 * numpy_s
            if y > 0:
                rows.append(((float(x.calls), float(x.messages), float(x.nbytes)), y))
        if len(rows) < 3:
            raise ValueError(f"too few exchanges with a positive {end} CPU time to fit")
        costs.append(CpuCost(*nonnegative_fit(rows)))
    return costs[0], costs[1]


def median_exchanges(exchanges: Sequence[Exchange]) -> tuple[Exchange, ...]:
    """One exchange per layout, in first-seen order: the median of its measurements' worker,
    PS and wall times, with their counts added up."""
    by_layout: dict[tuple[int, int], list[Exchange]] = {}
    for x in exchanges:
        by_layout.setdefault((x.shards, x.shard_bytes), []).append(x)
    return tuple(
        replace(
            same[0],
            worker_s=float(np.median([x.worker_s for x in same])),
            ps_s=float(np.median([x.ps_s for x in same])),
            wall_s=float(np.median([x.wall_s for x in same])),
            count=sum(x.count for x in same),
        )
        for same in by_layout.values()
    )


def exchange_hidden(exchanges: Sequence[Exchange], rate: float = 1.0) -> CpuCost:
    """The seconds of an exchange during which both its ends worked, fitted per call, per
    stream message and per byte as :func:`exchange_costs` fits CPU time: ``worker + ps -
    wall * rate`` per exchange, where ``rate`` is the share of a core each end could have
    had (other sessions' load is counted apart). Exchanges whose ends never worked at once
    are left out; with fewer than three left, nothing is hidden."""
    rows = []
    for x in exchanges:
        both = x.worker_s + x.ps_s - x.wall_s * rate
        if both > 0:
            rows.append(((float(x.calls), float(x.messages), float(x.nbytes)), both))
    if len({row[0] for row in rows}) < 3:
        return CpuCost(0.0, 0.0, 0.0)
    return CpuCost(*nonnegative_fit(rows))


def _exchange(
    cluster: PSCluster, shards: int, shard_bytes: int, chunk_bytes: int, run: RunSpec
) -> Exchange:
    """Worker 0's sync-SGD steps against a one-worker job on PS 0 of ``shards`` shards of
    ``shard_bytes``: the step's own code at both ends, on the step's own processes."""
    (reply,), (stats,) = cluster.sync_sgd(
        [[(f"fit{i}", 0, shard_bytes) for i in range(shards)]],
        **run.step_bounds(EXCHANGE_BARRIER_S),
        workers=1,
        chunk_bytes=chunk_bytes,
        learning_rate=0.1,
        init=INIT_RANDOM,
        barrier_timeout=EXCHANGE_BARRIER_S,
    )
    samples = jobs_samples(reply.samples_ns)
    count = len(samples)
    if count == 0 or stats.measured_steps != count:
        raise BenchmarkError(
            f"the fit's exchange measured {count} steps at the worker and "
            f"{stats.measured_steps} at PS 0"
        )
    slices = shards * max(1, -(-shard_bytes // chunk_bytes))
    return Exchange(
        shards=shards,
        shard_bytes=shard_bytes,
        messages=2 * slices + 1,
        nbytes=2 * shards * shard_bytes,
        worker_s=(reply.cpu_user_ns + reply.cpu_system_ns) / count / 1e9,
        ps_s=(stats.cpu_user_ns + stats.cpu_system_ns) / count / 1e9,
        wall_s=float(np.median(samples)) / 1e9,
        count=count,
    )


def measure_exchanges(
    cluster: PSCluster,
    layouts: Sequence[tuple[int, int]],
    *,
    chunk_bytes: int = grpc_settings.DEFAULT_CHUNK_BYTES,
    run: RunSpec = FIT_EXCHANGE_RUN,
) -> tuple[Exchange, ...]:
    """Worker 0's exchanges with PS 0 for each ``(shards, shard_bytes)`` layout: a one-worker
    job on PS 0 (which drops the job it had; the next benchmark configures its own), a
    warm-up, then at most ``run.iterations`` exchanges within ``run.time_limit_s``. Shard
    sizes are rounded down to whole float32 elements."""
    out = []
    for shards, shard_bytes in layouts:
        if shards < 1 or shard_bytes < 4:
            raise ValueError(f"layout ({shards}, {shard_bytes}): needs a shard of 4 B or more")
        out.append(_exchange(cluster, shards, shard_bytes // 4 * 4, chunk_bytes, run))
    return tuple(out)


def _cpu_per_byte(
    op: Callable[[], None], nbytes: int, min_seconds: float, max_repeats: int
) -> float:
    clock = time.thread_time_ns
    op()  # first touch of fresh memory is not the steady state
    start = clock()
    repeats = 0
    while repeats < max_repeats and clock() - start < min_seconds * 1e9:
        op()
        repeats += 1
    return (clock() - start) / 1e9 / repeats / nbytes


def measure_numpy_costs(
    nbytes: int, *, min_seconds: float = 0.03, max_repeats: int = 200
) -> tuple[float, float]:
    """CPU seconds per byte of a PS's numpy work on ``nbytes`` of float32, in this process:
    (summing one worker's gradient into the accumulator, applying the update and keeping
    the new weights' bytes to serve), as :mod:`pytest_tfgrpc.roles.parameter_server` does them."""
    nbytes = max(4, nbytes // 4 * 4)
    rng = np.random.default_rng(0)
    gradient = (rng.standard_normal(nbytes // 4, dtype=np.float32) * 1e-3).tobytes()
    weights = rng.standard_normal(nbytes // 4, dtype=np.float32)
    accumulator = np.zeros_like(weights)

    def aggregate() -> None:
        accumulator[:] += np.frombuffer(gradient, dtype=np.float32)

    def update() -> None:
        apply_update(weights, accumulator, 0.1, 2)
        accumulator.fill(0.0)
        weights.tobytes()

    return (
        _cpu_per_byte(aggregate, nbytes, min_seconds, max_repeats),
        _cpu_per_byte(update, nbytes, min_seconds, max_repeats),
    )


#: A busy process of :func:`measure_cores`: spins from a shared start time for a while, then
#: prints the CPU seconds that spin had.
_SPIN = """
import sys, time
start, seconds = float(sys.argv[1]), float(sys.argv[2])
while time.time() < start:
    time.sleep(min(0.01, max(0.0, start - time.time())))
cpu0 = time.process_time()
end = time.time() + seconds
while time.time() < end:
    pass
print(time.process_time() - cpu0)
"""


def measure_cores(
    seconds: float = 0.25, processes: int | None = None, *, start_delay: float = 0.4
) -> float:
    """The cores ``processes`` busy processes get together now (default: one per usable CPU).

    Each process starts a session of its own, as every PS and worker of a
    :class:`~pytest_tfgrpc.ps.ps_cluster.PSCluster` does: Linux shares the CPU fairly between
    sessions (autogroups) first, so this is the share such a cluster can have at the moment
    on a machine others use. All spin from one start time, ``start_delay`` s after launch
    (room for the interpreters to start), for ``seconds``; the cores are their CPU time over
    ``seconds``, at most ``processes`` and the usable CPUs.
    """
    width = processes or available_cpus()
    if not seconds > 0:
        raise ValueError(f"seconds={seconds!r}: must be positive")
    start = time.time() + start_delay
    spinners = [
        subprocess.Popen(
            [sys.executable, "-c", _SPIN, repr(start), repr(seconds)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=child_environ(),
        )
        for _ in range(width)
    ]
    used = 0.0
    for spinner in spinners:
        try:
            out, _ = spinner.communicate(timeout=start_delay + seconds + 30.0)
            used += float(out or 0.0)
        except (subprocess.TimeoutExpired, ValueError):
            spinner.kill()
            spinner.wait()
    return min(float(width), float(available_cpus()), max(used / seconds, 1e-3))


def other_load(got: float, sessions: int, cpus: float) -> float:
    """Other runnable sessions, from the ``got`` cores ``sessions`` busy sessions had on
    ``cpus`` CPUs: with fair sharing each had ``cpus / (sessions + load)`` of a core, so
    ``load = sessions * cpus / got - sessions``; 0 when they had all they could use."""
    if not got > 0 or sessions < 1 or not cpus > 0:
        raise ValueError(f"got={got!r} cores for {sessions} sessions on {cpus} CPUs")
    if got >= min(sessions, cpus) * 0.999:
        return 0.0
    return max(0.0, sessions * cpus / got - sessions)


def measure_load(sessions: int, seconds: float = 0.25) -> float:
    """Other runnable sessions now, as :func:`other_load` infers them from ``sessions`` busy
    processes (:func:`measure_cores`)."""
    return other_load(measure_cores(seconds, sessions), sessions, available_cpus())


def measure_fit(
    cluster: PSCluster,
    placement: Placement,
    *,
    chunk_bytes: int = grpc_settings.DEFAULT_CHUNK_BYTES,
    load: float | None = None,
    latency_run: RunSpec = FIT_LATENCY_RUN,
    bandwidth_run: RunSpec = FIT_BANDWIDTH_RUN,
    exchange_run: RunSpec = FIT_EXCHANGE_RUN,
    exchange_rounds: int = FIT_EXCHANGE_ROUNDS,
) -> MachineFit:
    """Fit the link and the host costs for a step of ``placement`` on ``cluster``: the link of
    every PS task (a P2P sweep to each, PS 0's as ``link``), the host costs on PS 0 and
    worker 0.

    Streams travel in slices of ``chunk_bytes``, as the step's do. The cluster's tasks share
    this machine's usable CPUs with ``load`` other runnable sessions; None measures it with
    as many busy sessions as the cluster has tasks (:func:`measure_load`). The exchange
    layouts are measured ``exchange_rounds`` times, one pass after the other, and fitted by
    their medians (:func:`median_exchanges`). Every size and
    layout is bounded by its run spec; with the defaults the fit takes 2-4 s. PS 0 is left
    with the fit's last job: a benchmark configures its own.
    """
    start = time.perf_counter()
    echo = LatencyCall(mode="protobuf", rpc="unary", run=latency_run, label="fit_latency")
    push = BandwidthCall(
        mode="protobuf",
        rpc="stream",
        chunk_bytes=chunk_bytes,
        run=bandwidth_run,
        label="fit_bandwidth",
    )
    sizes = sweep_sizes(placement, chunk_bytes)
    sweeps: list[tuple[BenchmarkResult, BenchmarkResult]] = []
    for server in cluster.ps:  # every PS task's own link: one may sit behind a slower one
        sweeps.append(
            (p2p_latency(server, LATENCY_SIZES, echo), p2p_bandwidth(server, sizes, push))
        )
    ps_links = tuple(fit_from_results(sweep) for sweep in sweeps)
    link = ps_links[0]
    layouts = exchange_layouts(placement, chunk_bytes)
    exchanges = measure_exchanges(
        cluster, layouts * max(1, exchange_rounds), chunk_bytes=chunk_bytes, run=exchange_run
    )
    typical = median_exchanges(exchanges)
    largest = max(x.nbytes // 2 for x in typical)
    aggregate, update = measure_numpy_costs(largest)
    worker, ps = exchange_costs(typical, aggregate, update)
    if load is None:
        topology = cluster.topology
        load = measure_load(topology.ps + topology.workers)
    cpus = float(available_cpus())
    host = HostCosts(worker, ps, aggregate, update, cpus, load=load)
    host = replace(host, hidden=exchange_hidden(typical, host.rate(2)))
    results = tuple(result for sweep in sweeps for result in sweep)
    elapsed = time.perf_counter() - start
    return MachineFit(link, host, results, exchanges, elapsed, ps_links)
