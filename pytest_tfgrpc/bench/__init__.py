"""The benchmarks, one module each; this package's names are the benchmark API.

Also the timing loops, run settings, the driver the ``tfgrpc`` fixture hands out, and the
engines (``bench.engines``) that measure with grpcio, the native engine or TensorFlow.

Layer: beside ``cli`` (neither imports the other), below ``plugin``; may import ``hosts``,
``ps``, ``report``, ``roles`` and every layer below them, never pytest.
"""

from pytest_tfgrpc.bench.allreduce import ALLREDUCE_RUN, allreduce
from pytest_tfgrpc.bench.p2p import (
    BANDWIDTH_RUN,
    LATENCY_RUN,
    BandwidthCall,
    LatencyCall,
    p2p_bandwidth,
    p2p_latency,
)
from pytest_tfgrpc.bench.ps import PS_THROUGHPUT_RUN, SYNC_SGD_RUN, ps_throughput, sync_sgd_step
from pytest_tfgrpc.bench.timing import RunSpec

__all__ = [
    "ALLREDUCE_RUN",
    "BANDWIDTH_RUN",
    "LATENCY_RUN",
    "PS_THROUGHPUT_RUN",
    "SYNC_SGD_RUN",
    "BandwidthCall",
    "LatencyCall",
    "RunSpec",
    "allreduce",
    "p2p_bandwidth",
    "p2p_latency",
    "ps_throughput",
    "sync_sgd_step",
]
