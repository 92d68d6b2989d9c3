"""Side by side, in one run on one fabric: the raw-TCP floor, bare grpcio, and the plugin.

    python benchmarks/run.py [--quick] [--fabric lo] [--sizes 1KiB..64MiB] [--rounds N]
                             [--json out.json] [--mallopt]

Latency contenders run at sizes up to ``--latency-max``, bandwidth contenders from
``--bandwidth-min``. Every round measures every contender at every size, in the same order, so
drift on a shared machine spreads over all of them; a figure is the median over rounds of each
round's median (latency) or of each round's bytes / median time per tensor (bandwidth). Each row
shows its ratio to the floor that does the same work: ping-pong for latency, push with one ack per
tensor for bandwidth. "x floor" is the figure divided by the floor's; "ops" counts the timed
operations (round trips or tensors) over all rounds. Nothing here asserts a speed: it measures
and prints.
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
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bare_grpc

from pytest_tfgrpc import floor
from pytest_tfgrpc.fabric import Fabric, resolve_fabric
from pytest_tfgrpc.units import parse_sizes, size_label

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
    mallopt: bool
    notes: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------------------------
# Contenders
# --------------------------------------------------------------------------------------------


def floor_contenders(server: floor.FloorServer, cfg: Config) -> list[Contender]:
    host, port = server.address

    def pingpong(size: int, b: Budget) -> Measurement:
        s = floor.tcp_pingpong(
            host, port, size, iterations=b.iterations, warmup=b.warmup, max_seconds=b.max_seconds
        )
        return Measurement(s, size)

    def push_ack(size: int, b: Budget) -> Measurement:
        s = floor.tcp_push_ack(
            host, port, size, iterations=b.iterations, warmup=b.warmup, max_seconds=b.max_seconds
        )
        return Measurement(s, size)

    def stream(size: int, b: Budget) -> Measurement:
        count = max(4, min(1000, cfg.stream_bytes // max(size, 1)))
        r = floor.tcp_stream(host, port, size, count=count, warmup=2, max_seconds=b.max_seconds)
        return Measurement(np.array([r.elapsed_ns], dtype=np.int64), r.nbytes, r.count)

    return [
        Contender("tcp pingpong", "latency", "socket echo", pingpong, floor=True),
        Contender("tcp push+ack", "bandwidth", "socket push, 1 ack/tensor", push_ack, floor=True),
        Contender("tcp stream", "bandwidth", "socket stream, 1 ack at end", stream),
    ]


def bare_contenders(sync: bare_grpc.BareServer, aio: bare_grpc.BareServer) -> list[Contender]:
    def unary_echo(size: int, b: Budget) -> Measurement:
        s = bare_grpc.unary_echo(
            sync.target, size, iterations=b.iterations, warmup=b.warmup, max_seconds=b.max_seconds
        )
        return Measurement(s, size)

    def stream_pingpong(size: int, b: Budget) -> Measurement:
        s = bare_grpc.aio_stream_pingpong(
            aio.target, size, iterations=b.iterations, warmup=b.warmup, max_seconds=b.max_seconds
        )
        return Measurement(s, size)

    def client_stream(size: int, b: Budget) -> Measurement:
        s = bare_grpc.client_stream_push(
            sync.target, size, iterations=b.iterations, warmup=b.warmup, max_seconds=b.max_seconds
        )
        return Measurement(s, size)

    def unary_push(size: int, b: Budget) -> Measurement:
        s = bare_grpc.unary_push(
            sync.target, size, iterations=b.iterations, warmup=b.warmup, max_seconds=b.max_seconds
        )
        return Measurement(s, size)

    return [
        Contender("grpc sync unary", "latency", "unary echo, sync", unary_echo),
        Contender("grpc aio stream", "latency", "stream-stream ping-pong, aio", stream_pingpong),
        Contender("grpc client-stream", "bandwidth", "1 MiB chunks, 1 ack/tensor", client_stream),
        Contender("grpc unary push", "bandwidth", "whole tensor, unary", unary_push),
    ]


# ---- EXTENSION POINT: the plugin's own contenders ------------------------------------------
# Every contender the plugin offers goes in this list and is measured against the same floor, in
# the same rounds. A new RPC shape or mode of pytest_tfgrpc.bench is one more entry here.
def plugin_contenders(stack: ExitStack, cfg: Config) -> list[Contender]:
    try:
        from pytest_tfgrpc.bench import RunSpec, p2p_bandwidth, p2p_latency
        from pytest_tfgrpc.process import ServerProcess
    except ImportError as exc:
        cfg.notes.append(f"plugin contenders skipped: pytest_tfgrpc.bench not importable ({exc})")
        return []
    server = ServerProcess.start(cfg.fabric)
    stack.callback(server.stop)

    def spec(b: Budget) -> Any:
        return RunSpec(
            iterations=b.iterations,
            warmup=b.warmup,
            max_seconds=b.max_seconds,
            warmup_seconds=b.max_seconds,
        )

    def latency(mode: str, rpc: str) -> Callable[[int, Budget], Measurement]:
        def run(size: int, b: Budget) -> Measurement:
            result = p2p_latency(server, [size], mode=mode, rpc=rpc, run=spec(b))
            return Measurement(result.sizes[0].samples_ns, size)

        return run

    def bandwidth(mode: str, rpc: str) -> Callable[[int, Budget], Measurement]:
        def run(size: int, b: Budget) -> Measurement:
            result = p2p_bandwidth(server, [size], mode=mode, rpc=rpc, run=spec(b))
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
                    bandwidth(mode, rpc),
                )
            )
    return out


def tensorflow_contenders(cfg: Config) -> list[Contender]:
    try:
        import tensorflow  # type: ignore[import-not-found,unused-ignore]  # noqa: F401
    except ImportError:
        cfg.notes.append(
            "TensorFlow's gRPC runtime skipped: `import tensorflow` fails here "
            "(install tensorflow-cpu to add it)"
        )
        return []
    cfg.notes.append("TensorFlow is importable, but no TensorFlow contender is written yet")
    return []


# --------------------------------------------------------------------------------------------
# Running and reporting
# --------------------------------------------------------------------------------------------


def round_figure(kind: str, m: Measurement) -> float:
    median = float(np.median(m.samples_ns))
    return median if kind == "latency" else m.bytes_per_sample * 1e9 / median


def run_rounds(
    contenders: Sequence[Contender], cfg: Config, log: Callable[[str], None]
) -> list[Row]:
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
    return rows


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


def environment(cfg: Config, mallopt: dict[str, int] | None) -> dict[str, Any]:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
            cwd=Path(__file__).resolve().parent,
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "libc": os.confstr("CS_GNU_LIBC_VERSION") if hasattr(os, "confstr") else "",
        "grpcio": grpc.__version__,
        "numpy": np.__version__,
        "cpu_count": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
        "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
        "mallopt": mallopt,
        "fabric": cfg.fabric.name,
        "address": cfg.fabric.address,
        "commit": commit,
    }


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
        "--mallopt",
        action="store_true",
        help="apply glibc mallopt(M_MMAP_THRESHOLD, M_TRIM_THRESHOLD) in this process and the "
        "bare grpc servers",
    )
    p.add_argument("--no-plugin", action="store_true", help="leave the plugin's contenders out")
    return p.parse_args(argv)


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
    cfg = Config(
        fabric=fabric,
        sizes=tuple(sizes),
        rounds=args.rounds or (2 if args.quick else 5),
        latency_max=parse_sizes(args.latency_max)[0],
        bandwidth_min=parse_sizes(args.bandwidth_min)[0],
        latency=lat,
        bandwidth=bw,
        stream_bytes=stream_bytes,
        mallopt=args.mallopt,
    )
    mallopt = bare_grpc.apply_mallopt() if args.mallopt else None

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    started = time.monotonic()
    with ExitStack() as stack:
        fs = stack.enter_context(floor.FloorServer(fabric.address))
        sync = stack.enter_context(
            bare_grpc.BareServer(fabric.address, "sync", mallopt=cfg.mallopt)
        )
        aio = stack.enter_context(bare_grpc.BareServer(fabric.address, "aio", mallopt=cfg.mallopt))
        contenders = floor_contenders(fs, cfg) + bare_contenders(sync, aio)
        if args.no_plugin:
            cfg.notes.append("plugin contenders left out (--no-plugin)")
        else:
            contenders += plugin_contenders(stack, cfg)
        contenders += tensorflow_contenders(cfg)
        if cfg.mallopt:
            cfg.notes.append(
                "mallopt applied in this process and the bare grpc servers; other servers "
                "only get MALLOC_* from the environment"
            )
        env = environment(cfg, mallopt)
        rows = run_rounds(contenders, cfg, log)
    env["loadavg_end"] = os.getloadavg()
    env["elapsed_s"] = round(time.monotonic() - started, 1)
    print(f"fabric {fabric.name} ({fabric.address}), {cfg.rounds} rounds, medians over rounds")
    print(json.dumps(env))
    print(table(rows))
    for note in cfg.notes:
        print(f"note: {note}")
    if args.json is not None:
        doc = {"environment": env, "notes": cfg.notes, "rows": [asdict(r) for r in rows]}
        args.json.write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
