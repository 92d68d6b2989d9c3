"""What the kernel knows of a measured transfer: TCP state per connection, link counters.

Nothing here needs an engine's help. A connection is found by its endpoint (the server's
address and port) in the kernel's socket diagnostics (netlink ``sock_diag``, the
``INET_DIAG`` dump that ``ss -ti`` prints): every TCP socket of this network namespace whose
local or remote end is that endpoint, so both ends of a connection to a server on this host,
and the client's end of one to a server elsewhere (the server's end is read on its host by its
node agent). Where the client's ends are known (this process's own connections,
:func:`own_connections`; those a native client reports), both ends of each are looked up by
their exact addresses instead: a hash lookup each, where a dump walks the kernel's whole
connection table. An interface's counters (bytes, drops, errors) come from sysfs, its root
qdisc's drops and ``tbf`` rate from rtnetlink; the host's count of retransmitted segments from
``/proc/net/snmp``, for when a connection is gone.

Messages are pyroute2's (``inet_diag_req``/``inet_diag_msg`` with ``struct tcp_info``,
``tcmsg`` with the qdisc's options and statistics), encoded and decoded by it; they travel on
plain blocking netlink sockets, which a :class:`TelemetryReader` keeps open: pyroute2's own
socket classes run an asyncio loop per request, which costs milliseconds on a loaded machine
and cannot run inside another loop (a stream benchmark's). Readings are taken between timed
loops, never inside them.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pyroute2.netlink import NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR
from pyroute2.netlink.diag import SOCK_DIAG_BY_FAMILY, inet_diag_msg, inet_diag_req
from pyroute2.netlink.rtnl import RTM_GETQDISC
from pyroute2.netlink.rtnl.tcmsg import tcmsg

NETLINK_ROUTE = 0
NETLINK_SOCK_DIAG = 4

__all__ = [
    "Clients",
    "LinkState",
    "Reading",
    "TcpState",
    "TelemetryError",
    "TelemetryReader",
    "host_retransmits",
    "own_connections",
    "run_queue_wait_ns",
    "split_target",
]

#: TCP states read: established (1), FIN-WAIT-1/2 (4, 5), CLOSE-WAIT (8), LAST-ACK (9),
#: CLOSING (11): a connection that still carries or owes data. Bit ``1 << state``.
_STATES = sum(1 << state for state in (1, 4, 5, 8, 9, 11))
#: ``idiag_ext`` bit asking for ``INET_DIAG_INFO`` (``struct tcp_info``).
_INFO_EXT = 1 << (2 - 1)
_SNMP = "/proc/net/snmp"
_COUNTERS = ("rx_bytes", "tx_bytes", "rx_dropped", "tx_dropped", "rx_errors", "tx_errors")
#: The :class:`TcpState` counters and the ``struct tcp_info`` field each is.
_FROM_TCP_INFO = {
    "retransmits": "tcpi_total_retrans",
    "data_segs_out": "tcpi_data_segs_out",
    "bytes_sent": "tcpi_bytes_sent",
    "bytes_acked": "tcpi_bytes_acked",
    "bytes_retrans": "tcpi_bytes_retrans",
    "bytes_received": "tcpi_bytes_received",
    "rtt_us": "tcpi_rtt",
    "rttvar_us": "tcpi_rttvar",
    "cwnd": "tcpi_snd_cwnd",
    "delivery_rate_Bps": "tcpi_delivery_rate",
    "dsack_dups": "tcpi_dsack_dups",
}


def _tcp_info_reader() -> tuple[struct.Struct, tuple[str, ...]]:
    """One unpack of the kept fields of ``struct tcp_info`` as pyroute2 lays it out (its
    ``inet_diag_msg.tcp_info`` fields), the others skipped as pad bytes, up to the last kept
    one; and the :class:`TcpState` names of what it unpacks, in order. One unpack per socket
    instead of pyroute2's decoder (150 us a message on a loaded machine)."""
    wanted = {field: name for name, field in _FROM_TCP_INFO.items()}
    layout, names, kept = "=", [], ""
    for field, kind in inet_diag_msg.tcp_info.fields:
        if field in wanted:
            layout += kind
            names.append(wanted.pop(field))
            kept = layout
        else:
            layout += f"{struct.calcsize('=' + kind)}x"
    if wanted:
        raise ImportError(f"pyroute2's tcp_info lacks {', '.join(sorted(wanted))}")
    return struct.Struct(kept), tuple(names)


_TCP_INFO, _TCP_INFO_KEPT = _tcp_info_reader()
#: Offsets in a raw ``inet_diag_msg`` answer: after the 16-byte netlink header, the family
#: byte, the socket id (ports, addresses, cookie: what a lookup request takes back) and,
#: past the 72-byte message, its attributes.
_FAMILY, _SOCKID, _SOCKID_END, _ATTRS = 16, 20, 68, 16 + 72
#: Where a request (``inet_diag_req_v2``) holds the socket id.
_REQUEST_SOCKID = 24
#: ``INET_DIAG_NOCOOKIE``: a lookup by addresses alone, whichever socket holds them now.
_NO_COOKIE = b"\xff" * 8
_INET_DIAG_INFO = 2
_INET_DIAG_REQ_BYTECODE = 1
_BC_JMP, _BC_S_COND, _BC_D_COND = 1, 7, 8
_TCPDIAG_GETSOCK = 18
#: A raw ``tcmsg`` answer's attributes start after the netlink header and its 20 bytes;
#: ``TCA_KIND`` and ``TCA_STATS`` are its attributes 1 and 3.
_TCMSG_ATTRS, _TCA_KIND, _TCA_STATS = 16 + 20, 1, 3
_ROOT = 0xFFFFFFFF  # TC_H_ROOT
#: ``RTM_GETSTATS`` and its attribute of an interface's ``struct rtnl_link_stats64``.
_RTM_GETSTATS, _IFLA_STATS_LINK_64 = 94, 1


