"""Throw-away test hosts: a network namespace joined to this one by a veth pair.

Tests that must cross a real link (not loopback) make one with :func:`veth_link`::

    from netns import can_make_links, veth_link

    ok, reason = can_make_links()
    if not ok:
        pytest.skip(reason)
    with veth_link(rate="100mbit") as link:
        # link.root_if (this namespace, 198.18.k.1) <-> link.ns_if in link.ns_name (198.18.k.2)
        server = socket.create_server((link.root_addr, 0))
        link.run_in_ns([sys.executable, "-c", client_code], timeout=5)

Addresses come from 198.18.0.0/15 (IPv4, RFC 2544) and 2001:2::/48 (IPv6, RFC 5180), the
ranges set aside for benchmarking, one /24 (and /64) per link. The subnet index is chosen under a
file lock from what the root namespace already uses, so parallel processes (pytest-xdist
workers) never share a subnet or an interface name. Teardown always deletes the namespace and
the veth pair, also on exceptions and Ctrl-C.

This module is a plain module in ``tests/`` (no pytest import), importable as ``netns`` from
any test file there.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_tfgrpc.hosts.emulated import (
    IPV4_BENCHMARK_NET,
    FabricBuildError,
    add_veth_namespace,
    allocation_lock,
    cap_rate,
    free_subnet_index,
    pid_alive,
    sigint_deferred,
    tbf_burst_bytes,
)
from pytest_tfgrpc.hosts.emulated import run_command as _run

#: Kept under its old name for tests that hold Ctrl-C back themselves.
_sigint_deferred = sigint_deferred

__all__ = [
    "LinkError",
    "VethLink",
    "can_make_links",
    "remove_stale_links",
    "veth_link",
]

IPV6_BENCHMARK_NET = ipaddress.IPv6Network("2001:2::/48")

_NS_PREFIX = "tfg-"
_NS_NAME = re.compile(r"^tfg-(?P<pid>\d+)-(?P<k>\d+)$")
_SYS_NET = Path("/sys/class/net")
_NETNS_DIR = Path("/run/netns")


#: A namespace or veth pair could not be made or removed; the message has the command.
LinkError = FabricBuildError


@dataclass(frozen=True)
class VethLink:
    """A veth pair between this namespace (``root_if``) and namespace ``ns_name`` (``ns_if``).

    IPv4 fields are empty strings when the link was made with ``ipv4=False``; the IPv6 ones
    are ``None`` unless it was made with ``ipv6=True``.
    """

    ns_name: str
    root_if: str
    ns_if: str
    root_addr: str
    ns_addr: str
    prefixlen: int
    root_addr6: str | None
    ns_addr6: str | None
    rate: str | None
    timeout: float

    def ns_command(self, args: Sequence[str]) -> list[str]:
        """``args`` wrapped to run inside the namespace, for ``subprocess.Popen``."""
        return ["ip", "netns", "exec", self.ns_name, *args]

    def run_in_ns(
        self,
        args: Sequence[str],
        *,
        timeout: float | None = None,
        check: bool = True,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a command inside the namespace and wait for it (at most ``timeout`` seconds).

        Output is captured as text; with ``check`` a non-zero exit raises :class:`LinkError`
        that shows the command, exit status and stderr.
        """
        return _run(
            self.ns_command(args),
            timeout=self.timeout if timeout is None else timeout,
            check=check,
            input=input,
        )


@contextlib.contextmanager
def veth_link(
    *,
    ipv4: bool = True,
    ipv6: bool = False,
    link_local: bool = True,
    rate: str | None = None,
    burst: str | None = None,
    timeout: float = 10.0,
) -> Iterator[VethLink]:
    """Make a namespace joined to this one by a veth pair; remove both on exit.

    Both ends are up and the namespace's ``lo`` is up. ``ipv4`` gives the ends
    198.18.k.1/24 (here) and 198.18.k.2/24 (namespace); ``ipv6`` gives them 2001:2:0:k::1/64 and
    ::2/64; ``link_local=False`` stops the kernel from adding IPv6 link-local addresses (so an
    end can have no address at all). Duplicate address detection is off, so IPv6 addresses are
    usable at once. ``rate`` (a ``tc`` rate: ``"100mbit"``, ``"1gbit"``, ``"10mbps"``) caps both
    directions with a ``tbf`` qdisc on each end; ``burst`` overrides the bucket size, which
    otherwise holds 10 ms at that rate (at least 32 KiB). ``timeout`` bounds every command.

    Needs root and iproute2; check :func:`can_make_links` first.
    """
    burst_bytes = tbf_burst_bytes(rate, burst) if rate is not None else None
    with allocation_lock(timeout):
        k = free_subnet_index()
        pid = os.getpid()
        ns_name = f"{_NS_PREFIX}{pid}-{k}"
        root_if, ns_if = f"tfgv{pid % 10000}k{k}a", f"tfgv{pid % 10000}k{k}b"
        net4 = ipaddress.IPv4Network((int(IPV4_BENCHMARK_NET.network_address) + (k << 8), 24))
        net6 = (
            ipaddress.IPv6Network((int(IPV6_BENCHMARK_NET.network_address) + (k << 64), 64))
            if ipv6
            else None
        )
        link = VethLink(
            ns_name=ns_name,
            root_if=root_if,
            ns_if=ns_if,
            root_addr=str(net4[1]) if ipv4 else "",
            ns_addr=str(net4[2]) if ipv4 else "",
            prefixlen=24,
            root_addr6=str(net6[1]) if net6 is not None else None,
            ns_addr6=str(net6[2]) if net6 is not None else None,
            rate=rate,
            timeout=timeout,
        )
        try:
            _create(link, link_local=link_local, burst_bytes=burst_bytes)
        except BaseException:
            with sigint_deferred():
                _remove(link, quiet=True)
            raise
    try:
        yield link
    finally:
        failed = sys.exc_info()[0] is not None
        with sigint_deferred():
            _remove(link, quiet=failed)


