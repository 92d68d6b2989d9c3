"""The property codec: figures <-> JUnit ``(name, value)`` properties, in one place.

Names (the README's contract):

- ``tfgrpc.fabric``, ``tfgrpc.target``: where a test measured (the first result's server);
- ``tfgrpc.path``, ``tfgrpc.placement``: whether a test's traffic crossed the fabric or stayed
  on one host (loopback), and on which host each server, PS task and worker ran;
- ``tfgrpc.<label>.<field>`` for ``target`` (the result's server: a floor's is its floor
  server), ``rpc``, ``mode``, ``settings``, ``topology``, ``ends`` (where the figures came
  from: ``client=HOST@ADDRESS server=HOST@ADDRESS``, or every PS task and worker);
- ``tfgrpc.<label>.<key>.<metric>_<unit>``: a figure of one point (message size, payload or
  profile), e.g. ``tfgrpc.p2p_latency.1KiB.p99_us``; the metric and its unit come from
  :mod:`pytest_tfgrpc.report.metrics`;
- ``tfgrpc.<label>.<key>.<scope>.<metric>_<unit>`` with scope ``ps<i>`` or ``workers``: a figure
  of one PS task or of all workers;
- ``tfgrpc.<label>.<key>.sketch``, ``.bytes``, ``.buffers``: a point's sketch and payload;
- ``tfgrpc.meta.*``: run metadata; ``tfgrpc.<label>[.<key>].model.*``: the analytic model's
  prediction; ``....<metric>.verdict`` / ``.verdict_reason`` / ``.change``: baseline verdicts.

A label ending in ``_floor`` is a raw-TCP transport floor (:func:`ParsedFigure.floor`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pytest_tfgrpc.report.metrics import METRICS, RATIO, Metric, is_floor, significant
from pytest_tfgrpc.results import BenchmarkResult
from pytest_tfgrpc.stats.sketch import Sketch

__all__ = [
    "FABRIC",
    "LABEL_FIELDS",
    "LOOPBACK",
    "META_PREFIX",
    "PATH",
    "PLACEMENT",
    "PREFIX",
    "TARGET",
    "ParsedFigure",
    "figure_name",
    "figure_value",
    "format_rounds",
    "fraction_value",
    "label_property",
    "model_properties",
    "parse_figure",
    "parse_rounds",
    "point_property",
    "read_figures",
    "result_properties",
]

PREFIX = "tfgrpc."
META_PREFIX = "tfgrpc.meta."
FABRIC = f"{PREFIX}fabric"
TARGET = f"{PREFIX}target"
#: How a test's traffic went (``loopback ...`` or ``<fabric>: <from> -> <to>``).
PATH = f"{PREFIX}path"
#: How a ``tfgrpc.path`` value starts when the traffic stayed in one host, whatever the fabric.
LOOPBACK = "loopback"
#: Where each role of a test ran (``server=HOST@ADDRESS``, ``ps0=...``, ``worker0=...``).
PLACEMENT = f"{PREFIX}placement"
#: Properties of a whole result label (``tfgrpc.<label>.<field>``), strings, not figures.
LABEL_FIELDS = ("target", "rpc", "mode", "settings", "topology", "ends")
SKETCH = "sketch"
#: ``tfgrpc.<label>.<key>.rounds``: the point's figures per round (:func:`format_rounds`).
ROUNDS = "rounds"
#: The point key of a model prediction (``tfgrpc.<label>.model.*``): no measurement.
MODEL = "model"

_SCOPE = re.compile(r"^(?:ps\d+|workers)$")
_BY_SUFFIX: Mapping[bool, Mapping[str, Metric]] = {
    scoped: {m.property_suffix: m for m in METRICS.values() if m.scoped == scoped}
    for scoped in (False, True)
}


def label_property(label: str, field: str) -> str:
    """``tfgrpc.<label>.<field>``."""
    return f"{PREFIX}{label}.{field}"


def point_property(label: str, key: str, field: str) -> str:
    """``tfgrpc.<label>.<key>.<field>`` (``sketch``, ``bytes``, ``buffers``)."""
    return f"{PREFIX}{label}.{key}.{field}"


def figure_name(label: str, key: str, metric: str, scope: str = "") -> str:
    """The property name of one figure; KeyError for a metric the registry does not know."""
    suffix = METRICS[metric].property_suffix
    return f"{PREFIX}{label}.{key}.{scope + '.' if scope else ''}{suffix}"


def figure_value(metric: str, value: float) -> str:
    """A figure's value (base unit) as its property holds it."""
    return METRICS[metric].unit.property_value(value)


def fraction_value(value: float) -> str:
    """A relative figure (a verdict's ``.change`` or ``.detectable``: ``0.25`` is +25%) as a
    property holds it, like a ratio figure: significant digits, no float noise
    (``0.3``, not ``0.30000000000000004``)."""
    return RATIO.property_value(value)


@dataclass(frozen=True)
class ParsedFigure:
    """A figure property read back: which result label, point key, scope and metric."""

    label: str
    key: str
    metric: Metric
    scope: str = ""

    @property
    def floor(self) -> bool:
        """Whether the figure is a raw-TCP transport floor's, not a gRPC measurement's."""
        return is_floor(self.label)


