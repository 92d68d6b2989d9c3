"""Transport telemetry: the socket-diagnostics reader, the windows, the limit rule, the words,
and the plugin end to end on loopback (the grpcio engine; the gate quoting the transport)."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import struct
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from junitparser.xunit2 import JUnitXml

from pytest_tfgrpc.bench.p2p import LatencyCall, p2p_latency
from pytest_tfgrpc.bench.partial import partial_result
from pytest_tfgrpc.bench.telemetry import TransportProbe, Window, summarize_windows
from pytest_tfgrpc.bench.timing import RunSpec
from pytest_tfgrpc.report.limits import CPU_SHARE, LINK_SHARE, name_limit
from pytest_tfgrpc.report.telemetry_text import gate_context, summary_cell
from pytest_tfgrpc.results import CpuTime, SizeResult, Transport
from pytest_tfgrpc.roles.processes import ServerProcess
from pytest_tfgrpc.wire.client import BenchmarkError
from pytest_tfgrpc.wire.fabric import resolve_fabric
from pytest_tfgrpc.wire.telemetry import (
    LinkState,
    Reading,
    TcpState,
    TelemetryReader,
    _tcp_state,
    own_connections,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="netlink: Linux")


@pytest.fixture
def connection() -> Iterator[tuple[socket.socket, socket.socket, int]]:
    """A TCP connection on loopback: (client, server end, server port)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = listener.accept()
        with client, accepted:
            yield client, accepted, port


def test_the_reader_finds_both_ends_of_a_connection_by_its_endpoint(
    connection: tuple[socket.socket, socket.socket, int],
) -> None:
    client, accepted, port = connection
    with TelemetryReader("lo") as reader:
        before = reader.read("127.0.0.1", port)
        client.sendall(b"x" * 200_000)
        got = 0
        while got < 200_000:
            got += len(accepted.recv(1 << 20))
        after = reader.read("127.0.0.1", port)
    ends = {state.server_side: state for state in after.sockets}
    assert set(ends) == {True, False}
    assert ends[False].local == f"127.0.0.1:{client.getsockname()[1]}"
    assert ends[False].bytes_sent - _sent(before, server_side=False) == 200_000
    assert ends[True].bytes_received >= 200_000
    assert ends[False].rtt_us > 0 and ends[False].cwnd > 0
    assert after.link is not None and after.link.interface == "lo"
    assert after.link.rx_bytes > before.link.rx_bytes if before.link else True
    assert after.link.speed_bps is None  # lo reports no speed: no nominal rate


@pytest.mark.parametrize("one_walk", [True, False], ids=["both-families", "per-family"])
def test_the_kernel_sends_only_the_endpoints_sockets_and_lookups_find_them_again(
    monkeypatch: pytest.MonkeyPatch, one_walk: bool
) -> None:
    """Among many connections to another port, the discovery's filtered dump (both families
    in one request, or one request a family) answers with the endpoint's sockets only, and the
    lookups at a window's end read those and nothing else."""
    from pyroute2.netlink.diag import inet_diag_msg

    answered: list[bytes] = []
    dump = TelemetryReader._dump

    def recording(self: TelemetryReader, sock: socket.socket, request: bytes) -> list[bytes]:
        out = dump(self, sock, request)
        if sock is self._kernel.diag:
            answered.extend(out)
        return out

    monkeypatch.setattr(TelemetryReader, "_dump", recording)
    with contextlib.ExitStack() as stack:
        other = stack.enter_context(socket.create_server(("127.0.0.1", 0)))
        for _ in range(20):
            stack.enter_context(socket.create_connection(other.getsockname()))
            stack.enter_context(other.accept()[0])
        listener = stack.enter_context(socket.create_server(("127.0.0.1", 0)))
        port = listener.getsockname()[1]
        client = stack.enter_context(socket.create_connection(("127.0.0.1", port)))
        accepted = stack.enter_context(listener.accept()[0])
        client_port = client.getsockname()[1]
        with TelemetryReader("lo") as reader:
            reader._any = one_walk
            found = reader.sockets("127.0.0.1", port)
            client.sendall(b"y" * 5000)
            assert len(accepted.recv(1 << 16)) > 0
            again = reader.sockets("127.0.0.1", port, discover=False)
            # A connection opened since is found by the next discovery (the namespace's open
            # count moved), though the sockets found before are still open.
            late = stack.enter_context(socket.create_connection(("127.0.0.1", port)))
            stack.enter_context(listener.accept()[0])
            late_port = late.getsockname()[1]
            more = reader.sockets("127.0.0.1", port)
    ends = {(f"127.0.0.1:{client_port}", False), (f"127.0.0.1:{port}", True)}
    assert {(s.local, s.server_side) for s in found} == ends
    assert {s.key for s in again} == {s.key for s in found}
    assert {s.local for s in more} - {s.local for s in found} == {f"127.0.0.1:{late_port}"}
    assert sum(s.bytes_sent for s in again if not s.server_side) == 5000
    assert answered and all(port in struct.unpack_from(">HH", a, 20) for a in answered)
    # The one-unpack decoding agrees with pyroute2's decoder of the same answer.
    message = inet_diag_msg(answered[0])
    message.decode()
    info = message.get_attr("INET_DIAG_INFO")
    state = _tcp_state(answered[0], server_side=True)
    assert state is not None and state.local.endswith(f":{message['idiag_sport']}")
    assert state.cwnd == info["tcpi_snd_cwnd"] and state.rtt_us == info["tcpi_rtt"]
    assert state.bytes_received == info["tcpi_bytes_received"]


