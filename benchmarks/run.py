"""Side by side, in one run on one fabric: the raw-TCP floor, bare grpcio, and the plugin.

    python benchmarks/run.py [--quick] [--fabric lo] [--sizes 1KiB..64MiB] [--rounds N]
                             [--json out.json] [--allocator tuned|default] [--no-ps]
                             [--tf-python PATH]

Latency contenders run at sizes up to ``--latency-max``, bandwidth contenders from
``--bandwidth-min``. Every round measures every contender at every size, in the same order, so
drift on a shared machine spreads over all of them; a figure is the median over rounds of each
round's median (latency) or of each round's bytes / median time per tensor (bandwidth). Each row
shows its ratio to the floor that does the same work: ping-pong for latency, push with one ack per
tensor for bandwidth. "x floor" is the figure divided by the floor's; "ops" counts the timed
operations (round trips or tensors) over all rounds. Nothing here asserts a speed: it measures
and prints.

Every contender runs in the same process environment: ``--allocator tuned`` (the plugin's
default) applies :func:`pytest_tfgrpc.tuning.allocator.apply_policy` to this process and gives its
environment (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``) to every server started
here: the floor, both bare grpcio servers, the plugin's server, the PS cluster and TensorFlow's
two tasks. Each server's allocator variables are read back from ``/proc/<pid>/environ`` and
recorded.

TensorFlow's own gRPC runtime (``tf_contender.py``: a worker task pulling a PS task's variable
through RecvTensor) is measured when TensorFlow is importable here or ``--tf-python`` names the
python of an environment that has it (tensorflow-cpu is an optional extra); otherwise its rows
are skipped with a note. Its version is recorded.

The parameter-server patterns (``ps_throughput`` on 2 PS x 3 workers, TF-gRPC-Bench's setup,
and ``sync_sgd_step`` of a small ResNet-50 under each sharding) are measured in the same
rounds, after the point-to-point contenders, and printed as a second table; ``--quick`` keeps
one tiny point of each so CI runs the code path.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bare_grpc

from pytest_tfgrpc.bench import floor as floor_client
from pytest_tfgrpc.bench.timing import RunSpec
from pytest_tfgrpc.roles import floor_server as floor
from pytest_tfgrpc.tuning import allocator as tuning
from pytest_tfgrpc.units import parse_sizes, size_label
from pytest_tfgrpc.wire.fabric import Fabric, resolve_fabric

Samples = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Budget:
    """Bounds of one measurement: counts and a deadline."""

    iterations: int
    warmup: int
    max_seconds: float


@dataclass(frozen=True)
class Measurement:
    """Timed operations: ``samples_ns[i]`` moved ``bytes_per_sample`` payload bytes."""

    samples_ns: Samples
    bytes_per_sample: int
    operations: int | None = None  # tensors moved, when one sample covers several

    @property
    def ops(self) -> int:
        return len(self.samples_ns) if self.operations is None else self.operations


@dataclass(frozen=True)
class Contender:
    """One way to move tensors; ``kind`` is ``latency`` (ns, lower is better) or ``bandwidth``.

    ``floor`` marks the raw-TCP reference of its kind; ``shape`` says which RPC shape (or
    socket pattern) was measured.
    """

    name: str
    kind: str
    shape: str
    measure: Callable[[int, Budget], Measurement]
    floor: bool = False


@dataclass(frozen=True)
class Row:
    contender: str
    kind: str
    shape: str
    size: int
    figure: float  # median over rounds: ns per round trip, or bytes/s
    round_figures: tuple[float, ...]
    samples: int
    floor_ratio: float | None


@dataclass(frozen=True)
class PSPlan:
    """What the parameter-server rows measure: TF-gRPC-Bench's 2 PS x 3 workers."""

    ps: int
    workers: int
    sizes: tuple[int, ...]  # ps_throughput message sizes
    throughput: Budget
    profile: str  # sync_sgd_step: a profile name and its scale
    scale: float
    shardings: tuple[str, ...]
    sgd: Budget


@dataclass(frozen=True)
class PSCase:
    """One parameter-server row; ``measure`` returns (figure, throughput B/s, samples, extra)."""

    name: str
    shape: str
    key: str
    unit: str  # "rpc/s" or "ms/step"
    measure: Callable[[], tuple[float, float, int, str]]


