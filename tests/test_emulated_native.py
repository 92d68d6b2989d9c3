"""The native engine across emulated hosts: every role through the agents, plaintext and mutual
TLS; an agent killed mid-run fails only its test, naming the host; nothing is left anywhere."""

from __future__ import annotations

import os
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from test_emulated import FAST, namespace_pids, properties
from test_native import MULTI_CHUNK, RUN, TLS_CALLS

from pytest_tfgrpc import native
from pytest_tfgrpc.bench import native_p2p, p2p
from pytest_tfgrpc.bench.floor import transport_floor
from pytest_tfgrpc.bench.p2p import LatencyCall
from pytest_tfgrpc.bench.ps import ps_throughput
from pytest_tfgrpc.hosts.agent_client import AgentClient, AgentTLS
from pytest_tfgrpc.hosts.emulated import pid_alive
from pytest_tfgrpc.model.placement import Topology
from pytest_tfgrpc.plugin.emulated import EmulatedHosts
from pytest_tfgrpc.ps.ps_cluster import PSCluster
from pytest_tfgrpc.roles.native_server import start_tensor_server
from pytest_tfgrpc.wire.fabric import resolve_fabric
from pytest_tfgrpc.wire.security import load_tls, use_tls

# Imported once, here: pytester restores sys.modules after each test, and a second import of
# cryptography's bindings (trustme's backend) in a later test breaks its type checks.
pytest.importorskip("trustme")

Hosts = Callable[..., EmulatedHosts]
NOT_BUILT = native.unavailable_reason()
pytestmark = pytest.mark.skipif(NOT_BUILT is not None, reason=NOT_BUILT or "")
PAIRINGS = [(p, w) for p in ("grpcio", "native") for w in ("grpcio", "native")]
EXAMPLES = Path(__file__).resolve().parent.parent / "example_suites"

AGENT_DIES = """
import os
import pytest

@pytest.mark.message_profile(["256KiB"])
@pytest.mark.ps_topology(ps=2, workers=3)
def test_agent_dies(tfgrpc, ps_cluster):
    os.kill(int(os.environ["KILL_AGENT"]), 9)
    tfgrpc.ps_throughput(ps_cluster)

@pytest.mark.message_profile(["64KiB"])
def test_after(tfgrpc, tensor_server):
    tfgrpc.p2p_bandwidth(tensor_server)
"""


def _nothing_left(hosts: EmulatedHosts, dead: str | None = None) -> None:
    """Only the agents still alive are in their hosts (an agent stops its roles when the
    driver's lease ends, which takes a moment under load)."""
    for host in hosts.fabric.hosts:
        alive = [hosts.agents[host.name].pid] if host.name != dead else []
        deadline = time.monotonic() + 10
        while (left := [p for p in namespace_pids(host.netns) if pid_alive(p)]) != alive:
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert left == alive, host.name


#: What bounds the example suites' runs below (each under a minute on 2 busy cores): a
#: second of measuring per size after one warm-up, 100 samples at most (the suites' p99
#: budgets need 100, which their small echoes reach within the second).
BOUNDED = ("--tfgrpc-iterations=100", "--tfgrpc-warmup=1", "--tfgrpc-max-seconds=1")
FIVE_HOSTS = "nhps0,nhps1,nhw0,nhw1,nhw2"


