"""The gate never passes in silence, end to end: a renamed, deselected or differently named
test, a baseline that matches nothing, zero samples, concurrent runs on one host, an 11 MB
baseline read with lxml; and the docs' CI recipe (a history of main runs) passes unchanged
code twice and fails an injected delay."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import QUICK
from junitparser.xunit2 import JUnitXml

from pytest_tfgrpc import native

#: Enough samples per round (10 rounds) for a p50 of each.
STEADY = ("--tfgrpc-iterations=100", "--tfgrpc-warmup=5", "--tfgrpc-max-seconds=2")

#: Where a test is about which figures are compared, not their noise (3 samples a round).
WIDE = ("--tfgrpc-max-regression=1000%",)

#: One server for a run's tests (a server start is most of a quick test's time): these runs
#: are about which figures the gate compares, not about the server fixtures.
SHARED_SERVER = """
import pytest
from pytest_tfgrpc import ServerProcess
from pytest_tfgrpc.wire.fabric import resolve_fabric

@pytest.fixture(scope="module")
def server():
    with ServerProcess.start(resolve_fabric("lo")) as started:
        yield started
"""

SUITE = (
    SHARED_SERVER
    + """
@pytest.mark.message_profile(["1KiB"])
def test_a(tfgrpc, fabric, server):
    tfgrpc.p2p_latency(server)

@pytest.mark.message_profile(["1KiB"])
def test_b(tfgrpc, fabric, server):
    tfgrpc.p2p_latency(server)
"""
)


def cases_properties(xml: Path) -> dict[str, str]:
    return {
        p.name: p.value
        for suite in JUnitXml.fromfile(str(xml))
        for case in suite
        for p in case.properties()  # type: ignore[attr-defined]
    }


def suite_properties(xml: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for suite in JUnitXml.fromfile(str(xml)):
        for p in suite.properties():  # type: ignore[no-untyped-call]
            out.setdefault(p.name, []).append(p.value)
    return out


@pytest.fixture
def baseline(pytester: pytest.Pytester) -> Path:
    pytester.makepyfile(test_perf=SUITE)
    pytester.runpytest(*QUICK, "--junitxml=base.xml").assert_outcomes(passed=2)
    return pytester.path / "base.xml"


def test_a_renamed_test_fails_the_run_and_says_so(
    pytester: pytest.Pytester, baseline: Path
) -> None:
    pytester.makepyfile(test_perf=SUITE.replace("def test_b", "def test_b_renamed"))
    result = pytester.runpytest(*QUICK, f"--tfgrpc-baseline={baseline}", "--junitxml=new.xml")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*not compared: test_perf.test_b?lo? on lo: p2p_latency 1KiB: no test of that name*",
            "*FAILED 1 baseline figure not compared (--tfgrpc-missing=fail*",
        ]
    )
    props = suite_properties(pytester.path / "new.xml")
    assert props["tfgrpc.gate.not_compared"] == ["1"]
    assert "renamed or removed" in props["tfgrpc.gate.not_compared.item"][0]
    warned = pytester.runpytest(
        *QUICK, *WIDE, f"--tfgrpc-baseline={baseline}", "--tfgrpc-missing=warn"
    )
    assert warned.ret == pytest.ExitCode.OK
    warned.stdout.fnmatch_lines(["*not compared: test_perf.test_b?lo?*"])


def test_a_deselected_test_is_listed_and_fails(pytester: pytest.Pytester, baseline: Path) -> None:
    for how in (("-k", "test_a"), ("--deselect", "test_perf.py::test_b[lo]")):
        result = pytester.runpytest(*QUICK, f"--tfgrpc-baseline={baseline}", *how)
        assert result.ret == pytest.ExitCode.TESTS_FAILED, how
        result.stdout.fnmatch_lines(["*not compared: test_perf.test_b?lo?*deselected in this run*"])


def test_a_baseline_that_matches_nothing_fails(pytester: pytest.Pytester, baseline: Path) -> None:
    pytester.makepyfile(test_perf=SUITE.replace("def test_", "def test_other_"))
    for missing in ("fail", "warn"):
        result = pytester.runpytest(
            *QUICK, f"--tfgrpc-baseline={baseline}", f"--tfgrpc-missing={missing}"
        )
        assert result.ret == pytest.ExitCode.TESTS_FAILED
        result.stdout.fnmatch_lines(["*matched no figure of this run: nothing was gated*"])
    warned = pytester.runpytest(
        *QUICK, f"--tfgrpc-baseline={baseline}", "--tfgrpc-bad-baseline=warn",
        "--tfgrpc-missing=warn",
    )  # fmt: skip
    assert warned.ret == pytest.ExitCode.OK
    warned.stdout.fnmatch_lines(["*WARNING baseline * matched no figure*"])


NAMES = (
    SHARED_SERVER
    + """
