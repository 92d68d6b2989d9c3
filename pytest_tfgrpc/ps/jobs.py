"""The messages between a PS cluster's driver and its worker processes, typed on both sides.

The driver (:class:`~pytest_tfgrpc.ps.ps_cluster.PSCluster`, and through it
:mod:`pytest_tfgrpc.bench.ps` and :mod:`pytest_tfgrpc.bench.fit`) and the workers
(:mod:`pytest_tfgrpc.ps.worker`) both import this module; neither side builds or reads a
raw dict. One message is one line of JSON on the worker's stdin or stdout:

* driver to worker: a job (:class:`ThroughputJob`, :class:`SyncSGDJob`), then :class:`Go`;
* worker to driver: :class:`Hello` once it is up, :class:`Ready` when the job is prepared, then
  a reply (:class:`ThroughputReply`, :class:`SyncSGDReply`) or :class:`WorkerFailed`.

Samples travel as base64 of little-endian int64 nanoseconds, 8 bytes a sample (a JSON list
took up to 20), encoded after the measured phase. :func:`decode` checks every field's type
and range and raises :class:`MessageError`, naming the field, for anything else.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

import numpy as np
import numpy.typing as npt

__all__ = [
    "MODES",
    "Go",
    "Hello",
    "JobMessage",
    "Message",
    "MessageError",
    "Ready",
    "Reply",
    "SyncSGDJob",
    "SyncSGDReply",
    "ThroughputJob",
    "ThroughputReply",
    "WorkerFailed",
    "decode",
    "encode",
    "pack_samples",
    "unpack_samples",
]

Samples = npt.NDArray[np.int64]
#: The encodings a throughput job may send its payload in.
MODES = ("raw", "protobuf")
_SAMPLE = np.dtype("<i8")


class MessageError(ValueError):
    """A line that is not a valid message of the worker protocol."""


def pack_samples(samples: Samples | list[int]) -> str:
    """Nanosecond samples as base64 of little-endian int64."""
    return base64.b64encode(np.asarray(samples, dtype=_SAMPLE).tobytes()).decode("ascii")


def unpack_samples(text: str) -> Samples:
    """The read-only int64 array :func:`pack_samples` encoded; MessageError if it is not one."""
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise MessageError(f"samples: not base64 ({exc})") from None
    if len(raw) % _SAMPLE.itemsize:
        raise MessageError(f"samples: {len(raw)} bytes is not a whole number of int64")
    out = np.frombuffer(raw, dtype=_SAMPLE).astype(np.int64)
    if out.size and out.min() < 0:
        raise MessageError("samples: a duration is negative")
    out.setflags(write=False)
    return out


# --- field checks ------------------------------------------------------------------------------


def _count(name: str, value: object, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise MessageError(f"{name}={value!r}: expected a whole number >= {low}")
    return value


def _seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MessageError(f"{name}={value!r}: expected a number of seconds")
    if not (math.isfinite(value) and value > 0):
        raise MessageError(f"{name}={value!r}: expected a finite number of seconds > 0")
    return float(value)


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise MessageError(f"{name}={value!r}: expected true or false")
    return value


def _text(name: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise MessageError(f"{name}={value!r}: expected a non-empty string")
    return value


def _targets(value: object) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or not value:
        raise MessageError(f"targets={value!r}: expected a non-empty list of host:port")
    return tuple(_text("targets[]", target) for target in value)


def _cpu(cpu_user_ns: object, cpu_system_ns: object) -> None:
    _count("cpu_user_ns", cpu_user_ns)
    _count("cpu_system_ns", cpu_system_ns)


# --- driver to worker --------------------------------------------------------------------------


@dataclass(frozen=True)
class ThroughputJob:
    """Call every PS of ``targets`` in a closed loop, one call in flight per PS.

    ``payload_bytes[p]`` is the size sent to ``targets[p]``, in ``mode`` (``raw`` bytes or
    ``protobuf`` tensors). ``warmup`` calls per PS within ``warmup_seconds`` first (after the
    start barrier); then at most ``iterations`` calls per PS, none started after ``seconds``.
    """

    kind: ClassVar[str] = "throughput"
    targets: tuple[str, ...]
    worker: int
    mode: str
    payload_bytes: tuple[int, ...]
    iterations: int
    warmup: int
    warmup_seconds: float
    seconds: float

    def __post_init__(self) -> None:
        _targets(self.targets)
        _count("worker", self.worker)
        if self.mode not in MODES:
            raise MessageError(f"mode={self.mode!r}: expected one of {', '.join(MODES)}")
        if len(self.payload_bytes) != len(self.targets):
            raise MessageError(
                f"payload_bytes: {len(self.payload_bytes)} sizes for {len(self.targets)} targets"
            )
        for size in self.payload_bytes:
            _count("payload_bytes[]", size)
        _count("iterations", self.iterations, 1)
        _count("warmup", self.warmup)
        _seconds("warmup_seconds", self.warmup_seconds)
        _seconds("seconds", self.seconds)


@dataclass(frozen=True)
class SyncSGDJob:
    """Push the gradients of, and pull the weights of, every shard each PS owns, step by step.

    ``shards[p]`` lists the ``(tensor offset, nbytes)`` of each shard ``targets[p]`` owns, in
    that PS's order; streams travel in slices of ``chunk_bytes``. The chief PS says when the
    warm-up ends and when to stop; ``max_steps`` bounds the steps whatever it says.
    ``check=True`` sends predictable gradients
    (:func:`~pytest_tfgrpc.roles.parameter_server.check_gradient`).
    """

    kind: ClassVar[str] = "sync_sgd"
    targets: tuple[str, ...]
    worker: int
    shards: tuple[tuple[tuple[int, int], ...], ...]
    chunk_bytes: int
    warmup: int
    max_steps: int
    barrier_timeout: float
    check: bool = False

    def __post_init__(self) -> None:
        _targets(self.targets)
        _count("worker", self.worker)
        if len(self.shards) != len(self.targets):
            raise MessageError(
                f"shards: {len(self.shards)} lists of shards for {len(self.targets)} targets"
            )
        for owned in self.shards:
            for shard in owned:
                if len(shard) != 2:
                    raise MessageError(f"shards: {shard!r} is not (offset, nbytes)")
                _count("shard offset", shard[0])
                _count("shard nbytes", shard[1])
        _count("chunk_bytes", self.chunk_bytes, 1)
        _count("warmup", self.warmup)
        _count("max_steps", self.max_steps, 1)
        _seconds("barrier_timeout", self.barrier_timeout)
        _flag("check", self.check)

    @property
    def owned_bytes(self) -> tuple[int, ...]:
        """The bytes each PS owns, by target."""
        return tuple(sum(nbytes for _, nbytes in owned) for owned in self.shards)


@dataclass(frozen=True)
class Go:
    """The start barrier: ``go=True`` starts a prepared job, ``False`` calls it off."""

    kind: ClassVar[str] = "go"
    go: bool

    def __post_init__(self) -> None:
        _flag("go", self.go)


# --- worker to driver --------------------------------------------------------------------------


@dataclass(frozen=True)
class Hello:
    """A worker is up."""

    kind: ClassVar[str] = "hello"
    pid: int

    def __post_init__(self) -> None:
        _count("pid", self.pid, 1)


@dataclass(frozen=True)
class Ready:
    """A worker prepared its job and waits for :class:`Go`."""

    kind: ClassVar[str] = "ready"


@dataclass(frozen=True)
class WorkerFailed:
    """A job failed at a worker; ``error`` says why."""

    kind: ClassVar[str] = "error"
    error: str

    def __post_init__(self) -> None:
        _text("error", self.error)


@dataclass(frozen=True, eq=False)
class ThroughputReply:
    """What one worker measured of a :class:`ThroughputJob`: ``samples_ns[p]`` holds the
    latency of every measured call to PS ``p``; ``elapsed_ns`` is the measured phase's wall
    time; the CPU times are the worker process's over that phase."""

    kind: ClassVar[str] = "throughput_result"
    samples_ns: tuple[Samples, ...] = field(repr=False)
    elapsed_ns: int
    cpu_user_ns: int
    cpu_system_ns: int

    def __post_init__(self) -> None:
        _count("elapsed_ns", self.elapsed_ns, 1)
        _cpu(self.cpu_user_ns, self.cpu_system_ns)


