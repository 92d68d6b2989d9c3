"""Engines and hooks end to end: an engine registered from a conftest runs the latency,
bandwidth and PS tests; run metadata from hooks reaches the JUnit suite properties and the
gate's setup check; results reach the result hook; bad engines and metadata are clear errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from junitparser.xunit2 import JUnitXml

EXAMPLE = Path(__file__).parent.parent / "example_suites" / "custom_ps"
#: The count bounds each size (the time limit is far away: a busy machine once cut one at 19).
FAST = (
    "-p",
    "no:cacheprovider",
    "--tfgrpc-iterations=20",
    "--tfgrpc-warmup=2",
    "--tfgrpc-max-seconds=60",
)

RESULT_HOOK = """

def pytest_tfgrpc_result(item, result):
    import json
    with open("results.jsonl", "a") as out:
        out.write(json.dumps({"test": item.nodeid, "label": result.label,
                              "engine": result.settings["engine"],
                              "sizes": [p.label for p in result.sizes]}) + "\\n")
"""

SUITE = """
import pytest

pytestmark = pytest.mark.tfgrpc_engines("myps")

@pytest.mark.message_profile(["1KiB", "64KiB"])
def test_latency(tfgrpc, tensor_server):
    tfgrpc.p2p_latency(tensor_server)

@pytest.mark.message_profile(["64KiB", "1MiB"])
def test_bandwidth(tfgrpc, tensor_server):
    tfgrpc.p2p_bandwidth(tensor_server, label="push")
    tfgrpc.p2p_bandwidth(tensor_server, direction="pull", label="pull")

@pytest.mark.message_profile(["4KiB", "256KiB"])
@pytest.mark.ps_topology(ps=2, workers=1)
def test_ps_sizes(tfgrpc, ps_cluster):
    tfgrpc.ps_throughput(ps_cluster)

@pytest.mark.message_profile("resnet50", scale=0.01)
@pytest.mark.ps_topology(ps=3, workers=1, sharding="greedy")
def test_ps_profile(tfgrpc, ps_cluster):
    result = tfgrpc.ps_throughput(ps_cluster)
    assert result.placement is not None and result.sizes[0].imbalance == result.placement.imbalance
