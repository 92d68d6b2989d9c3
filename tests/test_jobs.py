"""The typed messages between the PS cluster driver and its workers: round trips and refusals."""

from __future__ import annotations

import json
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
    shards=(((0, 4096), (4096, 64)), ()),
    chunk_bytes=1024,
    warmup=2,
    max_steps=23,
    barrier_timeout=30.0,
    check=True,
)


@pytest.mark.parametrize(
    "message",
    [
        THROUGHPUT,
        SYNC,
        jobs.Go(True),
        jobs.Go(False),
        jobs.Hello(1234),
        jobs.Ready(),
        jobs.WorkerFailed("boom"),
    ],
)
def test_messages_round_trip_on_one_line(message: Any) -> None:
    line = jobs.encode(message)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert jobs.decode(line) == message


def test_sync_job_knows_the_bytes_each_ps_owns() -> None:
    assert SYNC.owned_bytes == (4160, 0)


def test_replies_carry_samples_as_packed_int64() -> None:
    big = [2**40 + 7, 1, 0, 123_456_789]
    reply = jobs.ThroughputReply(
        samples_ns=(np.array(big, dtype=np.int64), np.array([], dtype=np.int64)),
        elapsed_ns=10,
        cpu_user_ns=5,
        cpu_system_ns=0,
    )
    line = jobs.encode(reply)
    raw = json.loads(line)
    assert all(isinstance(s, str) for s in raw["samples_ns"])  # not JSON lists
    back = jobs.decode(line, jobs.ThroughputReply)
    assert [list(s) for s in back.samples_ns] == [big, []]
    assert back.samples_ns[0].dtype == np.int64 and not back.samples_ns[0].flags.writeable
    step = jobs.decode(jobs.encode(jobs.SyncSGDReply(np.array(big), 9, 1, 2)), jobs.SyncSGDReply)
    assert list(step.samples_ns) == big and step.steps == 9


def test_packed_samples_are_eight_bytes_each() -> None:
    samples = np.arange(1000, dtype=np.int64) * 1_000_003
    assert len(jobs.pack_samples(samples)) == 8 * 1000 * 4 // 3 + 4 - (8000 * 4 // 3) % 4
    assert len(jobs.pack_samples(samples)) < len(json.dumps(samples.tolist()))
    assert list(jobs.unpack_samples(jobs.pack_samples(samples))) == samples.tolist()


@pytest.mark.parametrize(
    ("line", "match"),
    [
        (b"not json", "not a JSON line"),
        (b"[1, 2]", "no 'kind'"),
        (b'{"kind": "teleport"}', "kind='teleport': expected one of"),
        (b'{"kind": "hello", "pid": 0}', r"pid=0: expected a whole number >= 1"),
        (b'{"kind": "hello", "pid": true}', "pid=True"),
        (b'{"kind": "hello"}', "hello: .*pid"),
        (b'{"kind": "hello", "pid": 3, "extra": 1}', "unknown field 'extra'"),
        (b'{"kind": "go", "go": "yes"}', "go='yes': expected true or false"),
        (b'{"kind": "error", "error": ""}', "error='': expected a non-empty string"),
        (
            b'{"kind": "sync_sgd_result", "samples_ns": "!!", "steps": 1,'
            b' "cpu_user_ns": 0, "cpu_system_ns": 0}',
            "samples: not base64",
        ),
        (
            b'{"kind": "sync_sgd_result", "samples_ns": "AAAA", "steps": 1,'
            b' "cpu_user_ns": 0, "cpu_system_ns": 0}',
            "not a whole number of int64",
        ),
        (
            b'{"kind": "sync_sgd_result", "samples_ns": "", "steps": 1,'
            b' "cpu_user_ns": -1, "cpu_system_ns": 0}',
            "cpu_user_ns=-1",
        ),
        (
            b'{"kind": "throughput_result", "samples_ns": "", "elapsed_ns": 1,'
            b' "cpu_user_ns": 0, "cpu_system_ns": 0}',
            "expected a list, one per PS",
        ),
    ],
)
def test_decode_refuses_what_is_not_a_message(line: bytes, match: str) -> None:
    with pytest.raises(jobs.MessageError, match=match):
        jobs.decode(line)


