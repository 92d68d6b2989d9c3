"""Transport telemetry of the native engine: its client pauses with its connections open when
its measured phase starts and ends (``--pause-fd``), and the plugin reads their TCP state then,
on this host and, for a server elsewhere, on the server's host through its node agent."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest

from pytest_tfgrpc import native
from pytest_tfgrpc.bench import native_p2p
from pytest_tfgrpc.bench.p2p import BandwidthCall, LatencyCall
from pytest_tfgrpc.bench.streams import p2p_bandwidth_streams
from pytest_tfgrpc.bench.telemetry import probe_for
from pytest_tfgrpc.bench.timing import RunSpec
from pytest_tfgrpc.hosts.agent_client import AgentClient, AgentError
from pytest_tfgrpc.native.client import ClientPause, ClientSettings, parse_pause, run_client
from pytest_tfgrpc.plugin.emulated import EmulatedHosts
from pytest_tfgrpc.roles.native_server import start_tensor_server
from pytest_tfgrpc.roles.processes import ServerProcess
from pytest_tfgrpc.wire.client import connect
from pytest_tfgrpc.wire.fabric import resolve_fabric
from pytest_tfgrpc.wire.telemetry import TelemetryReader, own_connections, split_target

NOT_BUILT = native.unavailable_reason()
pytestmark = [
    pytest.mark.skipif(NOT_BUILT is not None, reason=NOT_BUILT or ""),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="netlink: Linux"),
]
RUN = RunSpec(iterations=20, warmup=2, max_seconds=2.0, warmup_seconds=1.0)
MiB4 = 4 << 20
Hosts = Callable[..., EmulatedHosts]


@pytest.fixture
def native_server() -> Iterator[ServerProcess]:
    with start_tensor_server(resolve_fabric("lo"), engine="native") as server:
        yield server


def _settings(server: ServerProcess) -> ClientSettings:
    return ClientSettings(
        target=server.target, benchmark="bandwidth", mode="raw", rpc="unary", size=MiB4,
        dtype="float32", iterations=5, warmup=1, max_seconds=2.0, warmup_seconds=1.0,
        deadline_s=30.0,
    )  # fmt: skip


@pytest.mark.parametrize("streams", [1, 3])
def test_the_client_pauses_with_its_connections_open_at_each_end_of_its_measured_phase(
    native_server: ServerProcess, streams: int
) -> None:
    """At the start the warm-up's bytes are on the connections, at the end every measured
    push's too; the client process waits meanwhile, tells the ends of its streams'
    connections (not its CPU reads' status channel's), its threads' run-queue wait and what
    telling took it, and an error in the hook comes back."""
    seen: list[tuple[str, int, int]] = []
    told: list[ClientPause] = []
    with probe_for(native_server) as probe:

        def pause(at: ClientPause) -> None:
            told.append(at)
            probe.told(at.ends)
            (probe.start if at.phase == "start" else probe.stop)()
            window = probe.windows[-1]
            reading = window.start["local"] if at.phase == "start" else window.end["local"]
            sent = sum(s.bytes_sent for s in reading.sockets if not s.server_side)
            seen.append((at.phase, at.pid, sent))

        measured = run_client(replace(_settings(native_server), streams=streams), pause=pause)
    assert [phase for phase, _, _ in seen] == ["start", "end"]
    assert seen[0][1] == seen[1][1] != os.getpid()
    assert seen[0][2] >= streams * 2 * MiB4  # each stream's prepare call and warm-up push
    pushes = sum(len(stream.samples_ns) for stream in measured.streams)
    assert seen[1][2] - seen[0][2] >= pushes * MiB4
    transport = probe.transport()
    assert transport is not None and transport.connections == streams
    # The same connections at both phases, one per stream, each to the server: the ends
    # the probe found.
    port = split_target(native_server.target)[1]
    assert told[0].ends == told[1].ends and len(told[0].ends) == streams
    assert all(far.endswith(f":{port}") for _, far in told[0].ends)
    ends = probe.windows[-1].end["local"].sockets
    clients = {s.local for s in ends if not s.server_side}
    assert clients == {near for near, _ in told[0].ends}
    # Its own run-queue wait, never shrinking, and a cost of its own at each pause.
    waits = [at.run_queue_wait_ns for at in told]
    assert waits[0] is not None and waits[1] is not None and 0 <= waits[0] <= waits[1]
    assert all(at.read_ns > 0 for at in told)

    def broken(at: ClientPause) -> None:
        raise RuntimeError(f"hook failed at {at.phase}")

    with pytest.raises(RuntimeError, match="hook failed at start"):
        run_client(_settings(native_server), pause=broken)


V4 = ("127.0.0.1:5", "127.0.0.1:9")
V6 = (("[::1]:5", "[::1]:9"), ("[::1]:6", "[::1]:9"))


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("s w120 r3400 127.0.0.1:5>127.0.0.1:9", ("start", (V4,), 120, 3400)),
        ("e r10 [::1]:5>[::1]:9 [::1]:6>[::1]:9", ("end", V6, None, 10)),
        ("s", ("start", (), None, 0)),
        ("e wx r x9 z1 a>b", ("end", (("a", "b"),), None, 0)),  # tokens it does not know
    ],
)
def test_a_pause_line_reads_as_its_phase_ends_wait_and_cost(
    line: str, expected: tuple[str, tuple[tuple[str, str], ...], int | None, int]
) -> None:
    at = parse_pause(line, pid=42)
    assert (at.phase, at.ends, at.run_queue_wait_ns, at.read_ns) == expected
    assert at.pid == 42


def test_native_on_loopback_records_telemetry_per_size_and_names_a_limit(
    native_server: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per size, the connections the client reports are looked up by their ends: no walk of
    the kernel's connection table."""

    def no_walk(self: TelemetryReader, address: str, port: int) -> None:
        raise AssertionError("a dump walked the connection table")

    monkeypatch.setattr(TelemetryReader, "_discover", no_walk)
    result = native_p2p.p2p_bandwidth(native_server, [MiB4], BandwidthCall(run=RUN))
    point = result.sizes[0]
    tcp = point.transport
    assert tcp is not None and tcp.sides == ("local",)
    assert tcp.retransmits == 0 and tcp.connections == 1
    assert tcp.bytes_sent >= point.count * MiB4 and tcp.rtt_ns
    assert point.limit is not None and point.limit.kind != ""
    assert point.cpu_wait.get("client") is not None  # as the client process read it itself
    echo = native_p2p.p2p_latency(native_server, [1024], LatencyCall(run=RUN)).sizes[0]
    assert echo.transport is not None and echo.transport.bytes_sent >= echo.count * 1024


