"""The record: one module spells the tfgrpc.* namespace; results read back as typed records;
the summary and the HTML render them (engines and fabrics side by side, per-PS rows)."""

from __future__ import annotations

import ast
import re
from html.parser import HTMLParser
from pathlib import Path
from types import MappingProxyType

import numpy as np
import pytest

from pytest_tfgrpc.report.html import HtmlRun, render_html
from pytest_tfgrpc.report.record import (
    Key,
    Outcome,
    TestRecord,
    Verdict,
    junit_test_id,
    path_value,
    placement_value,
    read_record,
    result_properties,
    verdict_properties,
    without_params,
)
from pytest_tfgrpc.report.summary import format_ps_loads, format_summary, summary_rows
from pytest_tfgrpc.results import BenchmarkResult, Cluster, CpuTime, PSLoad, SizeResult

PACKAGE = Path(__file__).resolve().parent.parent / "pytest_tfgrpc"
OWNER = PACKAGE / "report" / "record.py"

#: The namespace's parts beyond figure names: written as ``tfgrpc.<label>.<key>.<part>`` or
#: ``....<metric>.<part>``, or a name of their own (``tfgrpc.path``).
_PARTS = "verdict|verdict_reason|rounds|sketch|detectable|change|path|placement|model|gate"
#: A string that spells a namespace name or part: ``tfgrpc.`` starting a property name (not a
#: module path, a gRPC service or the ``tfgrpc`` fixture called in a message), or a part
#: joined by a dot.
_SPELLS = re.compile(rf"(?<![\w])tfgrpc\.(?![A-Z])(?!\w+\()|^\.(?:{_PARTS})\b|\.(?:{_PARTS})$")


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _module_path(text: str) -> bool:
    """Whether ``text`` names a module or package of this package (``model.placement``)."""
    parts = text.removeprefix("pytest_tfgrpc.").split(".")
    if not all(p.isidentifier() for p in parts):
        return False
    where = PACKAGE.joinpath(*parts)
    return where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()


#: Methods that take a property name apart.
_PARSERS = {"endswith", "startswith", "removesuffix", "removeprefix", "partition", "split", "get"}
_BARE = set(_PARTS.split("|"))


def _parsed(tree: ast.AST) -> set[int]:
    """Bare part names (``"sketch"``) compared with a piece of a name (``parts[2]``) or used
    to take a string apart."""
    out = set()
    for node in ast.walk(tree):
        operands = [node.left, *node.comparators] if isinstance(node, ast.Compare) else []
        if any(isinstance(side, ast.Subscript) for side in operands):  # parts[2] == "rounds"
            candidates = operands
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _PARSERS
        ):
            candidates = list(node.args)
        else:
            continue
        for child in candidates:
            for inner in ast.walk(child):
                if isinstance(inner, ast.Constant) and inner.value in _BARE:
                    out.add(id(inner))
    return out


def spellings(source: str) -> list[str]:
    """Every string in ``source`` (docstrings aside) that spells a part of the namespace: a
    property name or part, or a bare part name a property name is compared with or cut at."""
    tree = ast.parse(source)
    docs, parsed = _docstrings(tree), _parsed(tree)
    return [
        f"{node.lineno}: {node.value[:60]!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docs
        and ((_SPELLS.search(node.value) and not _module_path(node.value)) or id(node) in parsed)
    ]


def test_only_the_record_module_spells_the_namespace() -> None:
    sources = [p for p in PACKAGE.rglob("*.py") if "_pb2" not in p.name and p != OWNER]
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in sorted(sources)
        for line in spellings(path.read_text(encoding="utf-8"))
    ]
    assert found == [], "\n".join(found)


def test_the_namespace_check_sees_what_it_looks_for() -> None:
    hand_made = """
def f(name, parts, props, label, key):
    "A docstring may say tfgrpc.path and .verdict."
    a = name.endswith(".verdict")
    b = props.get(f"{label}.{key}.detectable")
    c = parts[2] == "rounds"
    d = name.removesuffix("sketch")
    e = "tfgrpc.placement"
    g = f"tfgrpc.{label}.{key}.rounds"
    return "model.placement", "tfgrpc.TensorService", "call tfgrpc.p2p_latency(server)"
"""
    assert sorted(line.split(":")[0] for line in spellings(hand_made)) == [
        "4", "5", "6", "7", "8", "9", "9",
    ]  # fmt: skip
    owned = OWNER.read_text(encoding="utf-8")
    assert spellings(owned), "the owner's names are not seen: the check is blind"


# --- results in, records out ---------------------------------------------------------------


