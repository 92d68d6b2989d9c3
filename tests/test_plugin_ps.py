"""The PS benchmarks through the plugin: ps_topology, ps_cluster, JUnit figures, budgets."""

from __future__ import annotations

import pytest
from junitparser.xunit2 import JUnitXml

from pytest_tfgrpc.model.placement import place_profile
from pytest_tfgrpc.model.profiles import load_profile

FAST = ("--tfgrpc-iterations=8", "--tfgrpc-warmup=1", "--tfgrpc-max-seconds=5")


def properties(xml: str) -> dict[str, dict[str, str]]:
    return {
        case.name: {p.name: p.value for p in case.properties()}  # type: ignore[attr-defined]
        for suite in JUnitXml.fromfile(xml)
        for case in suite
    }


SUITE = """
import pytest
from pytest_tfgrpc import assert_budget

@pytest.mark.message_profile(["64B", "64KiB"])
@pytest.mark.ps_topology(ps=2, workers=3)
def test_throughput(tfgrpc, ps_cluster):
    result = tfgrpc.ps_throughput(ps_cluster)
    assert [p.key for p in result.sizes] == ["64B", "64KiB"]
    assert_budget(result, rpc_rate=">=1")

@pytest.mark.message_profile("hep_cnn")
@pytest.mark.ps_topology(ps=2, workers=2, sharding="greedy")
@pytest.mark.budget(imbalance="<=2", p50="60s")
def test_placed_throughput(tfgrpc, ps_cluster):
    tfgrpc.ps_throughput(ps_cluster, label="placed")

@pytest.mark.message_profile("hep_cnn")
@pytest.mark.ps_topology(ps=2, workers=2, sharding="partitioned")
def test_steps(tfgrpc, ps_cluster):
    result = tfgrpc.sync_sgd_step(ps_cluster)
    assert result.sizes[0].count == 8
"""


def test_ps_benchmarks_reach_junit(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(SUITE)
    xml = pytester.path / "perf.xml"
    result = pytester.runpytest(*FAST, f"--junitxml={xml}")
    result.assert_outcomes(passed=3)
    props = properties(str(xml))
    throughput = props["test_throughput[lo]"]
    assert throughput["tfgrpc.ps_throughput.topology"] == "2ps_3workers_round_robin"
    for key in ("64B", "64KiB"):
        assert float(throughput[f"tfgrpc.ps_throughput.{key}.rpc_rate_per_s"]) > 0
        for ps in (0, 1):
            assert int(throughput[f"tfgrpc.ps_throughput.{key}.ps{ps}.rpcs"]) > 0
            # each PS task's connections, read around the job
            assert throughput[f"tfgrpc.ps_throughput.{key}.ps{ps}.retransmits"] == "0"
        assert throughput[f"tfgrpc.ps_throughput.{key}.limit"]
    hep = load_profile("hep_cnn")
    placed = props["test_placed_throughput[lo]"]
    greedy = place_profile(hep, 2, "greedy")
    imbalance = float(placed["tfgrpc.placed.hep_cnn.imbalance"])
    assert imbalance == pytest.approx(greedy.imbalance, rel=1e-5)
    steps = props["test_steps[lo]"]
    partitioned = place_profile(hep, 2, "partitioned")
    assert float(steps["tfgrpc.sync_sgd_step.hep_cnn.imbalance"]) == pytest.approx(
        partitioned.imbalance, rel=1e-5
    )
    assert steps["tfgrpc.sync_sgd_step.hep_cnn.samples"] == "8"
    assert float(steps["tfgrpc.sync_sgd_step.hep_cnn.step_p50_us"]) > 0
    for ps in (0, 1):  # every worker pushed and pulled this task's shards
        sent = float(steps[f"tfgrpc.sync_sgd_step.hep_cnn.ps{ps}.tcp_bytes_sent"])
        assert sent >= float(steps[f"tfgrpc.sync_sgd_step.hep_cnn.ps{ps}.bytes_in"])
    result.stdout.re_match_lines(
        # a named limit; cpu-bound names its side: "cpu-bound (ps0)"
        [r".*::test_steps +sync_sgd_step .*hep_cnn +lo .* 8 +(\S+-bound( \([^)]*\))?|unknown)$"]
    )


@pytest.mark.parametrize(
    ("marker", "expected"),
    [
        ("ps_topology(ps=0)", "@pytest.mark.ps_topology argument ps=0"),
        ("ps_topology(sharding='random')", "sharding='random'"),
        ("ps_topology(nodes=3)", "'nodes'"),
    ],
)
def test_bad_topologies_lead_with_the_argument(
    pytester: pytest.Pytester, marker: str, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # the one-line summary cuts to the terminal's width
    pytester.makepyfile(
        test_t=f"""
        import pytest

        @pytest.mark.{marker}
        def test_cluster(ps_cluster):
            pass
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    lines = result.stdout.str().splitlines()
    summary = "ERROR test_t.py::test_cluster[lo] - Failed: @pytest.mark.ps_topology"
    assert any(line.startswith(summary) and expected in line for line in lines), lines


def test_a_ps_killed_mid_test_fails_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import os, signal

        def test_killed(tfgrpc, ps_cluster):
            os.kill(ps_cluster.ps[0].pid, signal.SIGKILL)
            tfgrpc.ps_throughput(ps_cluster, [64])
        """
    )
    result = pytester.runpytest(*FAST)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*PS 0 on lo exited with signal 9 (SIGKILL)*"])


def test_a_tests_profile_is_placed_once_and_handed_down(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fixture's tensor limit, ps_throughput's payload and sync_sgd_step's benchmark all
    # take the one placement the test makes; the result carries that very placement.
    from pytest_tfgrpc.model import placement

    calls: list[str] = []
    real = placement.place_profile

    def counting(profile, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(profile.name)
        return real(profile, *args, **kwargs)

    monkeypatch.setattr(placement, "place_profile", counting)
    pytester.makepyfile(
        """
import pytest

@pytest.mark.message_profile("hep_cnn", scale=0.05)
@pytest.mark.ps_topology(ps=2, workers=1, sharding="greedy")
def test_both(tfgrpc, ps_cluster):
    throughput = tfgrpc.ps_throughput(ps_cluster)
    steps = tfgrpc.sync_sgd_step(ps_cluster, model=False)
    assert throughput.placement is steps.placement is not None

@pytest.mark.message_profile("hep_cnn", scale=0.05)
def test_p2p(tfgrpc, tensor_server):
    tfgrpc.p2p_latency(tensor_server, iterations=2, warmup=0)
"""
    )
    result = pytester.runpytest_inprocess(*FAST, "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    assert len(calls) == 1  # test_both once; a P2P test places nothing
