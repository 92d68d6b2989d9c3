"""Fabric resolution against this machine's interfaces and against veth links made for the test.

Link tests send traffic only over veth pairs to namespaces they create (198.18.0.0/15) and
bind, without sending, to IPv6 addresses in 2001:2::/48 and link-local ones on those pairs.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import netns
import pytest
from netns import VethLink, can_make_links, veth_link

from pytest_tfgrpc.wire import fabric as fabric_module
from pytest_tfgrpc.wire.fabric import (
    Fabric,
    FabricError,
    FabricNameError,
    FabricStateError,
    check_fabric_name,
    interface_counters,
    list_interfaces,
    parse_fabric_names,
    resolve_fabric,
    resolve_fabrics,
)

NOT_AN_INTERFACE = "tfgnosuchif0"


def _wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.02)


def _operstate(name: str) -> str:
    return Path(f"/sys/class/net/{name}/operstate").read_text().strip()


@pytest.fixture
def links() -> None:
    ok, reason = can_make_links()
    if not ok:
        pytest.skip(reason)


@pytest.fixture
def link(links: None) -> Iterator[VethLink]:
    with veth_link() as made:
        yield made


# --- names ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "complaint"),
    [
        ("", "empty fabric name"),
        ("ib0:0", "'ib0:0' is not an interface name: interface names cannot contain ':'"),
        ("127.0.0.1", "'127.0.0.1' is not an interface name but an IP address"),
        ("::1", "'::1' is not an interface name but an IP address"),
        ("fe80::1%eth0", "'fe80::1%eth0' is not an interface name but an IP address"),
        ("127.0.0.1:5000", "'127.0.0.1:5000' is not an interface name but an address and port"),
        ("[::1]:5000", "'[::1]:5000' is not an interface name but an address and port"),
        ("node1:5000", "'node1:5000' is not an interface name: interface names cannot contain"),
        ("a" * 16, f"'{'a' * 16}' is not an interface name: it is 16 bytes long"),
        ("é" * 8, f"'{'é' * 8}' is not an interface name: it is 16 bytes long"),
        ("a/b", "'a/b' is not an interface name: it contains '/'"),
        ("eth 0", "'eth 0' is not an interface name: it contains a space"),
        ("eth\t0", "it contains a tab"),
        ("eth\x000", "it contains a NUL byte"),
        ("..", "'..' is not an interface name"),
    ],
)
def test_invalid_names_are_rejected_with_the_reason(name: str, complaint: str) -> None:
    with pytest.raises(FabricNameError) as info:
        resolve_fabric(name)
    assert complaint in str(info.value)
    assert "a fabric is a network interface name" in str(info.value)


@pytest.mark.parametrize("name", ["lo", "eth0", "ib0", "ib0.8001", "enp94s0f1np1", "a" * 15])
def test_valid_names_pass_the_name_check_unchanged(name: str) -> None:
    assert check_fabric_name(name) == name


def _interfaces_now() -> set[str]:
    return {name for _, name in socket.if_nameindex()}


def test_unknown_name_lists_this_hosts_interfaces() -> None:
    # Other tests (other xdist workers) may add or remove links meanwhile: the listing must lie
    # between what existed both before and after, and what existed at either time.
    before = _interfaces_now()
    assert NOT_AN_INTERFACE not in before
    with pytest.raises(FabricNameError) as info:
        resolve_fabric(NOT_AN_INTERFACE)
    after = _interfaces_now()
    prefix = f"unknown fabric '{NOT_AN_INTERFACE}': no such network interface; interfaces here: "
    message = str(info.value)
    assert message.startswith(prefix)
    listed = message.removeprefix(prefix).split(", ")
    assert listed == sorted(listed)
    assert before & after <= set(listed) <= before | after


def test_list_interfaces_matches_sysfs() -> None:
    before = {p.name for p in Path("/sys/class/net").iterdir()}
    names = list_interfaces()
    after = {p.name for p in Path("/sys/class/net").iterdir()}
    assert "lo" in names
    assert len(set(names)) == len(names)
    assert before & after <= set(names) <= before | after


# --- option values ----------------------------------------------------------------------------


def test_option_values_split_strip_and_drop_duplicates_in_order() -> None:
    assert parse_fabric_names(["eth0, lo", " ib0 ", "lo,eth0"]) == ("eth0", "lo", "ib0")
    assert parse_fabric_names([]) == ()


@pytest.mark.parametrize("value", ["lo,,eth0", "lo,", ",lo", " ", "lo, ,eth0"])
def test_empty_items_in_an_option_value_are_an_error(value: str) -> None:
    with pytest.raises(FabricNameError, match="empty fabric name in") as info:
        parse_fabric_names([value])
    assert repr(value) in str(info.value)


def test_all_bad_option_values_are_reported_together() -> None:
    with pytest.raises(FabricNameError) as info:
        parse_fabric_names(["lo,,eth0", "ib0:0", "lo", "a/b"])
    assert len(info.value.errors) == 3
    message = str(info.value)
    assert message.startswith("3 fabric problems:\n")
    for part in ("'lo,,eth0'", "'ib0:0'", "'a/b'"):
        assert part in message


# --- Fabric -----------------------------------------------------------------------------------


def test_loopback_resolves_to_ipv4_127_0_0_1() -> None:
    lo = resolve_fabric("lo")
    assert lo.name == "lo"
    assert (lo.address, lo.family, lo.zone) == ("127.0.0.1", "ipv4", None)
    assert lo.link_type == "loopback"
    assert lo.mtu == 65536
    assert lo.operstate in ("unknown", "up")
    assert lo.speed_mbps is None
    assert lo.host == "127.0.0.1"
    assert lo.target(5000) == "127.0.0.1:5000"
    assert lo.bind_address == "127.0.0.1:0"
    assert lo.socket_family == socket.AF_INET


def test_ipv6_hosts_are_bracketed_and_link_local_ones_carry_the_zone() -> None:
    fabric = Fabric(name="eth1", address="2001:2::1", family="ipv6")
    assert fabric.host == "[2001:2::1]"
    assert fabric.target(5000) == "[2001:2::1]:5000"
    local = Fabric(name="eth1", address="fe80::1", family="ipv6", zone="eth1")
    assert local.host == "[fe80::1%eth1]"
    assert local.bind_address == "[fe80::1%eth1]:0"


@pytest.mark.parametrize("port", [-1, 65536, 70000, True, 1.5, "5000"])
def test_target_refuses_ports_grpc_would_wrap_or_misread(port: object) -> None:
    lo = Fabric(name="lo", address="127.0.0.1", family="ipv4")
    with pytest.raises(ValueError, match="port must be an integer from 0 to 65535"):
        lo.target(port)  # type: ignore[arg-type]


def test_target_accepts_the_port_range_ends() -> None:
    lo = Fabric(name="lo", address="127.0.0.1", family="ipv4")
    assert (lo.target(0), lo.target(65535)) == ("127.0.0.1:0", "127.0.0.1:65535")


def test_resolve_fabrics_reports_every_problem_at_once() -> None:
    with pytest.raises(FabricNameError) as info:
        resolve_fabrics(["lo", NOT_AN_INTERFACE, "a/b"])
    assert [type(e) for e in info.value.errors] == [FabricNameError, FabricNameError]
    assert f"unknown fabric '{NOT_AN_INTERFACE}'" in str(info.value)
    assert "'a/b' is not an interface name" in str(info.value)


def test_resolve_fabrics_resolves_each_name_once() -> None:
    fabrics = resolve_fabrics(["lo", "lo"])
    assert [f.name for f in fabrics] == ["lo"]


def test_interface_counters_see_loopback_traffic() -> None:
    payload = b"x" * 256 * 1024
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(5)
        rx_before, tx_before = interface_counters("lo")
        with socket.create_connection(server.getsockname(), timeout=5) as client:
            peer, _ = server.accept()
            with peer:
                peer.settimeout(5)
                client.sendall(payload)
                received = 0
                while received < len(payload):
                    chunk = peer.recv(65536)
                    assert chunk, "connection closed early"
                    received += len(chunk)
        rx_after, tx_after = interface_counters("lo")
    assert rx_after - rx_before >= len(payload)
    assert tx_after - tx_before >= len(payload)


def test_interface_counters_of_an_unknown_interface() -> None:
    with pytest.raises(FabricNameError, match=f"unknown fabric '{NOT_AN_INTERFACE}'"):
        interface_counters(NOT_AN_INTERFACE)


def test_ipv6_addresses_rank_stable_global_first_and_skip_unusable_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Columns: address, ifindex, prefix length, scope, IFA flags, name.
    table = tmp_path / "if_inet6"
    table.write_text(
        "fe800000000000000000000000000001 05 40 20 80   ib0\n"  # link-local
        "20010002000000000000000000000003 05 40 00 01   ib0\n"  # global, temporary
        "20010002000000000000000000000004 05 40 00 c0   ib0\n"  # global, tentative
        "20010002000000000000000000000005 05 40 00 88   ib0\n"  # global, DAD failed
        "20010002000000000000000000000006 05 40 00 a0   ib0\n"  # global, deprecated
        "20010002000000000000000000000002 05 40 00 80   ib0\n"  # global, stable
        "20010002000000000000000000000007 06 40 00 80   ib1\n"  # another interface
    )
    monkeypatch.setattr(fabric_module, "_PROC_IF_INET6", table)
    usable, tentative = fabric_module._ipv6_addresses("ib0")
    assert [address for address, _ in usable] == ["2001:2::2", "2001:2::3", "2001:2::6", "fe80::1"]
    assert tentative == ["2001:2::4"]


# --- real links -------------------------------------------------------------------------------


def test_a_veth_end_resolves_to_its_ipv4_address(link: VethLink) -> None:
    fabric = resolve_fabric(link.root_if)
    assert (fabric.address, fabric.family, fabric.zone) == (link.root_addr, "ipv4", None)
    assert fabric.link_type == "ether"
    assert fabric.mtu == 1500
    assert fabric.operstate == "up"
    assert fabric.speed_mbps == 10000  # what veth reports


def test_an_interface_set_down_is_refused_with_its_state(link: VethLink) -> None:
    subprocess.run(["ip", "link", "set", "dev", link.root_if, "down"], check=True, timeout=10)
    with pytest.raises(FabricStateError) as info:
        resolve_fabric(link.root_if)
    assert str(info.value) == (
        f"fabric '{link.root_if}' is down (operstate: down);"
        f" bring it up with 'ip link set dev {link.root_if} up'"
    )


def test_an_interface_without_carrier_is_refused_with_its_state(link: VethLink) -> None:
    link.run_in_ns(["ip", "link", "set", "dev", link.ns_if, "down"])
    _wait_for(lambda: _operstate(link.root_if) != "up", 5, "the carrier to drop")
    with pytest.raises(FabricStateError) as info:
        resolve_fabric(link.root_if)
    assert f"fabric '{link.root_if}' is down (operstate: down)" in str(info.value)
    assert "no carrier" in str(info.value)


def test_an_up_interface_without_addresses_is_refused(links: None) -> None:
    with veth_link(ipv4=False, link_local=False) as bare:
        assert _operstate(bare.root_if) == "up"
        with pytest.raises(FabricStateError) as info:
            resolve_fabric(bare.root_if)
    assert str(info.value) == f"fabric '{bare.root_if}' has no IPv4 or IPv6 address"


def test_only_tentative_ipv6_addresses_are_named_in_the_error(
    links: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with veth_link(ipv4=False, link_local=False) as bare:
        table = tmp_path / "if_inet6"
        table.write_text(f"20010002000000000000000000000009 63 40 00 c0 {bare.root_if}\n")
        monkeypatch.setattr(fabric_module, "_PROC_IF_INET6", table)
        with pytest.raises(FabricStateError) as info:
            resolve_fabric(bare.root_if)
    assert str(info.value) == (
        f"fabric '{bare.root_if}' has no IPv4 or IPv6 address (IPv6 2001:2::9 still tentative:"
        " duplicate address detection has not finished, try again in a few seconds)"
    )


def test_ipv4_is_chosen_over_ipv6_when_both_are_there(links: None) -> None:
    with veth_link(ipv4=True, ipv6=True) as dual:
        fabric = resolve_fabric(dual.root_if)
    assert (fabric.family, fabric.address) == ("ipv4", dual.root_addr)


def test_down_and_unknown_fabrics_are_reported_together(link: VethLink) -> None:
    subprocess.run(["ip", "link", "set", "dev", link.root_if, "down"], check=True, timeout=10)
    with pytest.raises(FabricError) as info:
        resolve_fabrics([link.root_if, NOT_AN_INTERFACE, "lo"])
    assert type(info.value) is FabricError  # neither purely a usage nor a state problem
    assert [type(e) for e in info.value.errors] == [FabricStateError, FabricNameError]


def test_ipv6_only_interface_prefers_its_global_address(links: None) -> None:
    with veth_link(ipv4=False, ipv6=True) as link6:
        _wait_for(lambda: _has_link_local(link6.root_if), 5, "a link-local address")
        fabric = resolve_fabric(link6.root_if)
        assert (fabric.family, fabric.address, fabric.zone) == ("ipv6", link6.root_addr6, None)
        assert fabric.host == f"[{link6.root_addr6}]"
        assert fabric.target(5000) == f"[{link6.root_addr6}]:5000"
        with socket.socket(fabric.socket_family, socket.SOCK_STREAM) as sock:
            sock.bind(fabric.sockaddr())
            assert sock.getsockname()[0] == link6.root_addr6


def test_link_local_only_interface_gets_a_zone_that_binding_needs(links: None) -> None:
    with veth_link(ipv4=False, link_local=True) as local:
        _wait_for(lambda: _has_link_local(local.root_if), 5, "a link-local address")
        fabric = resolve_fabric(local.root_if)
        assert fabric.family == "ipv6"
        assert fabric.address.startswith("fe80:")
        assert fabric.zone == local.root_if
        assert fabric.host == f"[{fabric.address}%{local.root_if}]"
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(fabric.sockaddr())
            assert sock.getsockname()[3] == socket.if_nametoindex(local.root_if)
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            with pytest.raises(OSError) as info:
                sock.bind((fabric.address, 0))
            assert info.value.errno == errno.EINVAL


def test_traffic_from_the_namespace_reaches_a_socket_bound_to_the_fabric(link: VethLink) -> None:
    fabric = resolve_fabric(link.root_if)
    size = 1024 * 1024
    rx_before, _ = interface_counters(link.root_if)
    received, _ = _receive_from_namespace(link, fabric, size)
    rx_after, _ = interface_counters(link.root_if)
    assert received == size
    assert rx_after - rx_before >= size


def test_a_rate_cap_slows_the_link_down(links: None) -> None:
    ok, reason = can_make_links(shaping=True)
    if not ok:
        pytest.skip(reason)
    size = 1024 * 1024
    with veth_link(rate="20mbit") as capped:
        shown = subprocess.run(
            ["tc", "qdisc", "show", "dev", capped.root_if],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout
        assert "tbf" in shown and "rate 20Mbit" in shown
        assert (
            "rate 20Mbit" in capped.run_in_ns(["tc", "qdisc", "show", "dev", capped.ns_if]).stdout
        )
        received, seconds = _receive_from_namespace(capped, resolve_fabric(capped.root_if), size)
    assert received == size
    # 1 MiB at 20 Mbit/s takes 0.42 s; an uncapped veth moves it in milliseconds.
    assert seconds >= 0.3, f"1 MiB crossed a 20 Mbit/s link in {seconds:.3f} s"


# --- the netns helper itself ------------------------------------------------------------------


def _link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def _namespace_exists(name: str) -> bool:
    return Path("/run/netns", name).exists()


def test_links_get_distinct_names_and_benchmark_subnets(links: None) -> None:
    with veth_link() as first, veth_link() as second:
        assert first.ns_name != second.ns_name
        assert first.root_if != second.root_if
        assert first.root_addr.rsplit(".", 1)[0] != second.root_addr.rsplit(".", 1)[0]
        for made in (first, second):
            assert len(made.root_if) <= 15 and len(made.ns_if) <= 15
            assert made.root_addr.startswith(("198.18.", "198.19."))
            assert _namespace_exists(made.ns_name)


@pytest.mark.parametrize("raised", [ValueError, KeyboardInterrupt])
def test_teardown_removes_namespace_and_veth_even_when_the_body_raises(
    links: None, raised: type[BaseException]
) -> None:
    with pytest.raises(raised), veth_link() as made:
        assert _link_exists(made.root_if) and _namespace_exists(made.ns_name)
        raise raised()
    assert not _link_exists(made.root_if)
    assert not _namespace_exists(made.ns_name)


def test_commands_in_the_namespace_see_only_its_interfaces(link: VethLink) -> None:
    names = link.run_in_ns(["ls", "/sys/class/net"]).stdout.split()
    assert sorted(names) == sorted(["lo", link.ns_if])


def _has_link_local(name: str) -> bool:
    lines = Path("/proc/net/if_inet6").read_text().splitlines()
    return any(line.split()[5] == name and line.startswith("fe80") for line in lines)


_CLIENT = """
import socket, sys
host, port, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with socket.create_connection((host, port), timeout=5) as s:
    s.sendall(b"x" * size)
    s.shutdown(socket.SHUT_WR)
    s.recv(1)
