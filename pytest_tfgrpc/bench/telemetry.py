"""Transport telemetry of a measured point: read when each timed loop starts and ends.

A :class:`TransportProbe` is a :class:`~pytest_tfgrpc.bench.timing.Phase`: it reads the
kernel's state of the server's connections (:mod:`pytest_tfgrpc.wire.telemetry`) on this host
and, for a server an agent started, on the server's host through the agent, when a measured
window starts and when it ends, and sums the windows into a
:class:`~pytest_tfgrpc.results.Transport`. It never reads inside a timed loop. A probe that
cannot read (no netlink, an agent without telemetry) records nothing rather than failing the
measurement: telemetry explains figures, it is not one of them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from pytest_tfgrpc.bench.timing import Phase
from pytest_tfgrpc.report.limits import name_limit
from pytest_tfgrpc.results import SizeResult, Transport
from pytest_tfgrpc.units import format_duration
from pytest_tfgrpc.wire.client import Server
from pytest_tfgrpc.wire.telemetry import (
    Clients,
    LinkState,
    Reading,
    TcpState,
    TelemetryError,
    TelemetryReader,
    split_target,
)

__all__ = [
    "ClusterProbe",
    "RemoteRead",
    "TransportProbe",
    "Window",
    "explained",
    "merge_windows",
    "probe_for",
    "server_cores",
    "summarize_windows",
]

#: Reads the server's side on its host: (address, port, discover, the server's process id
#: there whose run-queue wait to read, or 0, the clients' ``(local, peer)`` ends by which
#: to find the connections there, none: a dump) -> a Reading there.
RemoteRead = Callable[[str, int, bool, int, Sequence[tuple[str, str]]], Reading]


@dataclass
class Window:
    """The readings that open and close one measured window, per side (``local``, a host)."""

    start: dict[str, Reading] = field(default_factory=dict)
    end: dict[str, Reading] = field(default_factory=dict)


#: One socket's change over a window: (its state at the end, retransmits, D-SACKed ones, data
#: segments, bytes sent, bytes acked, bytes received).
_Delta = tuple[TcpState, int, int, int, int, int, int]


def _delta_sockets(start: Reading, end: Reading) -> list[_Delta]:
    """Per socket open at the window's end: (its state, retransmits, spurious retransmits
    (D-SACKed), data segments, bytes sent, bytes acked, bytes received) over the window; a
    socket opened meanwhile counts from zero."""
    before = {state.key: state for state in start.sockets}
    out = []
    for now in end.sockets:
        was = before.get(now.key)

        def grown(name: str, now: TcpState = now, was: TcpState | None = was) -> int:
            return int(getattr(now, name)) - (int(getattr(was, name)) if was else 0)

        out.append(
            (
                now,
                grown("retransmits"),
                grown("dsack_dups"),
                grown("data_segs_out"),
                grown("bytes_sent"),
                grown("bytes_acked"),
                grown("bytes_received"),
            )
        )
    return out


def _link_delta(start: LinkState, end: LinkState) -> tuple[int, int, int, int]:
    return (
        end.rx_bytes + end.tx_bytes - start.rx_bytes - start.tx_bytes,
        end.drops - start.drops,
        end.errors - start.errors,
        end.qdisc_drops - start.qdisc_drops,
    )


def _measured(window: Window) -> list[tuple[str, _Delta]]:
    """The sockets that carried the window's traffic, with their changes: another channel to
    the same server (the CPU probe's two Status calls) carries a few hundred bytes, the
    measured connections at least a tenth of the busiest one's."""
    deltas = [
        (side, delta)
        for side, start in window.start.items()
        if side in window.end
        for delta in _delta_sockets(start, window.end[side])
    ]
    busiest = max((d[4] + d[6] for _, d in deltas), default=0)
    return [(side, d) for side, d in deltas if (d[4] + d[6]) * 10 >= busiest > 0]


def _carriers(window: Window) -> set[tuple[str, str]]:
    return {delta[0].key for _, delta in _measured(window)}


def summarize_windows(
    windows: Sequence[Window], named_rate_Bps: float | None = None
) -> Transport | None:
    """The windows' telemetry as one :class:`Transport` (None when no window was read).

    Counts are summed over windows and sides; the sender's RTT, RTT variance, cwnd and
    delivery rate are taken at each window's end from the socket that sent the most in it.
    The nominal rate is the lowest of the links' ``tbf`` rates and ``named_rate_Bps``, or
    where no rate was named, of their reported speeds too: a named rate replaces the speeds
    (a virtual interface's 10 Gbit/s is no path's rate), a ``tbf`` cap is real."""
    complete = _complete(windows)
    if not complete:
        return None
    retransmits = spurious = segs = sent = acked = 0
    link_bytes = drops = errors = qdrops = 0
    links_read = False
    rtt: list[float] = []
    rttvar: list[float] = []
    cwnd: list[float] = []
    rate: list[float] = []
    nominal: list[tuple[float, str]] = []
    if named_rate_Bps:
        nominal.append((named_rate_Bps, "named"))
    connections = 0
    for window in complete:
        measured = _measured(window)
        best: tuple[int, TcpState] | None = None
        clients: set[tuple[str, str]] = set()
        servers: set[tuple[str, str]] = set()
        for _, (state, re, dup, seg, out, ack, _) in measured:
            (servers if state.server_side else clients).add(state.key)
            # A retransmission the receiver reported as a duplicate repaired no loss.
            spurious += min(dup, re)
            retransmits, segs = retransmits + re - min(dup, re), segs + seg
            sent, acked = sent + out, acked + ack
            if best is None or out > best[0]:
                best = (out, state)
        connections = max(connections, len(clients) or len(servers))
        if best is not None and best[0] > 0:
            state = best[1]
            rtt.append(state.rtt_us * 1e3)
            rttvar.append(state.rttvar_us * 1e3)
            cwnd.append(float(state.cwnd))
            rate.append(float(state.delivery_rate_Bps))
        for side, start in window.start.items():
            end = window.end[side]
            if start.link is not None and end.link is not None:
                links_read = True
                b, d, e, q = _link_delta(start.link, end.link)
                link_bytes, drops, errors = link_bytes + b, drops + d, errors + e
                qdrops += q
                where = f"{end.link.interface}@{side}"
                if end.link.tbf_rate_Bps:
                    nominal.append((float(end.link.tbf_rate_Bps), f"tbf of {where}"))
                elif end.link.nominal_Bps and not named_rate_Bps:
                    nominal.append((end.link.nominal_Bps, f"speed of {where}"))
    lowest = min(nominal) if nominal else None
    sides = sorted({side for window in complete for side in window.start})
    return Transport(
        connections=connections,
        retransmits=retransmits,
        spurious_retransmits=spurious,
        data_segs_out=segs,
        bytes_sent=sent,
        bytes_acked=acked,
        rtt_ns=tuple(rtt),
        rttvar_ns=tuple(rttvar),
        cwnd=tuple(cwnd),
        delivery_rate_Bps=tuple(rate),
        link_bytes=link_bytes if links_read else None,
        link_drops=drops if links_read else None,
        link_errors=errors if links_read else None,
        qdisc_drops=qdrops if links_read else None,
        nominal_Bps=lowest[0] if lowest else None,
        nominal_source=lowest[1] if lowest else "",
        sides=tuple(sides),
    )


def _complete(windows: Sequence[Window]) -> list[Window]:
    return [w for w in windows if w.start and set(w.start) == set(w.end)]


class TransportProbe:
    """Reads the telemetry of ``target``'s connections over measured windows.

    A window (:meth:`start`, :meth:`stop`) reads the measured connections and the fabric's
    link counters when it opens and when it closes. A size measured in several rounds opens
    one window for all of them, when its first round's timed loop starts, and closes it when
    its last round's ends (:meth:`round`): two readings per size. Its connections carry no
    other size's traffic (the rounds between add only their brief warm-ups); the link
    counters count what the interface carried meanwhile, the other sizes' rounds too. The
    sides' run-queue waits are read around every round's timed loop, as the CPU figures are:
    the processes run the other sizes' rounds too.

    ``interface`` is this host's fabric (its link counters are read too); ``remote`` reads the
    server's host (None: the server is on this host, or nothing can read its host), with the
    run-queue wait of ``remote_pid`` there (the server's process; 0: none) as the
    ``server`` side's. ``clients`` finds the measured connections' client ends on this host
    (:func:`~pytest_tfgrpc.wire.telemetry.own_connections` where this process is the client;
    :meth:`watch` sets those a client process reports): this host's ends of them are then
    looked up by their addresses, never found by a walk of the kernel's connection table
    (None: found that way); those it finds when the probe is made are not the probe's (another
    size's channel, opened before). Wrap a CPU probe with :meth:`around` or :meth:`round`: the
    telemetry is read outside the CPU probe's window, so that reading it never counts in the
    CPU figures (the CPU probe's own small calls are told apart from the measured connections
    by the bytes they carry).
    """

    def __init__(
        self,
        target: str,
        interface: str | None,
        *,
        remote: RemoteRead | None = None,
        remote_name: str = "server",
        remote_pid: int = 0,
        named_rate_Bps: float | None = None,
        pids: Mapping[str, int] | None = None,
        clients: Clients | None = None,
    ) -> None:
        #: The measured connections' windows, with every side's reading at each end.
        self.windows: list[Window] = []
        self._in_round = False
        self._clients = clients
        #: The clients' ends a client process told (:meth:`told`).
        self._told: Sequence[tuple[str, str]] = ()
        #: Per side (``client``, a local ``server``), the run-queue wait over the rounds (ns).
        self.cpu_wait: dict[str, int] = {}
        self._pids: dict[str, tuple[int, ...]] = {
            side: (pid,) for side, pid in (pids or {}).items()
        }
        #: The connections that carried the last window's traffic (looked up, not dumped).
        self._carried: set[tuple[str, str]] = set()
        self._wait_start: dict[str, int] = {}
        #: Per side, the run-queue wait its own process reported for the next reading
        #: (:meth:`reported`); None: it could not read it.
        self._reported: dict[str, int | None] = {}
        #: What reading telemetry took in other processes of this host, as they reported it
        #: (ns): the native client's own reads at its pauses.
        self.reported_read_ns = 0
        self.errors: list[str] = []
        self._named = named_rate_Bps
        self._remote = remote
        self._remote_name = remote_name
        self._remote_pid = remote_pid
        self._reader: TelemetryReader | None = None
        self._first: Reading | None = None
        #: The latest reading of this host that found the connections: what a failure quotes
        #: once they are gone (a native client that exited).
        self._last: Reading | None = None
        self._started_ns = 0
        self._address, self._port = "", 0
        try:
            self._address, self._port = split_target(target)
            self._reader = TelemetryReader(interface)
            if clients is not None:
                before = frozenset(clients(self._port))
                self._clients = lambda port: [e for e in clients(port) if e not in before]
            # What the host looked like before anything was sent (its counters: the measured
            # connections are not open yet): a call that fails, in its warm-up too, is told
            # what the transport saw since.
            self._started_ns = time.monotonic_ns()
            self._first = self._reader.counters()
        except (TelemetryError, OSError) as exc:
            self.errors.append(str(exc))

    def _read(
        self, discover: bool = True, was: Mapping[str, Reading] | None = None
    ) -> dict[str, Reading]:
        """Both sides now. At a window's end (not ``discover``) the connections found at its
        start (``was``) are looked up; where every one of them has closed since, those that
        replaced them are found and count from their opening. At its start they are found (by
        the clients' ends, else a dump of every socket), or, where the last window's carriers
        are still open, looked up."""
        out: dict[str, Reading] = {}
        if self._reader is None or not self._port:
            return out
        was = was or {}
        try:
            reader, clients = self._reader, self._clients

            def read_local(address: str, port: int, *, discover: bool) -> Reading:
                return reader.read(address, port, discover=discover, clients=clients)

            out["local"] = self._side(read_local, discover, was.get("local"))
            if self._remote is not None:
                remote, pid = self._remote, self._remote_pid
                # The connections' client ends, as this host found them: the server's host
                # finds its ends of them by address too.
                found = out["local"].sockets
                ends = [(s.local, s.remote) for s in found if not s.server_side] or self._told

                def read_remote(address: str, port: int, *, discover: bool) -> Reading:
                    return remote(address, port, discover, pid, ends)

                far = self._remote_name
                out[far] = self._side(read_remote, discover, was.get(far))
        except (TelemetryError, OSError) as exc:
            self.errors.append(str(exc))
            return {}
        if out["local"].sockets:
            self._last = out["local"]
        return out

    def _side(self, read: Callable[..., Reading], discover: bool, was: Reading | None) -> Reading:
        if discover and not self._carried:
            return read(self._address, self._port, discover=True)
        reading = read(self._address, self._port, discover=False)
        seen = {state.key for state in reading.sockets}
        if discover and not self._carried & seen:
            return read(self._address, self._port, discover=True)
        started = {state.key for state in was.sockets} if was is not None else set()
        if not discover and started and not seen & started:
            return read(self._address, self._port, discover=True)
        return reading

    def _marks(self) -> dict[str, Reading]:
        """For a round that neither opens nor closes the window: the reading of a remote
        server whose run-queue wait is read on its host (it carries the wait), else none."""
        if self._remote is None or not self._remote_pid or not self._port:
            return {}
        try:
            far = self._remote(self._address, self._port, False, self._remote_pid, ())
        except (TelemetryError, OSError) as exc:
            self.errors.append(str(exc))
            return {}
        return {self._remote_name: far}

    def _waits(self, readings: Mapping[str, Reading]) -> dict[str, int]:
        """Each side's run-queue wait so far: as its own process reported it
        (:meth:`reported`), else this host's processes read here, summed per side; a remote
        server's from its host's reading (``readings``)."""
        waits = {side: ns for side, ns in self._reported.items() if ns is not None}
        self._reported.clear()
        if self._reader is not None:
            for side, pids in self._pids.items():
                each = [self._reader.run_queue_wait_ns(pid) for pid in pids]
                if pids and all(ns is not None for ns in each):
                    waits[side] = sum(ns for ns in each if ns is not None)
        far = readings.get(self._remote_name) if self._remote_pid else None
        if far is not None and far.cpu_wait_ns is not None:
            waits["server"] = far.cpu_wait_ns
        return waits

    def watch(
        self,
        side: str,
        pid: int | Sequence[int],
        connections: Sequence[tuple[str, str]] | None = None,
    ) -> None:
        """Read ``side``'s run-queue wait from process ``pid`` (of this host; several: their
        sum) from the next round on: a side whose processes start after the probe (the
        native client's, the Python engine's stream workers); with ``connections``, the
        ``(local, peer)`` ends of the client's connections it reported, which the next
        readings look up (as ``clients`` does)."""
        self._pids[side] = (pid,) if isinstance(pid, int) else tuple(pid)
        if connections is not None:
            self.told(connections)

    def reported(self, side: str, waited_ns: int | None, *, read_ns: int = 0) -> None:
        """``side``'s run-queue wait so far (ns), as its own process read it (the native
        client, at its pauses: cheaper than listing and opening its threads' files from
        here): used at the next round's start or end in place of reading ``side``'s
        processes, which are no longer read (None: it could not read it, and the round
        counts none). ``read_ns``: what that process's telemetry took it, counted in
        :attr:`reported_read_ns`."""
        self._pids.pop(side, None)
        self._reported[side] = waited_ns
        self.reported_read_ns += read_ns

    def told(self, connections: Sequence[tuple[str, str]]) -> None:
        """Look the clients' connections up by these ``(local, peer)`` ends from the next
        window on, on this host and (where its reading finds none of them) the server's."""
        ends = tuple(connections)
        self._clients = lambda port: ends
        self._told = ends

    def begin_round(self, *, window: bool) -> None:
        """A timed loop starts: read the sides' run-queue waits, and with ``window``, open a
        window of the measured connections and link counters."""
        if window:
            readings = self._read()
            self.windows.append(Window(start=readings))
        else:
            readings = self._marks()
        self._in_round = True
        self._wait_start = self._waits(readings)

    def end_round(self, *, window: bool) -> None:
        """A timed loop ended: read the sides' run-queue waits, and with ``window``, close
        the open window."""
        if not self._in_round:
            return
        if window and self.windows and not self.windows[-1].end:
            opened = self.windows[-1]
            readings = self._read(discover=False, was=opened.start)
            opened.end = readings
            self._carried = _carriers(opened)
        else:
            readings = self._marks()
        self._in_round = False
        for side, ns in self._waits(readings).items():
            if side in self._wait_start:
                waited = max(ns - self._wait_start[side], 0)
                self.cpu_wait[side] = self.cpu_wait.get(side, 0) + waited

    def cut_short(self) -> None:
        """A failure ended the rounds before this size's last one: close its open window
        with a reading now, so that the rounds it measured before keep their telemetry
        (its connections' counters to the failure, which a round the failure cut short
        adds to as the warm-ups between rounds do; the run-queue wait of that round is not
        counted, as its samples are not). Where none of the connections the window opened
        on is there now (the failure broke them), the window stays open and records
        nothing rather than a connection's zeros: the failure quotes what it last saw
        (:meth:`last_seen`)."""
        self._in_round = False
        if not self.windows or self.windows[-1].end:
            return
        opened = self.windows[-1]
        readings = self._read(discover=False, was=opened.start)
        start = opened.start.get("local")
        if start is None or "local" not in readings:
            return
        before = {state.key for state in start.sockets}
        if before & {state.key for state in readings["local"].sockets}:
            opened.end = readings

    def start(self) -> None:
        """Open a window of one timed loop."""
        self.begin_round(window=True)

    def stop(self) -> None:
        """Close the window :meth:`start` opened."""
        self.end_round(window=True)

    def around(self, inner: Phase) -> Phase:
        """A phase that starts this probe then ``inner``, and stops them in reverse."""
        return _Nested(self, inner, first=True, last=True)

    def round(self, inner: Phase, *, first: bool, last: bool) -> Phase:
        """As :meth:`around`, for one round of a size measured in several: the window opens
        at the ``first`` round's start and closes at the ``last`` one's end; every round
        reads the run-queue waits."""
        return _Nested(self, inner, first=first, last=last)

    def transport(self) -> Transport | None:
        """The telemetry of every complete window so far."""
        return summarize_windows(self.windows, self._named)

    def last_seen(self) -> str:
        """What the transport showed since the probe was made, read now (after a
        failure): ``after 22 s; 528 retransmissions, RTT 210 ms, qdisc drops 413``; where the
        connection is gone, what it showed when last read and what the host retransmitted
        since (``no connection was seen`` where no reading ever found one: refused, or never
        made); empty when nothing was read."""
        if self._first is None or self._reader is None:
            return ""
        try:
            now = self._reader.read(self._address, self._port, clients=self._clients, host=True)
        except (TelemetryError, OSError):
            return ""
        at_ns = time.monotonic_ns()
        parts = [f"after {format_duration(at_ns - self._started_ns)}"]
        closed = Window(start={"local": self._first}, end={"local": now})
        seen = summarize_windows([closed])
        if seen is not None and seen.connections:
            parts.append(f"{seen.retransmits:,} retransmissions")
            if seen.rtt_ns:
                parts.append(f"RTT {format_duration(seen.rtt_ns[-1])}")
        elif self._first.host_retransmits is not None and now.host_retransmits is not None:
            grown = now.host_retransmits - self._first.host_retransmits
            # Gone, where a reading found it; never seen (a connection refused or never made).
            gone = "the connection is gone" if self._last is not None else "no connection was seen"
            parts.append(f"{gone}; this host retransmitted {grown:,} segments")
            last = self._last_connection()
            if last is not None:
                parts.append(last)
        if seen is not None and seen.qdisc_drops:
            parts.append(f"{seen.qdisc_drops:,} qdisc drops")
        return parts[0] + "; " + ", ".join(parts[1:]) if len(parts) > 1 else ""

    def _last_connection(self) -> str | None:
        """``when last read, 3.2 s before: 12 retransmissions, RTT 1.2 ms``: the connections
        from the probe's start to the last reading that found them; None without one."""
        if self._first is None or self._last is None or self._last is self._first:
            return None
        seen = summarize_windows([Window(start={"local": self._first}, end={"local": self._last})])
        if seen is None or not seen.connections:
            return None
        ago = format_duration(time.monotonic_ns() - self._last.at_ns)
        words = f"when last read, {ago} before: {seen.retransmits:,} retransmissions"
        return words + (f", RTT {format_duration(seen.rtt_ns[-1])}" if seen.rtt_ns else "")

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def __enter__(self) -> TransportProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Nested:
    def __init__(self, outer: TransportProbe, inner: Phase, *, first: bool, last: bool) -> None:
        self._outer, self._inner = outer, inner
        self._first, self._last = first, last

    def start(self) -> None:
        self._outer.begin_round(window=self._first)
        self._inner.start()

    def stop(self) -> None:
        self._inner.stop()
        self._outer.end_round(window=self._last)


def merge_windows(windows: Sequence[Window]) -> Window:
    """One window of several probes' windows, read at nearly the same moments (a cluster's PS
    tasks'): per side, every probe's sockets (each once) and the first probe's link and host
    counters (one host's, read again by the others)."""
    merged = Window()
    for window in windows:
        for into, readings in ((merged.start, window.start), (merged.end, window.end)):
            for side, reading in readings.items():
                had = into.get(side)
                if had is None:
                    into[side] = reading
                    continue
                keys = {state.key for state in had.sockets}
                more = tuple(state for state in reading.sockets if state.key not in keys)
                into[side] = replace(had, sockets=had.sockets + more)
    return merged


class ClusterProbe:
    """A probe of each PS task's connections (:func:`probe_for`), all started and stopped
    together: a :class:`~pytest_tfgrpc.ps.ps_cluster.PSCluster` job's window. One per job."""

    def __init__(self, tasks: Sequence[Server]) -> None:
        self._tasks = tuple(tasks)
        self.probes = [probe_for(task) for task in self._tasks]

    def start(self, connections: Sequence[tuple[str, str]] = ()) -> None:
        """Open every task's window; with the workers' ``(local, peer)`` ends of their
        connections, each task's are looked up by them (its port's), never found by a walk
        of a connection table."""
        for probe in self.probes:
            if connections:
                probe.told(connections)
            probe.start()

    def stop(self) -> None:
        for probe in reversed(self.probes):
            probe.stop()

    def per_task(self) -> list[Transport | None]:
        """Each PS task's telemetry over the job."""
        return [probe.transport() for probe in self.probes]

    def transport(self) -> Transport | None:
        """Every PS task's connections together, over the job."""
        closed = [probe.windows[-1] for probe in self.probes if probe.windows]
        if not closed:
            return None
        named = min((t.fabric.link_rate_Bps or 0.0 for t in self._tasks), default=0.0)
        return summarize_windows([merge_windows(closed)], named or None)

    def last_seen(self) -> str:
        """What each PS task's connections showed since the probe was made, read now (after
        a failure): ``ps0: after 3.1 s; 528 retransmissions, RTT 210 ms; ps1: ...``, the
        tasks with a reading only (:meth:`TransportProbe.last_seen`); empty for none."""
        seen = ((i, probe.last_seen()) for i, probe in enumerate(self.probes))
        return "; ".join(f"ps{i}: {words}" for i, words in seen if words)

    def cores(self) -> dict[str, int | None]:
        """The CPUs each PS task may run on (``ps<i>``; None for one on another host)."""
        return {
            f"ps{i}": affinity(getattr(task, "pid", None)) if _is_local(task) else None
            for i, task in enumerate(self._tasks)
        }

    def close(self) -> None:
        for probe in self.probes:
            probe.close()

    def __enter__(self) -> ClusterProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def affinity(pid: int | None) -> int | None:
    """How many CPUs ``pid`` may run on (this process for 0), None where it cannot be read."""
    if pid is None:
        return None
    try:
        return len(os.sched_getaffinity(pid))
    except OSError:
        return None


def explained(
    point: SizeResult,
    transport: Transport | None,
    *,
    cores: Mapping[str, int | None],
    op_bytes: int | None = None,
    cpu_wait: Mapping[str, int] | None = None,
) -> SizeResult:
    """``point`` with its transport telemetry, its sides' run-queue waits (ns) and the limit
    the rule names (:func:`pytest_tfgrpc.report.limits.name_limit`) from them and the point's
    CPU figures."""
    with_tcp = replace(point, transport=transport, cpu_wait=MappingProxyType(dict(cpu_wait or {})))
    return replace(with_tcp, limit=name_limit(with_tcp, cores=cores, op_bytes=op_bytes))


def probe_for(server: Server, clients: Clients | None = None) -> TransportProbe:
    """A probe of ``server``'s connections: on this host's fabric, and on the server's host
    where its node agent can read them; with the rate the user named for its fabric
    (:attr:`~pytest_tfgrpc.wire.fabric.Fabric.link_rate_Bps`); ``clients`` as
    :class:`TransportProbe` takes it."""
    launcher = getattr(server, "launcher", None)
    remote: RemoteRead | None = getattr(launcher, "read_telemetry", None)
    pids = {"client": os.getpid()}
    pid = getattr(server, "pid", None)
    local = _is_local(server)
    if local and pid:
        pids["server"] = pid
    return TransportProbe(
        server.target,
        server.fabric.name,
        remote=remote,
        remote_name=str(getattr(launcher, "host", "server")),
        remote_pid=int(pid or 0) if remote is not None and not local else 0,
        named_rate_Bps=server.fabric.link_rate_Bps,
        pids=pids,
        clients=clients,
    )


def _is_local(server: Server) -> bool:
    launcher = getattr(server, "launcher", None)
    return launcher is None or getattr(launcher, "host", "local") == "local"


def server_cores(server: Server) -> Mapping[str, int | None]:
    """The CPUs each P2P side may run on: this process's; a local server's (None for one
    elsewhere: its agent's host decides)."""
    launcher = getattr(server, "launcher", None)
    local = launcher is None or getattr(launcher, "host", "local") == "local"
    return {
        "client": affinity(0),
        "server": affinity(getattr(server, "pid", None)) if local else None,
    }