#: Finds the clients' connections to a port: ``port`` -> their ``(local, peer)`` ends
#: (:func:`own_connections`).
Clients = Callable[[int], Sequence[tuple[str, str]]]


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
    endpoint, its fabric's link, the host's retransmitted segments so far (all connections; None
    where ``/proc/net/snmp`` cannot be read or was not), and ``cpu_wait_ns``, the run-queue wait
    so far of a role's process there (:func:`run_queue_wait_ns`; None where none was asked for
    or it cannot be read)."""

    at_ns: int
    sockets: tuple[TcpState, ...]
    link: LinkState | None
    host_retransmits: int | None
    cpu_wait_ns: int | None = None


#: :func:`split_target` of targets that name their address (no name to resolve again), at
#: most :data:`_LITERALS_KEPT`: a probe per measured size parses the same server's target.
_literals: dict[str, tuple[str, int]] = {}
_LITERALS_KEPT = 256


def split_target(target: str) -> tuple[str, int]:
    """``(address, port)`` of a ``host:port`` gRPC target (``[v6%zone]:port`` too); a host
    name is resolved. Raises :class:`TelemetryError` for a target that names no address."""
    known = _literals.get(target)
    if known is not None:
        return known
    host, _, port = target.rpartition(":")
    host = host.strip("[]").split("%", 1)[0]
    try:
        number = int(port)
        address = ipaddress.ip_address(host)
        if len(_literals) < _LITERALS_KEPT:
            _literals[target] = (str(address), number)
    except ValueError:
        try:
            info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            address = ipaddress.ip_address(info[0][4][0])
            number = int(info[0][4][1])
        except (OSError, ValueError, IndexError) as exc:
            raise TelemetryError(f"cannot find the address of target {target!r}: {exc}") from None
    return str(address), number


def _read_small(path: str) -> bytes:
    """A small ``/proc`` or ``/sys`` file's bytes, in one read (no file object)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 1 << 16)
    finally:
        os.close(fd)


def host_retransmits() -> int | None:
    """Segments this host's TCP has retransmitted since boot (``Tcp: RetransSegs`` of
    ``/proc/net/snmp``, this network namespace), or None where it cannot be read."""
    return _tcp_mib()[0]


def _tcp_mib(read: Callable[[str], bytes] = _read_small) -> tuple[int | None, int | None]:
    """This network namespace's ``Tcp:`` counters of ``/proc/net/snmp`` (read by ``read``):
    (``RetransSegs``, ``ActiveOpens + PassiveOpens``, the connections ever opened here, IPv4
    and IPv6 alike); (None, None) where it cannot be read."""
    try:
        lines = [line.split() for line in read(_SNMP).splitlines() if line[:4] == b"Tcp:"]
        row = dict(zip(lines[0], lines[1], strict=True))
        return int(row[b"RetransSegs"]), int(row[b"ActiveOpens"]) + int(row[b"PassiveOpens"])
    except (OSError, IndexError, ValueError, KeyError):
        return None, None


def run_queue_wait_ns(pid: int, read: Callable[[str], bytes] = _read_small) -> int | None:
    """Nanoseconds the threads of process ``pid`` (of this host) have waited on a run queue
    for a CPU, summed over the threads alive now (the second field of each
    ``/proc/<pid>/task/<tid>/schedstat``, read by ``read``); None where it cannot be read. A
    side that waited long wanted more CPU than it got: the machine's load, not the side, was
    short of CPU."""
    paths = _schedstats(pid)
    return None if paths is None else _waited(paths, read)


def _schedstats(pid: int) -> list[str] | None:
    """The ``schedstat`` files of ``pid``'s threads now; None where it cannot be listed."""
    where = f"/proc/{pid}/task/"
    try:
        return [f"{where}{tid}/schedstat" for tid in os.listdir(where)]
    except OSError:
        return None


