"""Remote tensor servers from a TF_CONFIG cluster spec; across a real, rate-capped link."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import QUICK
from junitparser.xunit2 import JUnitXml
from netns import can_make_links, veth_link

from pytest_tfgrpc.bench.driver import Driver
from pytest_tfgrpc.bench.specs import run_layer
from pytest_tfgrpc.hosts.cluster_spec import (
    ClusterSpecError,
    RemoteServer,
    load_cluster_spec,
    parse_cluster_spec,
)
from pytest_tfgrpc.wire.client import BenchmarkError
from pytest_tfgrpc.wire.fabric import resolve_fabric


def test_a_tf_config_spec_is_read_with_its_jobs() -> None:
    spec = parse_cluster_spec(
        json.dumps(
            {
                "cluster": {"ps": ["127.0.0.1:2222", "[::1]:2223"], "worker": {"1": "localhost:3"}},
                "task": {"type": "worker", "index": 1},
            }
        ),
        "TF_CONFIG",
    )
    assert [t.target for t in spec.job("ps")] == ["127.0.0.1:2222", "[::1]:2223"]
    (worker,) = spec.job("worker")
    assert (worker.index, worker.port) == (1, 3) and worker.host in ("127.0.0.1", "::1")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "TF_CONFIG: not JSON"),
        ('{"task": {}}', 'no "cluster" object'),
        ('{"cluster": {"ps": ["1.2.3.4"]}}', "job 'ps', task 0: '1.2.3.4' is not host:port"),
        ('{"cluster": {"ps": ["1.2.3.4:70000"]}}', "port 70000 of '1.2.3.4:70000' is not from 1"),
        ('{"cluster": {"ps": ["1.2.3.4:x"]}}', "port 'x' of '1.2.3.4:x' is not a number"),
        ('{"cluster": {"ps": [7]}}', "job 'ps', task 0: 7 is not a \"host:port\" string"),
        (
            '{"cluster": {"ps": ["no-such-host.invalid:1"]}}',
            "cannot resolve 'no-such-host.invalid'",
        ),
    ],
)
def test_bad_specs_quote_the_offending_value(text: str, message: str) -> None:
    with pytest.raises(ClusterSpecError) as info:
        parse_cluster_spec(text, "TF_CONFIG")
    assert message in str(info.value)


def test_the_option_wins_over_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "cluster.json"
    path.write_text('{"cluster": {"ps": ["127.0.0.2:9"]}}')
    env = {"TF_CONFIG": '{"cluster": {"ps": ["127.0.0.3:9"]}}'}
    assert load_cluster_spec(str(path), env).job("ps")[0].host == "127.0.0.2"  # type: ignore[union-attr]
    assert load_cluster_spec(None, env).job("ps")[0].host == "127.0.0.3"  # type: ignore[union-attr]
    assert load_cluster_spec(None, {}) is None
    with pytest.raises(ClusterSpecError, match=r"missing\.json"):
        load_cluster_spec(str(tmp_path / "missing.json"), {})


@pytest.mark.parametrize("call", ["p2p_latency", "p2p_bandwidth"])
def test_a_floor_against_a_server_nothing_here_started_is_refused_before_measuring(
    call: str,
) -> None:
    # Nothing listens at 127.0.0.1:9: a measurement would fail otherwise, and a floor server
    # started here would measure this host's loopback, not the way to that server.
    (task,) = parse_cluster_spec('{"cluster": {"ps": ["127.0.0.1:9"]}}', "spec").job("ps")
    recorded: list[tuple[str, str]] = []
    driver = Driver(
        test="t",
        messages=None,
        budget=None,
        run=[run_layer("test", {"iterations": 2, "warmup": 0})],
        record=lambda name, value: recorded.append((name, value)),
    )
    benchmark = getattr(driver, call)
    with pytest.raises(
        BenchmarkError, match=r"floor=True: .*127\.0\.0\.1:9's host.*--tfgrpc-agents"
    ):
        benchmark(RemoteServer(task, resolve_fabric("lo")), ["1KiB"], floor=True)
    assert recorded == []


SUITE = """
import pytest

@pytest.mark.message_profile(["1KiB"])
def test_latency(tfgrpc, tensor_server):
    tfgrpc.p2p_latency(tensor_server)

@pytest.mark.message_profile(["1MiB"])
def test_bandwidth(tfgrpc, tensor_server):
    tfgrpc.p2p_bandwidth(tensor_server)
"""


def test_a_remote_server_is_measured_across_the_link(pytester: pytest.Pytester) -> None:
    ok, reason = can_make_links(shaping=True)
    if not ok:
        pytest.skip(reason)
    with veth_link(rate="100mbit") as link:
        # The other host: a tensor server inside the namespace, on its end of the link.
        command = link.ns_command(
            [sys.executable, "-m", "pytest_tfgrpc.roles.tensor_server", "--fabric", link.ns_if,
             "--exit-on-stdin-eof"]
        )  # fmt: skip
        server = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            assert server.stdout is not None
            target = json.loads(server.stdout.readline())["target"]
            assert target.startswith(f"{link.ns_addr}:")
            spec = pytester.path / "cluster.json"
            spec.write_text(json.dumps({"cluster": {"ps": [target]}}))
            pytester.makepyfile(SUITE)
            xml = pytester.path / "perf.xml"
            result = pytester.runpytest(
                *QUICK, f"--fabric={link.root_if}", f"--tfgrpc-cluster={spec}", f"--junitxml={xml}"
            )
            result.assert_outcomes(passed=2)
            result.stdout.fnmatch_lines(
                [f"tfgrpc: remote tensor servers from *: ps[[]0[]] {target}"]
            )
            props = {
                case.name: {p.name: p.value for p in case.properties()}  # type: ignore[attr-defined]
                for suite in JUnitXml.fromfile(str(xml))
                for case in suite
            }
            bandwidth = props[f"test_bandwidth[{link.root_if}]"]
            assert bandwidth["tfgrpc.target"] == target
            # 100 Mbit/s is 12.5 MB/s: only a link that carries the bytes is that slow
            assert float(bandwidth["tfgrpc.p2p_bandwidth.1MiB.throughput_MBps"]) < 13.0
            # and a fabric the spec has no server on is a clear error
            result = pytester.runpytest(*QUICK, "--fabric=lo", f"--tfgrpc-cluster={spec}")
            result.assert_outcomes(errors=2)
            result.stdout.fnmatch_lines(["*has no ps task reached through fabric 'lo'*"])
        finally:
            assert server.stdin is not None
            server.stdin.close()
            server.wait(timeout=10)