class TestOuter:
    class TestInner:
        @pytest.mark.parametrize("how", ["a.b", "x::y", "\\x01odd", "sp ace"])
        @pytest.mark.message_profile(["1KiB"])
        def test_odd(self, tfgrpc, fabric, server, how):
            tfgrpc.p2p_latency(server)
"""
)


@pytest.mark.parametrize(
    "options",
    [(), ("--junit-prefix=ci",), ("-o", "junit_family=xunit1"), ("-o", "junit_suite_name=s")],
)
def test_test_identity_follows_pytests_junit_names(
    pytester: pytest.Pytester, options: tuple[str, ...]
) -> None:
    pytester.makepyfile(test_names=NAMES)
    base = pytester.runpytest(*QUICK, "--junitxml=base.xml", *options)
    base.assert_outcomes(passed=4)
    result = pytester.runpytest(
        *QUICK, *WIDE, "--tfgrpc-baseline=base.xml", "--junitxml=new.xml", *options
    )
    result.assert_outcomes(passed=4)
    props = suite_properties(pytester.path / "new.xml")
    assert props["tfgrpc.gate.not_compared"] == ["0"], props
    assert int(props["tfgrpc.gate.compared"][0]) == 4  # p50 of 4 tests


def test_identity_drift_is_loud(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_perf=SUITE)
    pytester.runpytest(*QUICK, "--junitxml=base.xml", "--junit-prefix=ci")
    result = pytester.runpytest(*QUICK, "--tfgrpc-baseline=base.xml", "--tfgrpc-missing=warn",
                                "--tfgrpc-bad-baseline=warn")  # fmt: skip
    result.stdout.fnmatch_lines(
        [
            "*not compared: ci.test_perf.test_a?lo?*this run's test_perf.test_a?lo? looks like "
            "it: the JUnit names differ*--junit-prefix*",
            "*WARNING baseline * matched no figure*",
        ]
    )
    # Run from another rootdir: the node ids, and so the names, gain the directory.
    sub = pytester.mkdir("sub")
    (sub / "test_perf.py").write_text(SUITE)
    pytester.runpytest(*QUICK, "--junitxml=sub.xml", "--rootdir", str(sub), str(sub))
    moved = pytester.runpytest(*QUICK, "--tfgrpc-baseline=sub.xml", "sub")
    assert moved.ret == pytest.ExitCode.TESTS_FAILED
    moved.stdout.fnmatch_lines(
        ["*not compared: test_perf.test_a?lo?*sub.test_perf.test_a?lo? looks like it*"]
    )


ZERO_CLOCK = """
import pytest
import pytest_tfgrpc.bench.timing as timing

class _Stopped:
    @staticmethod
    def perf_counter_ns():
        return 0

@pytest.fixture(autouse=True)
def stopped_clock(monkeypatch):
    monkeypatch.setattr(timing, "time", _Stopped)