def _waited(paths: Iterable[str], read: Callable[[str], bytes]) -> int:
    total = 0
    for path in paths:
        try:
            total += int(read(path).split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total


class _Threads:
    """The ``schedstat`` files of the threads of the processes whose run-queue wait was read,
    kept open (``pread`` again: the kernel makes their text anew at offset 0), and read
    without a listing of the threads where none may have changed.

    A process's threads are listed again only where its number of threads now (its ``task``
    directory's link count: one ``stat``) differs from the files kept, or one of those fails
    to read (its thread ended): the same count with every thread kept still alive is the
    same threads. Not thread-safe: :class:`_Kernel`'s lock serialises its use."""

    #: The most files kept open in all: beyond, the process read least recently is closed.
    LIMIT = 256

    def __init__(self) -> None:
        self._fds: dict[int, list[int]] = {}

    def waited(self, pid: int) -> int | None:
        """:func:`run_queue_wait_ns` of ``pid``."""
        fds = self._fds.pop(pid, None)
        if fds:
            try:
                if os.stat(f"/proc/{pid}/task").st_nlink - 2 == len(fds):  # "." and ".."
                    total = sum(int(os.pread(fd, 256, 0).split(None, 2)[1]) for fd in fds)
                    self._fds[pid] = fds
                    return total
            except (OSError, IndexError, ValueError):
                pass  # a thread ended, or the process: list them again
            _close_all(fds)
        paths = _schedstats(pid)
        if paths is None:
            return None
        total, fds = 0, []
        for path in paths:
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue  # a thread that ended meanwhile
            try:
                total += int(os.pread(fd, 256, 0).split(None, 2)[1])
            except (OSError, IndexError, ValueError):
                os.close(fd)
                continue
            fds.append(fd)
        while self._fds and len(fds) + sum(map(len, self._fds.values())) > self.LIMIT:
            _close_all(self._fds.pop(next(iter(self._fds))))
        if len(fds) <= self.LIMIT:
            self._fds[pid] = fds
        else:
            _close_all(fds)
        return total

    def forget(self, pid: int) -> None:
        """Close ``pid``'s files (it ended)."""
        _close_all(self._fds.pop(pid, []))


def _close_all(fds: Iterable[int]) -> None:
    """Close ``fds``: each run of consecutive descriptors (a process's thread files, opened
    one after another) in one ``close_range`` call, not a ``close`` each."""
    ordered = sorted(fds)
    while ordered:
        low = high = ordered.pop(0)
        while ordered and ordered[0] == high + 1:
            high = ordered.pop(0)
        if low == high:
            os.close(low)
        else:
            os.closerange(low, high + 1)  # every descriptor in it is one of ``fds``


def _alive(pid: int) -> bool:
    try:
        os.stat(f"/proc/{pid}")
    except OSError:
        return False
    return True


class _OpenFiles:
    """Small ``/proc`` and ``/sys`` files kept open and read again with ``pread`` (the kernel
    makes their text anew at offset 0), which saves an open and a close per read; a file
    that fails to read is closed and forgotten (its interface is gone)."""

    #: The most files kept open: the oldest is closed to open one more.
    LIMIT = 128

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()  # an agent reads from several threads

    def read(self, path: str) -> bytes:
        with self._lock:
            fd = self._fds.pop(path, None)
            if fd is not None:
                try:
                    data = os.pread(fd, 1 << 16, 0)
                    self._fds[path] = fd
                    return data
                except OSError:  # gone, or made anew under its name (an interface): reopen
                    os.close(fd)
            if len(self._fds) >= self.LIMIT:
                os.close(self._fds.pop(next(iter(self._fds))))
            fd = os.open(path, os.O_RDONLY)
            try:
                data = os.pread(fd, 1 << 16, 0)
            except OSError:
                os.close(fd)
                raise
            self._fds[path] = fd
            return data


class _Kernel:
    """This process's netlink sockets (socket diagnostics, routing), their receive buffer and
    its open ``/proc`` and ``/sys`` files, shared by all its readers: made once, where a
    reader per measured size would open them all again (two sockets, a 128 KiB buffer
    faulted in anew, a file per thread read). Requests on the sockets are serialised by
    ``lock``; sequence numbers are this process's."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.seq = 0
        try:
            self.diag = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG)
        except (OSError, AttributeError) as exc:
            raise TelemetryError(f"cannot open netlink for socket diagnostics: {exc}") from None
        try:
            self.route = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
        except OSError as exc:
            self.diag.close()
            raise TelemetryError(f"cannot open rtnetlink for qdiscs: {exc}") from None
        self.lock = threading.Lock()
        self.buffer = bytearray(1 << 17)
        self.files = _OpenFiles()
        self.threads = _Threads()
        #: Per interface and index, the speed its driver reports (None where it reports
        #: none): read once per interface, not once per reader (a reader per measured size
        #: read it anew: an open, a read and a close). An interface made again under its name
        #: has another index, and its speed is read again.
        self.speeds: dict[tuple[str, int], int | None] = {}


_kernel: _Kernel | None = None
_kernel_lock = threading.Lock()


def _shared_kernel() -> _Kernel:
    """This process's :class:`_Kernel`, made at its first use (and again in a forked child,
    which must not share its parent's netlink sockets). Raises :class:`TelemetryError`
    where netlink cannot be opened (not Linux)."""
    global _kernel
    with _kernel_lock:
        if _kernel is None or _kernel.pid != os.getpid():
            _kernel = _Kernel()
        return _kernel


#: The ends of this process's sockets as :func:`own_connections` last saw them, by descriptor
#: and socket (``/proc/self/fd``'s name and the socket's inode): a connected TCP socket's
#: ``(local, peer)``, None for another kind of socket. A socket's ends never change once
#: connected; a descriptor closed and used again holds another socket (another inode).
_own_ends: dict[tuple[str, int], tuple[str, str] | None] = {}


def own_connections(port: int) -> tuple[tuple[str, str], ...]:
    """The ends of this process's TCP connections to port ``port`` (any address): ``(local,
    peer)`` each, as ``address:port`` or ``[v6]:port``, read from its own descriptors
    (``/proc/self/fd``, each socket's ``getsockname``/``getpeername`` through a duplicate:
    gRPC's connections, which it does not show). A socket seen by an earlier call is not
    asked again (its ends are remembered, :data:`_own_ends`): a call lists the descriptors,
    ``fstat`` s each and asks only sockets new since."""
    global _own_ends
    out = []
    where = "/proc/self/fd/"
    seen: dict[tuple[str, int], tuple[str, str] | None] = {}
    for name in os.listdir(where):
        try:
            status = os.fstat(int(name))  # no path to resolve, as a readlink of it has
        except (OSError, ValueError):
            continue  # closed meanwhile
        if not stat.S_ISSOCK(status.st_mode):
            continue
        key = (name, status.st_ino)
        if key in _own_ends:
            ends = seen[key] = _own_ends[key]
        else:
            ends, final = _socket_ends(name)
            if final:
                seen[key] = ends
        if ends is not None and ends[1].rpartition(":")[2] == str(port):
            out.append(ends)
    _own_ends = seen
    return tuple(out)


def _socket_ends(name: str) -> tuple[tuple[str, str] | None, bool]:
    """The ``(local, peer)`` ends of descriptor ``name``'s socket (None: not a connected TCP
    socket), and whether that is final (False for one not connected yet, or closed
    meanwhile)."""
    try:
        duplicate = os.dup(int(name))
    except (OSError, ValueError):
        return None, False  # closed meanwhile
    try:
        sock = socket.socket(fileno=duplicate)
    except OSError:
        os.close(duplicate)
        return None, False
    with sock:
        if sock.family not in (socket.AF_INET, socket.AF_INET6):
            return None, True
        if sock.type != socket.SOCK_STREAM:
            return None, True
        try:
            peer, local = sock.getpeername(), sock.getsockname()
        except OSError:
            return None, False  # not connected
    return (_text_end(local[0], local[1]), _text_end(peer[0], peer[1])), True


def _text_end(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


#: An IPv6 address that carries an IPv4 one (``::ffff:a.b.c.d``) starts so.
_MAPPED = b"\0" * 10 + b"\xff\xff"


def _parse_end(text: str) -> tuple[int, bytes, int]:
    """The family, packed address (an IPv4-mapped one as IPv4) and port of
    ``address:port``/``[v6]:port``; ValueError for anything else."""
    host, _, port = text.rpartition(":")
    host = host.strip("[]").split("%", 1)[0]
    try:
        return socket.AF_INET, socket.inet_pton(socket.AF_INET, host), int(port)
    except OSError:
        pass
    try:
        packed = socket.inet_pton(socket.AF_INET6, host)
    except OSError:
        raise ValueError(f"no address: {text!r}") from None
    if packed.startswith(_MAPPED):
        return socket.AF_INET, packed[12:], int(port)
    return socket.AF_INET6, packed, int(port)


def _exact(client: str, server: str) -> list[tuple[bytes, bool]]:
    """Encoded lookups of both ends of the connection from ``client`` to ``server``
    (``address:port`` each), by their addresses and ports (no cookie): the client's end
    (False), then the server's (True). Empty for ends that do not parse or mix families."""
    try:
        (family, near, near_port), (other, far, far_port) = _parse_end(client), _parse_end(server)
    except ValueError:
        return []
    if family != other:
        return []
    request = _lookup_template(family)

    def lookup(src: bytes, sport: int, dst: bytes, dport: int) -> bytes:
        sockid = struct.pack(">HH", sport, dport) + src.ljust(16, b"\0")
        sockid += dst.ljust(16, b"\0") + struct.pack("=I", 0) + _NO_COOKIE
        at = _REQUEST_SOCKID
        return request[:at] + sockid + request[at + len(sockid) :]

    return [
        (lookup(near, near_port, far, far_port), False),
        (lookup(far, far_port, near, near_port), True),
    ]


