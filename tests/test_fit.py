"""bench.fit: the sweep's sizes and layouts, the cost fits on known data, and one real fit.

The real fit runs on a 1 PS x 1 worker cluster on 127.0.0.1 with short runs; it checks what the
fit is made of and that a prediction reaches the step's JUnit properties, never how fast
anything was.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from junitparser.xunit2 import JUnitXml

from pytest_tfgrpc.bench.fit import (
    LATENCY_SIZES,
    Exchange,
    exchange_costs,
    exchange_hidden,
    exchange_layouts,
    measure_cores,
    measure_fit,
    measure_numpy_costs,
    median_exchanges,
    other_load,
    sweep_sizes,
)
from pytest_tfgrpc.bench.ps import sync_sgd_step
from pytest_tfgrpc.bench.timing import RunSpec
from pytest_tfgrpc.model.analytic import CpuCost, LinkFit, predict_step
from pytest_tfgrpc.model.placement import Topology, place, place_profile
from pytest_tfgrpc.model.profiles import Profile, load_profile
from pytest_tfgrpc.ps.ps_cluster import PSCluster
from pytest_tfgrpc.report.record import read_record, result_properties
from pytest_tfgrpc.report.summary import summary_rows
from pytest_tfgrpc.wire.fabric import resolve_fabric

PROFILE = load_profile("hep_cnn").scaled(scale=0.05)
SHORT = RunSpec(iterations=5, warmup=1, max_seconds=0.05, warmup_seconds=0.05)


def test_sweep_sizes_span_the_placement() -> None:
    placement = place([("a", 1000), ("b", 40), ("c", 3 << 20)], 2, "round_robin")
    sizes = sweep_sizes(placement, chunk_bytes=1 << 20)
    assert sizes[0] == 64  # the smallest message (40 B) raised to the floor
    assert sizes[-1] == 1000 + (3 << 20)  # the busiest PS (a and c), in whole floats
    assert all(size % 4 == 0 for size in sizes) and list(sizes) == sorted(set(sizes))
    capped = sweep_sizes(placement, chunk_bytes=1 << 20, largest=1 << 20)
    assert capped[-1] == 1 << 20
    tiny = sweep_sizes(place([("a", 8)], 1, "greedy"))
    assert len(tiny) >= 2 and tiny[-1] == 1 << 20  # bytes must show in the largest push
    with pytest.raises(ValueError, match="count=1"):
        sweep_sizes(placement, count=1)


def test_exchange_layouts_tell_calls_messages_and_bytes_apart() -> None:
    placement = place([(f"t{i}", 4096) for i in range(40)], 2, "round_robin")
    layouts = exchange_layouts(placement, chunk_bytes=1 << 20)
    shards = [count for count, _ in layouts]
    sizes = [size for _, size in layouts]
    assert shards == [1, 1, 1, 20]  # 20 messages on the busiest PS
    assert sizes == [64, 5 * 4096, 20 * 4096, 4096]  # the last: that PS's mean message
    assert len(set(layouts)) == 4
    # Slices count as messages, and their mean size is at most a slice.
    chunked = exchange_layouts(place([("big", 3 << 20), ("b", 40)], 1, "greedy"), 1 << 20)
    assert chunked[3] == (8, ((3 << 20) + 40) // 4 // 4 * 4)  # 3 slices and b; 8 shards at least
    many = exchange_layouts(place([(f"t{i}", 64) for i in range(300)], 1, "greedy"), 1 << 20)
    assert many[3] == (64, 64)  # at most 64 shards, at least 64 bytes each


def _exchange(shards: int, size: int, worker: CpuCost, ps: CpuCost, extra: float) -> Exchange:
    messages, nbytes = 2 * shards + 1, 2 * shards * size
    return Exchange(
        shards=shards,
        shard_bytes=size,
        messages=messages,
        nbytes=nbytes,
        worker_s=worker.time(2, messages, nbytes),
        ps_s=ps.time(2, messages, nbytes) + nbytes / 2 * extra,
        wall_s=0.0,
        count=10,
    )


def test_exchange_costs_recover_known_costs() -> None:
    worker = CpuCost(rpc_s=400e-6, message_s=60e-6, byte_s=0.5e-9)
    ps = CpuCost(rpc_s=500e-6, message_s=80e-6, byte_s=0.8e-9)
    numpy_per_byte = (0.03e-9, 0.1e-9)
    layouts = [(1, 64), (1, 1 << 18), (1, 1 << 22), (32, 64)]
    exchanges = [_exchange(k, n, worker, ps, sum(numpy_per_byte)) for k, n in layouts]
    got_worker, got_ps = exchange_costs(exchanges, *numpy_per_byte)
    for got, want in ((got_worker, worker), (got_ps, ps)):
        assert got.rpc_s == pytest.approx(want.rpc_s, rel=1e-6)
        assert got.message_s == pytest.approx(want.message_s, rel=1e-6)
        assert got.byte_s == pytest.approx(want.byte_s, rel=1e-6)
    # A cost the data would make negative is 0: here bytes cost nothing at all.
    free = CpuCost(400e-6, 60e-6, 0.0)
    flat = [_exchange(k, n, free, free, 0.0) for k, n in layouts]
    noisy = [
        Exchange(**{**x.__dict__, "worker_s": x.worker_s * (0.97 if x.shard_bytes > 64 else 1)})
        for x in flat
    ]
    fitted, _ = exchange_costs(noisy)
    assert fitted.byte_s == 0.0 and fitted.rpc_s > 0 and fitted.message_s > 0
    with pytest.raises(ValueError, match="three or more layouts"):
        exchange_costs(exchanges[:2])


def test_numpy_costs_and_cores_are_measured() -> None:
    aggregate, update = measure_numpy_costs(1 << 16, min_seconds=0.005)
    assert 0 < aggregate < 1e-6 and 0 < update < 1e-6  # well under a microsecond a byte
    cores = measure_cores(seconds=0.05, processes=2)
    assert 0 < cores <= 2
    with pytest.raises(ValueError, match="seconds=0"):
        measure_cores(seconds=0)


def test_other_load_follows_fair_sharing() -> None:
    assert other_load(2.0, 4, 2) == 0.0  # all the CPUs: nobody else
    assert other_load(1.0, 1, 2) == 0.0  # all one session can use
    assert other_load(1.0, 2, 2) == pytest.approx(2.0)  # half the share: as many others
    assert other_load(0.5, 4, 2) == pytest.approx(12.0)  # 2 / (4 + 12) each
    with pytest.raises(ValueError, match="got=0"):
        other_load(0.0, 2, 2)


def test_median_exchanges_take_each_layouts_median() -> None:
    def x(shards: int, worker: float, ps: float, wall: float) -> Exchange:
        return Exchange(shards, 64, 2 * shards + 1, 128 * shards, worker, ps, wall, 5)

    passes = [x(1, 1.0, 2.0, 3.0), x(2, 4.0, 4.0, 6.0), x(1, 9.0, 2.5, 2.0), x(1, 1.5, 9.0, 4.0)]
    one, two = median_exchanges(passes)
    assert (one.shards, one.worker_s, one.ps_s, one.wall_s, one.count) == (1, 1.5, 2.5, 3.0, 15)
    assert two == passes[1]


def test_exchange_hidden_recovers_known_overlap() -> None:
    worker = CpuCost(rpc_s=400e-6, message_s=60e-6, byte_s=0.5e-9)
    ps = CpuCost(rpc_s=500e-6, message_s=80e-6, byte_s=0.8e-9)
    both = CpuCost(rpc_s=100e-6, message_s=40e-6, byte_s=0.3e-9)
    layouts = [(1, 64), (1, 1 << 18), (1, 1 << 22), (32, 64)]
    exchanges = []
    for k, n in layouts:
        x = _exchange(k, n, worker, ps, 0.0)
        wall = x.worker_s + x.ps_s - both.time(2, x.messages, x.nbytes)
        exchanges.append(replace(x, wall_s=wall))
    hidden = exchange_hidden(exchanges)
    assert hidden.rpc_s == pytest.approx(both.rpc_s, rel=1e-6)
    assert hidden.message_s == pytest.approx(both.message_s, rel=1e-6)
    assert hidden.byte_s == pytest.approx(both.byte_s, rel=1e-6)
    # Others' load stretched the walls: at half a core each, twice as long for the same work.
    stretched = [replace(x, wall_s=2 * x.wall_s) for x in exchanges]
    assert exchange_hidden(stretched, rate=0.5) == hidden
    # Ends one after the other (or fewer than three layouts that overlap): nothing hidden.
    serial = [replace(x, wall_s=x.worker_s + x.ps_s) for x in exchanges]
    assert exchange_hidden(serial) == CpuCost(0.0, 0.0, 0.0)
    assert exchange_hidden(exchanges[:2]) == CpuCost(0.0, 0.0, 0.0)


@pytest.fixture(scope="module")
def cluster() -> Iterator[PSCluster]:
    with PSCluster(resolve_fabric("lo"), Topology(ps=1, workers=1, sharding="greedy")) as c:
        yield c


def test_measure_fit_on_ps0(cluster: PSCluster) -> None:
    placement = place_profile(PROFILE, 1, "greedy")
    machine = measure_fit(
        cluster,
        placement,
        chunk_bytes=4096,
        load=0.5,
        latency_run=SHORT,
        bandwidth_run=SHORT,
        exchange_run=SHORT,
    )
    echoes, pushes = machine.results
    assert [s.size_bytes for s in echoes.sizes] == list(LATENCY_SIZES)
    assert [s.size_bytes for s in pushes.sizes] == list(sweep_sizes(placement, 4096))
    assert pushes.settings["chunk_bytes"] == "4096" and pushes.mode == "protobuf"
    layouts = exchange_layouts(placement, 4096)
    assert [(x.shards, x.shard_bytes) for x in machine.exchanges] == 3 * [
        (k, n // 4 * 4) for k, n in layouts
    ]  # three passes
    for x in machine.exchanges:
        assert 1 <= x.count <= SHORT.iterations
        assert x.messages == 2 * x.shards * max(1, -(-x.shard_bytes // 4096)) + 1
        assert x.worker_s > 0 and x.ps_s > 0 and x.wall_s > 0
    host = machine.host
    assert host.cores == len(os.sched_getaffinity(0)) and host.load == 0.5
    assert all(v >= 0 for v in (host.hidden.rpc_s, host.hidden.message_s, host.hidden.byte_s))
    for cost in (host.worker, host.ps):
        assert all(math.isfinite(v) and v >= 0 for v in (cost.rpc_s, cost.message_s, cost.byte_s))
    assert host.aggregate_byte_s > 0 and host.update_byte_s > 0
    assert machine.link.fabric == "lo" and len(machine.link.points) == 2 + len(pushes.sizes)
    assert machine.ps_links == (machine.link,)  # one PS: its own link is the link
    assert "lo: alpha" in machine.describe() and "CPU: worker" in machine.describe()


def test_the_step_after_a_fit_carries_its_prediction(cluster: PSCluster) -> None:
    steps = RunSpec(iterations=3, warmup=1, max_seconds=10.0, warmup_seconds=5.0)
    result = sync_sgd_step(cluster, PROFILE, run=steps, model=True, label="sgd")
    prediction = result.prediction
    assert prediction is not None and result.placement is not None
    assert prediction.bytes_per_ps == result.placement.bytes_per_ps()
    assert prediction.topology == cluster.topology and prediction.host is not None
    point = result.sizes[0]
    assert point.count == 3  # the fit's job on PS 0 did not disturb the step's
    props = dict(result_properties(result))
    model = f"tfgrpc.sgd.{point.label}.model."
    measured = float(props[f"tfgrpc.sgd.{point.label}.step_p50_us"])
    predicted = float(props[model + "step_us"])
    assert predicted == pytest.approx(prediction.iter_s * 1e6, rel=1e-5)
    error = float(props[model + "error_pct"])
    # Both figures are written with 6 significant digits (each off by up to 5e-6 of itself),
    # so the error recomputed from them may differ by up to ~1e-3 percentage points.
    assert error == pytest.approx(100 * (predicted - measured) / measured, abs=2e-3)
    assert props[model + "limit"] == prediction.limit
    # The prediction stays out of the terminal summary: one row, the measured step.
    rows = summary_rows(read_record("t", result_properties(result)))
    assert [(r.label, r.size) for r in rows] == [("sgd", point.key)]
    plain = sync_sgd_step(cluster, PROFILE, run=steps, label="plain")
    assert plain.prediction is None
    assert not any(".model." in name for name, _ in result_properties(plain))


SUITE = """
import pytest

