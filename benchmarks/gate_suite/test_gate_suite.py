"""The small suite benchmarks/gate_calibration.py runs again and again: the issue's
1 KiB and 64 KiB echo latency and 1 MiB push bandwidth, at the default run settings."""

import pytest


@pytest.mark.message_profile(["1KiB", "64KiB"])
def test_echo_latency(tfgrpc, tensor_server):
    tfgrpc.p2p_latency(tensor_server)


@pytest.mark.message_profile(["1MiB"])
def test_push_bandwidth(tfgrpc, tensor_server):
    tfgrpc.p2p_bandwidth(tensor_server)