def _end(family: int, raw: bytes) -> str:
    if family == socket.AF_INET:
        return socket.inet_ntop(family, raw[:4])
    return socket.inet_ntop(family, raw)


def _attributes(data: bytes, offset: int) -> dict[int, bytes]:
    """The netlink attributes of a raw message from ``offset`` on: type -> payload."""
    out = {}
    while offset + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, offset)
        if length < 4:
            break
        out[kind & 0x3FFF] = data[offset + 4 : offset + length]
        offset += (length + 3) & ~3
    return out


def _tcp_state(data: bytes, server_side: bool) -> TcpState | None:
    """The :class:`TcpState` of a raw ``inet_diag_msg`` answer (with its netlink header);
    None without ``INET_DIAG_INFO``. Its addresses and ports are read at their offsets and
    ``tcp_info`` with one unpack (a shorter one, from an older kernel, reads as zeros past
    its end)."""
    family = data[_FAMILY]
    sport, dport = struct.unpack_from(">HH", data, _SOCKID)
    src, dst = _end(family, data[24:40]), _end(family, data[40:56])
    payload = _attributes(data, _ATTRS).get(_INET_DIAG_INFO)
    if payload is None:
        return None
    if len(payload) < _TCP_INFO.size:
        payload = payload.ljust(_TCP_INFO.size, b"\0")
    return TcpState(
        _text_end(src, sport),
        _text_end(dst, dport),
        server_side,
        **dict(zip(_TCP_INFO_KEPT, _TCP_INFO.unpack_from(payload), strict=True)),
    )


