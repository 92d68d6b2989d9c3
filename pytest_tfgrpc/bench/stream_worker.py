"""One stream of a Python-engine ``p2p_bandwidth(..., streams=N)``, in a process of its own.

Run by :mod:`.streams` as ``python -m pytest_tfgrpc.bench.stream_worker ...``: it connects,
warms up, writes ``R`` and its connections' ends on stdout and waits for ``G`` on stdin (so all
streams start their measured phase together), measures, writes ``S`` and waits for ``G`` again
(its connections open while the parent reads their telemetry), and writes its samples in the
native client's binary form (:func:`pytest_tfgrpc.native.client.encode_run`; ``start_ns`` is
this host's monotonic clock, which every process shares). Errors go to stderr with exit status
3.
"""

from __future__ import annotations

import argparse
import sys
import time

import grpc
import numpy as np

from pytest_tfgrpc.bench import p2p
from pytest_tfgrpc.bench.timing import RunSpec, Samples
from pytest_tfgrpc.native.client import NativeRun, StreamSamples, encode_run
from pytest_tfgrpc.results import CpuTime, process_cpu_ns
from pytest_tfgrpc.wire.client import BenchmarkError, connect
from pytest_tfgrpc.wire.fabric import Fabric, resolve_fabric
from pytest_tfgrpc.wire.security import files_from_env, load_tls, use_tls
from pytest_tfgrpc.wire.telemetry import own_connections, split_target
from pytest_tfgrpc.wire.tensors import Tensor


class _Target:
    """The server as :class:`~pytest_tfgrpc.wire.client.Server` sees it; its death is the
    parent's to report."""

    def __init__(self, target: str, fabric: Fabric) -> None:
        self.target = target
        self.fabric = fabric

    def died(self, grace: float = 0.5) -> BaseException | None:
        return None


class _StartTogether:
    """The measured phase's start waits for the parent's go, telling it the ends of this
    process's connections to the server (``R local>peer ...`` and a newline: the parent reads
    their telemetry); its end says so (``S``) and waits for the parent's go again, with the
    connections still open. Its CPU time is read around it."""

    def __init__(self, port: int) -> None:
        self.start_ns = 0
        self.cpu: dict[str, CpuTime] = {}
        self._cpu0 = (0, 0)
        self._port = port

    def start(self) -> None:
        ends = " ".join(f"{local}>{peer}" for local, peer in own_connections(self._port))
        sys.stdout.buffer.write(f"R {ends}\n".encode())
        sys.stdout.buffer.flush()
        if sys.stdin.buffer.read(1) != b"G":
            raise BenchmarkError("the parent went away before the measured phase")
        self._cpu0 = process_cpu_ns()
        self.start_ns = time.perf_counter_ns()

    def stop(self) -> None:
        user, system = process_cpu_ns()
        self.cpu = {"client": CpuTime(user - self._cpu0[0], system - self._cpu0[1])}
        sys.stdout.buffer.write(b"S")
        sys.stdout.buffer.flush()
        if sys.stdin.buffer.read(1) != b"G":
            raise BenchmarkError("the parent went away after the measured phase")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pytest_tfgrpc.bench.stream_worker")
    parser.add_argument("--target", required=True)
    parser.add_argument("--fabric", required=True)
    parser.add_argument("--mode", required=True)
    parser.add_argument("--rpc", required=True)
    parser.add_argument("--direction", required=True)
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--chunk-bytes", type=int, required=True)
    parser.add_argument("--iterations", type=int, required=True)
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--max-seconds", type=float, required=True)
    parser.add_argument("--warmup-seconds", type=float, required=True)
    args = parser.parse_args(argv)
    use_tls(load_tls(files_from_env(), "$TFGRPC_TLS_"))  # the driver's setting (streams.py)
    server = _Target(args.target, resolve_fabric(args.fabric))
    run = RunSpec(args.iterations, args.warmup, args.max_seconds, args.warmup_seconds)
    tensor = Tensor.random(args.size)
    phase = _StartTogether(split_target(args.target)[1])
    samples: Samples
    timeout = p2p.deadline(server, run, tensor.wire_bytes(args.mode)).seconds
    mode, chunk_bytes = args.mode, args.chunk_bytes
    try:
        if args.rpc == "unary" or args.direction == "pull":
            with connect(server.target) as channel:
                if args.direction == "pull":
                    samples, elapsed = p2p._pull(
                        channel, tensor, mode, args.rpc, run, chunk_bytes, phase, timeout
                    )
                else:
                    samples, elapsed = p2p._push_unary(channel, tensor, mode, run, phase, timeout)
        else:
            with p2p._Channels(server) as channels:
                samples, elapsed = channels.run(
                    p2p._push_stream(channels, tensor, mode, run, chunk_bytes, phase, timeout)
                )
    except (grpc.RpcError, BenchmarkError) as exc:
        print(f"stream worker: {exc}", file=sys.stderr)
        return 3
    one = StreamSamples(np.asarray(samples, dtype=np.int64), elapsed, phase.start_ns)
    measured = NativeRun(tensor.nbytes, tensor.wire_bytes(args.mode), elapsed, phase.cpu, (one,))
    sys.stdout.buffer.write(encode_run(measured))
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
