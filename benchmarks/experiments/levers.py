"""Levers on the plugin's measuring path, side by side in one run (nothing in src/ changes).

    python benchmarks/experiments/levers.py [--rounds 3] [--only chunk,window,...] [--json out]

Every group below measures variants of one thing against the same server(s), variants
interleaved round by round so drift hits them alike; a figure is the median over rounds of
bytes / median time per tensor (bandwidth) or of the median round trip (latency). Groups:

- ``chunk``: stream push slice size (256 KiB, 1, 2, 4 MiB), raw and protobuf, 4 and 64 MiB;
- ``window``: ``grpc.http2.lookahead_bytes`` 4/8/16/64 MiB with ``grpc.http2.bdp_probe`` off
  and on, set on both ends (one patched server per setting, see ``patched_server.py``);
- ``fresh``: many fresh connections pulling (unary) and pushing (stream) 4 MiB, BDP probing
  off and on, to see connections that stick at a fraction of the bandwidth;
- ``wbuf``: ``grpc.http2.write_buffer_size`` on both ends;
- ``inflight``: how the client hands slices to gRPC: await each ``write`` (the plugin), an
  async request iterator fed by a queue, the sync client with a queue-fed request iterator, a
  new sync stream per tensor (starting every write at once is refused by grpc: one write may
  be pending per call, a second fails with GRPC_CALL_ERROR_TOO_MANY_OPERATIONS);
- ``compression``: gzip on the channel against none (the default) at 4 MiB;
- ``latency``: where the plugin's 1 KiB echo loses to bare grpcio: client channel options,
  server (plugin vs bare), and the plugin's loop itself, unary and stream.

Client channel options are changed by replacing
``pytest_tfgrpc.wire.grpc_settings.CHANNEL_OPTIONS`` in this process; server options by starting
``patched_server.py``. Every server is started with the plugin's tuned allocator environment, as
the harness does.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import queue
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import bare_grpc  # noqa: E402

from pytest_tfgrpc.bench import (  # noqa: E402
    BandwidthCall,
    LatencyCall,
    RunSpec,
    p2p_bandwidth,
    p2p_latency,
)
from pytest_tfgrpc.bench.timing import Samples, measure, measure_async  # noqa: E402
from pytest_tfgrpc.roles.processes import ServerProcess  # noqa: E402
from pytest_tfgrpc.tuning import allocator as tuning  # noqa: E402
from pytest_tfgrpc.wire import codec, grpc_settings  # noqa: E402
from pytest_tfgrpc.wire.client import connect, connect_aio  # noqa: E402
from pytest_tfgrpc.wire.fabric import Fabric, resolve_fabric  # noqa: E402
from pytest_tfgrpc.wire.tensors import Tensor  # noqa: E402

MiB = 1 << 20
KiB = 1 << 10
BASE_CHANNEL_OPTIONS = grpc_settings.CHANNEL_OPTIONS
BW_RUN = RunSpec(iterations=15, warmup=2, max_seconds=1.5, warmup_seconds=1.5)
LAT_RUN = RunSpec(iterations=400, warmup=30, max_seconds=1.0, warmup_seconds=0.5)


@dataclass(frozen=True)
class Figure:
    group: str
    variant: str
    size: int
    kind: str  # "bandwidth" (B/s) or "latency" (ns)
    figure: float  # median over rounds
    rounds: tuple[float, ...]
    samples: int


def start_server(fabric: Fabric, env: dict[str, str] | None, changes: Sequence[Any]) -> Any:
    """The plugin's server, with ``changes`` to its gRPC options (none: the stock server)."""
    if not changes:
        return ServerProcess.start(fabric, env=env)
    argv = [sys.executable, str(HERE / "patched_server.py"), json.dumps(list(changes))]
    argv += ["--fabric", fabric.name, "--exit-on-stdin-eof"]
    handle = ServerProcess(argv, fabric=fabric, name=f"patched server {changes}", env=env)
    try:
        handle._wait_ready(30.0)  # the same readiness wait ServerProcess.start uses
    except BaseException:
        handle.stop()
        raise
    return handle


def channel_options(changes: Sequence[Any]) -> tuple[Any, ...]:
    options = dict(BASE_CHANNEL_OPTIONS)
    for name, value in changes:
        if value is None:
            options.pop(name, None)
        else:
            options[name] = value
    return tuple(options.items())