def test_a_native_multi_stream_run_records_one_figure_over_all_its_connections(
    native_server: ServerProcess,
) -> None:
    streams = 3
    call = BandwidthCall(run=RUN)
    result = p2p_bandwidth_streams(native_server, [MiB4], call, streams=streams, engine="native")
    point = result.aggregate.sizes[0]
    tcp = point.transport
    assert tcp is not None and tcp.sides == ("local",)
    assert tcp.connections == streams and tcp.retransmits == 0
    assert tcp.bytes_sent >= point.count * MiB4 and len(tcp.rtt_ns) == 1
    assert point.limit is not None and point.cpu_wait.get("client") is not None
    assert all(stream.sizes[0].transport is None for stream in result.streams)


def test_native_through_an_agent_reads_the_servers_side_on_its_host(
    tfgrpc_emulated_hosts: Hosts,
) -> None:
    """A native server on host s0 (an uncapped link), started by its agent, measured by the
    native client from here: no retransmissions, the server's sockets and its run-queue wait
    read on s0, and a CPU side named as the limit. The agent reads no process it did not
    start. The veths report 10 Gbit/s, no rate of this path: 100 Gbit/s is named for it."""
    hosts = tfgrpc_emulated_hosts("s0")
    driver = replace(resolve_fabric(hosts.fabric.bridge), link_rate_Bps=100e9 / 8)
    with AgentClient(hosts.agent_targets()[0], hosts.token) as agent:
        server = start_tensor_server(driver, engine="native", launcher=agent.launcher())
        try:
            # The kernel may retransmit a segment when the machine is busy (22 seen once under
            # load): up to three runs, and one of them must record none.
            for _ in range(3):
                result = native_p2p.p2p_bandwidth(server, [MiB4], BandwidthCall(run=RUN))
                seen = result.sizes[0].transport
                if seen is not None and seen.retransmits == 0:
                    break
            address, port = split_target(server.target)
            with pytest.raises(AgentError, match=r"process 1 is no role driver .* started"):
                agent.telemetry(address, port, pid=1)
            # Told a connection's client ends, the agent looks that one up by its addresses:
            # of two connections open to the server, it answers with the one it was told of
            # (a dump of the port's sockets would answer with both).
            with connect(server.target, server=server), connect(server.target, server=server):
                ends = own_connections(port)
                assert len(ends) == 2
                told = agent.telemetry(address, port, connections=ends[:1])
        finally:
            server.stop()
    assert [(s.server_side, s.remote) for s in told.sockets] == [(True, ends[0][0])]
    point = result.sizes[0]
    tcp = point.transport
    assert tcp is not None and tcp.sides == ("local", "s0")
    assert tcp.retransmits == 0 and tcp.connections == 1
    assert tcp.bytes_sent >= point.count * MiB4
    assert point.cpu_wait.get("server") is not None  # the agent read it on s0
    assert point.limit is not None
    assert (point.limit.kind, point.limit.side in ("client", "server")) == ("cpu", True), (
        point.limit.describe()
    )
