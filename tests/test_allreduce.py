"""All-reduce among a cluster's workers over gRPC: ring and halving-doubling, checked sums,
nccl-tests' figures and the model's prediction beside the measurement."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pytest_tfgrpc.bench.allreduce import allreduce, bus_factor
from pytest_tfgrpc.bench.timing import RunSpec
from pytest_tfgrpc.model.placement import Topology
from pytest_tfgrpc.ps.jobs import AllReduceJob, MessageError
from pytest_tfgrpc.ps.ps_cluster import PSCluster
from pytest_tfgrpc.wire.fabric import resolve_fabric

RUN = RunSpec(iterations=5, warmup=1, max_seconds=5.0, warmup_seconds=2.0)


@pytest.fixture(scope="module")
def cluster() -> Iterator[PSCluster]:
    with PSCluster(resolve_fabric("lo"), Topology(ps=1, workers=4)) as c:
        yield c


@pytest.mark.parametrize("algorithm", ["ring", "halving_doubling"])
def test_four_local_workers_reduce_exactly(cluster: PSCluster, algorithm: str) -> None:
    result = allreduce(cluster, 1 << 20, run=RUN, algorithm=algorithm, check=True)
    point = result.sizes[0]
    assert result.ranks == 4 and point.size_bytes == 1 << 20
    assert result.settings["checked"] == str(len(point.samples_ns)) != "0"
    assert result.busbw_Bps == pytest.approx(result.algbw_Bps * 1.5)  # 2 (4 - 1) / 4
    assert result.algbw_Bps == pytest.approx((1 << 20) * 1e9 / point.summary.p50_ns)
    # the model's prediction beside the measurement, with its error
    props = dict(result.extra_properties())
    assert props["tfgrpc.allreduce.1MiB.model.step_us"]
    error = float(props["tfgrpc.allreduce.1MiB.model.error_pct"])
    assert error > -100
    print(
        f"{algorithm}: measured p50 {point.summary.p50_ns / 1e6:.1f} ms, model error {error:+.0f}%"
    )


def test_bad_requests_lead_with_the_cause(cluster: PSCluster) -> None:
    with pytest.raises(ValueError, match="at least one float32 per rank"):
        allreduce(cluster, 8, run=RUN)
    with pytest.raises(ValueError, match="known all-reduce algorithms: ring, halving_doubling"):
        allreduce(cluster, 1 << 10, run=RUN, algorithm="tree")
    with pytest.raises(MessageError, match="power-of-two number of workers, not 3"):
        AllReduceJob(
            worker=0,
            workers=3,
            bind="127.0.0.1",
            nbytes=1024,
            algorithm="halving_doubling",
            warmup=0,
            iterations=1,
            seconds=1.0,
        )
    assert bus_factor(8) == pytest.approx(1.75)


SUITE = """
import pytest

@pytest.mark.ps_topology(ps=1, workers=4)
def test_ring(tfgrpc, ps_cluster):
    tfgrpc.allreduce(ps_cluster, nbytes="256KiB", check=True, iterations=5)
"""


def test_allreduce_reaches_junit(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(SUITE)
    xml = pytester.path / "out.xml"
    result = pytester.runpytest("-p", "no:cacheprovider", f"--junitxml={xml}")
    result.assert_outcomes(passed=1)
    text = xml.read_text()
    for name in ("algbw_MBps", "busbw_MBps", "step_p50_us", "model.step_us", "model.error_pct"):
        assert f'name="tfgrpc.allreduce.256KiB.{name}"' in text, name
    assert "check=True" in text and "algorithm=ring" in text
