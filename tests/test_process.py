"""Tensor-server processes: ready, reachable, stopped, and clear when they fail."""

from __future__ import annotations

import os
import signal
import sys
import time

import grpc
import pytest
from conftest import pid_alive

from pytest_tfgrpc.roles.processes import ServerDied, ServerError, ServerProcess, live_servers
from pytest_tfgrpc.wire import grpc_settings
from pytest_tfgrpc.wire._proto import service_pb2
from pytest_tfgrpc.wire.fabric import resolve_fabric

LO = resolve_fabric("lo")


def status(target: str) -> service_pb2.ServerStatus:
    with grpc.insecure_channel(target) as channel:
        reply = channel.unary_unary(grpc_settings.method("raw", "Status"))(b"", timeout=5)
    status: service_pb2.ServerStatus = service_pb2.ServerStatus.FromString(reply)
    return status


def test_a_server_serves_on_the_fabric_address_and_stops() -> None:
    with ServerProcess.start(LO) as server:
        assert server.target.startswith("127.0.0.1:")
        reply = status(server.target)
        assert (reply.pid, reply.target, reply.fabric) == (server.pid, server.target, "lo")
        assert reply.grpc_version == grpc.__version__
        assert server in live_servers()
    assert not pid_alive(server.pid)
    assert server not in live_servers()


def test_a_second_server_never_shares_the_port() -> None:
    with ServerProcess.start(LO) as first:
        port = first.target.rsplit(":", 1)[1]
        with pytest.raises(ServerError) as info:
            ServerProcess.start(LO, extra_args=["--port", port])
        assert "exited with status 2 before it was ready" in str(info.value)
        assert f"cannot bind 127.0.0.1:{port}: Address already in use" in str(info.value)
        assert status(first.target).pid == first.pid


def test_a_server_that_cannot_start_says_why() -> None:
    with pytest.raises(ServerError) as info:
        ServerProcess.start(LO, extra_args=["--port", "70000"])
    message = str(info.value)
    assert "exited with status 2 before it was ready" in message
    assert "--port 70000: a port is a number from 0 to 65535" in message


def test_a_server_that_never_gets_ready_is_killed() -> None:
    argv = [sys.executable, "-c", "import time; time.sleep(60)"]
    handle = ServerProcess(argv, fabric=LO, name="sleeper", env=None)
    with pytest.raises(ServerError, match=r"did not become ready within 0\.5 s"):
        try:
            handle._wait_ready(0.5)
        finally:
            handle.stop(timeout=1)
    assert not pid_alive(handle.pid)


def test_death_is_reported_with_status_and_stderr() -> None:
    server = ServerProcess.start(LO)
    try:
        os.kill(server.pid, signal.SIGKILL)
        death = server.died(grace=5)
        assert isinstance(death, ServerDied)
        assert death.returncode == -signal.SIGKILL
        assert "signal 9 (SIGKILL)" in str(death)
        with pytest.raises(ServerDied):
            server.check_alive()
    finally:
        server.stop()
    assert server.died() is None  # once stopped on purpose, an exit is no death


def test_a_server_stops_when_its_parent_goes_away() -> None:
    # The parent here is a child python that starts a server and is then SIGKILLed: the
    # server's stdin lifeline closes and it must exit on its own.
    code = (
        "import sys; from pytest_tfgrpc.wire.fabric import resolve_fabric; "
        "from pytest_tfgrpc.roles.processes import ServerProcess; "
        "s = ServerProcess.start(resolve_fabric('lo')); print(s.pid, flush=True); "
        "import time; time.sleep(60)"
    )
    import subprocess

    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        server_pid = int(parent.stdout.readline())
        assert pid_alive(server_pid)
        parent.kill()
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while pid_alive(server_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pid_alive(server_pid)
    finally:
        parent.kill()
        parent.wait()
