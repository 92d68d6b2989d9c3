"""The native engine's targets, as ratios inside one run on one fabric.

    python benchmarks/native.py [--quick] [--fabric lo] [--rounds N] [--json out.json]

Contenders, measured in the same rounds by ``run.py``'s machinery (every round measures every
contender at every size in the same order; a figure is the median over rounds):

* the raw-TCP floors: ping-pong (latency) and push with one ack per tensor (bandwidth);
* bare grpcio doing the plugin's work (aio stream ping-pong against a sync server; client
  stream push in 1 MiB chunks with one ack per tensor);
* the Python engine (``engine="grpcio"``, its own server) and the native engine
  (``engine="native"``, the C++ client against the C++ server): 1 KiB stream echo, and raw
  stream push with one ack per tensor at 4-64 MiB;
* ``streams=1`` against ``streams=2`` (aggregate) for both engines at 4 MiB.

Then each target is printed with the figures it was read from. Nothing is asserted: on a shared
2-core machine a single run swings by 2x, so the verdict is a reading, not a gate. Needs the
native engine built (``tfgrpc-build-native``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bare_grpc
import numpy as np
import run as harness
from run import Budget, Config, Contender, Measurement, Row

from pytest_tfgrpc import native
from pytest_tfgrpc.bench import BandwidthCall, LatencyCall, RunSpec, native_p2p, p2p
from pytest_tfgrpc.bench.streams import p2p_bandwidth_streams
from pytest_tfgrpc.roles import floor_server as floor
from pytest_tfgrpc.roles.native_server import start_tensor_server
from pytest_tfgrpc.roles.processes import ServerProcess
from pytest_tfgrpc.tuning import allocator as tuning
from pytest_tfgrpc.units import parse_sizes, size_label
from pytest_tfgrpc.wire.fabric import resolve_fabric

Measure = Callable[[int, Budget], Measurement]


def spec(b: Budget) -> RunSpec:
    return RunSpec(
        iterations=b.iterations, warmup=b.warmup, max_seconds=b.max_seconds, warmup_seconds=1.0
    )


def engine_contenders(engine: str, server: ServerProcess) -> list[Contender]:
    """One engine's client against ``server``: stream echo and raw stream push."""
    module = native_p2p if engine == "native" else p2p

    def echo(size: int, b: Budget) -> Measurement:
        result = module.p2p_latency(server, [size], LatencyCall(rpc="stream", run=spec(b)))
        return Measurement(result.sizes[0].samples_ns, size)

    def push(size: int, b: Budget) -> Measurement:
        result = module.p2p_bandwidth(server, [size], BandwidthCall(rpc="stream", run=spec(b)))
        return Measurement(result.sizes[0].samples_ns, size)

    return [
        Contender(f"{engine} stream echo", "latency", f"{engine} client+server", echo),
        Contender(f"{engine} stream push", "bandwidth", f"{engine}, 1 ack/tensor", push),
    ]


def streams_contender(engine: str, server: ServerProcess, streams: int) -> Contender:
    """The aggregate rate of ``streams`` connections: every byte over the common wall time."""

    def push(size: int, b: Budget) -> Measurement:
        call = BandwidthCall(run=spec(b))
        both = p2p_bandwidth_streams(server, [size], call, streams=streams, engine=engine)
        merged = both.aggregate.sizes[0]
        # One sample of the whole wall time carrying every byte: the aggregate rate.
        wall = np.array([merged.samples_ns.sum()], dtype=np.int64)
        return Measurement(wall, size * merged.count, merged.count)

    return Contender(
        f"{engine} streams={streams}", "bandwidth", f"{engine}, aggregate of {streams}", push
    )


def figure(rows: Sequence[Row], contender: str, size: int) -> float | None:
    return next((r.figure for r in rows if r.contender == contender and r.size == size), None)


