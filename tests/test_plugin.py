"""The plugin end to end: real servers on loopback, real figures, JUnit read back."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest
from conftest import pid_alive
from junitparser.xunit2 import JUnitXml


def properties(xml_path: Path) -> dict[str, dict[str, str]]:
    """{testcase name: {property name: value}} of a JUnit file."""
    out: dict[str, dict[str, str]] = {}
    for suite in JUnitXml.fromfile(str(xml_path)):
        for case in suite:
            out[case.name] = {p.name: p.value for p in case.properties()}  # type: ignore[attr-defined]
    return out


def outcome(xml_path: Path, name: str) -> str:
    for suite in JUnitXml.fromfile(str(xml_path)):
        for case in suite:
            if case.name == name:
                if case.is_passed:
                    return "passed"
                return type(case.result[0]).__name__.lower()
    raise KeyError(name)


SUITE = """
import pytest
from pytest_tfgrpc import assert_budget

@pytest.mark.message_profile(["4B", "1KiB"])
def test_latency(tfgrpc, tensor_server):
    result = tfgrpc.p2p_latency(tensor_server)
    assert [s.size_bytes for s in result.sizes] == [4, 1024]
    assert result.fabric == "lo" and result.rpc == "unary" and result.mode == "raw"
    assert_budget(result, p50="10s")

@pytest.mark.message_profile("64KiB..128KiB")
def test_bandwidth(tfgrpc, tensor_server):
    result = tfgrpc.p2p_bandwidth(tensor_server, mode="protobuf")
    assert [s.size_bytes for s in result.sizes] == [65536, 131072]
    assert_budget(result, throughput=">=1 KB/s")
"""


def test_help_lists_options_and_markers(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(
        ["*--tfgrpc-fabric=NAME*", "*--fabric=NAME*", "*short for --tfgrpc-fabric*"]
    )
    result.stdout.fnmatch_lines(["*--tfgrpc-iterations=N*", "*--tfgrpc-tls-cert=FILE*"])
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(
        ["@pytest.mark.message_profile(*", "@pytest.mark.budget(**limits)*"]
    )


def test_figures_reach_junit_per_size_and_fabric(
    pytester: pytest.Pytester, quick: tuple[str, ...]
) -> None:
    pytester.makepyfile(SUITE)
    xml = pytester.path / "perf.xml"
    result = pytester.runpytest(*quick, f"--junitxml={xml}", "-W", "error")
    result.assert_outcomes(passed=2)
    assert "PytestWarning" not in result.stdout.str()
    props = properties(xml)
    latency = props["test_latency[lo]"]
    assert latency["tfgrpc.fabric"] == "lo"
    assert re.fullmatch(r"127\.0\.0\.1:\d+", latency["tfgrpc.target"])
    assert latency["tfgrpc.p2p_latency.rpc"] == "unary"
    for size in ("4B", "1KiB"):
        assert latency[f"tfgrpc.p2p_latency.{size}.samples"] == "30"
        p50 = float(latency[f"tfgrpc.p2p_latency.{size}.p50_us"])
        p99 = float(latency[f"tfgrpc.p2p_latency.{size}.p99_us"])
        assert 0 < float(latency[f"tfgrpc.p2p_latency.{size}.min_us"]) <= p50 <= p99
    assert not any("throughput" in name for name in latency)
    # the CPU time both ends spent measuring each size
    for end in ("client", "server"):
        for kind in ("user", "system"):
            assert float(latency[f"tfgrpc.p2p_latency.1KiB.{end}_cpu_{kind}_us"]) >= 0
    busy = sum(
        float(latency[f"tfgrpc.p2p_latency.1KiB.server_cpu_{k}_us"]) for k in ("user", "system")
    )
    assert busy > 0
    bandwidth = props["test_bandwidth[lo]"]
    assert bandwidth["tfgrpc.p2p_bandwidth.mode"] == "protobuf"
    for size in ("64KiB", "128KiB"):
        mbps = float(bandwidth[f"tfgrpc.p2p_bandwidth.{size}.throughput_MBps"])
        mean_us = float(bandwidth[f"tfgrpc.p2p_bandwidth.{size}.mean_us"])
        # throughput is the bytes moved over the time measured: the mean says the same
        size_bytes = 65536 if size == "64KiB" else 131072
        assert mbps == pytest.approx(size_bytes / mean_us, rel=1e-5)  # 6 significant digits
    result.stdout.fnmatch_lines(
        [
            "*= tfgrpc =*",
            "test*benchmark*size*fabric*p50*p99*throughput*samples*",
            "*::test_bandwidth *p2p_bandwidth*64KiB*lo*/s*30*",
            "*::test_latency *p2p_latency*4B*lo*30*",
        ]
    )


def test_budget_breach_fails_the_test_with_a_table(
    pytester: pytest.Pytester, quick: tuple[str, ...]
) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.message_profile(["1KiB"])
        @pytest.mark.budget(p50="1ns", max="10s")
        def test_too_strict(tfgrpc, tensor_server):
            tfgrpc.p2p_latency(tensor_server)

        def test_other():
            pass
        """
    )
    xml = pytester.path / "perf.xml"
    result = pytester.runpytest(*quick, f"--junitxml={xml}")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*p2p_latency on fabric lo*1 of 2 budget checks failed*",
            "*size*metric*measured*budget*margin*samples*fabric*",
            "*1KiB*p50*<= 1*ns*30*lo*",
        ]
    )
    assert outcome(xml, "test_too_strict[lo]") == "failure"
    # the figures that breached the budget are still in the XML
    assert "tfgrpc.p2p_latency.1KiB.p50_us" in properties(xml)["test_too_strict[lo]"]


