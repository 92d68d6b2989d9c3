"""The worker protocol's framing and checks: the messages of ``protos/tfgrpc/worker.proto``
between a PS cluster's driver and its worker processes.

The driver (:class:`~pytest_tfgrpc.ps.ps_cluster.PSCluster`, and through it
:mod:`pytest_tfgrpc.bench.ps` and :mod:`pytest_tfgrpc.bench.fit`) writes a ``ToWorker``
message on a worker's stdin; the worker (:mod:`pytest_tfgrpc.ps.worker`, or the native
``tfgrpc-native-worker``) writes ``FromWorker`` messages on its stdout. Each is
length-delimited (:func:`frame`: a varint size, then the bytes; :class:`Frames` reads them
back from any split of the stream). Samples travel as packed int64 nanoseconds.
:func:`job_of` and :func:`reply_of` check what the schema cannot (ranges, matching lengths)
and raise :class:`MessageError`, naming the field.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import numpy.typing as npt
from google.protobuf.message import DecodeError

from pytest_tfgrpc.model.scaling import ALLREDUCE_ALGORITHMS
from pytest_tfgrpc.wire._proto import worker_pb2 as pb

__all__ = [
    "ALLREDUCE_ALGORITHMS",
    "MAX_FRAME_BYTES",
    "MODES",
    "AllReduceJob",
    "AllReduceReply",
    "Frames",
    "FromWorker",
    "Go",
    "Hello",
    "JobMessage",
    "Listening",
    "MessageError",
    "OwnedShards",
    "Peers",
    "Ready",
    "Reply",
    "Samples",
    "Shard",
    "SyncSGDJob",
    "SyncSGDReply",
    "ThroughputJob",
    "ThroughputReply",
    "ToWorker",
    "WorkerFailed",
    "check_allreduce",
    "frame",
    "from_worker",
    "job_of",
    "owned_bytes",
    "reply_of",
    "samples",
    "to_worker",
]

ThroughputJob = pb.ThroughputJob
SyncSGDJob = pb.SyncSGDJob
Go = pb.Go
Hello = pb.Hello
Ready = pb.Ready
WorkerFailed = pb.WorkerFailed
ThroughputReply = pb.ThroughputReply
SyncSGDReply = pb.SyncSGDReply
Shard = pb.Shard
Samples = pb.Samples
OwnedShards = pb.OwnedShards
AllReduceJob = pb.AllReduceJob
AllReduceReply = pb.AllReduceReply
Peers = pb.Peers
Listening = pb.Listening
JobMessage = pb.ThroughputJob | pb.SyncSGDJob | pb.AllReduceJob
Reply = pb.ThroughputReply | pb.SyncSGDReply | pb.AllReduceReply
FromWorker = (
    pb.Hello
    | pb.Ready
    | pb.WorkerFailed
    | pb.ThroughputReply
    | pb.SyncSGDReply
    | pb.Listening
    | pb.AllReduceReply
)
M = TypeVar("M")

SampleArray = npt.NDArray[np.int64]
#: The encodings a throughput job may send its payload in.
MODES = ("raw", "protobuf")

#: The largest message either side accepts: a size beyond it is a broken stream, not a message.
MAX_FRAME_BYTES = 1 << 30


class MessageError(ValueError):
    """Bytes that are not a valid message of the worker protocol."""


def frame(message: pb.ToWorker | pb.FromWorker) -> bytes:
    """``message`` length-delimited: its size as a varint, then its bytes."""
    body: bytes = message.SerializeToString()
    size = len(body)
    head = bytearray()
    while size >= 0x80:
        head.append(size & 0x7F | 0x80)
        size >>= 7
    head.append(size)
    return bytes(head) + body


class Frames:
    """The messages of a byte stream as they complete: :meth:`feed` what was read, then
    :meth:`take` each whole message's bytes. A size over :data:`MAX_FRAME_BYTES`, or a
    varint longer than ten bytes, raises :class:`MessageError`: the stream is not framed."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def take(self) -> bytes | None:
        size = shift = 0
        for index, byte in enumerate(self._buffer):
            size |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
            shift += 7
            if index >= 9:
                raise MessageError("a message size longer than a varint: the stream is not framed")
        else:
            return None
        if size > MAX_FRAME_BYTES:
            raise MessageError(f"a message of {size} bytes, over {MAX_FRAME_BYTES}")
        start = index + 1
        if len(self._buffer) < start + size:
            return None
        body = bytes(self._buffer[start : start + size])
        del self._buffer[: start + size]
        return body

    @property
    def pending(self) -> int:
        """Bytes read that are not yet a whole message."""
        return len(self._buffer)


ToWorker = JobMessage | pb.Go | pb.Peers

_TO_WORKER = {
    pb.ThroughputJob: "throughput",
    pb.SyncSGDJob: "sync_sgd",
    pb.Go: "go",
    pb.AllReduceJob: "allreduce",
    pb.Peers: "peers",
}
_FROM_WORKER = {
    pb.Hello: "hello",
    pb.Ready: "ready",
    pb.WorkerFailed: "failed",
    pb.ThroughputReply: "throughput",
    pb.SyncSGDReply: "sync_sgd",
    pb.Listening: "listening",
    pb.AllReduceReply: "allreduce",
}


def to_worker(message: ToWorker) -> pb.ToWorker:
    """``message`` in the envelope of the driver's messages."""
    envelope = pb.ToWorker()
    getattr(envelope, _TO_WORKER[type(message)]).CopyFrom(message)
    return envelope