@pytest.mark.parametrize("family", ["ipv4", "ipv4-mapped"])
def test_own_connections_are_looked_up_by_their_ends_without_a_walk(
    monkeypatch: pytest.MonkeyPatch, family: str
) -> None:
    """This process's client end of a connection is found from its descriptors (a dual-stack
    socket's mapped address as it is), and both ends are looked up by their addresses: no
    dump walks the connection table. An end that is gone finds nothing, not the listening
    socket a lookup by addresses falls back to."""

    def no_walk(self: TelemetryReader, address: str, port: int) -> tuple[TcpState, ...]:
        raise AssertionError("a dump walked the connection table")

    monkeypatch.setattr(TelemetryReader, "_discover", no_walk)
    with contextlib.ExitStack() as stack:
        listener = stack.enter_context(socket.create_server(("127.0.0.1", 0)))
        port = listener.getsockname()[1]
        if family == "ipv4":
            client = stack.enter_context(socket.create_connection(("127.0.0.1", port)))
            near, far = f"127.0.0.1:{client.getsockname()[1]}", f"127.0.0.1:{port}"
        else:
            client = stack.enter_context(socket.socket(socket.AF_INET6))
            client.connect(("::ffff:127.0.0.1", port))
            near = f"[::ffff:127.0.0.1]:{client.getsockname()[1]}"
            far = f"[::ffff:127.0.0.1]:{port}"
        accepted = stack.enter_context(listener.accept()[0])
        assert own_connections(port) == ((near, far),)
        with TelemetryReader("lo") as reader:
            found = reader.sockets("127.0.0.1", port, clients=own_connections)
            client.sendall(b"q" * 5000)
            assert len(accepted.recv(1 << 16)) > 0
            again = reader.sockets("127.0.0.1", port, discover=False)
        with TelemetryReader("lo") as reader:
            gone = reader.sockets(
                "127.0.0.1", port, clients=lambda p: [("127.0.0.1:1", f"127.0.0.1:{p}")]
            )
    client_port = int(near.rpartition(":")[2])
    assert {(s.local.rpartition(":")[2], s.server_side) for s in found} == {
        (str(client_port), False),
        (str(port), True),
    }
    assert {s.key for s in again} == {s.key for s in found}
    assert sum(s.bytes_sent for s in again if not s.server_side) == 5000
    assert sum(s.bytes_received for s in again if s.server_side) == 5000
    assert gone == ()


def _sent(reading: Reading, *, server_side: bool) -> int:
    return sum(s.bytes_sent for s in reading.sockets if s.server_side == server_side)


def test_a_probe_sums_its_windows_and_leaves_idle_channels_out(
    connection: tuple[socket.socket, socket.socket, int],
) -> None:
    client, accepted, port = connection
    idle = socket.create_connection(("127.0.0.1", port))  # another channel: idle meanwhile
    with idle, TransportProbe(f"127.0.0.1:{port}", "lo") as probe:
        for _ in range(3):
            probe.start()
            client.sendall(b"y" * 100_000)
            got = 0
            while got < 100_000:
                got += len(accepted.recv(1 << 20))
            probe.stop()
        transport = probe.transport()
    assert probe.errors == []
    assert transport is not None
    assert transport.connections == 1
    assert transport.bytes_sent == 300_000 and transport.retransmits == 0
    assert len(transport.rtt_ns) == 3 and all(rtt > 0 for rtt in transport.rtt_ns)
    assert transport.link_drops == 0 and transport.nominal_Bps is None


