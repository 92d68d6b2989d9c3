"""What the kernel knows of a measured transfer: TCP state per connection, link counters.

Nothing here needs an engine's help. A connection is found by its endpoint (the server's
address and port) in the kernel's socket diagnostics (netlink ``sock_diag``, the
``INET_DIAG`` dump that ``ss -ti`` prints, read through pyroute2's ``DiagSocket``): every TCP
socket of this network namespace whose local or remote end is that endpoint, so both ends of a
connection to a server on this host, and the client's end of one to a server elsewhere (the
server's end is read on its host by its node agent). An interface's counters (bytes, drops,
errors) come from sysfs, its root qdisc's drops and ``tbf`` rate from rtnetlink; the host's
count of retransmitted segments from ``/proc/net/snmp``, for when a connection is gone.

Messages are pyroute2's (``inet_diag_req``/``inet_diag_msg`` with ``struct tcp_info``,
``tcmsg`` with the qdisc's options and statistics), encoded and decoded by it; they travel on
plain blocking netlink sockets, which a :class:`TelemetryReader` keeps open: pyroute2's own
socket classes run an asyncio loop per request, which costs milliseconds on a loaded machine
and cannot run inside another loop (a stream benchmark's). Readings are taken between timed
loops, never inside them.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyroute2.netlink import NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR
from pyroute2.netlink.diag import SOCK_DIAG_BY_FAMILY, inet_diag_msg, inet_diag_req
from pyroute2.netlink.rtnl import RTM_GETQDISC
from pyroute2.netlink.rtnl.tcmsg import tcmsg

NETLINK_ROUTE = 0
NETLINK_SOCK_DIAG = 4

__all__ = [
    "LinkState",
    "Reading",
    "TcpState",
    "TelemetryError",
    "TelemetryReader",
    "host_retransmits",
    "run_queue_wait_ns",
    "split_target",
]

#: TCP states read: established (1), FIN-WAIT-1/2 (4, 5), CLOSE-WAIT (8), LAST-ACK (9),
#: CLOSING (11): a connection that still carries or owes data. Bit ``1 << state``.
_STATES = sum(1 << state for state in (1, 4, 5, 8, 9, 11))
#: ``idiag_ext`` bit asking for ``INET_DIAG_INFO`` (``struct tcp_info``).
_INFO_EXT = 1 << (2 - 1)
_SNMP = Path("/proc/net/snmp")
_COUNTERS = ("rx_bytes", "tx_bytes", "rx_dropped", "tx_dropped", "rx_errors", "tx_errors")


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
    None where ``/proc/net/snmp`` cannot be read), and ``cpu_wait_ns``, the run-queue wait so
    far of a role's process there (:func:`run_queue_wait_ns`; None where none was asked for
    or it cannot be read)."""

    at_ns: int
    sockets: tuple[TcpState, ...]
    link: LinkState | None
    host_retransmits: int | None
    cpu_wait_ns: int | None = None


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


