"""Fabrics: a network interface name resolved to the address a tensor server binds to.

A fabric is named by its Linux interface (``lo``, ``eth0``, ``ib0``), never by an address or a
host name, so that ``--fabric=ib0`` cannot silently end up on another network. Resolution uses the
standard library only: ``socket.if_nameindex()``, the ``SIOCGIFADDR`` ioctl for IPv4,
``/proc/net/if_inet6`` for IPv6 and ``/sys/class/net/<name>/`` for link metadata.

Errors are :class:`FabricError`; :class:`FabricNameError` when the name itself is wrong (invalid,
unknown) and :class:`FabricStateError` when the interface exists but cannot carry traffic (down,
no address).
"""

from __future__ import annotations

import errno
import fcntl
import ipaddress
import socket
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = [
    "Fabric",
    "FabricError",
    "FabricNameError",
    "FabricStateError",
    "check_fabric_name",
    "interface_counters",
    "list_interfaces",
    "parse_fabric_names",
    "resolve_fabric",
    "resolve_fabrics",
]

Family = Literal["ipv4", "ipv6"]

IFNAMSIZ = 16
"""Kernel buffer size for an interface name, including the terminating NUL."""

_SYS_NET = Path("/sys/class/net")
_PROC_IF_INET6 = Path("/proc/net/if_inet6")
_SIOCGIFADDR = 0x8915
_IFF_UP = 0x1

_LINK_TYPES = {772: "loopback", 1: "ether", 32: "infiniband"}
# RFC 2863 states as /sys/class/net/<if>/operstate reports them; "unknown" (lo, tun) is usable.
_DOWN = frozenset({"down", "lowerlayerdown", "notpresent"})
_DOWN_STATES = _DOWN | {"dormant", "testing"}

# /proc/net/if_inet6 scope column (kernel IPV6_ADDR_* scope bits).
_SCOPE_GLOBAL = 0x00
_SCOPE_HOST = 0x10
_SCOPE_LINK = 0x20
_SCOPE_SITE = 0x40
# /proc/net/if_inet6 flags column (kernel IFA_F_*).
_IFA_F_TEMPORARY = 0x01
_IFA_F_OPTIMISTIC = 0x04
_IFA_F_DADFAILED = 0x08
_IFA_F_DEPRECATED = 0x20
_IFA_F_TENTATIVE = 0x40

_WHAT_A_FABRIC_IS = "a fabric is a network interface name such as 'lo', 'eth0' or 'ib0'"


class FabricError(Exception):
    """A fabric cannot be used; the message says which one and why.

    ``errors`` holds the individual problems when one error reports several fabrics at once
    (see :func:`resolve_fabrics`); for a single problem it is ``(self,)``.
    """

    def __init__(self, message: str, *, errors: Sequence[FabricError] = ()) -> None:
        super().__init__(message)
        self.errors: tuple[FabricError, ...] = tuple(errors) or (self,)

    @property
    def message(self) -> str:
        """The human-readable message."""
        return str(self.args[0])


class FabricNameError(FabricError):
    """A usage error: the fabric name is not a valid interface name or no such interface exists."""


class FabricStateError(FabricError):
    """The interface exists but cannot carry traffic now: it is down or has no usable address."""


