"""The benchmarks, one module each; this package's names are the benchmark API."""

from pytest_tfgrpc.bench.p2p import BANDWIDTH_RUN, LATENCY_RUN, p2p_bandwidth, p2p_latency
from pytest_tfgrpc.bench.timing import RunSpec

__all__ = ["BANDWIDTH_RUN", "LATENCY_RUN", "RunSpec", "p2p_bandwidth", "p2p_latency"]