@dataclass(frozen=True, eq=False)
class SyncSGDReply:
    """What one worker measured of a :class:`SyncSGDJob`: the time of every measured step
    (its push and pull on every PS), how many steps it ran in all (warm-up included), and the
    worker process's CPU times over the measured steps."""

    kind: ClassVar[str] = "sync_sgd_result"
    samples_ns: Samples = field(repr=False)
    steps: int
    cpu_user_ns: int
    cpu_system_ns: int

    def __post_init__(self) -> None:
        _count("steps", self.steps, len(self.samples_ns))
        _cpu(self.cpu_user_ns, self.cpu_system_ns)


JobMessage = ThroughputJob | SyncSGDJob
Reply = ThroughputReply | SyncSGDReply
Message = ThroughputJob | SyncSGDJob | Go | Hello | Ready | WorkerFailed | Reply
M = TypeVar("M")

_TYPES: dict[str, type[Any]] = {
    cls.kind: cls
    for cls in (ThroughputJob, SyncSGDJob, Go, Hello, Ready, WorkerFailed, *Reply.__args__)
}


def _to_json(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": message.kind}
    for f in fields(message):
        value = getattr(message, f.name)
        if f.name == "samples_ns":
            value = (
                [pack_samples(s) for s in value]
                if isinstance(value, tuple)
                else pack_samples(value)
            )
        out[f.name] = value
    return out


def encode(message: Message) -> bytes:
    """One line (newline included) that :func:`decode` reads back as ``message``."""
    return json.dumps(_to_json(message), separators=(",", ":")).encode() + b"\n"


def _tuples(value: object, depth: int) -> object:
    # JSON has lists only: targets, sizes and shards become the tuples the dataclasses hold.
    if isinstance(value, list):
        return tuple(_tuples(item, depth - 1) for item in value) if depth > 0 else value
    return value


_DECODERS: Mapping[str, Callable[[object], object]] = {
    "targets": lambda v: _tuples(v, 1),
    "payload_bytes": lambda v: _tuples(v, 1),
    "shards": lambda v: _tuples(v, 3),
}


def _samples(kind: str, value: object) -> object:
    if kind == ThroughputReply.kind:
        if not isinstance(value, list):
            raise MessageError(f"samples_ns={value!r:.60}: expected a list, one per PS")
        return tuple(unpack_samples(_packed("samples_ns[]", v)) for v in value)
    return unpack_samples(_packed("samples_ns", value))


def _packed(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise MessageError(f"{name}={value!r:.60}: expected base64 of int64 samples")
    return value


def decode(line: bytes | str, expect: type[M] | tuple[type[Any], ...] | None = None) -> M:
    """The message on ``line``; with ``expect``, it must be of that type (or one of those).

    Raises :class:`MessageError` for a line that is not JSON, a kind that does not exist or
    is not expected, a missing or unknown field, or a field of the wrong type or range.
    """
    try:
        raw = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MessageError(f"not a JSON line ({exc}): {line[:80]!r}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("kind"), str):
        raise MessageError(f"not a message (no 'kind'): {str(line)[:80]}")
    kind = raw.pop("kind")
    cls = _TYPES.get(kind)
    if cls is None:
        raise MessageError(f"kind={kind!r}: expected one of {', '.join(sorted(_TYPES))}")
    if expect is not None and not issubclass(cls, expect):
        raise MessageError(f"a {kind!r} message where {_names(expect)} was expected")
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(raw) - names)
    if unknown:
        raise MessageError(f"{kind}: unknown field {unknown[0]!r}")
    for name, value in raw.items():
        if name == "samples_ns":
            raw[name] = _samples(kind, value)
        elif name in _DECODERS:
            raw[name] = _DECODERS[name](value)
    try:
        message: M = cls(**raw)
    except TypeError as exc:
        raise MessageError(f"{kind}: {exc}") from None
    return message


def _names(expect: type[Any] | tuple[type[Any], ...]) -> str:
    kinds = expect if isinstance(expect, tuple) else (expect,)
    return " or ".join(repr(k.kind) for k in kinds)
