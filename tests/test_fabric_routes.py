"""Emulated fabrics skip test subnets an existing route covers (issue 25: ``tfgrpc-fabric up``
chose 198.18.0.0/24 though a route sent it to another host)."""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import sys

import pytest

from pytest_tfgrpc.hosts.emulated import (
    IPV4_BENCHMARK_NET,
    MAX_SUBNETS,
    allocation_lock,
    free_subnet_index,
    routed_subnets,
)

Net = ipaddress.IPv4Network


def subnet(k: int) -> Net:
    return Net((int(IPV4_BENCHMARK_NET.network_address) + (k << 8), 24))


@pytest.mark.parametrize(
    ("routes", "taken"),
    [
        (["198.18.0.0/24"], {0}),
        (["198.18.2.0/23"], {2, 3}),
        (["198.18.5.7/32", "198.19.255.255/32"], {5, 511}),
        (["198.18.0.0/15"], set(range(MAX_SUBNETS))),
        (["198.16.0.0/12"], set(range(MAX_SUBNETS))),
        (["10.0.0.0/8", "127.0.0.0/8", "198.20.0.0/24", "198.17.255.0/24"], set()),
    ],
)
def test_routed_subnets_are_the_indices_a_route_covers(routes: list[str], taken: set[int]) -> None:
    assert routed_subnets(Net(r) for r in routes) == taken


def test_a_routed_subnet_is_skipped() -> None:
    if shutil.which("ip") is None:
        pytest.skip("needs iproute2's ip")
    with allocation_lock(30):
        free = free_subnet_index(lambda: [])
        after = free_subnet_index(lambda: [subnet(free)])
        assert after != free
        everything = free_subnet_index(lambda: [subnet(k) for k in range(free, free + 3)])
        assert everything not in range(free, free + 3)


#: Run inside a namespace of its own: a real route there moves the choice on.
IN_NAMESPACE = """
import subprocess
from pytest_tfgrpc.hosts.emulated import IPV4_BENCHMARK_NET, free_subnet_index, ipv4_routes
first = free_subnet_index()
net = f"198.{18 + (first >> 8)}.{first & 255}.0/24"
subprocess.run(["ip", "route", "add", "blackhole", net], check=True)
assert any(str(route) == net for route in ipv4_routes()), ipv4_routes()
second = free_subnet_index()
assert second != first, (first, second)
print("SKIPPED", net, "FOR", second)
"""


def test_a_route_in_the_namespace_moves_the_fabric_on() -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 (a namespace of its own)")
    name = f"harden-routes-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=10)
    try:
        run = subprocess.run(
            ["ip", "netns", "exec", name, sys.executable, "-c", IN_NAMESPACE],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        assert "SKIPPED 198.1" in run.stdout
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False, timeout=10)