def run_queue_wait_ns(pid: int) -> int | None:
    """Nanoseconds the threads of process ``pid`` (of this host) have waited on a run queue
    for a CPU, summed over the threads alive now (the second field of each
    ``/proc/<pid>/task/<tid>/schedstat``); None where it cannot be read. A side that waited
    long wanted more CPU than it got: the machine's load, not the side, was short of CPU."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tasks:
        try:
            total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total


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
    cannot be opened (not Linux).
    """

    def __init__(self, interface: str | None = None) -> None:
        self.interface = interface
        self._seq = 0
        try:
            self._diag = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG)
        except (OSError, AttributeError) as exc:
            raise TelemetryError(f"cannot open netlink for socket diagnostics: {exc}") from None
        try:
            self._route = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
        except OSError as exc:
            self._diag.close()
            raise TelemetryError(f"cannot open rtnetlink for qdiscs: {exc}") from None
        # One request at a time per socket (an agent answers from several threads).
        self._lock = threading.Lock()
        #: Per endpoint, the sockets its last discovery found: (family, ident, server side).
        self._known: dict[tuple[str, int], list[tuple[int, _Ident, bool]]] = {}

    def _request(
        self, sock: socket.socket, message: Any, kind: int, *, dump: bool = True
    ) -> list[bytes]:
        """Send a request (a dump unless ``dump`` is false); the raw messages of its answer,
        up to NLMSG_DONE, or the one answer of a lookup."""
        self._seq += 1
        message["header"]["type"] = kind
        message["header"]["flags"] = NLM_F_REQUEST | (NLM_F_DUMP if dump else 0)
        message["header"]["sequence_number"] = self._seq
        message.encode()
        sock.send(message.data)
        out: list[bytes] = []
        while True:
            data = sock.recv(1 << 20)
            offset = 0
            while offset + 16 <= len(data):
                length, kind_, _, seq, _ = struct.unpack_from("=IHHII", data, offset)
                if length < 16:
                    raise TelemetryError("netlink: a malformed answer")
                if seq == self._seq:
                    if kind_ == NLMSG_DONE:
                        return out
                    if kind_ == NLMSG_ERROR:
                        (code,) = struct.unpack_from("=i", data, offset + 16)
                        if code:
                            raise TelemetryError(f"netlink: {os.strerror(-code)}")
                        return out
                    out.append(data[offset : offset + length])
                    if not dump:
                        return out
                offset += (length + 3) & ~3

    def sockets(self, address: str, port: int, *, discover: bool = True) -> tuple[TcpState, ...]:
        """Every TCP socket here with ``address:port`` at either end (connection states that
        carry data), with its ``tcp_info``.

        ``discover`` dumps every TCP socket of the namespace to find them (the kernel walks
        its whole connection table: milliseconds on a large host); without it, the sockets
        the last discovery found are looked up one by one by their addresses (a hash lookup
        each), and one opened since is not seen."""
        endpoint = (address, port)
        if discover or endpoint not in self._known:
            return self._discover(address, port)
        found: list[TcpState] = []
        for family, ident, server_side in self._known[endpoint]:
            request = _request_for(family)
            request["idiag_sport"], request["idiag_dport"] = ident[0], ident[1]
            request["idiag_src"], request["idiag_dst"] = ident[2], ident[3]
            request["idiag_cookie"] = ident[4]
            try:
                with self._lock:
                    raw = self._request(self._diag, request, SOCK_DIAG_BY_FAMILY, dump=False)
            except TelemetryError:
                continue  # closed since (ENOENT)
            except OSError as exc:
                raise TelemetryError(f"socket diagnostics: {exc}") from None
            for data in raw:
                message = inet_diag_msg(data)
                message.decode()
                state = _tcp_state(message, server_side=server_side)
                if state is not None:
                    found.append(state)
        return tuple(found)

    def _discover(self, address: str, port: int) -> tuple[TcpState, ...]:
        # gRPC opens AF_INET6 sockets and reaches IPv4 through mapped addresses
        # (::ffff:127.0.0.1): an IPv4 endpoint is looked up in both families.
        families: tuple[int, ...] = (
            (socket.AF_INET6,) if ":" in address else (socket.AF_INET, socket.AF_INET6)
        )
        # Both families walk the one connection table: once the endpoint's sockets were found
        # in one, only that one is dumped again.
        seen = {family for family, _, _ in self._known.get((address, port), ())}
        if seen:
            families = tuple(f for f in families if f in seen)
        want = {address, f"::ffff:{address}"}
        found: list[TcpState] = []
        known: list[tuple[int, _Ident, bool]] = []
        for family in families:
            try:
                with self._lock:
                    raw = self._request(self._diag, _request_for(family), SOCK_DIAG_BY_FAMILY)
            except OSError as exc:
                raise TelemetryError(f"socket diagnostics: {exc}") from None
            for data in raw:
                # The ports first (cheap: after the 16-byte header and 4 bytes of the message),
                # then the whole message with its tcp_info.
                sport, dport = struct.unpack_from(">HH", data, 20)
                if port not in (sport, dport):
                    continue
                message = inet_diag_msg(data)
                message.decode()
                if message["idiag_sport"] == port and message["idiag_src"] in want:
                    server_side = True
                elif message["idiag_dport"] == port and message["idiag_dst"] in want:
                    server_side = False
                else:
                    continue
                state = _tcp_state(message, server_side=server_side)
                if state is not None:
                    found.append(state)
                    known.append((family, _ident(data), server_side))
        self._known[(address, port)] = known
        return tuple(found)

    def link(self, interface: str) -> LinkState:
        """``interface``'s counters (sysfs), root qdisc (rtnetlink) and speed now."""
        where = Path("/sys/class/net", interface)
        try:
            index = int((where / "ifindex").read_text())
            counters = {name: int((where / "statistics" / name).read_text()) for name in _COUNTERS}
        except (OSError, ValueError) as exc:
            raise TelemetryError(f"interface {interface!r}: {exc}") from None
        kind, drops, rate = "", 0, None
        request = tcmsg()
        request["family"] = socket.AF_UNSPEC
        try:
            with self._lock:
                raw = self._request(self._route, request, RTM_GETQDISC)
        except (OSError, TelemetryError):
            raw = []  # counters without the qdisc rather than nothing
        for data in raw:
            qdisc = tcmsg(data)
            qdisc.decode()
            if qdisc["index"] != index or qdisc["parent"] != 0xFFFFFFFF:  # TC_H_ROOT only
                continue
            kind = str(qdisc.get_attr("TCA_KIND") or "")
            basic = qdisc.get_attr("TCA_STATS") or {}
            drops = int(basic.get("drop", 0))
            if kind == "tbf":
                rate = _tbf_rate(qdisc.get_attr("TCA_OPTIONS"))
        return LinkState(
            interface=interface,
            **counters,
            qdisc=kind,
            qdisc_drops=drops,
            tbf_rate_Bps=rate,
            speed_bps=_speed_bps(interface),
        )

    def read(self, address: str, port: int, *, discover: bool = True) -> Reading:
        """One :class:`Reading` of the endpoint ``address:port`` and this reader's fabric
        (``discover``: as for :meth:`sockets`)."""
        at = time.monotonic_ns()
        sockets = self.sockets(address, port, discover=discover)
        link = self.link(self.interface) if self.interface else None
        return Reading(at, sockets, link, host_retransmits())

    def close(self) -> None:
        self._diag.close()
        self._route.close()

    def __enter__(self) -> TelemetryReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: A socket's identity in a lookup: (sport, dport, src words, dst words, cookie).
_Ident = tuple[int, int, tuple[int, int, int, int], tuple[int, int, int, int], int]


def _ident(data: bytes) -> _Ident:
    """The identity of the socket an ``inet_diag_msg`` (raw, with its netlink header)
    describes, as a lookup request takes it back."""
    sport, dport = struct.unpack_from(">HH", data, 20)
    src = struct.unpack_from(">4I", data, 24)
    dst = struct.unpack_from(">4I", data, 40)
    (cookie,) = struct.unpack_from("=Q", data, 60)
    return sport, dport, src, dst, cookie


def _request_for(family: int) -> Any:
    request = inet_diag_req()
    request["sdiag_family"] = family
    request["sdiag_protocol"] = socket.IPPROTO_TCP
    request["idiag_ext"] = _INFO_EXT
    request["idiag_states"] = _STATES
    return request


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