def can_make_links(*, shaping: bool = False) -> tuple[bool, str]:
    """Whether this process can make :func:`veth_link` links, and if not, why.

    It makes and removes a trial link, so the answer is the real one (not just "am I root").
    With ``shaping`` the trial link also gets a ``tbf`` rate cap. The answer is cached.
    """
    return _can_make_links(shaping)


def remove_stale_links() -> list[str]:
    """Delete namespaces this module made in processes that no longer exist.

    A process killed with SIGKILL or SIGTERM cannot clean up; deleting its namespace also
    deletes its veth pair. Returns the names removed.
    """
    removed: list[str] = []
    if not _NETNS_DIR.is_dir():
        return removed
    for entry in sorted(os.listdir(_NETNS_DIR)):
        match = _NS_NAME.match(entry)
        if match is None or pid_alive(int(match["pid"])):
            continue
        _run(["ip", "netns", "del", entry], timeout=10.0, check=False)
        removed.append(entry)
    return removed


_probe_cache: dict[bool, tuple[bool, str]] = {}


def _can_make_links(shaping: bool) -> tuple[bool, str]:
    if shaping in _probe_cache:
        return _probe_cache[shaping]
    answer = _probe(shaping)
    _probe_cache[shaping] = answer
    return answer


def _probe(shaping: bool) -> tuple[bool, str]:
    if not sys.platform.startswith("linux"):
        return False, f"veth links need Linux network namespaces (this is {sys.platform})"
    if os.geteuid() != 0:
        return False, f"veth links need root to make network namespaces (euid {os.geteuid()})"
    for tool in ("ip", "tc") if shaping else ("ip",):
        if shutil.which(tool) is None:
            return False, f"veth links need the iproute2 '{tool}' command, not found on PATH"
    try:
        with veth_link(ipv4=True, link_local=False, rate="1mbit" if shaping else None):
            pass
    except (LinkError, OSError) as exc:
        return False, f"cannot make a network namespace and veth pair here: {exc}"
    return True, "veth links can be made"


def _create(link: VethLink, *, link_local: bool, burst_bytes: int | None) -> None:
    t = link.timeout
    ns = add_veth_namespace(link.ns_name, link.root_if, link.ns_if, timeout=t)
    for prefix, ifname in (([], link.root_if), (ns, link.ns_if)):
        ipv6_conf = "/proc/sys/net/ipv6/conf"
        if not link_local:
            _run([*prefix, "ip", "link", "set", "dev", ifname, "addrgenmode", "none"], timeout=t)
        if Path(ipv6_conf).is_dir():
            _run([*prefix, "sysctl", "-qw", f"net.ipv6.conf.{ifname}.accept_dad=0"], timeout=t)
    if link.root_addr:
        cidr = f"/{link.prefixlen}"
        _run(["ip", "addr", "add", link.root_addr + cidr, "dev", link.root_if], timeout=t)
        _run([*ns, "ip", "addr", "add", link.ns_addr + cidr, "dev", link.ns_if], timeout=t)
    if link.root_addr6 is not None and link.ns_addr6 is not None:
        for prefix, addr, ifname in (
            ([], link.root_addr6, link.root_if),
            (ns, link.ns_addr6, link.ns_if),
        ):
            _run([*prefix, "ip", "-6", "addr", "add", f"{addr}/64", "dev", ifname, "nodad"],
                 timeout=t)  # fmt: skip
    if link.rate is not None and burst_bytes is not None:
        for prefix, ifname in (([], link.root_if), (ns, link.ns_if)):
            cap_rate(prefix, ifname, link.rate, burst_bytes, timeout=t)
    _run([*ns, "ip", "link", "set", "dev", "lo", "up"], timeout=t)
    _run([*ns, "ip", "link", "set", "dev", link.ns_if, "up"], timeout=t)
    _run(["ip", "link", "set", "dev", link.root_if, "up"], timeout=t)
    deadline = time.monotonic() + t
    operstate = _SYS_NET / link.root_if / "operstate"
    while operstate.read_text().strip() != "up":
        if time.monotonic() > deadline:
            raise LinkError(f"veth {link.root_if} did not come up within {t:g} s")
        time.sleep(0.02)


def _remove(link: VethLink, *, quiet: bool) -> None:
    """Delete the pair and the namespace; raise if either is left (unless ``quiet``)."""
    # Deleting one end deletes both; deleting the namespace would too, but only once nothing
    # holds it open, so the veth goes first.
    problems: list[str] = []
    for args in (["ip", "link", "del", "dev", link.root_if], ["ip", "netns", "del", link.ns_name]):
        try:
            _run(args, timeout=10.0, check=False)
        except LinkError as exc:
            problems.append(str(exc))
    if (_SYS_NET / link.root_if).exists():
        problems.append(f"veth {link.root_if} still exists")
    if (_NETNS_DIR / link.ns_name).exists():
        problems.append(f"namespace {link.ns_name} still exists")
    if problems:
        message = "could not remove the test link: " + "; ".join(problems)
        if not quiet:
            raise LinkError(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)