@dataclass(frozen=True)
class PSRow:
    """A parameter-server row: medians over rounds of each round's figure."""

    pattern: str
    shape: str
    key: str
    unit: str
    figure: float  # rpc/s (ps_throughput) or ms per step (sync_sgd_step)
    throughput_Bps: float
    round_figures: tuple[float, ...]
    samples: int
    extra: str  # imbalance, per-PS bytes: what the pattern adds


@dataclass
class Config:
    fabric: Fabric
    sizes: tuple[int, ...]
    rounds: int
    latency_max: int
    bandwidth_min: int
    latency: Budget
    bandwidth: Budget
    stream_bytes: int
    allocator: str
    #: The environment every server gets (None: this process's, unchanged).
    server_env: dict[str, str] | None
    ps: PSPlan | None = None
    quick: bool = False
    notes: list[str] = field(default_factory=list)
    #: Every server process started, by name: its pid, so its environment can be recorded.
    servers: dict[str, int] = field(default_factory=dict)
    #: TensorFlow's version and how its tasks were run, when its contender ran.
    tensorflow: dict[str, Any] | None = None


# --------------------------------------------------------------------------------------------
# Contenders
# --------------------------------------------------------------------------------------------


def _floor_run(count: int, b: Budget, warmup: int | None = None) -> RunSpec:
    """The plugin's run spec for a floor loop: warm-up and measurement each bounded by the
    budget's deadline, as the plugin contenders' are."""
    return RunSpec(
        iterations=count,
        warmup=b.warmup if warmup is None else warmup,
        max_seconds=b.max_seconds,
        warmup_seconds=b.max_seconds,
    )


