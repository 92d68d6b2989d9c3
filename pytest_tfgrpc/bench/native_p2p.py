"""The point-to-point benchmarks measured by the native (C++) client.

Same benchmarks, calls and result as :mod:`.p2p` (``engine="grpcio"``): the Python side takes
the same checked call options, starts ``tfgrpc-native-client`` once per message size with them,
and reads every sample into :meth:`~pytest_tfgrpc.results.SizeResult.from_samples`, so
statistics, budgets, the baseline gate and JUnit treat both engines alike. The server may be
either engine's: the client only speaks the wire protocol.

The native client sends each tensor from its own buffer (no copy per message, as
TensorFlow's zero-copy send path): in protobuf mode the TensorProto header is encoded per
message and the content follows it as a second slice of the same gRPC message.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from types import MappingProxyType

from pytest_tfgrpc.bench.p2p import (
    BandwidthCall,
    LatencyCall,
    Message,
    Transfer,
    _check_messages,
    _name,
    deadline,
    p2p_result,
)
from pytest_tfgrpc.bench.settings import run_settings
from pytest_tfgrpc.bench.telemetry import TransportProbe, explained, probe_for, server_cores
from pytest_tfgrpc.bench.timing import RunSpec
from pytest_tfgrpc.native import binaries
from pytest_tfgrpc.native.client import (
    ClientPause,
    ClientSettings,
    NativeClientError,
    NativeRun,
    Pause,
    run_client,
)
from pytest_tfgrpc.results import BenchmarkResult, SizeResult
from pytest_tfgrpc.turns import take_turn
from pytest_tfgrpc.wire import codec
from pytest_tfgrpc.wire.client import RAISE_HINT, BenchmarkError, Server
from pytest_tfgrpc.wire.schemes import Payload
from pytest_tfgrpc.wire.security import child_env

ENGINE = "native"


def tensor_of(message: Message) -> tuple[int, str, int, int]:
    """(content bytes, dtype, raw wire bytes, protobuf wire bytes) of a message, as
    :meth:`~pytest_tfgrpc.wire.tensors.Tensor.random` and payload tensors make them."""
    nbytes = message.total_bytes if isinstance(message, Payload) else message
    dtype = "float32" if not isinstance(message, Payload) and nbytes % 4 == 0 else "uint8"
    elements = nbytes // 4 if dtype == "float32" else nbytes
    header = codec.encode_header(dtype, (elements,), nbytes)
    return nbytes, dtype, nbytes, len(header) + nbytes


def run_native(
    server: Server,
    message: Message,
    call: Transfer,
    streams: int = 1,
    telemetry: TransportProbe | None = None,
) -> NativeRun:
    """One client run of one message (an echo for a latency call, a push or a pull for a
    bandwidth call) over ``streams`` connections; failures say what failed (or that the
    server died), and what the transport saw meanwhile. ``telemetry`` reads the run's
    connections when its measured phase starts and ends (the client waits meanwhile), and
    the client's run-queue wait."""
    mode, rpc, run = call.mode, call.rpc, call.run
    benchmark = "bandwidth" if isinstance(call, BandwidthCall) else "latency"
    nbytes, dtype, raw_wire, protobuf_wire = tensor_of(message)
    wire = raw_wire if mode == "raw" else protobuf_wire
    # The Python engine's rule, per call or per stream (a stream stays open for the run,
    # which the run's own bound covers): an echo carries the tensor both ways.
    bound = deadline(server, run, wire * (2 if benchmark == "latency" else 1))
    settings = ClientSettings(
        target=server.target,
        benchmark=benchmark,
        mode=mode,
        rpc=rpc,
        size=nbytes,
        dtype=dtype,
        iterations=run.iterations,
        warmup=run.warmup,
        max_seconds=run.time_limit_s,
        warmup_seconds=run.warmup_seconds,
        deadline_s=bound.seconds,
        streams=streams,
    )
    if isinstance(call, BandwidthCall):  # an echo keeps the client's defaults
        settings = replace(settings, direction=call.direction, chunk_bytes=call.chunk_bytes)
    pause = _reading(telemetry) if telemetry is not None else None
    try:
        measured = run_client(settings, env=child_env(), pause=pause)  # the run's TLS setting
    except NativeClientError as error:
        death = server.died()
        if death is not None:
            raise death from error
        seen = telemetry.last_seen() if telemetry is not None else ""
        # What the deadline was and how to raise it, as the Python engine says (gRPC's C++
        # library says only "Deadline Exceeded").
        told = str(error).replace(
            "DEADLINE_EXCEEDED: Deadline Exceeded",
            f"DEADLINE_EXCEEDED: the deadline was {bound.describe()}; {RAISE_HINT}",
        )
        raise BenchmarkError(
            f"native client, {rpc} {benchmark} of {nbytes} B: {told}"
            + (f" (transport: {seen})" if seen else "")
        ) from None
    if measured.wire_bytes != wire or measured.size_bytes != nbytes:
        raise BenchmarkError(
            f"the native client sent {measured.size_bytes} B as {measured.wire_bytes} B on the "
            f"wire; the Python codec makes {nbytes} B into {wire} B"
        )
    return measured