def targets(rows: Sequence[Row], big: Sequence[int], small: int) -> list[str]:
    """Each of the native engine's targets with the figures it is read from."""
    out = []

    def ratio_line(
        name: str, top: float | None, bottom: float | None, ok: Callable[[float], bool]
    ) -> None:
        if top is None or bottom is None:
            out.append(f"{name}: not measured")
            return
        value = top / bottom
        out.append(f"{name}: {value:.3f} -> {'met' if ok(value) else 'NOT met'}")

    for size in big:
        ratio_line(
            f"native stream push {size_label(size)} / tcp push+ack >= 0.8",
            figure(rows, "native stream push", size),
            figure(rows, "tcp push+ack", size),
            lambda v: v >= 0.8,
        )
    ratio_line(
        f"native stream push {size_label(big[-1])} / {size_label(big[0])} within 10%",
        figure(rows, "native stream push", big[-1]),
        figure(rows, "native stream push", big[0]),
        lambda v: abs(v - 1) <= 0.1,
    )
    ratio_line(
        f"native {size_label(small)} stream echo p50 / tcp pingpong <= 3",
        figure(rows, "native stream echo", small),
        figure(rows, "tcp pingpong", small),
        lambda v: v <= 3,
    )
    ratio_line(
        f"grpcio engine {size_label(small)} stream echo p50 / bare grpcio <= 1.05",
        figure(rows, "grpcio stream echo", small),
        figure(rows, "grpc aio stream/sync srv", small),
        lambda v: v <= 1.05,
    )
    for size in big:
        ratio_line(
            f"bare grpcio client-stream {size_label(size)} / grpcio engine push <= 1.05",
            figure(rows, "grpc client-stream", size),
            figure(rows, "grpcio stream push", size),
            lambda v: v <= 1.05,
        )
    for engine in ("native", "grpcio"):
        ratio_line(
            f"{engine} streams=2 aggregate / streams=1 at {size_label(big[0])} (2 cores: "
            "no scaling expected)",
            figure(rows, f"{engine} streams=2", big[0]),
            figure(rows, f"{engine} streams=1", big[0]),
            lambda v: True,
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="CI smoke run: 1 round, short loops")
    parser.add_argument("--fabric", default="lo")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 5, quick 1)")
    parser.add_argument("--json", type=Path, default=None, help="write rows and environment here")
    args = parser.parse_args(argv)
    reason = native.unavailable_reason()
    if reason is not None:
        print(f"native.py: {reason}", file=sys.stderr)
        return 2
    fabric = resolve_fabric(args.fabric)
    small = parse_sizes("1KiB")[0]
    big = parse_sizes("4MiB,16MiB,64MiB" if not args.quick else "4MiB,64MiB")
    server_env = tuning.apply_policy("tuned")
    cfg = Config(
        fabric=fabric,
        sizes=(small, *big),
        rounds=args.rounds or (1 if args.quick else 5),
        latency_max=small,
        bandwidth_min=big[0],
        latency=Budget(100, 10, 0.5) if args.quick else Budget(2000, 100, 1.5),
        bandwidth=Budget(5, 1, 1.0) if args.quick else Budget(50, 3, 3.0),
        stream_bytes=0,
        allocator="tuned",
        server_env=server_env,
    )
    started = time.monotonic()

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    with ExitStack() as stack:
        with harness.process_environment(server_env):
            fs = stack.enter_context(floor.FloorServer.start(fabric.address))
        sync = stack.enter_context(bare_grpc.BareServer(fabric.address, "sync", env=server_env))
        aio = stack.enter_context(bare_grpc.BareServer(fabric.address, "aio", env=server_env))
        python_server = stack.enter_context(start_tensor_server(fabric, env=server_env))
        native_server = stack.enter_context(
            start_tensor_server(fabric, engine="native", env=server_env)
        )
        cfg.servers |= {
            "tcp floor server": fs.pid,
            "bare grpc sync server": sync.pid,
            "python tensor server": python_server.pid,
            "native tensor server": native_server.pid,
        }
        keep = {"tcp pingpong", "tcp push+ack", "grpc aio stream/sync srv", "grpc client-stream"}
        contenders = [
            c
            for c in harness.floor_contenders(fs, cfg) + harness.bare_contenders(sync, aio)
            if c.name in keep
        ]
        contenders += engine_contenders("grpcio", python_server)
        contenders += engine_contenders("native", native_server)
        env = harness.environment(cfg)
        env["native"] = {"grpc_cpp": native.binaries().grpc_version, "source": native.source_hash()}
        rows, _ = harness.run_rounds(contenders, [], cfg, log)
        # Streams in rounds of their own, at the smallest bandwidth size only: streams x
        # processes x rounds adds up.
        parallel = [
            streams_contender(engine, server, n)
            for engine, server in (("native", native_server), ("grpcio", python_server))
            for n in (1, 2)
        ]
        more, _ = harness.run_rounds(parallel, [], replace(cfg, sizes=(big[0],)), log)
        rows += more
    env["loadavg_end"] = os.getloadavg()
    env["elapsed_s"] = round(time.monotonic() - started, 1)
    print(f"fabric {fabric.name} ({fabric.address}), {cfg.rounds} rounds, medians over rounds")
    print(f"uptime at start: load {env['loadavg_start']}, at end: {env['loadavg_end']}")
    print("the machine is shared with other engineers' test runs: figures swing between runs")
    print(json.dumps(env))
    print(harness.table(rows))
    print()
    for line in targets(rows, big, small):
        print(line)
    if args.json is not None:
        args.json.write_text(
            json.dumps({"environment": env, "rows": [asdict(r) for r in rows]}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
