"""Point-to-point benchmarks, as TF-gRPC-Bench defines them.

* :func:`p2p_latency`: the server echoes the tensor back; one sample is one round trip.
* :func:`p2p_bandwidth`: the worker pushes a tensor and the server only acknowledges it
  (or, ``direction="pull"``, the worker fetches a tensor as TensorFlow's RecvTensor does);
  one sample is one tensor moved, from its first byte sent to its acknowledgement.

Both run over one RPC shape: ``rpc="unary"`` (one call per tensor, as TensorFlow's
RecvTensor) or ``rpc="stream"`` (one long-lived stream; large tensors travel in slices of
``chunk_bytes``). In ``mode="protobuf"`` every message is encoded and decoded as a
TensorProto inside the timed region; in ``mode="raw"`` tensor bytes travel as they are.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import grpc

from pytest_tfgrpc.bench.cpu import CpuProbe
from pytest_tfgrpc.bench.partial import keeping_partial
from pytest_tfgrpc.bench.settings import run_settings
from pytest_tfgrpc.bench.timing import Phase, RunSpec, Samples, measure, measure_async
from pytest_tfgrpc.results import BenchmarkResult, CpuTime, SizeResult
from pytest_tfgrpc.units import size_label
from pytest_tfgrpc.wire import channels as transport
from pytest_tfgrpc.wire import codec
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
from pytest_tfgrpc.wire.tensors import Tensor

RPCS = ("unary", "stream")
DIRECTIONS = ("push", "pull")

LATENCY_RUN = RunSpec(iterations=1000, warmup=50, max_seconds=5.0, warmup_seconds=1.0)
BANDWIDTH_RUN = RunSpec(iterations=50, warmup=3, max_seconds=5.0, warmup_seconds=2.0)


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
        if message > transport.MAX_TENSOR_BYTES:
            raise ValueError(transport.too_large(message))
    return tuple(messages)


#: Told before each message size is measured: (index from 1, count, size or payload name).
Progress = Callable[[int, int, str], None]


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
    server: Server, method: str, timeout: float, metadata: tuple[tuple[str, str], ...] = ()
) -> AsyncIterator[Any]:
    """A bidirectional stream call on a channel of its own; on the way out (not after a
    failure) the stream is half-closed and its end awaited, so no task of it outlives the
    loop, then the channel closes."""
    channel = await connect_aio(server.target, server=server)
    try:
        stream = channel.stream_stream(method)(timeout=timeout, metadata=metadata or None)
        yield stream
        await stream.done_writing()
        await stream.code()
    finally:
        await channel.close()


def p2p_result(
    benchmark: str,
    server: Server,
    label: str | None,
    mode: str,
    rpc: str,
    sizes: Sequence[SizeResult],
    settings: Mapping[str, str],
) -> BenchmarkResult:
    """The result of a point-to-point benchmark against ``server`` (either engine's), in the
    one result family; ``settings`` are :func:`~pytest_tfgrpc.bench.settings.run_settings`'."""
    return BenchmarkResult(
        benchmark=benchmark,
        label=label or benchmark,
        fabric=server.fabric.name,
        target=server.target,
        mode=mode,
        rpc=rpc,
        sizes=tuple(sizes),
        settings=MappingProxyType(dict(settings)),
    )


# --- latency -------------------------------------------------------------------------------
def deadline(server: Server, run: RunSpec, nbytes: int) -> Deadline:
    """The deadline of every call (or stream) of ``run`` moving ``nbytes`` with ``server``:
    the run's own bound (warm-up and measured time) and the fabric's speed where known."""
    bound = run.warmup_seconds + run.time_limit_s
    return call_deadline(nbytes, bound_s=bound, speed_mbps=server.fabric.speed_mbps)


def _wire(tensor: Tensor, mode: str, what: str) -> int:
    """Bytes one operation of ``what`` moves: an echo carries the tensor both ways."""
    return tensor.wire_bytes(mode) * (2 if "echo" in what else 1)


def _latency_unary(
    server: Server, tensor: Tensor, mode: str, run: RunSpec, probe: Phase
) -> tuple[Samples, int]:
    channel = connect(server.target, server=server)
    try:
        call = channel.unary_unary(transport.method(mode, "Echo"))
        timeout = deadline(server, run, 2 * tensor.wire_bytes(mode)).seconds
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
    finally:
        channel.close()


async def _latency_stream(
    server: Server, tensor: Tensor, mode: str, run: RunSpec, probe: Phase
) -> tuple[Samples, int]:
    timeout = deadline(server, run, 2 * tensor.wire_bytes(mode)).seconds
    async with _stream(server, transport.method(mode, "EchoStream"), timeout) as stream:
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


#: Measures one tensor: (samples, elapsed ns), telling the probe when timing starts and ends.
MeasureOne = Callable[[Tensor, Phase], tuple[Samples, int]]


def _measure_each(
    server: Server,
    messages: Sequence[Message],
    mode: str,
    what: str,
    run: RunSpec,
    measure_one: MeasureOne,
    progress: Progress | None,
    build: Callable[[tuple[SizeResult, ...]], BenchmarkResult],
) -> BenchmarkResult:
    """Measure every message in turn, with the CPU time of both ends, into ``build``'s
    result. A failed call is reported as the server's death when that is what happened, in
    one line; the sizes measured before it travel on the error (:mod:`.partial`)."""
    checked = _check_messages(messages)
    results: list[SizeResult] = []
    with keeping_partial(results, build):
        for index, message in enumerate(checked, 1):
            if progress is not None:
                progress(index, len(checked), _name(message))
            tensor = _tensor(message)
            try:
                with CpuProbe(server.target) as probe:
                    samples, elapsed = measure_one(tensor, probe)
            except grpc.RpcError as error:
                limit = deadline(server, run, _wire(tensor, mode, what))
                raise explain(error, server, f"{what} of {tensor.nbytes} B", limit) from None
            results.append(_size_result(message, tensor, mode, samples, elapsed, probe.usage))
    return build(tuple(results))


def _builder(
    benchmark: str,
    label: str | None,
    server: Server,
    mode: str,
    rpc: str,
    settings: Mapping[str, str],
) -> Callable[[tuple[SizeResult, ...]], BenchmarkResult]:
    """The result of ``benchmark`` for the sizes measured (all, or those before a failure)."""

    def build(results: tuple[SizeResult, ...]) -> BenchmarkResult:
        return p2p_result(benchmark, server, label, mode, rpc, results, settings)

    return build


def p2p_latency(
    server: Server,
    sizes: Sequence[Message],
    *,
    mode: str = "raw",
    rpc: str = "unary",
    run: RunSpec = LATENCY_RUN,
    label: str | None = None,
    progress: Progress | None = None,
) -> BenchmarkResult:
    """Echo round-trip time of each size or payload (TF-gRPC-P2P-Latency)."""
    _check_choice("mode", mode, transport.MODES)
    _check_choice("rpc", rpc, RPCS)

    def measure_one(tensor: Tensor, probe: Phase) -> tuple[Samples, int]:
        if rpc == "unary":
            return _latency_unary(server, tensor, mode, run, probe)
        return run_async(_latency_stream(server, tensor, mode, run, probe))

    method = "Echo" if rpc == "unary" else "EchoStream"
    settings = run_settings(run, method=transport.method(mode, method))
    build = _builder("p2p_latency", label, server, mode, rpc, settings)
    return _measure_each(server, sizes, mode, f"{rpc} echo", run, measure_one, progress, build)


# --- bandwidth -----------------------------------------------------------------------------
def _push_unary(
    server: Server, tensor: Tensor, mode: str, run: RunSpec, probe: Phase
) -> tuple[Samples, int]:
    channel = connect(server.target, server=server)
    try:
        call = channel.unary_unary(transport.method(mode, "Push"))
        timeout = deadline(server, run, tensor.wire_bytes(mode)).seconds
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
    finally:
        channel.close()


async def _push_stream(
    server: Server, tensor: Tensor, mode: str, run: RunSpec, chunk_bytes: int, probe: Phase
) -> tuple[Samples, int]:
    protobuf = mode == "protobuf"
    wire = tensor.wire_bytes(mode)
    content, dtype, shape = tensor.content, tensor.dtype, tensor.shape
    timeout = deadline(server, run, wire).seconds
    metadata = ((transport.MESSAGE_BYTES_KEY, str(wire)),)
    async with _stream(server, transport.method(mode, "PushStream"), timeout, metadata) as stream:
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
    server: Server,
    tensor: Tensor,
    mode: str,
    rpc: str,
    run: RunSpec,
    chunk_bytes: int,
    probe: Phase,
) -> tuple[Samples, int]:
    channel = connect(server.target, server=server)
    try:
        request = codec.encode_pull_request(tensor.nbytes, tensor.dtype, chunk_bytes)
        wire = tensor.wire_bytes(mode)
        timeout = deadline(server, run, wire).seconds
        protobuf = mode == "protobuf"
        if rpc == "unary":
            call = channel.unary_unary(transport.method(mode, "Pull"))

            def op() -> int:
                reply: bytes = call(request, timeout=timeout)
                if protobuf:
                    return len(codec.decode_tensor(reply).content)
                return len(reply)

        else:
            stream_call = channel.unary_stream(transport.method(mode, "PullStream"))

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
    finally:
        channel.close()


