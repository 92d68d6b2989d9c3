"""Our parameter server measured by pytest-tfgrpc through the engine in conftest.py:

pytest example_suites/custom_ps --junitxml=myps.xml
pytest example_suites/custom_ps --tfgrpc-baseline=myps.xml    # later: the gate
"""

import pytest

pytestmark = [pytest.mark.tfgrpc_engines("myps"), pytest.mark.tfgrpc_run(iterations=200)]


@pytest.mark.message_profile(["1KiB", "64KiB"])
@pytest.mark.budget(p99="50ms")
def test_latency(tfgrpc, tensor_server):
    tfgrpc.p2p_latency(tensor_server)


@pytest.mark.message_profile(["1MiB", "4MiB"])
@pytest.mark.budget(throughput=">=50 MB/s")
def test_pull_bandwidth(tfgrpc, tensor_server):
    tfgrpc.p2p_bandwidth(tensor_server, direction="pull")


@pytest.mark.message_profile("resnet50", scale=0.01)
@pytest.mark.ps_topology(ps=2, workers=1)
@pytest.mark.budget(p50="1s", throughput=">=1 MB/s")
def test_resnet50_exchange(tfgrpc, ps_cluster):
    tfgrpc.ps_throughput(ps_cluster)
