"""Transport telemetry of PS benchmarks: each PS task's connections read when a job's workers
are ready and when their replies are in (the workers keep their connections between jobs),
recorded per PS task and for the point."""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Sequence

import pytest

from pytest_tfgrpc import native
from pytest_tfgrpc.bench.ps import ps_throughput
from pytest_tfgrpc.bench.telemetry import ClusterProbe
from pytest_tfgrpc.bench.timing import RunSpec
from pytest_tfgrpc.model.placement import Topology
from pytest_tfgrpc.ps.ps_cluster import PSCluster
from pytest_tfgrpc.report.record import read_record, result_properties
from pytest_tfgrpc.wire.client import BenchmarkError
from pytest_tfgrpc.wire.fabric import resolve_fabric
from pytest_tfgrpc.wire.telemetry import TelemetryReader

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="netlink: Linux")
RUN = RunSpec(iterations=20, warmup=2, max_seconds=2.0, warmup_seconds=1.0)
SIZE = 64 << 10


@pytest.mark.parametrize("workers_engine", ["grpcio", "native"])
def test_each_ps_tasks_connections_are_read_around_every_job(
    monkeypatch: pytest.MonkeyPatch, workers_engine: str
) -> None:
    """Found by the ends the workers report when ready, Python's and C++'s alike: no walk of
    the connection table."""
    if workers_engine == "native" and (why := native.unavailable_reason()) is not None:
        pytest.skip(why)

    def no_walk(self: TelemetryReader, address: str, port: int) -> None:
        raise AssertionError("a dump walked the connection table")

    monkeypatch.setattr(TelemetryReader, "_discover", no_walk)
    topology = Topology(ps=2, workers=2)
    with PSCluster(resolve_fabric("lo"), topology, workers_engine=workers_engine) as cluster:
        results = [ps_throughput(cluster, [SIZE], run=RUN) for _ in range(2)]
    for result in results:  # the second job on the connections the first one opened
        point = result.sizes[0]
        for load in point.per_ps:
            tcp = load.transport
            assert tcp is not None, load.task
            assert tcp.connections == 2 and tcp.retransmits == 0  # one per worker
            assert tcp.bytes_sent >= load.bytes_in >= load.rpcs * SIZE > 0
            assert tcp.rtt_ns and tcp.sides == ("local",)
        assert point.transport is not None and point.transport.connections == 4
        assert point.transport.bytes_sent == sum(
            load.transport.bytes_sent for load in point.per_ps if load.transport
        )
        assert point.limit is not None
    figures = {(f.metric.name, f.scope): f.value for f in results[1].sizes[0].figures()}
    assert figures[("retransmits", "ps1")] == 0.0
    assert figures[("tcp_bytes_sent", "ps0")] > 0
    record = read_record("test_ps", result_properties(results[1]), strict=True)
    (recorded,) = record.measurements
    assert recorded.scoped["ps0"]["retransmits"] == 0.0
    assert recorded.scoped["ps1"]["rtt_p50"] > 0


def test_a_ps_job_that_breaks_quotes_what_each_tasks_connections_showed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PS 0 stops answering once the workers are ready (SIGSTOP: alive, silent), so a
    worker's call runs past its deadline (10 s of slack): the failure quotes what each PS
    task's connections showed meanwhile, as a P2P failure does."""
    stopped: list[int] = []
    start = ClusterProbe.start

    def start_then_stop_ps0(
        self: ClusterProbe, connections: Sequence[tuple[str, str]] = ()
    ) -> None:
        start(self, connections)
        os.kill(cluster.ps[0].pid, signal.SIGSTOP)
        stopped.append(cluster.ps[0].pid)

    monkeypatch.setattr(ClusterProbe, "start", start_then_stop_ps0)
    run = RunSpec(iterations=1000, warmup=1, max_seconds=0.5, warmup_seconds=0.2)
    with PSCluster(resolve_fabric("lo"), Topology(ps=2, workers=1)) as cluster:
        try:
            with pytest.raises(BenchmarkError) as failed:
                ps_throughput(cluster, [SIZE], run=run)
        finally:
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)
    assert stopped
    message = str(failed.value)
    assert "Throughput of 65536 B" in message and "DEADLINE_EXCEEDED" in message, message
    # PS 0's connection stays open (its kernel still answers); the worker may have closed
    # the one to PS 1 by the time it is read, which then says so.
    words = r"after \S+; [\d,]+ retransmissions, RTT \S+"
    assert re.search(rf"\(transport: ps0: {words}; ps1: after \S+; .+\)$", message), message