@dataclass(frozen=True)
class Fabric:
    """A network interface resolved to the address a server on it binds to.

    ``address`` is the bare IP (no brackets, no zone); ``zone`` is the interface name when the
    address is an IPv6 link-local one, which is only reachable with a zone id.
    ``link_rate_Bps`` is the nominal rate the user named for it (bytes/s; the plugin's
    ``tfgrpc_link_rates``), for the link efficiency of what crosses it; None: not named.
    """

    name: str
    address: str
    family: Family
    zone: str | None = None
    mtu: int | None = None
    operstate: str = "unknown"
    link_type: str = "other"
    speed_mbps: int | None = None
    link_rate_Bps: float | None = None

    @property
    def host(self) -> str:
        """The host part as gRPC wants it: ``127.0.0.1``, ``[::1]``, ``[fe80::1%eth0]``."""
        if self.family == "ipv4":
            return self.address
        if self.zone:
            return f"[{self.address}%{self.zone}]"
        return f"[{self.address}]"

    def target(self, port: int) -> str:
        """``host:port`` for gRPC (``127.0.0.1:5000``, ``[fe80::1%eth0]:5000``).

        The port is checked here because gRPC does not check it: 70000 wraps to 4464 and -1
        becomes 65535.
        """
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"port must be an integer from 0 to 65535, got {port!r}")
        return f"{self.host}:{port}"

    @property
    def bind_address(self) -> str:
        """The address a server binds to for an ephemeral port: ``target(0)``."""
        return self.target(0)

    @property
    def socket_family(self) -> socket.AddressFamily:
        """``socket.AF_INET`` or ``socket.AF_INET6``, for a plain socket on this fabric."""
        return socket.AF_INET if self.family == "ipv4" else socket.AF_INET6

    def sockaddr(self, port: int = 0) -> tuple[str, int] | tuple[str, int, int, int]:
        """The ``socket.bind``/``connect`` address; a link-local IPv6 one carries its scope id.

        Useful to check that an address can be bound before handing it to gRPC, whose bind
        errors do not say why.
        """
        self.target(port)  # validates the port
        if self.family == "ipv4":
            return (self.address, port)
        scope_id = socket.if_nametoindex(self.zone) if self.zone else 0
        return (self.address, port, 0, scope_id)


def check_fabric_name(name: str) -> str:
    """Return ``name`` if it can be an interface name, else raise :class:`FabricNameError`.

    The rules are the kernel's (``dev_valid_name``): 1 to 15 bytes, not ``.`` or ``..``, no
    ``/``, ``:``, whitespace or NUL. IP addresses and ``host:port`` are rejected with their own
    message; the name is never truncated or guessed at.
    """
    if not name:
        raise FabricNameError(f"empty fabric name: {_WHAT_A_FABRIC_IS}")
    if _is_ip_address(name):
        raise FabricNameError(
            f"{name!r} is not an interface name but an IP address; {_WHAT_A_FABRIC_IS}"
            " (use the interface that carries the address)"
        )
    host, sep, port = name.rpartition(":")
    if sep and port.isdigit() and _is_ip_address(host):
        raise FabricNameError(
            f"{name!r} is not an interface name but an address and port; {_WHAT_A_FABRIC_IS}"
        )
    if sep:
        raise FabricNameError(
            f"{name!r} is not an interface name: interface names cannot contain ':' (an alias"
            f" label like 'eth0:1' is not an interface of its own, and the port is chosen by"
            f" the plugin); {_WHAT_A_FABRIC_IS}"
        )
    size = len(name.encode("utf-8", "surrogateescape"))
    if size >= IFNAMSIZ:
        raise FabricNameError(
            f"{name!r} is not an interface name: it is {size} bytes long and interface names"
            f" have at most {IFNAMSIZ - 1}; {_WHAT_A_FABRIC_IS}"
        )
    if name in (".", ".."):
        raise FabricNameError(f"{name!r} is not an interface name; {_WHAT_A_FABRIC_IS}")
    bad = sorted({_describe_char(c) for c in name if c in "/\0" or c.isspace()})
    if bad:
        raise FabricNameError(
            f"{name!r} is not an interface name: it contains {' and '.join(bad)}, which"
            f" interface names cannot; {_WHAT_A_FABRIC_IS}"
        )
    return name


