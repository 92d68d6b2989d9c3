"""The raw-TCP floor: protocol, sample counts, deadlines, timing rules, the server's lifetime."""

from __future__ import annotations

import gc
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import numpy as np
import pytest

from pytest_tfgrpc.bench import floor as floor_bench
from pytest_tfgrpc.bench import timing
from pytest_tfgrpc.bench.floor import (
    FloorClient,
    FloorStream,
    native_floor_samples,
    tcp_pingpong,
    tcp_push_ack,
    tcp_stream,
)
from pytest_tfgrpc.bench.timing import RunSpec
from pytest_tfgrpc.native import unavailable_reason
from pytest_tfgrpc.roles.floor_server import (
    ACK_BYTE,
    HEADER,
    OP_SINK_ACK,
    FloorError,
    FloorServer,
)
from pytest_tfgrpc.roles.processes import ChildProcess, live_children, stop_all


def _run(iterations: int, warmup: int = 0, max_seconds: float = 30.0) -> RunSpec:
    return RunSpec(iterations, warmup, max_seconds=max_seconds, warmup_seconds=30.0)


def _ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


HOSTS = [
    "127.0.0.1",
    pytest.param(
        "::1", marks=pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
    ),
]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0): look at its state.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.02)
    return False


NATIVE_MISSING = unavailable_reason()
#: The floor's servers: the Python one, and the native engine's (the same protocol, so every
#: test of the server below runs the Python client against both).
ENGINES = [
    "grpcio",
    pytest.param(
        "native", marks=pytest.mark.skipif(NATIVE_MISSING is not None, reason=str(NATIVE_MISSING))
    ),
]


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=HOSTS)
def server(request: pytest.FixtureRequest, engine: str) -> Iterator[FloorServer]:
    with FloorServer.start(request.param, engine=engine) as srv:
        assert srv.engine == engine
        yield srv


@pytest.mark.skipif(NATIVE_MISSING is not None, reason=str(NATIVE_MISSING))
@pytest.mark.parametrize("op", ["echo", "push_ack"])
def test_the_native_floor_client_times_every_operation_on_either_server(
    server: FloorServer, op: str
) -> None:
    samples = native_floor_samples(*server.address, 64 * 1024, _run(23, 3), op)
    assert samples.dtype == np.int64
    assert samples.shape == (23,)
    assert (samples > 0).all()


@pytest.mark.skipif(NATIVE_MISSING is not None, reason=str(NATIVE_MISSING))
def test_the_native_floor_client_stops_at_the_time_limit(server: FloorServer) -> None:
    samples = native_floor_samples(*server.address, 1024, _run(10**9, 0, max_seconds=0.2), "echo")
    assert 1 <= samples.size < 10**9


@pytest.mark.skipif(NATIVE_MISSING is not None, reason=str(NATIVE_MISSING))
def test_a_native_floor_client_that_cannot_connect_says_so() -> None:
    with FloorServer.start("127.0.0.1") as srv:
        address = srv.address
    with pytest.raises(
        FloorError, match=r"native floor echo of 8 B: cannot connect to 127\.0\.0\.1 port"
    ):
        native_floor_samples(*address, 8, _run(1), "echo")


def test_server_reports_port_and_pid(server: FloorServer) -> None:
    assert 0 < server.port < 65536
    assert _alive(server.pid)
    assert server.address == (server.host, server.port)


def test_echo_returns_exactly_the_bytes_sent(server: FloorServer) -> None:
    rng = np.random.default_rng(7)
    with FloorClient(*server.address) as client:
        for size in (0, 1, 1000, 65536 + 3, 3 * 1024 * 1024 + 1):
            data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
            assert client.echo(data) == data
        # Two different messages back to back: the second is not mixed with the first.
        assert client.echo(b"first") == b"first"
        assert client.echo(b"second!") == b"second!"


def test_ack_comes_only_after_the_whole_payload(server: FloorServer) -> None:
    size = 256 * 1024
    with socket.create_connection(server.address, timeout=10) as sock:
        sock.sendall(HEADER.pack(OP_SINK_ACK, size) + b"x" * (size - 1))
        readable, _, _ = select.select([sock], [], [], 0.3)
        assert readable == [], "acknowledged before the last byte arrived"
        sock.sendall(b"x")
        assert sock.recv(16) == ACK_BYTE
    # And the connection stays in step after push_ack: an echo that follows is intact.
    with FloorClient(*server.address) as client:
        client.push_ack(b"y" * size)
        assert client.echo(b"after the push") == b"after the push"


def test_pingpong_takes_one_sample_per_iteration(server: FloorServer) -> None:
    samples = tcp_pingpong(*server.address, 1024, _run(57, 5))
    assert samples.dtype == np.int64
    assert samples.shape == (57,)
    assert (samples > 0).all()


def test_push_ack_takes_one_sample_per_iteration(server: FloorServer) -> None:
    samples = tcp_push_ack(*server.address, 1024 * 1024, _run(9, 1))
    assert samples.dtype == np.int64
    assert samples.shape == (9,)
    assert (samples > 0).all()


