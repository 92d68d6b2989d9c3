"""Under pytest-xdist every figure reaches the JUnit XML, and no two measurements overlap."""

from __future__ import annotations

import itertools
import json

import pytest
from conftest import QUICK
from junitparser.xunit2 import JUnitXml

pytest.importorskip("xdist")

SUITE = """
import json, os, time
import pytest

@pytest.mark.parametrize("n", range(4))
@pytest.mark.message_profile(["1KiB", "64KiB"])
def test_latency(tfgrpc, tensor_server, n):
    start = time.monotonic()
    tfgrpc.p2p_latency(tensor_server)
    with open(os.environ["WINDOWS"], "a") as out:
        out.write(json.dumps([start, time.monotonic(), os.environ["PYTEST_XDIST_WORKER"]]) + "\\n")
"""


def test_two_workers_lose_no_figure_and_never_measure_at_once(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    windows = pytester.path / "windows.jsonl"
    monkeypatch.setenv("WINDOWS", str(windows))
    pytester.makepyfile(SUITE)
    xml = pytester.path / "perf.xml"
    result = pytester.runpytest_subprocess("-n", "2", *QUICK, f"--junitxml={xml}")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*tfgrpc: pytest-xdist: tests that measure run one at a time*"])
    cases = [case for suite in JUnitXml.fromfile(str(xml)) for case in suite]
    assert sorted(case.name for case in cases) == [f"test_latency[{n}-lo]" for n in range(4)]
    for case in cases:
        props = {p.name: p.value for p in case.properties()}  # type: ignore[attr-defined]
        for size in ("1KiB", "64KiB"):
            assert props[f"tfgrpc.p2p_latency.{size}.samples"] == "30"
            float(props[f"tfgrpc.p2p_latency.{size}.p50_us"])
    suite_props = {p.name for suite in JUnitXml.fromfile(str(xml)) for p in suite.properties()}  # type: ignore[no-untyped-call]
    assert "tfgrpc.meta.grpcio" in suite_props
    spans = sorted(json.loads(line) for line in windows.read_text().splitlines())
    assert {worker for _, _, worker in spans} == {"gw0", "gw1"}
    for (_, end, _), (start, _, _) in itertools.pairwise(spans):
        assert end <= start, "two measurements overlapped"