@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "mtls"])
def test_the_example_suites_pass_natively_on_five_hosts(
    tfgrpc_emulated_hosts: Hosts, pytester: pytest.Pytester, tls: bool
) -> None:
    """PS tasks on nhps0 and nhps1, a worker on each of nhw0-nhw2, the tensor server on nhps0:
    all native, started by the agents; with ``--tfgrpc-tls-*``, each host serves its own
    certificate and the driver presents its own (mutual TLS)."""
    hosts = tfgrpc_emulated_hosts(FIVE_HOSTS, tls=tls)
    for name in ("test_p2p.py", "test_ps.py"):
        shutil.copy(EXAMPLES / name, pytester.path / name)
    xml = pytester.path / "perf.xml"
    result = pytester.runpytest_subprocess(
        *BOUNDED, *hosts.pytest_args(), "--tfgrpc-engines=native", f"--junitxml={xml}",
        "-p", "no:cacheprovider", timeout=300,
    )  # fmt: skip
    result.assert_outcomes(passed=10)
    fabric, bridge = hosts.fabric, hosts.fabric.bridge
    props = properties(xml)
    p2p = props[f"test_large_weight_push_bandwidth[{bridge}]"]
    settings = p2p["tfgrpc.p2p_bandwidth.settings"]
    assert "engine=native" in settings and ("tls=mtls" if tls else "tls=off") in settings
    ps0 = fabric.host("nhps0").address
    assert p2p["tfgrpc.p2p_bandwidth.ends"] == (
        f"client={socket.gethostname()}@{fabric.driver_address} server=nhps0@{ps0}"
    )
    ps = props[f"test_ps_throughput_by_scheme[uniform-{bridge}]"]
    assert ps["tfgrpc.ps_throughput.ends"].split() == [
        f"ps0=nhps0@{ps0}",
        f"ps1=nhps1@{fabric.host('nhps1').address}",
        *(f"worker{j}=nhw{j}@{fabric.host(f'nhw{j}').address}" for j in range(3)),
    ]
    assert "engine=native" in ps["tfgrpc.ps_throughput.settings"]
    _nothing_left(hosts)


@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "mtls"])
def test_a_killed_agent_fails_its_native_test_in_one_line(
    tfgrpc_emulated_hosts: Hosts,
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    tls: bool,
) -> None:
    hosts = tfgrpc_emulated_hosts(FIVE_HOSTS, tls=tls)
    monkeypatch.setenv("KILL_AGENT", str(hosts.agents["nhw1"].pid))
    pytester.makepyfile(AGENT_DIES)
    xml = pytester.path / "perf.xml"
    result = pytester.runpytest_subprocess(
        *FAST, *hosts.pytest_args(), "--tfgrpc-engines=native", f"--junitxml={xml}", timeout=300
    )
    result.assert_outcomes(passed=1, failed=1)
    # The failure is the one line naming the role and its host (and the agent's loss, from
    # the role's stderr), no traceback.
    lines = result.stdout.lines
    header = next(i for i, line in enumerate(lines) if "_ test_agent_dies" in line)
    failure = lines[header + 1 : header + 3]
    assert failure[0].startswith("ServerDied: native PS worker 1 on host nhw1 exited"), failure
    assert "lost agent nhw1" in failure[1], failure
    assert not any("Traceback" in line or "def test_agent_dies" in line for line in lines)
    ends = properties(xml)[f"test_after[{hosts.fabric.bridge}]"]["tfgrpc.p2p_bandwidth.ends"]
    assert ends.endswith(f"server=nhps0@{hosts.fabric.host('nhps0').address}")
    _nothing_left(hosts, dead="nhw1")