def test_stream_counts_what_it_sent(server: FloorServer) -> None:
    result = tcp_stream(*server.address, 65536, _run(40, 2))
    assert isinstance(result, FloorStream)
    assert (result.size, result.count, result.nbytes) == (65536, 40, 40 * 65536)
    assert result.elapsed_ns > 0
    assert result.throughput == result.nbytes * 1e9 / result.elapsed_ns


def test_max_seconds_stops_a_long_loop_early(server: FloorServer) -> None:
    big = 16 * 1024 * 1024
    with FloorClient(*server.address) as client:
        short = _run(10_000, 0, max_seconds=0.001)
        pp = client.pingpong(big, short)
        pa = client.push_ack_samples(big, short)
        st = client.stream(big, short)
        # Never empty (one operation always runs), never the whole count.
        assert 1 <= len(pp) < 10_000
        assert 1 <= len(pa) < 10_000
        assert 1 <= st.count < 10_000
        # The connection is still in step after the early stops.
        assert client.echo(b"still in step") == b"still in step"


def test_floor_loops_are_the_timing_loops(
    server: FloorServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every floor loop goes through bench.timing.measure with the run spec it was given: the
    # same warm-up, GC and bound rules as the gRPC loops.
    seen: list[RunSpec] = []
    real = timing.measure

    def spy(op: object, run: RunSpec, phase: object = None) -> object:
        seen.append(run)
        return real(op, run, phase)  # type: ignore[arg-type]

    monkeypatch.setattr(floor_bench, "measure", spy)
    run = _run(5, 2)
    with FloorClient(*server.address) as client:
        client.pingpong(64, run)
        client.push_ack_samples(64, run)
        client.stream(64, run)
    assert seen == [run, run, run]


def test_floor_warm_up_is_outside_the_measured_deadline(server: FloorServer) -> None:
    # A warm-up longer than the measured time leaves the measured loop its own time: the old
    # loops counted the warm-up inside the deadline and measured one operation here.
    long_warmup = RunSpec(iterations=5, warmup=10**7, max_seconds=0.1, warmup_seconds=0.3)
    with FloorClient(*server.address) as client:
        assert len(client.pingpong(64, long_warmup)) == 5


def test_floor_samples_are_timed_without_cyclic_gc(
    server: FloorServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    states: list[bool] = []
    with FloorClient(*server.address) as client:
        real = client._wait_ack

        def spy() -> None:
            real()
            states.append(gc.isenabled())

        monkeypatch.setattr(client, "_wait_ack", spy)
        client.push_ack_samples(64, RunSpec(3, 0, max_seconds=5.0, warmup_seconds=1.0))
    assert states == [False, False, False]


def test_process_is_gone_after_stop() -> None:
    srv = FloorServer.start("127.0.0.1")
    pid = srv.pid
    assert srv in live_children() and isinstance(srv, ChildProcess)
    assert srv.stop() == 0
    assert not _alive(pid)
    assert srv not in live_children()
    assert srv.stop() == 0  # stopping twice is harmless


def test_process_machinery_stops_a_forgotten_floor_server() -> None:
    srv = FloorServer.start("127.0.0.1")
    pid = srv.pid
    del srv
    gc.collect()
    assert stop_all() >= 1  # what atexit and the plugin's session end call
    assert _wait_gone(pid)


def test_process_exits_when_its_parent_dies() -> None:
    # A parent that starts a floor server, prints its pid, then is killed without cleanup.
    code = (
        "import sys, time\n"
        "from pytest_tfgrpc.roles.floor_server import FloorServer\n"
        "s = FloorServer.start('127.0.0.1')\n"
        "print(s.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert _alive(child)
        parent.kill()
        parent.wait(10)
        assert _wait_gone(child)
    finally:
        if parent.poll() is None:
            parent.kill()
        parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()


def test_sigterm_stops_the_server() -> None:
    srv = FloorServer.start("127.0.0.1")
    try:
        os.kill(srv.pid, 15)
        assert _wait_gone(srv.pid)
    finally:
        srv.stop()


@pytest.mark.parametrize(
    ("host", "match"),
    [
        ("not-an-address", "not a numeric IPv4/IPv6 address"),
        ("0.0.0.0", "all interfaces"),
        ("::", "all interfaces"),
        # 198.18.0.0/15 is reserved for benchmarking: no interface here holds this address.
        ("198.19.255.254", "cannot bind to '198.19.255.254'"),
    ],
)
def test_bad_bind_address_errors_clearly(host: str, match: str, engine: str) -> None:
    before = set(live_children())
    with pytest.raises(FloorError, match=match) as info:
        FloorServer.start(host, ready_timeout=30, engine=engine)
    assert "exited with status 2 before it was ready" in str(info.value)
    assert set(live_children()) == before


def test_connection_to_a_stopped_server_fails() -> None:
    with FloorServer.start("127.0.0.1") as srv:
        address = srv.address
    with pytest.raises(OSError):
        FloorClient(*address, connect_timeout=5).close()