def _samples(p50_us: float, seed: int, n: int = 200, spread: float = 0.05) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (p50_us * 1e3 * rng.uniform(1 - spread, 1 + spread, n)).astype(np.int64)


def _p2p(engine: str, fabric: str, p50_us: float, seed: int) -> BenchmarkResult:
    samples = _samples(p50_us, seed)
    point = SizeResult.from_samples(
        1 << 20, 1 << 20, samples, int(samples.sum()), rounds=(100, 100)
    )
    return BenchmarkResult(
        "p2p_bandwidth",
        "p2p_bandwidth",
        fabric,
        "127.0.0.1:1",
        "raw",
        "unary",
        (point,),
        settings=MappingProxyType({"engine": engine}),
    )


def _record(test: str, result: BenchmarkResult, *extra: tuple[str, str]) -> TestRecord:
    return read_record(test, [("tfgrpc.fabric", result.fabric), *result_properties(result), *extra])


def test_a_result_reads_back_as_its_record() -> None:
    result = _p2p("native", "lo", 100.0, 1)
    record = _record("t.py::test_x[lo-native]", result)
    (m,) = record.measurements
    point = result.sizes[0]
    assert m.key == Key("t.py::test_x[lo-native]", "lo", "p2p_bandwidth", "1MiB")
    assert m.figures["p50"] == pytest.approx(point.summary.p50_ns, abs=0.5)
    assert m.figures["throughput"] == pytest.approx(point.throughput_Bps, rel=1e-5)
    assert m.sketch is not None and m.sketch.count == 200
    assert set(m.rounds) >= {"p50", "throughput"} and len(m.rounds["p50"]) == 2
    assert record.label("p2p_bandwidth").engine == "native"
    assert (record.label("p2p_bandwidth").rpc, m.rpc, m.mode) == ("unary", "unary", "raw")
    assert record.fabric == "lo" and record.verdicts == ()


def test_verdicts_path_and_placement_read_back_as_they_were_written() -> None:
    key = Key("t.x[lo]", "lo", "p2p_bandwidth", "1MiB")
    verdict = Verdict(key, "throughput", Outcome.REGRESSION, change=-0.25, reason="slower",
                      tolerance=0.1, detectable=0.03)  # fmt: skip
    props = verdict_properties([verdict], [key._replace(size="4MiB")])
    path = path_value("eth0", source="driver", destination="node1")
    props += [
        ("tfgrpc.path", path),
        ("tfgrpc.placement", placement_value([("ps0", "node1", "10.0.0.1")])),
    ]
    record = read_record("t.x[lo]", [("tfgrpc.fabric", "lo"), *props])
    (back,) = record.verdicts
    assert (back.key, back.metric, back.outcome) == (key, "throughput", Outcome.REGRESSION)
    assert (back.change, back.reason, back.threshold) == (-0.25, "slower", 0.1)
    assert [k.size for k in record.unjudged] == ["4MiB"]
    assert record.path == "eth0: driver -> node1" and not record.loopback
    assert record.placement == "ps0=node1@10.0.0.1"
    assert read_record("t", [("tfgrpc.path", path_value("lo", loopback="(one host)"))]).loopback
    # A verdict names no figure: the record has no measurement for it.
    assert record.measurements == ()


def test_test_ids_lose_their_fabric_and_engine_parts() -> None:
    assert without_params("t.py::test_x[lo-native]", "lo", "native") == "t.py::test_x"
    assert without_params("t.py::test_x[lo-4B-native]", "lo", "native") == "t.py::test_x[4B]"
    assert without_params("t.test_x[eth0]", "lo") == "t.test_x[eth0]"
    assert junit_test_id("a/b.py::C::t[x]", "ci") == "ci.a.b.C.t[x]"


# --- the views ---------------------------------------------------------------------------


def _grid() -> list[TestRecord]:
    """Two engines on two fabrics: grpcio 3x native's time, veth0 4x lo's."""
    out = []
    for engine, engine_us in (("grpcio", 300.0), ("native", 100.0)):
        for seed, (fabric, factor) in enumerate((("lo", 1.0), ("veth0", 4.0))):
            result = _p2p(engine, fabric, engine_us * factor, seed)
            out.append(_record(f"t.py::test_pull[{fabric}-{engine}]", result))
    return out


