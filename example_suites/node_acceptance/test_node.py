"""Node acceptance: does a new node move tensors as well as a known-good one?

Run an agent on the node under test and on a peer, and the suite from the peer, once against a
known-good node (the baseline) and once against the new node, gated:

    # on the known-good node, the new node and the peer (same token everywhere)
    tfgrpc-node --fabric ib0 --token-file ~/.tfgrpc-token
    # on the peer
    pytest example_suites/node_acceptance --fabric=ib0 \
        --tfgrpc-agents=good-node:7461,peer:7461 --tfgrpc-agent-token-file ~/.tfgrpc-token \
        --junitxml=good.xml
    pytest example_suites/node_acceptance --fabric=ib0 \
        --tfgrpc-agents=new-node:7461,peer:7461 --tfgrpc-agent-token-file ~/.tfgrpc-token \
        --junitxml=new.xml --tfgrpc-baseline=good.xml --tfgrpc-max-regression=10%

The tensor server runs on the first agent (the node under test); the PS runs there too and
the worker on the peer, so every figure crosses the node's own link. A regression beyond the
tolerance fails its test with the table of baseline and current figures.
"""

import pytest


@pytest.mark.message_profile(["64B", "64KiB"])
def test_latency(tfgrpc, tensor_server):
    tfgrpc.p2p_latency(tensor_server)


@pytest.mark.message_profile(["4MiB"])
def test_bandwidth(tfgrpc, tensor_server):
    tfgrpc.p2p_bandwidth(tensor_server)


@pytest.mark.message_profile(["1MiB"])
@pytest.mark.ps_topology(ps=1, workers=1)
def test_ps_throughput(tfgrpc, ps_cluster):
    tfgrpc.ps_throughput(ps_cluster)