class TelemetryReader:
    """Netlink sockets kept open to read TCP state and link counters cheaply, again and again.

    ``interface`` is the fabric whose link counters every :meth:`read` includes (None: none).
    Use as a context manager, or :meth:`close`. Raises :class:`TelemetryError` when netlink
    cannot be opened (not Linux).
    """

    def __init__(self, interface: str | None = None) -> None:
        self.interface = interface
        self._kernel = _shared_kernel()
        #: Per endpoint, the sockets its last discovery found: (family, the encoded lookup
        #: request of the socket, server side).
        self._known: dict[tuple[str, int], list[tuple[int, bytes, bool]]] = {}
        #: Per endpoint, the connections opened in the namespace before its last discovery.
        self._opened: dict[tuple[str, int], int | None] = {}
        self._qdisc_request = _qdisc_request()
        #: Per interface, what does not change while a reader lives: its index and the
        #: speed its driver reports (None where it reports none, as ``lo``, whose file
        #: fails to read every time).
        self._static: dict[str, tuple[int, int | None]] = {}
        #: Whether the kernel takes the one-walk discovery of both families.
        self._any = True
        self._files = self._kernel.files
        self._lock = self._kernel.lock
        #: The processes whose run-queue wait this reader read (their threads' files are
        #: the process's, :attr:`_Kernel.threads`).
        self._pids: set[int] = set()

    def _send(self, sock: socket.socket, requests: list[bytes]) -> list[int]:
        """Send encoded requests in one datagram, each with a sequence number of its own
        (returned in order)."""
        seqs = []
        batch = bytearray()
        kernel = self._kernel
        for request in requests:
            kernel.seq = (kernel.seq + 1) & 0xFFFFFFFF
            seqs.append(kernel.seq)
            head = len(batch)
            batch += request
            struct.pack_into("=I", batch, head + 8, kernel.seq)
        sock.send(batch)
        return seqs

    def _answers(
        self, sock: socket.socket, seqs: list[int], *, dump: bool | Container[int]
    ) -> dict[int, Any]:
        """The raw messages answering ``seqs``, per sequence number, up to each one's
        NLMSG_DONE (a dump: all of them with ``dump`` true, or those ``dump`` holds) or its
        one answer (a lookup); an error answer is its :class:`TelemetryError` in place of
        the list."""
        out: dict[int, Any] = {seq: [] for seq in seqs}
        pending = set(seqs)
        while pending:
            size = sock.recv_into(self._kernel.buffer)
            data = bytes(self._kernel.buffer[:size])
            offset = 0
            while offset + 16 <= size:
                length, kind, _, seq, _ = struct.unpack_from("=IHHII", data, offset)
                if length < 16:
                    raise TelemetryError("netlink: a malformed answer")
                if seq in pending:
                    if kind == NLMSG_DONE:
                        pending.discard(seq)
                    elif kind == NLMSG_ERROR:
                        (code,) = struct.unpack_from("=i", data, offset + 16)
                        if code:
                            out[seq] = TelemetryError(f"netlink: {os.strerror(-code)}")
                        pending.discard(seq)
                    else:
                        out[seq].append(data[offset : offset + length])
                        if not (dump if isinstance(dump, bool) else seq in dump):
                            pending.discard(seq)
                offset += (length + 3) & ~3
        return out

    def _dump(self, sock: socket.socket, request: bytes) -> list[bytes]:
        with self._lock:
            (answer,) = self._answers(sock, self._send(sock, [request]), dump=True).values()
        if isinstance(answer, TelemetryError):
            raise answer
        return list(answer)

    def sockets(
        self, address: str, port: int, *, discover: bool = True, clients: Clients | None = None
    ) -> tuple[TcpState, ...]:
        """Every TCP socket here with ``address:port`` at either end (connection states that
        carry data), with its ``tcp_info``.

        ``discover`` finds the endpoint's connections anew, unless no connection was opened
        in the namespace since its last discovery (``/proc/net/snmp``'s open counts
        unchanged). With ``clients`` (called with ``port``: the ``(local, peer)`` ends of the
        clients' connections to it, as :func:`own_connections` gives them), both ends of
        each are looked up by their addresses; without, the kernel is asked for the TCP
        sockets of the namespace with ``port`` at either end (a dump filtered in the kernel
        by ``INET_DIAG`` bytecode: it still walks its whole connection table, 2 ms with
        262,144 hash buckets, but sends only those). Without ``discover``, or when nothing
        was opened, the sockets the last discovery found are looked up by their addresses,
        all in one datagram (a hash lookup each), and one opened since is not seen."""
        opened = (
            _tcp_mib(self._files.read)[1] if self._rediscovers(address, port, discover) else None
        )
        return self._sockets(address, port, discover, opened, clients)

    def _rediscovers(self, address: str, port: int, discover: bool) -> bool:
        """Whether a reading must read the namespace's open count to decide: a discovery
        of an endpoint discovered before (one never discovered is found anyway)."""
        return discover and (address, port) in self._known

    def _sockets(
        self,
        address: str,
        port: int,
        discover: bool,
        opened: int | None,
        clients: Clients | None = None,
    ) -> tuple[TcpState, ...]:
        endpoint = (address, port)
        if endpoint not in self._known or (
            discover and (opened is None or self._opened.get(endpoint) != opened)
        ):
            self._opened[endpoint] = opened
            if clients is not None:
                return self._find(address, port, clients(port))
            return self._discover(address, port)
        known = self._known[endpoint]
        if not known:
            return ()
        found = self._looked_up([(request, side) for _, request, side in known])
        return tuple(state for state, _ in found)

    def _looked_up(self, requests: list[tuple[bytes, bool]]) -> list[tuple[TcpState, bytes]]:
        """The sockets that lookup ``requests`` (each with its side) found, with each one's
        raw answer, in one datagram; one closed since (ENOENT) is left out."""
        if not requests:
            return []
        try:
            with self._lock:
                seqs = self._send(self._kernel.diag, [request for request, _ in requests])
                answers = self._answers(self._kernel.diag, seqs, dump=False)
        except OSError as exc:
            raise TelemetryError(f"socket diagnostics: {exc}") from None
        found: list[tuple[TcpState, bytes]] = []
        for seq, (request, server_side) in zip(seqs, requests, strict=True):
            answer = answers[seq]
            if isinstance(answer, TelemetryError):
                continue  # closed since (ENOENT)
            for data in answer:
                # A lookup by addresses that finds no connection answers with the port's
                # listening socket, whose far port is 0: only the asked-for ports count.
                ports = _REQUEST_SOCKID, _REQUEST_SOCKID + 4
                if data[_SOCKID : _SOCKID + 4] != request[ports[0] : ports[1]]:
                    continue
                state = _tcp_state(data, server_side=server_side)
                if state is not None:
                    found.append((state, data))
        return found

    def _find(
        self, address: str, port: int, clients: Sequence[tuple[str, str]]
    ) -> tuple[TcpState, ...]:
        """Both ends of each client connection ``(local, peer)`` to ``port``, looked up by
        their addresses; remembered (with their cookies) for the endpoint's next lookups."""
        requests = [
            request
            for local, peer in clients
            if peer.rpartition(":")[2] == str(port)
            for request in _exact(local, peer)
        ]
        found = self._looked_up(requests)
        self._known[(address, port)] = [
            (data[_FAMILY], _lookup(data[_FAMILY], data), state.server_side)
            for state, data in found
        ]
        return tuple(state for state, _ in found)

    def _discover(self, address: str, port: int) -> tuple[TcpState, ...]:
        # gRPC opens AF_INET6 sockets and reaches IPv4 through mapped addresses
        # (::ffff:127.0.0.1): an IPv4 endpoint is looked up in both families, in one walk
        # of the table where the kernel takes the older request, else one family at a time.
        want = {address, f"::ffff:{address}"}
        try:
            if self._any:
                try:
                    raw = self._dump(self._kernel.diag, _port_dump_any(port))
                except TelemetryError:
                    self._any = False
            if not self._any:
                families = (
                    (socket.AF_INET6,) if ":" in address else (socket.AF_INET, socket.AF_INET6)
                )
                diag = self._kernel.diag
                raw = [d for f in families for d in self._dump(diag, _port_dump(f, port))]
        except OSError as exc:
            raise TelemetryError(f"socket diagnostics: {exc}") from None
        found: list[TcpState] = []
        known: list[tuple[int, bytes, bool]] = []
        for data in raw:
            family = data[_FAMILY]
            server_side = _side(data, family, want, port)
            if server_side is None:
                continue  # the port at the other end of another address
            state = _tcp_state(data, server_side=server_side)
            if state is not None:
                found.append(state)
                known.append((family, _lookup(family, data), server_side))
        self._known[(address, port)] = known
        return tuple(found)

    def link(self, interface: str) -> LinkState:
        """``interface``'s counters, root qdisc and speed now: the counters
        (``rtnl_link_stats64``, what sysfs shows too) and every qdisc in one rtnetlink
        datagram (``RTM_GETSTATS`` of the interface, an ``RTM_GETQDISC`` dump), the counters
        from sysfs where the kernel takes no ``RTM_GETSTATS`` (older than 4.7)."""
        where = f"/sys/class/net/{interface}/"
        read = self._files.read
        try:
            static = self._static.get(interface)
            if static is None:
                index = int(read(where + "ifindex"))
                with self._lock:
                    speeds = self._kernel.speeds
                    if (interface, index) not in speeds:
                        speeds[(interface, index)] = _speed_bps(interface, _read_small)
                    static = index, speeds[(interface, index)]
                self._static[interface] = static
            index, speed = static
        except (OSError, ValueError) as exc:
            raise TelemetryError(f"interface {interface!r}: {exc}") from None
        route, seqs = self._kernel.route, [0, 0]
        try:
            with self._lock:
                seqs = self._send(route, [_stats_request(index), self._qdisc_request])
                answers = self._answers(route, seqs, dump=seqs[1:])
        except OSError:
            answers = {}
        counters = _link_counters(answers.get(seqs[0]))
        if counters is None:
            try:
                counters = {name: int(read(f"{where}statistics/{name}")) for name in _COUNTERS}
            except (OSError, ValueError) as exc:
                raise TelemetryError(f"interface {interface!r}: {exc}") from None
        kind, drops, rate = "", 0, None
        raw = answers.get(seqs[1], [])
        if isinstance(raw, TelemetryError):
            raw = []  # counters without the qdisc rather than nothing
        for data in raw:
            # The interface and parent first (struct tcmsg after the netlink header), then
            # the one root qdisc of the interface whole.
            ifindex, _, parent = struct.unpack_from("=iII", data, 20)
            if ifindex != index or parent != _ROOT:
                continue
            # Its kind and drops from their attributes (a string; struct tc_stats: bytes,
            # packets, drops), pyroute2's decoder only for a tbf's rate (its options).
            attrs = _attributes(data, _TCMSG_ATTRS)
            kind = attrs.get(_TCA_KIND, b"").split(b"\0", 1)[0].decode()
            stats = attrs.get(_TCA_STATS, b"")
            drops = struct.unpack_from("=QII", stats)[2] if len(stats) >= 16 else 0
            if kind == "tbf":
                qdisc = tcmsg(data)
                qdisc.decode()
                rate = _tbf_rate(qdisc.get_attr("TCA_OPTIONS"))
        return LinkState(
            interface=interface,
            **counters,
            qdisc=kind,
            qdisc_drops=drops,
            tbf_rate_Bps=rate,
            speed_bps=speed,
        )

    def read(
        self,
        address: str,
        port: int,
        *,
        discover: bool = True,
        clients: Clients | None = None,
        host: bool = False,
    ) -> Reading:
        """One :class:`Reading` of the endpoint ``address:port`` and this reader's fabric
        (``discover`` and ``clients``: as for :meth:`sockets`); its ``host_retransmits`` is
        read with ``host``, else only where ``/proc/net/snmp`` is read anyway (a discovery
        of an endpoint discovered before), else None (not read)."""
        at = time.monotonic_ns()
        # The host's counters where connections may be found anew (their open count says
        # whether any was opened since), not for a lookup of known ones, nor the first
        # discovery of an endpoint.
        mib = host or self._rediscovers(address, port, discover)
        retransmits, opened = _tcp_mib(self._files.read) if mib else (None, None)
        opened = opened if discover else None
        sockets = self._sockets(address, port, discover, opened, clients)
        link = self.link(self.interface) if self.interface else None
        return Reading(at, sockets, link, retransmits)

    def counters(self, *, host: bool = True) -> Reading:
        """This host's counters now, without sockets: its fabric's link and, with ``host``,
        its retransmitted segments (``/proc/net/snmp``)."""
        at = time.monotonic_ns()
        retransmits = _tcp_mib(self._files.read)[0] if host else None
        link = self.link(self.interface) if self.interface else None
        return Reading(at, (), link, retransmits)

    def run_queue_wait_ns(self, pid: int) -> int | None:
        """:func:`run_queue_wait_ns` of ``pid``, its threads' files kept open between reads
        (:class:`_Threads`)."""
        with self._lock:
            self._pids.add(pid)
            return self._kernel.threads.waited(pid)

    def close(self) -> None:
        """Close the files of the processes this reader read that have ended since (the
        netlink sockets and other files stay open for the process's next reader)."""
        with self._lock:
            pids, self._pids = self._pids, set()
            for pid in pids:
                if not _alive(pid):
                    self._kernel.threads.forget(pid)

    def __enter__(self) -> TelemetryReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _side(data: bytes, family: int, want: set[str], port: int) -> bool | None:
    """Whether a raw answer is the endpoint's server end (its local end is the endpoint),
    its client end (False), or neither (None: the port matched, the address did not)."""
    sport, dport = struct.unpack_from(">HH", data, _SOCKID)
    if sport == port and _end(family, data[24:40]) in want:
        return True
    if dport == port and _end(family, data[40:56]) in want:
        return False
    return None


