"""Real PS clusters on 127.0.0.1: PS throughput, sync-SGD steps, correctness and failures."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import numpy as np
import pytest

from pytest_tfgrpc.bench.ps import (
    PSResult,
    fetch_weights,
    ps_throughput,
    sync_sgd_step,
)
from pytest_tfgrpc.bench.timing import RunSpec
from pytest_tfgrpc.model.placement import SHARDINGS, Placement, Topology, place_profile
from pytest_tfgrpc.model.profiles import Profile, TensorSpec, load_profile
from pytest_tfgrpc.ps.jobs import OwnedShards, Shard, SyncSGDJob
from pytest_tfgrpc.ps.ps_cluster import PSCluster
from pytest_tfgrpc.report.budget import Budget, BudgetError, check, parse_budget
from pytest_tfgrpc.report.record import result_properties
from pytest_tfgrpc.roles.parameter_server import apply_update, check_gradient, initial_weights
from pytest_tfgrpc.roles.processes import ServerDied
from pytest_tfgrpc.wire._proto import service_pb2
from pytest_tfgrpc.wire.fabric import Fabric, resolve_fabric

RUN = RunSpec(iterations=30, warmup=3, max_seconds=10.0, warmup_seconds=5.0)
STEPS = RunSpec(iterations=4, warmup=1, max_seconds=20.0, warmup_seconds=10.0)
# Small, with tensors above and below the partitioning threshold used below.
PROFILE = load_profile("hep_cnn").scaled(scale=0.05)


@pytest.fixture(scope="module")
def lo() -> Fabric:
    return resolve_fabric("lo")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is gone if its state says so.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] not in "ZX"
    except FileNotFoundError:
        return False


@pytest.fixture(scope="module")
def cluster(lo: Fabric) -> Iterator[PSCluster]:
    with PSCluster(lo, Topology(ps=2, workers=3, sharding="round_robin")) as started:
        yield started
    assert not any(_alive(pid) for pid in started.pids)


def test_ps_throughput_every_worker_calls_every_ps(cluster: PSCluster) -> None:
    result = ps_throughput(cluster, [64, 64 << 10], run=RUN)
    assert [p.key for p in result.sizes] == ["64B", "64KiB"]
    for point, size in zip(result.sizes, (64, 64 << 10), strict=True):
        # 3 workers x 2 PS x 30 calls, every one counted by its PS.
        assert point.count == 3 * 2 * 30
        assert [load.rpcs for load in point.per_ps] == [90, 90]
        assert [load.bytes_in for load in point.per_ps] == [90 * size, 90 * size]
        assert point.imbalance == 1.0
        rate = point.rate_per_s
        assert rate is not None and rate > 0
        assert point.throughput_Bps == pytest.approx(rate * size)
        assert all(load.cpu.total_ns > 0 for load in point.per_ps)
        assert point.cpu["workers"].total_ns > 0
        assert {load.pid for load in point.per_ps} == {ps.pid for ps in cluster.ps}
    props = dict(result_properties(result))
    recorded = props["tfgrpc.ps_throughput.64KiB.rpc_rate_per_s"]
    assert float(recorded) == pytest.approx(result.sizes[1].rate_per_s, rel=1e-5)
    assert props["tfgrpc.ps_throughput.64B.ps1.bytes_in"] == str(90 * 64)
    assert props["tfgrpc.ps_throughput.64B.samples"] == "180"


def test_ps_throughput_protobuf_and_placed_profile(cluster: PSCluster) -> None:
    placement = place_profile(PROFILE, 2, "round_robin")
    result = ps_throughput(cluster, placement, mode="protobuf", run=RUN, key="hep_cnn")
    point = result.point("hep_cnn")
    expected = [90 * b for b in placement.bytes_per_ps()]
    assert [load.bytes_in for load in point.per_ps] == expected
    assert point.imbalance == pytest.approx(placement.imbalance)
    assert result.placement == placement and result.mode == "protobuf"


def test_sync_sgd_weights_are_the_numpy_sum_of_all_gradients(cluster: PSCluster) -> None:
    profile = Profile("tiny", (TensorSpec("w", (10, 7)), TensorSpec("b", (3,))))
    learning_rate = 0.25
    result = sync_sgd_step(
        cluster, profile, run=STEPS, learning_rate=learning_rate, check=True, chunk_bytes=64
    )
    assert result.placement is not None
    weights = fetch_weights(cluster, result.placement)
    steps = STEPS.warmup + STEPS.iterations
    for spec in profile.tensors:
        expected = initial_weights(0, spec.nbytes, init=1)
        for step in range(steps):
            total = np.sum([check_gradient(w, step, 0, spec.nbytes) for w in range(3)], axis=0)
            apply_update(expected, total, learning_rate, 3)
        np.testing.assert_array_equal(weights[spec.name], expected)
        # The update did something: not the initial weights.
        assert not np.array_equal(weights[spec.name], initial_weights(0, spec.nbytes, init=1))


@pytest.mark.parametrize("sharding", SHARDINGS)
def test_sync_sgd_step_bytes_follow_the_placement(lo: Fabric, sharding: str) -> None:
    with PSCluster(lo, Topology(ps=2, workers=2, sharding=sharding)) as cluster:
        result = sync_sgd_step(cluster, PROFILE, run=STEPS, partition_bytes=4096, check=True)
        placement = place_profile(PROFILE, 2, sharding, partition_bytes=4096)
        assert result.placement == placement
        point = result.sizes[0]
        assert point.count == STEPS.iterations
        for load, placed in zip(point.per_ps, placement.bytes_per_ps(), strict=True):
            assert load.bytes_in == load.bytes_out == placed * 2 * STEPS.iterations
            assert load.steps == STEPS.iterations
        assert point.imbalance == pytest.approx(placement.imbalance)
        assert point.size_bytes == 2 * 2 * PROFILE.total_bytes
        # The final weights are those of the check computation wherever the shards went.
        weights = fetch_weights(cluster, placement)
        assert sorted(weights) == sorted(spec.name for spec in PROFILE.tensors)
        for spec in PROFILE.tensors:
            assert weights[spec.name].nbytes == spec.nbytes
        props = dict(result_properties(result))
        imbalance = props[f"tfgrpc.sync_sgd_step.{point.label}.imbalance"]
        assert float(imbalance) == pytest.approx(point.imbalance, rel=1e-5)
        assert "tfgrpc.sync_sgd_step.hep_cnn-scale_0p05.step_p99_us" in props
        pids = cluster.pids
    assert not any(_alive(pid) for pid in pids)


def _budget(**limits: str) -> Budget:
    return parse_budget(limits)


def test_a_job_can_run_on_the_first_workers_and_one_ps(cluster: PSCluster) -> None:
    chief = service_pb2.PSJob(
        job_id=cluster.next_job_id(),
        task=0,
        workers=1,
        shards=[service_pb2.ShardSpec(tensor="t", nbytes=4096)],
        learning_rate=0.1,
        warmup_steps=1,
        steps=3,
        warmup_seconds=5.0,
        max_seconds=10.0,
        barrier_timeout_seconds=10.0,
    )
    cluster.configure([chief])
    job = SyncSGDJob(
        targets=cluster.targets[:1],
        worker=0,
        shards=[OwnedShards(shards=[Shard(offset=0, nbytes=4096)])],
        chunk_bytes=1024,
        warmup=1,
        max_steps=5,
        barrier_timeout=10.0,
    )
    (reply,) = cluster.run([job], timeout=60.0)
    (stats,) = cluster.job_stats([0])
    assert len(reply.samples_ns) == stats.measured_steps == 3
    assert stats.task == 0 and stats.bytes_in == stats.bytes_out == 3 * 4096
    with pytest.raises(ValueError, match="task 2: the cluster has PS tasks 0-1"):
        cluster.job_stats([2])
    with pytest.raises(ValueError, match="0 jobs for 3 workers"):
        cluster.run([], timeout=1.0)


def test_budgets_read_ps_results(cluster: PSCluster) -> None:
    result = sync_sgd_step(cluster, PROFILE, run=STEPS)
    assert isinstance(result, PSResult)
    point = result.sizes[0]
    assert check(_budget(imbalance=f"<={point.imbalance}"), result) == ()
    breaches = check(_budget(imbalance="<=0.5", step_p50="1ns"), result)
    assert {b.metric for b in breaches} == {"imbalance", "step_p50"}
    with pytest.raises(BudgetError, match="reports no figure 'p99'"):
        check(_budget(p99="1s"), result)
    rates = ps_throughput(cluster, [64], run=RUN)
    assert check(_budget(rpc_rate=">=1"), rates) == ()
    assert len(check(_budget(rpc_rate=">=1e12"), rates)) == 1


def test_eight_workers_on_four_ps(lo: Fabric) -> None:
    small = RunSpec(iterations=3, warmup=1, max_seconds=20.0, warmup_seconds=10.0)
    with PSCluster(lo, Topology(ps=4, workers=8, sharding="greedy")) as cluster:
        steps = sync_sgd_step(cluster, PROFILE, run=small)
        assert steps.sizes[0].count == 3
        assert sum(load.bytes_in for load in steps.sizes[0].per_ps) == 8 * 3 * PROFILE.total_bytes
        rpcs = ps_throughput(cluster, [1024], run=small)
        assert rpcs.sizes[0].count == 8 * 4 * 3
        pids = cluster.pids
    assert not any(_alive(pid) for pid in pids)


def test_a_killed_worker_is_reported(lo: Fabric) -> None:
    with PSCluster(lo, Topology(ps=1, workers=2)) as cluster:
        os.kill(cluster.workers[1].pid, signal.SIGKILL)
        with pytest.raises(ServerDied, match=r"PS worker 1 exited with signal 9 \(SIGKILL\)"):
            sync_sgd_step(cluster, PROFILE, run=STEPS, barrier_timeout=5.0)
        pids = cluster.pids
    assert not any(_alive(pid) for pid in pids)


def test_a_killed_ps_is_reported(lo: Fabric) -> None:
    with PSCluster(lo, Topology(ps=2, workers=1)) as cluster:
        os.kill(cluster.ps[1].pid, signal.SIGKILL)
        with pytest.raises(ServerDied, match=r"PS 1 on lo exited with signal 9 \(SIGKILL\)"):
            ps_throughput(cluster, [64], run=RUN)
        pids = cluster.pids
    assert not any(_alive(pid) for pid in pids)


def test_check_fails_when_the_aggregate_is_wrong(
    cluster: PSCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pytest_tfgrpc.bench.ps as ps_module

    profile = Profile("tiny", (TensorSpec("w", (10, 7)), TensorSpec("b", (3,))))
    result = sync_sgd_step(cluster, profile, run=STEPS, check=True, chunk_bytes=64)
    ps_module.check_aggregate(cluster, result)  # the real aggregate passes, again
    real = ps_module.fetch_weights

    def one_wrong_weight(cluster: PSCluster, placement: Placement) -> dict[str, np.ndarray]:
        weights = {name: array.copy() for name, array in real(cluster, placement).items()}
        weights["w"][17] += 1.0  # as if one gradient slice had been summed twice
        return weights

    monkeypatch.setattr(ps_module, "fetch_weights", one_wrong_weight)
    with pytest.raises(ps_module.AggregateError, match=r"tensor 'w': 1 of 70 weights differ"):
        sync_sgd_step(cluster, profile, run=STEPS, check=True, chunk_bytes=64)
    with pytest.raises(ValueError, match="check=True"):
        ps_module.check_aggregate(cluster, sync_sgd_step(cluster, profile, run=STEPS))


def test_sync_sgd_counts_every_push_and_pull_as_an_rpc(lo: Fabric) -> None:
    with PSCluster(lo, Topology(ps=2, workers=2, sharding="greedy")) as cluster:
        result = sync_sgd_step(cluster, PROFILE, run=STEPS)
    for load in result.sizes[0].per_ps:
        # Each worker pushes once and pulls once per measured step, to every PS.
        assert load.rpcs == 2 * 2 * STEPS.iterations