def test_a_probe_whose_connection_is_gone_quotes_its_last_reading() -> None:
    """A native client that exited: what its connection showed when last read, and what the
    host retransmitted since."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = listener.accept()
        with TransportProbe(f"127.0.0.1:{port}", "lo") as probe:
            with client, accepted:
                client.sendall(b"z" * 50_000)
                accepted.recv(1 << 20)
                probe.start()
            seen = probe.last_seen()
    assert re.fullmatch(
        r"after \S+; the connection is gone; this host retransmitted [\d,]+ segments, when "
        r"last read, \S+ before: 0 retransmissions, RTT \S+",
        seen,
    ), seen


def test_a_probe_that_never_saw_a_connection_says_so() -> None:
    """A target that refused every connection (nothing listens there): no reading found one,
    so the failure says none was seen, not that one is gone."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
    with TransportProbe(f"127.0.0.1:{port}", "lo") as probe:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2)
        seen = probe.last_seen()
    assert re.fullmatch(
        r"after \S+; no connection was seen; this host retransmitted [\d,]+ segments", seen
    ), seen


def _state(sent: int, retrans: int, *, server_side: bool = False) -> TcpState:
    return TcpState(
        local="10.0.0.1:5" if server_side else "10.0.0.2:6",
        remote="10.0.0.2:6" if server_side else "10.0.0.1:5",
        server_side=server_side,
        retransmits=retrans,
        data_segs_out=sent // 1000,
        bytes_sent=sent,
        bytes_acked=sent,
        bytes_retrans=0,
        bytes_received=0,
        rtt_us=200,
        rttvar_us=50,
        cwnd=10,
        delivery_rate_Bps=10**8,
    )


def _link(drops: int, rate: int | None) -> LinkState:
    return LinkState("fab0", 0, 0, 0, 0, 0, 0, "tbf" if rate else "", drops, rate, 10**10)


def test_windows_add_up_on_both_sides_with_the_lowest_rate() -> None:
    """The remote side's link is shaped: its tbf rate is the path's, not the local speed."""
    start = Reading(0, (_state(0, 0),), _link(0, None), 7)
    end = Reading(1, (_state(1_000_000, 30),), _link(0, None), 37)
    far_start = Reading(0, (), _link(5, 25_000_000), None)
    far_end = Reading(1, (), _link(9, 25_000_000), None)
    window = Window({"local": start, "ps0": far_start}, {"local": end, "ps0": far_end})
    transport = summarize_windows([window, window])
    assert transport is not None
    assert transport.retransmits == 60 and transport.bytes_sent == 2_000_000
    assert transport.qdisc_drops == 8
    assert transport.nominal_Bps == 25e6 and transport.nominal_source == "tbf of fab0@ps0"
    assert transport.retransmits_per_MB == 30.0
    named = summarize_windows([window], named_rate_Bps=12.5e6)
    assert named is not None and named.nominal_source == "named"
    # A named rate replaces the interfaces' reported speeds (10 Gbit/s here), not a tbf cap.
    local = Window({"local": start}, {"local": end})
    alone = summarize_windows([local], named_rate_Bps=1e10)
    assert alone is not None and alone.nominal_Bps == 1e10
    faster = summarize_windows([window], named_rate_Bps=1e10)
    assert faster is not None and faster.nominal_Bps == 25e6
    assert summarize_windows([Window({"local": start}, {})]) is None  # never closed


