"""The parameter-server side of the PS benchmarks: a job's shards, the step barrier, the update.

A PS process (the tensor server, :mod:`pytest_tfgrpc.roles.tensor_server`) also serves
``tfgrpc.ParameterServer`` (see ``protos/tfgrpc/service.proto``) and its raw twin
``tfgrpc.RawParameterServer``. Every call carries the run's job token (the driver's and its
workers'), checked before the request is read: a stranger's call changes and counts nothing.
The parent configures a job on every PS; then worker processes drive it:

* ``Throughput``: the PS acknowledges a payload (TF-gRPC-PS-Throughput). Calls carry
  ``x-tfgrpc-phase: measure`` metadata in the measured phase, so only those are counted.
* ``PushGradients``: one worker's gradients of one step, streamed as slices of the shards this
  PS owns; checked whole and then added into float32 accumulators (as TensorFlow's
  ``ConditionalAccumulator`` does), so a refused or broken push changes no sum. When all W
  workers have pushed step ``s`` the PS applies ``weights -= (learning_rate / W) * sum`` with
  numpy and the step is done.
* ``PullWeights``: waits until step ``s`` is done (the barrier, bounded by the job's timeout,
  and given up at once when the client cancels or its deadline passes, so a parked pull never
  keeps its stream), then streams the updated weights.

Every method reads its request messages under the idle bound of :mod:`pytest_tfgrpc.roles.idle`
(a stranger's stream that sends no message is cancelled), after the token check.

The chief (task 0) decides what the next step is (warm-up, measured, or none: the run is over)
from the job's counts and time limits, and tells each worker in the trailing metadata of its
pull. Workers pass each step's phase on to every PS, so all PS count the same measured steps.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc
import numpy as np
import numpy.typing as npt
from google.protobuf.message import DecodeError, Message

from pytest_tfgrpc.results import process_cpu_ns
from pytest_tfgrpc.roles.idle import IdleWatch
from pytest_tfgrpc.wire import codec
from pytest_tfgrpc.wire._proto import service_pb2
from pytest_tfgrpc.wire.security import TOKEN_ENV, TOKEN_KEY

SERVICE = "tfgrpc.ParameterServer"
RAW_SERVICE = "tfgrpc.RawParameterServer"

#: Metadata on Throughput calls: ``measure`` in the measured phase.
PHASE_KEY = "x-tfgrpc-phase"
#: Trailing metadata of the chief's PullWeights: what the next step is.
NEXT_PHASE_KEY = "x-tfgrpc-next-phase"
WARMUP, MEASURE, STOP = "warmup", "measure", "stop"

#: Initial weights: seeded random, or a function of the element index (the check mode).
INIT_RANDOM, INIT_INDEX = 0, 1
WEIGHT_SEED = 20171226
DEFAULT_PULL_CHUNK = 1 << 20

Floats = npt.NDArray[np.float32]
M = TypeVar("M", bound=Message)

#: Refusals of a push: they say what was wrong with it, nothing of the job's state.
_OUT_OF_TURN = "a gradient push out of turn (not the open step, or this worker pushed it)"
_BAD_SLICE = (
    "a gradient push whose slices are not exactly this PS's shards (outside them, "
    "not float32-aligned, or more or fewer bytes)"
)


def method(name: str, *, raw: bool = False) -> str:
    """The full path of a ParameterServer method (``raw``: of its raw-bytes twin)."""
    return f"/{RAW_SERVICE if raw else SERVICE}/{name}"


def initial_weights(offset: int, nbytes: int, init: int, seed: int = WEIGHT_SEED) -> Floats:
    """The initial float32 weights of the slice ``[offset, offset + nbytes)`` of a tensor.

    ``INIT_INDEX`` gives element ``j`` of the tensor the value ``j % 251``, so any slice of it
    can be predicted; ``INIT_RANDOM`` draws small normal values.
    """
    count = nbytes // 4
    if init == INIT_INDEX:
        return (np.arange(offset // 4, offset // 4 + count) % 251).astype(np.float32)
    rng = np.random.default_rng([seed, offset])
    weights: Floats = rng.standard_normal(count, dtype=np.float32) * np.float32(0.01)
    return weights


def check_gradient(worker: int, step: int, offset: int, nbytes: int) -> Floats:
    """The check mode's gradient: element ``j`` of a tensor is ``((w+1)*(s+1) + j) % 16``.

    Small integers, so that their float32 sum is exact whatever order they arrive in.
    """
    index = np.arange(offset // 4, offset // 4 + nbytes // 4)
    return (((worker + 1) * (step + 1) + index) % 16).astype(np.float32)


def apply_update(weights: Floats, total: Floats, learning_rate: float, workers: int) -> None:
    """``weights -= (learning_rate / workers) * total`` in float32, in place: the SGD step."""
    scale = np.float32(learning_rate / workers)
    np.subtract(weights, scale * total, out=weights)


class _Job:
    """One configured job: shard weights and accumulators, and the step state."""

    def __init__(self, spec: service_pb2.PSJob) -> None:
        self.spec = spec
        self.sizes = [shard.nbytes for shard in spec.shards]
        self.total_bytes = sum(self.sizes)
        self.weights = [
            initial_weights(shard.offset, shard.nbytes, spec.init) for shard in spec.shards
        ]
        self.accumulators = [np.zeros_like(w) for w in self.weights]
        self.served = [w.tobytes() for w in self.weights]
        self.step = 0  # the step being pushed; steps below it are applied
        self.pushed: set[int] = set()
        self.phase = WARMUP if spec.warmup_steps > 0 else MEASURE
        self.next_phase: dict[int, str] = {}
        self.warmup_done = 0
        self.scheduled = 0  # measured steps as the chief's schedule counts them
        self.measured = 0  # steps the workers flagged as measured
        self.step_measured = False
        self.phase_start = time.monotonic()
        self.bytes_in = 0
        self.bytes_out = 0
        self.rpcs = 0
        self.cpu_start: tuple[int, int] | None = None

    def start_measuring(self) -> None:
        if self.cpu_start is None:
            self.cpu_start = process_cpu_ns()

    def decide_next(self) -> str:
        """The chief's schedule: what the step after the one just applied is."""
        now = time.monotonic()
        spec = self.spec
        if self.phase == WARMUP:
            self.warmup_done += 1
            if self.warmup_done < spec.warmup_steps and now - self.phase_start < (
                spec.warmup_seconds
            ):
                return WARMUP
            self.phase_start = now
            return MEASURE
        self.scheduled += 1
        if self.scheduled >= spec.steps or now - self.phase_start >= spec.max_seconds:
            return STOP
        return MEASURE


