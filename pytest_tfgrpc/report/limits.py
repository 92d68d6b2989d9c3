"""The limit rule: what bounded a point's figures, named from what was measured beside them.

The rule (the docs' "What limited a figure" states it for users), first match wins:

1. **loss-bound**: TCP retransmitted at least :data:`LOSS_SHARE` of the data segments sent.
2. **link-bound**: where the path's nominal rate is known, throughput reached at least
   :data:`LINK_SHARE` of it (the ``efficiency`` figure) and at most :data:`LINK_OVER` of it:
   a throughput well above the nominal rate says that rate is not the path's (a virtual
   interface's reported speed: a veth reports 10 Gbit/s and carries more).
3. **cpu-bound**, naming the side: a side's demand for CPU reached :data:`CPU_SHARE` of the
   cores it could use over the measured time: its CPU time (``busy``) plus the time its
   threads waited on a run queue for a CPU (``waited``: another process had the core; read
   for the processes of this host). The cores a side could use are the CPUs it may run on
   (its affinity, where known), but at most one per measured connection: gRPC handles one
   connection's frames on one thread at a time at each end. Sides are ``client``, ``server``
   (P2P), ``ps<i>`` and ``workers`` (PS benchmarks); the busiest share is named.
4. **latency-bound**: one operation's bytes fit within the path's bandwidth-delay product
   (rate x the sender's smoothed RTT; the rate is the nominal one, else the best delivery
   rate TCP measured): round trips, not bytes, set the time.
5. otherwise **unknown**, with the figures that were looked at.

Every verdict carries the figures it used (:class:`~pytest_tfgrpc.results.Limit`).
"""

from __future__ import annotations

from collections.abc import Mapping

from pytest_tfgrpc.results import Limit, SizeResult

__all__ = ["CPU_SHARE", "LINK_OVER", "LINK_SHARE", "LOSS_SHARE", "cpu_shares", "name_limit"]

#: Retransmitted / data segments sent from which a point is loss-bound (0.1%: at that loss
#: rate TCP's throughput model gives well under a gigabit at a millisecond's RTT).
LOSS_SHARE = 1e-3
#: Throughput / nominal rate from which a point is link-bound.
LINK_SHARE = 0.8
#: Throughput / nominal rate beyond which the nominal rate is not the path's.
LINK_OVER = 1.1
#: Busy share of a side's usable cores from which a point is CPU-bound.
CPU_SHARE = 0.7


def cpu_shares(
    point: SizeResult, cores: Mapping[str, int | None], connections: int
) -> dict[str, tuple[float, float]]:
    """Per side, ``(busy, waited)``: its CPU time, and the time its threads waited on a run
    queue for a CPU (0 where not read), over the point's measured time, each as a share of the
    core-time it could use: ``min(cores[side], connections)`` cores (``cores``: a side's
    affinity, None or absent where unknown). ``waited`` sums over threads, so several threads
    waiting at once can take it past 1. Sides with CPU figures only; PS tasks as ``ps<i>``."""
    if point.elapsed_ns <= 0:
        return {}
    used = {role: cpu.total_ns for role, cpu in point.cpu.items()}
    used |= {f"ps{load.task}": load.cpu.total_ns for load in point.per_ps}
    shares: dict[str, tuple[float, float]] = {}
    for side, ns in used.items():
        usable = max(connections, 1)
        affinity = cores.get(side)
        if affinity:
            usable = min(usable, affinity)
        span = point.elapsed_ns * usable
        shares[side] = (ns / span, point.cpu_wait.get(side, 0) / span)
    return shares


def name_limit(
    point: SizeResult,
    *,
    cores: Mapping[str, int | None],
    op_bytes: int | None = None,
) -> Limit:
    """The limit of ``point`` by the module's rule. ``cores`` maps a side to the CPUs it may
    run on (None: unknown); ``op_bytes`` is the bytes one operation moves (an echo's both
    ways; None: the point's wire bytes)."""
    tcp = point.transport
    connections = tcp.connections if tcp is not None and tcp.connections else 1
    if tcp is not None and tcp.data_segs_out and tcp.loss_share >= LOSS_SHARE:
        used = [("loss_share", tcp.loss_share), ("retransmits", float(tcp.retransmits))]
        if tcp.qdisc_drops:
            used.append(("qdisc_drops", float(tcp.qdisc_drops)))
        return Limit("loss", used=tuple(used))
    efficiency = point.figure("efficiency")
    if efficiency is not None and LINK_SHARE <= efficiency.value <= LINK_OVER:
        assert tcp is not None and tcp.nominal_Bps
        return Limit(
            "link", used=(("efficiency", efficiency.value), ("link_rate_Bps", tcp.nominal_Bps))
        )
    shares = cpu_shares(point, cores, connections)
    looked: list[tuple[str, float]] = []
    if efficiency is not None:
        looked.append(("efficiency", efficiency.value))
    if tcp is not None:
        looked.append(("loss_share", tcp.loss_share))
    cpu_used: list[tuple[str, float]] = []
    for side, (busy, waited) in sorted(shares.items()):
        cpu_used.append((f"{side}_busy", busy))
        if point.cpu_wait.get(side) is not None:
            cpu_used.append((f"{side}_waited", waited))
    if shares:
        side, (busy, waited) = max(shares.items(), key=lambda item: sum(item[1]))
        if busy + waited >= CPU_SHARE:
            return Limit("cpu", side=side, used=tuple(cpu_used))
    looked.extend(cpu_used)
    rtt = point.figure("rtt_p50")
    if tcp is not None and rtt is not None:
        rate = tcp.nominal_Bps or max(tcp.delivery_rate_Bps, default=0.0)
        nbytes = point.wire_bytes if op_bytes is None else op_bytes
        bdp = rate * rtt.value / 1e9
        if rate and nbytes <= bdp:
            return Limit(
                "latency",
                used=(("op_bytes", float(nbytes)), ("bdp_bytes", bdp), ("rtt_ns", rtt.value)),
            )
        looked.append(("bdp_bytes", bdp))
    return Limit("unknown", used=tuple(looked))