def parse_figure(name: str) -> ParsedFigure | None:
    """What a property name says, when it names a registered figure; None for anything else
    (metadata, sketches, verdicts, model predictions, label fields)."""
    if not name.startswith(PREFIX) or name.startswith(META_PREFIX):
        return None
    parts = name[len(PREFIX) :].split(".")
    if len(parts) == 3:
        label, key, last = parts
        scope = ""
    elif len(parts) == 4 and _SCOPE.match(parts[2]):
        label, key, scope, last = parts
    else:
        return None
    if key == MODEL:
        return None
    found = _BY_SUFFIX[bool(scope)].get(last)
    return ParsedFigure(label, key, found, scope) if found is not None else None


@dataclass(frozen=True)
class ReadFigure:
    """One figure read from properties: its name's parts, its value (base unit) and the text."""

    at: ParsedFigure
    value: float
    text: str


def read_figures(
    properties: Iterable[tuple[str, object]], *, strict: bool = True
) -> list[ReadFigure]:
    """Every figure among ``(name, value)`` properties, in base units. A figure whose value is
    not a number raises ValueError naming the property, or is skipped when not ``strict``."""
    out = []
    for name, raw in properties:
        at = parse_figure(str(name))
        if at is None:
            continue
        text = str(raw)
        try:
            value = at.metric.unit.read_value(text)
        except ValueError:
            if not strict:
                continue
            raise ValueError(f"property {name}: {text!r} is not a number") from None
        out.append(ReadFigure(at, value, text))
    return out


def label_fields(properties: Mapping[str, str], label: str) -> dict[str, str]:
    """The label-level fields (rpc, mode, settings, topology, ends) recorded for ``label``."""
    return {
        field: properties[label_property(label, field)]
        for field in LABEL_FIELDS
        if label_property(label, field) in properties
    }


def model_properties(
    label: str, key: str, figures: Iterable[tuple[str, str]]
) -> list[tuple[str, str]]:
    """A model prediction's ``(name, value)`` pairs
    (:func:`~pytest_tfgrpc.model.analytic.prediction_figures`) beside the measured point
    ``key`` of result ``label``: ``tfgrpc.<label>.<key>.model.<name>``. No reader takes them
    for measured figures (:func:`parse_figure`)."""
    return [
        (point_property(label, key, f"{MODEL}.{name}"), _without_float_noise(value))
        for name, value in figures
    ]


def _without_float_noise(text: str) -> str:
    """A number written by ``repr`` (``1234.5600000000001``) to the digits a model's figure
    supports; text that is no such number (a limit's name, a whole count) as it is."""
    if not any(c in text for c in ".eE"):
        return text
    try:
        value = float(text)
    except ValueError:
        return text
    return significant(value) if math.isfinite(value) else text


def result_properties(result: BenchmarkResult) -> list[tuple[str, str]]:
    """The properties of one result, whichever benchmark made it: where and how it was
    measured (target, rpc, mode, topology when it has one, both ends when known, settings),
    then per point its
    payload, every figure (with the scoped per-PS and workers' figures), and a sketch of every
    sample; then the result's :meth:`~pytest_tfgrpc.results.BenchmarkResult.extra_properties`
    (a model prediction)."""
    label = result.label
    settings = ";".join(f"{k}={v}" for k, v in sorted(result.settings.items()))
    out = [
        (label_property(label, "target"), result.target),
        (label_property(label, "rpc"), result.rpc),
        (label_property(label, "mode"), result.mode),
    ]
    if result.topology:
        out.append((label_property(label, "topology"), result.topology))
    if result.ends:
        out.append((label_property(label, "ends"), " ".join(e.describe() for e in result.ends)))
    out.append((label_property(label, "settings"), settings))
    for point in result.sizes:
        key = point.label
        if point.payload:
            out.append((point_property(label, key, "bytes"), str(point.size_bytes)))
            out.append((point_property(label, key, "buffers"), ",".join(map(str, point.buffers))))
        for figure in point.figures(rates=result.reports_rates):
            name = figure_name(label, key, figure.metric, figure.scope)
            out.append((name, figure_value(figure.metric, figure.value)))
        # A compact sketch of every sample: what a later run's baseline gate tests against.
        sketch = Sketch.from_samples(point.samples_ns).to_string()
        out.append((point_property(label, key, SKETCH), sketch))
        rounds = point.round_figures(rates=result.reports_rates)
        if rounds:
            out.append((point_property(label, key, ROUNDS), format_rounds(rounds)))
    return out + result.extra_properties()


def format_rounds(rounds: Mapping[str, Sequence[float]]) -> str:
    """Per-round figures as one property value, base units, 6 digits:
    ``p50=2.77e+05,2.81e+05;p99=...`` (metric ``=`` one value per round, in order)."""
    return ";".join(
        f"{metric}={','.join(f'{value:.6g}' for value in values)}"
        for metric, values in rounds.items()
    )


def parse_rounds(value: str) -> dict[str, tuple[float, ...]]:
    """Read :func:`format_rounds`' value; ValueError naming what is wrong."""
    out: dict[str, tuple[float, ...]] = {}
    for item in filter(None, value.split(";")):
        metric, equals, numbers = item.partition("=")
        if not equals or not metric:
            raise ValueError(f"round figures {item[:40]!r} are not <metric>=<v>,<v>,...")
        try:
            out[metric] = tuple(float(x) for x in numbers.split(","))
        except ValueError:
            raise ValueError(f"round figures of {metric}: not numbers: {numbers[:40]!r}") from None
    return out
