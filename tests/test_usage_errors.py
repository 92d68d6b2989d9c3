"""Usage errors at start (exit code 4, one line that leads with the cause and names the option,
ini key or marker and its value), for what a run names and cannot do: engines that are unknown
or unavailable, tolerances that are malformed or have no baseline to apply to; budgets naming a
metric the test's benchmarks never record fail the test at setup, before anything is measured;
mistyped marker arguments are answered with the argument meant."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_tfgrpc import native
from pytest_tfgrpc.metrics import GATED as GATED_METRICS
from pytest_tfgrpc.metrics import budget_metrics_of
from pytest_tfgrpc.ps.tf_cluster import find_tf_python

ENGINES = "registered engines: grpcio, native, tensorflow"
P2P_TEST = "def test_x(tfgrpc, tensor_server):\n    pass\n"
MISSING_ENGINE = """
from pytest_tfgrpc.bench.engines.grpcio import GrpcioEngine


def pytest_tfgrpc_add_engines(registry):
    missing = GrpcioEngine()  # an engine whose library is not installed here
    missing.name = "missing"
    missing.unavailable = lambda: "libmissing is not installed: pip install missing"
    registry.add(missing)
"""


def _usage_error(result: pytest.RunResult, message: str) -> None:
    """The run stopped before any test with one ``ERROR:`` line: ``message`` (the whole
    line after ``ERROR: ``)."""
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    errors = [line for line in result.stderr.lines if line.startswith("ERROR:")]
    assert errors == [f"ERROR: {message}"], result.stderr.str()
    out = result.stderr.str() + result.stdout.str()
    assert "Traceback" not in out
    assert not re.search(r"\d+ (passed|failed|skipped|error)", out), out


WITH_MISSING = "registered engines: missing, grpcio, native, tensorflow"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("nativ", f"unknown engine 'nativ'; {WITH_MISSING}; did you mean 'native'?"),
        ("GRPCIO", f"unknown engine 'GRPCIO'; {WITH_MISSING}; did you mean 'grpcio'?"),
        (
            "grpcio,tensorflw",
            f"unknown engine 'tensorflw'; {WITH_MISSING}; did you mean 'tensorflow'?",
        ),
        ("rust", f"unknown engine 'rust'; {WITH_MISSING}"),
        (
            "grpcio,missing",
            "engine 'missing' unavailable: libmissing is not installed: pip install missing",
        ),
    ],
)
def test_an_engine_the_command_line_names_must_exist_and_be_available(
    pytester: pytest.Pytester, value: str, message: str
) -> None:
    pytester.makeconftest(MISSING_ENGINE)
    pytester.makepyfile(P2P_TEST)
    result = pytester.runpytest("-p", "no:cacheprovider", f"--tfgrpc-engines={value}")
    _usage_error(result, f"--tfgrpc-engines={value}: {message}")


def test_an_empty_engine_option_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(P2P_TEST)
    result = pytester.runpytest("-p", "no:cacheprovider", "--tfgrpc-engines=")
    _usage_error(result, "--tfgrpc-engines: give engine names such as 'grpcio', 'tensorflow'")


def test_an_engine_the_ini_file_names_is_checked_too(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ntfgrpc_engines = grpcio nativ\n")
    pytester.makepyfile(P2P_TEST)
    result = pytester.runpytest("-p", "no:cacheprovider")
    _usage_error(
        result,
        f"ini tfgrpc_engines = grpcio nativ: unknown engine 'nativ'; {ENGINES}; "
        "did you mean 'native'?",
    )


def test_an_unbuilt_native_engine_on_the_command_line_is_a_usage_error(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(native.CACHE_ENV, str(tmp_path))  # a cache without the build
    reason = native.unavailable_reason()
    assert reason is not None and "tfgrpc-build-native" in reason
    pytester.makepyfile(P2P_TEST)
    result = pytester.runpytest("-p", "no:cacheprovider", "--tfgrpc-engines=native")
    _usage_error(result, f"--tfgrpc-engines=native: engine 'native' unavailable: {reason}")


def test_tensorflow_not_installed_on_the_command_line_is_a_usage_error(
    pytester: pytest.Pytester,
) -> None:
    tf_python, why = find_tf_python()
    if tf_python is not None:
        pytest.skip("TensorFlow is installed here")
    pytester.makepyfile(P2P_TEST)
    result = pytester.runpytest("-p", "no:cacheprovider", "--tfgrpc-engines=grpcio,tensorflow")
    _usage_error(
        result, f"--tfgrpc-engines=grpcio,tensorflow: engine 'tensorflow' unavailable: {why}"
    )


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        ("tfgrpc_engines('nativ')", f"unknown engine 'nativ'; {ENGINES}; did you mean 'native'?"),
        (
            "tfgrpc_engines('grpcio', 'Native')",
            f"unknown engine 'Native'; {ENGINES}; did you mean 'native'?",
        ),
        ("tfgrpc_engines(server='rust')", f"unknown engine 'rust'; {ENGINES}"),
        (
            "tfgrpc_engines('grpcio', server='grcpio')",
            f"unknown engine 'grcpio'; {ENGINES}; did you mean 'grpcio'?",
        ),
    ],
)
def test_an_engine_a_marker_names_must_exist_naming_the_test(
    pytester: pytest.Pytester, marker: str, message: str
) -> None:
    pytester.makepyfile(
        f"import pytest\n\n@pytest.mark.{marker}\ndef test_x(tfgrpc, tensor_server):\n    pass\n"
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    test = "test_an_engine_a_marker_names_must_exist_naming_the_test.py::test_x"
    _usage_error(result, f"{test}: {marker}: {message}")


NO_BASELINE = (
    "no baseline to gate against; give --tfgrpc-baseline PATH (a JUnit XML, a directory of "
    "them or a --tfgrpc-results file) or drop {flag}"
)
GATED = f"gated metrics are {', '.join(GATED_METRICS)}"
PERCENTAGE = "expected a percentage such as '10%' (relative to the baseline value)"


@pytest.mark.parametrize("baseline", [False, True], ids=["no-baseline", "baseline"])
@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("10", f"cannot read tolerance '10': {PERCENTAGE}"),
        ("10ms", f"cannot read tolerance '10ms': {PERCENTAGE}"),
        ("p95:10%", f"cannot read tolerance 'p95:10%': unknown metric 'p95'; {GATED}"),
        ("P99:10%", f"cannot read tolerance 'P99:10%': unknown metric 'P99'; {GATED}"),
        ("", "empty tolerance: expected '10%' or 'METRIC:10%', e.g. 'p99:10%'"),
        ("-5%", "cannot read tolerance '-5%': the percentage must be a finite number >= 0"),
    ],
)
def test_a_malformed_tolerance_is_a_usage_error_with_or_without_a_baseline(
    pytester: pytest.Pytester, value: str, message: str, baseline: bool
) -> None:
    pytester.makepyfile("def test_x(tfgrpc_fabric):\n    pass\n")
    args = ["--tfgrpc-baseline=nosuch.xml"] if baseline else []
    result = pytester.runpytest("-p", "no:cacheprovider", *args, f"--tfgrpc-max-regression={value}")
    suggestion = {"p95": "; did you mean 'p99'?", "P99": "; did you mean 'p99'?"}
    message += suggestion.get(value.split(":")[0], "")
    _usage_error(result, f"--tfgrpc-max-regression: {message}")


@pytest.mark.parametrize(
    ("option", "flag"),
    [
        ("--tfgrpc-max-regression=10%", "--tfgrpc-max-regression"),
        ("--tfgrpc-max-regression=p99:20%", "--tfgrpc-max-regression"),
        ("--tfgrpc-alpha=0.01", "--tfgrpc-alpha"),
        ("--tfgrpc-inconclusive=fail", "--tfgrpc-inconclusive"),
        ("--tfgrpc-missing=warn", "--tfgrpc-missing"),
    ],
)
def test_a_gate_option_without_a_baseline_is_a_usage_error(
    pytester: pytest.Pytester, option: str, flag: str
) -> None:
    pytester.makepyfile("def test_x(tfgrpc_fabric):\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", option)
    _usage_error(result, f"{option}: {NO_BASELINE.format(flag=flag)}")


def test_an_ini_tolerance_waits_for_a_baseline_but_must_read(pytester: pytest.Pytester) -> None:
    # A project's standing tolerance applies to the runs that give a baseline (CI), not to
    # every local run; a malformed one is an error in every run.
    pytester.makepyfile("def test_x(tfgrpc_fabric):\n    pass\n")
    pytester.makeini("[pytest]\ntfgrpc_max_regression = p99:20% 5%\n")
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)
    pytester.makeini("[pytest]\ntfgrpc_max_regression = 5\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    _usage_error(result, f"ini tfgrpc_max_regression: cannot read tolerance '5': {PERCENTAGE}")


#: Tests, each with its one server fixture (or none) and its budget marker's arguments.
BUDGET_TESTS = {
    "test_p2p_step": ("tensor_server", 'step_p50="5ms"'),
    "test_p2p_rpc_rate": ("tensor_server", 'p99="5ms", rpc_rate=">=100"'),
    "test_p2p_imbalance": ("tensor_server", 'imbalance="<=1.2"'),
    "test_ps_throughput_p50": ("ps_cluster", 'throughput_p50=">=1 MB/s"'),
    "test_ps_efficiency": ("ps_cluster", 'efficiency=">=0.5"'),
    "test_ps_wrong_case": ("ps_cluster", 'Step_p50="5ms"'),
    "test_ps_fine": ("ps_cluster", 'p50="5ms", step_rate=">=1", imbalance="<=2"'),
    # A test without a server fixture may measure anything: not checked.
    "test_remote": ("", 'step_p50="5ms"'),
}
BUDGETS = "import pytest\n" + "".join(
    f"\n@pytest.mark.budget({budget})\ndef {test}(tfgrpc{', ' * bool(fixture)}{fixture}):\n"
    "    pass\n"
    for test, (fixture, budget) in BUDGET_TESTS.items()
)
P2P_METRICS = (
    f"it uses tensor_server: p2p_latency, p2p_bandwidth record "
    f"{', '.join(budget_metrics_of(('p2p_latency', 'p2p_bandwidth')))}"
)
PS_METRICS = (
    f"it uses ps_cluster: ps_throughput, sync_sgd_step, allreduce record "
    f"{', '.join(budget_metrics_of(('ps_throughput', 'sync_sgd_step', 'allreduce')))}"
)


def test_a_budget_on_a_metric_the_tests_benchmarks_never_record_fails_at_setup(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(BUDGETS)
    result = pytester.runpytest("-p", "no:cacheprovider", "-q", "--tb=line")
    result.assert_outcomes(passed=2, errors=6)
    for test, message in (
        (
            "test_p2p_step",
            "@pytest.mark.budget step_p50='5ms': no benchmark of this test records "
            f"'step_p50' ({P2P_METRICS}); did you mean 'p50'?",
        ),
        (
            "test_p2p_rpc_rate",
            "@pytest.mark.budget rpc_rate='>=100': no benchmark of this test records "
            f"'rpc_rate' ({P2P_METRICS})",
        ),
        (
            "test_p2p_imbalance",
            "@pytest.mark.budget imbalance='<=1.2': no benchmark of this test records "
            f"'imbalance' ({P2P_METRICS})",
        ),
        (
            "test_ps_throughput_p50",
            "@pytest.mark.budget throughput_p50='>=1 MB/s': no benchmark of this test records "
            f"'throughput_p50' ({PS_METRICS}); did you mean 'throughput'?",
        ),
        (
            "test_ps_efficiency",
            "@pytest.mark.budget efficiency='>=0.5': no benchmark of this test records "
            f"'efficiency' ({PS_METRICS})",
        ),
        ("test_ps_wrong_case", "@pytest.mark.budget: unknown budget metric 'Step_p50'"),
    ):
        # The cause, whole, right under the test's header: nothing was started or measured.
        result.stdout.fnmatch_lines([f"*ERROR at setup of {test}*", message + "*"])
    result.stdout.fnmatch_lines(["*unknown budget metric 'Step_p50'*did you mean 'step_p50'?"])


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        (
            "message_profile(['1KiB'], sclae=0.5)",
            "@pytest.mark.message_profile: unknown argument 'sclae'; it takes name, sizes, "
            "scheme, scale, max_tensors, name_filter, buffers, classes, bias, seed, size_range; "
            "did you mean 'scale'?",
        ),
        (
            "message_profile('resnet50', Scale=0.1)",
            "@pytest.mark.message_profile: unknown argument 'Scale'; it takes name, sizes, "
            "scheme, scale, max_tensors, name_filter, buffers, classes, bias, seed, size_range; "
            "did you mean 'scale'?",
        ),
        (
            "ps_topology(worker=2)",
            "@pytest.mark.ps_topology: unknown argument 'worker'; it takes ps, workers, "
            "sharding; did you mean 'workers'?",
        ),
        (
            "ps_topology(topology=2)",
            "@pytest.mark.ps_topology: unknown argument 'topology'; it takes ps, workers, sharding",
        ),
        (
            "tfgrpc_run(iteration=5)",
            "unknown run setting 'iteration' from @pytest.mark.tfgrpc_run; the settings are "
            "iterations, warmup, max_seconds, warmup_seconds, duration; did you mean 'iterations'?",
        ),
        (
            "budget(p95='2ms')",
            "@pytest.mark.budget: unknown budget metric 'p95'",
        ),
    ],
)
def test_a_mistyped_marker_argument_is_answered_with_the_one_meant(
    pytester: pytest.Pytester, marker: str, message: str
) -> None:
    pytester.makepyfile(
        f"import pytest\n\n@pytest.mark.{marker}\ndef test_x(tfgrpc, tensor_server):\n    pass\n"
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "--tb=line")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*ERROR at setup of test_x*", message + "*"])


def test_a_mistyped_engines_marker_argument_is_a_usage_error_with_the_one_meant(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        "import pytest\n\n@pytest.mark.tfgrpc_engines(sever='native')\n"
        "def test_x(tfgrpc, tensor_server):\n    pass\n"
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    _usage_error(
        result,
        "test_a_mistyped_engines_marker_argument_is_a_usage_error_with_the_one_meant.py::test_x:"
        " tfgrpc_engines() takes server=..., got sever; did you mean 'server'?",
    )


def test_under_xdist_a_usage_error_fails_each_test_with_the_line(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pytest-xdist's controller takes a worker's usage error for a crash (INTERNALERROR): the
    # workers fail each tfgrpc test at setup with the same one line instead, without waiting
    # for the host's measurement lock, which another measurement holds here all along.
    import fcntl

    lock = pytester.path / "held" / "host.lock"
    lock.parent.mkdir(mode=0o700)
    monkeypatch.setenv("TFGRPC_HOST_LOCK", str(lock))
    monkeypatch.setenv("TFGRPC_HOST_LOCK_WAIT", "300")
    pytester.makepyfile(P2P_TEST + "\n\ndef test_y(tfgrpc, tensor_server):\n    pass\n")
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        result = pytester.runpytest_subprocess(
            "-p", "no:cacheprovider", "-n", "2", "--tfgrpc-engines=nativ", timeout=120
        )
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["--tfgrpc-engines=nativ: unknown engine 'nativ'; *"])