def parse_fabric_names(values: Iterable[str]) -> tuple[str, ...]:
    """Turn ``--fabric`` option values into interface names.

    Each value may hold several comma-separated names. Names are stripped, kept in order and
    de-duplicated; empty items and invalid names are reported together in one
    :class:`FabricNameError`. Whether the interfaces exist is checked by :func:`resolve_fabrics`.
    """
    names: list[str] = []
    problems: list[FabricError] = []
    for value in values:
        for item in value.split(","):
            name = item.strip()
            if not name:
                problems.append(
                    FabricNameError(
                        f"empty fabric name in {value!r}: separate interface names with single"
                        " commas, e.g. 'lo,eth0'"
                    )
                )
                continue
            try:
                check_fabric_name(name)
            except FabricNameError as exc:
                problems.append(exc)
                continue
            if name not in names:
                names.append(name)
    if problems:
        raise _combine(problems, FabricNameError)
    return tuple(names)


def list_interfaces() -> tuple[str, ...]:
    """Names of this network namespace's interfaces, in interface-index order."""
    return tuple(name for _, name in socket.if_nameindex())


def resolve_fabric(name: str) -> Fabric:
    """Resolve an interface name to a :class:`Fabric`.

    The address is the interface's primary IPv4 address if it has one, else its best IPv6
    address: global before link-local, stable before temporary; link-local ones get the
    interface as zone.

    Raises :class:`FabricNameError` for an invalid or unknown name and
    :class:`FabricStateError` for an interface that is down or has no usable address.
    """
    check_fabric_name(name)
    if name not in list_interfaces():
        raise _unknown(name)
    sys_dir = _SYS_NET / name
    operstate = _read_sys(sys_dir / "operstate")
    flags = _read_sys_int(sys_dir / "flags")
    if operstate is None or flags is None:
        raise _unknown(name)  # disappeared between the listing and the reads
    if operstate in _DOWN_STATES:
        raise FabricStateError(
            f"fabric {name!r} is {'down' if operstate in _DOWN else 'not up'}"
            f" (operstate: {operstate}); {_down_hint(name, operstate, flags)}"
        )
    if not flags & _IFF_UP:
        raise FabricStateError(
            f"fabric {name!r} is down (operstate: {operstate}, IFF_UP not set); bring it up"
            f" with 'ip link set dev {name} up'"
        )

    address: str
    family: Family
    zone: str | None = None
    ipv4 = _ipv4_address(name)
    if ipv4 is not None:
        address, family = ipv4, "ipv4"
    else:
        usable, tentative = _ipv6_addresses(name)
        if not usable:
            note = ""
            if tentative:
                note = (
                    f" (IPv6 {', '.join(tentative)} still tentative: duplicate address"
                    " detection has not finished, try again in a few seconds)"
                )
            raise FabricStateError(f"fabric {name!r} has no IPv4 or IPv6 address{note}")
        address, scope = usable[0]
        family = "ipv6"
        if scope == _SCOPE_LINK:
            zone = name

    type_code = _read_sys_int(sys_dir / "type")
    speed = _read_sys_int(sys_dir / "speed")
    return Fabric(
        name=name,
        address=address,
        family=family,
        zone=zone,
        mtu=_read_sys_int(sys_dir / "mtu"),
        operstate=operstate,
        link_type=_LINK_TYPES.get(type_code, "other") if type_code is not None else "other",
        speed_mbps=speed if speed is not None and speed > 0 else None,
    )


def resolve_fabrics(names: Iterable[str]) -> tuple[Fabric, ...]:
    """Resolve several interface names, reporting every problem in one :class:`FabricError`.

    Duplicate names are resolved once. When all problems are usage errors the exception is a
    :class:`FabricNameError`; its ``errors`` attribute lists the individual problems.
    """
    fabrics: list[Fabric] = []
    problems: list[FabricError] = []
    seen: set[str] = set()
    for name in names:
        if name in seen:
            continue
        seen.add(name)
        try:
            fabrics.append(resolve_fabric(name))
        except FabricError as exc:
            problems.append(exc)
    if problems:
        kind = FabricNameError if all(isinstance(p, FabricNameError) for p in problems) else None
        raise _combine(problems, kind)
    return tuple(fabrics)