"""


def _cases(xml: Path) -> dict[str, dict[str, str]]:
    return {
        case.name: {p.name: p.value for p in case.properties()}  # type: ignore[attr-defined]
        for suite in JUnitXml.fromfile(str(xml))
        for case in suite
    }


def _suite_properties(xml: Path) -> dict[str, str]:
    suite = next(iter(JUnitXml.fromfile(str(xml))))
    return {p.name: p.value for p in suite.properties()}  # type: ignore[no-untyped-call]


def _with_example_engine(pytester: pytest.Pytester, extra_conftest: str = "") -> None:
    shutil.copy(EXAMPLE / "my_ps.py", pytester.path / "my_ps.py")
    conftest = (EXAMPLE / "conftest.py").read_text() + extra_conftest
    pytester.makeconftest(conftest)


def test_a_conftest_engine_runs_latency_bandwidth_and_ps_tests(pytester: pytest.Pytester) -> None:
    _with_example_engine(pytester, RESULT_HOOK)
    pytester.makepyfile(test_suite=SUITE)
    xml = pytester.path / "perf.xml"
    result = pytester.runpytest_subprocess(*FAST, f"--junitxml={xml}")
    result.assert_outcomes(passed=4)
    cases = _cases(xml)
    for test, labels, sizes in (
        ("test_latency[lo]", ["p2p_latency"], ["1KiB", "64KiB"]),
        ("test_bandwidth[lo]", ["push", "pull"], ["64KiB", "1MiB"]),
        ("test_ps_sizes[lo]", ["ps_throughput"], ["4KiB", "256KiB"]),
        ("test_ps_profile[lo]", ["ps_throughput"], ["resnet50-scale_0p01"]),
    ):
        props = cases[test]
        for label in labels:
            assert "engine=myps" in props[f"tfgrpc.{label}.settings"]
            for size in sizes:
                assert int(props[f"tfgrpc.{label}.{size}.samples"]) == 20
                assert 0 < float(props[f"tfgrpc.{label}.{size}.p50_us"]) < 10e6
    assert "direction=pull" in cases["test_bandwidth[lo]"]["tfgrpc.pull.settings"]
    assert float(cases["test_bandwidth[lo]"]["tfgrpc.pull.1MiB.throughput_MBps"]) > 0
    ps = cases["test_ps_profile[lo]"]
    assert ps["tfgrpc.ps_throughput.topology"] == "3ps_1workers_greedy"
    assert float(ps["tfgrpc.ps_throughput.resnet50-scale_0p01.imbalance"]) >= 1.0
    assert len(ps["tfgrpc.target"].split(",")) == 3
    seen = [json.loads(line) for line in (pytester.path / "results.jsonl").read_text().splitlines()]
    assert sorted((r["test"].split("::")[1], r["label"]) for r in seen) == [
        ("test_bandwidth[lo]", "pull"),
        ("test_bandwidth[lo]", "push"),
        ("test_latency[lo]", "p2p_latency"),
        ("test_ps_profile[lo]", "ps_throughput"),
        ("test_ps_sizes[lo]", "ps_throughput"),
    ]
    assert {r["engine"] for r in seen} == {"myps"}
    assert "my_ps.py" not in _running_commands()


def _running_commands() -> str:
    out = []
    for proc in Path("/proc").iterdir():
        try:
            out.append((proc / "cmdline").read_bytes().decode(errors="replace"))
        except OSError:
            continue
    return "\n".join(out)


def test_several_engines_run_each_test_once_per_engine(pytester: pytest.Pytester) -> None:
    _with_example_engine(pytester)
    pytester.makepyfile(
        """
        def test_echo(tfgrpc, tensor_server):
            tfgrpc.p2p_latency(tensor_server, sizes=["1KiB"])
        """
    )
    xml = pytester.path / "perf.xml"
    result = pytester.runpytest_subprocess(
        *FAST, "--tfgrpc-engines=myps,grpcio", f"--junitxml={xml}"
    )
    result.assert_outcomes(passed=2)
    cases = _cases(xml)
    assert set(cases) == {"test_echo[lo-myps]", "test_echo[lo-grpcio]"}
    for engine in ("myps", "grpcio"):
        assert f"engine={engine}" in cases[f"test_echo[lo-{engine}]"]["tfgrpc.p2p_latency.settings"]


def test_an_engine_in_a_subdirectorys_conftest_is_found(pytester: pytest.Pytester) -> None:
    # An option wakes the plugin before that conftest is loaded: engines are asked for later.
    sub = pytester.mkdir("sub")
    shutil.copy(EXAMPLE / "my_ps.py", sub / "my_ps.py")
    shutil.copy(EXAMPLE / "conftest.py", sub / "conftest.py")
    (sub / "test_sub.py").write_text(
        "import pytest\n\n@pytest.mark.tfgrpc_engines('myps')\n"
        "def test_echo(tfgrpc, tensor_server):\n"
        "    tfgrpc.p2p_latency(tensor_server, sizes=['1KiB'])\n"
    )
    pytester.runpytest_subprocess(*FAST, "--tfgrpc-iterations=10", ".").assert_outcomes(passed=1)


def test_a_hook_chooses_a_tests_engines(pytester: pytest.Pytester) -> None:
    _with_example_engine(
        pytester,
        """

def pytest_tfgrpc_engines(config, item):
    return ["myps"] if "mine" in item.name else None
""",
    )
    pytester.makepyfile(
        """
        def test_mine(tfgrpc, tensor_server):
            assert tfgrpc.engine.name == "myps"

        def test_default(tfgrpc, tensor_server):
            assert tfgrpc.engine.name == "grpcio"
        """
    )
    pytester.runpytest_subprocess(*FAST).assert_outcomes(passed=2)


METADATA = """
def pytest_tfgrpc_run_metadata(config):
    return {"commit": config.getoption("commit"), "nic.firmware": "20.31.1014"}

def pytest_addoption(parser):
    parser.addoption("--commit", default="4f2a9c1")