class Options:
    """Replace the client channel options for the calls made inside."""

    def __init__(self, changes: Sequence[Any]) -> None:
        self.options = channel_options(changes)

    def __enter__(self) -> None:
        grpc_settings.CHANNEL_OPTIONS = self.options  # type: ignore[misc]

    def __exit__(self, *exc: object) -> None:
        grpc_settings.CHANNEL_OPTIONS = BASE_CHANNEL_OPTIONS  # type: ignore[misc]


def bw_of(size: int, samples: Samples) -> float:
    return size * 1e9 / float(np.median(samples))


# --- push variants (raw PushStream of the plugin's server) ----------------------------------
def _pieces(size: int, chunk: int) -> list[bytes]:
    content = Tensor.random(size).content
    view = memoryview(content)
    return [view[i : i + chunk].tobytes() for i in range(0, size, chunk)]


def _check_ack(reply: bytes, size: int) -> None:
    acked, _ = codec.decode_ack(reply)
    if acked != size:
        raise RuntimeError(f"acknowledged {acked} B of {size}")


async def _aio_push(target: str, size: int, chunk: int, variant: str, run: RunSpec) -> Samples:
    pieces = _pieces(size, chunk)
    channel = await connect_aio(target)
    meta = ((grpc_settings.MESSAGE_BYTES_KEY, str(size)),)
    timeout = 120.0 + 4 * run.max_seconds
    multi = channel.stream_stream(grpc_settings.method("raw", "PushStream"))
    try:
        if variant == "iterator":
            q: asyncio.Queue[bytes | None] = asyncio.Queue()

            async def requests() -> AsyncIterator[bytes]:
                while True:
                    item = await q.get()
                    if item is None:
                        return
                    yield item

            stream = multi(requests(), timeout=timeout, metadata=meta)

            async def op() -> bytes:
                for piece in pieces:
                    q.put_nowait(piece)
                reply: bytes = await stream.read()
                return reply

        else:
            stream = multi(timeout=timeout, metadata=meta)
            write, read = stream.write, stream.read
            if variant == "await":

                async def op() -> bytes:
                    for piece in pieces:
                        await write(piece)
                    reply: bytes = await read()
                    return reply

            elif variant == "gather":

                async def op() -> bytes:
                    await asyncio.gather(*(write(piece) for piece in pieces))
                    reply: bytes = await read()
                    return reply

            else:
                raise ValueError(variant)
        _check_ack(await op(), size)
        samples, _ = await measure_async(op, run)
        if variant == "iterator":
            q.put_nowait(None)
        else:
            await stream.done_writing()
        await stream.code()
        return samples
    finally:
        await channel.close()


def aio_push(target: str, size: int, chunk: int, variant: str, run: RunSpec) -> Samples:
    return asyncio.run(_aio_push(target, size, chunk, variant, run))


def sync_push(target: str, size: int, chunk: int, variant: str, run: RunSpec) -> Samples:
    pieces = _pieces(size, chunk)
    channel = connect(target)
    meta = ((grpc_settings.MESSAGE_BYTES_KEY, str(size)),)
    timeout = 120.0 + 4 * run.max_seconds
    multi = channel.stream_stream(grpc_settings.method("raw", "PushStream"))
    try:
        if variant == "sync stream":
            q: queue.Queue[bytes | None] = queue.Queue()

            def requests() -> Iterator[bytes]:
                while True:
                    item = q.get(timeout=timeout)
                    if item is None:
                        return
                    yield item

            replies = multi(requests(), timeout=timeout, metadata=meta)

            def op() -> bytes:
                for piece in pieces:
                    q.put(piece)
                reply: bytes = next(replies)
                return reply

            _check_ack(op(), size)
            samples, _ = measure(op, run)
            q.put(None)
            for _ in replies:  # the call's end
                pass
            return samples
        if variant == "sync stream/tensor":

            def op() -> bytes:
                (reply,) = list(multi(iter(pieces), timeout=timeout, metadata=meta))
                return bytes(reply)

            _check_ack(op(), size)
            samples, _ = measure(op, run)
            return samples
        raise ValueError(variant)
    finally:
        channel.close()


# --- latency decomposition -------------------------------------------------------------------
def sync_unary_echo(target: str, method: str, size: int, run: RunSpec) -> Samples:
    data = Tensor.random(size).content
    channel = connect(target)
    try:
        call = channel.unary_unary(method)
        if call(data, timeout=60) != data:
            raise RuntimeError("echo differs")
        samples, _ = measure(lambda: call(data, timeout=60), run)
        return samples
    finally:
        channel.close()


