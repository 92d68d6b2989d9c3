"""Tolerances of the baseline gate: ``--tfgrpc-max-regression`` / ``--max-regression`` values.

``10%`` is every metric's tolerance, ``p99:10%`` or ``step_p99:5%`` one metric's; a metric is
any figure the registry (:mod:`pytest_tfgrpc.metrics`) says the gate tests.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from types import MappingProxyType

from pytest_tfgrpc.metrics import GATED, METRICS
from pytest_tfgrpc.suggest import did_you_mean

__all__ = [
    "ANY_METRIC",
    "DEFAULT_METRICS",
    "DEFAULT_TOLERANCE",
    "ToleranceError",
    "gated_metrics",
    "parse_tolerances",
    "tolerance_for",
]

#: The tolerance of every metric that ``--tfgrpc-max-regression`` does not name.
DEFAULT_TOLERANCE = 0.10
#: The key of :func:`parse_tolerances`' result that holds a bare ``10%``.
ANY_METRIC = "*"
#: Compared whenever a run has them; other gated metrics only when a tolerance names them.
DEFAULT_METRICS = tuple(m.name for m in GATED.values() if m.by_default)


class ToleranceError(ValueError):
    """A ``--tfgrpc-max-regression`` value that cannot be read; the message quotes the item."""


_TOLERANCE = re.compile(r"^(?:(?P<metric>[A-Za-z_][A-Za-z0-9_]*)\s*:\s*)?(?P<value>.*?)\s*$")


def parse_tolerances(spec: str | Iterable[str]) -> Mapping[str, float]:
    """Read ``--tfgrpc-max-regression`` values: ``10%``, ``p99:10%``, ``throughput:5%``.

    ``spec`` is one string (items separated by commas or spaces) or several. A bare percentage
    is the tolerance of every metric not named; the result holds it under ``"*"``. Tolerances
    are fractions (10% -> 0.1) of the baseline value. Raises :class:`ToleranceError` quoting
    the bad item: an unknown or ungated metric, a number without ``%``, a negative or non-finite
    percentage, or a metric given twice.
    """
    items = [spec] if isinstance(spec, str) else list(spec)
    out: dict[str, float] = {}
    for raw in items:
        if not isinstance(raw, str):
            raise ToleranceError(
                f"cannot read {raw!r} as a tolerance: expected text like 'p99:10%'"
            )
        # "p99: 10%" is one item: join around colons before splitting on spaces.
        text = re.sub(r"\s*:\s*", ":", raw.strip())
        for item in re.split(r"\s*,\s*|\s+", text):
            _parse_tolerance_item(item, out)
    return MappingProxyType(out)


def _parse_tolerance_item(item: str, out: dict[str, float]) -> None:
    if not item:
        raise ToleranceError("empty tolerance: expected '10%' or 'METRIC:10%', e.g. 'p99:10%'")
    match = _TOLERANCE.match(item)
    assert match is not None  # the pattern matches any string
    metric = match["metric"] or ANY_METRIC
    text = match["value"]
    if metric != ANY_METRIC and metric not in GATED:
        known = METRICS.get(metric)
        why = f"{metric} is {known.not_gated}" if known else f"unknown metric {metric!r}"
        message = f"cannot read tolerance {item!r}: {why}; gated metrics are {', '.join(GATED)}"
        if known is None:
            message += did_you_mean(metric, GATED)
        raise ToleranceError(message)
    if not text.endswith("%"):
        raise ToleranceError(
            f"cannot read tolerance {item!r}: expected a percentage such as '10%' "
            "(relative to the baseline value)"
        )
    try:
        percent = float(text[:-1])
    except ValueError:
        percent = math.nan
    if not math.isfinite(percent) or percent < 0:
        raise ToleranceError(
            f"cannot read tolerance {item!r}: the percentage must be a finite number >= 0"
        )
    if metric in out:
        which = "the default tolerance" if metric == ANY_METRIC else f"metric {metric!r}"
        raise ToleranceError(f"cannot read tolerance {item!r}: {which} is given twice")
    out[metric] = percent / 100.0


def tolerance_for(tolerances: Mapping[str, float], metric: str) -> float:
    """The tolerance of ``metric``: its own, else the bare one, else :data:`DEFAULT_TOLERANCE`."""
    return tolerances.get(metric, tolerances.get(ANY_METRIC, DEFAULT_TOLERANCE))


def gated_metrics(tolerances: Mapping[str, float]) -> tuple[str, ...]:
    """The metrics a comparison covers: :data:`DEFAULT_METRICS` and those ``tolerances`` name."""
    return tuple(m for m in GATED if m in DEFAULT_METRICS or m in tolerances)
