"""All-reduce through node agents on emulated hosts (root only; the fixture skips otherwise):
four workers, each on a host of its own behind a capped link, reduce over mutual TLS with
exact sums, and the model's prediction stands beside the measurement."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from pytest_tfgrpc.plugin.emulated import EmulatedHosts

Hosts = Callable[..., EmulatedHosts]

SUITE = """
import pytest

@pytest.mark.ps_topology(ps=1, workers=4)
def test_ring(tfgrpc, ps_cluster):
    tfgrpc.allreduce(ps_cluster, sizes="1MiB", check=True, iterations=10)
"""


def test_ring_allreduce_on_four_emulated_hosts(
    tfgrpc_emulated_hosts: Hosts, pytester: pytest.Pytester
) -> None:
    hosts = tfgrpc_emulated_hosts("ps0,w0,w1,w2,w3", rate="1gbit", tls=True)
    pytester.makepyfile(SUITE)
    xml = pytester.path / "out.xml"
    result = pytester.runpytest_subprocess(*hosts.pytest_args(), f"--junitxml={xml}", timeout=300)
    result.assert_outcomes(passed=1)
    text = xml.read_text()
    props = dict(re.findall(r'name="(tfgrpc\.[^"]*)" value="([^"]*)"', text))
    assert "checked=10" in props["tfgrpc.allreduce.settings"]
    assert "tls=mtls" in props["tfgrpc.allreduce.settings"]
    # every worker on its own host: the ends name four distinct worker hosts
    ends = props["tfgrpc.allreduce.ends"].split()
    assert len({end.split("=")[1].split("@")[0] for end in ends if end.startswith("worker")}) == 4
    busbw = float(props["tfgrpc.allreduce.1MiB.busbw_MBps"])
    assert 0 < busbw < 125  # 1 Gbit/s links: 125 MB/s of frames at most
    model = {k.rsplit(".model.", 1)[1]: v for k, v in props.items() if ".model." in k}
    # Emulated hosts are namespaces of this machine: the ranks report one boot id, so the model
    # takes them as sharing its CPUs, with the step measured where they run.
    assert model["sharing"] == "4" and float(model["rate"]) < 1
    assert float(model["shared_step_us"]) > 0
    # its CPU inputs were measured over the run's own mutual-TLS channels, as the ranks say
    assert model["inputs_tls"] == "mtls" and model["inputs_engine"] == "grpcio"
    # The error is a timing figure on a shared machine: printed, not asserted (docs/tasks/model.md).
    print(
        f"ring all-reduce of 1 MiB on 4 emulated hosts at 1 Gbit/s: busbw {busbw:.1f} MB/s, "
        f"step p50 {float(props['tfgrpc.allreduce.1MiB.step_p50_us']) / 1e3:.1f} ms, model "
        f"{float(model['step_us']) / 1e3:.1f} ms ({float(model['error_pct']):+.0f}%)"
    )