def _encoded(message: Any, kind: int, *, dump: bool) -> bytes:
    """A pyroute2 request encoded once, to be sent again and again (the sequence number is
    set on each send)."""
    message["header"]["type"] = kind
    message["header"]["flags"] = NLM_F_REQUEST | (NLM_F_DUMP if dump else 0)
    message.encode()
    return bytes(message.data)


def _request_for(family: int) -> Any:
    request = inet_diag_req()
    request["sdiag_family"] = family
    request["sdiag_protocol"] = socket.IPPROTO_TCP
    request["idiag_ext"] = _INFO_EXT
    request["idiag_states"] = _STATES
    return request


@functools.cache
def _lookup_template(family: int) -> bytes:
    """``family``'s lookup request (``inet_diag_req_v2``, no socket id yet), encoded by
    pyroute2 once per process: its encoder takes about 250 us a message, a copy with the
    socket id put in place a microsecond."""
    return _encoded(_request_for(family), SOCK_DIAG_BY_FAMILY, dump=False)


@functools.cache
def _dump_template(family: int) -> bytes:
    """``family``'s dump request, encoded once per process (as :func:`_lookup_template`)."""
    return _encoded(_request_for(family), SOCK_DIAG_BY_FAMILY, dump=True)


@functools.cache
def _stats_request(index: int) -> bytes:
    """The request of interface ``index``'s ``rtnl_link_stats64`` (``RTM_GETSTATS``, struct
    ``if_stats_msg`` asking for ``IFLA_STATS_LINK_64`` only)."""
    body = struct.pack("=BBHII", socket.AF_UNSPEC, 0, 0, index, 1 << (_IFLA_STATS_LINK_64 - 1))
    return struct.pack("=IHHII", 16 + len(body), _RTM_GETSTATS, NLM_F_REQUEST, 0, 0) + body


