"""The worker protocol (protos/tfgrpc/worker.proto): framing, round trips and refusals."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from pytest_tfgrpc.ps import jobs

THROUGHPUT = jobs.ThroughputJob(
    targets=("127.0.0.1:1", "127.0.0.1:2"),
    worker=1,
    mode="protobuf",
    payload_bytes=(64, 1 << 20),
    iterations=200,
    warmup=10,
    warmup_seconds=2.0,
    seconds=5.0,
)
SYNC = jobs.SyncSGDJob(
    targets=("127.0.0.1:1", "[::1]:2"),
    worker=0,
    shards=[
        jobs.OwnedShards(
            shards=[jobs.Shard(offset=0, nbytes=4096), jobs.Shard(offset=4096, nbytes=64)]
        ),
        jobs.OwnedShards(),
    ],
    chunk_bytes=1024,
    warmup=2,
    max_steps=23,
    barrier_timeout=30.0,
    check=True,
)


def _body(data: bytes) -> bytes:
    frames = jobs.Frames()
    frames.feed(data)
    body = frames.take()
    assert body is not None and frames.pending == 0
    return body


@pytest.mark.parametrize("message", [THROUGHPUT, SYNC, jobs.Go(go=True), jobs.Go(go=False)])
def test_driver_messages_round_trip_framed(message: Any) -> None:
    assert jobs.job_of(_body(jobs.frame(jobs.to_worker(message)))) == message


@pytest.mark.parametrize(
    "message", [jobs.Hello(pid=1234), jobs.Ready(), jobs.WorkerFailed(error="boom")]
)
def test_worker_messages_round_trip_framed(message: Any) -> None:
    assert jobs.reply_of(_body(jobs.frame(jobs.from_worker(message)))) == message


def test_frames_come_whole_from_any_split_of_the_stream() -> None:
    stream = b"".join(
        jobs.frame(jobs.from_worker(m))
        for m in (jobs.Hello(pid=7), jobs.Ready(), jobs.WorkerFailed(error="x" * 300))
    )
    frames = jobs.Frames()
    got = []
    for byte in stream:  # one byte at a time: the worst split a pipe can make
        frames.feed(bytes([byte]))
        while (body := frames.take()) is not None:
            got.append(jobs.reply_of(body))
    assert got == [jobs.Hello(pid=7), jobs.Ready(), jobs.WorkerFailed(error="x" * 300)]
    assert frames.pending == 0


def test_sync_job_knows_the_bytes_each_ps_owns() -> None:
    assert jobs.owned_bytes(SYNC) == (4160, 0)


def test_replies_carry_samples_as_packed_int64() -> None:
    big = [2**40 + 7, 1, 0, 123_456_789]
    reply = jobs.ThroughputReply(
        samples=[jobs.Samples(ns=big), jobs.Samples()],
        elapsed_ns=10,
        cpu_user_ns=5,
        cpu_system_ns=0,
    )
    body = _body(jobs.frame(jobs.from_worker(reply)))
    # packed: tag and length once, then a varint per sample (not a tag per sample)
    assert len(body) < 4 * len(big) + 32
    back = jobs.reply_of(body)
    assert isinstance(back, jobs.ThroughputReply)
    arrays = [jobs.samples(s.ns) for s in back.samples]
    assert [list(a) for a in arrays] == [big, []]
    assert arrays[0].dtype == np.int64 and not arrays[0].flags.writeable
    step = jobs.reply_of(
        _body(jobs.frame(jobs.from_worker(jobs.SyncSGDReply(samples_ns=big, steps=9))))
    )
    assert isinstance(step, jobs.SyncSGDReply)
    assert list(step.samples_ns) == big and step.steps == 9


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"\xff\xff", "not a worker message"),
        (b"", "an empty worker message"),
        (jobs.from_worker(jobs.Hello(pid=0)).SerializeToString(), r"pid=0: expected a whole"),
        (jobs.from_worker(jobs.WorkerFailed()).SerializeToString(), "error='': a failure"),
        (
            jobs.from_worker(jobs.SyncSGDReply(samples_ns=[5, -1], steps=2)).SerializeToString(),
            "negative",
        ),
        (
            jobs.from_worker(jobs.SyncSGDReply(samples_ns=[1, 2], steps=1)).SerializeToString(),
            "steps=1: fewer than its 2 samples",
        ),
        (
            jobs.from_worker(jobs.ThroughputReply(elapsed_ns=0)).SerializeToString(),
            "elapsed_ns=0",
        ),
    ],
)
def test_reply_of_refuses_what_is_not_a_message(body: bytes, match: str) -> None:
    with pytest.raises(jobs.MessageError, match=match):
        jobs.reply_of(body)


def test_a_stream_that_is_not_framed_is_refused() -> None:
    frames = jobs.Frames()
    frames.feed(b"\xff" * 11)
    with pytest.raises(jobs.MessageError, match="not framed"):
        frames.take()
    frames = jobs.Frames()
    frames.feed(jobs.frame(jobs.to_worker(jobs.Go(go=True)))[:1] and b"\x80\x80\x80\x80\x08")
    with pytest.raises(jobs.MessageError, match="over"):
        frames.take()


def _changed(job: Any, **change: Any) -> bytes:
    copy = type(job)()
    copy.CopyFrom(job)
    for name, value in change.items():
        if isinstance(value, list):
            copy.ClearField(name)
            getattr(copy, name).extend(value)
        else:
            setattr(copy, name, value)
    body: bytes = jobs.to_worker(copy).SerializeToString()
    return body


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"targets": []}, r"targets=\[\]: expected a non-empty list"),
        ({"mode": "json"}, "mode='json': expected one of raw, protobuf"),
        ({"payload_bytes": [64]}, "1 sizes for 2 targets"),
        ({"iterations": 0}, "iterations=0"),
        ({"seconds": float("nan")}, "seconds=nan: expected a finite"),
        ({"warmup_seconds": float("inf")}, "warmup_seconds=inf"),
    ],
)
def test_throughput_jobs_are_checked(change: dict[str, Any], match: str) -> None:
    with pytest.raises(jobs.MessageError, match=match):
        jobs.job_of(_changed(THROUGHPUT, **change))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"shards": [jobs.OwnedShards()]}, "1 lists of shards for 2 targets"),
        ({"chunk_bytes": 0}, "chunk_bytes=0"),
        ({"max_steps": 0}, "max_steps=0"),
        ({"barrier_timeout": 0.0}, "barrier_timeout=0"),
    ],
)
def test_sync_jobs_are_checked(change: dict[str, Any], match: str) -> None:
    with pytest.raises(jobs.MessageError, match=match):
        jobs.job_of(_changed(SYNC, **change))


def test_an_empty_driver_message_is_refused() -> None:
    with pytest.raises(jobs.MessageError, match="no job, no go"):
        jobs.job_of(b"")


def test_bench_imports_no_worker_entry_module() -> None:
    from pathlib import Path

    import pytest_tfgrpc.bench as bench

    for path in Path(bench.__file__).parent.glob("*.py"):
        assert "ps.worker" not in path.read_text(), path.name


def test_bytes_outside_the_protocol_are_a_cluster_error_naming_the_worker() -> None:
    from pytest_tfgrpc.ps.ps_cluster import ClusterError, WorkerProcess

    worker = WorkerProcess(3)
    try:
        worker._frames.feed(b"\x02\xff\xff" + jobs.frame(jobs.from_worker(jobs.Ready())))
        with pytest.raises(ClusterError, match=r"PS worker 3 wrote not a worker message"):
            worker.take_message()
        assert worker.take_message() == jobs.Ready()
        assert worker.take_message() is None
    finally:
        worker.stop()


def test_a_worker_answers_a_bad_job_with_a_typed_failure() -> None:
    from pytest_tfgrpc.ps.ps_cluster import WorkerProcess

    worker = WorkerProcess(0)
    try:
        deadline = time.monotonic() + 60
        message = None
        while message is None and time.monotonic() < deadline:
            assert worker.read_more()
            message = worker.take_message()
        assert message == jobs.Hello(pid=worker.pid)
        worker._proc.stdin.write(jobs.frame(jobs.to_worker(jobs.SyncSGDJob())))
        worker._proc.stdin.flush()
        message = None
        while message is None and time.monotonic() < deadline:
            assert worker.read_more()
            message = worker.take_message()
        assert isinstance(message, jobs.WorkerFailed)
        assert message.error.startswith("bad job: targets=[]")
    finally:
        worker.stop()
