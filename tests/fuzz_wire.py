"""A fuzzer for the tensor servers' parsers: random and mutated byte strings through raw gRPC
generic calls to a running server, every method of every service, bounded in count and time.

Used by ``tests/test_native_parsers.py`` (a few seconds, in CI) and by
``scripts/fuzz_servers.py`` (the longer run whose output is committed). A server passes when
it answers every call with some status within the call's deadline, still answers ``Status``
after each round, and its peak resident memory stays under a bound.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field

import grpc

from pytest_tfgrpc.wire import codec, grpc_settings
from pytest_tfgrpc.wire._proto import service_pb2
from pytest_tfgrpc.wire.security import TOKEN_KEY

#: (path, kind): u = unary, us = unary-stream, su = stream-unary, ss = stream-stream.
TENSOR_METHODS = (
    ("Echo", "u"),
    ("EchoStream", "ss"),
    ("Push", "u"),
    ("PushStream", "ss"),
    (
        "Pull",
        "u",
    ),
    ("PullStream", "us"),
    ("Status", "u"),
)
PS_METHODS = (
    ("Configure", "u"),
    ("JobStats", "u"),
    ("Throughput", "u"),
    (
        "PushGradients",
        "su",
    ),
    ("PullWeights", "us"),
)


def methods() -> list[tuple[str, str]]:
    out = [
        (f"/{svc}/{name}", kind)
        for svc in ("tfgrpc.TensorService", "tfgrpc.RawTensorService")
        for name, kind in TENSOR_METHODS
    ]
    out += [(f"/tfgrpc.ParameterServer/{name}", kind) for name, kind in PS_METHODS]
    out.append(("/tfgrpc.RawParameterServer/Throughput", "u"))
    return out


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def seeds() -> list[bytes]:
    """Valid messages of every kind the servers parse: where mutations start."""
    job = service_pb2.PSJob(
        job_id=1,
        task=0,
        workers=1,
        shards=[service_pb2.ShardSpec(tensor="w", offset=0, nbytes=64)],
        learning_rate=0.1,
        init=1,
        warmup_steps=0,
        steps=2,
        warmup_seconds=1.0,
        max_seconds=1.0,
        barrier_timeout_seconds=0.5,
    )
    return [
        codec.encode_tensor(bytes(64), "float32", (16,)),
        codec.encode_chunk(codec.encode_tensor(bytes(16), "uint8", (16,))),
        codec.encode_pull_request(64, "float32", 16),
        job.SerializeToString(),
        service_pb2.WeightChunk(step=0, worker=0, measured=True).SerializeToString(),
        service_pb2.WeightChunk(shard=0, offset=0, data=bytes(64)).SerializeToString(),
        service_pb2.PullWeightsRequest(step=0, worker=0, chunk_bytes=16).SerializeToString(),
        b"",
    ]


def hostile(rng: random.Random) -> bytes:
    """A short message of one to three fields, one of them with an extreme length or value
    (lengths near 2^64, sizes of gigabytes and terabytes, negative int64s)."""
    out = bytearray(bytes([8, 1]) if rng.random() < 0.5 else b"")
    for _ in range(rng.randrange(1, 4)):
        number = rng.choice([1, 1, 2, 3, 4, 4, 5, 6, 9, 15])
        wire = rng.choice([0, 0, 2, 2, 2, 1, 5, 3, 7])
        value = rng.choice(
            [2**64 - 1, 2**64 - 11, 2**63, 2**40, 2**34, 2**31, 2**32 - 1, 1 << rng.randrange(64)]
        )
        out += _varint(number << 3 | wire) + _varint(value)
    return bytes(out + rng.randbytes(rng.randrange(4)))


def mutate(data: bytes, rng: random.Random) -> bytes:
    """One to four edits: flip a bit, set a byte, insert, delete, truncate, splice a varint."""
    out = bytearray(data)
    for _ in range(rng.randrange(1, 5)):
        op = rng.randrange(6)
        at = rng.randrange(len(out) + 1)
        if op == 0 and out:
            out[at % len(out)] ^= 1 << rng.randrange(8)
        elif op == 1 and out:
            out[at % len(out)] = rng.choice([0x00, 0x7F, 0x80, 0xFF, rng.randrange(256)])
        elif op == 2:
            out[at:at] = rng.randbytes(rng.randrange(1, 8))
        elif op == 3 and out:
            del out[at : at + rng.randrange(1, 8)]
        elif op == 4:
            del out[at:]
        else:
            out[at:at] = _varint(rng.choice([2**64 - 1, 2**63, 2**40, 1 << rng.randrange(64)]))
    return bytes(out)


def payload(rng: random.Random, pool: list[bytes]) -> bytes:
    pick = rng.random()
    if pick < 0.15:
        return rng.randbytes(rng.randrange(64))
    if pick < 0.45:
        return hostile(rng)
    return mutate(rng.choice(pool), rng)


@dataclass
class FuzzReport:
    """What a run sent and how the server answered: calls by status code, and failures."""

    calls: int = 0
    codes: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    peak_rss_kib: int = 0
    seconds: float = 0.0


def peak_rss_kib(pid: int) -> int:
    """The process's peak resident memory (VmHWM), KiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmHWM for pid {pid}")