def test_a_host_without_the_native_build_is_named(
    tfgrpc_emulated_hosts: Hosts,
    pytester: pytest.Pytester,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The agents look for the build in an empty cache; the driver (here) has it.
    built = native.cache_root()
    monkeypatch.setenv(native.CACHE_ENV, str(tmp_path / "nothing-built"))
    hosts = tfgrpc_emulated_hosts("ps0")
    monkeypatch.setenv(native.CACHE_ENV, str(built))
    pytester.makepyfile(
        "def test_p2p(tfgrpc, tensor_server):\n    tfgrpc.p2p_latency(tensor_server, ['1KiB'])\n"
    )
    result = pytester.runpytest_subprocess(
        *FAST, *hosts.pytest_args(), "--tfgrpc-engines=native", timeout=120
    )
    result.assert_outcomes(errors=1)  # at setup: its server cannot start
    result.stdout.fnmatch_lines(
        [
            "*host ps0: the native engine is not built there, so it cannot run the native tensor"
            " server: run `tfgrpc-build-native` on ps0*"
        ]
    )


def test_every_pair_of_engines_on_every_call_through_an_agent(
    tfgrpc_emulated_hosts: Hosts,
) -> None:
    """Each engine's server on another host, started by its agent, measured by each engine's
    client from here, on every call; plaintext, then mutual TLS with the host's own
    certificate (the same agent serves both: the run decides)."""
    hosts = tfgrpc_emulated_hosts("s0", tls=True)
    assert hosts.tls is not None
    driver = resolve_fabric(hosts.fabric.bridge)
    ca, cert, key = hosts.tls.ca, hosts.tls.cert, hosts.tls.key
    assert ca is not None
    agent_tls = AgentTLS.from_files(ca, cert, key)
    with AgentClient(hosts.agent_targets()[0], hosts.token, tls=agent_tls) as agent:
        assert agent.info.engines == ("grpcio", "native") and agent.info.tls == "mtls"
        for files in (None, hosts.tls):
            env = {**os.environ, **(files.env() if files is not None else {})}
            for server_engine in ("grpcio", "native"):
                server = start_tensor_server(
                    driver, engine=server_engine, env=env, launcher=agent.launcher()
                )
                use_tls(load_tls(files) if files is not None else None)
                try:
                    assert server.target.startswith(hosts.fabric.host("s0").address + ":")
                    for loops in (p2p, native_p2p):
                        for call in TLS_CALLS:
                            measure = (
                                loops.p2p_latency
                                if isinstance(call, LatencyCall)
                                else loops.p2p_bandwidth
                            )
                            result = measure(server, [1, MULTI_CHUNK], call)
                            counts = [s.count for s in result.sizes]
                            assert counts == [RUN.iterations] * 2, (server_engine, call)
                finally:
                    use_tls(None)
                    server.stop()
    _nothing_left(hosts)


def test_every_pairing_of_ps_and_worker_engines_and_the_native_floor_through_agents(
    tfgrpc_emulated_hosts: Hosts,
) -> None:
    """PS tasks on ps0 and workers on w0, each started by its host's agent, in every pairing of
    engines, plaintext and then mutual TLS (each host's own certificate); then the native floor
    server on ps0, timed from here by the native floor client."""
    hosts = tfgrpc_emulated_hosts("ps0,w0", tls=True)
    assert hosts.tls is not None and hosts.tls.ca is not None
    driver = resolve_fabric(hosts.fabric.bridge)
    agent_tls = AgentTLS.from_files(hosts.tls.ca, hosts.tls.cert, hosts.tls.key)
    ps_target, worker_target = hosts.agent_targets(["ps0", "w0"])
    with (
        AgentClient(ps_target, hosts.token, tls=agent_tls) as ps_agent,
        AgentClient(worker_target, hosts.token, tls=agent_tls) as worker_agent,
    ):
        for files in (None, hosts.tls):
            env = {**os.environ, **(files.env() if files is not None else {})}
            use_tls(load_tls(files) if files is not None else None)
            try:
                for ps_engine, workers_engine in PAIRINGS:
                    with PSCluster(
                        driver,
                        Topology(ps=1, workers=2),
                        env=env,
                        ps_launchers=(ps_agent.launcher(),),
                        worker_launchers=(worker_agent.launcher(),),
                        ps_engine=ps_engine,
                        workers_engine=workers_engine,
                    ) as cluster:
                        result = ps_throughput(cluster, [4096], run=RUN)
                    point = result.sizes[0]
                    pairing = (ps_engine, workers_engine, files is not None)
                    assert [load.rpcs for load in point.per_ps] == [2 * RUN.iterations], pairing
                    assert result.settings["ps_engine"] == ps_engine, pairing
                    assert result.settings["workers_engine"] == workers_engine, pairing
            finally:
                use_tls(None)
        server = start_tensor_server(driver, engine="native", launcher=ps_agent.launcher())
        try:
            measured = native_p2p.p2p_latency(server, [1, MULTI_CHUNK], LatencyCall(run=RUN))
            floor = transport_floor(
                driver, measured, RUN, launcher=ps_agent.launcher(), engine="native"
            )
        finally:
            server.stop()
    assert floor.settings["floor_engine"] == "native"
    assert floor.target.startswith(hosts.fabric.host("ps0").address + ":")
    assert [s.count for s in floor.sizes] == [RUN.iterations] * 2
    _nothing_left(hosts)