def _reading(probe: TransportProbe) -> Pause:
    """The client's pause hook: ``probe``'s window opens when the measured phase starts
    (on the connections the client reports then) and closes when it ends; the client side's
    run-queue wait at each is the one the client read itself."""

    def pause(told: ClientPause) -> None:
        probe.reported("client", told.run_queue_wait_ns, read_ns=told.read_ns)
        if told.phase == "start":
            probe.told(told.ends)
            probe.start()
        else:
            probe.stop()

    return pause


def run_probed(
    server: Server, message: Message, call: Transfer, streams: int = 1
) -> tuple[NativeRun, TransportProbe]:
    """:func:`run_native` with a probe of the run's connections (all ``streams`` of them),
    looked up by the ends the client reports: no connection is there before it runs."""
    with probe_for(server, clients=lambda port: ()) as probe:
        return run_native(server, message, call, streams, telemetry=probe), probe


def size_result(message: Message, mode: str, measured: NativeRun, stream: int = 0) -> SizeResult:
    """One stream's samples of a run as a :class:`SizeResult` (CPU of the whole run)."""
    payload = message if isinstance(message, Payload) else None
    one = measured.streams[stream]
    return SizeResult.from_samples(
        measured.size_bytes,
        measured.wire_bytes,
        one.samples_ns,
        one.elapsed_ns,
        payload=payload.description if payload else "",
        buffers=payload.sizes if payload else (),
        cpu=measured.cpu,
    )


def native_settings(run: RunSpec, **extra: str) -> MappingProxyType[str, str]:
    """The recorded settings of a native run: the run's (:func:`run_settings`) with
    ``engine=native`` and the C++ client's gRPC version as ``grpc_cpp``."""
    return run_settings(run, engine=ENGINE, grpc_cpp=binaries().grpc_version, **extra)


def _measure_each(server: Server, sizes: Sequence[Message], call: Transfer) -> BenchmarkResult:
    """Every message of ``sizes`` in a client run of its own, into ``call``'s result."""
    checked = _check_messages(sizes)
    binaries()  # not built: say so before anything runs
    results = []
    cores = server_cores(server)  # the client inherits this process's CPUs
    for index, message in enumerate(checked, 1):
        if call.progress is not None:
            call.progress(index, len(checked), _name(message))
        take_turn()  # lockstep with another run (tfgrpc-ab --interleave rounds)
        measured, probe = run_probed(server, message, call)
        point = size_result(message, call.mode, measured)
        wire = measured.wire_bytes * (2 if isinstance(call, LatencyCall) else 1)
        results.append(
            explained(point, probe.transport(), cores=cores, op_bytes=wire, cpu_wait=probe.cpu_wait)
        )
    settings = native_settings(call.run, **call.extra_settings())
    return p2p_result(call, server, results, settings)


def p2p_latency(server: Server, sizes: Sequence[Message], call: LatencyCall) -> BenchmarkResult:
    """Echo round-trip time of each size, measured by the native client (see
    :func:`pytest_tfgrpc.bench.p2p.p2p_latency`)."""
    return _measure_each(server, sizes, call)


def p2p_bandwidth(server: Server, sizes: Sequence[Message], call: BandwidthCall) -> BenchmarkResult:
    """Tensors moved per second for each size, measured by the native client (see
    :func:`pytest_tfgrpc.bench.p2p.p2p_bandwidth`)."""
    call.check_sizes(sizes)
    return _measure_each(server, sizes, call)
