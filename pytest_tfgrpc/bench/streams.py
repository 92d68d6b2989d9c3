"""``p2p_bandwidth(..., streams=N)``: N concurrent connections, aggregate and per stream.

As OSU's multi-pair bandwidth and ``iperf -P``: every stream has its own connection (the
native client gives each its own channel with a local subchannel pool and distinct channel
arguments; the Python engine runs each in its own process), all warm up, then their measured
phases start together.

The aggregate of one size is a :class:`~pytest_tfgrpc.results.SizeResult` whose samples are
the gaps between consecutive tensor completions on any stream, from the common start (each
stream's completions are its start plus the running sum of its back-to-back samples). Their
count is every tensor moved and their sum the wall time from the common start to the last
completion, so its ``throughput`` is the aggregate rate in bytes/s. Each stream is also a
result of its own, labelled ``<label>_stream<i>``.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pytest_tfgrpc.bench.cpu import CpuProbe
from pytest_tfgrpc.bench.native_p2p import native_settings, run_probed, size_result
from pytest_tfgrpc.bench.p2p import BandwidthCall, Message, _check_messages, p2p_result
from pytest_tfgrpc.bench.settings import run_settings
from pytest_tfgrpc.bench.telemetry import TransportProbe, explained, probe_for, server_cores
from pytest_tfgrpc.bench.timing import Samples
from pytest_tfgrpc.metrics import stream_label
from pytest_tfgrpc.native.client import NativeRun, StreamSamples, decode_run
from pytest_tfgrpc.results import BenchmarkResult, CpuTime, SizeResult
from pytest_tfgrpc.turns import take_turn
from pytest_tfgrpc.wire.client import BenchmarkError, Server
from pytest_tfgrpc.wire.schemes import Payload
from pytest_tfgrpc.wire.security import child_env

#: No more streams than this from one call: each is a connection (and a process for grpcio).
MAX_STREAMS = 64


@dataclass(frozen=True, eq=False)
class StreamsResult:
    """What ``p2p_bandwidth(..., streams=N)`` measured: the aggregate and each stream."""

    aggregate: BenchmarkResult
    streams: tuple[BenchmarkResult, ...]


def aggregate_samples(streams: Sequence[StreamSamples]) -> Samples:
    """The gaps (ns) between consecutive completions on any stream, from the common start."""
    ends = [s.start_ns + np.cumsum(s.samples_ns) for s in streams if len(s.samples_ns)]
    if not ends:
        return np.empty(0, dtype=np.int64)
    merged = np.sort(np.concatenate(ends))
    start = min(s.start_ns for s in streams)
    return np.diff(merged, prepend=start).astype(np.int64)


def check_streams(streams: object) -> int:
    """``streams`` as a count, or a ValueError that names it."""
    if not isinstance(streams, int) or isinstance(streams, bool) or not 1 <= streams <= MAX_STREAMS:
        raise ValueError(
            f"streams={streams!r}: a whole number of connections from 1 to {MAX_STREAMS}"
        )
    return streams


def _python_streams(
    server: Server, size: int, call: BandwidthCall, streams: int, telemetry: TransportProbe
) -> NativeRun:
    """N worker processes of :mod:`.stream_worker`, started together; their samples joined.
    ``telemetry`` reads their connections (by the ends each reports when it is ready) when
    their measured phases start and once all have ended, with the workers' run-queue wait as
    the client's."""
    mode, rpc, direction, run = call.mode, call.rpc, call.direction, call.run
    chunk_bytes = call.chunk_bytes
    argv = [sys.executable, "-m", "pytest_tfgrpc.bench.stream_worker"]
    argv += ["--target", server.target, "--fabric", server.fabric.name, "--mode", mode]
    argv += ["--rpc", rpc, "--direction", direction, "--size", str(size)]
    argv += ["--chunk-bytes", str(chunk_bytes), "--iterations", str(run.iterations)]
    argv += ["--warmup", str(run.warmup), "--max-seconds", repr(run.time_limit_s)]
    argv += ["--warmup-seconds", repr(run.warmup_seconds)]
    timeout = 60.0 + run.warmup_seconds + run.time_limit_s + size / 10e6
    env = child_env()  # the streams connect as the driver does, under its TLS setting
    workers = [
        subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        for _ in range(streams)
    ]
    try:
        with CpuProbe(server.target) as probe:
            ends: list[tuple[str, str]] = []
            for worker in workers:
                assert worker.stdout is not None
                said = worker.stdout.readline()
                if not said.startswith(b"R"):
                    _, err = worker.communicate(timeout=timeout)
                    raise BenchmarkError(err.decode("utf-8", "replace").strip() or "no message")
                for end in said[1:].decode().split():
                    local, _, peer = end.partition(">")
                    ends.append((local, peer))
            telemetry.watch("client", [worker.pid for worker in workers], ends)
            telemetry.start()
            probe.start()
            _tell(workers)
            # Every stream's measured phase has ended when it says S; its connection stays
            # open until it is told to go on.
            ended = [worker.stdout.read(1) == b"S" for worker in workers if worker.stdout]
            probe.stop()
            if all(ended):
                telemetry.stop()
            _tell(workers)
            outputs = [worker.communicate(timeout=timeout) for worker in workers]
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    runs = []
    for worker, (out, err) in zip(workers, outputs, strict=True):
        if worker.returncode != 0:
            raise BenchmarkError(err.decode("utf-8", "replace").strip() or "no message")
        runs.append(decode_run(out))
    first = min(r.streams[0].start_ns for r in runs)
    last = max(r.streams[0].start_ns + r.streams[0].elapsed_ns for r in runs)
    none = CpuTime(0, 0)
    clients = [r.cpu.get("client", none) for r in runs]
    cpu = {
        "client": CpuTime(sum(c.user_ns for c in clients), sum(c.system_ns for c in clients)),
        "server": (probe.usage or {}).get("server", none),
    }
    joined = tuple(
        StreamSamples(
            r.streams[0].samples_ns, r.streams[0].elapsed_ns, r.streams[0].start_ns - first
        )
        for r in runs
    )
    return NativeRun(runs[0].size_bytes, runs[0].wire_bytes, last - first, cpu, joined)