def test_the_summary_puts_fabrics_side_by_side_per_engine_and_engines_beside() -> None:
    rows = [row for record in _grid() for row in summary_rows(record)]
    lines = format_summary(rows, ["lo", "veth0"])
    assert lines[0].split()[:5] == ["test", "benchmark", "size", "engine", "fabric"]
    body = [line.split() for line in lines[1:5]]
    assert body[0][:5] == ["t.py::test_pull", "p2p_bandwidth", "1MiB", "grpcio", "lo"]
    assert [b[3:5] if b[0] == "t.py::test_pull" else b[:2] for b in body] == [
        ["grpcio", "lo"], ["grpcio", "veth0"], ["native", "lo"], ["native", "veth0"],
    ]  # fmt: skip
    # best/worst among each engine's fabrics (by throughput: lo is 4x faster)
    assert [b[-1] for b in body] == ["best", "worst", "best", "worst"]
    ratios = [line.split() for line in lines[5:7]]
    assert [r[:2] for r in ratios] == [["grpcio/native", "lo"], ["grpcio/native", "veth0"]]
    for ratio in ratios:  # grpcio takes ~3x native's time, moves ~1/3 of its bytes
        assert float(ratio[2].removeprefix("x")) == pytest.approx(3.0, rel=0.1)
        assert float(ratio[4].removeprefix("x")) == pytest.approx(1 / 3, rel=0.1)
    assert any(line.startswith("a/b: engine a's") for line in lines[7:])


class TableText(HTMLParser):
    """Table headers and cells of an HTML page, as text."""

    def __init__(self) -> None:
        super().__init__()
        self.headers: list[str] = []
        self.cells: list[str] = []
        self._where: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("th", "td"):
            self._where = tag
            (self.headers if tag == "th" else self.cells).append("")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("th", "td"):
            self._where = None

    def handle_data(self, data: str) -> None:
        if self._where == "th":
            self.headers[-1] += data
        elif self._where == "td":
            self.cells[-1] += data


def test_the_html_puts_fabrics_side_by_side_per_engine_and_engines_beside() -> None:
    records = {record.test: record for record in _grid()}
    page = TableText()
    page.feed(render_html(HtmlRun(records=records, fabrics=["lo", "veth0"])))
    groups = [h for h in page.headers if " on " in h]
    assert groups == [
        "grpcio on lo", "grpcio on veth0", "native on lo", "native on veth0",
        "grpcio/native on lo", "grpcio/native on veth0",
    ]  # fmt: skip
    marked = [c.split()[-1] for c in page.cells if c.endswith(("best", "worst"))]
    assert marked == ["best", "worst", "best", "worst"]
    ratios = [c for c in page.cells if c.startswith("x")]
    assert len(ratios) == 6  # p50, p99, throughput per fabric
    assert float(ratios[0][1:]) == pytest.approx(3.0, rel=0.1)


def _ps_record() -> TestRecord:
    samples = _samples(5000.0, 3)
    loads = (
        PSLoad(0, "127.0.0.1:1", 1, 1 << 20, 692 << 20, 692 << 20, 692, 0, CpuTime(9, 1)),
        PSLoad(1, "127.0.0.1:2", 2, 1 << 20, 138 << 20, 138 << 20, 138, 0, CpuTime(3, 1)),
    )
    point = SizeResult.from_samples(
        1 << 20, 1 << 20, samples, int(samples.sum()), rate_per_s=100.0, rate_Bps=1e8,
        per_ps=loads, cpu={"workers": CpuTime(5, 6)},
    )  # fmt: skip
    result = BenchmarkResult(
        "ps_throughput", "ps_throughput", "lo", "a,b", "raw", "unary", (point,),
        cluster=Cluster(2, 2, "round_robin"),
    )  # fmt: skip
    return _record("t.py::test_throughput[lo]", result)


def test_ps_rows_show_every_task_with_the_slowest_marked() -> None:
    record = _ps_record()
    (m,) = record.measurements
    rows = m.ps_rows()
    assert [(r.task, r.rpcs, r.slowest) for r in rows] == [("ps0", 692, False), ("ps1", 138, True)]
    assert rows[0].bytes_in == 692 << 20 and rows[1].cpu_ns == 4
    lines = format_ps_loads(summary_rows(record))
    assert lines[0] == "PS load per task:"
    assert lines[2].split()[4:] == ["ps0", "692MiB", "692MiB", "692", "10.0ns"]
    assert lines[3].split() == ["ps1", "138MiB", "138MiB", "138", "4.00ns", "slowest"]
    page = render_html(HtmlRun(records={record.test: record}, fabrics=["lo"]))
    assert "PS load per task" in page
    assert re.search(r'class="slowest">ps1 <small>slowest</small>', page)
    cells = TableText()
    cells.feed(page)
    at = cells.cells.index("ps1 slowest")
    assert cells.cells[at + 1 : at + 4] == ["138MiB", "138MiB", "138"]