def _point(
    *,
    transport: Transport | None,
    throughput_bytes: int = 1 << 20,
    elapsed_ns: int = 10**9,
    client_ns: int = 0,
    server_ns: int = 0,
) -> SizeResult:
    samples = np.full(10, elapsed_ns // 10, dtype=np.int64)
    cpu = {"client": CpuTime(client_ns, 0), "server": CpuTime(server_ns, 0)}
    return SizeResult.from_samples(
        throughput_bytes // 10, throughput_bytes // 10, samples, elapsed_ns, cpu=cpu,
        transport=transport,
    )  # fmt: skip


def _transport(**fields: object) -> Transport:
    base: dict[str, object] = {
        "connections": 1,
        "retransmits": 0,
        "data_segs_out": 10_000,
        "bytes_sent": 10**7,
        "bytes_acked": 10**7,
        "rtt_ns": (1e5,),
        "delivery_rate_Bps": (1e9,),
    }
    return Transport(**(base | fields))  # type: ignore[arg-type]


def test_the_limit_rule_in_its_order() -> None:
    lossy = _point(transport=_transport(retransmits=50, nominal_Bps=1e6))
    limit = name_limit(lossy, cores={})
    assert limit.kind == "loss" and dict(limit.used)["retransmits"] == 50
    at_rate = _point(transport=_transport(nominal_Bps=1.1e6), throughput_bytes=10**6)
    limit = name_limit(at_rate, cores={})
    assert limit.kind == "link" and dict(limit.used)["efficiency"] >= LINK_SHARE
    # Beyond the nominal rate (a veth's reported speed), the link is not what bounds it.
    beyond = _point(transport=_transport(nominal_Bps=0.5e6), throughput_bytes=10**6)
    assert name_limit(beyond, cores={}).kind != "link"
    busy = _point(transport=_transport(), server_ns=9 * 10**8, client_ns=10**8)
    limit = name_limit(busy, cores={"client": 4, "server": 4})
    assert (limit.kind, limit.side) == ("cpu", "server")
    assert dict(limit.used)["server_busy"] >= CPU_SHARE
    # Two connections may use two cores: the same CPU time is then half of what it could use.
    two = _point(transport=_transport(connections=2), server_ns=9 * 10**8)
    assert name_limit(two, cores={"server": 4}).kind != "cpu"
    small = _point(transport=_transport(), throughput_bytes=1000)
    limit = name_limit(small, cores={}, op_bytes=100)
    assert limit.kind == "latency" and dict(limit.used)["bdp_bytes"] == pytest.approx(1e5)
    big = _point(transport=_transport(), throughput_bytes=10**7)
    limit = name_limit(big, cores={})
    assert limit.kind == "unknown" and "client_busy" in dict(limit.used)
    assert limit.describe().startswith("unknown: loss_share=0 client_busy=0")
    assert name_limit(_point(transport=None), cores={}).kind == "unknown"


def test_efficiency_is_a_budget_metric() -> None:
    from pytest_tfgrpc.report.budget import check, parse_budget
    from pytest_tfgrpc.results import BenchmarkResult

    point = _point(transport=_transport(nominal_Bps=2e6), throughput_bytes=10**6)
    assert point.figure("efficiency") is not None
    assert point.figure("efficiency").value == pytest.approx(0.5)  # type: ignore[union-attr]
    result = BenchmarkResult("p2p_bandwidth", "bw", "lo", "t", "raw", "stream", (point,))
    assert len(check(parse_budget({"efficiency": ">=0.9"}), result)) == 1
    assert check(parse_budget({"efficiency": ">=0.4"}), result) == ()


def test_the_words_say_only_what_is_not_nothing() -> None:
    assert summary_cell({"retransmits_per_MB": 0.0, "qdisc_drops": 0.0}) == ""
    assert summary_cell({"retransmits_per_MB": 1.204, "qdisc_drops": 413.0}) == (
        "1,204 retx/GB, 413 qdisc drops"
    )
    context = gate_context(
        {"retransmits_per_MB": 0.0, "rtt_p50": 1.2e5},
        {"retransmits_per_MB": 1.204, "rtt_p50": 2.1e8},
    )
    assert context == "retransmissions 0 -> 1,204 per GB; RTT p50 120us -> 210ms"
    assert gate_context({}, {}) == ""


def properties(xml: Path) -> dict[str, str]:
    return {
        p.name: p.value
        for suite in JUnitXml.fromfile(str(xml))
        for case in suite
        for p in case.properties()  # type: ignore[attr-defined]
    }


LOOPBACK_SUITE = """
import pytest
from pytest_tfgrpc.roles.processes import ServerProcess

@pytest.fixture
def server(fabric):
    with ServerProcess.start(fabric, extra_args=["--delay", "{delay}"]) as started:
        yield started

@pytest.mark.message_profile(["4MiB"])
def test_bandwidth(tfgrpc, server):
    tfgrpc.p2p_bandwidth(server)

@pytest.mark.message_profile(["1KiB"])
def test_echo(tfgrpc, server):
    tfgrpc.p2p_latency(server)
"""
STEADY = ("--tfgrpc-iterations=40", "--tfgrpc-warmup=3", "--tfgrpc-max-seconds=2")


def test_grpcio_on_loopback_retransmits_nothing_and_names_a_cpu_side(
    pytester: pytest.Pytester,
) -> None:
    """Loopback loses nothing, so the figure is 0; but on a busy machine the kernel itself
    may retransmit a segment on ``lo`` (a quiet suite run saw one in 168 MB: 4.1 per GB), which
    the tool rightly records. So up to three runs, and one of them must record 0."""
    pytester.makepyfile(test_perf=LOOPBACK_SUITE.replace("{delay}", "0s"))
    point = "tfgrpc.p2p_bandwidth.4MiB"
    for _ in range(3):
        result = pytester.runpytest(*STEADY, "--junitxml=perf.xml", "--tfgrpc-html=report.html")
        result.assert_outcomes(passed=2)
        props = properties(pytester.path / "perf.xml")
        if props[f"{point}.retransmits"] == "0":
            break
    assert props[f"{point}.retransmits"] == "0"
    assert float(props[f"{point}.tcp_bytes_sent"]) >= 40 * 4 * 2**20
    assert float(props[f"{point}.rtt_p50_us"]) > 0
    assert f"{point}.efficiency" not in props  # lo has no nominal rate
    assert props[f"{point}.limit"].startswith("cpu-bound ("), props[f"{point}.limit"]
    result.stdout.fnmatch_lines(["*limit*", "*p2p_bandwidth*4MiB*cpu-bound (*)*"])
    page = (pytester.path / "report.html").read_text()
    assert "<th>limit</th>" in page and "cpu-bound (" in page and "_busy=" in page


def test_the_gate_quotes_the_transport_beside_a_regression(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_perf=LOOPBACK_SUITE.replace("{delay}", "0s"))
    pytester.runpytest(*STEADY, "-k", "echo", "--junitxml=base.xml").assert_outcomes(passed=1)
    pytester.makepyfile(test_perf=LOOPBACK_SUITE.replace("{delay}", "15ms"))
    slowed = pytester.runpytest(*STEADY, "-k", "echo", "--tfgrpc-baseline=base.xml")
    slowed.assert_outcomes(failed=1)
    slowed.stdout.re_match_lines(
        [r"regression: .*p2p_latency 1KiB p50: \+.*; transport: retransmissions 0 -> 0 per GB; "
         r"RTT p50 \S+ -> \S+"]
    )  # fmt: skip


def test_a_rate_named_for_the_fabric_in_the_ini_file_gives_the_efficiency(
    pytester: pytest.Pytester,
) -> None:
    """``lo`` reports no speed: the rate named in the ini file is its nominal rate."""
    pytester.makepyfile(test_perf=LOOPBACK_SUITE.replace("{delay}", "0s"))
    pytester.makeini("[pytest]\ntfgrpc_link_rates = eth9=1Gbit/s lo=80Gbit/s\n")
    result = pytester.runpytest(*STEADY, "-k", "bandwidth", "--junitxml=perf.xml")
    result.assert_outcomes(passed=1)
    props = properties(pytester.path / "perf.xml")
    point = "tfgrpc.p2p_bandwidth.4MiB"
    assert float(props[f"{point}.link_rate_MBps"]) == 10_000.0
    throughput = float(props[f"{point}.throughput_MBps"])
    assert float(props[f"{point}.efficiency"]) == pytest.approx(throughput / 10_000, rel=1e-3)


@pytest.mark.parametrize(
    ("pair", "message"),
    [
        ("lo", "'lo' is not FABRIC=RATE (eth0=10Gbit/s)"),
        ("lo=fast", "lo: cannot read 'fast' as a rate"),
        ("lo=0Mbit/s", "'lo=0Mbit/s': a link's rate is above 0"),
    ],
)
def test_a_bad_link_rate_is_a_usage_error(
    pytester: pytest.Pytester, pair: str, message: str
) -> None:
    pytester.makepyfile(test_perf="def test_nothing(tfgrpc):\n    pass\n")
    result = pytester.runpytest(f"--tfgrpc-link-rate={pair}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--tfgrpc-link-rate / tfgrpc_link_rates: {message}*"])