async def _aio_stream_echo(target: str, method: str, size: int, run: RunSpec) -> Samples:
    data = Tensor.random(size).content
    channel = await connect_aio(target)
    try:
        stream = channel.stream_stream(method)(timeout=120)
        write, read = stream.write, stream.read

        async def op() -> object:
            await write(data)
            return await read()

        if await op() != data:
            raise RuntimeError("echo differs")
        samples, _ = await measure_async(op, run)
        await stream.done_writing()
        await stream.code()
        return samples
    finally:
        await channel.close()


def aio_stream_echo(target: str, method: str, size: int, run: RunSpec) -> Samples:
    return asyncio.run(_aio_stream_echo(target, method, size, run))


# --- the groups -----------------------------------------------------------------------------
Case = tuple[str, int, str, Callable[[], float], Callable[[], int]]


def run_cases(
    group: str, cases: list[Any], rounds: int, log: Callable[[str], None]
) -> list[Figure]:
    """``cases``: (variant, size, kind, measure() -> (figure, count)). Interleaved rounds."""
    got: dict[tuple[str, int], list[float]] = {}
    counts: dict[tuple[str, int], int] = {}
    for r in range(rounds):
        t0 = time.monotonic()
        for variant, size, _kind, fn in cases:
            figure, count = fn()
            got.setdefault((variant, size), []).append(figure)
            counts[variant, size] = counts.get((variant, size), 0) + count
        log(f"{group}: round {r + 1}/{rounds} in {time.monotonic() - t0:.1f} s")
    return [
        Figure(
            group,
            variant,
            size,
            kind,
            statistics.median(got[variant, size]),
            tuple(got[variant, size]),
            counts[variant, size],
        )
        for variant, size, kind, _ in cases
    ]


def bw_case(variant: str, size: int, fn: Callable[[], Samples]) -> Any:
    def run() -> tuple[float, int]:
        samples = fn()
        return bw_of(size, samples), len(samples)

    return (variant, size, "bandwidth", run)


def lat_case(variant: str, size: int, fn: Callable[[], Samples]) -> Any:
    def run() -> tuple[float, int]:
        samples = fn()
        return float(np.median(samples)), len(samples)

    return (variant, size, "latency", run)


def plugin_bw(server: Any, size: int, mode: str, chunk: int, rpc: str = "stream") -> Samples:
    call = BandwidthCall(mode=mode, rpc=rpc, chunk_bytes=chunk, run=BW_RUN)
    result = p2p_bandwidth(server, [size], call)
    return result.sizes[0].samples_ns


def group_chunk(server: Any, sizes: Sequence[int]) -> list[Any]:
    cases = []
    for size in sizes:
        for mode in ("raw", "protobuf"):
            for chunk in (256 * KiB, 1 * MiB, 2 * MiB, 4 * MiB):
                cases.append(
                    bw_case(
                        f"{mode} chunk {chunk // KiB} KiB",
                        size,
                        functools.partial(plugin_bw, server, size, mode, chunk),
                    )
                )
    return cases


def group_window(
    stack: ExitStack, fabric: Fabric, env: dict[str, str] | None, sizes: Sequence[int]
) -> list[Any]:
    cases = []
    for bdp in (0, 1):
        for lookahead in (4 * MiB, 8 * MiB, 16 * MiB, 64 * MiB):
            changes = [["grpc.http2.lookahead_bytes", lookahead], ["grpc.http2.bdp_probe", bdp]]
            server = start_server(fabric, env, changes)
            stack.callback(server.stop)
            for size in sizes:

                def fn(s: int = size, srv: Any = server, c: Any = changes) -> Samples:
                    with Options(c):
                        return plugin_bw(srv, s, "raw", grpc_settings.DEFAULT_CHUNK_BYTES)

                name = f"lookahead {lookahead // MiB} MiB, bdp_probe {'on' if bdp else 'off'}"
                cases.append(bw_case(name, size, fn))
    return cases


