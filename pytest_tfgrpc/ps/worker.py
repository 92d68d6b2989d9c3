"""A PS-benchmark worker process: runs jobs against every parameter server, prints samples.

Started by :class:`~pytest_tfgrpc.ps.ps_cluster.PSCluster` as ``python -m
pytest_tfgrpc.ps.worker``.
Workers are processes, not threads, so that W workers measure the network and the servers,
not one interpreter's GIL. The parent talks to a worker in the messages of
``protos/tfgrpc/worker.proto``, length-delimited (:mod:`pytest_tfgrpc.ps.jobs`):

1. the worker writes ``Hello`` once it is up;
2. the parent writes a job (``ThroughputJob``, ``SyncSGDJob`` or ``AllReduceJob``); the
   worker connects to every PS (once: it keeps its connections for later jobs), prepares its
   tensors and writes ``Ready`` (an all-reduce job first serves ``tfgrpc.Collective`` on the
   fabric, writes ``Listening`` and takes ``Peers``, the other ranks' addresses);
3. the parent writes ``Go`` to all workers at once (the start barrier); the worker runs the
   job and writes its reply, samples as packed int64; then it waits for the next job.

Every PS call carries the cluster's job token (given in ``$TFGRPC_JOB_TOKEN``, read once and
removed from the environment). Any failure is written as ``WorkerFailed``. The worker exits when
its stdin closes, which is how no worker outlives its parent, however the parent ends.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import queue
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, TypeVar

import grpc
import grpc.aio
import numpy as np
import numpy.typing as npt

from pytest_tfgrpc.ps.checked_sum import check_input, verify_sum
from pytest_tfgrpc.ps.jobs import (
    AllReduceJob,
    AllReduceReply,
    Frames,
    FromWorker,
    Go,
    Hello,
    JobMessage,
    Listening,
    MessageError,
    Peers,
    Ready,
    Reply,
    Samples,
    SyncSGDJob,
    SyncSGDReply,
    ThroughputJob,
    ThroughputReply,
    WorkerFailed,
    frame,
    from_worker,
    job_of,
    owned_bytes,
)
from pytest_tfgrpc.results import process_cpu_ns
from pytest_tfgrpc.roles.parameter_server import (
    MEASURE,
    NEXT_PHASE_KEY,
    PHASE_KEY,
    STOP,
    WARMUP,
    check_gradient,
    method,
)
from pytest_tfgrpc.roles.processes import available_cpus, this_machine
from pytest_tfgrpc.wire import codec, grpc_settings
from pytest_tfgrpc.wire._proto import service_pb2, worker_pb2
from pytest_tfgrpc.wire.client import RAISE_HINT, BenchmarkError, connect_aio, rpc_timeout
from pytest_tfgrpc.wire.security import (
    TOKEN_ENV,
    TOKEN_KEY,
    TlsError,
    add_port,
    files_from_env,
    load_tls,
    tls_failure,
    tls_mode,
    use_tls,
)
from pytest_tfgrpc.wire.telemetry import own_connections, split_target
from pytest_tfgrpc.wire.tensors import make_content

#: How long a worker waits for the parent's "go" after saying it is ready.
GO_TIMEOUT_S = 120.0


M = TypeVar("M")

#: The metadata every PS call carries: the cluster's job token, if the parent gave one.
Credentials = tuple[tuple[str, str], ...]


def _emit(message: FromWorker) -> None:
    sys.stdout.buffer.write(frame(from_worker(message)))
    sys.stdout.buffer.flush()


def _lifeline(lines: queue.Queue[bytes]) -> None:
    """Read the parent's messages from stdin into ``lines`` (each one's bytes); on EOF the
    parent is gone or done, and on a stream that is not framed nothing more can be read:
    exit at once."""
    frames = Frames()
    while chunk := os.read(0, 1 << 16):
        frames.feed(chunk)
        try:
            while (body := frames.take()) is not None:
                lines.put(body)
        except MessageError as error:
            _emit(WorkerFailed(error=f"bad job stream: {error}"))
            break
    os._exit(0)


async def _next_message(lines: queue.Queue[bytes], timeout: float, expect: type[M]) -> M:
    loop = asyncio.get_running_loop()
    try:
        line = await loop.run_in_executor(None, lambda: lines.get(timeout=timeout))
    except queue.Empty:
        raise BenchmarkError(f"no word from the parent within {timeout:g} s") from None
    message = job_of(line)
    if not isinstance(message, expect):
        raise MessageError(f"a {type(message).__name__} where {expect.__name__} was expected")
    return message


def _describe(error: grpc.RpcError, target: str, what: str, timeout: float | None = None) -> str:
    code = error.code() if isinstance(error, grpc.aio.AioRpcError) else None
    details = " ".join(str(error.details() if code is not None else error).split())
    # The files are the driver's (--tfgrpc-tls-*), handed down in the environment.
    why = tls_failure(target, details, flag_prefix="--tfgrpc-tls-") if code is not None else None
    if why is not None:
        return f"{what} to {target} failed: {why}"
    if code is grpc.StatusCode.DEADLINE_EXCEEDED and timeout is not None:
        return (
            f"{what} to {target} failed: DEADLINE_EXCEEDED: the deadline was {timeout:.3g} s "
            "(10 s slack + the job's time bound or barrier wait + its bytes at 1 MB/s); "
            + RAISE_HINT
        )
    return f"{what} to {target} failed: {code.name if code else 'error'}: {details}"


def _cpu_since(start: tuple[int, int] | None) -> tuple[int, int]:
    """This process's user and system CPU nanoseconds since ``start`` (none measured: 0)."""
    now = process_cpu_ns()
    start = start or now
    return now[0] - start[0], now[1] - start[1]