def _link_counters(answer: Any) -> dict[str, int] | None:
    """The counters of an ``RTM_GETSTATS`` answer (its raw messages), by their sysfs names;
    None for an error or no ``IFLA_STATS_LINK_64`` in it."""
    if not isinstance(answer, list) or not answer:
        return None
    stats = _attributes(answer[0], 16 + 12).get(_IFLA_STATS_LINK_64, b"")
    if len(stats) < 64:
        return None
    # rx/tx packets, rx/tx bytes, rx/tx errors, rx/tx dropped (struct rtnl_link_stats64)
    _, _, rx_bytes, tx_bytes, rx_errors, tx_errors, rx_dropped, tx_dropped = struct.unpack_from(
        "=8Q", stats
    )
    return {
        "rx_bytes": rx_bytes,
        "tx_bytes": tx_bytes,
        "rx_dropped": rx_dropped,
        "tx_dropped": tx_dropped,
        "rx_errors": rx_errors,
        "tx_errors": tx_errors,
    }


@functools.cache
def _qdisc_request() -> bytes:
    """The dump request of every qdisc (``RTM_GETQDISC``), encoded once per process."""
    return _encoded(tcmsg(), RTM_GETQDISC, dump=True)


def _lookup(family: int, answer: bytes) -> bytes:
    """The encoded lookup request of the socket a raw ``inet_diag_msg`` answer describes: its
    socket id (ports, addresses, interface, cookie) taken back as it came."""
    request = _lookup_template(family)
    at = _REQUEST_SOCKID
    return request[:at] + answer[_SOCKID:_SOCKID_END] + request[at + _SOCKID_END - _SOCKID :]


