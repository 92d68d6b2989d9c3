"""A stranger's idle streams and rapid reset against the Python tensor server (issue 25): the
calls it takes at once are bounded, idle streams are cancelled and free their handler threads,
and a rapid reset leaves the server answering."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest
import stranger

from pytest_tfgrpc.roles.idle import IDLE_STREAM_S
from pytest_tfgrpc.roles.tensor_server import build_server
from pytest_tfgrpc.wire import grpc_settings

pytest.importorskip("h2")

ECHO = grpc_settings.method("raw", "Echo")
STATUS = grpc_settings.method("raw", "Status")
THREADS = 16


@pytest.fixture(params=[1.0])
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    """A tensor server on loopback (16 threads, as tfgrpc-server's default) whose idle bound
    is the parameter (1 s, unless a test asks for the default)."""
    idle_s = IDLE_STREAM_S if request.param is None else request.param
    started, target = build_server("127.0.0.1", 0, "lo", workers=THREADS, idle_s=idle_s)
    started.start()
    try:
        host, _, port = target.rpartition(":")
        yield host, int(port)
    finally:
        started.stop(0).wait(5)


def echo(host: str, port: int, timeout: float) -> float:
    """Seconds one 1 KiB echo took."""
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        start = time.monotonic()
        assert channel.unary_unary(ECHO)(bytes(1024), timeout=timeout) == bytes(1024)
        return time.monotonic() - start


@pytest.mark.parametrize(("streams", "connections"), [(16, 1), (24, 2), (40, 4)])
def test_idle_streams_are_cancelled_and_free_the_handler_threads(
    server: tuple[str, int], streams: int, connections: int
) -> None:
    host, port = server
    with stranger.idle_streams(host, port, ECHO, streams, connections) as held:
        assert held["idle_streams"] == streams
        time.sleep(0.2)  # the stranger's streams hold every handler thread now
        took = echo(host, port, timeout=8)
    # It waited for the idle streams that held every thread (1 s each), not for ever.
    assert 0.5 < took < 5, f"an echo took {took:.1f} s behind {streams} idle streams"


def test_calls_beyond_the_bound_are_refused_at_once_until_idle_ones_are_cancelled(
    server: tuple[str, int],
) -> None:
    host, port = server
    bound = grpc_settings.max_concurrent_rpcs(THREADS)
    with stranger.idle_streams(host, port, ECHO, bound, 4):
        time.sleep(0.2)
        start = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            echo(host, port, timeout=5)
        assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert time.monotonic() - start < 0.5
        # Each idle call is cancelled 1 s after it got a thread: 4 rounds of 16; then
        # the server takes calls again, the stranger's streams still open.
        while True:
            try:
                echo(host, port, timeout=5)
                break
            except grpc.RpcError as error:
                assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
                assert time.monotonic() - start < 8, "the idle calls were never cancelled"
                time.sleep(0.25)


@pytest.mark.parametrize("server", [None], indirect=True)  # the default idle bound
def test_a_rapid_reset_leaves_the_server_answering(server: tuple[str, int]) -> None:
    host, port = server
    outcomes: list[str] = []
    with stranger.rapid_reset(host, port, ECHO, limit=20_000, seconds=5) as counts:
        for _ in range(20):
            start = time.monotonic()
            try:
                echo(host, port, timeout=5)
                outcomes.append("OK")
            except grpc.RpcError as error:
                # Refused while the resets fill the bound, or cancelled by gRPC's core under
                # the flood: each in bounded time, never a hang or a dead server.
                assert error.code() in (
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    grpc.StatusCode.CANCELLED,
                ), error
                outcomes.append(error.code().name)
            assert time.monotonic() - start < 5
    assert counts["reset_streams"] > 0
    print(counts, outcomes.count("OK"), "of", len(outcomes), "echoes answered during the attack")
    assert echo(host, port, timeout=5) < 1  # after it, at once
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        channel.unary_unary(STATUS)(b"", timeout=5)