def test_negative_samples_are_refused() -> None:
    with pytest.raises(jobs.MessageError, match="negative"):
        jobs.unpack_samples(jobs.pack_samples(np.array([5, -1], dtype=np.int64)))


def test_a_reply_counts_no_fewer_steps_than_samples() -> None:
    with pytest.raises(jobs.MessageError, match="steps=1"):
        jobs.SyncSGDReply(np.array([1, 2], dtype=np.int64), 1, 0, 0)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"targets": ()}, "targets=\\(\\): expected a non-empty list"),
        ({"mode": "json"}, "mode='json': expected one of raw, protobuf"),
        ({"payload_bytes": (64,)}, "1 sizes for 2 targets"),
        ({"payload_bytes": (64, -1)}, "payload_bytes\\[\\]=-1"),
        ({"iterations": 0}, "iterations=0"),
        ({"seconds": float("nan")}, "seconds=nan: expected a finite"),
        ({"warmup_seconds": float("inf")}, "warmup_seconds=inf"),
    ],
)
def test_throughput_jobs_validate_their_fields(change: dict[str, Any], match: str) -> None:
    fields = {**THROUGHPUT.__dict__, **change}
    with pytest.raises(jobs.MessageError, match=match):
        jobs.ThroughputJob(**fields)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"shards": (((0, 4),),)}, "1 lists of shards for 2 targets"),
        ({"shards": (((0, 4, 5),), ())}, "is not \\(offset, nbytes\\)"),
        ({"shards": (((-4, 4),), ())}, "shard offset=-4"),
        ({"chunk_bytes": 0}, "chunk_bytes=0"),
        ({"max_steps": 0}, "max_steps=0"),
        ({"barrier_timeout": 0}, "barrier_timeout=0"),
        ({"check": 1}, "check=1: expected true or false"),
    ],
)
def test_sync_jobs_validate_their_fields(change: dict[str, Any], match: str) -> None:
    fields = {**SYNC.__dict__, **change}
    with pytest.raises(jobs.MessageError, match=match):
        jobs.SyncSGDJob(**fields)


def test_decode_can_insist_on_a_kind() -> None:
    with pytest.raises(jobs.MessageError, match="a 'ready' message where 'hello' was expected"):
        jobs.decode(jobs.encode(jobs.Ready()), jobs.Hello)
    assert jobs.decode(jobs.encode(jobs.Go(True)), (jobs.SyncSGDJob, jobs.Go)) == jobs.Go(True)


def test_bench_imports_no_worker_entry_module() -> None:
    from pathlib import Path

    import pytest_tfgrpc.bench as bench

    for path in Path(bench.__file__).parent.glob("*.py"):
        assert "ps.worker" not in path.read_text(), path.name


def test_a_line_outside_the_protocol_is_a_cluster_error_naming_the_worker() -> None:
    from pytest_tfgrpc.ps.ps_cluster import ClusterError, WorkerProcess

    worker = WorkerProcess(3)
    try:
        worker._buffer = b'{"hello": 12}\n' + jobs.encode(jobs.Ready())
        with pytest.raises(ClusterError, match=r"PS worker 3 wrote not a message \(no 'kind'\)"):
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
        assert message == jobs.Hello(worker.pid)
        worker._proc.stdin.write(b'{"kind": "sync_sgd", "targets": []}\n')
        worker._proc.stdin.flush()
        message = None
        while message is None and time.monotonic() < deadline:
            assert worker.read_more()
            message = worker.take_message()
        assert isinstance(message, jobs.WorkerFailed)
        assert message.error.startswith("bad job: ")
    finally:
        worker.stop()