"""


def test_run_metadata_reaches_the_suite_properties_and_the_gate(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(METADATA)
    pytester.makepyfile(
        """
        def test_echo(tfgrpc, tensor_server):
            tfgrpc.p2p_latency(tensor_server, sizes=["1KiB"])
        """
    )
    base = pytester.path / "base.xml"
    pytester.runpytest_subprocess(*FAST, f"--junitxml={base}").assert_outcomes(passed=1)
    suite = _suite_properties(base)
    assert suite["tfgrpc.meta.extra.commit"] == "4f2a9c1"
    assert suite["tfgrpc.meta.extra.nic.firmware"] == "20.31.1014"
    # Same metadata: no setup mismatch. Another commit: the gate's setup check names it.
    same = pytester.runpytest_subprocess(*FAST, f"--tfgrpc-baseline={base}")
    assert "extra.commit" not in same.stdout.str()
    other = pytester.runpytest_subprocess(
        *FAST,
        f"--tfgrpc-baseline={base}",
        "--commit=77aa000",
        "--tfgrpc-baseline-mismatch=fail",
    )
    assert other.ret == pytest.ExitCode.USAGE_ERROR
    other.stderr.fnmatch_lines(["*another setup: extra.commit: baseline 4f2a9c1, current 77aa000*"])


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ('{"bad key": "x"}', "key 'bad key' is not an identifier"),
        ('{"commit": 7}', "key 'commit': value 7 is not a string"),
        ('["commit"]', "an answer must be a mapping"),
    ],
)
def test_bad_run_metadata_is_a_usage_error(
    pytester: pytest.Pytester, answer: str, message: str
) -> None:
    pytester.makeconftest(f"def pytest_tfgrpc_run_metadata(config):\n    return {answer}\n")
    pytester.makepyfile("def test_x(tfgrpc):\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider")  # refused before any test: in here
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*pytest_tfgrpc_run_metadata: {message}*"])
    assert "INTERNALERROR" not in result.stderr.str() + result.stdout.str()


def test_metadata_given_by_two_hooks_under_one_key_is_a_usage_error(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest("def pytest_tfgrpc_run_metadata(config):\n    return {'k': 'a'}\n")
    sub = pytester.mkpydir("sub")
    (sub / "conftest.py").write_text(
        "def pytest_tfgrpc_run_metadata(config):\n    return {'k': 'b'}\n"
    )
    (sub / "test_x.py").write_text("def test_x(tfgrpc):\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "sub")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*key 'k' is given twice*"])


BAD_ENGINES = """
from pytest_tfgrpc.bench.engines import Engine, Measured


class Negative(Engine):
    name = "negative"

    def start_server(self, provision):
        fabric = provision.fabric

        class Server:
            target = f"{fabric.address}:1"
            def __init__(self):
                self.fabric = fabric
            def died(self, grace=0.5):
                return None
            def stop(self):
                pass
        return Server()

    def echo(self, server, tensor, *, mode, rpc, run):
        return Measured([5, -1])


class Missing(Negative):
    name = "missing"

    def unavailable(self):
        return "libmissing is not installed"


def pytest_tfgrpc_add_engines(registry):
    registry.add(Negative())
    registry.add(Missing())