def from_worker(message: FromWorker) -> pb.FromWorker:
    """``message`` in the envelope of a worker's messages."""
    envelope = pb.FromWorker()
    getattr(envelope, _FROM_WORKER[type(message)]).CopyFrom(message)
    return envelope


def _parse(envelope: M, body: bytes, side: str) -> M:
    try:
        envelope.ParseFromString(body)  # type: ignore[attr-defined]
    except DecodeError as exc:
        raise MessageError(f"not a {side} message ({exc})") from None
    return envelope


def _count(name: str, value: int, low: int = 0) -> None:
    if value < low:
        raise MessageError(f"{name}={value}: expected a whole number >= {low}")


def _seconds(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise MessageError(f"{name}={value!r}: expected a finite number of seconds > 0")


def _targets(targets: Sequence[str]) -> None:
    if not targets or not all(targets):
        raise MessageError(f"targets={list(targets)!r}: expected a non-empty list of host:port")


def job_of(body: bytes) -> ToWorker:
    """The driver's message in ``body``, checked: a job, the start barrier or an all-reduce
    job's peers."""
    envelope = _parse(pb.ToWorker(), body, "driver")
    kind = envelope.WhichOneof("kind")
    if kind is None:
        raise MessageError("an empty driver message (no job, no go)")
    message: ToWorker = getattr(envelope, kind)
    if isinstance(message, pb.ThroughputJob):
        _targets(message.targets)
        if message.mode not in MODES:
            raise MessageError(f"mode={message.mode!r}: expected one of {', '.join(MODES)}")
        if len(message.payload_bytes) != len(message.targets):
            raise MessageError(
                f"payload_bytes: {len(message.payload_bytes)} sizes for "
                f"{len(message.targets)} targets"
            )
        _count("iterations", message.iterations, 1)
        _seconds("warmup_seconds", message.warmup_seconds)
        _seconds("seconds", message.seconds)
    elif isinstance(message, pb.SyncSGDJob):
        _targets(message.targets)
        if len(message.shards) != len(message.targets):
            raise MessageError(
                f"shards: {len(message.shards)} lists of shards for {len(message.targets)} targets"
            )
        _count("chunk_bytes", message.chunk_bytes, 1)
        _count("max_steps", message.max_steps, 1)
        _seconds("barrier_timeout", message.barrier_timeout)
    elif isinstance(message, pb.AllReduceJob):
        check_allreduce(message)
    elif isinstance(message, pb.Peers):
        _targets(message.addresses)
    return message


def check_allreduce(job: pb.AllReduceJob) -> None:
    """MessageError naming the first field of ``job`` out of range."""
    _count("ranks", job.ranks, 2)
    if job.rank >= job.ranks:
        raise MessageError(f"rank={job.rank}: a rank in 0..{job.ranks - 1}")
    if not job.bind:
        raise MessageError("bind='': expected the host address to serve Collective on")
    if job.nbytes % 4 or job.nbytes < 4 * job.ranks:
        raise MessageError(
            f"nbytes={job.nbytes}: whole float32 elements, at least one per rank "
            f"({4 * job.ranks} bytes)"
        )
    if job.algorithm not in ALLREDUCE_ALGORITHMS:
        raise MessageError(
            f"algorithm={job.algorithm!r}: expected one of {', '.join(ALLREDUCE_ALGORITHMS)}"
        )
    if job.algorithm == "halving_doubling" and job.ranks & (job.ranks - 1):
        raise MessageError(
            f"algorithm='halving_doubling' needs a power-of-two number of ranks, not {job.ranks}"
        )
    _count("iterations", job.iterations, 1)
    _seconds("seconds", job.seconds)


def reply_of(body: bytes) -> FromWorker:
    """The worker's message in ``body``, checked."""
    envelope = _parse(pb.FromWorker(), body, "worker")
    kind = envelope.WhichOneof("kind")
    if kind is None:
        raise MessageError("an empty worker message")
    message: FromWorker = getattr(envelope, kind)
    if isinstance(message, pb.Hello):
        _count("pid", message.pid, 1)
    elif isinstance(message, pb.WorkerFailed) and not message.error:
        raise MessageError("error='': a failure that does not say why")
    elif isinstance(message, pb.ThroughputReply):
        _count("elapsed_ns", message.elapsed_ns, 1)
        for each in message.samples:
            samples(each.ns, "samples[]")
    elif isinstance(message, pb.SyncSGDReply):
        samples(message.samples_ns, "samples_ns")
        if message.steps < len(message.samples_ns):
            raise MessageError(
                f"steps={message.steps}: fewer than its {len(message.samples_ns)} samples"
            )
    elif isinstance(message, pb.AllReduceReply):
        samples(message.samples_ns, "samples_ns")
        if message.tls not in ("off", "tls", "mtls"):
            raise MessageError(f"tls={message.tls!r}: expected off, tls or mtls")
        if message.checked > len(message.samples_ns):
            raise MessageError(
                f"checked={message.checked}: more than its {len(message.samples_ns)} samples"
            )
    elif isinstance(message, pb.Listening) and not message.address:
        raise MessageError("address='': a Collective service that says not where")
    return message


def samples(values: object, name: str = "samples_ns") -> SampleArray:
    """Nanosecond samples as a read-only int64 array; MessageError for a negative one."""
    out = np.asarray(values, dtype=np.int64)
    if out.size and out.min() < 0:
        raise MessageError(f"{name}: a duration is negative")
    out.setflags(write=False)
    return out


def owned_bytes(job: pb.SyncSGDJob) -> tuple[int, ...]:
    """The bytes each PS of a sync-SGD job owns, by target."""
    return tuple(sum(shard.nbytes for shard in owned.shards) for owned in job.shards)
