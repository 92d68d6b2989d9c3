"""The plugin's grpcio service and TensorFlow's gRPC runtime side by side, on one fabric, in one
run and one JUnit file (needs the tensorflow extra; its tests skip without it)::

    pytest benchmarks/engines --junitxml=benchmarks/results/engines.xml
"""

import pytest

pytestmark = pytest.mark.tfgrpc_engines("grpcio", "tensorflow")
SIZES = ["1KiB", "64KiB", "1MiB", "4MiB", "16MiB", "64MiB"]


@pytest.mark.message_profile(["1KiB", "64KiB", "1MiB"])
@pytest.mark.tfgrpc_run(iterations=300, warmup=20, max_seconds=5)
def test_echo(tfgrpc, tensor_server):
    tfgrpc.p2p_latency(tensor_server, label="echo")


@pytest.mark.message_profile(SIZES)
@pytest.mark.tfgrpc_run(iterations=40, warmup=3, max_seconds=5)
def test_pull(tfgrpc, tensor_server):
    tfgrpc.p2p_bandwidth(tensor_server, direction="pull", rpc="unary", label="pull")


@pytest.mark.message_profile(SIZES)
@pytest.mark.tfgrpc_run(iterations=40, warmup=3, max_seconds=5)
def test_push(tfgrpc, tensor_server):
    tfgrpc.p2p_bandwidth(tensor_server, direction="push", label="push")


@pytest.mark.message_profile("resnet50")
@pytest.mark.ps_topology(ps=2, workers=1)
@pytest.mark.tfgrpc_run(iterations=40, warmup=3, max_seconds=10)
def test_resnet50_exchange(tfgrpc, ps_cluster):
    tfgrpc.ps_throughput(ps_cluster)