def test_sizes_measured_before_a_failed_call_keep_their_telemetry() -> None:
    """A server that refuses tensors over 16 KiB: the 1 KiB echo is measured in round 1,
    then the 64 KiB one's first call fails. The 1 KiB size's window (opened for all its
    rounds) closes at the failure, so the result kept on the error has its telemetry; the
    failure quotes what the failed size's connection showed."""
    run = RunSpec(iterations=40, warmup=2, max_seconds=2.0, warmup_seconds=0.5, rounds=4)
    refusing = ["--max-tensor-bytes", "16KiB"]
    with (
        ServerProcess.start(resolve_fabric("lo"), extra_args=refusing) as server,
        pytest.raises(BenchmarkError) as failed,
    ):
        p2p_latency(server, [1024, 65536], LatencyCall(run=run))
    assert "RESOURCE_EXHAUSTED" in str(failed.value)
    assert "(transport: after " in str(failed.value), str(failed.value)
    partial = partial_result(failed.value)
    assert partial is not None
    (point,) = partial.sizes
    assert point.size_bytes == 1024
    assert point.transport is not None, "the size measured before the failure lost its telemetry"
    assert point.transport.connections == 1
    assert point.transport.retransmits == 0
    # Round 1's ten echoes at least, both ways (1 KiB and its framing each).
    assert point.transport.bytes_sent >= 10 * 2 * 1024


