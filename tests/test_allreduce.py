"""All-reduce among a cluster's workers over gRPC: ring and halving-doubling on 4 local
workers, exact sums, nccl-tests' figures, the model beside the measurement, bad requests."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import numpy as np
import pytest

from pytest_tfgrpc.bench.allreduce import (
    AllReduceCosts,
    AllReducePrediction,
    AllReduceResult,
    ProbeRound,
    Spread,
    _rounds_after,
    allreduce,
    costs_from_rounds,
    measure_whole_buffer,
    predict_allreduce,
    security,
    shared_step,
)
from pytest_tfgrpc.bench.timing import RunSpec
from pytest_tfgrpc.model.analytic import CpuCost
from pytest_tfgrpc.model.placement import Topology
from pytest_tfgrpc.model.scaling import allreduce_pieces, allreduce_time, bus_factor
from pytest_tfgrpc.ps.checked_sum import check_input, verify_sum
from pytest_tfgrpc.ps.jobs import AllReduceJob, MessageError, check_allreduce, reply_of
from pytest_tfgrpc.ps.ps_cluster import PSCluster
from pytest_tfgrpc.ps.worker import Mailbox
from pytest_tfgrpc.report.record import read_record, result_properties
from pytest_tfgrpc.wire._proto import worker_pb2
from pytest_tfgrpc.wire.client import BenchmarkError
from pytest_tfgrpc.wire.fabric import resolve_fabric
from pytest_tfgrpc.wire.security import TOKEN_KEY, TlsFiles, child_env, load_tls, use_tls

RUN = RunSpec(iterations=5, warmup=1, max_seconds=5.0, warmup_seconds=2.0)


@pytest.fixture(scope="module")
def cluster() -> Iterator[PSCluster]:
    with PSCluster(resolve_fabric("lo"), Topology(ps=1, workers=4)) as started:
        yield started


@pytest.mark.parametrize("algorithm", ["ring", "halving_doubling"])
def test_four_local_workers_reduce_exactly(cluster: PSCluster, algorithm: str) -> None:
    # 1 MiB + 36 B: pieces that do not split evenly among 4 ranks or in halves
    nbytes = (1 << 20) + 36
    result = allreduce(cluster, [nbytes], run=RUN, algorithm=algorithm, check=True)
    point = result.sizes[0]
    assert result.ranks == 4 and point.size_bytes == nbytes
    assert result.settings["checked"] == str(point.count) != "0"
    algbw = nbytes * 1e9 / point.summary.p50_ns
    figures = {f.metric.name: f.value for f in point.figures()}
    assert figures["algbw"] == pytest.approx(algbw)
    assert figures["busbw"] == pytest.approx(algbw * 1.5)  # 2 (4 - 1) / 4
    # The record: nccl-tests' figures, and the model's prediction beside the measurement.
    record = read_record("t", [("tfgrpc.fabric", "lo"), *result_properties(result)], strict=True)
    (measurement,) = record.measurements
    # The record keeps a figure to its recorded digits: a few parts in 1e5 of the float.
    assert measurement.figure("busbw") == pytest.approx(algbw * 1.5, rel=1e-4)
    model = measurement.model
    predicted = float(model["step_us"])
    measured = point.summary.p50_ns / 1e3
    assert float(model["error_pct"]) == pytest.approx(
        100 * (predicted - measured) / measured, rel=1e-4, abs=1e-3
    )
    assert predicted == pytest.approx(max(float(model["link_us"]), float(model["cpu_us"])), rel=1)
    assert float(model["cores"]) >= 1 and 0 < float(model["rate"]) <= 1
    # all four ranks report this machine's boot id: one machine shared, a step measured there
    assert model["sharing"] == "4" and float(model["shared_step_us"]) > 0
    # the inputs are the medians of three rounds of probes (one size: all three after it),
    # with the rounds' spread beside them
    assert model["inputs_rounds"] == "3"
    step = prediction_of(result).costs.spread("step_s")
    assert step is not None and len(step.values) == 3 and all(v > 0 for v in step.values)
    # the record keeps a figure to its recorded digits
    assert float(model["shared_step_spread_pct"]) == pytest.approx(100 * step.relative, rel=1e-4)
    assert float(model["load_low"]) <= float(model["load"]) <= float(model["load_high"])
    # a plaintext run: the ranks measured the model's inputs over plaintext channels too
    assert model["inputs_tls"] == "off" == result.settings["tls"]
    assert model["inputs_engine"] == "grpcio"
    print(
        f"{algorithm}, 4 local workers, 1 MiB: measured p50 {measured / 1e3:.1f} ms, "
        f"model {predicted / 1e3:.1f} ms ({float(model['error_pct']):+.0f}%, "
        f"{model['limit']}-bound, load {float(model['load']):.2g})"
    )


def prediction_of(result: AllReduceResult) -> AllReducePrediction:
    (prediction,) = result.predictions
    assert prediction is not None
    return prediction


def test_bad_requests_lead_with_the_cause(cluster: PSCluster) -> None:
    with pytest.raises(MessageError, match=r"nbytes=8: .*at least one per rank \(16 bytes\)"):
        allreduce(cluster, [8], run=RUN, model=False)
    with pytest.raises(MessageError, match=r"nbytes=1026: whole float32 elements"):
        allreduce(cluster, [1026], run=RUN)
    with pytest.raises(MessageError, match="algorithm='tree': expected one of ring, halving_"):
        allreduce(cluster, [1024], run=RUN, algorithm="tree")
    with pytest.raises(ValueError, match="model_rounds=0: at least one round of probes"):
        allreduce(cluster, [1024], run=RUN, model_rounds=0)
    with pytest.raises(ValueError, match="2 to 4 ranks"):
        cluster.allreduce(1024, algorithm="ring", warmup=0, iterations=1, seconds=1.0,
                          check=False, ranks=5)  # fmt: skip
    job = AllReduceJob(
        rank=0, ranks=3, bind="127.0.0.1", nbytes=1024, algorithm="halving_doubling",
        iterations=1, seconds=1.0,
    )  # fmt: skip
    with pytest.raises(MessageError, match="power-of-two number of ranks, not 3"):
        check_allreduce(job)
    # the cluster is still usable after refusals
    result = allreduce(cluster, [4096], run=RUN, check=True, model=False)
    assert result.sizes[0].count >= 1 and not result.model_predictions()


def test_the_model_counts_each_algorithms_pieces() -> None:
    assert bus_factor(8) == pytest.approx(1.75)
    ring = allreduce_pieces(1024, 4, "ring")
    assert ring == (256,) * 6
    hd = allreduce_pieces(1024, 8, "halving_doubling")
    assert hd == (512, 256, 128, 128, 256, 512)
    for n, algorithm in ((4, "ring"), (8, "halving_doubling"), (6, "halving_doubling")):
        assert sum(allreduce_pieces(1000, n, algorithm)) == pytest.approx(1000 * bus_factor(n))
    # link only: nccl-tests' and Thakur et al.'s totals
    total, link, host = allreduce_time(1e6, 8, "ring", alpha_s=1e-4, link_Bps=1e9)
    assert total == link == pytest.approx(14 * 1e-4 + 1.75e6 / 1e9) and host == 0
    # a CPU per step that the ranks share: each step takes the larger of link and CPU
    cpu = CpuCost(1e-3, 0.0, 1e-9)
    total, link, host = allreduce_time(1e6, 4, "ring", alpha_s=1e-5, link_Bps=1e10, cpu=cpu,
                                       rate=0.5)  # fmt: skip
    assert host == pytest.approx(6 * (1e-3 + 2 * 250e3 * 1e-9) / 0.5)
    assert total == pytest.approx(host) and link < host
    with pytest.raises(ValueError, match="known all-reduce algorithms: ring, halving_doubling"):
        allreduce_pieces(1024, 4, "tree")


def test_the_whole_buffer_cost_is_paid_once_per_allreduce_at_the_ranks_share() -> None:
    def time(whole_s: float) -> tuple[float, float, float]:
        cpu = CpuCost(1e-3, 0.0, 1e-9)
        return allreduce_time(
            1e6, 4, "ring", alpha_s=1e-5, link_Bps=1e10, cpu=cpu, rate=0.5, whole_s=whole_s
        )

    total0, link0, host0 = time(0.0)
    total, link, host = time(2e-3)
    # once per all-reduce (not per step), at the rank's share of a core, never on the link
    assert total - total0 == pytest.approx(2e-3 / 0.5)
    assert host - host0 == pytest.approx(2e-3 / 0.5) and link == link0
    for bad in (-1e-3, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="whole_s="):
            time(bad)


def test_ranks_sharing_cores_pay_the_step_measured_in_place() -> None:
    cpu = CpuCost(1e-3, 0.0, 1e-9)

    def time(step_s: float | None) -> tuple[float, float, float]:
        return allreduce_time(
            1e6, 4, "ring", alpha_s=1e-5, link_Bps=1e10, cpu=cpu, rate=0.5, step_s=step_s
        )

    _, link0, host0 = time(None)
    total, link, host = time(3e-3)
    # the step's fixed part is the one measured in place, not rpc_s at the rank's share; the
    # bytes still cost byte_s at that share; the link is untouched
    assert host == pytest.approx(6 * (3e-3 + 2 * 250e3 * 1e-9 / 0.5))
    assert host - host0 == pytest.approx(6 * (3e-3 - 1e-3 / 0.5)) and total == host
    assert link == link0
    with pytest.raises(ValueError, match="step_s=-1"):
        time(-1.0)
    # from an in-place all-reduce of 4 KiB (six 1 KiB pieces): its bytes at the share, out
    wall = 6 * 3e-3 + 6 * 2 * 1024 * 1e-9 / 0.5
    assert shared_step(wall, 4096, 4, "ring", cpu, 0.5) == pytest.approx(3e-3)
    # halving-doubling on 4 ranks: 2 KiB, 1 KiB, 1 KiB, 2 KiB
    wall = 4 * 3e-3 + 2 * 6144 * 1e-9 / 0.5
    assert shared_step(wall, 4096, 4, "halving_doubling", cpu, 0.5) == pytest.approx(3e-3)
    assert shared_step(1e-9, 4096, 4, "ring", cpu, 0.5) == 0.0  # never negative
    with pytest.raises(ValueError, match="wall_s=nan"):
        shared_step(float("nan"), 4096, 4, "ring", cpu, 0.5)
    # the share: the ranks on the busiest machine, not all of them, with the load there
    costs = AllReduceCosts(1e-4, 1e9, cpu, 2.0, 1.0, sharing=2, step_s=3e-3)
    assert costs.rate(8) == pytest.approx(2.0 / 3.0)
    assert replace(costs, sharing=0).rate(4) == pytest.approx(2.0 / 5.0)
    assert replace(costs, cores=None).rate(4) == 1.0
    prediction = predict_allreduce(costs, 1 << 20, 4, "ring")
    figures = dict(prediction.figures(0.01))
    assert figures["sharing"] == "2" and float(figures["shared_step_us"]) == pytest.approx(3e3)


def probe(step_s: float, load: float, *, sharing: int = 4, tls: str = "off") -> ProbeRound:
    """A round of probes whose figures a link of alpha 100 us and 1 GB/s, a CPU of 0.5 ms per
    step and 2 ns per byte, and an in-place step of ``step_s`` at ``load`` on 2 cores give."""
    pieces = (1024, 256 << 10)
    rate = min(1.0, 2.0 / (sharing + load))
    in_place = 6 * step_s + sum(2 * p * 2e-9 for p in allreduce_pieces(4096, 4, "ring")) / rate
    return ProbeRound(
        pieces=pieces,
        walls_s=(1e-4 + pieces[0] * 1e-9, 1e-4 + pieces[1] * 1e-9),
        cpus_s=(5e-4 + 2 * pieces[0] * 2e-9, 5e-4 + 2 * pieces[1] * 2e-9),
        in_place_bytes=4096,
        in_place_s=in_place,
        in_place_cpu_s=6 * 1e-3 + 6 * 2 * 1024 * 2e-9,
        in_place_count=12,
        machine="boot",
        sharing=sharing,
        cpus=2,
        load=load,
        tls=tls,
    )


def test_the_inputs_are_the_medians_of_the_rounds_with_their_spread() -> None:
    rounds = [probe(1e-3, 0.0), probe(5e-3, 3.0), probe(2e-3, 1.0)]
    costs = costs_from_rounds(rounds, 4, "ring", whole_byte_s=1e-10, engine="grpcio")
    # each round's own step (at its own load), then the median: not a round's outlier
    assert costs.step_s == pytest.approx(2e-3) and costs.load == 1.0
    step = costs.spread("step_s")
    assert step is not None and step.values == pytest.approx((1e-3, 5e-3, 2e-3))
    assert (step.low, step.high) == pytest.approx((1e-3, 5e-3))
    assert step.relative == pytest.approx((5e-3 - 1e-3) / 2e-3)
    # the link and the CPU per step, fitted per round through its two pieces
    assert costs.alpha_s == pytest.approx(1e-4) and costs.link_Bps == pytest.approx(1e9)
    assert costs.cpu.rpc_s == pytest.approx(5e-4) and costs.cpu.byte_s == pytest.approx(2e-9)
    assert costs.step_cpu_s == pytest.approx(1e-3)
    assert (costs.cores, costs.sharing, costs.whole_byte_s) == (2.0, 4, 1e-10)
    figures = dict(predict_allreduce(costs, 1 << 20, 4, "ring").figures(0.01))
    assert figures["inputs_rounds"] == "3" and float(figures["load_high"]) == 3.0
    assert float(figures["shared_step_spread_pct"]) == pytest.approx(200.0)
    assert float(figures["cpu_MBps_spread_pct"]) == pytest.approx(0.0, abs=1e-6)
    # ranks on machines of their own: no load, no step in place, no spread of either
    alone = costs_from_rounds([probe(1e-3, 0.0, sharing=1)], 4, "ring", whole_byte_s=0.0,
                              engine="grpcio")  # fmt: skip
    assert alone.cores is None and alone.step_s is None and alone.spread("load") is None
    assert Spread("x", (0.0, 1.0, 0.0)).relative == 0.0  # a median of 0: no share of it
    # the rounds spread evenly after the sizes, the last size followed by one at least
    assert [_rounds_after(i, 3, 3) for i in range(3)] == [1, 1, 1]
    assert [_rounds_after(i, 5, 3) for i in range(5)] == [0, 1, 0, 1, 1]
    assert [_rounds_after(0, 1, 3), _rounds_after(0, 1, 0)] == [3, 0]
    with pytest.raises(ValueError, match="no rounds of probes"):
        costs_from_rounds([], 4, "ring", whole_byte_s=0.0, engine="grpcio")
    with pytest.raises(BenchmarkError, match="different TLS settings"):
        costs_from_rounds([probe(1e-3, 0.0), probe(1e-3, 0.0, tls="mtls")], 4, "ring",
                          whole_byte_s=0.0, engine="grpcio")  # fmt: skip
    with pytest.raises(BenchmarkError, match="on different machines"):
        costs_from_rounds([probe(1e-3, 0.0), probe(1e-3, 0.0, sharing=3)], 4, "ring",
                          whole_byte_s=0.0, engine="grpcio")  # fmt: skip


def test_the_whole_buffer_probe_times_the_workers_copy_and_verification() -> None:
    copy = measure_whole_buffer(4 << 20, check=False, repeats=5)
    checked = measure_whole_buffer(4 << 20, check=True, repeats=5)
    # a copy of 4 MiB costs something, and verifying it as well costs more than the copy
    assert 0 < copy < checked < 1e-6  # seconds per byte: above 1 MB/s of CPU
    assert measure_whole_buffer(3, check=True) == 0.0  # no whole float32 element
    with pytest.raises(ValueError, match="repeats=0"):
        measure_whole_buffer(1024, check=True, repeats=0)
    costs = AllReduceCosts(1e-4, 1e9, CpuCost(1e-3, 0.0, 1e-9), 2.0, 1.0, whole_byte_s=1e-9)
    plain = replace(costs, whole_byte_s=0.0)
    with_whole = predict_allreduce(costs, 1 << 20, 4, "ring")
    without = predict_allreduce(plain, 1 << 20, 4, "ring")
    rate = 2.0 / (4 + 1.0)
    assert with_whole.step_s - without.step_s == pytest.approx(1e-9 * (1 << 20) / rate)
    assert float(dict(with_whole.figures(0.01))["whole_MBps"]) == pytest.approx(1e3)


SUITE = """
import pytest