"""


def test_engines_that_cannot_measure_fail_or_skip_with_the_reason(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(BAD_ENGINES)
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.tfgrpc_engines("negative")
        def test_negative(tfgrpc, tensor_server):
            tfgrpc.p2p_latency(tensor_server, sizes=["1KiB"])

        @pytest.mark.tfgrpc_engines("negative")
        def test_unsupported(tfgrpc, tensor_server):
            tfgrpc.p2p_bandwidth(tensor_server, sizes=["1KiB"])

        @pytest.mark.tfgrpc_engines("negative")
        @pytest.mark.ps_topology(ps=2)
        def test_ps_unsupported(tfgrpc, ps_cluster):
            tfgrpc.ps_throughput(ps_cluster, sizes=["1KiB"])

        @pytest.mark.tfgrpc_engines("missing")
        def test_missing(tfgrpc, tensor_server):
            pass
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(failed=3, skipped=1)
    for line in (
        "*engine 'negative': p2p_latency of 1KiB returned a negative sample*",
        "*engine 'negative' does not measure push bandwidth (push)*",
        "*engine 'negative' does not measure PS exchanges (ps_exchange)*",
        "*engine 'missing' unavailable: libmissing is not installed*",
    ):
        result.stdout.fnmatch_lines([line])
    assert "another exception occurred" not in result.stdout.str()
    assert "INTERNALERROR" not in result.stdout.str()


@pytest.mark.parametrize(
    ("conftest", "message"),
    [
        (
            "from pytest_tfgrpc.bench.engines.grpcio import GrpcioEngine\n"
            "def pytest_tfgrpc_add_engines(registry):\n    registry.add(GrpcioEngine())\n",
            "engine 'grpcio' is registered twice",
        ),
        (
            "def pytest_tfgrpc_add_engines(registry):\n"
            "    registry.add(lambda: None, 'my-engine')\n",
            "engine name 'my-engine': give a non-empty identifier",
        ),
        (
            "def pytest_tfgrpc_add_engines(registry):\n    registry.add(42)\n",
            "engine 42 is neither an Engine nor a factory of one",
        ),
    ],
)
def test_bad_engine_registrations_are_usage_errors(
    pytester: pytest.Pytester, conftest: str, message: str
) -> None:
    pytester.makeconftest(conftest)
    pytester.makepyfile("def test_x(tfgrpc):\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*pytest_tfgrpc_add_engines: {message}*"])


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        ("tfgrpc_engines()", "give engine names"),
        ("tfgrpc_engines('grpcio', 'grpcio')", "engine listed twice"),
        ("tfgrpc_engines(engines=['grpcio'])", "tfgrpc_engines() takes server=..., got engines"),
    ],
)
def test_bad_engine_markers_are_usage_errors(
    pytester: pytest.Pytester, marker: str, message: str
) -> None:
    pytester.makepyfile(f"import pytest\n\n@pytest.mark.{marker}\ndef test_x(tfgrpc):\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}*"])


BARE_ECHO = """
import grpc

from pytest_tfgrpc import Engine, Measured


class BareEcho(Engine):
    name = "bare_echo"

    def start_server(self, provision):
        raise AssertionError("a client-only engine here: the test's engine serves")

    def echo(self, server, tensor, *, mode, rpc, run):
        with grpc.insecure_channel(server.target) as channel:
            call = channel.unary_unary("/tfgrpc.RawTensorService/Echo")
            return Measured.timed(lambda: call(tensor.content), run)


class Missing(BareEcho):
    name = "missing"

    def unavailable(self):
        return "not built: run build-missing"


def pytest_tfgrpc_add_engines(registry):
    registry.add(BareEcho())
    registry.add(Missing())
"""


def test_a_call_can_measure_with_another_engines_client(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(BARE_ECHO)
    pytester.makepyfile(
        """
        import pytest

        def test_mixed(tfgrpc, tensor_server):
            tfgrpc.p2p_latency(tensor_server, sizes=["1KiB"], label="plugin")
            tfgrpc.p2p_latency(tensor_server, sizes=["1KiB"], label="bare", engine="bare_echo")

        def test_unknown(tfgrpc, tensor_server):
            tfgrpc.p2p_latency(tensor_server, sizes=["1KiB"], engine="nosuch")

        def test_unavailable(tfgrpc, tensor_server):
            tfgrpc.p2p_bandwidth(tensor_server, sizes=["1KiB"], engine="missing")
        """
    )
    xml = pytester.path / "perf.xml"
    result = pytester.runpytest_subprocess(*FAST, f"--junitxml={xml}")
    result.assert_outcomes(passed=1, failed=2)
    props = _cases(xml)["test_mixed[lo]"]
    assert "engine=grpcio" in props["tfgrpc.plugin.settings"]
    assert "engine=bare_echo" in props["tfgrpc.bare.settings"]
    assert int(props["tfgrpc.bare.1KiB.samples"]) == 20
    result.stdout.fnmatch_lines(
        ["*p2p_latency() argument engine='nosuch': unknown engine 'nosuch'*"]
    )
    result.stdout.fnmatch_lines(["*p2p_bandwidth(engine='missing'): not built: run build-missing*"])