async def _wait_for_go(lines: queue.Queue[bytes], targets: Sequence[str] = ()) -> None:
    """The start barrier: say ready, with the ends of this process's connections to the
    ``targets`` (the PS tasks, whose telemetry the parent reads by them), then wait until the
    parent tells every worker to go."""
    ports = {split_target(target)[1] for target in targets}
    ends = {f"{local}>{peer}" for port in ports for local, peer in own_connections(port)}
    _emit(Ready(connections=sorted(ends)))
    if not (await _next_message(lines, GO_TIMEOUT_S, Go)).go:
        raise BenchmarkError("the parent called the run off")


# --- PS throughput ---------------------------------------------------------------------------
async def _throughput(
    job: ThroughputJob,
    channels: Sequence[grpc.aio.Channel],
    lines: queue.Queue[bytes],
    credentials: Credentials,
) -> ThroughputReply:
    protobuf = job.mode == "protobuf"
    calls = [ch.unary_unary(method("Throughput", raw=not protobuf)) for ch in channels]
    payloads = [make_content(size) for size in job.payload_bytes]
    # A call may take as long as the job's own bounds allow, and its bytes at the least rate.
    bound = job.warmup_seconds + job.seconds
    timeouts = [rpc_timeout(size, bound) for size in job.payload_bytes]
    warm_meta = ((PHASE_KEY, WARMUP), *credentials)
    measure_meta = ((PHASE_KEY, MEASURE), *credentials)
    clock = time.perf_counter_ns

    async def loop(ps: int, count: int, seconds: float, meta: Any, samples: list[int]) -> None:
        call, timeout = calls[ps], timeouts[ps]
        content, dtype, shape = payloads[ps]
        encode = codec.encode_tensor
        end = clock() + int(seconds * 1e9)
        for _ in range(count):
            t0 = clock()
            message = encode(content, dtype, shape) if protobuf else content
            try:
                await call(message, timeout=timeout, metadata=meta)
            except grpc.RpcError as error:
                what = f"Throughput of {job.payload_bytes[ps]} B"
                raise BenchmarkError(_describe(error, job.targets[ps], what, timeout)) from None
            t1 = clock()
            samples.append(t1 - t0)
            if t1 >= end:
                return

    # One untimed call per PS proves the path before anyone is told to start.
    await asyncio.gather(*(loop(ps, 1, 60.0, warm_meta, []) for ps in range(len(calls))))
    await _wait_for_go(lines, job.targets)
    ignored: list[list[int]] = [[] for _ in calls]
    await asyncio.gather(
        *(
            loop(ps, job.warmup, job.warmup_seconds, warm_meta, ignored[ps])
            for ps in range(len(calls))
        )
    )
    samples: list[list[int]] = [[] for _ in calls]
    cpu0 = process_cpu_ns()
    start = clock()
    await asyncio.gather(
        *(
            loop(ps, job.iterations, job.seconds, measure_meta, samples[ps])
            for ps in range(len(calls))
        )
    )
    elapsed = clock() - start
    cpu1 = process_cpu_ns()
    return ThroughputReply(
        samples=[Samples(ns=s) for s in samples],
        elapsed_ns=elapsed,
        cpu_user_ns=cpu1[0] - cpu0[0],
        cpu_system_ns=cpu1[1] - cpu0[1],
    )


