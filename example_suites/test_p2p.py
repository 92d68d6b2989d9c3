"""A first suite to copy: how gradients and weights move between a worker and a PS.

Run it on the fabrics you care about:

    pytest example_suites --fabric=lo,eth0 --junitxml=perf.xml

Each test runs once per fabric. The budgets are loose enough to pass on a laptop's
loopback; tighten them to what your fabric should deliver.
"""

import pytest

from pytest_tfgrpc import assert_budget


# Small tensors (biases, BatchNorm parameters, small gradients) are latency-bound: what
# counts is the round trip, as TF-gRPC-Bench's P2P latency measures it with an echo.
@pytest.mark.message_profile(["4B", "1KiB", "64KiB"])
@pytest.mark.budget(p50="20ms", p99="100ms")
def test_small_gradient_latency(tfgrpc, tensor_server):
    tfgrpc.p2p_latency(tensor_server)


# The same round trip with every message a TensorProto, encoded and decoded inside the
# timed region: the difference to the test above is the serialization cost.
@pytest.mark.message_profile(["64KiB"])
def test_serialized_gradient_latency(tfgrpc, tensor_server):
    result = tfgrpc.p2p_latency(tensor_server, mode="protobuf")
    assert_budget(result, p50="20ms")


# Large weights (ResNet-50's last layer alone is 8 MB) are bandwidth-bound: the worker
# pushes, the PS acknowledges each tensor.
@pytest.mark.message_profile(["4MiB", "64MiB"])
def test_large_weight_push_bandwidth(tfgrpc, tensor_server):
    result = tfgrpc.p2p_bandwidth(tensor_server)
    assert_budget(result, throughput=">=50 MB/s")


# A worker fetching a weight from the PS, one unary call per tensor, as TensorFlow's
# RecvTensor does.
@pytest.mark.message_profile(["4MiB"])
def test_weight_pull_as_recvtensor(tfgrpc, tensor_server):
    result = tfgrpc.p2p_bandwidth(tensor_server, direction="pull", rpc="unary", mode="protobuf")
    assert_budget(result, throughput=">=50 MB/s")