def group_fresh(
    stack: ExitStack, fabric: Fabric, env: dict[str, str] | None, sizes: Sequence[int]
) -> list[Any]:
    """Fresh connections pulling and pushing 4 MiB, BDP probing off (the plugin) and on.

    Every round is a new channel, so ``--rounds`` counts fresh connections: the rounds show
    whether some connections stick at a fraction of the others' bandwidth.
    """
    cases = []
    for bdp in (0, 1):
        changes = [["grpc.http2.bdp_probe", bdp]]
        server = start_server(fabric, env, changes)
        stack.callback(server.stop)
        name = f"bdp_probe {'on' if bdp else 'off'}, lookahead 8 MiB"

        def pull(srv: Any = server, c: Any = changes) -> Samples:
            with Options(c):
                call = BandwidthCall(rpc="unary", direction="pull", run=BW_RUN)
                result = p2p_bandwidth(srv, [4 * MiB], call)
                return result.sizes[0].samples_ns

        def push(srv: Any = server, c: Any = changes) -> Samples:
            with Options(c):
                return plugin_bw(srv, 4 * MiB, "raw", grpc_settings.DEFAULT_CHUNK_BYTES)

        cases.append(bw_case(f"unary pull, {name}", 4 * MiB, pull))
        cases.append(bw_case(f"stream push, {name}", 4 * MiB, push))
    return cases


def group_wbuf(
    stack: ExitStack, fabric: Fabric, env: dict[str, str] | None, sizes: Sequence[int]
) -> list[Any]:
    cases = []
    for wbuf in (None, 64 * KiB, 1 * MiB, 8 * MiB):
        changes = [] if wbuf is None else [["grpc.http2.write_buffer_size", wbuf]]
        server = start_server(fabric, env, changes)
        stack.callback(server.stop)
        for size in sizes:

            def fn(s: int = size, srv: Any = server, c: Any = changes) -> Samples:
                with Options(c):
                    return plugin_bw(srv, s, "raw", grpc_settings.DEFAULT_CHUNK_BYTES)

            name = "write_buffer_size default" if wbuf is None else f"write_buffer_size {wbuf}"
            cases.append(bw_case(name, size, fn))
    return cases


def group_inflight(server: Any, sizes: Sequence[int]) -> list[Any]:
    cases = []
    chunk = grpc_settings.DEFAULT_CHUNK_BYTES
    for size in sizes:
        # No "gather" (all writes started at once): grpc allows one pending write per call and
        # answers a second with GRPC_CALL_ERROR_TOO_MANY_OPERATIONS (seen on grpcio 1.85.3).
        for variant in ("await", "iterator"):
            cases.append(
                bw_case(
                    f"aio {variant}",
                    size,
                    functools.partial(aio_push, server.target, size, chunk, variant, BW_RUN),
                )
            )
        for variant in ("sync stream", "sync stream/tensor"):
            cases.append(
                bw_case(
                    variant,
                    size,
                    functools.partial(sync_push, server.target, size, chunk, variant, BW_RUN),
                )
            )
    return cases


def group_compression(server: Any) -> list[Any]:
    size = 4 * MiB
    cases = [bw_case("none", size, lambda: plugin_bw(server, size, "raw", MiB))]

    def gzip() -> Samples:
        with Options([["grpc.default_compression_algorithm", 2]]):  # 2 = gzip
            return plugin_bw(server, size, "raw", MiB)

    cases.append(bw_case("gzip (channel default)", size, gzip))
    return cases