class ParameterServer:
    """The ParameterServer handlers of one PS process; one job at a time."""

    def __init__(self, token: str | None = None, idle: IdleWatch | None = None) -> None:
        self._cond = threading.Condition()
        self._job: _Job | None = None
        self._token = token
        self._idle = idle or IdleWatch()

    def _authorize(self, context: grpc.ServicerContext) -> None:
        """Every call to this PS (job control, throughput, pushes, pulls) belongs to the driver
        that started it and its workers: it must carry the run's token
        (:data:`~pytest_tfgrpc.wire.security.TOKEN_KEY`), checked in constant time before the
        request is read or anything is counted. The refusal names nothing of the job."""
        token = self._token
        if token is None:
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"the PS service is off: this server was started without a job token "
                f"({TOKEN_ENV}); only a PS started by a pytest-tfgrpc driver takes jobs",
            )
            raise AssertionError("unreachable")  # abort raises
        given = dict(context.invocation_metadata()).get(TOKEN_KEY, "")
        if not hmac.compare_digest(str(given).encode(), token.encode()):
            context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "the PS service needs the token of the driver that started this PS "
                f"(metadata {TOKEN_KEY!r}); the call carried "
                + ("a wrong one" if given else "none"),
            )

    def _current(self, context: grpc.ServicerContext) -> _Job:
        job = self._job
        if job is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no job configured on this PS")
            raise AssertionError("unreachable")  # abort raises
        return job

    # --- job -------------------------------------------------------------------------------
    def configure(
        self, request: service_pb2.PSJob, context: grpc.ServicerContext
    ) -> service_pb2.PSJobStats:
        for shard in request.shards:
            if shard.nbytes % 4 or shard.offset % 4:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"shard {shard.tensor}@{shard.offset}: sync SGD aggregates float32, so "
                    f"offsets and sizes must be multiples of 4 bytes, not {shard.nbytes}",
                )
        if request.workers < 1:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a job needs at least one worker")
        job = _Job(request)
        with self._cond:
            self._job = job
            self._cond.notify_all()  # pulls waiting on an old job give up
        return self._stats(job)

    def _stats(self, job: _Job) -> service_pb2.PSJobStats:
        user, system = 0, 0
        if job.cpu_start is not None:
            now = process_cpu_ns()
            user, system = now[0] - job.cpu_start[0], now[1] - job.cpu_start[1]
        return service_pb2.PSJobStats(
            job_id=job.spec.job_id,
            task=job.spec.task,
            steps=job.step,
            measured_steps=job.measured,
            bytes_in=job.bytes_in,
            bytes_out=job.bytes_out,
            rpcs=job.rpcs,
            cpu_user_ns=user,
            cpu_system_ns=system,
            pid=os.getpid(),
        )

    def job_stats(
        self, request: service_pb2.StatusRequest, context: grpc.ServicerContext
    ) -> service_pb2.PSJobStats:
        job = self._current(context)
        with self._cond:
            return self._stats(job)

    # --- PS throughput ---------------------------------------------------------------------
    def _throughput(self, request: bytes, context: grpc.ServicerContext, protobuf: bool) -> bytes:
        size = len(codec.decode_tensor(request).content) if protobuf else len(request)
        job = self._job
        if job is not None and (PHASE_KEY, MEASURE) in context.invocation_metadata():
            with self._cond:
                job.start_measuring()
                job.rpcs += 1
                job.bytes_in += size
        return codec.encode_ack(len(request), 1)

    # --- sync SGD --------------------------------------------------------------------------
    def push_gradients(
        self, requests: Iterator[service_pb2.WeightChunk], context: grpc.ServicerContext
    ) -> service_pb2.Ack:
        """Take one worker's gradients of one step. The push is checked whole (its turn,
        every slice inside this PS's shards, exactly their size) and staged before any of it
        touches the step's sum: a refused push, or a stream that breaks midway, leaves the
        aggregate as it was. Refusals name nothing of the job (its step, its workers)."""
        job = self._current(context)
        first = next(requests, None)
        if first is None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "an empty gradient push")
            raise AssertionError("unreachable")
        step, worker, measured = first.step, first.worker, first.measured
        with self._cond:
            if step != job.step or worker in job.pushed:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, _OUT_OF_TURN)
        staged: list[tuple[int, int, Floats]] = []
        received = 0
        chunk: service_pb2.WeightChunk | None = first
        while chunk is not None:
            size = len(chunk.data)
            if size:
                shard, offset = chunk.shard, chunk.offset
                if (
                    not 0 <= shard < len(job.sizes)
                    or offset % 4
                    or size % 4
                    or not 0 <= offset <= job.sizes[shard] - size
                    or received + size > job.total_bytes
                ):
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, _BAD_SLICE)
                staged.append((shard, offset // 4, np.frombuffer(chunk.data, dtype=np.float32)))
                received += size
            chunk = next(requests, None)
        if received != job.total_bytes:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, _BAD_SLICE)
        with self._cond:
            if job is not self._job:
                context.abort(grpc.StatusCode.ABORTED, "the job was replaced during the push")
            if step != job.step or worker in job.pushed:  # another push of it came first
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, _OUT_OF_TURN)
            for shard, start, gradient in staged:
                job.accumulators[shard][start : start + len(gradient)] += gradient
            job.pushed.add(worker)
            if measured:
                job.start_measuring()
                job.step_measured = True
                job.bytes_in += received
                job.rpcs += 1
            if len(job.pushed) == job.spec.workers:
                self._apply(job)
        return service_pb2.Ack(bytes_received=received, messages=1)

    def _apply(self, job: _Job) -> None:
        """All workers pushed ``job.step``: update the weights, open the next step."""
        for weights, accumulator in zip(job.weights, job.accumulators, strict=True):
            apply_update(weights, accumulator, job.spec.learning_rate, job.spec.workers)
            accumulator.fill(0.0)
        job.served = [w.tobytes() for w in job.weights]
        job.measured += job.step_measured
        job.step_measured = False
        job.next_phase[job.step] = job.decide_next()
        job.phase = job.next_phase[job.step]
        job.step += 1
        job.pushed = set()
        self._cond.notify_all()

    def pull_weights(
        self, request: service_pb2.PullWeightsRequest, context: grpc.ServicerContext
    ) -> Iterator[service_pb2.WeightChunk]:
        job = self._current(context)
        step = request.step
        timeout = job.spec.barrier_timeout_seconds
        with self._cond:
            if step >= 0:
                if step > job.step:
                    context.abort(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"pull of step {step} before it was pushed",
                    )
                # A pull whose client cancels, or whose deadline passes, gives up at once:
                # parked until the barrier's timeout it would keep its HTTP/2 stream, and the
                # connection's stream bound would refuse the client's next calls.
                context.add_callback(self._wake)
                done = self._cond.wait_for(
                    lambda: job.step > step or self._job is not job or not context.is_active(),
                    timeout=timeout,
                )
                if not context.is_active():
                    return
                if self._job is not job:
                    context.abort(grpc.StatusCode.ABORTED, "the job was replaced")
                if not done:
                    context.abort(
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                        f"step {step}: {len(job.pushed)} of {job.spec.workers} workers pushed "
                        f"their gradients within {timeout:g} s (workers {sorted(job.pushed)})",
                    )
                if job.step != step + 1:
                    context.abort(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"pull of step {step}, which is no longer the last applied",
                    )
                if job.spec.task == 0:
                    context.set_trailing_metadata(((NEXT_PHASE_KEY, job.next_phase[step]),))
            served = job.served
        chunk_bytes = request.chunk_bytes or DEFAULT_PULL_CHUNK
        sent = 0
        for index, data in enumerate(served):
            view = memoryview(data)
            for offset in range(0, len(view), chunk_bytes):
                piece = view[offset : offset + chunk_bytes]
                sent += len(piece)
                yield service_pb2.WeightChunk(
                    shard=index, offset=offset, data=piece.tobytes(), step=step
                )
        if request.measured and step >= 0:
            with self._cond:
                job.bytes_out += sent
                job.rpcs += 1

    def _wake(self) -> None:
        """A call ended (gRPC's callback): parked pulls look at their calls again."""
        with self._cond:
            self._cond.notify_all()

    # --- registration ----------------------------------------------------------------------
    def handlers(self) -> list[grpc.GenericRpcHandler]:
        """The generic handlers of ``tfgrpc.ParameterServer`` and its raw twin. Each reads
        its requests as a stream under the idle bound, after the token check, and parses them
        itself: a request gRPC failed to deserialize would keep its HTTP/2 stream (grpcio
        1.85 never closes it), and a connection's stream bound would then refuse every call."""
        watch, check = self._idle, self._authorize

        def unary(fn: Callable[[Any, Any], Any], message: type[Any]) -> grpc.RpcMethodHandler:
            def handle(request: bytes, context: grpc.ServicerContext) -> Any:
                return fn(_parse(message, request, context), context)

            return grpc.stream_unary_rpc_method_handler(
                watch.first(handle, check), response_serializer=_serialize
            )

        def throughput(protobuf: bool) -> grpc.RpcMethodHandler:
            def handle(request: bytes, context: grpc.ServicerContext) -> bytes:
                with refusing_malformed(context, "TensorProto"):
                    return self._throughput(request, context, protobuf)

            return grpc.stream_unary_rpc_method_handler(watch.first(handle, check))

        def push(requests: Iterator[bytes], context: grpc.ServicerContext) -> Any:
            chunks = (_parse(service_pb2.WeightChunk, data, context) for data in requests)
            return self.push_gradients(chunks, context)

        def pull(request: bytes, context: grpc.ServicerContext) -> Any:
            return self.pull_weights(
                _parse(service_pb2.PullWeightsRequest, request, context), context
            )

        protobuf = {
            "Configure": unary(self.configure, service_pb2.PSJob),
            "JobStats": unary(self.job_stats, service_pb2.StatusRequest),
            "Throughput": throughput(True),
            "PushGradients": grpc.stream_unary_rpc_method_handler(
                watch.each(push, check), response_serializer=_serialize
            ),
            "PullWeights": grpc.stream_stream_rpc_method_handler(
                watch.first(pull, check), response_serializer=_serialize
            ),
        }
        return [
            grpc.method_handlers_generic_handler(SERVICE, protobuf),
            grpc.method_handlers_generic_handler(RAW_SERVICE, {"Throughput": throughput(False)}),
        ]


@contextlib.contextmanager
def refusing_malformed(context: grpc.ServicerContext, message: str) -> Iterator[None]:
    """Refuse the call (``INVALID_ARGUMENT: a malformed <message>: <why>``) when decoding in
    the block fails (:class:`~pytest_tfgrpc.wire.codec.CodecError`), instead of grpcio's
    UNKNOWN for a handler's exception."""
    try:
        yield
    except codec.CodecError as exc:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"a malformed {message}: {exc}")


def _parse(message: type[M], data: bytes, context: grpc.ServicerContext) -> M:
    """``data`` as a ``message``; a malformed one is refused (INVALID_ARGUMENT)."""
    try:
        parsed: M = message.FromString(data)
        return parsed
    except DecodeError:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"a malformed {message.__name__}")
        raise AssertionError("unreachable") from None  # abort raises


def _serialize(message: Any) -> bytes:
    return bytes(message.SerializeToString())