def test_unknown_fabric_is_a_usage_error_listing_interfaces(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(tensor_server): pass")
    result = pytester.runpytest("--fabric=lo,nosuch0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown fabric 'nosuch0'*interfaces here:*lo*"])


@pytest.mark.parametrize(
    ("marker", "expected"),
    [
        ('message_profile(["4Q"])', "profile argument 1=['4Q']: cannot read '4Q' as a size"),
        ('message_profile(sizes="1KiB..1B")', "message_profile sizes='1KiB..1B': "),
        ('message_profile(["1KiB"], shape=3)', "message_profile: unknown argument 'shape'"),
        ('budget(p99="fast")', "@pytest.mark.budget: budget p99='fast': "),
        ('budget(p98="1ms")', "unknown budget metric 'p98'"),
        ('budget(rpc_rate="fast")', "@pytest.mark.budget: budget rpc_rate='fast': "),
        ('budget(imbalance=float("nan"))', "@pytest.mark.budget: budget imbalance=nan: "),
        ('budget(step_p99="inf ms")', "@pytest.mark.budget: budget step_p99='inf ms': "),
        ('message_profile("resnet50", scale=2)', "profile argument scale=2: scale must be in"),
        ('message_profile("resnet50", max_tensors=0)', "profile argument max_tensors=0: "),
        ('message_profile("resnet50", name_filter="(")', "argument name_filter='(': "),
        ('message_profile("nosuchnet", scale=0.5)', "profile argument name='nosuchnet': "),
    ],
)
def test_malformed_markers_lead_with_the_cause_and_blame_the_argument(
    pytester: pytest.Pytester,
    quick: tuple[str, ...],
    marker: str,
    expected: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # the one-line summary cuts to the terminal's width
    pytester.makepyfile(
        test_m=f"""
        import pytest

        @pytest.mark.{marker}
        def test_marked(tfgrpc, tensor_server):
            tfgrpc.p2p_latency(tensor_server)

        @pytest.mark.message_profile(["4B"])
        def test_fine(tfgrpc, tensor_server):
            tfgrpc.p2p_latency(tensor_server)
        """
    )
    xml = pytester.path / "perf.xml"
    result = pytester.runpytest(*quick, f"--junitxml={xml}")
    result.assert_outcomes(passed=1, errors=1)
    lines = result.stdout.str().splitlines()
    # pytest's one-line summary names the test; the message after it leads with the cause.
    summary = "ERROR test_m.py::test_marked[lo] - Failed: @pytest.mark."
    assert any(line.startswith(summary) and expected in line for line in lines), lines
    assert "During handling" not in result.stdout.str()
    assert "tfgrpc.p2p_latency.4B.p50_us" in properties(xml)["test_fine[lo]"]


@pytest.mark.parametrize(
    ("marker", "meant"),
    [
        ('budjet(p99="1ns")', "budget"),
        ('message_profil(["4B"])', "message_profile"),
        ("ps_toplogy(ps=2)", "ps_topology"),
        ("tfgrpc_runs(iterations=5)", "tfgrpc_run"),
        ('tfgrpc_engine_("grpcio")', "tfgrpc_engines"),
    ],
)
def test_a_misspelled_marker_fails_its_test_naming_the_one_meant(
    pytester: pytest.Pytester,
    quick: tuple[str, ...],
    marker: str,
    meant: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # pytest ignores an unknown marker with a warning: a misspelled budget would pass unchecked.
    monkeypatch.setenv("COLUMNS", "400")
    pytester.makepyfile(
        test_m=f"""
        import pytest

        @pytest.mark.message_profile(["4B"])
        @pytest.mark.{marker}
        def test_marked(tfgrpc, tensor_server):
            tfgrpc.p2p_latency(tensor_server)

        @pytest.mark.message_profile(["4B"])
        @pytest.mark.slow_path  # not close to a tfgrpc marker: pytest's warning only
        def test_fine(tfgrpc, tensor_server):
            tfgrpc.p2p_latency(tensor_server)
        """
    )
    result = pytester.runpytest(*quick)
    result.assert_outcomes(passed=1, errors=1)
    name = marker.split("(")[0]
    result.stdout.fnmatch_lines(
        [
            f"ERROR test_m.py::test_marked[[]lo[]] - Failed: unknown marker @pytest.mark.{name}:"
            f" did you mean @pytest.mark.{meant}? *"
        ]
    )


def test_a_registered_marker_close_to_ours_is_left_alone(
    pytester: pytest.Pytester, quick: tuple[str, ...]
) -> None:
    pytester.makeini("[pytest]\nmarkers =\n    budgets: the project's own marker\n")
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.budgets
        @pytest.mark.message_profile(["4B"])
        def test_own(tfgrpc, tensor_server):
            tfgrpc.p2p_latency(tensor_server)
        """
    )
    pytester.runpytest(*quick).assert_outcomes(passed=1)


def test_a_server_killed_mid_test_fails_that_test_only(
    pytester: pytest.Pytester, quick: tuple[str, ...]
) -> None:
    pytester.makepyfile(
        """
        import os, signal, threading, pytest

        @pytest.mark.message_profile(["1KiB"])
        def test_killed(tfgrpc, tensor_server, tmp_path_factory):
            (tmp_path_factory.getbasetemp() / "pid").write_text(str(tensor_server.pid))
            threading.Timer(0.5, os.kill, (tensor_server.pid, signal.SIGKILL)).start()
            tfgrpc.p2p_latency(tensor_server, iterations=10**6, duration=20, max_seconds=20)

        @pytest.mark.message_profile(["1KiB"])
        def test_survivor(tfgrpc, tensor_server):
            tfgrpc.p2p_latency(tensor_server)
        """
    )
    xml = pytester.path / "perf.xml"
    basetemp = pytester.path / "bt"
    result = pytester.runpytest(*quick, f"--junitxml={xml}", "--basetemp", str(basetemp))
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*ServerDied: tensor server on lo exited with signal 9 (SIGKILL)*"]
    )
    assert outcome(xml, "test_killed[lo]") == "failure"
    assert "tfgrpc.p2p_latency.1KiB.p99_us" in properties(xml)["test_survivor[lo]"]
    assert not pid_alive(int((basetemp / "pid").read_text()))


def test_a_server_that_dies_unnoticed_still_fails_its_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import os, signal, time

        def test_dies(tensor_server):
            os.kill(tensor_server.pid, signal.SIGTERM)
            time.sleep(0.5)
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*exited with signal 15 (SIGTERM) while in use*"])


def test_payload_schemes_record_the_buffers_they_sent(
    pytester: pytest.Pytester, quick: tuple[str, ...]
) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.message_profile(scheme="skew")
        def test_skew(tfgrpc, tensor_server):
            result = tfgrpc.p2p_bandwidth(tensor_server, mode="protobuf")
            assert result.sizes[0].buffers == (10,) + (10_000,) * 3 + (1_000_000,) * 6

        @pytest.mark.message_profile(scheme="random", classes="small,medium", seed=7)
        def test_random(tfgrpc, tensor_server):
            tfgrpc.p2p_latency(tensor_server)
        """
    )
    xml = pytester.path / "perf.xml"
    result = pytester.runpytest(*quick, f"--junitxml={xml}")
    result.assert_outcomes(passed=2)
    skew = properties(xml)["test_skew[lo]"]
    assert skew["tfgrpc.p2p_bandwidth.skew-10x.bytes"] == "6030010"
    assert skew["tfgrpc.p2p_bandwidth.skew-10x.buffers"] == ",".join(
        ["10"] + ["10000"] * 3 + ["1000000"] * 6
    )
    assert float(skew["tfgrpc.p2p_bandwidth.skew-10x.throughput_MBps"]) > 0
    random = properties(xml)["test_random[lo]"]
    (key,) = {name.rsplit(".", 1)[0] for name in random if name.endswith(".buffers")}
    sizes = [int(n) for n in random[f"{key}.buffers"].split(",")]
    assert len(sizes) == 10 and {10, 10_000} == set(sizes)
    assert sum(sizes) == int(random[f"{key}.bytes"])
    assert random[f"{key}.samples"] == "30"


ALLOCATOR_PROBE = """
import grpc
from pytest_tfgrpc.wire import grpc_settings
from pytest_tfgrpc.wire._proto import service_pb2

def test_probe(tfgrpc, tensor_server, record_property):
    result = tfgrpc.p2p_latency(tensor_server, ["1KiB"])
    with grpc.insecure_channel(tensor_server.target) as channel:
        reply = channel.unary_unary(grpc_settings.method("raw", "Status"))(b"", timeout=5)
    env = service_pb2.ServerStatus.FromString(reply).environment
    print("SERVER-ENV", dict(env))
    print("CLIENT", dict(result.settings))
"""


@pytest.mark.parametrize("policy", ["tuned", "default"])
def test_the_allocator_policy_reaches_servers_and_results(
    pytester: pytest.Pytester, quick: tuple[str, ...], policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
        monkeypatch.delenv(name, raising=False)
    pytester.makepyfile(ALLOCATOR_PROBE)
    xml = pytester.path / "perf.xml"
    result = pytester.runpytest_subprocess(
        *quick, f"--tfgrpc-allocator={policy}", f"--junitxml={xml}", "-s"
    )
    result.assert_outcomes(passed=1)
    out = result.stdout.str()
    settings = properties(xml)["test_probe[lo]"]["tfgrpc.p2p_latency.settings"]
    if policy == "tuned":
        assert "'MALLOC_MMAP_THRESHOLD_': '33554432'" in out
        assert "mallopt.M_MMAP_THRESHOLD=33554432" in settings
        assert "'allocator': 'tuned'" in out
    else:
        server_env = next(line for line in out.splitlines() if "SERVER-ENV" in line)
        assert "MALLOC" not in server_env and "mallopt" not in server_env, server_env
        assert "'allocator': 'default'" in server_env
        assert "mallopt" not in settings
    assert "iterations=30" in settings and "grpcio=" in settings


def test_the_transport_floor_is_measured_beside_on_request(
    pytester: pytest.Pytester, quick: tuple[str, ...]
) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.message_profile(["1KiB", "64KiB"])
        def test_latency(tfgrpc, tensor_server):
            tfgrpc.p2p_latency(tensor_server, floor=True)

        @pytest.mark.message_profile(["1MiB"])
        def test_bandwidth(tfgrpc, tensor_server):
            tfgrpc.p2p_bandwidth(tensor_server, floor=True)
        """
    )
    xml = pytester.path / "perf.xml"
    pytester.runpytest(*quick, f"--junitxml={xml}").assert_outcomes(passed=2)
    latency = properties(xml)["test_latency[lo]"]
    assert latency["tfgrpc.p2p_latency_floor.rpc"] == "tcp-pingpong"
    for size in ("1KiB", "64KiB"):
        assert latency[f"tfgrpc.p2p_latency_floor.{size}.samples"] == "30"
        assert float(latency[f"tfgrpc.p2p_latency_floor.{size}.p50_us"]) > 0
    assert not any(n.startswith("tfgrpc.p2p_latency_floor.") and "throughput" in n for n in latency)
    bandwidth = properties(xml)["test_bandwidth[lo]"]
    assert bandwidth["tfgrpc.p2p_bandwidth_floor.rpc"] == "tcp-push-ack"
    assert float(bandwidth["tfgrpc.p2p_bandwidth_floor.1MiB.throughput_MBps"]) > 0
    # Every result says where both of its ends ran, the floor's too.
    here = socket.gethostname()
    for label in ("p2p_bandwidth", "p2p_bandwidth_floor"):
        ends = f"client={here}@127.0.0.1 server={here}@127.0.0.1"
        assert bandwidth[f"tfgrpc.{label}.ends"] == ends


def test_long_sweeps_report_progress_without_flooding(
    pytester: pytest.Pytester, quick: tuple[str, ...]
) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.message_profile("1KiB..4KiB")
        def test_sweep(tfgrpc, tensor_server):
            tfgrpc.p2p_latency(tensor_server)
        """
    )
    # A real process, with pytest's own fd capture on: the default of the run.
    result = pytester.runpytest_subprocess(*quick)  # a line only after 5 s: none here
    result.assert_outcomes(passed=1)
    assert "size 1 of 3" not in result.stdout.str()
    pytester.makeconftest(
        """
        from pytest_tfgrpc.plugin import fixtures

        fixtures.PROGRESS_EVERY_S = 0.0
        """
    )
    result = pytester.runpytest_subprocess(*quick)  # captured, yet shown
    result.stdout.fnmatch_lines(
        [
            "tfgrpc: *::test_sweep[[]lo[]]: p2p_latency on lo: size 1 of 3 (1KiB)",
            "tfgrpc: *::test_sweep[[]lo[]]: p2p_latency on lo: size 3 of 3 (4KiB), ETA *s",
        ]
    )
    quiet = pytester.runpytest_subprocess(*quick, "-q")
    quiet.assert_outcomes(passed=1)
    assert "size 1 of 3" not in quiet.stdout.str()
    # Under pytest-xdist the worker writes its lines to its stderr, which reaches the terminal.
    spread = pytester.runpytest_subprocess(*quick, "-n", "1")
    spread.assert_outcomes(passed=1)
    spread.stderr.fnmatch_lines(
        ["tfgrpc [[]gw0[]]: *::test_sweep[[]lo[]]: p2p_latency on lo: size 3 of 3 (4KiB), ETA *"]
    )


def test_the_run_marker_makes_a_time_based_run(
    pytester: pytest.Pytester, quick: tuple[str, ...]
) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.tfgrpc_run(duration="0.5s", warmup_seconds=0.1)
        @pytest.mark.message_profile(["1KiB"])
        def test_timed(tfgrpc, tensor_server):
            result = tfgrpc.p2p_latency(tensor_server)
            size = result.sizes[0]
            assert 0.5e9 <= size.elapsed_ns < 0.5e9 + 1e8
            assert size.count > 30  # the options' 30 iterations do not bound a timed run
            assert result.settings["duration_s"] == "0.5"

        @pytest.mark.tfgrpc_run(iterations=7)
        @pytest.mark.message_profile(["1KiB"])
        def test_counted(tfgrpc, tensor_server):
            assert tfgrpc.p2p_latency(tensor_server).sizes[0].count == 7

        @pytest.mark.tfgrpc_run(iterations=0)
        def test_bad(tfgrpc):
            pass
        """
    )
    result = pytester.runpytest(*quick)
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(
        ["iterations=0 from @pytest.mark.tfgrpc_run: expected a whole number >= 1*"]
    )  # the cause first


@pytest.mark.parametrize(
    ("args", "ini", "message"),
    [
        (("--tfgrpc-iterations=x",), "", "iterations='x' from --tfgrpc-iterations: expected*"),
        ((), "tfgrpc_max_seconds = 0", "max_seconds='0' from ini tfgrpc_max_seconds: *"),
    ],
)
def test_a_bad_run_option_is_a_usage_error_naming_its_source(
    pytester: pytest.Pytester, args: tuple[str, ...], ini: str, message: str
) -> None:
    pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile("def test_x(tfgrpc):\n    pass\n")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}"])


def test_an_unknown_run_argument_is_named(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        def test_typo(tfgrpc, tensor_server):
            tfgrpc.p2p_latency(tensor_server, ["1KiB"], iteration=5)
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*unknown run setting 'iteration' from p2p_latency(); the*"])


def test_a_bad_budget_string_shows_no_internal_traceback(
    pytester: pytest.Pytester, quick: tuple[str, ...]
) -> None:
    pytester.makepyfile(
        """
        import pytest
        from pytest_tfgrpc import assert_budget

        @pytest.mark.message_profile(["4B"])
        def test_budget(tfgrpc, tensor_server):
            result = tfgrpc.p2p_latency(tensor_server)
            assert_budget(result, p99="fast")
        """
    )
    result = pytester.runpytest(*quick)
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    result.stdout.fnmatch_lines(["E * pytest_tfgrpc.BudgetError: budget p99='fast': *"])
    assert "report/budget.py" not in out and "bench/driver.py" not in out, out
    assert 'assert_budget(result, p99="fast")' in out  # the test's own line is the one shown


def test_markers_give_their_full_signatures(pytester: pytest.Pytester) -> None:
    from pytest_tfgrpc.plugin.options import MARKERS

    # The marker reference (docs/reference/markers.md) is made from the same registry.
    signatures = [text.split(":")[0] for text in MARKERS.values()]
    assert all(re.fullmatch(r"\w+\(.*\)", s) for s in signatures), signatures
    result = pytester.runpytest("--markers")
    out = result.stdout.str()
    for signature in signatures:
        assert f"@pytest.mark.{signature}:" in out, signature


@pytest.mark.parametrize("junit", [False, True], ids=["no-junitxml", "junitxml"])
def test_the_summary_table_follows_its_rule_with_no_blank_line(
    pytester: pytest.Pytester, quick: tuple[str, ...], junit: bool
) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.message_profile(["4B"])
        def test_rtt(tfgrpc, tensor_server):
            tfgrpc.p2p_latency(tensor_server)
        """
    )
    args = (*quick, "--junitxml=perf.xml") if junit else quick
    lines = pytester.runpytest_subprocess(*args).stdout.lines
    rule = next(i for i, line in enumerate(lines) if re.fullmatch(r"=+ tfgrpc =+", line))
    assert lines[rule + 1].split()[:2] == ["test", "benchmark"], lines[rule - 2 : rule + 3]