def _port_filter(port: int) -> bytes:
    """The ``INET_DIAG_REQ_BYTECODE`` attribute of ``sport = P or dport = P`` (as ``ss``
    writes it: a source condition, a jump to accept, a destination condition), which the
    kernel runs on each socket of a dump, sending only those it accepts."""
    cond = struct.pack("=BBxxi", socket.AF_UNSPEC, 0, port)  # struct inet_diag_hostcond
    op = 4 + len(cond)
    bytecode = (
        struct.pack("=BBH", _BC_S_COND, op, op + 4)
        + cond
        + struct.pack("=BBH", _BC_JMP, 4, op + 4)
        + struct.pack("=BBH", _BC_D_COND, op, op + 4)
        + cond
    )
    return struct.pack("=HH", 4 + len(bytecode), _INET_DIAG_REQ_BYTECODE) + bytecode


def _with_length(message: bytes) -> bytes:
    return struct.pack("=I", len(message)) + message[4:]


def _port_dump(family: int, port: int) -> bytes:
    """An encoded dump request of ``family``'s TCP sockets with ``port`` at either end."""
    return _with_length(_dump_template(family) + _port_filter(port))


def _port_dump_any(port: int) -> bytes:
    """The same of both families in one walk of the connection table: the kernel's older
    ``TCPDIAG_GETSOCK`` request (``struct inet_diag_req``, which pyroute2 does not define:
    family, address lengths, extensions, socket id, states, ``dbs``), which dumps every
    family (``AF_UNSPEC``) where ``SOCK_DIAG_BY_FAMILY`` takes one."""
    header = struct.pack("=IHHII", 0, _TCPDIAG_GETSOCK, NLM_F_REQUEST | NLM_F_DUMP, 0, 0)
    body = struct.pack("=BBBB48xII", socket.AF_INET, 0, 0, _INFO_EXT, _STATES, 0)
    return _with_length(header + body + _port_filter(port))


def _tbf_rate(options: Any) -> int | None:
    if options is None:
        return None
    rate64 = options.get_attr("TCA_TBF_RATE64")
    if rate64:
        return int(rate64)
    parms = options.get_attr("TCA_TBF_PARMS")
    return int(parms["rate"]) if parms and parms.get("rate") else None


def _speed_bps(interface: str, read: Callable[[str], bytes] = _read_small) -> int | None:
    """The speed the driver reports in sysfs (Mbit/s there), None where it reports none."""
    try:
        mbps = int(read(f"/sys/class/net/{interface}/speed"))
    except (OSError, ValueError):
        return None
    return mbps * 1_000_000 if mbps > 0 else None


def readings_sockets(readings: Iterable[Reading]) -> int:
    """How many distinct connections a series of readings saw."""
    return len({state.key for reading in readings for state in reading.sockets})
