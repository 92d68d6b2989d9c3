"""Parameter-server traffic, as TF-gRPC-Bench measures it and as sync SGD makes it.

Each test starts its own PS processes and worker processes on the fabric. A marker given
per parameter (``pytest.param(..., marks=...)``) sweeps schemes and sharding strategies.
Budgets are loose enough for a laptop; the figures are in the JUnit XML and the summary.
"""

import pytest

from pytest_tfgrpc import assert_budget

SCHEMES = ["uniform", "random", "skew"]
SHARDINGS = ["round_robin", "greedy", "partitioned"]


# TF-gRPC-Bench's PS throughput: 2 PS x 3 workers, every worker calling every PS with a
# payload of 10 iovec buffers drawn by the scheme (Small 10 B, Medium 10 KB, Large 1 MB).
@pytest.mark.ps_topology(ps=2, workers=3)
@pytest.mark.parametrize(
    "scheme", [pytest.param(s, marks=pytest.mark.message_profile(scheme=s)) for s in SCHEMES]
)
def test_ps_throughput_by_scheme(tfgrpc, ps_cluster, scheme):
    result = tfgrpc.ps_throughput(ps_cluster)
    assert_budget(result, rpc_rate=">=10")


# A synchronous SGD step of a scaled-down ResNet-50 (2% of every tensor, the same 161
# tensors): every worker pushes the gradients of the tensors each PS owns, each PS sums
# them, every worker pulls the new weights. The placement decides how even the PS load is.
@pytest.mark.message_profile("resnet50", scale=0.02)
@pytest.mark.parametrize(
    "sharding",
    [
        pytest.param(s, marks=pytest.mark.ps_topology(ps=2, workers=3, sharding=s))
        for s in SHARDINGS
    ],
)
def test_sync_sgd_step_by_sharding(tfgrpc, ps_cluster, sharding):
    result = tfgrpc.sync_sgd_step(ps_cluster)
    assert_budget(result, step_p50="5s", imbalance="<=2")
