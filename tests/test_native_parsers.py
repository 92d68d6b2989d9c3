"""The native server's parsers and limits against hostile bytes (issue 25's cases and their
kind), and a bounded fuzzing run of every method of every service, native and Python.

Each case is a real server process and a raw gRPC generic call; after each the server must
still answer, and its peak memory stays bounded. The longer fuzzing run is
``scripts/fuzz_servers.py`` (output in ``benchmarks/results/fuzz_servers.txt``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import grpc
import pytest
from fuzz_wire import fuzz, peak_rss_kib

from pytest_tfgrpc import native
from pytest_tfgrpc.roles.native_server import start_native_server
from pytest_tfgrpc.roles.processes import ServerProcess
from pytest_tfgrpc.wire import codec, grpc_settings
from pytest_tfgrpc.wire._proto import service_pb2
from pytest_tfgrpc.wire.fabric import Fabric, resolve_fabric
from pytest_tfgrpc.wire.security import TOKEN_ENV, TOKEN_KEY

NOT_BUILT = native.unavailable_reason()
pytestmark = pytest.mark.skipif(NOT_BUILT is not None, reason=NOT_BUILT or "")

TOKEN = "parsers-token"
LIMIT = 1 << 20
Metadata = tuple[tuple[str, str], ...]
AUTH: Metadata = ((TOKEN_KEY, TOKEN),)


def varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@pytest.fixture(scope="module")
def lo() -> Fabric:
    return resolve_fabric("lo")


def _start(engine: str, lo: Fabric) -> ServerProcess:
    env = {**os.environ, TOKEN_ENV: TOKEN}
    if engine == "native":
        return start_native_server(lo, env=env, max_tensor_bytes=LIMIT)
    return ServerProcess.start(lo, env=env, max_tensor_bytes=LIMIT)


@pytest.fixture(scope="module")
def server(lo: Fabric) -> Iterator[ServerProcess]:
    started = _start("native", lo)
    yield started
    started.stop()


@pytest.fixture(scope="module")
def channel(server: ServerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.target, options=grpc_settings.CHANNEL_OPTIONS) as opened:
        yield opened


def _status(channel: grpc.Channel, path: str, request: bytes, metadata: Metadata = ()) -> str:
    try:
        channel.unary_unary(path)(request, timeout=5.0, metadata=metadata)
    except grpc.RpcError as error:
        return f"{error.code().name}: {error.details()}"
    return "OK"


def _still_answers(channel: grpc.Channel) -> None:
    reply = channel.unary_unary("/tfgrpc.RawTensorService/Status")(b"", timeout=5.0)
    assert service_pb2.ServerStatus.FromString(reply).pid > 0


# (what, path, request bytes, metadata, the status the server answers with)
HOSTILE = [
    # issue 25: 11 bytes whose one field claims 2^64 - 11 bytes (the reader's position wrapped)
    (
        "a field length of 2^64-11",
        "/tfgrpc.TensorService/Echo",
        b"\x1a" + varint(2**64 - 11),
        (),
        "INVALID_ARGUMENT",
    ),
    (
        "content of 2^64-11 bytes",
        "/tfgrpc.TensorService/Echo",
        b"\x08\x01\x22" + varint(2**64 - 11),
        (),
        "INVALID_ARGUMENT",
    ),
    (
        "a shape of 2^64-3 bytes",
        "/tfgrpc.TensorService/Push",
        b"\x08\x01\x12" + varint(2**64 - 3),
        (),
        "INVALID_ARGUMENT",
    ),
    (
        "a fixed64 past the end",
        "/tfgrpc.TensorService/Push",
        b"\x08\x01\x19\x01",
        (),
        "INVALID_ARGUMENT",
    ),
    (
        "a varint that never ends",
        "/tfgrpc.TensorService/Echo",
        b"\x08" + b"\xff" * 12,
        (),
        "INVALID_ARGUMENT",
    ),
    # issue 25: a 7-byte PullRequest for 1 TiB (std::bad_alloc), and over the test's limit
    (
        "a pull of 1 TiB",
        "/tfgrpc.TensorService/Pull",
        b"\x08" + varint(2**40),
        (),
        "RESOURCE_EXHAUSTED: a pull of 1099511627776 B refused",
    ),
    (
        "a pull of 2^63-1 B",
        "/tfgrpc.RawTensorService/PullStream",
        b"\x08" + varint(2**63 - 1),
        (),
        "RESOURCE_EXHAUSTED",
    ),
    (
        "a pull over the limit",
        "/tfgrpc.RawTensorService/Pull",
        b"\x08" + varint(LIMIT + 1),
        (),
        f"RESOURCE_EXHAUSTED: a pull of {LIMIT + 1} B refused",
    ),
    (
        "a negative pull",
        "/tfgrpc.TensorService/Pull",
        b"\x08" + varint(2**64 - 1),
        (),
        "INVALID_ARGUMENT",
    ),
    (
        "an echo over the limit",
        "/tfgrpc.RawTensorService/Echo",
        bytes(LIMIT + 1),
        (),
        "RESOURCE_EXHAUSTED",
    ),
    # the PS service: the token before anything, then its parsers and limits
    (
        "a PS call without the token",
        "/tfgrpc.ParameterServer/Configure",
        b"\x08\x01",
        (),
        "UNAUTHENTICATED",
    ),
    (
        "a raw Throughput without the token",
        "/tfgrpc.RawParameterServer/Throughput",
        b"x",
        (),
        "UNAUTHENTICATED",
    ),
    (
        "a wrong token",
        "/tfgrpc.ParameterServer/JobStats",
        b"",
        ((TOKEN_KEY, TOKEN + "x"),),
        "UNAUTHENTICATED: the PS service needs the token",
    ),
    (
        "a shard of 2^64-11 bytes",
        "/tfgrpc.ParameterServer/Configure",
        b"\x18\x01\x22" + varint(2**64 - 11),
        AUTH,
        "INVALID_ARGUMENT",
    ),
    (
        "shards over the limit",
        "/tfgrpc.ParameterServer/Configure",
        service_pb2.PSJob(
            workers=1, shards=[service_pb2.ShardSpec(nbytes=LIMIT + 4)]
        ).SerializeToString(),
        AUTH,
        "RESOURCE_EXHAUSTED",
    ),
    (
        "a Throughput payload over the limit",
        "/tfgrpc.RawParameterServer/Throughput",
        bytes(LIMIT + 1),
        AUTH,
        "RESOURCE_EXHAUSTED",
    ),
]


@pytest.mark.parametrize(
    ("path", "request_bytes", "metadata", "expected"),
    [case[1:] for case in HOSTILE],
    ids=[case[0] for case in HOSTILE],
)
def test_hostile_bytes_are_refused_and_the_server_answers_on(
    channel: grpc.Channel, path: str, request_bytes: bytes, metadata: Metadata, expected: str
) -> None:
    assert _status(channel, path, request_bytes, metadata).startswith(expected)
    _still_answers(channel)


def test_a_push_announced_over_the_limit_is_refused(channel: grpc.Channel) -> None:
    call = channel.stream_stream("/tfgrpc.RawTensorService/PushStream")
    meta = ((grpc_settings.MESSAGE_BYTES_KEY, str(2**40)),)
    with pytest.raises(grpc.RpcError) as caught:
        list(call(iter([b"x" * 1024]), timeout=5.0, metadata=meta))
    assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    _still_answers(channel)


def test_a_pull_in_small_slices_costs_no_memory_per_slice(
    channel: grpc.Channel, server: ServerProcess
) -> None:
    # issue 25: 4 MiB in 1-byte slices cost 1.4 GB (every slice was made before the first
    # went). Slices are now cut as they are written, and none is smaller than 64 B.
    before = peak_rss_kib(server.pid)
    request = codec.encode_pull_request(LIMIT, "uint8", 64)
    call = channel.unary_stream("/tfgrpc.RawTensorService/PullStream")(request, timeout=30.0)
    got = sum(len(piece) for piece in call)
    assert got == LIMIT
    _still_answers(channel)
    # The 1 MiB tensor and gRPC's buffers; 16384 slices made up front cost ~6 MB more.
    assert peak_rss_kib(server.pid) - before < 4 * 1024


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/tfgrpc.RawTensorService/PullStream", codec.encode_pull_request(LIMIT, "uint8", 1)),
        (
            "/tfgrpc.ParameterServer/PullWeights",
            service_pb2.PullWeightsRequest(step=-1, chunk_bytes=63).SerializeToString(),
        ),
    ],
    ids=["PullStream", "PullWeights"],
)
def test_slices_under_64_bytes_are_refused(channel: grpc.Channel, path: str, body: bytes) -> None:
    call = channel.unary_stream(path)(body, timeout=5.0, metadata=AUTH)
    with pytest.raises(grpc.RpcError) as caught:
        list(call)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "slices of at least 64 B" in caught.value.details()


@pytest.mark.parametrize("engine", ["native", "grpcio"])
def test_fuzzed_bytes_leave_every_server_answering(lo: Fabric, engine: str) -> None:
    started = _start(engine, lo)
    try:
        report = fuzz(started.target, started.pid, TOKEN, seed=2025, calls=400, seconds=4.0)
        assert started.poll() is None, f"the {engine} server died: {started.stderr_tail(5)}"
    finally:
        started.stop()
    assert not report.failures, report.failures
    assert report.calls >= 100, report
    # Every malformed request is refused with a named status, never a handler's exception.
    assert report.codes["UNKNOWN"] == 0, report.codes
    # Every request is bounded by LIMIT (1 MiB): a few of them alive at once, never 100s of MB.
    assert report.peak_rss_kib < 256 * 1024, report
