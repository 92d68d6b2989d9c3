"""Transport telemetry on the agent protocol: :mod:`pytest_tfgrpc.wire.telemetry`'s readings
as ``TelemetryReply`` messages (``protos/tfgrpc/agent.proto``) and back."""

from __future__ import annotations

from typing import Any

from pytest_tfgrpc.wire._proto import agent_pb2
from pytest_tfgrpc.wire.telemetry import LinkState, Reading, TcpState

__all__ = ["link_message", "reading_from_message", "reading_message"]

_SOCKET_FIELDS = tuple(TcpState.__dataclass_fields__)


def link_message(link: LinkState) -> Any:
    """A link's state as ``InterfaceCounters`` (0 for an unknown rate or speed)."""
    return agent_pb2.InterfaceCounters(
        fabric=link.interface,
        rx_bytes=link.rx_bytes,
        tx_bytes=link.tx_bytes,
        rx_dropped=link.rx_dropped,
        tx_dropped=link.tx_dropped,
        rx_errors=link.rx_errors,
        tx_errors=link.tx_errors,
        qdisc=link.qdisc,
        qdisc_drops=link.qdisc_drops,
        tbf_rate_Bps=link.tbf_rate_Bps or 0,
        speed_bps=link.speed_bps or 0,
    )


def reading_message(reading: Reading) -> Any:
    """A reading as a ``TelemetryReply``."""
    reply = agent_pb2.TelemetryReply(
        at_ns=reading.at_ns,
        sockets=[
            agent_pb2.TcpSocket(**{name: getattr(s, name) for name in _SOCKET_FIELDS})
            for s in reading.sockets
        ],
        host_retransmits=-1 if reading.host_retransmits is None else reading.host_retransmits,
        cpu_wait_ns=-1 if reading.cpu_wait_ns is None else reading.cpu_wait_ns,
    )
    if reading.link is not None:
        reply.link.CopyFrom(link_message(reading.link))
    return reply


def reading_from_message(reply: Any) -> Reading:
    """A ``TelemetryReply`` back as a :class:`Reading` (the agent's clock in ``at_ns``)."""
    link = None
    if reply.HasField("link"):
        m = reply.link
        link = LinkState(
            interface=m.fabric,
            rx_bytes=m.rx_bytes,
            tx_bytes=m.tx_bytes,
            rx_dropped=m.rx_dropped,
            tx_dropped=m.tx_dropped,
            rx_errors=m.rx_errors,
            tx_errors=m.tx_errors,
            qdisc=m.qdisc,
            qdisc_drops=m.qdisc_drops,
            tbf_rate_Bps=m.tbf_rate_Bps or None,
            speed_bps=m.speed_bps or None,
        )
    sockets = tuple(
        TcpState(**{name: getattr(s, name) for name in _SOCKET_FIELDS}) for s in reply.sockets
    )
    retrans = reply.host_retransmits if reply.host_retransmits >= 0 else None
    wait = reply.cpu_wait_ns if reply.cpu_wait_ns >= 0 else None
    return Reading(reply.at_ns, sockets, link, retrans, wait)