"""


def test_zero_samples_are_invalid_figures(pytester: pytest.Pytester, baseline: Path) -> None:
    pytester.makeconftest(ZERO_CLOCK)
    result = pytester.runpytest(*QUICK, f"--tfgrpc-baseline={baseline}", "--junitxml=zero.xml")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*invalid figures: *", "*invalid: *p50 is 0: not a measurement*"])


def test_an_11_mb_baseline_with_lxml(pytester: pytest.Pytester) -> None:
    pytest.importorskip("lxml")
    pytester.makepyfile(
        test_perf=SUITE
        + "\ndef test_chatty():\n    print('x' * (11 * 1024 * 1024))\n    assert False\n"
    )
    pytester.runpytest(*QUICK, "--junitxml=big.xml", "-o", "junit_logging=all")
    assert (pytester.path / "big.xml").stat().st_size > 11 * 1024 * 1024
    result = pytester.runpytest(*QUICK, *WIDE, "--tfgrpc-baseline=big.xml", "-k", "not chatty",
                                "--tfgrpc-missing=warn")  # fmt: skip
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*baseline runs: 1; figures compared: 2*"])


SLEEPER = """
import time
import pytest

@pytest.mark.message_profile(["1KiB"])
def test_a(tfgrpc, tensor_server):
    time.sleep({hold})
    tfgrpc.p2p_latency(tensor_server)
"""


def test_concurrent_runs_take_turns_and_say_so(pytester: pytest.Pytester, tmp_path: Path) -> None:
    env = dict(os.environ, TFGRPC_HOST_LOCK=str(tmp_path / "host.lock"))
    for name, hold in (("first", 3), ("second", 0)):
        (pytester.path / name).mkdir()
        (pytester.path / name / "test_perf.py").write_text(SLEEPER.replace("{hold}", str(hold)))
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *QUICK, "-W", "error"]

    def start(name: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [*command, f"--junitxml={name}.xml", f"--tfgrpc-results={name}.jsonl", name],
            cwd=pytester.path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip

    first = start("first")
    deadline = time.monotonic() + 60
    while not (tmp_path / "host.lock").exists() or not (tmp_path / "host.lock").read_text():
        assert time.monotonic() < deadline and first.poll() is None
        time.sleep(0.05)
    second = start("second")
    out_first, _ = first.communicate(timeout=120)
    out_second, _ = second.communicate(timeout=120)
    assert first.returncode == 0 and second.returncode == 0, out_first + out_second
    first_id = suite_properties(pytester.path / "first.xml")["tfgrpc.meta.run_id"][0]
    assert "test_a[lo] waited" in out_second and f"for run {first_id} to finish" in out_second
    waited = cases_properties(pytester.path / "second.xml")["tfgrpc.meta.host_wait"]
    assert waited.startswith("waited ") and first_id in waited
    second_id = suite_properties(pytester.path / "second.xml")["tfgrpc.meta.run_id"][0]
    assert second_id != first_id
    assert f'"run": "{second_id}"' in (pytester.path / "second.jsonl").read_text()


CI_SUITE = """
import pytest
from pytest_tfgrpc.roles.processes import ServerProcess

@pytest.fixture
def server(fabric):
    with ServerProcess.start(fabric, extra_args=["--delay", "{delay}"]) as started:
        yield started

@pytest.mark.message_profile(["1KiB"])
def test_echo(tfgrpc, server):
    tfgrpc.p2p_latency(server)
"""


def test_the_readme_ci_recipe(pytester: pytest.Pytester) -> None:
    """docs/tasks/gate-ci.md: main's runs kept as a history; the PR gated against it."""
    pytester.makepyfile(test_perf=CI_SUITE.replace("{delay}", "0s"))
    for i in range(5):
        main = pytester.runpytest(*STEADY, f"--junitxml=main-runs/run-{i:04d}.xml")
        main.assert_outcomes(passed=1)
    # The README's recipe with a tolerance a busy CI runner cannot cross by noise alone (an
    # unchanged 1 KiB echo was seen +63% there); the 3 ms delay below is +500% and more.
    gate = ("--junitxml=pr.xml", "--tfgrpc-baseline=main-runs", "--tfgrpc-max-regression=200%")
    for _ in range(2):
        pr = pytester.runpytest(*STEADY, *gate)
        assert pr.ret == pytest.ExitCode.OK, pr.stdout.str()[-3000:]
        pr.stdout.fnmatch_lines(["*baseline runs: 5; figures compared: 1*"])
    if len(os.sched_getaffinity(0)) >= 2:  # the suite's own server is pinned as it is measured
        settings = cases_properties(pytester.path / "pr.xml")["tfgrpc.p2p_latency.settings"]
        assert "cpu_placement=client " in settings and "unpinned" not in settings, settings
    pytester.makepyfile(test_perf=CI_SUITE.replace("{delay}", "3ms"))
    slowed = pytester.runpytest(*STEADY, *gate)
    slowed.assert_outcomes(failed=1)
    slowed.stdout.fnmatch_lines(["*regression: test_perf.py::test_echo?lo? p2p_latency.1KiB.p50*"])


