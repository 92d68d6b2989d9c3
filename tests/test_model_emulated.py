"""The in-run model on emulated hosts, one PS behind a slower link (root only; the fixture
skips otherwise): the prediction must fit each PS's own link and find the slow one."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from pytest_tfgrpc.plugin.emulated import EmulatedHosts

Hosts = Callable[..., EmulatedHosts]

SUITE = """
import pytest

@pytest.mark.message_profile("resnet50", scale=0.05)
@pytest.mark.ps_topology(ps=2, workers=2, sharding="greedy")
def test_step(tfgrpc, ps_cluster):
    tfgrpc.sync_sgd_step(ps_cluster, iterations=10, max_seconds=20)
"""


def test_the_model_fits_the_slow_ps_link(
    tfgrpc_emulated_hosts: Hosts, pytester: pytest.Pytester
) -> None:
    hosts = tfgrpc_emulated_hosts("ps0,ps1@200mbit,w0,w1", rate="1gbit")
    pytester.makepyfile(SUITE)
    xml = pytester.path / "out.xml"
    result = pytester.runpytest_subprocess(*hosts.pytest_args(), f"--junitxml={xml}", timeout=300)
    result.assert_outcomes(passed=1)
    props = dict(
        re.findall(r'name="(tfgrpc\.sync_sgd_step\.[^"]*)" value="([^"]*)"', xml.read_text())
    )
    model = {k.rsplit(".model.", 1)[1]: v for k, v in props.items() if ".model." in k}
    assert model["links"] == "each PS"
    assert model["bottleneck_ps"] == "1"
    # 200 Mbit/s is 25 MB/s of frames; the fit sees gRPC's payload rate through it
    assert 10 < float(model["busiest_ps_bandwidth_MBps"]) < 30
    assert float(model["bandwidth_MBps"]) > 2 * float(model["busiest_ps_bandwidth_MBps"])
    # The error is a timing figure on a shared machine: printed, not asserted (docs/tasks/model.md).
    print(f"model error on emulated hosts, ps1 at 200 Mbit/s: {model['error_pct']}%")