def check_bandwidth_args(
    mode: str, rpc: str, direction: str, chunk_bytes: int, sizes: Sequence[Message]
) -> None:
    """The argument checks of :func:`pytest_tfgrpc.bench.p2p.p2p_bandwidth`."""
    _check_choice("mode", mode, transport.MODES)
    _check_choice("rpc", rpc, RPCS)
    _check_choice("direction", direction, DIRECTIONS)
    if chunk_bytes < 64:
        raise ValueError(f"chunk_bytes={chunk_bytes}: slices must be at least 64 bytes")
    if direction == "pull" and any(isinstance(message, Payload) for message in sizes):
        raise ValueError("a pull fetches tensors by size; payload schemes are pushed")


def bandwidth_extra(direction: str, mode: str, rpc: str, chunk_bytes: int) -> dict[str, str]:
    """The settings a bandwidth result records beside the run's (as the Python engine)."""
    names = {("push", "unary"): "Push", ("push", "stream"): "PushStream"}
    names |= {("pull", "unary"): "Pull", ("pull", "stream"): "PullStream"}
    extra = {"direction": direction, "method": transport.method(mode, names[direction, rpc])}
    if rpc == "stream":
        extra["chunk_bytes"] = str(chunk_bytes)
    return extra


def p2p_bandwidth(
    server: Server,
    sizes: Sequence[Message],
    *,
    mode: str = "raw",
    rpc: str = "stream",
    direction: str = "push",
    chunk_bytes: int = transport.DEFAULT_CHUNK_BYTES,
    run: RunSpec = BANDWIDTH_RUN,
    label: str | None = None,
    progress: Progress | None = None,
) -> BenchmarkResult:
    """Tensors moved per second for each size (TF-gRPC-P2P-Bandwidth), in bytes/s."""
    check_bandwidth_args(mode, rpc, direction, chunk_bytes, sizes)

    def measure_one(tensor: Tensor, probe: Phase) -> tuple[Samples, int]:
        if direction == "pull":
            return _pull(server, tensor, mode, rpc, run, chunk_bytes, probe)
        if rpc == "unary":
            return _push_unary(server, tensor, mode, run, probe)
        return run_async(_push_stream(server, tensor, mode, run, chunk_bytes, probe))

    what = f"{rpc} {direction}"
    extra = bandwidth_extra(direction, mode, rpc, chunk_bytes)
    build = _builder("p2p_bandwidth", label, server, mode, rpc, run_settings(run, **extra))
    return _measure_each(server, sizes, mode, what, run, measure_one, progress, build)