def interface_counters(name: str) -> tuple[int, int]:
    """``(rx_bytes, tx_bytes)`` of an interface since it was created, from sysfs."""
    check_fabric_name(name)
    stats = _SYS_NET / name / "statistics"
    rx = _read_sys_int(stats / "rx_bytes")
    tx = _read_sys_int(stats / "tx_bytes")
    if rx is None or tx is None:
        raise _unknown(name)
    return rx, tx


def _unknown(name: str) -> FabricNameError:
    here = ", ".join(sorted(list_interfaces())) or "none"
    return FabricNameError(
        f"unknown fabric {name!r}: no such network interface; interfaces here: {here}"
    )


def _down_hint(name: str, operstate: str, flags: int) -> str:
    if operstate == "down" and flags & _IFF_UP:
        return "it is set up but has no carrier: is the cable or the peer end up?"
    if operstate == "down":
        return f"bring it up with 'ip link set dev {name} up'"
    if operstate == "lowerlayerdown":
        return "the interface it is stacked on is down"
    if operstate == "notpresent":
        return "its device is not present"
    return "it cannot pass traffic yet"


def _combine(problems: Sequence[FabricError], kind: type[FabricError] | None) -> FabricError:
    if len(problems) == 1:
        return problems[0]
    lines = "\n".join(f"  {p.message}" for p in problems)
    return (kind or FabricError)(f"{len(problems)} fabric problems:\n{lines}", errors=problems)


def _is_ip_address(text: str) -> bool:
    candidate = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    candidate = candidate.partition("%")[0]
    try:
        ipaddress.ip_address(candidate)
    except ValueError:
        return False
    return True


def _describe_char(char: str) -> str:
    names = {" ": "a space", "\0": "a NUL byte", "\t": "a tab", "\n": "a newline"}
    return names.get(char, repr(char))


def _read_sys(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _read_sys_int(path: Path) -> int | None:
    text = _read_sys(path)
    if text is None:
        return None
    try:
        return int(text, 0)
    except ValueError:
        return None


def _ipv4_address(name: str) -> str | None:
    request = struct.pack("256s", name.encode("utf-8", "surrogateescape"))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            reply = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                return None
            if exc.errno == errno.ENODEV:
                raise _unknown(name) from None
            raise FabricStateError(
                f"cannot read the IPv4 address of fabric {name!r}: {exc.strerror}"
            ) from exc
    return socket.inet_ntoa(reply[20:24])


def _ipv6_addresses(name: str) -> tuple[list[tuple[str, int]], list[str]]:
    """Usable ``(address, scope)`` pairs of ``name``, best first, and the tentative addresses."""
    try:
        lines = _PROC_IF_INET6.read_text().splitlines()
    except OSError:  # no IPv6 in this kernel or namespace
        return [], []
    ranked: list[tuple[tuple[int, int, int, int], str, int]] = []
    tentative: list[str] = []
    scope_rank = {_SCOPE_GLOBAL: 0, _SCOPE_SITE: 1, _SCOPE_HOST: 2, _SCOPE_LINK: 3}
    for position, line in enumerate(lines):
        fields = line.split()
        if len(fields) != 6 or fields[5] != name:
            continue
        address = str(ipaddress.IPv6Address(bytes.fromhex(fields[0])))
        scope, flags = int(fields[3], 16), int(fields[4], 16)
        if flags & _IFA_F_DADFAILED:
            continue
        # A tentative address cannot be bound (EADDRNOTAVAIL) unless it is optimistic.
        if flags & _IFA_F_TENTATIVE and not flags & _IFA_F_OPTIMISTIC:
            tentative.append(address)
            continue
        key = (
            scope_rank.get(scope, 2),
            1 if flags & _IFA_F_DEPRECATED else 0,
            1 if flags & _IFA_F_TEMPORARY else 0,
            position,
        )
        ranked.append((key, address, scope))
    ranked.sort()
    return [(address, scope) for _, address, scope in ranked], tentative
