"""Point-to-point benchmarks, as TF-gRPC-Bench defines them.

* :func:`p2p_latency`: the server echoes the tensor back; one sample is one round trip.
* :func:`p2p_bandwidth`: the worker pushes a tensor and the server only acknowledges it
  (or, ``direction="pull"``, the worker fetches a tensor as TensorFlow's RecvTensor does);
  one sample is one tensor moved, from its first byte sent to its acknowledgement.

Both run over one RPC shape: ``rpc="unary"`` (one call per tensor, as TensorFlow's
RecvTensor) or ``rpc="stream"`` (one long-lived stream; large tensors travel in slices of
``chunk_bytes``). In ``mode="protobuf"`` every message is encoded and decoded as a
TensorProto inside the timed region; in ``mode="raw"`` tensor bytes travel as they are.

A call's options are one checked value, a :class:`LatencyCall` or a :class:`BandwidthCall`
(both :class:`Transfer`), which every P2P client takes: these loops, the native client
(:mod:`.native_p2p`), parallel streams (:mod:`.streams`) and the engines.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar

import grpc
import numpy as np

from pytest_tfgrpc.bench.cpu import CpuProbe
from pytest_tfgrpc.bench.partial import keeping_partial
from pytest_tfgrpc.bench.settings import run_settings
from pytest_tfgrpc.bench.telemetry import TransportProbe, explained, probe_for, server_cores
from pytest_tfgrpc.bench.timing import Phase, RunSpec, Samples, measure, measure_async
from pytest_tfgrpc.metrics import P2P_BANDWIDTH, P2P_LATENCY
from pytest_tfgrpc.results import BenchmarkResult, CpuTime, SizeResult
from pytest_tfgrpc.turns import take_turn
from pytest_tfgrpc.units import size_label
from pytest_tfgrpc.wire import codec, grpc_settings
from pytest_tfgrpc.wire.client import (
    BenchmarkError,
    Deadline,
    Server,
    call_deadline,
    connect,
    connect_aio,
    explain,
    run_async,
)
from pytest_tfgrpc.wire.schemes import Payload, payload_message
from pytest_tfgrpc.wire.telemetry import own_connections
from pytest_tfgrpc.wire.tensors import Tensor

_T = TypeVar("_T")

RPCS = ("unary", "stream")
DIRECTIONS = ("push", "pull")

#: Ten rounds: Google Benchmark's U test wants at least 9 repetitions.
LATENCY_RUN = RunSpec(iterations=1000, warmup=50, max_seconds=5.0, warmup_seconds=1.0, rounds=10)
BANDWIDTH_RUN = RunSpec(iterations=50, warmup=3, max_seconds=5.0, warmup_seconds=2.0, rounds=10)


def _check_choice(name: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r}: expected one of {', '.join(choices)}")


Message = int | Payload


def _check_messages(messages: Sequence[Message]) -> tuple[Message, ...]:
    if not messages:
        raise ValueError("no message sizes to measure")
    for message in messages:
        if isinstance(message, Payload):
            continue
        if not isinstance(message, int) or isinstance(message, bool) or message < 0:
            raise ValueError(f"message size {message!r} is not a whole number of bytes")
        if message > grpc_settings.MAX_TENSOR_BYTES:
            raise ValueError(grpc_settings.too_large(message))
    return tuple(messages)


#: Told before each message size is measured: (index from 1, count, size or payload name).
Progress = Callable[[int, int, str], None]


@dataclass(frozen=True, kw_only=True)
class Transfer(ABC):
    """The options of one point-to-point call, checked when made: how its tensors travel
    (``mode``: ``raw`` or ``protobuf``; ``rpc``: ``unary`` or ``stream``), the bounds of its
    loop (``run``), its result's name (``label``; None: the benchmark's) and what is told
    before each message is measured (``progress``). Its kinds, :class:`LatencyCall` and
    :class:`BandwidthCall`, carry their benchmark's defaults.

    :raises ValueError: a value that is not one of its choices, naming the argument
        (``rpc='bidi': expected one of unary, stream``).
    """

    #: The benchmark a call of this kind runs, as its result names it.
    benchmark: ClassVar[str]
    mode: str = "raw"
    rpc: str
    run: RunSpec
    label: str | None = None
    progress: Progress | None = None

    def __post_init__(self) -> None:
        _check_choice("mode", self.mode, grpc_settings.MODES)
        _check_choice("rpc", self.rpc, RPCS)
        if not isinstance(self.run, RunSpec):
            raise ValueError(f"run={self.run!r}: expected a RunSpec (bench.timing)")

    @abstractmethod
    def extra_settings(self) -> dict[str, str]:
        """What a result of this call records beside its run's settings: the gRPC method
        (and, for bandwidth, the direction and a stream's slice size)."""


@dataclass(frozen=True, kw_only=True)
class LatencyCall(Transfer):
    """The options of :func:`p2p_latency`: one echo per sample, one call per tensor unless
    ``rpc="stream"``."""

    benchmark: ClassVar[str] = P2P_LATENCY
    rpc: str = "unary"
    run: RunSpec = LATENCY_RUN

    def extra_settings(self) -> dict[str, str]:
        method = "Echo" if self.rpc == "unary" else "EchoStream"
        return {"method": grpc_settings.method(self.mode, method)}


@dataclass(frozen=True, kw_only=True)
class BandwidthCall(Transfer):
    """The options of :func:`p2p_bandwidth`: which way tensors move (``direction``: ``push``
    or ``pull``) and a stream's slice size in bytes (``chunk_bytes``, at least 64), one
    long-lived stream unless ``rpc="unary"``."""

    benchmark: ClassVar[str] = P2P_BANDWIDTH
    rpc: str = "stream"
    run: RunSpec = BANDWIDTH_RUN
    direction: str = "push"
    chunk_bytes: int = grpc_settings.DEFAULT_CHUNK_BYTES

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_choice("direction", self.direction, DIRECTIONS)
        chunk = self.chunk_bytes
        if isinstance(chunk, bool) or not isinstance(chunk, int):
            raise ValueError(f"chunk_bytes={chunk!r}: expected a whole number of bytes")
        if not 64 <= chunk <= grpc_settings.MAX_TENSOR_BYTES:
            raise ValueError(
                f"chunk_bytes={chunk}: slices must be at least 64 bytes and at most "
                f"{grpc_settings.MAX_TENSOR_BYTES} (one gRPC message)"
            )

    def extra_settings(self) -> dict[str, str]:
        names = {("push", "unary"): "Push", ("push", "stream"): "PushStream"}
        names |= {("pull", "unary"): "Pull", ("pull", "stream"): "PullStream"}
        method = grpc_settings.method(self.mode, names[self.direction, self.rpc])
        extra = {"direction": self.direction, "method": method}
        if self.rpc == "stream":
            extra["chunk_bytes"] = str(self.chunk_bytes)
        return extra

    def check_sizes(self, sizes: Sequence[Message]) -> None:
        """Refuse payload schemes for a pull: it fetches tensors by size."""
        if self.direction == "pull" and any(isinstance(message, Payload) for message in sizes):
            raise ValueError("a pull fetches tensors by size; payload schemes are pushed")


def _name(message: Message) -> str:
    return message.description if isinstance(message, Payload) else size_label(message)


def _tensor(message: Message) -> Tensor:
    if isinstance(message, Payload):
        # TF-gRPC-Bench sends a payload's iovec buffers as one message.
        return Tensor(payload_message(message), "uint8", (message.total_bytes,))
    return Tensor.random(message)


def _size_result(
    message: Message,
    tensor: Tensor,
    mode: str,
    samples: Samples,
    elapsed: int,
    cpu: Mapping[str, CpuTime] | None,
    rounds: tuple[int, ...] = (),
) -> SizeResult:
    payload = message if isinstance(message, Payload) else None
    return SizeResult.from_samples(
        tensor.nbytes,
        tensor.wire_bytes(mode),
        samples,
        elapsed,
        payload=payload.description if payload else "",
        buffers=payload.sizes if payload else (),
        cpu=cpu,
        rounds=rounds if len(rounds) > 1 else (),
    )


def _slices(message: bytes, chunk_bytes: int) -> list[bytes]:
    view = memoryview(message)
    return [view[i : i + chunk_bytes].tobytes() for i in range(0, max(len(view), 1), chunk_bytes)]


def _verify_echo(tensor: Tensor, mode: str, reply: bytes) -> None:
    content = codec.decode_tensor(reply).content if mode == "protobuf" else memoryview(reply)
    if content != memoryview(tensor.content):
        raise BenchmarkError(
            f"the echo of a {tensor.nbytes} B tensor came back different ({len(content)} B)"
        )


@contextlib.asynccontextmanager
async def _stream(
    channel: grpc.aio.Channel,
    method: str,
    timeout: float,
    metadata: tuple[tuple[str, str], ...] = (),
) -> AsyncIterator[Any]:
    """A bidirectional stream call on ``channel``; on the way out (not after a failure) the
    stream is half-closed and its end awaited, so no task of it outlives the loop."""
    stream = channel.stream_stream(method)(timeout=timeout, metadata=metadata or None)
    yield stream
    await stream.done_writing()
    await stream.code()


def p2p_result(
    call: Transfer,
    server: Server,
    sizes: Sequence[SizeResult],
    settings: Mapping[str, str],
    label: str | None = None,
) -> BenchmarkResult:
    """The result of ``call`` against ``server`` (any engine's), in the one result family,
    labelled ``label`` (default: the call's label, else its benchmark's name); ``settings``
    are :func:`~pytest_tfgrpc.bench.settings.run_settings`'."""
    return BenchmarkResult(
        benchmark=call.benchmark,
        label=label or call.label or call.benchmark,
        fabric=server.fabric.name,
        target=server.target,
        mode=call.mode,
        rpc=call.rpc,
        sizes=tuple(sizes),
        settings=MappingProxyType(dict(settings)),
    )


class _Channels:
    """One connected channel per tensor, opened at its first round and kept for the others
    (a reconnect per round would time connection setup into the rounds' warm-up and open a
    connection that telemetry must find anew), an asyncio one for the stream rounds
    (:meth:`aio`), and one event loop for them (:meth:`run`); all closed on the way out.
    Channels are opened by :func:`~pytest_tfgrpc.wire.client.connect` (``connect_aio``),
    under the process's TLS setting, and report ``server``'s death while connecting."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self._open: dict[int, grpc.Channel] = {}
        self._aio: dict[int, grpc.aio.Channel] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    async def aio(self, tensor: Tensor) -> grpc.aio.Channel:
        """``tensor``'s asyncio channel, on the loop of :meth:`run`."""
        channel = self._aio.get(id(tensor))
        if channel is None:
            channel = await connect_aio(self.server.target, server=self.server)
            self._aio[id(tensor)] = channel
        return channel

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run a round's coroutine on the call's one event loop."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return run_async(coro, self._loop)

    def get(self, tensor: Tensor) -> grpc.Channel:
        channel = self._open.get(id(tensor))
        if channel is None:
            channel = self._open[id(tensor)] = connect(self.server.target, server=self.server)
        return channel

    def __enter__(self) -> _Channels:
        return self

    def __exit__(self, *exc: object) -> None:
        while self._open:
            self._open.popitem()[1].close()
        if self._loop is not None:
            while self._aio:
                self._loop.run_until_complete(self._aio.popitem()[1].close())
            self._loop.close()
            self._loop = None


def deadline(server: Server, run: RunSpec, nbytes: int) -> Deadline:
    """The deadline of every call (or stream) of ``run`` moving ``nbytes`` with ``server``:
    the run's own bound (warm-up and measured time) and the fabric's speed where known.
    ``run`` is the whole call's spec, not one round's: a call may take as long as the run may."""
    bound = run.warmup_seconds + run.time_limit_s
    return call_deadline(nbytes, bound_s=bound, speed_mbps=server.fabric.speed_mbps)


def _wire(tensor: Tensor, mode: str, what: str) -> int:
    """Bytes one operation of ``what`` moves: an echo carries the tensor both ways."""
    return tensor.wire_bytes(mode) * (2 if "echo" in what else 1)


# --- latency -------------------------------------------------------------------------------
def _latency_unary(
    channel: grpc.Channel, tensor: Tensor, mode: str, run: RunSpec, probe: Phase, timeout: float
) -> tuple[Samples, int]:
    call = channel.unary_unary(grpc_settings.method(mode, "Echo"))
    if mode == "raw":
        message = tensor.content
        _verify_echo(tensor, mode, call(message, timeout=timeout))

        def op() -> object:
            return call(message, timeout=timeout)

    else:
        content, dtype, shape = tensor.content, tensor.dtype, tensor.shape
        encode, decode = codec.encode_tensor, codec.decode_tensor
        _verify_echo(tensor, mode, call(encode(content, dtype, shape), timeout=timeout))

        def op() -> object:
            return decode(call(encode(content, dtype, shape), timeout=timeout))

    return measure(op, run, probe)


async def _latency_stream(
    channels: _Channels, tensor: Tensor, mode: str, run: RunSpec, probe: Phase, timeout: float
) -> tuple[Samples, int]:
    channel = await channels.aio(tensor)
    async with _stream(channel, grpc_settings.method(mode, "EchoStream"), timeout) as stream:
        write, read = stream.write, stream.read
        content, dtype, shape = tensor.content, tensor.dtype, tensor.shape
        if mode == "raw":
            await write(content)
            _verify_echo(tensor, mode, await read())

            async def op() -> object:
                await write(content)
                return await read()

        else:
            encode, decode = codec.encode_tensor, codec.decode_tensor
            await write(encode(content, dtype, shape))
            _verify_echo(tensor, mode, await read())

            async def op() -> object:
                await write(encode(content, dtype, shape))
                return decode(await read())

        return await measure_async(op, run, probe)


#: Measures one tensor for one round: (samples, elapsed ns), telling the probe when timing
#: starts and ends; the last argument is the deadline of each call, in seconds.
MeasureOne = Callable[[Tensor, Phase, RunSpec, float], tuple[Samples, int]]


class _Sweep:
    """The samples, time and CPU time of each message, gathered over the rounds."""

    def __init__(self, messages: tuple[Message, ...], mode: str) -> None:
        self.messages = messages
        self.mode = mode
        self.tensors = [_tensor(message) for message in messages]
        self.parts: list[list[Samples]] = [[] for _ in messages]
        self.elapsed = [0] * len(messages)
        self.cpu: list[dict[str, CpuTime]] = [{} for _ in messages]

    def add(self, index: int, samples: Samples, took: int, usage: Mapping[str, CpuTime]) -> None:
        self.parts[index].append(samples)
        self.elapsed[index] += took
        for role, used in usage.items():
            had = self.cpu[index].get(role, CpuTime(0, 0))
            self.cpu[index][role] = CpuTime(
                had.user_ns + used.user_ns, had.system_ns + used.system_ns
            )

    def results(
        self,
        telemetry: Mapping[int, TransportProbe] | None = None,
        cores: Mapping[str, int | None] | None = None,
        echo: bool = False,
    ) -> tuple[SizeResult, ...]:
        """A result per message with at least one round measured (all of them once the sweep
        is done; before a failure, those measured so far), with each message's transport
        telemetry (``telemetry``, by message index) and named limit."""
        out = []
        for index, (message, tensor, part, took, used) in enumerate(
            zip(self.messages, self.tensors, self.parts, self.elapsed, self.cpu, strict=True)
        ):
            if not part:
                continue
            point = _size_result(
                message,
                tensor,
                self.mode,
                np.concatenate(part),
                took,
                used or None,
                tuple(len(samples) for samples in part),
            )
            probe = (telemetry or {}).get(index)
            transport = probe.transport() if probe is not None else None
            waits = probe.cpu_wait if probe is not None else None
            op_bytes = _wire(tensor, self.mode, "echo" if echo else "")
            out.append(
                explained(point, transport, cores=cores or {}, op_bytes=op_bytes, cpu_wait=waits)
            )
        return tuple(out)


def _measure_each(
    server: Server,
    messages: Sequence[Message],
    call: Transfer,
    what: str,
    measure_one: MeasureOne,
) -> BenchmarkResult:
    """Measure every message in ``call.run.round_count`` rounds, each round visiting every
    message once in a new order (Google Benchmark's random interleaving, seeded), so that
    drift over the call spreads over all sizes and rounds; with the CPU time of both ends,
    into ``call``'s result. Every call's deadline comes from the whole run's bound and the
    bytes it moves. A failed call is reported as the server's death when that is what
    happened, in one line; the sizes measured before it (each with the rounds it completed)
    travel on the error (:mod:`.partial`)."""
    run, mode, progress = call.run, call.mode, call.progress
    sweep = _Sweep(_check_messages(messages), mode)
    settings = run_settings(run, **call.extra_settings())
    # Per message, the transport telemetry of its connections (read when its first round
    # starts and its last ends) and of each round's links and run-queue waits, outside the
    # CPU probe's readings so that its RPCs fall outside.
    telemetry: dict[int, TransportProbe] = {}
    cores = server_cores(server)
    echo = "echo" in what

    def build(results: tuple[SizeResult, ...]) -> BenchmarkResult:
        return p2p_result(call, server, results, settings)

    def gathered() -> tuple[SizeResult, ...]:
        # After the last round every window is closed; after a failure, those still open
        # close now: the sizes measured before it keep their telemetry.
        for probe in telemetry.values():
            probe.cut_short()
        return sweep.results(telemetry, cores, echo)

    count = len(sweep.messages)
    with contextlib.ExitStack() as stack, keeping_partial(gathered, build):
        # A probe per message, opened when the message is first measured and kept for its
        # later rounds (its CPU times are read per round).
        probes: dict[int, CpuProbe] = {}
        order = list(range(count))
        shuffle = random.Random(count).shuffle
        for round_index in range(run.round_count):
            take_turn()  # lockstep with another run (tfgrpc-ab --interleave rounds)
            spec = run.round_spec(round_index)
            for index in order:
                tensor = sweep.tensors[index]
                if progress is not None and round_index == 0:
                    progress(index + 1, count, _name(sweep.messages[index]))
                limit = deadline(server, run, _wire(tensor, mode, what))
                try:
                    if index not in probes:
                        probes[index] = stack.enter_context(CpuProbe(server.target))
                        telemetry[index] = stack.enter_context(probe_for(server, own_connections))
                    probe = probes[index]
                    last = round_index == run.round_count - 1
                    phase = telemetry[index].round(probe, first=round_index == 0, last=last)
                    samples, took = measure_one(tensor, phase, spec, limit.seconds)
                except grpc.RpcError as error:
                    seen = telemetry[index].last_seen() if index in telemetry else ""
                    raise explain(
                        error, server, f"{what} of {tensor.nbytes} B", limit, seen
                    ) from None
                sweep.add(index, samples, took, probe.usage or {})
            shuffle(order)
    return build(gathered())


def p2p_latency(server: Server, sizes: Sequence[Message], call: LatencyCall) -> BenchmarkResult:
    """Echo round-trip time of each size or payload (TF-gRPC-P2P-Latency), with ``call``'s
    options."""
    mode, rpc = call.mode, call.rpc

    with _Channels(server) as channels:

        def measure_one(
            tensor: Tensor, probe: Phase, spec: RunSpec, timeout: float
        ) -> tuple[Samples, int]:
            if rpc == "unary":
                return _latency_unary(channels.get(tensor), tensor, mode, spec, probe, timeout)
            return channels.run(_latency_stream(channels, tensor, mode, spec, probe, timeout))

        return _measure_each(server, sizes, call, f"{rpc} echo", measure_one)


# --- bandwidth -----------------------------------------------------------------------------
def _push_unary(
    channel: grpc.Channel, tensor: Tensor, mode: str, run: RunSpec, probe: Phase, timeout: float
) -> tuple[Samples, int]:
    call = channel.unary_unary(grpc_settings.method(mode, "Push"))
    content, dtype, shape = tensor.content, tensor.dtype, tensor.shape
    expected = tensor.wire_bytes(mode)
    if mode == "raw":

        def op() -> object:
            return call(content, timeout=timeout)

    else:
        encode = codec.encode_tensor

        def op() -> object:
            return call(encode(content, dtype, shape), timeout=timeout)

    acked, _ = codec.decode_ack(op())  # type: ignore[arg-type]
    if acked != expected:
        raise BenchmarkError(f"the server acknowledged {acked} B of a {expected} B push")
    return measure(op, run, probe)


async def _push_stream(
    channels: _Channels,
    tensor: Tensor,
    mode: str,
    run: RunSpec,
    chunk_bytes: int,
    probe: Phase,
    timeout: float,
) -> tuple[Samples, int]:
    protobuf = mode == "protobuf"
    wire = tensor.wire_bytes(mode)
    content, dtype, shape = tensor.content, tensor.dtype, tensor.shape
    metadata = ((grpc_settings.MESSAGE_BYTES_KEY, str(wire)),)
    channel = await channels.aio(tensor)
    async with _stream(
        channel, grpc_settings.method(mode, "PushStream"), timeout, metadata
    ) as stream:
        write, read = stream.write, stream.read
        # Slices of a tensor that already exists, made once outside the timed region, as
        # TensorFlow's send path hands gRPC the tensor's own buffer; in protobuf mode the
        # TensorProto header is encoded for every message, inside it.
        if protobuf:
            slices = codec.ChunkedTensor(content, dtype, shape, chunk_bytes).chunks
        else:
            prepared = _slices(content, chunk_bytes)

            def slices() -> list[bytes]:
                return prepared

        async def op() -> bytes:
            for piece in slices():
                await write(piece)
            reply: bytes = await read()
            return reply

        acked, _ = codec.decode_ack(await op())
        if acked != wire:
            raise BenchmarkError(f"the server acknowledged {acked} B of a {wire} B push")
        return await measure_async(op, run, probe)


def _pull(
    channel: grpc.Channel,
    tensor: Tensor,
    mode: str,
    rpc: str,
    run: RunSpec,
    chunk_bytes: int,
    probe: Phase,
    timeout: float,
) -> tuple[Samples, int]:
    request = codec.encode_pull_request(tensor.nbytes, tensor.dtype, chunk_bytes)
    protobuf = mode == "protobuf"
    if rpc == "unary":
        call = channel.unary_unary(grpc_settings.method(mode, "Pull"))

        def op() -> int:
            reply: bytes = call(request, timeout=timeout)
            if protobuf:
                return len(codec.decode_tensor(reply).content)
            return len(reply)

    else:
        stream_call = channel.unary_stream(grpc_settings.method(mode, "PullStream"))

        def op() -> int:
            replies: Iterator[bytes] = stream_call(request, timeout=timeout)
            if not protobuf:
                return sum(len(piece) for piece in replies)
            pieces = [codec.chunk_data(piece) for piece in replies]
            return codec.content_span(pieces[0])[3] if pieces else 0

    got = op()
    if got != tensor.nbytes:
        raise BenchmarkError(f"pulled {got} B of tensor content, asked for {tensor.nbytes} B")
    return measure(op, run, probe)


def p2p_bandwidth(server: Server, sizes: Sequence[Message], call: BandwidthCall) -> BenchmarkResult:
    """Tensors moved per second for each size (TF-gRPC-P2P-Bandwidth), in bytes/s, with
    ``call``'s options."""
    call.check_sizes(sizes)
    mode, rpc, direction, chunk_bytes = call.mode, call.rpc, call.direction, call.chunk_bytes

    with _Channels(server) as channels:

        def measure_one(
            tensor: Tensor, probe: Phase, spec: RunSpec, timeout: float
        ) -> tuple[Samples, int]:
            if direction == "pull":
                channel = channels.get(tensor)
                return _pull(channel, tensor, mode, rpc, spec, chunk_bytes, probe, timeout)
            if rpc == "unary":
                return _push_unary(channels.get(tensor), tensor, mode, spec, probe, timeout)
            push = _push_stream(channels, tensor, mode, spec, chunk_bytes, probe, timeout)
            return channels.run(push)

        return _measure_each(server, sizes, call, f"{rpc} {direction}", measure_one)


# --- two servers, side by side ---------------------------------------------------------------
def p2p_latency_pair(
    servers: tuple[Server, Server], sizes: Sequence[Message], call: LatencyCall, *, seed: int = 0
) -> tuple[BenchmarkResult, BenchmarkResult]:
    """Echo latency of two servers, A and B, interleaved size by size: every round visits
    every message (in a new seeded order each round, as :func:`p2p_latency`), and measures
    each message on both servers one right after the other, which first decided by a seeded
    coin. Round ``r`` of a message on A and on B are then a pair that shared the machine's
    state (:mod:`pytest_tfgrpc.stats.paired`). Returns A's result and B's, both with their
    rounds; a failed call raises as :func:`p2p_latency` does, naming the server."""
    mode, rpc, run, progress = call.mode, call.rpc, call.run, call.progress
    messages = _check_messages(sizes)
    sweeps = (_Sweep(messages, mode), _Sweep(messages, mode))
    settings = run_settings(run, **call.extra_settings())
    coin = random.Random(seed)
    count = len(messages)
    with contextlib.ExitStack() as stack:
        channels = [stack.enter_context(_Channels(server)) for server in servers]
        probes: dict[tuple[int, int], CpuProbe] = {}
        order = list(range(count))
        shuffle = random.Random(count).shuffle
        for round_index in range(run.round_count):
            take_turn()
            spec = run.round_spec(round_index)
            for index in order:
                if progress is not None and round_index == 0:
                    progress(index + 1, count, _name(messages[index]))
                sides = [0, 1] if coin.random() < 0.5 else [1, 0]
                for side in sides:
                    server, sweep, open_channels = servers[side], sweeps[side], channels[side]
                    tensor = sweep.tensors[index]
                    limit = deadline(server, run, _wire(tensor, mode, "unary echo"))
                    try:
                        if (side, index) not in probes:
                            probe = stack.enter_context(CpuProbe(server.target))
                            probes[(side, index)] = probe
                        probe = probes[(side, index)]
                        if rpc == "unary":
                            samples, took = _latency_unary(
                                open_channels.get(tensor), tensor, mode, spec, probe, limit.seconds
                            )
                        else:
                            samples, took = open_channels.run(
                                _latency_stream(
                                    open_channels, tensor, mode, spec, probe, limit.seconds
                                )
                            )
                    except grpc.RpcError as error:
                        what = f"{rpc} echo of {tensor.nbytes} B"
                        raise explain(error, server, what, limit) from None
                    sweep.add(index, samples, took, probe.usage or {})
            shuffle(order)
    a, b = (
        p2p_result(call, server, sweep.results(), settings)
        for server, sweep in zip(servers, sweeps, strict=True)
    )
    return a, b
