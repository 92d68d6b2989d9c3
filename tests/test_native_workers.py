"""The native engine's PS roles in every pairing: native workers (``tfgrpc-native-worker``)
to native PS tasks (``tfgrpc-native-server`` with the job token), native workers to Python PS
tasks, and Python workers to native PS tasks, call for call (the grpcio pair is
``tests/test_ps.py``'s). The native PS service alone, call by call: ``tests/test_native_ps.py``.

Tests that run the C++ programs skip, with the command that builds them, when the native
engine is not built (``tfgrpc-build-native``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping

import numpy as np
import pytest

from pytest_tfgrpc import native
from pytest_tfgrpc.bench.ps import fetch_weights, ps_throughput, sync_sgd_step
from pytest_tfgrpc.bench.timing import RunSpec
from pytest_tfgrpc.model.placement import Topology, place_profile
from pytest_tfgrpc.model.profiles import Profile, TensorSpec, load_profile
from pytest_tfgrpc.ps import jobs
from pytest_tfgrpc.ps.ps_cluster import PSCluster
from pytest_tfgrpc.roles.parameter_server import apply_update, check_gradient, initial_weights
from pytest_tfgrpc.wire.client import BenchmarkError
from pytest_tfgrpc.wire.fabric import Fabric, resolve_fabric
from pytest_tfgrpc.wire.security import TlsFiles, load_tls, use_tls

NOT_BUILT = native.unavailable_reason()
needs_native = pytest.mark.skipif(NOT_BUILT is not None, reason=NOT_BUILT or "")

RUN = RunSpec(iterations=30, warmup=3, max_seconds=10.0, warmup_seconds=5.0)
STEPS = RunSpec(iterations=4, warmup=1, max_seconds=20.0, warmup_seconds=10.0)


@pytest.fixture(scope="module")
def lo() -> Fabric:
    return resolve_fabric("lo")


def assert_numpy_weights(
    weights: Mapping[str, np.ndarray], profile: Profile, steps: RunSpec, workers: int, lr: float
) -> None:
    """``weights`` (the PS tasks' after ``steps`` of ``check=True`` sync SGD with ``workers``
    workers) are what numpy makes of the same gradients."""
    for spec in profile.tensors:
        expected = initial_weights(0, spec.nbytes, init=1)
        for step in range(steps.warmup + steps.iterations):
            grads = [check_gradient(w, step, 0, spec.nbytes) for w in range(workers)]
            apply_update(expected, np.sum(grads, axis=0), lr, workers)
        np.testing.assert_array_equal(weights[spec.name], expected)


#: (PS tasks' engine, workers' engine): every pairing with a native role.
PAIRS = [("native", "native"), ("grpcio", "native"), ("native", "grpcio")]


@pytest.fixture(scope="module", params=PAIRS, ids=[f"ps_{p}-workers_{w}" for p, w in PAIRS])
def cluster(lo: Fabric, request: pytest.FixtureRequest) -> Iterator[PSCluster]:
    if NOT_BUILT is not None:
        pytest.skip(NOT_BUILT)
    ps_engine, workers_engine = request.param
    with PSCluster(
        lo, Topology(ps=2, workers=3), workers_engine=workers_engine, ps_engine=ps_engine
    ) as started:
        yield started


def _records_its_roles(settings: Mapping[str, str], cluster: PSCluster) -> None:
    assert settings["engine"] == settings["workers_engine"] == cluster.workers_engine
    assert settings["ps_engine"] == cluster.ps_engine
    assert settings["grpc_cpp"] == native.binaries().grpc_version


@needs_native
@pytest.mark.parametrize("mode", ["raw", "protobuf"])
@pytest.mark.parametrize("size", [0, 1, 64, 1000, 64 << 10])
def test_native_workers_call_every_ps_and_every_call_is_counted(
    cluster: PSCluster, mode: str, size: int
) -> None:
    assert all(w.engine == cluster.workers_engine for w in cluster.workers)
    result = ps_throughput(cluster, [size], mode=mode, run=RUN)
    point = result.sizes[0]
    # 3 workers x 2 PS x 30 calls, every one counted by its PS with its tensor bytes.
    assert point.count == 3 * 2 * 30
    assert [load.rpcs for load in point.per_ps] == [90, 90]
    assert [load.bytes_in for load in point.per_ps] == [90 * size, 90 * size]
    assert point.rate_per_s is not None and point.rate_per_s > 0
    assert point.cpu["workers"].total_ns > 0
    _records_its_roles(result.settings, cluster)
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
    tensors: tuple[TensorSpec, ...] = (TensorSpec("w", (10, 7)), TensorSpec("b", (3,)))
    if chunk_bytes == 1 << 20:
        # 1 MiB chunks of a 1.2 MB tensor arrive in several slices: the native PS parses them
        # where they lie.
        tensors += (TensorSpec("big", (300_000,)),)
    profile = Profile("tiny", tensors)
    result = sync_sgd_step(
        cluster, profile, run=STEPS, learning_rate=0.25, check=True, chunk_bytes=chunk_bytes
    )
    _records_its_roles(result.settings, cluster)
    assert result.placement is not None
    assert_numpy_weights(fetch_weights(cluster, result.placement), profile, STEPS, 3, 0.25)


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


def _cluster_with(lo: Fabric, role: str, engine: str) -> PSCluster:
    if role == "ps":
        return PSCluster(lo, Topology(ps=1, workers=1), ps_engine=engine)
    return PSCluster(lo, Topology(ps=1, workers=1), workers_engine=engine)


@pytest.mark.parametrize("engine", ["c++", "", "NATIVE"])
@pytest.mark.parametrize("role", ["workers", "ps"])
def test_an_unknown_engine_of_a_role_is_named(lo: Fabric, engine: str, role: str) -> None:
    expected = re.escape(f"{role}_engine={engine!r}: expected one of grpcio, native")
    with pytest.raises(ValueError, match=expected):
        _cluster_with(lo, role, engine)


@needs_native
@pytest.mark.parametrize(
    ("ps_engine", "workers_engine"),
    [("grpcio", "native"), ("native", "grpcio"), ("native", "native")],
)
def test_native_roles_speak_mutual_tls_in_every_pairing(
    lo: Fabric, tmp_path_factory: pytest.TempPathFactory, ps_engine: str, workers_engine: str
) -> None:
    trustme = pytest.importorskip("trustme")
    where = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    files = TlsFiles(str(where / "cert.pem"), str(where / "key.pem"), str(where / "ca.pem"))
    ca.cert_pem.write_to_path(files.ca)
    leaf.private_key_pem.write_to_path(files.key)
    for i, pem in enumerate(leaf.cert_chain_pems):
        pem.write_to_path(files.cert, append=i > 0)
    use_tls(load_tls(files))  # the driver's own channels to the PS tasks (job control)
    try:
        env = {**os.environ, **files.env()}
        with PSCluster(
            lo,
            Topology(ps=1, workers=2),
            env=env,
            ps_engine=ps_engine,
            workers_engine=workers_engine,
        ) as tls:
            point = ps_throughput(tls, [4096], run=RUN).sizes[0]
    finally:
        use_tls(None)
    assert [load.rpcs for load in point.per_ps] == [2 * 30]
