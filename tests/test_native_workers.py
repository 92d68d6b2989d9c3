"""The native engine's PS workers (``tfgrpc-native-worker``) against the plugin's Python PS tasks.

Tests that run the C++ worker skip, with the command that builds it, when the native engine
is not built (``tfgrpc-build-native``).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator

import numpy as np
import pytest

from pytest_tfgrpc import native
from pytest_tfgrpc.bench.ps import fetch_weights, ps_throughput, sync_sgd_step
from pytest_tfgrpc.bench.timing import RunSpec
from pytest_tfgrpc.model.placement import Topology, place_profile
from pytest_tfgrpc.model.profiles import Profile, TensorSpec, load_profile
from pytest_tfgrpc.ps import jobs, ps_cluster
from pytest_tfgrpc.ps.ps_cluster import ClusterError, PSCluster
from pytest_tfgrpc.roles.parameter_server import apply_update, check_gradient, initial_weights
from pytest_tfgrpc.roles.processes import LOCAL
from pytest_tfgrpc.wire.client import BenchmarkError
from pytest_tfgrpc.wire.fabric import Fabric, resolve_fabric

NOT_BUILT = native.unavailable_reason()
needs_native = pytest.mark.skipif(NOT_BUILT is not None, reason=NOT_BUILT or "")

RUN = RunSpec(iterations=30, warmup=3, max_seconds=10.0, warmup_seconds=5.0)
STEPS = RunSpec(iterations=4, warmup=1, max_seconds=20.0, warmup_seconds=10.0)


@pytest.fixture(scope="module")
def lo() -> Fabric:
    return resolve_fabric("lo")


@pytest.fixture(scope="module")
def cluster(lo: Fabric) -> Iterator[PSCluster]:
    if NOT_BUILT is not None:
        pytest.skip(NOT_BUILT)
    with PSCluster(lo, Topology(ps=2, workers=3), workers_engine="native") as started:
        yield started


@needs_native
@pytest.mark.parametrize("mode", ["raw", "protobuf"])
@pytest.mark.parametrize("size", [0, 1, 64, 1000, 64 << 10])
def test_native_workers_call_every_ps_and_every_call_is_counted(
    cluster: PSCluster, mode: str, size: int
) -> None:
    assert all(w.engine == "native" for w in cluster.workers)
    result = ps_throughput(cluster, [size], mode=mode, run=RUN)
    point = result.sizes[0]
    # 3 workers x 2 PS x 30 calls, every one counted by its PS with its tensor bytes.
    assert point.count == 3 * 2 * 30
    assert [load.rpcs for load in point.per_ps] == [90, 90]
    assert [load.bytes_in for load in point.per_ps] == [90 * size, 90 * size]
    assert point.rate_per_s is not None and point.rate_per_s > 0
    assert point.cpu["workers"].total_ns > 0
    assert result.settings["engine"] == "native"
    assert result.settings["grpc_cpp"] == native.binaries().grpc_version
    assert result.mode == mode


@needs_native
def test_native_workers_send_each_ps_the_bytes_its_placement_owns(cluster: PSCluster) -> None:
    placement = place_profile(load_profile("hep_cnn").scaled(scale=0.05), 2, "round_robin")
    for mode in ("raw", "protobuf"):
        point = ps_throughput(cluster, placement, mode=mode, run=RUN, key="hep").point("hep")
        assert [load.bytes_in for load in point.per_ps] == [
            90 * b for b in placement.bytes_per_ps()
        ]


@needs_native
@pytest.mark.parametrize("chunk_bytes", [64, 1 << 20])
def test_native_workers_sync_sgd_weights_are_the_numpy_sum_of_all_gradients(
    cluster: PSCluster, chunk_bytes: int
) -> None:
    profile = Profile("tiny", (TensorSpec("w", (10, 7)), TensorSpec("b", (3,))))
    result = sync_sgd_step(
        cluster, profile, run=STEPS, learning_rate=0.25, check=True, chunk_bytes=chunk_bytes
    )
    assert result.settings["engine"] == "native"
    assert result.placement is not None
    weights = fetch_weights(cluster, result.placement)
    for spec in profile.tensors:
        expected = initial_weights(0, spec.nbytes, init=1)
        for step in range(STEPS.warmup + STEPS.iterations):
            total = np.sum([check_gradient(w, step, 0, spec.nbytes) for w in range(3)], axis=0)
            apply_update(expected, total, 0.25, 3)
        np.testing.assert_array_equal(weights[spec.name], expected)


@needs_native
def test_native_workers_sync_sgd_bytes_follow_the_placement(cluster: PSCluster) -> None:
    profile = load_profile("hep_cnn").scaled(scale=0.05)
    result = sync_sgd_step(cluster, profile, run=STEPS, partition_bytes=4096, model=False)
    point = result.sizes[0]
    assert point.count == STEPS.iterations
    assert result.placement is not None
    for load, placed in zip(point.per_ps, result.placement.bytes_per_ps(), strict=True):
        assert load.bytes_in == load.bytes_out == placed * 3 * STEPS.iterations


@needs_native
def test_a_native_worker_names_the_ps_it_cannot_reach(lo: Fabric) -> None:
    with PSCluster(lo, Topology(ps=1, workers=1), workers_engine="native") as small:
        job = jobs.ThroughputJob(
            targets=("127.0.0.1:1",),
            worker=0,
            mode="raw",
            payload_bytes=(8,),
            iterations=1,
            warmup=0,
            warmup_seconds=1.0,
            seconds=1.0,
        )
        with pytest.raises(
            BenchmarkError, match=r"native PS worker 0: no connection to 127\.0\.0\.1:1"
        ):
            small.run([job], timeout=30.0)
        # The worker survives a failed job and takes the next one.
        assert ps_throughput(small, [8], run=RUN).sizes[0].count == 30


@needs_native
@pytest.mark.parametrize("variable", ["TFGRPC_TLS_CERT", "TFGRPC_TLS_CA"])
def test_the_native_worker_refuses_tls_settings(variable: str) -> None:
    done = subprocess.run(
        [str(native.binaries().worker)],
        env={**os.environ, variable: "/nonexistent.pem"},
        input=b"",
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    frames = jobs.Frames()
    frames.feed(done.stdout)
    body = frames.take()
    assert body is not None
    failed = jobs.reply_of(body)
    assert isinstance(failed, jobs.WorkerFailed)
    assert "plaintext only" in failed.error and variable in failed.error


class _Agent:
    host = "node1"
    address = None


def test_native_workers_through_node_agents_are_refused_before_anything_starts(
    lo: Fabric,
) -> None:
    with pytest.raises(ClusterError, match="native PS workers cannot run through node agents"):
        PSCluster(
            lo,
            Topology(ps=1, workers=2),
            workers_engine="native",
            worker_launchers=(LOCAL, _Agent()),  # type: ignore[arg-type]
        )


@pytest.mark.parametrize("mode", ["tls", "mtls"])
def test_native_workers_under_tls_are_refused(
    lo: Fabric, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    monkeypatch.setattr(ps_cluster, "tls_mode", lambda: mode)
    with pytest.raises(ClusterError, match=f"plaintext only, and this run uses TLS \\({mode}\\)"):
        PSCluster(lo, Topology(ps=1, workers=1), workers_engine="native")


@pytest.mark.parametrize("engine", ["c++", "", "NATIVE"])
def test_an_unknown_workers_engine_is_named(lo: Fabric, engine: str) -> None:
    expected = re.escape(f"workers_engine={engine!r}: expected one of grpcio, native")
    with pytest.raises(ValueError, match=expected):
        PSCluster(lo, Topology(ps=1, workers=1), workers_engine=engine)
