"""The cluster-scale model: framework placement, each term, all-reduce, and calibration."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from pytest_tfgrpc.model.placement import place_profile
from pytest_tfgrpc.model.profiles import load_profile
from pytest_tfgrpc.model.scaling import (
    FITTABLE,
    ClusterTerms,
    MeasuredPoint,
    allreduce_step,
    calibrate,
    ps_step,
)

RESNET = "resnet50_tf_cnn"
TERMS = ClusterTerms(compute_s=0.5, bandwidth_Bps=2e9, alpha_s=50e-6)


def test_round_robin_follows_creation_slots() -> None:
    # Inception-v3 in tf_cnn_benchmarks has four variables per convolution (kernel, beta and
    # two moving statistics) after global_step: every kernel is at slot 1 + 4k, so with 2 or
    # 4 PS tasks one task holds every kernel; torchvision order spreads them.
    tf_order = place_profile(load_profile("inception3_tf_cnn"), 4, "round_robin")
    loads = tf_order.bytes_per_ps()
    assert loads[1] > 0.99 * sum(loads)
    assert tf_order.imbalance > 3.9
    torch_order = place_profile(load_profile("inception_v3"), 4, "round_robin")
    assert torch_order.imbalance < 2
    # greedy and partitioned do not depend on the slots
    assert place_profile(load_profile("inception3_tf_cnn"), 4, "partitioned").imbalance < 1.1


def test_each_term_switches_off() -> None:
    base = ps_step(RESNET, 16, 4, TERMS, sharding="greedy")
    assert base.limit.startswith("ps ")
    assert math.isclose(base.efficiency, TERMS.compute_s / base.step_s)
    overlapped = ps_step(RESNET, 16, 4, TERMS.__class__(**{**TERMS.__dict__, "overlap": 1.0}))
    assert overlapped.hidden_s > 0
    fixed = ps_step(RESNET, 16, 4, ClusterTerms(**{**TERMS.__dict__, "fixed": 0.1}))
    plain = ps_step(RESNET, 16, 4, TERMS)
    assert math.isclose(fixed.step_s - plain.step_s, 0.1 * TERMS.compute_s)
    # fixed and straggler losses need more than one worker
    one = ps_step(RESNET, 1, 1, ClusterTerms(**{**TERMS.__dict__, "fixed": 0.1, "straggler": 1}))
    assert math.isclose(one.step_s, ps_step(RESNET, 1, 1, TERMS).step_s)
    straggling = ps_step(RESNET, 64, 4, ClusterTerms(**{**TERMS.__dict__, "straggler": 0.05}))
    gap = straggling.step_s - ps_step(RESNET, 64, 4, TERMS).step_s
    assert math.isclose(gap, 0.05 * math.sqrt(2 * math.log(64)) * TERMS.compute_s)


def test_colocated_half_duplex_costs_more_than_full() -> None:
    full = ClusterTerms(**{**TERMS.__dict__, "colocated": True})
    half = ClusterTerms(**{**TERMS.__dict__, "colocated": True, "duplex": False})
    a, b = ps_step(RESNET, 8, 8, full), ps_step(RESNET, 8, 8, half)
    assert a.limit.startswith("host ") and b.comm_s > a.comm_s
    # a worker's own PS share is local: with one worker and one colocated PS, no traffic
    assert ps_step(RESNET, 1, 1, full).comm_s == pytest.approx(
        2 * 161 * 50e-6 + 2 * load_profile(RESNET).total_bytes / 2e9
    )


def test_network_core_grows_with_workers() -> None:
    core = ClusterTerms(**{**TERMS.__dict__, "core_Bps": 10e9})
    small, large = ps_step(RESNET, 8, 8, core), ps_step(RESNET, 128, 128, core)
    assert large.limit == "network core"
    assert large.comm_s == pytest.approx(2 * 128 * load_profile(RESNET).total_bytes / 10e9)
    assert large.efficiency < small.efficiency


def test_ring_allreduce_follows_the_nccl_tests_formula() -> None:
    size = load_profile(RESNET).total_bytes
    for n in (2, 8, 512):
        ring = allreduce_step(RESNET, n, TERMS)
        expected = 2 * (n - 1) / n * size / 2e9 + 2 * (n - 1) * 50e-6
        assert ring.comm_s == pytest.approx(expected)
        hd = allreduce_step(RESNET, n, TERMS, algorithm="halving_doubling")
        assert hd.comm_s == pytest.approx(
            2 * (n - 1) / n * size / 2e9 + 2 * math.ceil(math.log2(n)) * 50e-6
        )
    unfused = allreduce_step(RESNET, 8, TERMS, fused=False)
    assert unfused.comm_s == pytest.approx(2 * 7 / 8 * size / 2e9 + 14 * 161 * 50e-6)
    with pytest.raises(ValueError, match="ring, halving_doubling"):
        allreduce_step(RESNET, 8, TERMS, algorithm="tree")


GRID = [(1, 1), (2, 1), (4, 2), (8, 2), (8, 4), (16, 4), (16, 8), (32, 8), (32, 16), (64, 16)]


def _synthetic(truth: ClusterTerms, noise: float, seed: int) -> list[MeasuredPoint]:
    rng = np.random.default_rng(seed)
    return [
        MeasuredPoint(w, p, ps_step(RESNET, w, p, truth).efficiency + rng.normal(0, noise))
        for w, p in GRID
    ]


def test_calibration_recovers_known_terms_from_noisy_points() -> None:
    truth = ClusterTerms(compute_s=0.5, bandwidth_Bps=1.5e9, alpha_s=50e-6, overlap=0.6, fixed=0.05)
    start = ClusterTerms(compute_s=0.5, bandwidth_Bps=1e8, alpha_s=50e-6)
    fit = calibrate(_synthetic(truth, 0.005, seed=1), RESNET, start)
    by_name = {term.name: term for term in fit.fitted}
    assert set(by_name) == {"bandwidth", "overlap", "fixed"}
    for name, true_value in (("bandwidth", 1.5e9), ("overlap", 0.6), ("fixed", 0.05)):
        term = by_name[name]
        assert term.pinned, term
        assert term.sd is not None
        # within four standard uncertainties, and the uncertainty is not absurdly wide
        assert abs(term.value - true_value) < 4 * term.sd + 1e-9, term
        assert term.sd < 0.25 * true_value, term
    assert fit.rms < 0.01
    assert len(fit.residuals) == len(GRID)


def test_calibration_says_what_the_points_cannot_pin_down() -> None:
    # Compute-bound points (a huge bandwidth): nothing in them depends on the bandwidth.
    truth = ClusterTerms(compute_s=0.5, bandwidth_Bps=1e13, fixed=0.05)
    points = _synthetic(truth, 0.002, seed=2)
    fit = calibrate(points, RESNET, truth, free=("bandwidth", "fixed"))
    unpinned = fit.unpinned()
    assert "bandwidth" in unpinned and "fixed" not in unpinned
    few = calibrate(points[:3], RESNET, truth, free=("bandwidth", "overlap", "fixed"))
    assert any("fewer than 4" in warning for warning in few.warnings)
    assert all(not term.pinned for term in few.fitted)
    with pytest.raises(ValueError, match="fittable terms"):
        calibrate(points, RESNET, truth, free=("speed",))


def test_a_point_carries_the_placement_its_run_had() -> None:
    # Points run in two modes (tf_cnn_benchmarks' parameter_server and distributed_replicated)
    # are each predicted with their own placement; the others with the calibration's sharding.
    model = load_profile("inception3_tf_cnn")
    terms = ClusterTerms(compute_s=0.1, bandwidth_Bps=5e8, colocated=True)
    skewed = place_profile(model, 4, "round_robin")  # one task holds every kernel
    assert skewed.imbalance > 3.9
    points = [
        MeasuredPoint(w, 4, ps_step(model, w, 4, terms, sharding="greedy").efficiency)
        for w in (4, 8)
    ]
    points.append(
        MeasuredPoint(16, 4, ps_step(model, 16, 4, terms, placement=skewed).efficiency, "", skewed)
    )
    fit = calibrate(points, model, terms, free=(), sharding="greedy")
    assert fit.rms < 1e-12
    greedy = [replace(p, placement=None) for p in points]
    assert calibrate(greedy, model, terms, free=(), sharding="greedy").rms > 0.01
    with pytest.raises(ValueError, match="placement over 2 PS tasks"):
        MeasuredPoint(8, 4, 0.9, placement=place_profile(model, 2, "greedy"))
    other = place_profile(load_profile(RESNET), 4, "greedy")
    with pytest.raises(ValueError, match=r"holds .* bytes"):
        calibrate([MeasuredPoint(8, 4, 0.9, placement=other)], model, terms, free=())


def test_a_term_that_ends_at_either_bound_is_not_pinned() -> None:
    # AWS p2.xlarge's published W <= 32 points (e-bug/distributed-tensorflow-benchmarks,
    # table tab:peak-perf-p2), each placed as its mode did (W = 2-16 distributed_replicated:
    # round robin of one copy per variable after global_step), fitted with the network core
    # free too: the link's bandwidth runs to its upper bound (1e13 B/s, the core binds
    # instead), which once read as pinned.
    model = load_profile("inception3_tf_cnn")
    copies = replace(model, slots=tuple(range(1, model.num_tensors + 1)))
    rows = [(1, 1, 30.55), (2, 2, 57.45), (4, 4, 114.57), (8, 8, 228.41), (16, 12, 431.64)]
    points = [
        MeasuredPoint(w, p, x / (w * 30.55), placement=place_profile(copies, p, "round_robin"))
        if 2 <= w <= 16
        else MeasuredPoint(w, p, x / (w * 30.55))
        for w, p, x in [*rows, (32, 32, 825.64)]
    ]
    start = ClusterTerms(
        compute_s=64 / 30.55, bandwidth_Bps=1.1e9, alpha_s=50e-6, overlap=0.0, colocated=True
    )
    free = ("bandwidth", "overlap", "fixed", "core")
    fit = calibrate(points, model, start, free=free, sharding="greedy")
    by_name = {term.name: term for term in fit.fitted}
    assert by_name["bandwidth"].value > 0.99e13
    for term in fit.fitted:
        low, high = FITTABLE[term.name]
        if term.value <= low * (1 + 1e-5) or term.value >= high * (1 - 1e-5):
            assert not term.pinned and "ends at its bound" in term.why, term


def test_a_term_held_at_its_lower_bound_says_so() -> None:
    # Every point at full efficiency: the fixed loss runs to its lower bound (0), where
    # least_squares gives its column no slope; it once read "no point's efficiency depends
    # on it" although every point with more than one worker does.
    points = [MeasuredPoint(w, p, 1.0) for w, p in [(1, 1), (8, 2), (32, 4), (64, 8), (128, 16)]]
    fit = calibrate(
        points,
        "resnet50",
        ClusterTerms(compute_s=0.2, bandwidth_Bps=1e9),
        free=("overlap", "fixed"),
    )
    fixed = {term.name: term for term in fit.fitted}["fixed"]
    assert fixed.value < 1e-9
    assert not fixed.pinned and "ends at its bound" in fixed.why, fixed


def test_calibration_does_not_stop_where_it_started() -> None:
    # Piz Daint's published W <= 32 points (e-bug/distributed-tensorflow-benchmarks, table
    # tab:peak-perf-daint): started at overlap 0, the fit used to stop at a local minimum
    # (overlap 0.87, rms 1.6 points), started at 0.9 it reaches overlap 0.99 (rms 1.45).
    rows = [(1, 1, 138.23), (2, 1, 264.57), (4, 3, 523.38), (8, 2, 1018.18), (16, 4, 2001.0)]
    points = [MeasuredPoint(w, p, x / (w * 138.23)) for w, p, x in [*rows, (32, 12, 3840.35)]]
    start = ClusterTerms(compute_s=64 / 138.23, bandwidth_Bps=2.6e9, alpha_s=50e-6, colocated=True)
    fits = [
        calibrate(points, "inception3_tf_cnn", replace(start, overlap=o), sharding="greedy")
        for o in (0.0, 0.9)
    ]
    assert fits[0].rms == pytest.approx(fits[1].rms, abs=1e-4)
    assert fits[0].rms < 0.0150


def test_the_docs_table_is_the_committed_validation_output() -> None:
    # docs/tasks/model.md quotes benchmarks/results/model_validation.txt: each of its rows'
    # published, calibrated, + core and a-priori figures is that file's row for W and PS.
    root = Path(__file__).resolve().parent.parent
    output = (root / "benchmarks/results/model_validation.txt").read_text(encoding="utf-8")
    docs = (root / "docs/tasks/model.md").read_text(encoding="utf-8")
    curves = {"Piz Daint": "## Piz Daint", "p2.xlarge": "## AWS p2.xlarge"}
    rows = re.findall(r"^\| (Piz Daint|p2\.xlarge), (\d+) / (\d+) \| (.+) \|$", docs, re.M)
    assert len(rows) == 4
    for curve, workers, ps, cells in rows:
        block = output.split(curves[curve], 1)[1].split("\n## ", 1)[0]
        line = re.search(rf"^\s*{workers}\s+{ps}\s+(.+)$", block, re.M)
        assert line is not None, (curve, workers, ps)
        figures = re.findall(r"[-+]?\d+\.\d%?", cells.replace("\u2212", "-"))
        assert figures == line.group(1).split()[: len(figures)], (curve, workers, ps)