@pytest.mark.message_profile("hep_cnn")
@pytest.mark.ps_topology(ps=1, workers=2)
def test_steps(tfgrpc, ps_cluster):
    result = tfgrpc.sync_sgd_step(ps_cluster)
    assert result.prediction is not None

@pytest.mark.message_profile("hep_cnn")
@pytest.mark.ps_topology(ps=1, workers=1)
def test_plain(tfgrpc, ps_cluster):
    assert tfgrpc.sync_sgd_step(ps_cluster, model=False).prediction is None
"""


def test_the_fixture_records_the_prediction_in_junit(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(SUITE)
    xml = pytester.path / "perf.xml"
    fast = ("--tfgrpc-iterations=3", "--tfgrpc-warmup=1", "--tfgrpc-max-seconds=5")
    result = pytester.runpytest(*fast, f"--junitxml={xml}")
    result.assert_outcomes(passed=2)
    props = {
        case.name: {p.name: p.value for p in case.properties()}  # type: ignore[attr-defined]
        for suite in JUnitXml.fromfile(str(xml))
        for case in suite
    }
    steps, plain = props["test_steps[lo]"], props["test_plain[lo]"]
    model = "tfgrpc.sync_sgd_step.hep_cnn.model."
    assert float(steps[model + "step_us"]) > 0
    assert math.isfinite(float(steps[model + "error_pct"]))
    assert steps[model + "limit"] in ("ps link", "worker link", "chain", "cores")
    assert not any(".model." in name for name in plain)
    label = "sync_sgd_step"
    table = result.stdout.str().split("PS load per task:")[0].splitlines()  # then per-PS rows
    summary = [line for line in table if f"  {label}  " in line]
    assert len(summary) == 2 and all(line.split()[1:3] == [label, "hep_cnn"] for line in summary)


def test_a_step_is_placed_once_and_the_model_takes_that_placement(
    cluster: PSCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The driver places the profile; the benchmark, the fit and the model use that placement.
    from pytest_tfgrpc.bench.driver import Driver
    from pytest_tfgrpc.bench.specs import run_layer
    from pytest_tfgrpc.model import placement, profiles

    placed: list[object] = []
    real_place = placement.place_profile
    loaded: list[object] = []
    real_load = profiles.load_profile

    def count_place(*args: Any, **kwargs: Any) -> Any:
        placed.append(args[0])
        return real_place(*args, **kwargs)

    def count_load(source: Any, **kwargs: Any) -> Any:
        loaded.append(source)
        return real_load(source, **kwargs)

    for name, module in list(sys.modules.items()):
        if name.startswith("pytest_tfgrpc"):
            if vars(module).get("place_profile") is real_place:
                monkeypatch.setattr(module, "place_profile", count_place)
            if vars(module).get("load_profile") is real_load:
                monkeypatch.setattr(module, "load_profile", count_load)
    driver = Driver(
        test="t",
        messages=None,
        budget=None,
        run=[
            run_layer(
                "test", {"iterations": 2, "warmup": 1, "max_seconds": 5.0, "warmup_seconds": 5.0}
            )
        ],
        record=lambda name, value: None,
    )
    result = driver.sync_sgd_step(cluster, PROFILE, model=True)
    assert placed == [PROFILE]
    assert result.prediction is not None and result.placement is not None
    assert result.prediction.bytes_per_ps == result.placement.bytes_per_ps()
    assert all(isinstance(source, Profile) for source in loaded)  # nothing read twice


def test_the_model_refuses_a_placement_of_another_topology() -> None:
    link = LinkFit.given(alpha=1e-4, bandwidth_Bps=1e9)
    two = place_profile(PROFILE, 2, "greedy")
    same = predict_step(PROFILE, Topology(2, 3, "greedy"), link, placement=two)
    assert same == predict_step(PROFILE, Topology(2, 3, "greedy"), link)
    for topology in (Topology(3, 3, "greedy"), Topology(2, 3, "round_robin")):
        with pytest.raises(ValueError, match="placement: 2 PS tasks by greedy for a topology"):
            predict_step(PROFILE, topology, link, placement=two)
