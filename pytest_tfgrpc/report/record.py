"""The record of a test: the ``tfgrpc.*`` namespace, written and read in this module only.

A test's figures travel as JUnit ``(name, value)`` properties (pytest writes them into its
``<testcase>``, pytest-xdist forwards them from its workers, the results file keeps them); that
is the only place they are strings. Everything that reads figures (gate, summary, HTML, plots,
``tfgrpc-compare``, ``tfgrpc-model``, ``tfgrpc-history``) reads a :class:`TestRecord`
(:func:`read_record`), and everything that writes them writes through the functions here
(:func:`result_properties`, :func:`verdict_properties`, :func:`gate_properties`,
:func:`path_value`, :func:`placement_value`). Names (the contract of docs/reference/junit.md):

- ``tfgrpc.fabric``, ``tfgrpc.target``: where a test measured (the first result's server);
- ``tfgrpc.path``, ``tfgrpc.placement``: whether a test's traffic crossed the fabric or stayed
  on one host (loopback), and on which host each server, PS task and worker ran;
- ``tfgrpc.<label>.<field>`` for ``target`` (the result's server: a floor's is its floor
  server), ``rpc``, ``mode``, ``settings``, ``topology``, ``ends`` (where its figures came from:
  ``client=HOST@ADDRESS server=HOST@ADDRESS``, or every ``ps<i>=`` and ``worker<j>=``);
- ``tfgrpc.<label>.<key>.<metric>_<unit>``: a figure of one point (message size, payload or
  profile), e.g. ``tfgrpc.p2p_latency.1KiB.p99_us``; the metric and its unit come from
  :mod:`pytest_tfgrpc.metrics`;
- ``tfgrpc.<label>.<key>.<scope>.<metric>_<unit>`` with scope ``ps<i>`` or ``workers``: a figure
  of one PS task or of all workers;
- ``tfgrpc.<label>.<key>.sketch``, ``.rounds``, ``.bytes``, ``.buffers``: a point's sketch,
  per-round figures and payload;
- ``tfgrpc.meta.*``: run metadata; ``tfgrpc.<label>.<key>.model.*``: the analytic model's
  prediction; ``....<metric>.verdict`` / ``.verdict_reason`` / ``.change`` / ``.detectable``:
  baseline verdicts, ``tfgrpc.<label>.<key>.verdict`` = ``no baseline``, ``tfgrpc.baseline`` =
  ``unusable``; ``tfgrpc.gate.*`` (suite properties): the gate's totals.

A label ending in ``_floor`` is a raw-TCP transport floor (:func:`~pytest_tfgrpc.metrics.is_floor`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import NamedTuple

from pytest_tfgrpc.metrics import METRICS, RATIO, Metric, is_floor, significant
from pytest_tfgrpc.results import BenchmarkResult, End
from pytest_tfgrpc.stats.significance import DEFAULT_ALPHA
from pytest_tfgrpc.stats.sketch import Sketch
from pytest_tfgrpc.units import parse_size

__all__ = [
    "FABRIC",
    "LOOPBACK",
    "META_PREFIX",
    "PATH",
    "PLACEMENT",
    "PREFIX",
    "TARGET",
    "Key",
    "LabelRecord",
    "Measurement",
    "Outcome",
    "PSRow",
    "TestRecord",
    "Verdict",
    "figure_name",
    "gate_properties",
    "junit_test_id",
    "path_value",
    "placement_value",
    "read_record",
    "result_properties",
    "sketch_property",
    "verdict_properties",
    "without_params",
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
#: ``tfgrpc.baseline`` = ``unusable``: the gate had no baseline to judge the test with.
BASELINE = f"{PREFIX}baseline"
UNUSABLE = "unusable"
#: Properties of a whole result label (``tfgrpc.<label>.<field>``), strings, not figures.
LABEL_FIELDS = ("target", "rpc", "mode", "settings", "topology", "ends")
_SKETCH = "sketch"
_ROUNDS = "rounds"
#: ``tfgrpc.<label>.<key>.limit``: what bounded the point, with the figures the rule used
#: (:meth:`~pytest_tfgrpc.results.Limit.describe`, the rule in :mod:`.limits`).
_LIMIT = "limit"
_MODEL = "model"
_VERDICT = "verdict"
_NO_BASELINE = "no baseline"
#: A verdict's parts after ``tfgrpc.<label>.<key>.<metric>.``.
_VERDICT_PARTS = (_VERDICT, "verdict_reason", "change", "detectable")
_GATE = f"{PREFIX}gate."

_SCOPE = re.compile(r"^(?:ps\d+|workers)$")
_BY_SUFFIX: Mapping[bool, Mapping[str, Metric]] = {
    scoped: {
        m.property_suffix: m
        for m in METRICS.values()
        if m.scoped == scoped or (scoped and m.per_ps)
    }
    for scoped in (False, True)
}


# ---------------------------------------------------------------------------------------------
# Test ids


_XML_ILLEGAL = re.compile(
    "[^\u0009\u000a\u000d\u0020-\u007e\u0080-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]"
)


def _xml_escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"#x{code:02X}" if code <= 0xFF else f"#x{code:04X}"


def junit_test_id(nodeid: str, prefix: str = "") -> str:
    """A pytest node id as pytest's JUnit writer names its test case, ``<classname>.<name>``:
    the path to dots, ``::`` to dots, parameters kept, ``prefix`` (``--junit-prefix``) before
    the classname, characters XML cannot hold escaped (``#x1B``) as pytest escapes them
    (``tests/test_x.py::TestA::test_b[lo]`` -> ``tests.test_x.TestA.test_b[lo]``). Live tests,
    results files and baselines share a key through it."""
    path, bracket, params = nodeid.partition("[")
    names = path.split("::")
    names[0] = re.sub(r"\.py$", "", names[0].replace("/", "."))
    names[-1] += bracket + params
    classnames = names[:-1]
    if prefix:
        classnames.insert(0, prefix)
    name = _XML_ILLEGAL.sub(_xml_escape, names[-1])
    return f"{'.'.join(classnames)}.{name}" if classnames else name


def without_params(test: str, *params: str) -> str:
    """``test`` (a node id or JUnit id) without the given parts of its parameter id
    (``t[lo-native-4B]`` without ``lo`` and ``native`` -> ``t[4B]``; ``t[lo]`` -> ``t``): the
    rows of one group differ only in those."""
    start = test.find("[", max(test.rfind("::"), 0))
    if start < 0 or not test.endswith("]"):
        return test
    head, parts = test[:start], test[start + 1 : -1].split("-")
    for param in filter(None, params):
        if param in parts:
            parts.remove(param)
    return f"{head}[{'-'.join(parts)}]" if parts else head


# ---------------------------------------------------------------------------------------------
# The record's types


class Key(NamedTuple):
    """What identifies a set of figures across runs: test id, fabric, label and point key."""

    test: str
    fabric: str
    label: str
    size: str

    def describe(self) -> str:
        fabric = f" on {self.fabric}" if self.fabric else ""
        return f"{self.test}{fabric}: {self.label} {self.size}"

    @property
    def figure(self) -> str:
        """``<label>.<size>``, as people read a point's name."""
        return f"{self.label}.{self.size}"

    def order(self) -> tuple[str, str, int, str, str]:
        """Sort key: by test and label, then sizes by bytes (``4B`` before ``1KiB``)."""
        return (self.test, self.label, _size_order(self.size), self.size, self.fabric)


def _size_order(size: str) -> int:
    try:
        return parse_size(size)
    except ValueError:
        return -1


class Outcome(str, Enum):
    """What a comparison of one figure concluded."""

    PASS = "pass"
    REGRESSION = "regression"
    IMPROVEMENT = "improvement"
    INCONCLUSIVE = "inconclusive"
    #: A figure that cannot be a measurement: zero, negative, NaN or infinite.
    INVALID = "invalid"

    @property
    def word(self) -> str:
        """How a table says it after a change: ``worse``, ``better``, ``same``, ``unsure``,
        ``invalid``."""
        return _WORDS[self]


_WORDS = {
    Outcome.PASS: "same",
    Outcome.REGRESSION: "worse",
    Outcome.IMPROVEMENT: "better",
    Outcome.INCONCLUSIVE: "unsure",
    Outcome.INVALID: "invalid",
}


@dataclass(frozen=True)
class Verdict:
    """The outcome of one figure's comparison, with the numbers behind it.

    ``baseline`` and ``current`` are in the metric's base unit (``unit``: ns or B/s); ``change``
    is ``current / baseline - 1`` (NaN when undefined). ``method`` names the test
    (``mann-whitney-u`` or ``bootstrap``, empty when none ran); ``p_value`` is the U test's,
    ``ci`` the bootstrap interval of the relative change at level ``1 - alpha``. ``reason`` is
    one line for people. ``detectable`` is the smallest relative change (a fraction, either
    way) this figure's noise would let the test call significant, NaN when no test ran; a
    regression also needs the change beyond ``tolerance``, so the gate sees changes beyond
    ``max(tolerance, detectable)`` (:attr:`threshold`). ``runs`` counts the baseline runs
    the verdict drew on.

    A verdict read back from properties (:func:`read_record`) has what they hold: outcome,
    reason, change and threshold (as ``detectable``, ``tolerance`` NaN); the rest is unknown
    (NaN, 0).
    """

    key: Key
    metric: str
    outcome: Outcome
    change: float = math.nan
    reason: str = ""
    baseline: float = math.nan
    current: float = math.nan
    tolerance: float = math.nan
    unit: str = ""
    baseline_samples: int = 0
    current_samples: int = 0
    method: str = ""
    p_value: float | None = None
    ci: tuple[float, float] | None = None
    alpha: float = DEFAULT_ALPHA
    detectable: float = math.nan
    runs: int = 1

    @property
    def threshold(self) -> float:
        """The smallest change the gate would flag: the tolerance or, when larger, what the
        noise lets the test detect (NaN when no test could run)."""
        if not math.isfinite(self.detectable):
            return math.nan
        return (
            max(self.tolerance, self.detectable)
            if math.isfinite(self.tolerance)
            else (self.detectable)
        )

    @property
    def figure(self) -> str:
        """``<label>.<size>.<metric>``."""
        return f"{self.key.figure}.{self.metric}"

    def detection(self) -> str:
        """``could detect >= 12.3%``, or why it could not detect anything."""
        if not math.isfinite(self.threshold):
            return "could detect: nothing (no test ran)"
        if not math.isfinite(self.tolerance):
            return f"could detect >= {self.threshold:.1%}"
        noise = f"noise {self.detectable:.1%}" if self.detectable > self.tolerance else "tolerance"
        return f"could detect >= {self.threshold:.1%} ({noise})"

    def change_text(self) -> str:
        """``+12.3%``, or ``n/a`` when undefined."""
        return f"{self.change:+.1%}" if math.isfinite(self.change) else "n/a"


@dataclass(frozen=True)
class PSRow:
    """One PS task's load over a point, as recorded: bytes in and out, RPCs served, CPU time
    (ns). ``slowest`` marks the task that held the workers back: the one that served the fewest
    RPCs in the same measured time (a closed loop, ``ps_throughput``); where all served as many
    (sync-SGD steps), the one with the most bytes per RPC, the placement's busiest."""

    task: str
    bytes_in: float | None
    bytes_out: float | None
    rpcs: float | None
    cpu_ns: float | None
    slowest: bool = False


def _no_figures() -> Mapping[str, float]:
    return MappingProxyType({})


@dataclass(frozen=True)
class Measurement:
    """The figures of one benchmark label and point of one test, as a run recorded them.

    ``figures`` are in base units (ns, B/s; ``samples`` a count), keyed by metric name without
    its unit (``p99``, ``throughput``); ``scoped`` holds the per-PS (``ps<i>``) and workers'
    figures the same way, by scope; ``sketch`` is the sketch of the duration samples, or None
    when the run recorded none; ``rounds`` the figures of each round of a point measured in
    rounds (metric -> one value per round, base units), empty otherwise. ``size_bytes`` is the
    point's payload size where its key is no size (a payload's recorded ``.bytes``), ``model``
    the analytic model's prediction beside it (name -> value as recorded), ``limit`` what
    bounded it (``cpu-bound (client): client_busy=0.9 ...``; empty where not named).
    """

    key: Key
    figures: Mapping[str, float] = field(default_factory=_no_figures)
    sketch: Sketch | None = None
    rpc: str = ""
    mode: str = ""
    rounds: Mapping[str, tuple[float, ...]] = field(default_factory=lambda: MappingProxyType({}))
    scoped: Mapping[str, Mapping[str, float]] = field(default_factory=lambda: MappingProxyType({}))
    size_bytes: int | None = None
    model: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    limit: str = ""

    @property
    def samples(self) -> int:
        """The sample count: the sketch's, else the ``samples`` figure, else 0."""
        if self.sketch is not None:
            return self.sketch.count
        count = self.figures.get("samples", 0.0)
        return int(count) if math.isfinite(count) else 0

    def figure(self, *names: str) -> float | None:
        """The first of the figures ``names`` this point has (``"p50", "step_p50"``), if finite."""
        for name in names:
            value = self.figures.get(name)
            if value is not None and math.isfinite(value):
                return value
        return None

    def ps_rows(self) -> tuple[PSRow, ...]:
        """Per PS task (``ps0``, ``ps1``, ... in order), what it carried; the slowest marked
        when there are several."""
        rows = []
        for scope in sorted((s for s in self.scoped if s.startswith("ps")), key=_task_order):
            figures = self.scoped[scope]
            user, system = figures.get("cpu_user"), figures.get("cpu_system")
            cpu = user + system if user is not None and system is not None else None
            rows.append(
                PSRow(
                    scope,
                    figures.get("bytes_in"),
                    figures.get("bytes_out"),
                    figures.get("rpcs"),
                    cpu,
                )
            )
        if len(rows) < 2:
            return tuple(rows)
        slowness = [_slowness(r) for r in rows]
        slowest = max(range(len(rows)), key=lambda i: slowness[i])
        if slowness.count(slowness[slowest]) > 1:
            return tuple(rows)  # no one task stands out
        return tuple(
            PSRow(r.task, r.bytes_in, r.bytes_out, r.rpcs, r.cpu_ns, i == slowest)
            for i, r in enumerate(rows)
        )


def _slowness(row: PSRow) -> tuple[float, float]:
    """Larger for a task that held its workers back more: fewer RPCs, then more bytes each."""
    rpcs = row.rpcs or 0.0
    per_rpc = (row.bytes_in or 0.0) + (row.bytes_out or 0.0)
    return (-rpcs, per_rpc / rpcs if rpcs else 0.0)


def _task_order(scope: str) -> int:
    return int(scope[2:]) if scope[2:].isdigit() else -1


@dataclass(frozen=True)
class LabelRecord:
    """What a test recorded of one result label beyond its points: ``target``, ``rpc``,
    ``mode``, ``topology`` (``2ps_3workers_round_robin``, PS only), ``settings`` and ``ends``
    (where its figures came from; empty where not recorded)."""

    label: str
    target: str = ""
    rpc: str = ""
    mode: str = ""
    topology: str = ""
    settings: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    ends: tuple[End, ...] = ()

    @property
    def engine(self) -> str:
        """The measuring engine (``settings`` ``engine=``), ``""`` when not recorded."""
        return self.settings.get("engine", "")

    @property
    def floor(self) -> bool:
        """Whether the label is a raw-TCP transport floor's, not a gRPC measurement's."""
        return is_floor(self.label)


@dataclass(frozen=True)
class TestRecord:
    """Everything one test recorded in the ``tfgrpc.*`` namespace, typed.

    ``test`` is the id it was read under (a node id or a JUnit id); ``labels`` the label
    fields of each result; ``measurements`` one per label and point, in recorded order;
    ``path`` and ``placement`` how its traffic went and where each role ran;
    ``verdicts`` the baseline gate's, ``unjudged`` the points the baseline lacked (``no
    baseline``), ``baseline_unusable`` whether the gate had no baseline; ``meta`` the test's
    own ``tfgrpc.meta.*`` properties by their key (``host_wait``).
    """

    __test__ = False  # not a pytest test class, whatever its name

    test: str
    fabric: str = ""
    target: str = ""
    labels: Mapping[str, LabelRecord] = field(default_factory=lambda: MappingProxyType({}))
    measurements: tuple[Measurement, ...] = ()
    path: str = ""
    placement: str = ""
    verdicts: tuple[Verdict, ...] = ()
    unjudged: tuple[Key, ...] = ()
    baseline_unusable: bool = False
    meta: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def loopback(self) -> bool:
        """Whether the test's traffic stayed in one host (its ``tfgrpc.path`` says so)."""
        return self.path.startswith(LOOPBACK)

    def label(self, name: str) -> LabelRecord:
        """The label fields of ``name`` (empty ones when none were recorded)."""
        return self.labels.get(name) or LabelRecord(name)

    def by_key(self) -> dict[Key, Measurement]:
        """The measurements by :class:`Key`."""
        return {m.key: m for m in self.measurements}

    def verdict(self, key: Key, *metrics: str) -> Verdict | None:
        """The verdict of the first of ``metrics`` that has one at ``key``."""
        for metric in metrics:
            for v in self.verdicts:
                if v.key == key and v.metric == metric:
                    return v
        return None

    @property
    def compared(self) -> int:
        """How many figures the gate judged in this test."""
        return len(self.verdicts)


# ---------------------------------------------------------------------------------------------
# Writing


def _label_property(label: str, field_: str) -> str:
    return f"{PREFIX}{label}.{field_}"


def _point_property(label: str, key: str, field_: str) -> str:
    return f"{PREFIX}{label}.{key}.{field_}"


def sketch_property(key: Key) -> str:
    """The property that holds the sketch of the point ``key`` (for messages)."""
    return _point_property(key.label, key.size, _SKETCH)


def figure_name(label: str, key: str, metric: Metric | str, scope: str = "") -> str:
    """The property name of one figure; KeyError for a metric the registry does not know."""
    found = metric if isinstance(metric, Metric) else METRICS[metric]
    return f"{PREFIX}{label}.{key}.{scope + '.' if scope else ''}{found.property_suffix}"


def _fraction(value: float) -> str:
    """A relative figure (``0.25`` is +25%) as a property holds it: significant digits, no
    float noise (``0.3``, not ``0.30000000000000004``)."""
    return RATIO.property_value(value)


def result_properties(result: BenchmarkResult) -> list[tuple[str, str]]:
    """The properties of one result, whichever benchmark made it: where and how it was
    measured (target, rpc, mode, topology when it has one, its ends when known, settings), then
    per point its
    payload, every figure (with the scoped per-PS and workers' figures), a sketch of every
    sample and its rounds; then the model's predictions
    (:meth:`~pytest_tfgrpc.results.BenchmarkResult.model_predictions`)."""
    label = result.label
    settings = ";".join(f"{k}={v}" for k, v in sorted(result.settings.items()))
    out = [
        (_label_property(label, "target"), result.target),
        (_label_property(label, "rpc"), result.rpc),
        (_label_property(label, "mode"), result.mode),
    ]
    if result.topology:
        out.append((_label_property(label, "topology"), result.topology))
    if result.ends:
        ends = placement_value((e.role, e.host, e.address) for e in result.ends)
        out.append((_label_property(label, "ends"), ends))
    out.append((_label_property(label, "settings"), settings))
    for point in result.sizes:
        key = point.label
        if point.payload:
            out.append((_point_property(label, key, "bytes"), str(point.size_bytes)))
            out.append((_point_property(label, key, "buffers"), ",".join(map(str, point.buffers))))
        for figure in point.figures(rates=result.reports_rates):
            name = figure_name(label, key, figure.metric, figure.scope)
            out.append((name, figure.metric.unit.property_value(figure.value)))
        # A compact sketch of every sample: what a later run's baseline gate tests against.
        sketch = Sketch.from_samples(point.samples_ns).to_string()
        out.append((_point_property(label, key, _SKETCH), sketch))
        rounds = point.round_figures(rates=result.reports_rates)
        if rounds:
            out.append((_point_property(label, key, _ROUNDS), _format_rounds(rounds)))
        if point.limit is not None:
            out.append((_point_property(label, key, _LIMIT), point.limit.describe()))
    for key, pairs in result.model_predictions().items():
        out += [
            (_point_property(label, key, f"{_MODEL}.{name}"), _without_float_noise(value))
            for name, value in pairs
        ]
    return out


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


def _format_rounds(rounds: Mapping[str, Sequence[float]]) -> str:
    """Per-round figures as one property value, base units, 6 digits:
    ``p50=2.77e+05,2.81e+05;p99=...`` (metric ``=`` one value per round, in order)."""
    return ";".join(
        f"{metric}={','.join(f'{value:.6g}' for value in values)}"
        for metric, values in rounds.items()
    )


def verdict_properties(
    verdicts: Iterable[Verdict], unjudged: Iterable[Key] = ()
) -> list[tuple[str, str]]:
    """JUnit properties of a test's verdicts: ``tfgrpc.<label>.<size>.<metric>.verdict`` (the
    outcome), ``...<metric>.verdict_reason`` (its one-line reason), ``...<metric>.change``
    (current / baseline - 1, when defined) and ``...<metric>.detectable`` (the smallest change
    the gate could flag, :attr:`Verdict.threshold`, when a test ran); and
    ``tfgrpc.<label>.<size>.verdict`` = ``no baseline`` for each point of ``unjudged``."""
    out = []
    for v in verdicts:
        name = _point_property(v.key.label, v.key.size, v.metric)
        out.append((f"{name}.{_VERDICT}", v.outcome.value))
        out.append((f"{name}.verdict_reason", v.reason))
        if math.isfinite(v.change):
            out.append((f"{name}.change", _fraction(v.change)))
        if math.isfinite(v.threshold):
            out.append((f"{name}.detectable", _fraction(v.threshold)))
    for key in unjudged:
        out.append((_point_property(key.label, key.size, _VERDICT), _NO_BASELINE))
    return out


def unusable_baseline_properties() -> list[tuple[str, str]]:
    """What a test records when the gate had no usable baseline to judge it with."""
    return [(BASELINE, UNUSABLE)]


def gate_properties(
    compared: int, not_compared: Sequence[str], failure: str | None
) -> list[tuple[str, str]]:
    """The gate's totals as suite properties: ``tfgrpc.gate.compared``, ``.not_compared`` (a
    count), one ``.not_compared.item`` per baseline figure not compared (why), ``.failure``."""
    out = [(f"{_GATE}compared", str(compared)), (f"{_GATE}not_compared", str(len(not_compared)))]
    out += [(f"{_GATE}not_compared.item", item) for item in not_compared]
    if failure:
        out.append((f"{_GATE}failure", failure))
    return out


def path_value(
    fabric: str, *, source: str = "", destination: str = "", loopback: str | None = None
) -> str:
    """A ``tfgrpc.path`` value: ``<fabric>: <source> -> <destination>`` for traffic that
    crossed ``fabric``, or, with ``loopback`` (why, or ``""``), ``loopback`` followed by it."""
    if loopback is not None:
        return f"{LOOPBACK} {loopback}".rstrip()
    return f"{fabric}: {source} -> {destination}"


def placement_value(roles: Iterable[tuple[str, str, str]]) -> str:
    """A ``tfgrpc.placement`` (or ``tfgrpc.<label>.ends``) value from ``(role, host,
    address)`` triples: ``server=HOST@ADDRESS`` or ``ps0=... worker0=...``."""
    return " ".join(f"{role}={host}@{address}" for role, host, address in roles)


def _ends(value: str) -> tuple[End, ...]:
    """The ends a ``tfgrpc.<label>.ends`` value names (:func:`placement_value`'s format);
    a part without ``=`` and ``@`` is skipped."""
    ends = []
    for part in value.split():
        role, eq, rest = part.partition("=")
        host, at, address = rest.rpartition("@")
        if eq and at:
            ends.append(End(role, host, address))
    return tuple(ends)


# ---------------------------------------------------------------------------------------------
# Reading


@dataclass(frozen=True)
class _Name:
    """What a ``tfgrpc.<label>.<key>...`` property name says: label, point key, and the rest."""

    label: str
    key: str
    rest: tuple[str, ...]


def _split(name: str) -> _Name | None:
    if not name.startswith(PREFIX) or name.startswith(META_PREFIX):
        return None
    parts = name[len(PREFIX) :].split(".")
    if len(parts) < 2:
        return None
    return _Name(parts[0], parts[1], tuple(parts[2:]))


def _figure_of(at: _Name) -> tuple[Metric, str] | None:
    """The metric and scope a figure's name gives, or None for anything else."""
    if len(at.rest) == 1:
        scope, last = "", at.rest[0]
    elif len(at.rest) == 2 and _SCOPE.match(at.rest[0]):
        scope, last = at.rest
    else:
        return None
    if at.key == _MODEL:
        return None
    found = _BY_SUFFIX[bool(scope)].get(last)
    return (found, scope) if found is not None else None


def _parse_rounds(value: str) -> dict[str, tuple[float, ...]]:
    """Read :func:`_format_rounds`' value; ValueError naming what is wrong."""
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


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def _settings(text: str) -> Mapping[str, str]:
    pairs = (item.partition("=") for item in text.split(";") if item)
    return MappingProxyType({k: v for k, eq, v in pairs if eq})


@dataclass
class _Point:
    figures: dict[str, float] = field(default_factory=dict)
    scoped: dict[str, dict[str, float]] = field(default_factory=dict)
    sketch: Sketch | None = None
    rounds: dict[str, tuple[float, ...]] = field(default_factory=dict)
    size_bytes: int | None = None
    model: dict[str, str] = field(default_factory=dict)
    measured: bool = False
    limit: str = ""


def read_record(
    test: str, properties: Iterable[tuple[str, object]], *, strict: bool = False
) -> TestRecord:
    """The record of one test from its ``(name, value)`` properties (a name given twice keeps
    its first value, as the results file does). A figure that is not a number, a sketch or
    rounds that do not decode raise ValueError naming the property when ``strict``, and are
    left out otherwise."""
    props: dict[str, str] = {}
    for name, value in properties:
        props.setdefault(str(name), str(value))
    fabric = props.get(FABRIC, "")
    points: dict[tuple[str, str], _Point] = {}
    labels: dict[str, dict[str, str]] = {}
    verdict_parts: dict[tuple[str, str, str], dict[str, str]] = {}
    unjudged: list[tuple[str, str]] = []
    meta: dict[str, str] = {}

    def point(label: str, key: str) -> _Point:
        return points.setdefault((label, key), _Point())

    for name, value in props.items():
        if name.startswith(META_PREFIX):
            meta[name[len(META_PREFIX) :]] = value
            continue
        at = _split(name)
        if at is None:
            continue
        if not at.rest:
            if at.key in LABEL_FIELDS:
                labels.setdefault(at.label, {})[at.key] = value
            elif at.key == _VERDICT:
                pass  # tfgrpc.<label>.verdict is no name this namespace writes
            continue
        try:
            if (found := _figure_of(at)) is not None:
                metric, scope = found
                try:
                    number = metric.unit.read_value(value)
                except ValueError:
                    raise ValueError(f"{value!r} is not a number") from None
                p = point(at.label, at.key)
                p.measured = True
                if scope:
                    p.scoped.setdefault(scope, {})[metric.name] = number
                else:
                    p.figures[metric.name] = number
            elif at.rest == (_SKETCH,):
                point(at.label, at.key).sketch = Sketch.from_string(value)
            elif at.rest == (_ROUNDS,):
                point(at.label, at.key).rounds = _parse_rounds(value)
            elif at.rest == (_LIMIT,):
                point(at.label, at.key).limit = value
            elif at.rest == ("bytes",):
                point(at.label, at.key).size_bytes = int(value)
            elif at.rest[0] == _MODEL and len(at.rest) == 2:
                point(at.label, at.key).model[at.rest[1]] = value
            elif at.rest == (_VERDICT,) and value == _NO_BASELINE:
                unjudged.append((at.label, at.key))
            elif len(at.rest) == 2 and at.rest[1] in _VERDICT_PARTS:
                verdict_parts.setdefault((at.label, at.key, at.rest[0]), {})[at.rest[1]] = value
        except ValueError as error:
            if strict:
                raise ValueError(f"property {name}: {error}") from None
            continue

    def fields(label: str) -> LabelRecord:
        got = labels.get(label, {})
        return LabelRecord(
            label,
            target=got.get("target", ""),
            rpc=got.get("rpc", ""),
            mode=got.get("mode", ""),
            topology=got.get("topology", ""),
            settings=_settings(got.get("settings", "")),
            ends=_ends(got.get("ends", "")),
        )

    label_records = {label: fields(label) for label in {*labels, *(lbl for lbl, _ in points)}}
    measurements = []
    for (label, key), p in points.items():
        if not (p.measured or p.sketch is not None or p.rounds):
            continue
        about = label_records[label]
        measurements.append(
            Measurement(
                Key(test, fabric, label, key),
                MappingProxyType(p.figures),
                p.sketch,
                about.rpc,
                about.mode,
                MappingProxyType(p.rounds),
                MappingProxyType({s: MappingProxyType(f) for s, f in p.scoped.items()}),
                p.size_bytes,
                MappingProxyType(p.model),
                p.limit,
            )
        )
    verdicts = []
    for (label, key, judged), parts in verdict_parts.items():
        if _VERDICT not in parts:
            continue
        try:
            outcome = Outcome(parts[_VERDICT])
        except ValueError:
            if strict:
                raise ValueError(
                    f"property {_point_property(label, key, judged)}.verdict: "
                    f"{parts[_VERDICT]!r} is no outcome"
                ) from None
            continue
        verdicts.append(
            Verdict(
                Key(test, fabric, label, key),
                judged,
                outcome,
                change=_float(parts.get("change", "nan")),
                reason=parts.get("verdict_reason", ""),
                detectable=_float(parts.get("detectable", "nan")),
            )
        )
    return TestRecord(
        test=test,
        fabric=fabric,
        target=props.get(TARGET, ""),
        path=props.get(PATH, ""),
        placement=props.get(PLACEMENT, ""),
        labels=MappingProxyType(label_records),
        measurements=tuple(measurements),
        verdicts=tuple(verdicts),
        unjudged=tuple(Key(test, fabric, label, key) for label, key in unjudged),
        baseline_unusable=props.get(BASELINE) == UNUSABLE,
        meta=MappingProxyType(meta),
    )


def suite_meta(properties: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Run metadata from suite (or test) properties: ``tfgrpc.meta.<key>`` by ``<key>``, the
    first value of each."""
    meta: dict[str, str] = {}
    for name, value in properties:
        if name.startswith(META_PREFIX):
            meta.setdefault(name[len(META_PREFIX) :], value)
    return meta


def has_figures(properties: Iterable[tuple[str, object]]) -> bool:
    """Whether any property is in the ``tfgrpc.*`` namespace (and not metadata)."""
    return any(_split(str(name)) is not None for name, _ in properties)
