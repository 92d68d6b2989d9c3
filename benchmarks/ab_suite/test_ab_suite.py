"""The suite of benchmarks/ab_calibration.py: one 1 KiB echo, as small as a trial can be."""

import pytest


@pytest.mark.message_profile(["1KiB"])
def test_echo_1k(tfgrpc, tensor_server):
    tfgrpc.p2p_latency(tensor_server)
