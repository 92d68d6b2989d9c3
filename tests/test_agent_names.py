"""Agents and hosts by name: every resolved address tried, a name that does not resolve yet
waited for within the bound an agent that does not listen yet gets (issue 25)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pytest_tfgrpc.hosts.names import HostNotReached, listening_address
from pytest_tfgrpc.plugin.agents import _Agents

#: What ``localhost`` resolves to where the hosts file lists ``::1`` first.
BOTH = ("::1", "127.0.0.1")


def late(after_s: float, addresses: tuple[str, ...]) -> Callable[[str, int], tuple[str, ...]]:
    """A resolver that knows no name for ``after_s`` seconds (a headless service before its
    pod is ready), then gives ``addresses``."""
    start = time.monotonic()

    def resolve(host: str, port: int) -> tuple[str, ...]:
        if time.monotonic() - start < after_s:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return addresses

    return resolve


@pytest.fixture
def ipv4_only() -> Iterator[int]:
    """A port listened on at 127.0.0.1 only (its ``::1`` twin refuses)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield int(server.getsockname()[1])


def test_every_resolved_address_is_tried(ipv4_only: int) -> None:
    assert listening_address("localhost", ipv4_only, 5, resolver=lambda h, p: BOTH) == "127.0.0.1"


@pytest.mark.parametrize("after_s", [0.5, 1.5])
def test_a_name_that_resolves_later_is_waited_for(ipv4_only: int, after_s: float) -> None:
    start = time.monotonic()
    found = listening_address("agent-0.svc", ipv4_only, 5, resolver=late(after_s, BOTH))
    assert found == "127.0.0.1"
    assert after_s <= time.monotonic() - start < 5


def test_a_name_that_never_resolves_fails_within_the_bound() -> None:
    start = time.monotonic()
    with pytest.raises(HostNotReached, match=r"'agent-9.svc' does not resolve.*waited 1 s"):
        listening_address("agent-9.svc", 9, 1, resolver=late(60, BOTH))
    assert time.monotonic() - start < 2


def test_no_address_listening_names_each_one() -> None:
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
    with pytest.raises(HostNotReached) as info:
        listening_address("localhost", port, 0.5, resolver=lambda h, p: BOTH)
    text = str(info.value)
    assert f"no address of localhost accepted a connection on port {port}" in text
    assert "::1: " in text and "127.0.0.1: " in text


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[int, str]]:
    """A node agent on loopback (127.0.0.1 only); its port and token file."""
    token = tmp_path / "token"
    token.write_text("names-token-0123456789abcdef\n")
    token.chmod(0o600)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest_tfgrpc.hosts.agent", "--fabric", "lo", "--port", "0",
         "--token-file", str(token), "--exit-on-stdin-eof"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        target = json.loads(proc.stdout.readline())["target"]
        yield int(target.rsplit(":", 1)[1]), str(token)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.parametrize("after_s", [0.0, 2.0], ids=["resolved", "resolved-later"])
def test_the_driver_reaches_an_agent_by_a_name_listing_ipv6_first(
    agent: tuple[int, str], after_s: float
) -> None:
    port, token_file = agent
    address = f"agent-0.tfjob.svc:{port}"
    agents = _Agents("--tfgrpc-agents", (address,), (address,), token_file)
    agents.resolver = late(after_s, BOTH)
    try:
        client = agents.client(address)
        assert client.target == f"127.0.0.1:{port}"
        assert client.info.fabric == "lo"
    finally:
        agents.close()
