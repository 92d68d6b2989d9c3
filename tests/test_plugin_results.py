"""Nothing lost: the results file and the JUnit XML keep every finished test through a
SIGTERM; plots."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import QUICK, pid_alive
from junitparser.xunit2 import JUnitXml

from pytest_tfgrpc.report.results_file import read_results

SUITE = """
import os, time
import pytest

@pytest.mark.message_profile(["1KiB"])
def test_first(tfgrpc, tensor_server):
    tfgrpc.p2p_latency(tensor_server)

@pytest.mark.message_profile(["64KiB"])
def test_second(tfgrpc, tensor_server):
    tfgrpc.p2p_bandwidth(tensor_server)

def test_third_hangs(tensor_server):
    with open(os.environ["PID_FILE"], "w") as out:
        out.write(str(tensor_server.pid))
    time.sleep(60)
"""


def test_sigterm_midway_keeps_every_finished_result(tmp_path: Path) -> None:
    (tmp_path / "test_suite.py").write_text(SUITE)
    results = tmp_path / "results.jsonl"
    pid_file = tmp_path / "server.pid"
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *QUICK,
         f"--tfgrpc-results={results}", f"--junitxml={tmp_path / 'perf.xml'}", str(tmp_path)],
        cwd=tmp_path,
        env={**os.environ, "PID_FILE": str(pid_file)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()):
            assert time.monotonic() < deadline and run.poll() is None
            time.sleep(0.05)
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=30)
    finally:
        run.kill()
        run.wait()
    records = read_results(results)
    assert [r["test"].rsplit("::", 1)[1] for r in records] == ["test_first[lo]", "test_second[lo]"]
    assert all(r["outcome"] == "passed" for r in records)
    assert float(records[0]["properties"]["tfgrpc.p2p_latency.1KiB.p50_us"]) > 0
    assert float(records[1]["properties"]["tfgrpc.p2p_bandwidth.64KiB.throughput_MBps"]) > 0
    assert records[0]["properties"]["tfgrpc.p2p_latency.1KiB.samples"] == "30"
    # SIGTERM ends the run as Ctrl-C does: the JUnit XML holds the finished tests' figures
    cases = {
        case.name: {p.name: p.value for p in case.properties()}  # type: ignore[attr-defined]
        for suite in JUnitXml.fromfile(str(tmp_path / "perf.xml"))
        for case in suite
    }
    assert float(cases["test_first[lo]"]["tfgrpc.p2p_latency.1KiB.p50_us"]) > 0
    assert "tfgrpc.p2p_bandwidth.64KiB.throughput_MBps" in cases["test_second[lo]"]
    deadline = time.monotonic() + 10
    while pid_alive(int(pid_file.read_text())) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(int(pid_file.read_text()))


def test_outcomes_of_failures_reach_the_results_file(
    pytester: pytest.Pytester, quick: tuple[str, ...]
) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.message_profile(["1KiB"])
        @pytest.mark.budget(p50="1ns")
        def test_breach(tfgrpc, tensor_server):
            tfgrpc.p2p_latency(tensor_server)

        @pytest.mark.budget(p50="fast")
        def test_bad_marker(tfgrpc):
            pass
        """
    )
    results = pytester.path / "results.jsonl"
    pytester.runpytest(*quick, f"--tfgrpc-results={results}").assert_outcomes(failed=1, errors=1)
    records = {r["test"].rsplit("::", 1)[1]: r for r in read_results(results)}
    assert records["test_breach[lo]"]["outcome"] == "failed"
    assert "tfgrpc.p2p_latency.1KiB.p50_us" in records["test_breach[lo]"]["properties"]
    assert records["test_bad_marker"]["outcome"] == "error"


def test_plots_are_written(pytester: pytest.Pytester, quick: tuple[str, ...]) -> None:
    pytest.importorskip("matplotlib", reason="plots need the 'plot' extra")
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.message_profile(["1KiB", "64KiB"])
        def test_latency(tfgrpc, tensor_server):
            tfgrpc.p2p_latency(tensor_server)

        @pytest.mark.message_profile(["64KiB", "1MiB"])
        def test_bandwidth(tfgrpc, tensor_server):
            tfgrpc.p2p_bandwidth(tensor_server)
        """
    )
    plots = pytester.path / "plots"
    result = pytester.runpytest(*quick, f"--tfgrpc-plot={plots}")
    result.assert_outcomes(passed=2)
    written = sorted(p.name for p in plots.iterdir())
    assert len(written) == 2 and all(name.endswith(".png") for name in written)
    for path in plots.iterdir():
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result.stdout.fnmatch_lines(["tfgrpc: plot *.png"])
