"""Transport telemetry in words: the summary's cell and the gate's context beside a verdict.

Figures come by metric name in base units (as :mod:`.properties` reads them back), so the
terminal, the gate and ``tfgrpc-compare`` say the same from the same JUnit properties.
"""

from __future__ import annotations

from collections.abc import Mapping

from pytest_tfgrpc.units import format_duration

__all__ = ["gate_context", "summary_cell"]

#: Counts shown only where non-zero: (metric, words after the number).
_COUNTS = (
    ("qdisc_drops", "qdisc drops"),
    ("link_drops", "link drops"),
    ("link_errors", "link errors"),
)


def _per_gb(figures: Mapping[str, float]) -> float | None:
    per_mb = figures.get("retransmits_per_MB")
    return None if per_mb is None else per_mb * 1e3


def _count(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 or value == int(value) else f"{value:.2g}"


def summary_cell(figures: Mapping[str, float]) -> str:
    """What the transport saw that is not nothing: ``1,204 retx/GB, 413 qdisc drops`` (empty
    when every count is zero or unread)."""
    parts = []
    per_gb = _per_gb(figures)
    if per_gb:
        parts.append(f"{_count(per_gb)} retx/GB")
    parts += [f"{_count(figures[m])} {words}" for m, words in _COUNTS if figures.get(m)]
    return ", ".join(parts)


def gate_context(baseline: Mapping[str, float], current: Mapping[str, float]) -> str:
    """The transport beside a changed figure: ``retransmissions 0 -> 1,204 per GB; RTT p50
    120us -> 210ms`` (counts where either run has some, the RTT where both have one); empty
    when neither run read telemetry."""
    parts = []
    was, now = _per_gb(baseline), _per_gb(current)
    if was is not None and now is not None:
        parts.append(f"retransmissions {_count(was)} -> {_count(now)} per GB")
    rtt_was, rtt_now = baseline.get("rtt_p50"), current.get("rtt_p50")
    if rtt_was is not None and rtt_now is not None:
        parts.append(f"RTT p50 {format_duration(rtt_was)} -> {format_duration(rtt_now)}")
    for metric, words in _COUNTS:
        a, b = baseline.get(metric), current.get(metric)
        if a is not None and b is not None and (a or b):
            parts.append(f"{words} {_count(a)} -> {_count(b)}")
    return "; ".join(parts)