def floor_contenders(server: floor.FloorServer, cfg: Config) -> list[Contender]:
    host, port = server.address

    def pingpong(size: int, b: Budget) -> Measurement:
        s = floor_client.tcp_pingpong(host, port, size, _floor_run(b.iterations, b))
        return Measurement(s, size)

    def push_ack(size: int, b: Budget) -> Measurement:
        s = floor_client.tcp_push_ack(host, port, size, _floor_run(b.iterations, b))
        return Measurement(s, size)

    def stream(size: int, b: Budget) -> Measurement:
        count = max(4, min(1000, cfg.stream_bytes // max(size, 1)))
        r = floor_client.tcp_stream(host, port, size, _floor_run(count, b, warmup=2))
        return Measurement(np.array([r.elapsed_ns], dtype=np.int64), r.nbytes, r.count)

    return [
        Contender("tcp pingpong", "latency", "socket echo", pingpong, floor=True),
        Contender("tcp push+ack", "bandwidth", "socket push, 1 ack/tensor", push_ack, floor=True),
        Contender("tcp stream", "bandwidth", "socket stream, 1 ack at end", stream),
    ]


def bare_contenders(sync: bare_grpc.BareServer, aio: bare_grpc.BareServer) -> list[Contender]:
    def on(
        server: bare_grpc.BareServer, loop: Callable[..., Any]
    ) -> Callable[[int, Budget], Measurement]:
        """A contender that runs one of bare_grpc's timed loops against ``server``."""

        def run(size: int, b: Budget) -> Measurement:
            samples = loop(
                server.target,
                size,
                iterations=b.iterations,
                warmup=b.warmup,
                max_seconds=b.max_seconds,
            )
            return Measurement(samples, size)

        return run

    return [
        Contender("grpc sync unary", "latency", "unary echo, sync", on(sync, bare_grpc.unary_echo)),
        Contender(
            "grpc aio unary",
            "latency",
            "unary echo, aio client+server",
            on(aio, bare_grpc.aio_unary_echo),
        ),
        Contender(
            "grpc aio stream",
            "latency",
            "stream ping-pong, aio client+server",
            on(aio, bare_grpc.aio_stream_pingpong),
        ),
        # The plugin's server is a sync (thread-pool) server: this is the same shape.
        Contender(
            "grpc aio stream/sync srv",
            "latency",
            "stream ping-pong, aio client, sync server",
            on(sync, bare_grpc.aio_stream_pingpong),
        ),
        Contender(
            "grpc client-stream",
            "bandwidth",
            "1 MiB chunks, 1 ack/tensor",
            on(sync, bare_grpc.client_stream_push),
        ),
        Contender(
            "grpc unary push", "bandwidth", "whole tensor, unary", on(sync, bare_grpc.unary_push)
        ),
    ]


# ---- EXTENSION POINT: the plugin's own contenders ------------------------------------------
# Every contender the plugin offers goes in this list and is measured against the same floor, in
# the same rounds. A new RPC shape or mode of pytest_tfgrpc.bench is one more entry here.
def plugin_contenders(stack: ExitStack, cfg: Config) -> list[Contender]:
    try:
        from pytest_tfgrpc.bench import (
            BandwidthCall,
            LatencyCall,
            RunSpec,
            p2p_bandwidth,
            p2p_latency,
        )
        from pytest_tfgrpc.roles.processes import ServerProcess
    except ImportError as exc:
        cfg.notes.append(f"plugin contenders skipped: pytest_tfgrpc.bench not importable ({exc})")
        return []
    server = ServerProcess.start(cfg.fabric, env=cfg.server_env)
    stack.callback(server.stop)
    cfg.servers["plugin tensor server"] = server.pid

    def spec(b: Budget) -> Any:
        return RunSpec(
            iterations=b.iterations,
            warmup=b.warmup,
            max_seconds=b.max_seconds,
            warmup_seconds=b.max_seconds,
        )

    def latency(mode: str, rpc: str) -> Callable[[int, Budget], Measurement]:
        def run(size: int, b: Budget) -> Measurement:
            result = p2p_latency(server, [size], LatencyCall(mode=mode, rpc=rpc, run=spec(b)))
            return Measurement(result.sizes[0].samples_ns, size)

        return run

    def bandwidth(mode: str, rpc: str, direction: str) -> Callable[[int, Budget], Measurement]:
        def run(size: int, b: Budget) -> Measurement:
            call = BandwidthCall(mode=mode, rpc=rpc, direction=direction, run=spec(b))
            result = p2p_bandwidth(server, [size], call)
            return Measurement(result.sizes[0].samples_ns, size)

        return run

    out: list[Contender] = []
    for mode in ("raw", "protobuf"):
        for rpc in ("unary", "stream"):
            out.append(
                Contender(
                    f"p2p_latency {mode}/{rpc}", "latency", f"plugin {rpc} echo", latency(mode, rpc)
                )
            )
        for rpc in ("stream", "unary"):
            out.append(
                Contender(
                    f"p2p_bandwidth {mode}/{rpc}",
                    "bandwidth",
                    f"plugin {rpc} push, 1 ack/tensor",
                    bandwidth(mode, rpc, "push"),
                )
            )
    # The direction TensorFlow moves parameters in (a worker fetching from a PS: RecvTensor is a
    # unary call answered with the tensor), so TF's rows have a like-for-like plugin row.
    # --quick keeps two of them (both modes, both shapes): it runs the code paths, within CI's time.
    pulls = (
        [("raw", "stream"), ("protobuf", "unary")]
        if cfg.quick
        else [(mode, rpc) for mode in ("raw", "protobuf") for rpc in ("stream", "unary")]
    )
    for mode, rpc in pulls:
        out.append(
            Contender(
                f"p2p_bandwidth {mode}/{rpc} pull",
                "bandwidth",
                f"plugin {rpc} pull, 1 request/tensor",
                bandwidth(mode, rpc, "pull"),
            )
        )
    return out


def tensorflow_contenders(stack: ExitStack, cfg: Config, given: str | None) -> list[Contender]:
    """TensorFlow's own gRPC runtime: a PS task's variable pulled by a worker task (RecvTensor).

    Runs where TensorFlow is importable by this interpreter or by ``--tf-python``; otherwise it
    is skipped with a note. Both task processes get the run's environment (``server_env``).
    """
    import tf_contender

    tf_python, how = tf_contender.find_tf_python(given)
    if tf_python is None:
        cfg.notes.append(how)
        return []
    try:
        cluster = stack.enter_context(tf_contender.TFCluster(tf_python, cfg.server_env))
    except RuntimeError as exc:
        cfg.notes.append(f"TensorFlow's gRPC runtime skipped: {exc}")
        return []
    cfg.servers.update(cluster.pids)
    cfg.tensorflow = {"how": how, "tf_python": tf_python, **cluster.info}
    cfg.notes.append(
        f"TensorFlow {cluster.version}: tf.distribute.Server tasks ps:0 and worker:0 on "
        f"{tf_contender.HOST}; the worker pulls a float32 tf.Variable placed on the PS in one "
        "tf.compat.v1.Session step (RunGraph on the PS + RecvTensor), op v[0]+1 on the worker; "
        "'- step' rows subtract the median step of a 4-byte variable timed just before"
    )
    last: dict[int, tf_contender.Steps] = {}

    def step(size: int, b: Budget) -> Measurement:
        got = cluster.measure(
            size, iterations=b.iterations, warmup=b.warmup, max_seconds=b.max_seconds
        )
        return Measurement(np.array(got.samples_ns, dtype=np.int64), size)

    def pull(size: int, b: Budget) -> Measurement:
        got = cluster.measure(
            size,
            iterations=b.iterations,
            warmup=b.warmup,
            max_seconds=b.max_seconds,
            overhead_iterations=50,
        )
        last[size] = got
        return Measurement(np.array(got.samples_ns, dtype=np.int64), size)

    def net(size: int, b: Budget) -> Measurement:
        # The steps just timed by `pull` (listed before this one), less TF's per-step cost.
        got = last.pop(size)
        overhead = int(np.median(got.overhead_ns))
        samples = np.maximum(np.array(got.samples_ns, dtype=np.int64) - overhead, 1)
        return Measurement(samples, size)

    return [
        Contender(
            "tf RecvTensor step",
            "latency",
            "TF graph step: PS var -> worker (RunGraph + RecvTensor), one way",
            step,
        ),
        Contender(
            "tf RecvTensor pull",
            "bandwidth",
            "TF graph step: PS var -> worker, 1 step/tensor",
            pull,
        ),
        Contender(
            "tf RecvTensor pull - step",
            "bandwidth",
            "the same steps less the 4-byte step's p50",
            net,
        ),
    ]


def ps_cases(stack: ExitStack, cfg: Config) -> list[PSCase]:
    """The parameter-server rows, on one cluster started here (its processes are recorded)."""
    plan = cfg.ps
    if plan is None:
        return []
    try:
        from pytest_tfgrpc.bench import RunSpec
        from pytest_tfgrpc.bench.ps import ps_throughput, sync_sgd_step
        from pytest_tfgrpc.model.placement import Topology
        from pytest_tfgrpc.model.profiles import load_profile
        from pytest_tfgrpc.ps.ps_cluster import PSCluster
    except ImportError as exc:
        cfg.notes.append(f"PS rows skipped: the PS benchmarks are not importable ({exc})")
        return []
    cluster = PSCluster(cfg.fabric, Topology(plan.ps, plan.workers), env=cfg.server_env)
    stack.callback(cluster.stop)
    for ps in cluster.ps:
        cfg.servers[ps.name] = ps.pid
    for worker in cluster.workers:
        cfg.servers[worker.name] = worker.pid
    topo = f"{plan.ps} PS x {plan.workers} workers"
    profile = load_profile(plan.profile).scaled(scale=plan.scale)

    def spec(b: Budget) -> Any:
        return RunSpec(
            iterations=b.iterations,
            warmup=b.warmup,
            max_seconds=b.max_seconds,
            warmup_seconds=b.max_seconds,
        )

    def throughput(size: int) -> Callable[[], tuple[float, float, int, str]]:
        def run() -> tuple[float, float, int, str]:
            point = ps_throughput(cluster, [size], run=spec(plan.throughput)).sizes[0]
            p50 = point.summary.p50_ns / 1e3
            extra = f"rpc p50 {p50:.0f} us, imbalance {point.imbalance:.2f}"
            return point.rate_per_s, point.throughput_Bps, point.count, extra

        return run

    def sgd(sharding: str) -> Callable[[], tuple[float, float, int, str]]:
        def run() -> tuple[float, float, int, str]:
            # One cluster serves every sharding: placement is computed from the topology's
            # sharding when a job is configured, and the processes are the same.
            cluster.topology = Topology(plan.ps, plan.workers, sharding)
            result = sync_sgd_step(cluster, profile, run=spec(plan.sgd))
            point = result.sizes[0]
            per_ps = "/".join(f"{load.placed_bytes / 2**20:.2f}MiB" for load in point.per_ps)
            extra = f"imbalance {point.imbalance:.2f}, per PS {per_ps}"
            return point.summary.p50_ns / 1e6, point.throughput_Bps, point.count, extra

        return run

    cases = [
        PSCase(
            "ps_throughput raw",
            f"{topo}, unary closed loop",
            size_label(size),
            "rpc/s",
            throughput(size),
        )
        for size in plan.sizes
    ]
    cases += [
        PSCase(
            f"sync_sgd_step {sharding}",
            f"{topo}, stream push+pull",
            profile.name,
            "ms/step",
            sgd(sharding),
        )
        for sharding in plan.shardings
    ]
    return cases


# --------------------------------------------------------------------------------------------
# Running and reporting
# --------------------------------------------------------------------------------------------


def round_figure(kind: str, m: Measurement) -> float:
    median = float(np.median(m.samples_ns))
    return median if kind == "latency" else m.bytes_per_sample * 1e9 / median


def run_rounds(
    contenders: Sequence[Contender],
    cases: Sequence[PSCase],
    cfg: Config,
    log: Callable[[str], None],
) -> tuple[list[Row], list[PSRow]]:
    ps_per: dict[str, list[tuple[float, float, int, str]]] = {}
    per: dict[tuple[str, int], list[float]] = {}
    counts: dict[tuple[str, int], int] = {}
    plan = [
        (c, size)
        for size in cfg.sizes
        for c in contenders
        if (c.kind == "latency" and size <= cfg.latency_max)
        or (c.kind == "bandwidth" and size >= cfg.bandwidth_min)
    ]
    for r in range(cfg.rounds):
        t0 = time.monotonic()
        for c, size in plan:
            budget = cfg.latency if c.kind == "latency" else cfg.bandwidth
            m = c.measure(size, budget)
            per.setdefault((c.name, size), []).append(round_figure(c.kind, m))
            counts[c.name, size] = counts.get((c.name, size), 0) + m.ops
        for case in cases:
            ps_per.setdefault(case.name + case.key, []).append(case.measure())
        log(f"round {r + 1}/{cfg.rounds} done in {time.monotonic() - t0:.1f} s")
    floors = {c.kind: c.name for c in contenders if c.floor}
    figures = {key: statistics.median(v) for key, v in per.items()}
    rows = []
    for c, size in plan:
        fig = figures[c.name, size]
        ref = figures.get((floors.get(c.kind, ""), size))
        # Same formula for both kinds: latency > 1 is slower than the floor, bandwidth < 1 is.
        ratio = fig / ref if ref else None
        rows.append(
            Row(
                c.name,
                c.kind,
                c.shape,
                size,
                fig,
                tuple(per[c.name, size]),
                counts[c.name, size],
                ratio,
            )
        )
    ps_rows = []
    for case in cases:
        got = ps_per[case.name + case.key]
        mid = sorted(got, key=lambda g: g[0])[(len(got) - 1) // 2]  # the median round, whole
        ps_rows.append(
            PSRow(
                case.name,
                case.shape,
                case.key,
                case.unit,
                statistics.median(g[0] for g in got),
                statistics.median(g[1] for g in got),
                tuple(g[0] for g in got),
                sum(g[2] for g in got),
                mid[3],
            )
        )
    return rows, ps_rows


def _fmt_figure(row: Row) -> str:
    if row.kind == "latency":
        return f"{row.figure / 1000:.1f} us"
    return f"{row.figure / 1e9:.3f} GB/s"


def table(rows: Sequence[Row]) -> str:
    head = ("kind", "size", "contender", "shape", "median", "x floor", "ops", "rounds")
    lines = [head]
    for row in rows:
        lines.append(
            (
                row.kind,
                size_label(row.size),
                row.contender,
                row.shape,
                _fmt_figure(row),
                "-" if row.floor_ratio is None else f"{row.floor_ratio:.2f}",
                str(row.samples),
                str(len(row.round_figures)),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    right = {1, 4, 5, 6, 7}
    out = []
    for n, line in enumerate(lines):
        cells = [
            cell.rjust(w) if i in right else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(line, widths, strict=True))
        ]
        out.append("  ".join(cells).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def ps_table(rows: Sequence[PSRow]) -> str:
    head = ("pattern", "payload", "shape", "median", "GB/s", "samples", "rounds", "median round")
    lines = [head]
    for row in rows:
        figure = (
            f"{row.figure:.1f} {row.unit}" if row.unit == "ms/step" else f"{row.figure:.0f} rpc/s"
        )
        lines.append(
            (
                row.pattern,
                row.key,
                row.shape,
                figure,
                f"{row.throughput_Bps / 1e9:.3f}",
                str(row.samples),
                str(len(row.round_figures)),
                row.extra,
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    right = {3, 4, 5, 6}
    out = []
    for n, line in enumerate(lines):
        cells = [
            cell.rjust(w) if i in right else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(line, widths, strict=True))
        ]
        out.append("  ".join(cells).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def allocator_vars_of(pid: int) -> dict[str, str] | str:
    """The allocator variables a running process was started with (``/proc/<pid>/environ``)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError as exc:
        return f"unreadable: {exc.strerror or exc}"
    found = {}
    for entry in raw.split(b"\0"):
        name, _, value = entry.decode(errors="replace").partition("=")
        if name in tuning.ALLOCATOR_VARS:
            found[name] = value
    return found


def environment(cfg: Config) -> dict[str, Any]:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
            cwd=Path(__file__).resolve().parent,
        ).stdout.strip()
        # Other work in the same checkout changes what is measured: name it with the commit.
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "src"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
            cwd=Path(__file__).resolve().parent,
        ).stdout.splitlines()
    except OSError:
        commit = ""
        dirty = []
    given = cfg.server_env if cfg.server_env is not None else dict(os.environ)
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "libc": os.confstr("CS_GNU_LIBC_VERSION") if hasattr(os, "confstr") else "",
        "grpcio": grpc.__version__,
        "numpy": np.__version__,
        "cpu_count": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
        "allocator": {
            "policy": cfg.allocator,
            "harness": tuning.allocator_settings(),
            "server_env": {k: given[k] for k in tuning.ALLOCATOR_VARS if k in given},
            # Read back from each process: what every server really runs with.
            "servers": {name: allocator_vars_of(pid) for name, pid in cfg.servers.items()},
        },
        "fabric": cfg.fabric.name,
        "address": cfg.fabric.address,
        "commit": commit,
        "src_uncommitted": [line.strip() for line in dirty],
        "tensorflow": cfg.tensorflow,
    }


@contextmanager
def process_environment(env: dict[str, str] | None) -> Iterator[None]:
    """Children started inside see ``env`` (for starters that take no ``env``, as the floor's)."""
    if env is None:
        yield
        return
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


QUICK_SIZES = "1KiB,64KiB,4MiB,64MiB"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="CI smoke run: few sizes, 2 rounds")
    p.add_argument("--fabric", default="lo", help="interface to run on (default lo)")
    p.add_argument("--sizes", default=None, help="e.g. 1KiB..64MiB (default) or 1KiB,4MiB")
    p.add_argument("--rounds", type=int, default=None, help="rounds (default 5, quick 2)")
    p.add_argument("--latency-max", default="512KiB", help="largest latency size")
    p.add_argument("--bandwidth-min", default="1MiB", help="smallest bandwidth size")
    p.add_argument("--json", type=Path, default=None, help="write rows and environment here")
    p.add_argument(
        "--allocator",
        choices=tuning.ALLOCATOR_POLICIES,
        default="tuned",
        help="glibc allocator policy of this process and of every server it starts, as the "
        "plugin's --tfgrpc-allocator (default tuned)",
    )
    p.add_argument("--no-plugin", action="store_true", help="leave the plugin's contenders out")
    p.add_argument("--no-ps", action="store_true", help="leave the parameter-server rows out")
    p.add_argument(
        "--tf-python",
        default=None,
        help="python of an environment with tensorflow-cpu, for TensorFlow's gRPC runtime rows "
        "when this interpreter has no TensorFlow (default: none, the rows are skipped)",
    )
    return p.parse_args(argv)


def ps_plan(quick: bool) -> PSPlan:
    if quick:
        return PSPlan(
            ps=2,
            workers=3,
            sizes=(64 * 1024,),
            throughput=Budget(iterations=20, warmup=2, max_seconds=0.5),
            profile="resnet50",
            scale=0.02,
            shardings=("round_robin",),
            sgd=Budget(iterations=3, warmup=1, max_seconds=2.0),
        )
    return PSPlan(
        ps=2,
        workers=3,
        sizes=(1024, 64 * 1024, 1024 * 1024, 4 * 1024 * 1024),
        throughput=Budget(iterations=200, warmup=10, max_seconds=2.0),
        profile="resnet50",
        scale=0.02,
        shardings=("round_robin", "greedy", "partitioned"),
        sgd=Budget(iterations=10, warmup=2, max_seconds=5.0),
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    fabric = resolve_fabric(args.fabric)
    sizes = parse_sizes(args.sizes or (QUICK_SIZES.split(",") if args.quick else "1KiB..64MiB"))
    if args.quick:
        lat = Budget(iterations=100, warmup=10, max_seconds=0.5)
        bw = Budget(iterations=5, warmup=1, max_seconds=1.0)
        stream_bytes = 128 * 1024 * 1024
    else:
        lat = Budget(iterations=400, warmup=30, max_seconds=1.5)
        bw = Budget(iterations=20, warmup=2, max_seconds=3.0)
        stream_bytes = 512 * 1024 * 1024
    # The plugin's own policy function: this process now, and the servers' environment.
    server_env = tuning.apply_policy(args.allocator)
    cfg = Config(
        fabric=fabric,
        sizes=tuple(sizes),
        rounds=args.rounds or (2 if args.quick else 5),
        latency_max=parse_sizes(args.latency_max)[0],
        bandwidth_min=parse_sizes(args.bandwidth_min)[0],
        latency=lat,
        bandwidth=bw,
        stream_bytes=stream_bytes,
        allocator=args.allocator,
        server_env=server_env,
        ps=None if args.no_ps else ps_plan(args.quick),
        quick=args.quick,
    )

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    started = time.monotonic()
    with ExitStack() as stack:
        with process_environment(server_env):
            fs = stack.enter_context(floor.FloorServer.start(fabric.address))
        cfg.servers["tcp floor server"] = fs.pid
        sync = stack.enter_context(bare_grpc.BareServer(fabric.address, "sync", env=server_env))
        aio = stack.enter_context(bare_grpc.BareServer(fabric.address, "aio", env=server_env))
        cfg.servers["bare grpc sync server"] = sync.pid
        cfg.servers["bare grpc aio server"] = aio.pid
        contenders = floor_contenders(fs, cfg) + bare_contenders(sync, aio)
        if args.no_plugin:
            cfg.notes.append("plugin contenders left out (--no-plugin)")
        else:
            contenders += plugin_contenders(stack, cfg)
        contenders += tensorflow_contenders(stack, cfg, args.tf_python)
        if args.no_ps:
            cfg.notes.append("parameter-server rows left out (--no-ps)")
            cases: list[PSCase] = []
        else:
            cases = ps_cases(stack, cfg)
        env = environment(cfg)
        rows, ps_rows = run_rounds(contenders, cases, cfg, log)
    env["loadavg_end"] = os.getloadavg()
    env["elapsed_s"] = round(time.monotonic() - started, 1)
    print(f"fabric {fabric.name} ({fabric.address}), {cfg.rounds} rounds, medians over rounds")
    print(json.dumps(env))
    print(table(rows))
    if ps_rows:
        print()
        print(ps_table(ps_rows))
    for note in cfg.notes:
        print(f"note: {note}")
    if args.json is not None:
        doc = {
            "environment": env,
            "notes": cfg.notes,
            "rows": [asdict(r) for r in rows],
            "ps_rows": [asdict(r) for r in ps_rows],
        }
        args.json.write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
