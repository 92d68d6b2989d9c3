"""The plugin end to end with the native engine: the marker, engine=, and the unbuilt error."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_tfgrpc import native
from pytest_tfgrpc.report.junit import read_junit

NOT_BUILT = native.unavailable_reason()
#: Pytester moves HOME: name the real cache, where the engine was built.
CACHE = str(native.cache_root())

SUITE = """
import pytest

ENGINES = ["grpcio", "native"]

@pytest.mark.tfgrpc_engines(server="native")
@pytest.mark.parametrize("engine", ENGINES)
def test_to_native_server(tfgrpc, tensor_server, engine):
    result = tfgrpc.p2p_latency(tensor_server, ["1KiB"], rpc="stream", engine=engine)
    assert result.settings["engine"] == engine

@pytest.mark.parametrize("engine", ENGINES)
def test_to_python_server(tfgrpc, tensor_server, engine):
    result = tfgrpc.p2p_bandwidth(tensor_server, ["1MiB"], engine=engine, streams=2)
    assert result.settings["streams"] == "2"
"""


def _settings(xml: Path) -> dict[str, str]:
    out = {}
    for case in read_junit(xml).cases:
        name = case.test.rsplit(".", 1)[-1]
        for prop, value in case.properties:
            if prop.endswith(".settings"):
                out[f"{name}:{prop}"] = value
    return out


@pytest.mark.skipif(NOT_BUILT is not None, reason=NOT_BUILT or "")
def test_both_engines_run_a_suite_and_say_which(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(native.CACHE_ENV, CACHE)
    pytester.makepyfile(SUITE)
    result = pytester.runpytest(
        "--tfgrpc-iterations=5", "--tfgrpc-warmup=1", "--tfgrpc-max-seconds=2", "--junitxml=out.xml"
    )
    result.assert_outcomes(passed=4)
    settings = _settings(pytester.path / "out.xml")
    native_ids = [k for k, v in settings.items() if "engine=native" in v]
    python_ids = [k for k, v in settings.items() if "engine=grpcio" in v]
    # Per test: the latency result, or the streams' aggregate and its two streams.
    assert len(native_ids) == 1 + 3 and len(python_ids) == 1 + 3
    assert any("test_to_native_server[native" in k for k in native_ids)


def _bad_marker(pytester: pytest.Pytester, marker: str) -> pytest.RunResult:
    pytester.makepyfile(
        f"""
import pytest

@pytest.mark.{marker}
def test_x(tensor_server):
    pass
"""
    )
    result = pytester.runpytest()
    assert "INTERNALERROR" not in result.stdout.str()
    return result


def test_a_server_engine_that_is_no_name_fails_the_test_by_name(pytester: pytest.Pytester) -> None:
    # Unknown server= names are usage errors at collection (tests/test_usage_errors.py).
    result = _bad_marker(pytester, "tfgrpc_engines(server=1)")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*test_x*tfgrpc_engines(server=1): give one engine name*"])


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        ("tfgrpc_engines(client='native')", "tfgrpc_engines() takes server=..., got client"),
        ("tfgrpc_engines()", "give engine names such as"),
        ("tfgrpc_engines('native', 'native')", "engine listed twice"),
    ],
)
def test_a_bad_engine_marker_is_a_collection_error_by_name(
    pytester: pytest.Pytester, marker: str, message: str
) -> None:
    result = _bad_marker(pytester, marker)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*test_x*{message}*"])


@pytest.mark.skipif(NOT_BUILT is not None, reason=NOT_BUILT or "")
def test_engines_run_a_test_once_per_engine_with_the_engine_in_its_id(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(native.CACHE_ENV, CACHE)
    pytester.makepyfile(
        """
import pytest

@pytest.mark.tfgrpc_engines("grpcio", "native")
def test_echo(tfgrpc, tensor_server, tfgrpc_engine):
    result = tfgrpc.p2p_latency(tensor_server, ["1KiB"], rpc="stream")
    assert result.settings["engine"] == tfgrpc_engine.name

@pytest.mark.tfgrpc_engines("grpcio", "native", server="native")
def test_pinned_server(tfgrpc, tensor_server, tfgrpc_engine):
    assert tfgrpc.p2p_latency(tensor_server, ["1KiB"]).settings["engine"] == tfgrpc_engine.name
"""
    )
    result = pytester.runpytest("-v", "--tfgrpc-iterations=5")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(
        ["*test_echo?lo-grpcio? PASSED*", "*test_echo?lo-native? PASSED*"], consecutive=False
    )


def test_an_unbuilt_native_engine_skips_or_fails_with_the_build_command(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(native.CACHE_ENV, str(tmp_path))
    pytester.makepyfile(
        """
import pytest

@pytest.mark.tfgrpc_engines(server="native")
def test_server(tensor_server):
    pass

@pytest.mark.tfgrpc_engines("native")
def test_selected(tfgrpc, tensor_server):
    pass

def test_client(tfgrpc, tensor_server):
    tfgrpc.p2p_latency(tensor_server, ["1KiB"], engine="native")