@pytest.mark.ps_topology(ps=1, workers=4)
def test_ring(tfgrpc, ps_cluster):
    tfgrpc.allreduce(ps_cluster, sizes="256KiB", check=True, iterations=4)

@pytest.mark.ps_topology(ps=1, workers=4)
def test_unknown_algorithm(tfgrpc, ps_cluster):
    tfgrpc.allreduce(ps_cluster, sizes="1KiB", algorithm="tree", model=False)

@pytest.mark.ps_topology(ps=1, workers=4)
def test_no_sizes(tfgrpc, ps_cluster):
    tfgrpc.allreduce(ps_cluster)
"""


def test_allreduce_reaches_junit(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(SUITE)
    xml = pytester.path / "out.xml"
    result = pytester.runpytest("-p", "no:cacheprovider", f"--junitxml={xml}")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*SpecError: *test_unknown_algorithm*: allreduce(): algorithm='tree': expected one "
            "of ring, halving_doubling*",
            "*SpecError: allreduce() needs sizes: pass sizes= or mark the test*",
        ]
    )
    assert "INTERNALERROR" not in result.stdout.str()
    text = xml.read_text()
    props = dict(re.findall(r'name="(tfgrpc\.allreduce\.[^"]*)" value="([^"]*)"', text))
    for name in ("algbw_MBps", "busbw_MBps", "step_p50_us", "model.step_us", "model.error_pct"):
        assert f"tfgrpc.allreduce.256KiB.{name}" in props, name
    busbw = float(props["tfgrpc.allreduce.256KiB.busbw_MBps"])
    algbw = float(props["tfgrpc.allreduce.256KiB.algbw_MBps"])
    assert busbw == pytest.approx(1.5 * algbw, rel=1e-5)
    assert "check=True" in text and "algorithm=ring" in text and "checked=4" in text
    assert np.isfinite(float(props["tfgrpc.allreduce.256KiB.model.error_pct"]))


def test_a_wrong_sum_or_a_stranger_s_piece_is_refused() -> None:
    expected = check_input(10, 0) * 10  # four ranks: (1 + 2 + 3 + 4) times the pattern
    assert np.array_equal(sum(check_input(10, r) for r in range(4)), expected)
    verify_sum(expected.copy(), expected, 2, 7)
    wrong = expected.copy()
    wrong[3] += 1
    with pytest.raises(BenchmarkError, match=r"rank 2: all-reduce 7 element 3 is 41.0, .* 40.0"):
        verify_sum(wrong, expected, 2, 7)

    class Context:
        def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
            self.metadata = metadata

        def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
            return self.metadata

        async def abort(self, code: grpc.StatusCode, details: str) -> None:
            raise PermissionError(f"{code.name}: {details}")

    async def deliver() -> None:
        mailbox = Mailbox(((TOKEN_KEY, "secret"),))
        piece = worker_pb2.Piece(iteration=0, step=0, data=b"\0" * 8)
        with pytest.raises(PermissionError, match=r"UNAUTHENTICATED: .*job token"):
            await mailbox.deliver(piece, Context(((TOKEN_KEY, "guess"),)))
        await mailbox.deliver(piece, Context(((TOKEN_KEY, "secret"),)))
        with pytest.raises(PermissionError, match="ALREADY_EXISTS: a second piece"):
            await mailbox.deliver(piece, Context(((TOKEN_KEY, "secret"),)))
        assert (await mailbox.take(0, 0, timeout=1.0)).data == b"\0" * 8

    asyncio.run(deliver())


@pytest.fixture
def mutual_tls(tmp_path: Path) -> Iterator[None]:
    """This process's TLS setting mutual (as ``--tfgrpc-tls-cert/-key/-ca`` make it), off
    after: a fresh CA and a certificate for 127.0.0.1 that the PS, the workers and this
    process all use."""
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    cert, key, ca_path = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    leaf.private_key_pem.write_to_path(str(key))
    for i, pem in enumerate(leaf.cert_chain_pems):
        pem.write_to_path(str(cert), append=i > 0)
    use_tls(load_tls(TlsFiles(str(cert), str(key), str(ca_path))))
    try:
        yield
    finally:
        use_tls(None)


def test_the_models_inputs_are_measured_with_the_runs_credentials(mutual_tls: None) -> None:
    # The run's workers under mutual TLS (its TLS files in their environment, as a run hands
    # them): the two-rank ring and the in-place run that give the model its CPU and step are
    # those workers' own channels, and every rank reports mutual TLS for them.
    with PSCluster(resolve_fabric("lo"), Topology(ps=1, workers=2), env=child_env()) as tls:
        result = allreduce(tls, [64 << 10], run=RUN, check=True)
    (prediction,) = result.predictions
    assert prediction is not None and result.settings["tls"] == "mtls"
    assert prediction.costs.tls == "mtls" and prediction.costs.engine == "grpcio"
    model = dict(prediction.figures(result.sizes[0].summary.p50_ns / 1e9))
    assert model["inputs_tls"] == "mtls" and model["inputs_engine"] == "grpcio"


def test_ranks_that_disagree_on_tls_are_refused() -> None:
    replies = [worker_pb2.AllReduceReply(samples_ns=[1], tls=mode) for mode in ("mtls", "off")]
    with pytest.raises(BenchmarkError, match="ranks reported different TLS settings: mtls, off"):
        security(replies)
    assert security(replies[:1]) == "mtls"
    reply = worker_pb2.FromWorker(allreduce=worker_pb2.AllReduceReply(samples_ns=[1], tls="ssl"))
    with pytest.raises(MessageError, match="tls='ssl': expected off, tls or mtls"):
        reply_of(reply.SerializeToString())