"""


def _receive_from_namespace(link: VethLink, fabric: Fabric, size: int) -> tuple[int, float]:
    """Have the namespace send ``size`` bytes to a socket bound to ``fabric``.

    Returns the bytes received and the seconds from the first byte to the last.
    """
    with socket.socket(fabric.socket_family, socket.SOCK_STREAM) as server:
        server.bind(fabric.sockaddr())
        server.listen(1)
        server.settimeout(5)
        port = server.getsockname()[1]
        client = subprocess.Popen(
            link.ns_command([sys.executable, "-c", _CLIENT, fabric.address,
                             str(port), str(size)]),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            peer, _ = server.accept()
            with peer:
                peer.settimeout(5)
                received, first = 0, 0.0
                while chunk := peer.recv(65536):
                    if not received:
                        first = time.perf_counter()
                    received += len(chunk)
                    if received > size:
                        break
                seconds = time.perf_counter() - first
                peer.sendall(b"k")
            _, stderr = client.communicate(timeout=10)
            assert client.returncode == 0, stderr.decode()
        finally:
            if client.poll() is None:
                client.kill()
                client.wait(timeout=5)
    return received, seconds


_INTERRUPTED_CHILD = """
import sys, time
sys.path.insert(0, sys.argv[1])
from netns import veth_link
with veth_link() as link:
    print(link.ns_name, link.root_if, flush=True)
    time.sleep(30)
"""


def test_ctrl_c_in_another_process_still_removes_its_link(links: None) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", _INTERRUPTED_CHILD, str(Path(__file__).parent)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        ns_name, root_if = child.stdout.readline().split()
        assert _namespace_exists(ns_name) and _link_exists(root_if)
        child.send_signal(signal.SIGINT)
        _, stderr = child.communicate(timeout=15)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=5)
    assert "KeyboardInterrupt" in stderr
    assert not _namespace_exists(ns_name)
    assert not _link_exists(root_if)


def test_ctrl_c_during_cleanup_is_held_until_cleanup_is_done() -> None:
    finished = False
    with pytest.raises(KeyboardInterrupt), netns._sigint_deferred():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # time for the signal to be handled while cleanup runs
        finished = True
    assert finished
