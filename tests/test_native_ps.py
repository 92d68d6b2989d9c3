"""The native PS task's service, call by call: the job token on every call, pushes validated
whole before they touch the aggregate, the step barrier, the update, and errors that tell a
caller nothing about the job's step. Real processes, raw gRPC calls.

The same calls from the plugin's workers (Python and native, against Python and native PS
tasks) are in ``tests/test_native_workers.py``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from pytest_tfgrpc import native
from pytest_tfgrpc.roles.native_server import start_native_server
from pytest_tfgrpc.roles.parameter_server import (
    INIT_INDEX,
    NEXT_PHASE_KEY,
    apply_update,
    check_gradient,
    initial_weights,
    method,
)
from pytest_tfgrpc.roles.processes import ServerProcess
from pytest_tfgrpc.wire._proto import service_pb2
from pytest_tfgrpc.wire.fabric import resolve_fabric
from pytest_tfgrpc.wire.security import TOKEN_ENV, TOKEN_KEY

NOT_BUILT = native.unavailable_reason()
pytestmark = pytest.mark.skipif(NOT_BUILT is not None, reason=NOT_BUILT or "")

TOKEN = "native-ps-token"
Metadata = tuple[tuple[str, str], ...]
AUTH: Metadata = ((TOKEN_KEY, TOKEN),)
SHARDS = ((0, 256), (1024, 100))  # (tensor offset, bytes) of the two shards this PS owns
OWNED = sum(n for _, n in SHARDS)


@pytest.fixture(scope="module")
def ps() -> Iterator[ServerProcess]:
    lo = resolve_fabric("lo")
    started = start_native_server(lo, env={**os.environ, TOKEN_ENV: TOKEN}, threads=2)
    yield started
    started.stop()


@pytest.fixture
def channel(ps: ServerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(ps.target) as opened:
        yield opened


def _configure(
    channel: grpc.Channel, workers: int = 2, steps: int = 5, timeout: float = 5.0
) -> None:
    job = service_pb2.PSJob(
        job_id=7,
        task=0,
        workers=workers,
        shards=[service_pb2.ShardSpec(tensor="w", offset=o, nbytes=n) for o, n in SHARDS],
        learning_rate=0.5,
        init=INIT_INDEX,
        warmup_steps=0,
        steps=steps,
        warmup_seconds=10.0,
        max_seconds=60.0,
        barrier_timeout_seconds=timeout,
    )
    call = channel.unary_unary(
        method("Configure"),
        request_serializer=service_pb2.PSJob.SerializeToString,
        response_deserializer=service_pb2.PSJobStats.FromString,
    )
    stats = call(job, timeout=5.0, metadata=AUTH)
    assert (stats.job_id, stats.steps) == (7, 0)


def _chunks(worker: int, step: int, chunk: int = 16) -> list[service_pb2.WeightChunk]:
    out = [service_pb2.WeightChunk(step=step, worker=worker, measured=True)]
    for shard, (offset, nbytes) in enumerate(SHARDS):
        data = check_gradient(worker, step, offset, nbytes).tobytes()
        out += [
            service_pb2.WeightChunk(shard=shard, offset=at, data=data[at : at + chunk])
            for at in range(0, nbytes, chunk)
        ]
    return out


def _push(
    channel: grpc.Channel, chunks: list[service_pb2.WeightChunk], metadata: Metadata = AUTH
) -> service_pb2.Ack:
    call = channel.stream_unary(
        method("PushGradients"),
        request_serializer=service_pb2.WeightChunk.SerializeToString,
        response_deserializer=service_pb2.Ack.FromString,
    )
    ack: service_pb2.Ack = call(iter(chunks), timeout=10.0, metadata=metadata)
    return ack


def _pull(
    channel: grpc.Channel, step: int, chunk: int = 64
) -> tuple[list[np.ndarray], dict[str, str]]:
    call = channel.unary_stream(
        method("PullWeights"),
        request_serializer=service_pb2.PullWeightsRequest.SerializeToString,
        response_deserializer=service_pb2.WeightChunk.FromString,
    )
    reply = call(
        service_pb2.PullWeightsRequest(step=step, measured=True, chunk_bytes=chunk),
        timeout=10.0,
        metadata=AUTH,
    )
    data = [bytearray() for _ in SHARDS]
    for piece in reply:
        assert piece.offset == len(data[piece.shard])
        data[piece.shard] += piece.data
    trailing = {k: str(v) for k, v in (reply.trailing_metadata() or ())}
    return [np.frombuffer(bytes(d), dtype=np.float32) for d in data], trailing


def _expected(steps: int, workers: int = 2) -> list[np.ndarray]:
    out = []
    for offset, nbytes in SHARDS:
        weights = initial_weights(offset, nbytes, INIT_INDEX)
        for step in range(steps):
            total = sum(check_gradient(w, step, offset, nbytes) for w in range(workers))
            apply_update(weights, np.asarray(total, dtype=np.float32), 0.5, workers)
        out.append(weights)
    return out


def _code(call: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as caught:
        call()  # type: ignore[operator]
    return caught.value.code(), caught.value.details()


def test_two_workers_two_steps_leave_numpys_weights_and_the_chief_names_the_next_phase(
    channel: grpc.Channel,
) -> None:
    _configure(channel)
    for step in range(2):
        for worker in range(2):
            assert _push(channel, _chunks(worker, step)).bytes_received == OWNED
        weights, trailing = _pull(channel, step)
        assert trailing[NEXT_PHASE_KEY] == "measure"
        for got, want in zip(weights, _expected(step + 1), strict=True):
            np.testing.assert_array_equal(got, want)
    stats = channel.unary_unary(
        method("JobStats"), response_deserializer=service_pb2.PSJobStats.FromString
    )(b"", timeout=5.0, metadata=AUTH)
    assert (stats.steps, stats.measured_steps) == (2, 2)
    assert stats.bytes_in == 4 * OWNED and stats.bytes_out == 2 * OWNED
    assert stats.rpcs == 6 and stats.pid == channel_pid(channel)


def channel_pid(channel: grpc.Channel) -> int:
    reply = channel.unary_unary("/tfgrpc.RawTensorService/Status")(b"", timeout=5.0)
    return int(service_pb2.ServerStatus.FromString(reply).pid)


def test_a_pull_waits_at_the_barrier_until_the_last_worker_pushed(channel: grpc.Channel) -> None:
    _configure(channel)
    _push(channel, _chunks(0, 0))
    pulled: list[list[np.ndarray]] = []
    waiter = threading.Thread(target=lambda: pulled.append(_pull(channel, 0)[0]))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive() and not pulled  # parked at the barrier
    _push(channel, _chunks(1, 0))
    waiter.join(10.0)
    for got, want in zip(pulled[0], _expected(1), strict=True):
        np.testing.assert_array_equal(got, want)


def test_the_barrier_times_out_naming_who_pushed_not_the_job_step(channel: grpc.Channel) -> None:
    _configure(channel, timeout=0.3)
    _push(channel, _chunks(1, 0))
    code, details = _code(lambda: _pull(channel, 0))
    assert code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert details == "step 0: 1 of 2 workers pushed their gradients within 0.3 s"


@pytest.mark.parametrize(
    ("damage", "code"),
    [
        # issue 25: a 4-byte push from a stranger during a check=True step reached the sum
        (lambda c: [*c[:1], service_pb2.WeightChunk(data=b"\x00\x00\x80\x7f")], "INVALID_ARGUMENT"),
        (lambda c: c[:-1], "INVALID_ARGUMENT"),  # a stream that ends early
        (lambda c: c[:1] + c[2:] + c[1:2], "INVALID_ARGUMENT"),  # slices out of order
        (lambda c: [*c, c[-1]], "INVALID_ARGUMENT"),  # a slice twice
        (
            lambda c: [*c[:3], service_pb2.WeightChunk(shard=0, offset=32, data=b"abc")],
            "INVALID_ARGUMENT",
        ),  # not float32-aligned
        (lambda c: [service_pb2.WeightChunk(step=0, worker=9), *c[1:]], "FAILED_PRECONDITION"),
        (lambda c: [service_pb2.WeightChunk(step=5, worker=0), *c[1:]], "FAILED_PRECONDITION"),
        (lambda c: [], "INVALID_ARGUMENT"),
    ],
    ids=[
        "stranger-slice",
        "short",
        "reordered",
        "duplicate",
        "unaligned",
        "worker-9",
        "future-step",
        "empty",
    ],
)
def test_a_bad_push_is_refused_whole_and_never_touches_the_aggregate(
    channel: grpc.Channel, damage: object, code: str
) -> None:
    _configure(channel)
    chunks = damage(_chunks(0, 0))  # type: ignore[operator]
    got, details = _code(lambda: _push(channel, chunks))
    assert got.name == code, details
    assert "PS expects step" not in details and "this PS is at" not in details
    # The worker's real push and the other worker's still make exactly numpy's step.
    _push(channel, _chunks(0, 0))
    _push(channel, _chunks(1, 0))
    for weights, want in zip(_pull(channel, 0)[0], _expected(1), strict=True):
        np.testing.assert_array_equal(weights, want)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (method("Configure"), b""),
        (method("JobStats"), b""),
        (method("Throughput"), b""),
        (method("Throughput", raw=True), b"xyz"),
        (method("PullWeights"), b""),
    ],
)
@pytest.mark.parametrize("token", [None, "wrong"])
def test_every_ps_call_needs_the_token_before_any_work(
    channel: grpc.Channel, path: str, body: bytes, token: str | None
) -> None:
    metadata = () if token is None else ((TOKEN_KEY, token),)
    if path.endswith("PullWeights"):
        call = channel.unary_stream(path)
        code, details = _code(lambda: list(call(body, timeout=5.0, metadata=metadata)))
    else:
        code, details = _code(
            lambda: channel.unary_unary(path)(body, timeout=5.0, metadata=metadata)
        )
    assert code is grpc.StatusCode.UNAUTHENTICATED
    assert details.endswith("the call carried " + ("none" if token is None else "a wrong one"))


def test_a_strangers_push_is_refused_before_it_is_read(channel: grpc.Channel) -> None:
    _configure(channel)
    code, _ = _code(lambda: _push(channel, _chunks(0, 0), metadata=()))
    assert code is grpc.StatusCode.UNAUTHENTICATED
    # The step is untouched: both workers' pushes still make exactly numpy's step.
    _push(channel, _chunks(0, 0))
    _push(channel, _chunks(1, 0))
    for weights, want in zip(_pull(channel, 0)[0], _expected(1), strict=True):
        np.testing.assert_array_equal(weights, want)


def test_a_ps_started_without_a_token_serves_no_ps_call() -> None:
    lo = resolve_fabric("lo")
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    with start_native_server(lo, env=env) as bare, grpc.insecure_channel(bare.target) as opened:
        code, details = _code(
            lambda: opened.unary_unary(method("JobStats"))(b"", timeout=5.0, metadata=AUTH)
        )
    assert code is grpc.StatusCode.PERMISSION_DENIED
    assert "started without a job token (TFGRPC_JOB_TOKEN)" in details