PS_SUITE = """
import pytest

@pytest.mark.ps_topology(ps=1, workers=1)
@pytest.mark.message_profile(["64KiB"])
def test_ps(tfgrpc, ps_cluster):
    tfgrpc.ps_throughput(ps_cluster, iterations=60, warmup=5)
"""


def test_ps_figures_are_gated_across_runs_not_samples(pytester: pytest.Pytester) -> None:
    """PS figures have no rounds: against a history of >= 3 runs the run is the replicate, so
    drift between runs (which a test across samples calls significant) does not fail."""
    pytester.makepyfile(test_gated_ps_suite=PS_SUITE)  # not tests/test_ps.py's module name
    for i in range(3):
        pytester.runpytest(f"--junitxml=main-runs/run-{i}.xml").assert_outcomes(passed=1)
    # A generous tolerance: the test is about which test judges the figures; whether drift
    # passes it is tested on figures with known spreads (test_gate_replication.py), not on
    # what a loaded machine happens to measure here.
    pr = pytester.runpytest(
        "--junitxml=pr.xml", "--tfgrpc-baseline=main-runs", "--tfgrpc-max-regression=200%"
    )
    assert pr.ret == pytest.ExitCode.OK, pr.stdout.str()[-3000:]
    reasons = cases_properties(pytester.path / "pr.xml")
    throughput = reasons["tfgrpc.ps_throughput.64KiB.throughput.verdict_reason"]
    assert "t-test across 3 baseline runs' figures (no rounds)" in throughput
    assert "Mann-Whitney" not in throughput


NATIVE_SUITE = """
import pytest

@pytest.mark.message_profile(["1KiB"])
def test_native(tfgrpc, tensor_server):
    tfgrpc.p2p_latency(tensor_server, engine="native")
"""


@pytest.mark.skipif(native.unavailable_reason() is not None, reason="native engine not built")
def test_a_native_result_has_no_rounds_and_is_gated_on_its_samples(
    pytester: pytest.Pytester,
) -> None:
    # The native engine times one run, not rounds: its figures fall back to the sample test,
    # as PS figures do, and their verdicts are written as the summary and HTML read them.
    pytester.makepyfile(test_perf=NATIVE_SUITE)
    pytester.runpytest(*QUICK, "--junitxml=base.xml").assert_outcomes(passed=1)
    result = pytester.runpytest(*QUICK, *WIDE, "--junitxml=new.xml", "--tfgrpc-baseline=base.xml")
    result.assert_outcomes(passed=1)
    got = cases_properties(pytester.path / "new.xml")
    assert "tfgrpc.p2p_latency.1KiB.rounds" not in got
    assert got["tfgrpc.p2p_latency.1KiB.p50.verdict"] in ("pass", "improvement"), got
    assert "rounds" not in got["tfgrpc.p2p_latency.1KiB.p50.verdict_reason"]
    for field in ("change", "detectable"):
        text = got[f"tfgrpc.p2p_latency.1KiB.p50.{field}"]
        # Significant digits only: no binary-float noise like 0.30000000000000004.
        assert len(text.lstrip("-0.").replace(".", "")) <= 6, text
    assert suite_properties(pytester.path / "new.xml")["tfgrpc.gate.compared"] != ["0"]