# --- sync SGD --------------------------------------------------------------------------------
def _chunks(
    gradients: Sequence[np.ndarray], chunk_bytes: int
) -> list[bytes]:  # the slices of one push, serialized once
    out = []
    for shard, gradient in enumerate(gradients):
        data = memoryview(gradient.tobytes())
        for offset in range(0, len(data), chunk_bytes):
            piece = data[offset : offset + chunk_bytes].tobytes()
            out.append(_serialize(service_pb2.WeightChunk(shard=shard, offset=offset, data=piece)))
    return out


def _serialize(message: Any) -> bytes:
    return bytes(message.SerializeToString())


async def _sync_sgd(
    job: SyncSGDJob,
    channels: Sequence[grpc.aio.Channel],
    lines: queue.Queue[bytes],
    credentials: Credentials,
) -> SyncSGDReply:
    worker, check, chunk_bytes = job.worker, job.check, job.chunk_bytes
    targets = job.targets
    # Per PS: the (tensor offset, nbytes) of each shard it owns, in the PS's shard order.
    shards = [[(s.offset, s.nbytes) for s in mine.shards] for mine in job.shards]
    owned = owned_bytes(job)
    timeout = job.barrier_timeout + rpc_timeout(max(owned, default=0))
    pushes = [ch.stream_unary(method("PushGradients")) for ch in channels]
    pulls = [ch.unary_stream(method("PullWeights")) for ch in channels]

    def gradients(ps: int, step: int) -> list[bytes]:
        if check:
            arrays = [check_gradient(worker, step, off, n) for off, n in shards[ps]]
        else:
            rng = np.random.default_rng([worker, ps])
            arrays = [rng.standard_normal(n // 4, dtype=np.float32) * 1e-3 for _, n in shards[ps]]
        return _chunks(arrays, chunk_bytes)

    fixed = None if check else [gradients(ps, 0) for ps in range(len(channels))]

    async def step_on(ps: int, step: int, measured: bool, body: list[bytes]) -> str:
        header = service_pb2.WeightChunk(step=step, worker=worker, measured=measured)
        target = targets[ps]
        try:
            await pushes[ps]([_serialize(header), *body], timeout=timeout, metadata=credentials)
        except grpc.RpcError as error:
            raise BenchmarkError(
                _describe(error, target, f"push of step {step}", timeout)
            ) from None
        request = service_pb2.PullWeightsRequest(
            step=step, worker=worker, measured=measured, chunk_bytes=chunk_bytes
        )
        call = pulls[ps](_serialize(request), timeout=timeout, metadata=credentials)
        got = 0
        try:
            async for reply in call:
                got += len(service_pb2.WeightChunk.FromString(reply).data)
            trailing = await call.trailing_metadata()
        except grpc.RpcError as error:
            raise BenchmarkError(
                _describe(error, target, f"pull of step {step}", timeout)
            ) from None
        if got != owned[ps]:
            raise BenchmarkError(f"pulled {got} B of weights from {target}, it owns {owned[ps]} B")
        return str(dict(trailing or ()).get(NEXT_PHASE_KEY, ""))

    await _wait_for_go(lines, job.targets)
    clock = time.perf_counter_ns
    phase = WARMUP if job.warmup > 0 else MEASURE
    samples: list[int] = []
    cpu0: tuple[int, int] | None = None
    step = 0
    while phase != STOP and step < job.max_steps:
        measured = phase == MEASURE
        bodies = fixed or [gradients(ps, step) for ps in range(len(channels))]
        if measured and cpu0 is None:
            cpu0 = process_cpu_ns()
        t0 = clock()
        phases = await asyncio.gather(
            *(step_on(ps, step, measured, bodies[ps]) for ps in range(len(channels)))
        )
        t1 = clock()
        if measured:
            samples.append(t1 - t0)
        if phases[0] not in (WARMUP, MEASURE, STOP):
            raise BenchmarkError(f"the chief PS sent no next phase after step {step}")
        phase = phases[0]
        step += 1
    user, system = _cpu_since(cpu0)
    return SyncSGDReply(samples_ns=samples, steps=step, cpu_user_ns=user, cpu_system_ns=system)


# --- all-reduce --------------------------------------------------------------------------------
#: The service every rank serves the others (``protos/tfgrpc/worker.proto``), and its method.
COLLECTIVE: str = worker_pb2.DESCRIPTOR.services_by_name["Collective"].full_name
DELIVER = f"/{COLLECTIVE}/Deliver"


class Mailbox:
    """The pieces peers delivered, by (iteration, step): a rank takes one per step. Every
    delivery must carry the cluster's job token when the worker has one."""

    def __init__(self, credentials: Credentials) -> None:
        self._slots: dict[tuple[int, int], asyncio.Future[worker_pb2.Piece]] = {}
        self._token = dict(credentials).get(TOKEN_KEY)

    def _slot(self, key: tuple[int, int]) -> asyncio.Future[worker_pb2.Piece]:
        if key not in self._slots:
            self._slots[key] = asyncio.get_running_loop().create_future()
        return self._slots[key]

    async def deliver(
        self, piece: worker_pb2.Piece, context: grpc.aio.ServicerContext[Any, Any]
    ) -> worker_pb2.Taken:
        if self._token is not None:
            given = str(dict(context.invocation_metadata() or ()).get(TOKEN_KEY, ""))
            if not hmac.compare_digest(given.encode(), self._token.encode()):
                await context.abort(
                    grpc.StatusCode.UNAUTHENTICATED,
                    f"an all-reduce piece needs the cluster's job token (metadata {TOKEN_KEY!r})",
                )
        slot = self._slot((piece.iteration, piece.step))
        if slot.done():
            await context.abort(
                grpc.StatusCode.ALREADY_EXISTS,
                f"a second piece for iteration {piece.iteration}, step {piece.step}",
            )
        slot.set_result(piece)
        return worker_pb2.Taken()

    async def take(self, iteration: int, step: int, timeout: float) -> worker_pb2.Piece:
        key = (iteration, step)
        try:
            return await asyncio.wait_for(self._slot(key), timeout)
        except asyncio.TimeoutError:
            raise BenchmarkError(
                f"no all-reduce piece for iteration {iteration}, step {step} within {timeout:g} s"
            ) from None
        finally:
            self._slots.pop(key, None)


def ring_partners(rank: int, ranks: int, algorithm: str) -> list[int]:
    """The ranks ``rank`` sends to: its right neighbour (ring), or its partner at each
    distance ``2^k`` (halving-doubling)."""
    if algorithm == "ring":
        return [(rank + 1) % ranks]
    return [rank ^ (1 << k) for k in range(ranks.bit_length() - 1)]


async def _allreduce(
    job: AllReduceJob, lines: queue.Queue[bytes], credentials: Credentials
) -> AllReduceReply:
    n, rank, size = job.nbytes // 4, job.rank, job.ranks
    mailbox = Mailbox(credentials)
    server = grpc.aio.server(options=grpc_settings.SERVER_OPTIONS)
    handler = grpc.method_handlers_generic_handler(
        COLLECTIVE,
        {
            "Deliver": grpc.unary_unary_rpc_method_handler(
                mailbox.deliver,
                request_deserializer=worker_pb2.Piece.FromString,
                response_serializer=worker_pb2.Taken.SerializeToString,
            )
        },
    )
    server.add_generic_rpc_handlers((handler,))
    host = f"[{job.bind}]" if ":" in job.bind else job.bind
    port = add_port(server, f"{host}:0")
    await server.start()
    channels: dict[int, grpc.aio.Channel] = {}
    try:
        _emit(Listening(address=f"{host}:{port}"))
        peers = list((await _next_message(lines, GO_TIMEOUT_S, Peers)).addresses)
        if len(peers) != size:
            raise BenchmarkError(f"{len(peers)} peer addresses for {size} ranks")
        for partner in ring_partners(rank, size, job.algorithm):
            channels[partner] = await connect_aio(peers[partner])
        calls = {
            partner: channel.unary_unary(
                DELIVER,
                request_serializer=worker_pb2.Piece.SerializeToString,
                response_deserializer=worker_pb2.Taken.FromString,
            )
            for partner, channel in channels.items()
        }
        timeout = job.seconds + rpc_timeout(job.nbytes)

        last = False  # rank 0's word that this iteration is the last (see Piece.last)

        async def exchange(
            partner: int, iteration: int, step: int, lo: int, data: npt.NDArray[np.float32]
        ) -> tuple[int, npt.NDArray[np.float32]]:
            nonlocal last
            piece = worker_pb2.Piece(
                iteration=iteration, step=step, offset=lo, data=data.tobytes(), last=last
            )
            try:
                _, got = await asyncio.gather(
                    calls[partner](piece, timeout=timeout, metadata=credentials),
                    mailbox.take(iteration, step, timeout),
                )
            except grpc.RpcError as error:
                what = f"rank {rank}'s all-reduce piece (step {step})"
                raise BenchmarkError(_describe(error, peers[partner], what, timeout)) from None
            last = last or got.last
            return got.offset, np.frombuffer(got.data, dtype=np.float32)

        bounds = [n * i // size for i in range(size + 1)]

        async def ring(buffer: npt.NDArray[np.float32], iteration: int) -> None:
            right = (rank + 1) % size
            for step in range(size - 1):  # reduce-scatter
                send = (rank - step) % size
                lo, hi = bounds[send], bounds[send + 1]
                offset, data = await exchange(right, iteration, step, lo, buffer[lo:hi])
                buffer[offset : offset + data.size] += data
            for step in range(size - 1):  # all-gather
                send = (rank + 1 - step) % size
                lo, hi = bounds[send], bounds[send + 1]
                offset, data = await exchange(right, iteration, size - 1 + step, lo, buffer[lo:hi])
                buffer[offset : offset + data.size] = data

        async def halving_doubling(buffer: npt.NDArray[np.float32], iteration: int) -> None:
            lo, hi, step, distance = 0, n, 0, size // 2
            while distance >= 1:  # reduce-scatter by recursive halving
                partner = rank ^ distance
                mid = (lo + hi) // 2
                keep, give = ((lo, mid), (mid, hi)) if rank < partner else ((mid, hi), (lo, mid))
                offset, data = await exchange(
                    partner, iteration, step, give[0], buffer[give[0] : give[1]]
                )
                buffer[offset : offset + data.size] += data
                lo, hi = keep
                step, distance = step + 1, distance // 2
            distance = 1
            while distance < size:  # all-gather by recursive doubling
                partner = rank ^ distance
                offset, data = await exchange(partner, iteration, step, lo, buffer[lo:hi])
                buffer[offset : offset + data.size] = data
                lo, hi = min(lo, offset), max(hi, offset + data.size)
                step, distance = step + 1, distance * 2

        run = ring if job.algorithm == "ring" else halving_doubling
        if job.check:
            start = check_input(n, rank)
            expected = check_input(n, 0) * (size * (size + 1) // 2)
        else:
            start = np.random.default_rng(rank).random(n, dtype=np.float32)
        await _wait_for_go(lines)
        clock = time.perf_counter_ns
        samples: list[int] = []
        checked = 0
        cpu0: tuple[int, int] | None = None
        deadline = time.monotonic() + job.seconds
        for iteration in range(job.warmup + job.iterations):
            measured = iteration >= job.warmup
            if measured and cpu0 is None:
                cpu0 = process_cpu_ns()
                deadline = time.monotonic() + job.seconds
            # Only rank 0 reads the clock: a rank that stopped on its own would leave its
            # partners waiting for its pieces.
            last = rank == 0 and measured and time.monotonic() >= deadline
            buffer = start.copy()
            t0 = clock()
            await run(buffer, iteration)
            t1 = clock()
            if measured:
                samples.append(t1 - t0)
                if job.check:
                    verify_sum(buffer, expected, rank, iteration)
                    checked += 1
                if last:
                    break
        user, system = _cpu_since(cpu0)
        return AllReduceReply(
            samples_ns=samples,
            checked=checked,
            cpu_user_ns=user,
            cpu_system_ns=system,
            machine=this_machine(),
            cpus=available_cpus(),
            tls=tls_mode(),
        )
    finally:
        for channel in channels.values():
            await channel.close()
        await server.stop(grace=1.0)


async def _run(
    job: JobMessage,
    lines: queue.Queue[bytes],
    credentials: Credentials,
    kept: dict[str, grpc.aio.Channel],
) -> Reply:
    """Run ``job``: a PS job on the channels ``kept`` from earlier jobs (per PS target),
    opening those it lacks: a worker's connections to the PS tasks live as long as it does, as
    TensorFlow's, so that the driver can read their TCP state once a job's replies are in. An
    all-reduce job makes and closes its own (its peers differ per job)."""
    if isinstance(job, AllReduceJob):
        return await _allreduce(job, lines, credentials)
    channels: list[grpc.aio.Channel] = []
    for target in job.targets:
        if target not in kept:
            kept[target] = await connect_aio(target)
        channels.append(kept[target])
    if isinstance(job, ThroughputJob):
        return await _throughput(job, channels, lines, credentials)
    return await _sync_sgd(job, channels, lines, credentials)


async def _close(kept: dict[str, grpc.aio.Channel]) -> None:
    for channel in kept.values():
        await channel.close()
    kept.clear()


def main() -> int:
    """Serve jobs from stdin until it closes (under the TLS setting of the environment)."""
    try:
        use_tls(load_tls(files_from_env(), "$TFGRPC_TLS_"))
    except TlsError as error:
        _emit(WorkerFailed(error=f"TLS settings: {error}"))
        return 2
    token = os.environ.pop(TOKEN_ENV, "")
    credentials: Credentials = ((TOKEN_KEY, token),) if token else ()
    lines: queue.Queue[bytes] = queue.Queue()
    threading.Thread(target=_lifeline, args=(lines,), daemon=True).start()
    _emit(Hello(pid=os.getpid()))
    # One event loop for the worker's life: the channels it keeps belong to it.
    loop = asyncio.new_event_loop()
    kept: dict[str, grpc.aio.Channel] = {}
    while True:
        try:
            job = job_of(lines.get())
        except MessageError as error:
            _emit(WorkerFailed(error=f"bad job: {error}"))
            continue
        if isinstance(job, (Go, Peers)):
            continue  # meant for a job that failed before it was ready
        try:
            reply = loop.run_until_complete(_run(job, lines, credentials, kept))
        except (BenchmarkError, grpc.RpcError, ValueError) as error:
            loop.run_until_complete(_close(kept))  # a failed job's connections start afresh
            _emit(WorkerFailed(error=str(error) or type(error).__name__))
        else:
            _emit(reply)


if __name__ == "__main__":
    sys.exit(main())
