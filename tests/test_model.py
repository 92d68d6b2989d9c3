"""The analytic model: alpha-beta fits, the sync-SGD step, projections and ``tfgrpc-model``.

Expected step times are worked out by hand from the formulas in :mod:`pytest_tfgrpc.model.analytic`
on
small profiles; the ResNet-50 projection is checked for the effects Mathuriya et al. report
(arXiv:1712.09388), as properties of the model's output. The Cori-like link (alpha 25 us,
5 GB/s) and the 1 s compute step are inputs chosen for those checks, not results.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from dataclasses import FrozenInstanceError, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_tfgrpc.cli.model import link_points_from_junit, link_points_from_results, main
from pytest_tfgrpc.model.analytic import (
    DEFAULT_PS,
    DEFAULT_WORKERS,
    LIMITS,
    CpuCost,
    HostCosts,
    LinkFit,
    Projection,
    fit,
    fit_from_results,
    link_point,
    predict_step,
    prediction_figures,
    project,
    relative_error,
    sharing_makespan,
)
from pytest_tfgrpc.model.placement import Topology
from pytest_tfgrpc.model.profiles import Profile, load_profile
from pytest_tfgrpc.report.results_file import ResultLog
from pytest_tfgrpc.results import BenchmarkResult, SizeResult

ALPHA = 20e-6
BANDWIDTH = 1.25e9
SIZES = [4, 64, 1024, 16 << 10, 256 << 10, 4 << 20, 64 << 20]


def hockney(n: int, alpha: float = ALPHA, bandwidth: float = BANDWIDTH) -> float:
    return alpha + n / bandwidth


# --- fitting the link --------------------------------------------------------------------------


def test_fit_recovers_exact_alpha_and_beta() -> None:
    link = fit([(n, hockney(n)) for n in SIZES], "lo")
    assert link.fabric == "lo"
    assert link.alpha == pytest.approx(ALPHA, rel=1e-9)
    assert link.bandwidth_Bps == pytest.approx(BANDWIDTH, rel=1e-9)
    assert link.r_squared == pytest.approx(1.0)
    assert link.max_relative_error == pytest.approx(0.0, abs=1e-9)
    assert link.points == tuple((n, hockney(n)) for n in SIZES)
    assert link.time(1000, messages=3) == pytest.approx(3 * ALPHA + 1000 / BANDWIDTH)


def test_fit_by_relative_error_keeps_alpha_when_large_sizes_are_noisy() -> None:
    # 1% noise on the largest message is 0.5 ms: ordinary least squares lets that swamp an
    # alpha of 20 us; fitting relative error does not.
    points = [(n, hockney(n) * (1.01 if n == SIZES[-1] else 1.0)) for n in SIZES]
    link = fit(points, "lo")
    assert link.alpha == pytest.approx(ALPHA, rel=0.05)
    assert link.bandwidth_Bps == pytest.approx(BANDWIDTH, rel=0.02)
    sizes = np.array([n for n, _ in points], dtype=float)
    times = np.array([t for _, t in points])
    (plain_alpha, _), *_ = np.linalg.lstsq(
        np.column_stack((np.ones_like(sizes), sizes)), times, rcond=None
    )
    assert abs(plain_alpha - ALPHA) > 5 * abs(link.alpha - ALPHA)


def test_fit_with_multiplicative_noise_stays_close() -> None:
    rng = np.random.default_rng(7)
    points = [(n, hockney(n) * float(rng.uniform(0.95, 1.05))) for n in SIZES for _ in range(5)]
    link = fit(points, "lo")
    assert link.alpha == pytest.approx(ALPHA, rel=0.1)
    assert link.bandwidth_Bps == pytest.approx(BANDWIDTH, rel=0.1)
    assert link.max_relative_error is not None and link.max_relative_error < 0.1
    assert link.r_squared is not None and 0.9 < link.r_squared < 1.0


def test_fit_never_gives_a_negative_alpha() -> None:
    # Times proportional to size, a bit less than proportional at the small end: the
    # unconstrained fit's alpha would be negative.
    points = [(1 << 20, 1e-3), (2 << 20, 2.1e-3), (4 << 20, 4.3e-3)]
    link = fit(points, "eth0")
    assert link.alpha == 0.0
    assert 1e-3 / (1 << 20) < link.beta < 4.3e-3 / (4 << 20) * 1.1


@pytest.mark.parametrize(
    ("points", "message"),
    [
        ([(1024, 1e-5), (1024, 2e-5)], "two or more message sizes"),
        ([(-1, 1e-5), (1024, 2e-5)], "whole number of bytes"),
        ([(4, 0.0), (1024, 2e-5)], "finite and > 0"),
        ([(4, float("nan")), (1024, 2e-5)], "finite and > 0"),
        ([(4, 1e-3), (1 << 20, 1e-5)], "do not grow with message size"),
        ([(4,), (1024, 2e-5)], "expected \\(bytes, seconds\\)"),
    ],
)
def test_fit_rejects_unusable_points(points: list[tuple[int, float]], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fit(points, "lo")


def test_given_link_and_validation() -> None:
    link = LinkFit.given(50e-6, 1.2e9, "aries")
    assert link.beta == pytest.approx(1 / 1.2e9)
    assert link.r_squared is None and link.max_relative_error is None
    assert "alpha 50.0us" in link.describe() and "1.20 GB/s" in link.describe()
    with pytest.raises(ValueError, match="alpha"):
        LinkFit.given(-1e-6, 1e9)
    with pytest.raises(ValueError, match="bandwidth"):
        LinkFit.given(1e-6, 0.0)
    with pytest.raises(FrozenInstanceError):
        link.alpha = 0.0  # type: ignore[misc]


def test_link_point_counts_an_echo_twice() -> None:
    assert link_point("p2p_latency", 1024, 1e-4) == (2048, 1e-4)
    assert link_point("p2p_latency_stream", 1024, 1e-4) == (2048, 1e-4)
    assert link_point("p2p_bandwidth", 1024, 1e-4) == (1024, 1e-4)
    assert link_point("ps_throughput", 1024, 1e-4) is None


def _result(benchmark: str, fabric: str, times: dict[int, float]) -> BenchmarkResult:
    sizes = tuple(
        SizeResult.from_samples(
            n, n, np.array([round(t * 1e9)] * 9 + [round(t * 5e9)], dtype=np.int64), 0
        )
        for n, t in times.items()
    )
    return BenchmarkResult(benchmark, benchmark, fabric, "127.0.0.1:1", "raw", "unary", sizes)


def test_fit_from_results_uses_medians_and_counts_echo_bytes() -> None:
    latency = _result("p2p_latency", "lo", {n: hockney(2 * n) for n in (4, 1024, 64 << 10)})
    bandwidth = _result("p2p_bandwidth", "lo", {n: hockney(n) for n in (1 << 20, 16 << 20)})
    link = fit_from_results([latency, bandwidth])
    assert link.fabric == "lo"
    # The last sample of each size is 5x slower: a mean would show it, the median does not.
    assert link.alpha == pytest.approx(ALPHA, rel=1e-3)
    assert link.bandwidth_Bps == pytest.approx(BANDWIDTH, rel=1e-3)
    assert any(  # ns-rounded
        n == 2 * 1024 and t == pytest.approx(hockney(2048), abs=1e-9) for n, t in link.points
    )


def test_fit_from_results_per_fabric() -> None:
    lo = _result("p2p_bandwidth", "lo", {n: hockney(n) for n in SIZES})
    slow = _result("p2p_bandwidth", "veth0", {n: hockney(n, 1e-4, 1e8) for n in SIZES})
    with pytest.raises(ValueError, match="several fabrics \\(lo, veth0\\)"):
        fit_from_results([lo, slow])
    assert fit_from_results([lo, slow], "veth0").bandwidth_Bps == pytest.approx(1e8, rel=1e-3)
    with pytest.raises(ValueError, match="on fabric 'ib0' \\(fabrics measured: lo, veth0\\)"):
        fit_from_results([lo, slow], "ib0")
    with pytest.raises(ValueError, match="no p2p_latency or p2p_bandwidth result"):
        fit_from_results([_result("ps_throughput", "lo", {4: 1e-3, 8: 2e-3})])


# --- one step ----------------------------------------------------------------------------------

# 100, 200 and 50 float32: 400, 800 and 200 bytes. Round-robin on 2 PS puts a and c on PS 0
# (600 B in 2 shards) and b on PS 1 (800 B in 1 shard).
SMALL = load_profile({"a": [100], "b": [200], "c": [50]}, name="small")
# 1 ms per message and 1 us per byte keep the hand arithmetic readable.
SLOW_LINK = LinkFit.given(1e-3, 1e6, "slow")


def test_step_uses_each_ps_link_when_given() -> None:
    # PS 1 behind a link 4x slower (250 kB/s): 2 * 3 * (1 ms + 800 B * 4 us) = 25.2 ms.
    slow_ps1 = LinkFit.given(1e-3, 0.25e6, "slow ps1")
    step = predict_step(SMALL, Topology(ps=2, workers=3), SLOW_LINK, ps_links=(SLOW_LINK, slow_ps1))
    assert step.ps_link_s == pytest.approx((15.6e-3, 25.2e-3))
    assert step.bottleneck_ps == 1 and step.comm_s == pytest.approx(25.2e-3)
    figures = dict(prediction_figures(step))
    assert figures["links"] == "each PS"
    assert float(figures["busiest_ps_bandwidth_MBps"]) == pytest.approx(0.25)
    assert (
        dict(prediction_figures(predict_step(SMALL, Topology(2, 3), SLOW_LINK)))["links"]
        == "PS 0 for all"
    )
    with pytest.raises(ValueError, match="1 links for 2 PS tasks"):
        predict_step(SMALL, Topology(ps=2, workers=3), SLOW_LINK, ps_links=(SLOW_LINK,))


def test_step_busiest_ps_is_by_time_not_bytes() -> None:
    step = predict_step(SMALL, Topology(ps=2, workers=3), SLOW_LINK)
    assert step.bytes_per_ps == (600, 800)
    assert step.shards_per_ps == (2, 1)
    assert step.bytes_in_per_ps == step.bytes_out_per_ps == (1800, 2400)
    # PS 0: 2 * 3 * (2 * 1 ms + 600 us) = 15.6 ms; PS 1: 2 * 3 * (1 ms + 800 us) = 10.8 ms.
    assert step.ps_link_s == pytest.approx((15.6e-3, 10.8e-3))
    # One worker: 2 * (3 * 1 ms + 1400 us) = 8.8 ms.
    assert step.worker_link_s == pytest.approx(8.8e-3)
    assert (step.bottleneck, step.bottleneck_ps) == ("ps", 0)
    assert step.comm_s == pytest.approx(15.6e-3)
    assert step.iter_s == pytest.approx(15.6e-3)
    assert step.efficiency is None
    assert step.imbalance == pytest.approx(800 / 700)
    assert step.profile == "small" and step.topology == Topology(2, 3)


def test_step_worker_link_limits_one_worker() -> None:
    step = predict_step(SMALL, Topology(ps=2, workers=1), SLOW_LINK)
    assert step.ps_link_s == pytest.approx((5.2e-3, 3.6e-3))
    assert step.bottleneck == "worker"
    assert step.comm_s == pytest.approx(8.8e-3)


@pytest.mark.parametrize(
    ("compute_s", "overlap", "iter_s"),
    [
        # t_b = 2/3 of compute. No overlap: t_c + t_comm.
        (30e-3, 0.0, 45.6e-3),
        # Full overlap, t_b = 20 ms > t_comm: t_f + t_b = 30 ms.
        (30e-3, 1.0, 30e-3),
        # Half of min(t_b, t_comm) = 7.8 ms hidden.
        (30e-3, 0.5, 37.8e-3),
        # Full overlap, t_b = 10 ms < t_comm: t_f + t_comm = 5 + 15.6 ms.
        (15e-3, 1.0, 20.6e-3),
    ],
)
def test_step_overlap_and_efficiency(compute_s: float, overlap: float, iter_s: float) -> None:
    step = predict_step(
        SMALL, Topology(ps=2, workers=3), SLOW_LINK, compute_s=compute_s, overlap=overlap
    )
    assert step.iter_s == pytest.approx(iter_s)
    assert step.efficiency == pytest.approx(compute_s / iter_s)


def test_step_backward_share() -> None:
    step = predict_step(
        SMALL,
        Topology(ps=2, workers=3),
        SLOW_LINK,
        compute_s=30e-3,
        overlap=1.0,
        backward_share=0.25,
    )
    # t_b = 7.5 ms hides under t_comm = 15.6 ms: t_f + t_comm.
    assert step.iter_s == pytest.approx(22.5e-3 + 15.6e-3)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"overlap": 1.5}, "overlap=1.5"),
        ({"overlap": -0.1}, "overlap=-0.1"),
        ({"backward_share": 2.0}, "backward_share=2.0"),
        ({"compute_s": -1.0}, "compute_s=-1.0"),
        ({"compute_s": math.inf}, "compute_s=inf"),
    ],
)
def test_step_rejects_bad_inputs(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        predict_step(SMALL, Topology(1, 1), SLOW_LINK, **kwargs)


def test_step_partitioned_splits_large_tensors() -> None:
    # One 4 MiB tensor on 4 PS: partitioned gives each PS a quarter, whole placement one PS.
    big: Profile = load_profile({"w": [1 << 20]}, name="big")
    link = LinkFit.given(10e-6, 1e9)
    whole = predict_step(big, Topology(4, 8, "greedy"), link)
    split = predict_step(big, Topology(4, 8, "partitioned"), link)
    assert whole.bytes_per_ps == (4 << 20, 0, 0, 0) and whole.imbalance == pytest.approx(4.0)
    assert split.bytes_per_ps == (1 << 20,) * 4 and split.imbalance == pytest.approx(1.0)
    assert split.comm_s == pytest.approx(2 * 8 * (10e-6 + (1 << 20) / 1e9))
    assert whole.comm_s > 3.5 * split.comm_s


def test_prediction_figures() -> None:
    step = predict_step(SMALL, Topology(2, 3), SLOW_LINK, compute_s=30e-3)
    props = dict(prediction_figures(step))
    assert set(props) == {
        name
        for name in (
            "step_comm_us",
            "step_us",
            "limit",
            "imbalance",
            "bottleneck_ps",
            "busiest_ps_in_bytes",
            "alpha_us",
            "bandwidth_MBps",
            "links",
            "efficiency",
        )
    }
    assert float(props["step_comm_us"]) == pytest.approx(15600)
    assert float(props["step_us"]) == pytest.approx(45600)
    assert props["bottleneck_ps"] == "0"
    assert props["limit"] == "ps link"
    assert props["busiest_ps_in_bytes"] == "1800"
    assert float(props["bandwidth_MBps"]) == pytest.approx(1.0)
    no_compute = dict(prediction_figures(predict_step(SMALL, Topology(2, 3), SLOW_LINK)))
    assert "efficiency" not in no_compute


# --- the host's CPU terms -----------------------------------------------------------------------

# Round numbers for hand arithmetic; SMALL on 2 PS round-robin: PS 0 owns a and c (600 B in 2
# shards), PS 1 owns b (800 B in 1 shard). The ends of an exchange work at once for half the
# worker's part.
HOST = HostCosts(
    worker=CpuCost(rpc_s=1e-3, message_s=1e-4, byte_s=1e-6),
    ps=CpuCost(rpc_s=2e-3, message_s=2e-4, byte_s=2e-6),
    aggregate_byte_s=1e-6,
    update_byte_s=3e-6,
    cores=1.5,
    hidden=CpuCost(rpc_s=0.5e-3, message_s=0.5e-4, byte_s=0.5e-6),
)
# PS 1's exchange (the heaviest PS): 3.9 ms at the worker, 8.6 ms at the PS, 1.95 ms of them at
# once, so the pair keeps 12.5 / (2 x 10.55) of two cores busy.
BUSY = 12.5 / 21.1
NONE = CpuCost(0.0, 0.0, 0.0)


def test_host_terms_follow_the_formulas() -> None:
    step = predict_step(SMALL, Topology(2, 3), SLOW_LINK, host=HOST)
    # x_ps: 2 calls, 2k+1 messages, 2B bytes at the PS, plus summing B.
    x_ps = (4e-3 + 5 * 2e-4 + 1200 * 2e-6 + 600e-6, 4e-3 + 3 * 2e-4 + 1600 * 2e-6 + 800e-6)
    assert step.ps_cpu_s == pytest.approx((3 * x_ps[0] + 1.8e-3, 3 * x_ps[1] + 2.4e-3))
    assert step.worker_cpu_s == pytest.approx((2e-3 + 5e-4 + 1.2e-3) + (2e-3 + 3e-4 + 1.6e-3))
    assert HOST.exchange(3, 1600, 800) == pytest.approx((3.9e-3, 8.6e-3, 1.95e-3))
    assert step.chain_s == pytest.approx(7.6e-3 + 28.2e-3 - 1.95e-3)
    # 5 tasks on 1.5 cores: the 3 workers (7.6 ms each) finish at 0.3 core each, then the
    # PS tasks share the 1.5 cores (0.75 each), then PS 1 runs alone: 52.0 ms. But the pair
    # keeps only BUSY of its cores busy, so all the work takes 76.8 ms / (BUSY x 1.5).
    ideal = 7.6e-3 / 0.3 + (25.8e-3 - 7.6e-3) / 0.75 + (28.2e-3 - 25.8e-3)
    work = [*step.ps_cpu_s, *[step.worker_cpu_s] * 3]
    assert sharing_makespan(work, HOST.rate) == pytest.approx(ideal) == pytest.approx(52.0e-3)
    assert step.utilization == pytest.approx(BUSY)
    assert step.shared_s == pytest.approx(76.8e-3 / (BUSY * 1.5)) == pytest.approx(86.4e-3, 1e-3)
    assert step.link_s == pytest.approx(15.6e-3)  # the link alone, as without host costs
    assert step.limit == "cores" and step.comm_s == step.shared_s
    assert step.bottleneck_ps == 1  # by CPU, though PS 0's link is the busier one
    alone = predict_step(SMALL, Topology(2, 3), SLOW_LINK, host=replace(HOST, cores=None))
    assert (alone.limit, alone.shared_s) == ("chain", 0.0)
    assert alone.comm_s == pytest.approx(33.85e-3)
    # Others' load: a lone task gets 1.5 / (1 + 1.5) of a core, and the chain slows with it.
    busy = predict_step(SMALL, Topology(2, 3), SLOW_LINK, host=replace(HOST, load=1.5))
    assert busy.chain_s == pytest.approx(33.85e-3 / 0.6)
    assert busy.shared_s > step.shared_s


def test_the_busy_share_of_the_cores_follows_the_hidden_work() -> None:
    # Ends that never work at once keep half of two cores busy: all the work over 0.75 core.
    serial = predict_step(SMALL, Topology(2, 3), SLOW_LINK, host=replace(HOST, hidden=NONE))
    assert serial.utilization == 0.5
    assert serial.shared_s == pytest.approx(76.8e-3 / 0.75)
    assert serial.chain_s == pytest.approx(7.6e-3 + 28.2e-3)
    # Hidden work is at most either end's: here all of the worker's part, 3.9 ms.
    most = replace(HOST, hidden=CpuCost(1.0, 1.0, 1.0))
    step = predict_step(SMALL, Topology(2, 3), SLOW_LINK, host=most)
    assert step.utilization == pytest.approx(12.5 / (2 * 8.6))
    assert step.chain_s == pytest.approx(7.6e-3 + 28.2e-3 - 3.9e-3)
    # With cores to spare, one worker and one PS (all 3 shards, 1400 B): their work over the
    # 2u cores they keep busy is the exchange's own wall time, x_w + x_ps - h, plus the update.
    spare = replace(HOST, cores=8.0)
    lone = predict_step(SMALL, Topology(1, 1), SLOW_LINK, host=spare)
    x_w, x_ps, h = spare.exchange(2 * 3 + 1, 2 * 1400, 1400)
    assert (lone.worker_cpu_s, *lone.ps_cpu_s) == pytest.approx((x_w, x_ps + 4.2e-3))
    bound = (x_w + x_ps + 4.2e-3) * (x_w + x_ps - h) / (x_w + x_ps)
    assert lone.shared_s == pytest.approx(bound) and bound > x_ps + 4.2e-3
    assert "at once 500us/call" in HOST.describe()


def test_sharing_makespan() -> None:
    def on(cores: float) -> Callable[[int], float]:
        return lambda k: min(1.0, cores / k)

    assert sharing_makespan([3.0, 1.0], on(2)) == pytest.approx(3.0)  # one core each
    assert sharing_makespan([1.0, 1.0, 1.0, 1.0], on(2)) == pytest.approx(2.0)  # sum / cores
    assert sharing_makespan([1.0, 3.0], on(1)) == pytest.approx(1 / 0.5 + 2.0)
    assert sharing_makespan([0.0, 2.0], on(1)) == pytest.approx(2.0)
    assert sharing_makespan([], on(1)) == 0.0


def test_every_limit_can_win_and_the_chain_covers_each_process() -> None:
    cheap = CpuCost(0.0, 0.0, 0.0)
    call = CpuCost(0.1, 0, 0)
    cases = {
        "ps link": (HostCosts(cheap, cheap), Topology(1, 1)),
        "worker link": (None, Topology(2, 1)),
        "chain": (HostCosts(call, call), Topology(1, 1)),
        "cores": (HostCosts(call, call, cores=1.0), Topology(1, 4)),
    }
    for limit, (host, topology) in cases.items():
        assert predict_step(SMALL, topology, SLOW_LINK, host=host).limit == limit
    assert set(cases) == set(LIMITS)
    for scale in (0.0, 0.5, 1.0, 10.0):
        hidden = CpuCost(scale * 1e-3, scale * 1e-4, scale * 1e-6)
        for workers in (1, 4):
            step = predict_step(
                SMALL, Topology(2, workers), SLOW_LINK, host=replace(HOST, hidden=hidden)
            )
            assert step.chain_s >= max(step.worker_cpu_s, *step.ps_cpu_s)
            assert 0.5 <= step.utilization <= 1.0


def test_streamed_steps_count_slices_as_messages_and_calls_on_the_link() -> None:
    step = predict_step(SMALL, Topology(2, 3), SLOW_LINK, chunk_bytes=256, host=HOST)
    assert step.shards_per_ps == (2, 1)
    assert step.messages_per_ps == (3, 4)  # a: 2 slices, c: 1; b: 4
    assert step.ps_link_s == pytest.approx((6 * (1e-3 + 600e-6), 6 * (1e-3 + 800e-6)))
    x_ps1 = 4e-3 + 9 * 2e-4 + 1600 * 2e-6 + 800e-6
    assert step.ps_cpu_s[1] == pytest.approx(3 * x_ps1 + 2.4e-3)
    whole = predict_step(SMALL, Topology(2, 3), SLOW_LINK)
    assert whole.messages_per_ps == whole.shards_per_ps == (2, 1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cores": 0.0}, "cores=0.0"),
        ({"update_byte_s": -1.0}, "update_byte_s=-1.0"),
        ({"load": -0.5}, "load=-0.5"),
    ],
)
def test_host_costs_reject_bad_values(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        replace(HOST, **kwargs)
    with pytest.raises(ValueError, match="message_s"):
        CpuCost(0.0, math.nan, 0.0)
    with pytest.raises(ValueError, match="chunk_bytes=0"):
        predict_step(SMALL, Topology(1, 1), SLOW_LINK, chunk_bytes=0)


def test_prediction_properties_with_host_key_and_error() -> None:
    step = predict_step(SMALL, Topology(2, 3), SLOW_LINK, host=HOST)
    props = {f"tfgrpc.sgd.small.model.{n}": v for n, v in prediction_figures(step, measured_s=0.04)}
    prefix = "tfgrpc.sgd.small.model."
    assert props[prefix + "limit"] == "cores"
    assert float(props[prefix + "cores"]) == 1.5
    assert float(props[prefix + "shared_us"]) == pytest.approx(step.shared_s * 1e6, rel=1e-5)
    assert float(props[prefix + "load"]) == 0.0
    assert float(props[prefix + "utilization"]) == pytest.approx(BUSY)
    assert float(props[prefix + "chain_us"]) == pytest.approx(33850)
    assert float(props[prefix + "error_pct"]) == pytest.approx(
        100 * (step.iter_s - 0.04) / 0.04, rel=1e-5
    )
    assert relative_error(0.03, 0.04) == pytest.approx(-0.25)
    with pytest.raises(ValueError, match="measured_s=0"):
        relative_error(0.03, 0)
    text = project(SMALL, SLOW_LINK, workers=[1, 3], ps=[2], host=HOST).describe()
    assert "ps 2.00ms/call" in text and "at once 500us/call, 50.0us/message" in text
    assert "1.5 cores shared with 0 other sessions" in text


# --- projections: ResNet-50 on a Cori-like link ------------------------------------------------

RESNET50 = load_profile("resnet50")
ARIES = LinkFit.given(25e-6, 5e9, "aries")  # an input, as a user would give it
LARGEST = RESNET50.largest(1)[0].nbytes
# The PS count at which a perfect whole-tensor balance gives each PS one largest tensor: past
# it, the largest tensor, not the PS count, sets the busiest PS's load.
SATURATION = RESNET50.total_bytes / LARGEST
PS_GRID = (1, 2, 4, 8, 16, 32, 64, 128)


@functools.cache
def resnet50_projection(sharding: str) -> Projection:
    return project(RESNET50, ARIES, ps=PS_GRID, sharding=sharding, compute_s=1.0, overlap=0.5)


@pytest.fixture(params=["round_robin", "greedy", "partitioned"])
def projection(request: pytest.FixtureRequest) -> Projection:
    return resnet50_projection(request.param)


WHOLE_TENSOR = pytest.mark.parametrize("sharding", ["round_robin", "greedy"])


def test_projection_grid_defaults() -> None:
    table = project(SMALL, SLOW_LINK)
    assert table.workers == DEFAULT_WORKERS == tuple(2**i for i in range(10))
    assert table.ps == DEFAULT_PS == tuple(2**i for i in range(7))
    assert [(p.topology.workers, p.topology.ps) for p in table.rows] == [
        (w, p) for w in DEFAULT_WORKERS for p in DEFAULT_PS
    ]
    assert table.row(512, 64) == predict_step(SMALL, Topology(64, 512), SLOW_LINK)
    with pytest.raises(KeyError, match="3 workers"):
        table.row(3, 1)


def test_projection_rejects_bad_grids() -> None:
    with pytest.raises(ValueError, match="repeats"):
        project(SMALL, SLOW_LINK, ps=(1, 1))
    with pytest.raises(ValueError, match="positive whole number"):
        project(SMALL, SLOW_LINK, workers=(0,))
    with pytest.raises(ValueError, match="sharding"):
        project(SMALL, SLOW_LINK, sharding="random")


def test_weak_scaling_efficiency_never_improves_with_more_workers(projection: Projection) -> None:
    for ps in projection.ps:
        efficiencies = [projection.row(w, ps).efficiency for w in projection.workers]
        assert all(e is not None and 0 < e <= 1 for e in efficiencies)
        assert efficiencies == sorted(efficiencies, reverse=True)  # type: ignore[type-var]


@WHOLE_TENSOR
def test_whole_tensor_placement_cannot_go_below_the_largest_tensor(sharding: str) -> None:
    for step in resnet50_projection(sharding).rows:
        assert max(step.bytes_per_ps) >= LARGEST
        assert step.comm_s >= 2 * step.topology.workers * LARGEST * ARIES.beta
        assert step.imbalance >= step.topology.ps * LARGEST / RESNET50.total_bytes


def test_more_ps_stops_helping_once_they_outnumber_the_large_tensors(
    projection: Projection,
) -> None:
    gains = {
        ps: projection.row(512, ps).comm_s / projection.row(512, 2 * ps).comm_s
        for ps in projection.ps[:-1]
    }
    early = [gain for ps, gain in gains.items() if 2 * ps <= SATURATION]
    late = [gain for ps, gain in gains.items() if ps >= 2 * SATURATION]
    assert early and late
    assert min(early) > 1.5  # doubling the PS tasks nearly halves the step's communication
    if projection.sharding == "partitioned":
        assert min(late) > 1.5  # slices keep spreading the load
    else:
        assert max(late) < 1.1  # the largest tensors' PS tasks stay the bottleneck


def test_imbalance_grows_past_saturation_unless_partitioned(projection: Projection) -> None:
    imbalance = [projection.row(512, ps).imbalance for ps in projection.ps]
    if projection.sharding == "partitioned":
        assert max(imbalance) < 1.5
    else:
        assert imbalance[-1] > 2 * max(
            i for ps, i in zip(projection.ps, imbalance, strict=True) if ps <= 8
        )
        past = [i for ps, i in zip(projection.ps, imbalance, strict=True) if ps > SATURATION]
        assert past == sorted(past)


def test_efficiency_holds_while_ps_tasks_spread_the_load(projection: Projection) -> None:
    # Four workers per PS task: while the PS tasks balance the bytes, each one's load stays the
    # same as both grow, and so does the efficiency.
    diagonal = {ps: projection.row(4 * ps, ps).efficiency for ps in (1, 2, 4, 8, 16, 32, 64)}
    assert all(e is not None for e in diagonal.values())
    start = diagonal[1]
    assert start is not None and start > 0.8
    spread = [e for ps, e in diagonal.items() if ps < SATURATION]
    assert min(e for e in spread if e is not None) > start - 0.05
    end = diagonal[64]
    assert end is not None
    if projection.sharding == "partitioned":
        assert end > start - 0.1
    else:
        assert end < start - 0.2


def test_projection_format_is_an_aligned_table(projection: Projection) -> None:
    lines = projection.format().splitlines()
    assert lines[0].split() == [
        *("workers", "ps", "busiest", "ps", "in", "shards", "imbalance", "limit"),
        *("comm", "step", "efficiency"),
    ]
    assert len(lines) == 1 + len(projection.rows)
    assert len({len(line) for line in lines}) == 1  # right-aligned columns, equal widths
    first = lines[1].split()
    assert first[:2] == ["1", "1"] and first[-1] == f"{projection.rows[0].efficiency:.1%}"
    grid = projection.format_grid().splitlines()
    assert grid[0].split()[3:] == [str(ps) for ps in projection.ps]
    assert len(grid) == 1 + len(projection.workers)
    assert grid[-1].split()[-1] == f"{projection.row(512, 128).efficiency:.1%}"


def test_grid_shows_communication_time_without_compute() -> None:
    table = project(SMALL, SLOW_LINK, workers=(1, 3), ps=(2,))
    assert table.format_grid().splitlines()[2].split() == ["3", "15.6ms"]
    assert table.format().splitlines()[2].split()[-1] == "-"


# --- tfgrpc-model ------------------------------------------------------------------------------


def _junit(cases: dict[str, dict[str, str]]) -> str:
    body = []
    for name, props in cases.items():
        items = "".join(f'<property name="{k}" value="{v}"/>' for k, v in props.items())
        body.append(
            f'<testcase classname="test_perf" name="{name}" time="1.0">'
            f"<properties>{items}</properties></testcase>"
        )
    return (
        '<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">'
        f'<testsuite name="pytest" errors="0" failures="0" skipped="0" tests="{len(cases)}" '
        f'time="1.0">{"".join(body)}</testsuite></testsuites>'
    )


def _p2p_properties(fabric: str, alpha: float, bandwidth: float) -> dict[str, str]:
    props = {"tfgrpc.fabric": fabric, "tfgrpc.p2p_latency.rpc": "unary"}
    for label in ("4B", "1KiB", "64KiB"):
        n = {"4B": 4, "1KiB": 1024, "64KiB": 64 << 10}[label]
        props[f"tfgrpc.p2p_latency.{label}.p50_us"] = repr(hockney(2 * n, alpha, bandwidth) * 1e6)
        # Figures the fit must not read: another percentile and a model prediction.
        props[f"tfgrpc.p2p_latency.{label}.p99_us"] = "1e9"
        props[f"tfgrpc.p2p_latency.{label}.samples"] = "1000"
    for label, n in (("1MiB", 1 << 20), ("16MiB", 16 << 20)):
        props[f"tfgrpc.p2p_bandwidth.{label}.p50_us"] = repr(hockney(n, alpha, bandwidth) * 1e6)
    props["tfgrpc.p2p_latency.model.step_comm_us"] = "12.5"
    return props


@pytest.fixture
def perf_xml(tmp_path: Path) -> Path:
    path = tmp_path / "perf.xml"
    path.write_text(
        _junit(
            {
                "test_p2p[lo]": _p2p_properties("lo", 30e-6, 2e9),
                "test_p2p[veth0]": _p2p_properties("veth0", 200e-6, 1.25e8),
                "test_other[lo]": {"tfgrpc.fabric": "lo", "tfgrpc.ps_step.1KiB.p50_us": "9"},
            }
        ),
        encoding="utf-8",
    )
    return path


def test_link_points_from_junit(perf_xml: Path) -> None:
    points = link_points_from_junit(perf_xml)
    assert sorted(points) == ["lo", "veth0"]
    assert sorted(n for n, _ in points["lo"]) == [8, 2048, 128 << 10, 1 << 20, 16 << 20]
    assert dict(points["lo"])[2048] == pytest.approx(hockney(2048, 30e-6, 2e9))


def test_cli_fits_a_results_file_like_a_junit_file(
    perf_xml: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "results.jsonl"
    with ResultLog(results, fsync=False) as log:
        log.append(
            "test_p2p[lo]",
            outcome="passed",
            duration=1.0,
            properties=_p2p_properties("lo", 30e-6, 2e9),
        )
        log.append("test_other[lo]", outcome="passed", duration=1.0, properties={"x": "1"})
    assert link_points_from_results(results) == {"lo": link_points_from_junit(perf_xml)["lo"]}
    argv = ["--profile", "resnet50", "--ps", "1,2", "--workers", "1,4", "--fabric", "lo"]
    assert main([*argv, "--from-results", str(results)]) == 0
    from_results = capsys.readouterr().out
    assert main([*argv, "--from-junit", str(perf_xml)]) == 0
    assert capsys.readouterr().out == from_results
    assert main([*argv, "--from-results", str(tmp_path / "missing.jsonl")]) == 1
    assert "results file" in capsys.readouterr().err


def _with_floors(props: dict[str, str]) -> dict[str, str]:
    """``props`` with transport-floor rows as the plugin records them, far from the gRPC link:
    a fit that read them would move."""
    out = dict(props)
    for name, value in props.items():
        for label in ("p2p_latency", "p2p_bandwidth"):
            if name.startswith(f"tfgrpc.{label}.") and name.endswith(".p50_us"):
                out[name.replace(label, f"{label}_floor", 1)] = repr(float(value) / 30)
    return out


def test_from_junit_and_from_results_ignore_floor_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = _p2p_properties("lo", 300e-6, 1e9)
    floored = _with_floors(plain)
    assert any("_floor." in name for name in floored)
    for case, props in (("plain", plain), ("floored", floored)):
        (tmp_path / f"{case}.xml").write_text(_junit({"test_p2p[lo]": props}), encoding="utf-8")
        with ResultLog(tmp_path / f"{case}.jsonl", fsync=False) as log:
            log.append("test_p2p[lo]", outcome="passed", duration=1.0, properties=props)
    assert link_points_from_junit(tmp_path / "floored.xml") == link_points_from_junit(
        tmp_path / "plain.xml"
    )
    assert link_points_from_results(tmp_path / "floored.jsonl") == link_points_from_results(
        tmp_path / "plain.jsonl"
    )
    argv = ["--profile", "resnet50", "--ps", "1", "--workers", "1,2"]
    outputs = set()
    for source, name in (
        ("--from-junit", "plain.xml"),
        ("--from-junit", "floored.xml"),
        ("--from-results", "plain.jsonl"),
        ("--from-results", "floored.jsonl"),
    ):
        assert main([*argv, source, str(tmp_path / name)]) == 0
        outputs.add(capsys.readouterr().out)
    assert len(outputs) == 1


def test_cli_with_given_link(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--profile", "resnet50", "--ps", "1,2,4", "--workers", "1,2,4,8"]
    argv += ["--sharding", "greedy", "--alpha", "50us", "--bandwidth", "1.2 GB/s"]
    argv += ["--compute", "200ms", "--overlap", "0.5"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    expected = project(
        "resnet50",
        LinkFit.given(50e-6, 1.2e9),
        workers=(1, 2, 4, 8),
        ps=(1, 2, 4),
        sharding="greedy",
        compute_s=0.2,
        overlap=0.5,
    )
    # The PS projection, then the ring all-reduce over the same link beside it.
    ps_part, allreduce_part = out.split("\n\nring all-reduce of the profile", 1)
    assert ps_part == f"{expected.describe()}\n\n{expected.format()}"
    assert [line.split()[0] for line in allreduce_part.splitlines()[2:]] == ["1", "2", "4", "8"]
    assert "sharding greedy" in out and "alpha 50.0us" in out and "compute 200ms" in out


def test_cli_grid(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--profile", "hep_cnn", "--ps", "1,2", "--workers", "1,64"]
    assert main([*argv, "--alpha", "5us", "--bandwidth", "10Gbit/s", "--grid"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].split() == ["workers", "\\", "ps", "1", "2"]
    grid = lines[3 : lines.index("", 3)]  # the all-reduce table follows a blank line
    assert [line.split()[0] for line in grid] == ["1", "64"]


def test_cli_fits_each_fabric_of_a_junit_file(
    perf_xml: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--profile", "resnet50", "--ps", "1,2", "--workers", "1,4", "--from-junit"]
    assert main([*argv, str(perf_xml)]) == 0
    blocks = capsys.readouterr().out.split("\n\n")
    headers = [block for block in blocks if block.startswith("resnet50")]
    assert len(headers) == 2
    assert "link lo: alpha 30.0us, bandwidth 2.00 GB/s (fitted to 5 points" in headers[0]
    assert "link veth0: alpha 200us, bandwidth 125 MB/s" in headers[1]
    assert main([*argv, str(perf_xml), "--fabric", "veth0"]) == 0
    out = capsys.readouterr().out
    assert "link veth0" in out and "link lo" not in out


@pytest.mark.parametrize(
    ("content", "extra", "message"),
    [
        (None, [], "does not exist"),
        ("not xml at all", [], "is not well-formed XML"),
        (_junit({"t": {"tfgrpc.fabric": "lo"}}), [], "holds no P2P figures to fit"),
        (
            _junit({"t": _p2p_properties("lo", 30e-6, 2e9)}),
            ["--fabric", "ib0"],
            "no P2P figures on fabric 'ib0' \\(it has: lo\\)",
        ),
        (
            _junit({"t": {"tfgrpc.fabric": "lo", "tfgrpc.p2p_latency.4B.p50_us": "50"}}),
            [],
            "fabric 'lo': an alpha-beta fit needs points at two or more message sizes",
        ),
    ],
)
def test_cli_junit_errors(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    content: str | None,
    extra: list[str],
    message: str,
) -> None:
    path = tmp_path / "perf.xml"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    assert main(["--profile", "resnet50", "--from-junit", str(path), *extra]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tfgrpc-model: error: ")
    assert len(err.splitlines()) == 1
    assert re.search(message, err)


def test_cli_unknown_profile(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--profile", "resnet5", "--alpha", "1us", "--bandwidth", "1GB/s"]) == 1
    assert "unknown profile 'resnet5'; known profiles: alexnet" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--alpha", "1us"], "--alpha and --bandwidth together"),
        ([], "--alpha and --bandwidth together, --from-junit or --from-results"),
        (["--alpha", "1us", "--bandwidth", "1GB/s", "--from-junit", "x.xml"], "one way"),
        (["--from-junit", "x.xml", "--from-results", "r.jsonl"], "one way"),
        (["--alpha", "1us", "--bandwidth", "1GB/s", "--fabric", "lo"], "give --from-junit"),
        (["--alpha", "1", "--bandwidth", "1GB/s"], "bare number is ambiguous"),
        (["--alpha", "1us", "--bandwidth", "0 GB/s"], "greater than zero"),
        (["--alpha", "1us", "--bandwidth", "1GB/s", "--ps", "1,x"], "'1,x' is not a comma"),
        (["--alpha", "1us", "--bandwidth", "1GB/s", "--ps", "0"], "at least 1"),
        (["--alpha", "1us", "--bandwidth", "1GB/s", "--overlap", "2"], "between 0 and 1"),
        (["--alpha", "1us", "--bandwidth", "1GB/s", "--sharding", "x"], "invalid choice"),
    ],
)
def test_cli_usage_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--profile", "resnet50", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