def group_latency(
    server: Any, bare_sync: bare_grpc.BareServer, bare_aio: bare_grpc.BareServer
) -> list[Any]:
    size = KiB
    run = LAT_RUN
    raw_echo = grpc_settings.method("raw", "Echo")
    raw_stream = grpc_settings.method("raw", "EchoStream")
    bare_opts = [[name, None] for name, _ in BASE_CHANNEL_OPTIONS] + [
        [n, v] for n, v in bare_grpc.CHANNEL_OPTIONS
    ]

    def with_opts(opts: Any, fn: Callable[[], Samples]) -> Callable[[], Samples]:
        def run_() -> Samples:
            with Options(opts):
                return fn()

        return run_

    spec = RunSpec(
        iterations=run.iterations,
        warmup=run.warmup,
        max_seconds=run.max_seconds,
        warmup_seconds=run.warmup_seconds,
    )
    return [
        lat_case(
            "unary: bare client opts -> bare sync server",
            size,
            with_opts(
                bare_opts, lambda: sync_unary_echo(bare_sync.target, bare_grpc.ECHO, size, run)
            ),
        ),
        lat_case(
            "unary: plugin client opts -> bare sync server",
            size,
            lambda: sync_unary_echo(bare_sync.target, bare_grpc.ECHO, size, run),
        ),
        lat_case(
            "unary: bare client opts -> plugin server",
            size,
            with_opts(bare_opts, lambda: sync_unary_echo(server.target, raw_echo, size, run)),
        ),
        lat_case(
            "unary: plugin client opts -> plugin server",
            size,
            lambda: sync_unary_echo(server.target, raw_echo, size, run),
        ),
        lat_case(
            "unary: p2p_latency raw/unary",
            size,
            lambda: (
                p2p_latency(server, [size], LatencyCall(rpc="unary", run=spec)).sizes[0].samples_ns
            ),
        ),
        lat_case(
            "stream: bare opts -> bare aio server",
            size,
            with_opts(
                bare_opts,
                lambda: aio_stream_echo(bare_aio.target, bare_grpc.ECHO_STREAM, size, run),
            ),
        ),
        lat_case(
            "stream: bare opts -> bare sync server",
            size,
            with_opts(
                bare_opts,
                lambda: aio_stream_echo(bare_sync.target, bare_grpc.ECHO_STREAM, size, run),
            ),
        ),
        lat_case(
            "stream: plugin opts -> bare sync server",
            size,
            lambda: aio_stream_echo(bare_sync.target, bare_grpc.ECHO_STREAM, size, run),
        ),
        lat_case(
            "stream: bare opts -> plugin server",
            size,
            with_opts(bare_opts, lambda: aio_stream_echo(server.target, raw_stream, size, run)),
        ),
        lat_case(
            "stream: plugin opts -> plugin server",
            size,
            lambda: aio_stream_echo(server.target, raw_stream, size, run),
        ),
        lat_case(
            "stream: p2p_latency raw/stream",
            size,
            lambda: (
                p2p_latency(server, [size], LatencyCall(rpc="stream", run=spec)).sizes[0].samples_ns
            ),
        ),
    ]


def group_server(
    stack: ExitStack,
    fabric: Fabric,
    env: dict[str, str] | None,
    server: Any,
    bare_sync: bare_grpc.BareServer,
) -> list[Any]:
    """1 KiB unary and stream echo, same client: bare sync server, the plugin's server with
    its 16 handler threads, and with 4 (as the bare one has)."""
    few = ServerProcess.start(fabric, env=env, extra_args=("--workers", "4"))
    stack.callback(few.stop)
    raw_echo = grpc_settings.method("raw", "Echo")
    raw_stream = grpc_settings.method("raw", "EchoStream")
    run = LAT_RUN
    cases = [
        lat_case(
            "unary: bare sync server (4 threads)",
            KiB,
            lambda: sync_unary_echo(bare_sync.target, bare_grpc.ECHO, KiB, run),
        ),
        lat_case(
            "unary: plugin server, 16 threads",
            KiB,
            lambda: sync_unary_echo(server.target, raw_echo, KiB, run),
        ),
        lat_case(
            "unary: plugin server, 4 threads",
            KiB,
            lambda: sync_unary_echo(few.target, raw_echo, KiB, run),
        ),
        lat_case(
            "stream: bare sync server (4 threads)",
            KiB,
            lambda: aio_stream_echo(bare_sync.target, bare_grpc.ECHO_STREAM, KiB, run),
        ),
        lat_case(
            "stream: plugin server, 16 threads",
            KiB,
            lambda: aio_stream_echo(server.target, raw_stream, KiB, run),
        ),
        lat_case(
            "stream: plugin server, 4 threads",
            KiB,
            lambda: aio_stream_echo(few.target, raw_stream, KiB, run),
        ),
    ]
    return cases


