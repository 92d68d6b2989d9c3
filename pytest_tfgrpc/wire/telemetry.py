"""What the kernel knows of a measured transfer: TCP state per connection, link counters.

Nothing here needs an engine's help. A connection is found by its endpoint (the server's
address and port) in the kernel's socket diagnostics (netlink ``sock_diag``, the
``INET_DIAG`` dump that ``ss -ti`` prints, read through pyroute2's ``DiagSocket``): every TCP
socket of this network namespace whose local or remote end is that endpoint, so both ends of a
connection to a server on this host, and the client's end of one to a server elsewhere (the
server's end is read on its host by its node agent). An interface's counters (bytes, drops,
errors) and its root qdisc's drops and ``tbf`` rate come from rtnetlink (pyroute2's
``IPRoute``); the host's count of retransmitted segments from ``/proc/net/snmp``, for when a
connection is gone.

A :class:`TelemetryReader` keeps its netlink sockets open, so a reading costs one dump
(about a millisecond); readings are taken between timed loops, never inside them.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "LinkState",
    "Reading",
    "TcpState",
    "TelemetryError",
    "TelemetryReader",
    "host_retransmits",
    "split_target",
]

#: TCP states read: established (1), FIN-WAIT-1/2 (4, 5), CLOSE-WAIT (8), LAST-ACK (9),
#: CLOSING (11): a connection that still carries or owes data. Bit ``1 << state``.
_STATES = sum(1 << state for state in (1, 4, 5, 8, 9, 11))
#: ``idiag_ext`` bit asking for ``INET_DIAG_INFO`` (``struct tcp_info``).
_INFO_EXT = 1 << (2 - 1)
_SNMP = Path("/proc/net/snmp")


class TelemetryError(RuntimeError):
    """Socket diagnostics or link counters could not be read (no netlink here, an interface
    that went away); the message says which and why."""


@dataclass(frozen=True)
class TcpState:
    """One TCP socket's ``struct tcp_info`` as the kernel reported it at one moment.

    ``local`` and ``remote`` are ``address:port``; ``server_side`` is whether ``local`` is the
    endpoint looked up. Counters are totals since the connection opened: ``retransmits``
    (segments, ``tcpi_total_retrans``), ``data_segs_out``, ``bytes_sent``, ``bytes_acked``,
    ``bytes_retrans``, ``bytes_received``. ``rtt_us`` and ``rttvar_us`` are the smoothed RTT
    and its mean deviation (microseconds), ``cwnd`` the congestion window (segments),
    ``delivery_rate_Bps`` the kernel's last delivery-rate sample (bytes/s), ``dsack_dups`` the
    retransmitted segments the receiver reported as duplicates (D-SACK): spurious ones, sent
    again though never lost (a probe fired while the receiver was slow to ack).
    """

    local: str
    remote: str
    server_side: bool
    retransmits: int
    data_segs_out: int
    bytes_sent: int
    bytes_acked: int
    bytes_retrans: int
    bytes_received: int
    rtt_us: int
    rttvar_us: int
    cwnd: int
    delivery_rate_Bps: int
    dsack_dups: int = 0

    @property
    def key(self) -> tuple[str, str]:
        return self.local, self.remote


@dataclass(frozen=True)
class LinkState:
    """An interface's counters at one moment (totals since it was made) and what limits it.

    ``qdisc`` is its root qdisc's kind (``tbf``, ``fq_codel``, ``noqueue``; empty if none
    was reported), ``qdisc_drops`` that qdisc's drops, ``tbf_rate_Bps`` a ``tbf``'s rate
    (bytes/s; None for other qdiscs) and ``speed_bps`` the speed the driver reports (None
    where it reports none, as for ``lo``).
    """

    interface: str
    rx_bytes: int
    tx_bytes: int
    rx_dropped: int
    tx_dropped: int
    rx_errors: int
    tx_errors: int
    qdisc: str
    qdisc_drops: int
    tbf_rate_Bps: int | None
    speed_bps: int | None

    @property
    def drops(self) -> int:
        return self.rx_dropped + self.tx_dropped

    @property
    def errors(self) -> int:
        return self.rx_errors + self.tx_errors

    @property
    def nominal_Bps(self) -> float | None:
        """The rate the link can carry: its ``tbf`` rate if shaped, else its reported speed
        (bytes/s), else None."""
        if self.tbf_rate_Bps:
            return float(self.tbf_rate_Bps)
        return self.speed_bps / 8 if self.speed_bps else None


@dataclass(frozen=True)
class Reading:
    """What one host saw at one moment (``at_ns``, its monotonic clock): the sockets of the
    endpoint, its fabric's link, the host's retransmitted segments so far (all connections;
    None where ``/proc/net/snmp`` cannot be read)."""

    at_ns: int
    sockets: tuple[TcpState, ...]
    link: LinkState | None
    host_retransmits: int | None


def split_target(target: str) -> tuple[str, int]:
    """``(address, port)`` of a ``host:port`` gRPC target (``[v6%zone]:port`` too); a host
    name is resolved. Raises :class:`TelemetryError` for a target that names no address."""
    host, _, port = target.rpartition(":")
    host = host.strip("[]").split("%", 1)[0]
    try:
        number = int(port)
        address = ipaddress.ip_address(host)
    except ValueError:
        try:
            info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            address = ipaddress.ip_address(info[0][4][0])
            number = int(info[0][4][1])
        except (OSError, ValueError, IndexError) as exc:
            raise TelemetryError(f"cannot find the address of target {target!r}: {exc}") from None
    return str(address), number


def host_retransmits() -> int | None:
    """Segments this host's TCP has retransmitted since boot (``Tcp: RetransSegs`` of
    ``/proc/net/snmp``, this network namespace), or None where it cannot be read."""
    try:
        lines = [line.split() for line in _SNMP.read_text().splitlines() if line.startswith("Tcp:")]
        names, values = lines[0], lines[1]
        return int(values[names.index("RetransSegs")])
    except (OSError, IndexError, ValueError):
        return None


def _tcp_state(message: Any, server_side: bool) -> TcpState | None:
    info = message.get_attr("INET_DIAG_INFO")
    if info is None:
        return None

    def end(address: str, port: int) -> str:
        return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"

    return TcpState(
        local=end(message["idiag_src"], message["idiag_sport"]),
        remote=end(message["idiag_dst"], message["idiag_dport"]),
        server_side=server_side,
        retransmits=int(info["tcpi_total_retrans"]),
        data_segs_out=int(info["tcpi_data_segs_out"]),
        bytes_sent=int(info["tcpi_bytes_sent"]),
        bytes_acked=int(info["tcpi_bytes_acked"]),
        bytes_retrans=int(info["tcpi_bytes_retrans"]),
        bytes_received=int(info["tcpi_bytes_received"]),
        rtt_us=int(info["tcpi_rtt"]),
        rttvar_us=int(info["tcpi_rttvar"]),
        cwnd=int(info["tcpi_snd_cwnd"]),
        delivery_rate_Bps=int(info["tcpi_delivery_rate"]),
        dsack_dups=int(info.get("tcpi_dsack_dups") or 0),
    )


class TelemetryReader:
    """Netlink sockets kept open to read TCP state and link counters cheaply, again and again.

    ``interface`` is the fabric whose link counters every :meth:`read` includes (None: none).
    Use as a context manager, or :meth:`close`. Raises :class:`TelemetryError` when netlink
    cannot be opened (not Linux; pyroute2 missing).
    """

    def __init__(self, interface: str | None = None) -> None:
        self.interface = interface
        # pyroute2's synchronous API runs an asyncio loop of its own, which cannot run inside
        # another (a stream benchmark's): its sockets live on, and are read from, one thread.
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tfgrpc-netlink")
        try:
            self._diag, self._route = self._thread.submit(_open_netlink).result()
        except BaseException:
            self._thread.shutdown(wait=False)
            raise

    def sockets(self, address: str, port: int) -> tuple[TcpState, ...]:
        """Every TCP socket here with ``address:port`` at either end (connection states that
        carry data), with its ``tcp_info``."""
        return self._thread.submit(self._sockets, address, port).result()

    def _sockets(self, address: str, port: int) -> tuple[TcpState, ...]:
        # gRPC opens AF_INET6 sockets and reaches IPv4 through mapped addresses
        # (::ffff:127.0.0.1): an IPv4 endpoint is looked up in both families.
        families = (socket.AF_INET6,) if ":" in address else (socket.AF_INET, socket.AF_INET6)
        want = {address, f"::ffff:{address}"}
        messages: list[Any] = []
        try:
            for family in families:
                messages.extend(
                    self._diag.get_sock_stats(family=family, states=_STATES, extensions=_INFO_EXT)
                )
        except OSError as exc:
            raise TelemetryError(f"socket diagnostics: {exc}") from None
        found: list[TcpState] = []
        for message in messages:
            if message["idiag_sport"] == port and message["idiag_src"] in want:
                state = _tcp_state(message, server_side=True)
            elif message["idiag_dport"] == port and message["idiag_dst"] in want:
                state = _tcp_state(message, server_side=False)
            else:
                continue
            if state is not None:
                found.append(state)
        return tuple(found)

    def link(self, interface: str) -> LinkState:
        """``interface``'s counters, root qdisc and speed now."""
        return self._thread.submit(self._link, interface).result()

    def _link(self, interface: str) -> LinkState:
        try:
            links = self._route.get_links(ifname=interface)
        except Exception as exc:  # pyroute2 raises NetlinkError (an OSError) or KeyError
            raise TelemetryError(f"interface {interface!r}: {exc}") from None
        if not links:
            raise TelemetryError(f"interface {interface!r}: no such interface here")
        link = links[0]
        stats = link.get_attr("IFLA_STATS64") or link.get_attr("IFLA_STATS") or {}
        kind, drops, rate = "", 0, None
        try:
            qdiscs = self._route.get_qdiscs(index=link["index"])
        except OSError:
            qdiscs = ()
        for qdisc in qdiscs:
            if qdisc["parent"] != 0xFFFFFFFF:  # TC_H_ROOT: only the root qdisc
                continue
            kind = str(qdisc.get_attr("TCA_KIND") or "")
            basic = qdisc.get_attr("TCA_STATS") or {}
            drops = int(basic.get("drop", 0))
            if kind == "tbf":
                rate = _tbf_rate(qdisc.get_attr("TCA_OPTIONS"))
        return LinkState(
            interface=interface,
            rx_bytes=int(stats.get("rx_bytes", 0)),
            tx_bytes=int(stats.get("tx_bytes", 0)),
            rx_dropped=int(stats.get("rx_dropped", 0)),
            tx_dropped=int(stats.get("tx_dropped", 0)),
            rx_errors=int(stats.get("rx_errors", 0)),
            tx_errors=int(stats.get("tx_errors", 0)),
            qdisc=kind,
            qdisc_drops=drops,
            tbf_rate_Bps=rate,
            speed_bps=_speed_bps(interface),
        )

    def read(self, address: str, port: int) -> Reading:
        """One :class:`Reading` of the endpoint ``address:port`` and this reader's fabric."""
        return self._thread.submit(self._read, address, port).result()

    def _read(self, address: str, port: int) -> Reading:
        at = time.monotonic_ns()
        sockets = self._sockets(address, port)
        link = self._link(self.interface) if self.interface else None
        return Reading(at, sockets, link, host_retransmits())

    def close(self) -> None:
        def close_all() -> None:
            for sock in (self._diag, self._route):
                sock.close()

        self._thread.submit(close_all).result()
        self._thread.shutdown()

    def __enter__(self) -> TelemetryReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _open_netlink() -> tuple[Any, Any]:
    try:
        from pyroute2 import DiagSocket, IPRoute
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise TelemetryError(f"cannot read socket diagnostics: {exc}") from None
    try:
        diag = DiagSocket()
        diag.bind()
    except OSError as exc:
        raise TelemetryError(f"cannot open netlink for socket diagnostics: {exc}") from None
    try:
        return diag, IPRoute()
    except OSError as exc:
        diag.close()
        raise TelemetryError(f"cannot open rtnetlink for link counters: {exc}") from None


def _tbf_rate(options: Any) -> int | None:
    if options is None:
        return None
    rate64 = options.get_attr("TCA_TBF_RATE64")
    if rate64:
        return int(rate64)
    parms = options.get_attr("TCA_TBF_PARMS")
    return int(parms["rate"]) if parms and parms.get("rate") else None


def _speed_bps(interface: str) -> int | None:
    """The speed the driver reports in sysfs (Mbit/s there), None where it reports none."""
    try:
        mbps = int(Path("/sys/class/net", interface, "speed").read_text())
    except (OSError, ValueError):
        return None
    return mbps * 1_000_000 if mbps > 0 else None


def readings_sockets(readings: Iterable[Reading]) -> int:
    """How many distinct connections a series of readings saw."""
    return len({state.key for reading in readings for state in reading.sockets})