"""
    )
    # A test selecting the engine skips with its reason (as any engine whose library is
    # missing); a call asking for it fails with it.
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=2, failed=1)
    result.stdout.fnmatch_lines(
        ["*SKIPPED*engine 'native' unavailable*not built*tfgrpc-build-native*"]
    )
    result.stdout.fnmatch_lines(["*test_client*not built*tfgrpc-build-native*"])


@pytest.mark.skipif(NOT_BUILT is not None, reason=NOT_BUILT or "")
def test_the_engine_option_sets_both_sides_where_a_test_does_not(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(native.CACHE_ENV, CACHE)
    pytester.makepyfile(
        """
import grpc
from pytest_tfgrpc.wire import grpc_settings
from pytest_tfgrpc.wire._proto import service_pb2

def _server_grpc(target):
    with grpc.insecure_channel(target) as channel:
        reply = channel.unary_unary(grpc_settings.method("raw", "Status"))(b"", timeout=10)
    return service_pb2.ServerStatus.FromString(reply).grpc_version

def test_default(tfgrpc, tensor_server):
    assert "(C++)" in _server_grpc(tensor_server.target)
    assert tfgrpc.p2p_latency(tensor_server, ["1KiB"]).settings["engine"] == "native"

def test_overridden(tfgrpc, tensor_server):
    result = tfgrpc.p2p_latency(tensor_server, ["1KiB"], engine="grpcio")
    assert result.settings["engine"] == "grpcio"
"""
    )
    result = pytester.runpytest("--tfgrpc-engines=native", "--tfgrpc-iterations=5")
    result.assert_outcomes(passed=2)


STREAMS_SUITE = """
import pytest

def test_default(tfgrpc, tensor_server):
    result = tfgrpc.p2p_bandwidth(tensor_server, ["256KiB"], label="bw")
    assert result.settings.get("streams") == {streams!r}

@pytest.mark.tfgrpc_streams(2)
def test_marked(tfgrpc, tensor_server):
    assert tfgrpc.p2p_bandwidth(tensor_server, ["256KiB"]).settings["streams"] == "2"

@pytest.mark.tfgrpc_streams(3)
def test_call_wins(tfgrpc, tensor_server):
    assert "streams" not in tfgrpc.p2p_bandwidth(tensor_server, ["256KiB"], streams=1).settings

@pytest.mark.message_profile(scheme="uniform", classes="small")
def test_payloads_stay_on_one_stream(tfgrpc, tensor_server):
    assert "streams" not in tfgrpc.p2p_bandwidth(tensor_server).settings
"""


@pytest.mark.parametrize(("option", "streams"), [(None, None), ("2", "2")])
def test_the_streams_marker_and_option(
    pytester: pytest.Pytester, option: str | None, streams: str | None
) -> None:
    pytester.makepyfile(STREAMS_SUITE.format(streams=streams))
    args = ["--tfgrpc-iterations=4", "--tfgrpc-warmup=1"]
    result = pytester.runpytest(*args, *([f"--tfgrpc-streams={option}"] if option else []))
    result.assert_outcomes(passed=4)


@pytest.mark.parametrize("value", ["0", "65", "two"])
def test_a_bad_streams_option_is_a_usage_error(pytester: pytest.Pytester, value: str) -> None:
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest(f"--tfgrpc-streams={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--tfgrpc-streams*"])


@pytest.mark.parametrize("marker", ["tfgrpc_streams(0)", "tfgrpc_streams()", "tfgrpc_streams(n=2)"])
def test_a_bad_streams_marker_fails_the_test_by_name(
    pytester: pytest.Pytester, marker: str
) -> None:
    pytester.makepyfile(f"import pytest\n\n@pytest.mark.{marker}\ndef test_x(tfgrpc):\n    pass\n")
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*test_x*tfgrpc_streams*"])


@pytest.mark.skipif(NOT_BUILT is not None, reason=NOT_BUILT or "")
def test_the_native_engine_runs_native_ps_tasks_workers_and_floor_and_says_so(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(native.CACHE_ENV, CACHE)
    pytester.makepyfile(
        """
import pytest

@pytest.mark.tfgrpc_engines("native")
def test_ps(tfgrpc, ps_cluster, tfgrpc_engine):
    assert tfgrpc_engine.name == "native"
    assert {w.engine for w in ps_cluster.workers} == {"native"}
    assert ps_cluster.ps_engine == "native"
    roles = {"engine": "native", "workers_engine": "native", "ps_engine": "native"}
    for mode in ("raw", "protobuf"):
        result = tfgrpc.ps_throughput(
            ps_cluster, ["4KiB"], mode=mode, iterations=5, warmup=1, label=f"ps_{mode}"
        )
        assert roles.items() <= result.settings.items()
        assert [load.bytes_in for load in result.sizes[0].per_ps] == [4096 * 5]
    step = tfgrpc.sync_sgd_step(ps_cluster, "resnet50", iterations=2, warmup=1, check=True)
    assert roles.items() <= step.settings.items()

@pytest.mark.tfgrpc_engines("grpcio", "native")
def test_floor(tfgrpc, tensor_server, tfgrpc_engine):
    tfgrpc.p2p_latency(tensor_server, ["1KiB"], iterations=5, warmup=1, floor=True, label="echo")
    floors = [r for r in tfgrpc.results if r.label == "echo_floor"]
    assert [r.settings["floor_engine"] for r in floors] == [tfgrpc_engine.name]
"""
    )
    pytester.makeconftest("")
    result = pytester.runpytest("--tfgrpc-max-seconds=5")
    result.assert_outcomes(passed=3)