def _tell(workers: Sequence[subprocess.Popen[bytes]]) -> None:
    """Tell every worker still running to go on (``G``)."""
    for worker in workers:
        if worker.poll() is None and worker.stdin is not None:
            try:
                worker.stdin.write(b"G")
                worker.stdin.flush()
            except BrokenPipeError:
                continue  # it ended meanwhile: its exit status says why


def p2p_bandwidth_streams(
    server: Server,
    sizes: Sequence[Message],
    call: BandwidthCall,
    *,
    streams: int,
    engine: str = "grpcio",
) -> StreamsResult:
    """Bandwidth of ``streams`` concurrent connections of ``engine``'s client (``grpcio`` or
    ``native``) per size, with ``call``'s options: the aggregate, labelled as the call, and
    each stream.

    Raises ValueError for bad arguments (payload schemes are not split over streams),
    :class:`~pytest_tfgrpc.wire.client.BenchmarkError` when a stream fails.
    """
    check_streams(streams)
    call.check_sizes(sizes)
    checked = _check_messages(sizes)
    if any(isinstance(message, Payload) for message in checked):
        raise ValueError("streams=N measures plain tensor sizes; payload schemes use streams=1")
    label = call.label or call.benchmark
    mode, run, progress = call.mode, call.run, call.progress
    aggregate: list[SizeResult] = []
    per_stream: list[list[SizeResult]] = [[] for _ in range(streams)]
    for index, message in enumerate(checked, 1):
        assert isinstance(message, int)
        if progress is not None:
            progress(index, len(checked), f"{message} B x {streams} streams")
        take_turn()  # lockstep with another run (tfgrpc-ab --interleave rounds)
        if engine == "native":
            measured, probe = run_probed(server, message, call, streams)
        else:
            with probe_for(server, clients=lambda port: ()) as probe:
                measured = _python_streams(server, message, call, streams, probe)
        merged = aggregate_samples(measured.streams)
        point = SizeResult.from_samples(
            measured.size_bytes, measured.wire_bytes, merged, measured.wall_ns, cpu=measured.cpu
        )
        if probe.windows:  # the clients' connections, all streams together
            point = explained(
                point,
                probe.transport(),
                cores=server_cores(server),
                op_bytes=measured.wire_bytes,
                cpu_wait=probe.cpu_wait,
            )
        aggregate.append(point)
        for i in range(streams):
            per_stream[i].append(size_result(message, mode, measured, i))
    extra = call.extra_settings() | {"streams": str(streams)}
    settings = native_settings(run, **extra) if engine == "native" else run_settings(run, **extra)

    return StreamsResult(
        p2p_result(call, server, aggregate, {**settings, "aggregate": "yes"}),
        tuple(
            p2p_result(
                call, server, results, {**settings, "stream": str(i)}, stream_label(label, i)
            )
            for i, results in enumerate(per_stream)
        ),
    )