def _read_threads(reader: TelemetryReader, pid: int) -> set[str]:
    """The threads whose ``schedstat`` files ``reader``'s process keeps open for ``pid``."""
    fds = reader._kernel.threads._fds.get(pid, [])
    return {os.readlink(f"/proc/self/fd/{fd}").split("/")[4] for fd in fds}


def test_run_queue_reads_follow_threads_that_end_and_start() -> None:
    """The threads are read again without a listing only while none changed: one more
    thread, or one ended and another started (the same count), is listed anew."""
    pid = os.getpid()

    def threads_now() -> set[str]:
        return set(os.listdir(f"/proc/{pid}/task"))

    stop = [threading.Event() for _ in range(2)]
    first = threading.Thread(target=stop[0].wait)
    with TelemetryReader() as reader:
        assert reader.run_queue_wait_ns(pid) is not None
        assert _read_threads(reader, pid) == threads_now()
        first.start()
        try:
            assert reader.run_queue_wait_ns(pid) is not None
            assert _read_threads(reader, pid) == threads_now()  # one more
        finally:
            stop[0].set()
            first.join()
        second = threading.Thread(target=stop[1].wait)
        second.start()
        try:
            ended_and_started = threads_now()
            assert reader.run_queue_wait_ns(pid) is not None
            assert _read_threads(reader, pid) == ended_and_started  # same count, not same
            assert reader.run_queue_wait_ns(pid) is not None  # unchanged: read again
            assert _read_threads(reader, pid) == ended_and_started
        finally:
            stop[1].set()
            second.join()


def test_close_all_closes_runs_and_single_descriptors() -> None:
    """Consecutive descriptors are closed in one call, lone ones each; none is left open and
    no other is touched."""
    from pytest_tfgrpc.wire.telemetry import _close_all

    fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(5)]
    keep = fds[2]  # a gap: fds[:2] and fds[3:] are runs, or single where they are not
    closing = [fd for fd in fds if fd != keep]
    _close_all(closing)
    try:
        for fd in closing:
            with pytest.raises(OSError):
                os.fstat(fd)
        os.fstat(keep)  # still open
    finally:
        os.close(keep)


def test_interface_speed_is_read_once_per_interface(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader per measured size reads the interface's index, but its speed only once."""
    from pytest_tfgrpc.wire import telemetry as wire

    asked: list[str] = []
    real = wire._speed_bps

    def counted(interface: str, read: object = None) -> int | None:
        asked.append(interface)
        return real(interface)

    monkeypatch.setattr(wire, "_speed_bps", counted)
    monkeypatch.setattr(wire._shared_kernel(), "speeds", {})
    for _ in range(3):
        with TelemetryReader("lo") as reader:
            assert reader.link("lo").interface == "lo"
    assert asked == ["lo"]