def _call(
    channel: grpc.Channel,
    path: str,
    kind: str,
    messages: list[bytes],
    meta: tuple[tuple[str, str], ...],
    timeout: float,
) -> str:
    """One call; returns its status code name. Streamed replies: at most 8 are read."""
    try:
        if kind == "u":
            channel.unary_unary(path)(messages[0], timeout=timeout, metadata=meta)
        elif kind == "su":
            channel.stream_unary(path)(iter(messages), timeout=timeout, metadata=meta)
        else:
            if kind == "us":
                call = channel.unary_stream(path)(messages[0], timeout=timeout, metadata=meta)
            else:
                call = channel.stream_stream(path)(iter(messages), timeout=timeout, metadata=meta)
            for count, _ in enumerate(call):
                if count >= 8:
                    call.cancel()
                    return "OK"
        return "OK"
    except grpc.RpcError as error:
        code = error.code()
        return code.name if code is not None else "UNKNOWN"


def fuzz(
    target: str,
    pid: int,
    token: str,
    *,
    seed: int,
    calls: int,
    seconds: float,
    call_timeout: float = 1.0,
) -> FuzzReport:
    """Up to ``calls`` fuzzed calls (none started after ``seconds``) to the server at
    ``target`` (process ``pid``), then a Status call that must answer."""
    rng = random.Random(seed)
    pool = seeds()
    paths = methods()
    report = FuzzReport()
    start = time.monotonic()
    channel = grpc.insecure_channel(target, options=grpc_settings.CHANNEL_OPTIONS)
    try:
        for _ in range(calls):
            if time.monotonic() - start > seconds:
                break
            path, kind = rng.choice(paths)
            count = 1 if kind in ("u", "us") else rng.randrange(0, 6)
            messages = [payload(rng, pool) for _ in range(max(count, 1))][: max(count, 1)]
            if kind in ("su", "ss") and count == 0:
                messages = []
            meta: list[tuple[str, str]] = []
            if "ParameterServer" in path and rng.random() < 0.9:
                meta.append((TOKEN_KEY, token))
            if path.endswith("/PushStream"):
                meta.append(
                    (
                        grpc_settings.MESSAGE_BYTES_KEY,
                        rng.choice(["64", "16", "0", "-1", "x", str(2**63), str(2**40), "1"]),
                    )
                )
            if path.endswith("Throughput") and rng.random() < 0.5:
                meta.append(("x-tfgrpc-phase", "measure"))
            if not messages and kind in ("u", "us"):
                messages = [b""]
            began = time.monotonic()
            code = _call(channel, path, kind, messages, tuple(meta), call_timeout)
            report.calls += 1
            report.codes[code] += 1
            took = time.monotonic() - began
            if code == "UNAVAILABLE" or took > call_timeout + 1.0:
                report.failures.append(f"{path}: {code} after {took:.1f} s ({messages[:2]!r})")
                break
        try:
            channel.unary_unary("/tfgrpc.RawTensorService/Status")(b"", timeout=5.0)
        except grpc.RpcError as error:
            report.failures.append(f"Status after fuzzing: {error.code()} {error.details()}")
        report.peak_rss_kib = peak_rss_kib(pid)
    finally:
        channel.close()
        report.seconds = time.monotonic() - start
    return report