def group_gc(
    stack: ExitStack,
    fabric: Fabric,
    env: dict[str, str] | None,
    server: Any,
    bare_sync: bare_grpc.BareServer,
) -> list[Any]:
    """1 KiB echo against the plugin's server with its cyclic GC as is, frozen after start-up
    (``gc.freeze()``), and off; the bare sync server beside them."""
    servers: list[tuple[str, Any]] = [("plugin server", server)]
    for mode in ("freeze", "off"):
        argv = [sys.executable, str(HERE / "patched_server.py"), "[]"]
        argv += ["--fabric", fabric.name, "--exit-on-stdin-eof"]
        genv = dict(env if env is not None else os.environ, TFGRPC_EXPERIMENT_GC=mode)
        handle = ServerProcess(argv, fabric=fabric, name=f"server gc {mode}", env=genv)
        stack.callback(handle.stop)
        handle._wait_ready(30.0)
        servers.append((f"plugin server, gc {mode}", handle))
    raw_echo = grpc_settings.method("raw", "Echo")
    raw_stream = grpc_settings.method("raw", "EchoStream")
    cases = [
        lat_case(
            "unary: bare sync server",
            KiB,
            lambda: sync_unary_echo(bare_sync.target, bare_grpc.ECHO, KiB, LAT_RUN),
        )
    ]
    for name, srv in servers:
        cases.append(
            lat_case(
                f"unary: {name}",
                KiB,
                functools.partial(sync_unary_echo, srv.target, raw_echo, KiB, LAT_RUN),
            )
        )
    cases.append(
        lat_case(
            "stream: bare sync server",
            KiB,
            lambda: aio_stream_echo(bare_sync.target, bare_grpc.ECHO_STREAM, KiB, LAT_RUN),
        )
    )
    for name, srv in servers:
        cases.append(
            lat_case(
                f"stream: {name}",
                KiB,
                functools.partial(aio_stream_echo, srv.target, raw_stream, KiB, LAT_RUN),
            )
        )
    return cases


GROUPS = ("gc", "server", "latency", "chunk", "window", "fresh", "wbuf", "inflight", "compression")


def fmt(f: Figure) -> str:
    if f.kind == "latency":
        return f"{f.figure / 1e3:.1f} us"
    return f"{f.figure / 1e9:.3f} GB/s"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--fabric", default="lo")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--only", default=",".join(GROUPS), help=f"groups: {','.join(GROUPS)}")
    p.add_argument("--sizes", default="4,64", help="bandwidth sizes in MiB")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    groups = [g for g in args.only.split(",") if g]
    unknown = set(groups) - set(GROUPS)
    if unknown:
        p.error(f"unknown groups {sorted(unknown)}")
    sizes = [int(s) * MiB for s in args.sizes.split(",")]
    fabric = resolve_fabric(args.fabric)
    env = tuning.apply_policy("tuned")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    figures: list[Figure] = []
    load = {"start": os.getloadavg()}
    with ExitStack() as stack:
        server = start_server(fabric, env, [])
        stack.callback(server.stop)
        for group in groups:
            if group == "latency":
                bare_sync = stack.enter_context(
                    bare_grpc.BareServer(fabric.address, "sync", env=env)
                )
                bare_aio = stack.enter_context(bare_grpc.BareServer(fabric.address, "aio", env=env))
                cases = group_latency(server, bare_sync, bare_aio)
            elif group == "gc":
                bare_sync = stack.enter_context(
                    bare_grpc.BareServer(fabric.address, "sync", env=env)
                )
                cases = group_gc(stack, fabric, env, server, bare_sync)
            elif group == "server":
                bare_sync = stack.enter_context(
                    bare_grpc.BareServer(fabric.address, "sync", env=env)
                )
                cases = group_server(stack, fabric, env, server, bare_sync)
            elif group == "chunk":
                cases = group_chunk(server, sizes)
            elif group == "window":
                cases = group_window(stack, fabric, env, sizes)
            elif group == "fresh":
                cases = group_fresh(stack, fabric, env, sizes)
            elif group == "wbuf":
                cases = group_wbuf(stack, fabric, env, sizes)
            elif group == "inflight":
                cases = group_inflight(server, sizes)
            else:
                cases = group_compression(server)
            got = run_cases(group, cases, args.rounds, log)
            figures += got
            load[group] = os.getloadavg()
            for f in got:
                log(f"  {f.group} {f.size} {f.variant}: {fmt(f)}")
    print(f"fabric {fabric.name}, {args.rounds} rounds, load averages {load}")
    head = f"{'group':<12} {'size':>6}  {'variant':<50} {'median':>11}  rounds"
    print(head)
    print("-" * len(head))
    for f in figures:
        rounds = ", ".join(
            f"{r / 1e3:.0f}" if f.kind == "latency" else f"{r / 1e9:.2f}" for r in f.rounds
        )
        label = f"{f.size // MiB}MiB" if f.size >= MiB else f"{f.size // KiB}KiB"
        print(f"{f.group:<12} {label:>6}  {f.variant:<50} {fmt(f):>11}  {rounds}")
    if args.json is not None:
        args.json.write_text(
            json.dumps({"load": load, "figures": [asdict(f) for f in figures]}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
