"""Across hosts on one machine: emulated hosts, node agents, PS clusters placed on them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import pid_alive
from junitparser.xunit2 import JUnitXml

from pytest_tfgrpc.hosts.emulated import (
    HostSpec,
    agent_pids,
    build_fabric,
    can_build,
    emulated_fabric,
    list_fabrics,
    parse_hosts,
    rate_bits_per_s,
    remove_leftovers,
)
from pytest_tfgrpc.plugin.emulated import EmulatedHosts

FAST = ("--tfgrpc-iterations=8", "--tfgrpc-warmup=1", "--tfgrpc-max-seconds=4")
Hosts = Callable[..., EmulatedHosts]
FABRIC = (sys.executable, "-m", "pytest_tfgrpc.cli.fabric")  # tfgrpc-fabric


def properties(xml: Path) -> dict[str, dict[str, str]]:
    return {
        case.name: {p.name: p.value for p in case.properties()}  # type: ignore[attr-defined]
        for suite in JUnitXml.fromfile(str(xml))
        for case in suite
    }


def namespace_pids(netns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
    return [int(pid) for pid in out.stdout.split()]


def joined_pids(netns: str, want: int, timeout: float = 10.0) -> list[int]:
    """The namespace's pids once ``want`` has joined it (``ip netns exec`` enters it after it
    starts, so right after Popen it may not be in yet), or as they are after ``timeout``."""
    deadline = time.monotonic() + timeout
    while want not in (pids := namespace_pids(netns)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return pids


def needs_root() -> None:
    ok, why = can_build()
    if not ok:
        pytest.skip(why)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("3", [("h0", None), ("h1", None), ("h2", None)]),
        ("ps0,ps1@200mbit,w0", [("ps0", "1gbit"), ("ps1", "200mbit"), ("w0", "1gbit")]),
        (" a , b@10mbps ", [("a", "1gbit"), ("b", "10mbps")]),
    ],
)
def test_host_lists_are_read_with_their_rates(text: str, expected: list[tuple[str, str]]) -> None:
    default = None if text == "3" else "1gbit"
    assert [(h.name, h.rate) for h in parse_hosts(text, default)] == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0", "host count 0"),
        ("a,a", "'a' is given twice"),
        ("Ps0", "host name 'Ps0'"),
        ("a@fast", "rate 'fast' is not a tc rate"),
        ("a@1kbit", "below 8kbit"),
        ("", "host name ''"),
    ],
)
def test_bad_host_lists_are_refused_naming_the_value(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_hosts(text)


def test_rates_are_read_as_tc_reads_them() -> None:
    assert rate_bits_per_s("200mbit") == 200_000_000
    assert rate_bits_per_s("1gbit") == 1_000_000_000
    assert rate_bits_per_s("1.5gbit") == 1_500_000_000
    assert rate_bits_per_s("10mbps") == 80_000_000  # tc: bps is bytes per second


def test_a_fabric_is_removed_whatever_ends_the_block() -> None:
    needs_root()
    with pytest.raises(RuntimeError, match="inside"), emulated_fabric(parse_hosts("a,b")) as made:
        host = made.host("b")
        sleeper = subprocess.Popen(host.command(["sleep", "60"]))
        assert joined_pids(host.netns, sleeper.pid) == [sleeper.pid]
        raise RuntimeError("inside")
    sleeper.wait(timeout=10)  # killed with its namespace, not left running
    assert not Path(f"/run/netns/{host.netns}").exists()
    assert not Path(f"/sys/class/net/{made.bridge}").exists()
    assert made.name not in [f.name for f in list_fabrics()]


def test_leftovers_of_a_dead_owner_are_removed() -> None:
    needs_root()
    owner = subprocess.Popen(["sleep", "0"])
    owner.wait()
    left = build_fabric([HostSpec("x")], owner_pid=owner.pid)  # as if its owner was killed
    assert Path(f"/run/netns/{left.hosts[0].netns}").exists()
    remove_leftovers()  # (another process's build may have removed it first: it may)
    assert not Path(f"/run/netns/{left.hosts[0].netns}").exists()
    assert not Path(f"/sys/class/net/{left.bridge}").exists()


def test_tfgrpc_fabric_up_status_down(tmp_path: Path) -> None:
    needs_root()
    token = tmp_path / "token"
    token.write_text("t" * 32 + "\n")
    token.chmod(0o600)
    up = subprocess.run(
        [*FABRIC, "up", "--hosts", "n1,n2@200mbit", "--rate", "1gbit", "--agents",
         "--token-file", str(token)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert up.returncode == 0, up.stderr
    name = up.stdout.split()[1].rstrip(":")
    try:
        assert "n2: 198.18." in up.stdout and "200mbit" in up.stdout and ":7461" in up.stdout
        status = subprocess.run([*FABRIC, "status"], capture_output=True, text=True)
        assert f"fabric {name}" in status.stdout and "1 process, received " in status.stdout
    finally:
        down = subprocess.run([*FABRIC, "down", name], capture_output=True, text=True)
    assert down.returncode == 0 and f"removed: {name}" in down.stdout
    assert not list(Path("/run/netns").glob(f"{name}-*"))
    unknown = subprocess.run([*FABRIC, "down", "tfgf9999"], capture_output=True, text=True)
    assert unknown.returncode == 2 and "no fabric 'tfgf9999'" in unknown.stdout


CLUSTER_SUITE = """
import os
import pytest

@pytest.mark.message_profile(["256KiB"])
@pytest.mark.ps_topology(ps=2, workers=2)
def test_throughput(tfgrpc, ps_cluster):
    tfgrpc.ps_throughput(ps_cluster)

@pytest.mark.message_profile("hep_cnn")
@pytest.mark.ps_topology(ps=2, workers=2, sharding="partitioned")
def test_steps(tfgrpc, ps_cluster):
    tfgrpc.sync_sgd_step(ps_cluster)

@pytest.mark.message_profile(["256KiB"])
@pytest.mark.ps_topology(ps=2, workers=2)
def test_agent_dies(tfgrpc, ps_cluster):
    os.kill(int(os.environ["KILL_AGENT"]), 9)
    tfgrpc.ps_throughput(ps_cluster)

@pytest.mark.message_profile(["64KiB"])
def test_after(tfgrpc, tensor_server):
    tfgrpc.p2p_bandwidth(tensor_server)
"""


def test_a_ps_cluster_runs_across_five_hosts(
    tfgrpc_emulated_hosts: Hosts, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2 PS, 2 workers and the driver: each PS's bytes cross its own link; an agent killed
    mid-run fails its test naming the host, the next test runs, nothing is left."""
    hosts = tfgrpc_emulated_hosts("ps0,ps1,w0,w1", rate="1gbit")
    fabric = hosts.fabric
    monkeypatch.setenv("KILL_AGENT", str(hosts.agents["ps1"].pid))
    before = {h.name: fabric.counters(h.name) for h in fabric.hosts}
    pytester.makepyfile(CLUSTER_SUITE)
    xml = pytester.path / "perf.xml"
    result = pytester.runpytest_subprocess(
        *FAST, *hosts.pytest_args(), f"--junitxml={xml}", timeout=300
    )
    after = {h.name: fabric.counters(h.name) for h in fabric.hosts}
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(
        ["*_ test_agent_dies*", "*ServerDied: PS 1 on host ps1 *", "*lost agent ps1*"]
    )
    props = properties(xml)
    bridge = fabric.bridge
    placed = props[f"test_throughput[{bridge}]"]["tfgrpc.placement"].split()
    assert placed == [
        f"ps0=ps0@{fabric.host('ps0').address}",
        f"ps1=ps1@{fabric.host('ps1').address}",
        f"worker0=w0@{fabric.host('w0').address}",
        f"worker1=w1@{fabric.host('w1').address}",
    ]
    assert props[f"test_throughput[{bridge}]"]["tfgrpc.path"].startswith("fab0:")
    assert props[f"test_after[{bridge}]"]["tfgrpc.path"] == "fab0: driver -> ps0"
    # Each PS's own link carried at least the bytes it counted, the workers' links sent them.
    for task, name in ((0, "ps0"), (1, "ps1")):
        counted = sum(
            int(props[f"{test}[{bridge}]"][key])
            for test in ("test_throughput", "test_steps")
            for key in props[f"{test}[{bridge}]"]
            if key.endswith(f".ps{task}.bytes_in")
        )
        received = after[name][0] - before[name][0]
        assert counted > 1_000_000 and received >= counted, (name, counted, received)
    for name in ("w0", "w1"):
        assert after[name][1] - before[name][1] > 1_000_000
    # No role is left on any host: only the agents still alive are in their namespaces (an
    # agent stops its roles when the driver's lease ends, which takes a moment under load).
    for host in fabric.hosts:
        alive = [hosts.agents[host.name].pid] if host.name != "ps1" else []
        deadline = time.monotonic() + 10
        while (left := [p for p in namespace_pids(host.netns) if pid_alive(p)]) != alive:
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert left == alive, host.name


def test_an_agent_refuses_strangers_and_other_roles(tfgrpc_emulated_hosts: Hosts) -> None:
    import grpc

    from pytest_tfgrpc.hosts.agent_client import AgentClient, AgentError
    from pytest_tfgrpc.wire._proto import agent_pb2, agent_pb2_grpc

    hosts = tfgrpc_emulated_hosts("n0")
    target = hosts.agents["n0"].target
    with pytest.raises(AgentError, match="UNAUTHENTICATED: wrong agent token"):
        AgentClient(target, "not-the-token-0123456789")
    with grpc.insecure_channel(target) as channel:
        stub = agent_pb2_grpc.NodeAgentStub(channel)  # type: ignore[no-untyped-call]
        for method in (stub.Hello, stub.Heartbeat, stub.Counters, stub.Release):
            with pytest.raises(grpc.RpcError) as bare:
                method(agent_pb2.LeaseRequest(driver="x"), timeout=5)
            assert bare.value.code() == grpc.StatusCode.UNAUTHENTICATED
        start = agent_pb2.RoleInput(start=agent_pb2.RoleStart(driver="x", role="worker"))
        with pytest.raises(grpc.RpcError) as run:
            list(stub.Run(iter([start]), timeout=5))
        assert run.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with AgentClient(target, hosts.token) as client, open(os.devnull, "rb") as devnull:
        refused = {
            ("bash", ()): "PERMISSION_DENIED: role 'bash' is not one this agent runs",
            ("tensor_server", (("command", "sh"),)): "has no parameter 'command'",
            ("tensor_server", (("workers", "1; rm"),)): "workers='1; rm'",
            ("ps", (("delay", "forever"),)): "delay='forever'",
            ("worker", (("fabric", "eth9"),)): "role 'worker' has no parameter 'fabric'",
        }
        for (role, params), message in refused.items():
            with pytest.raises(AgentError, match=message.replace("(", r"\(")):
                client.run(role, dict(params), {}, devnull, name=role)
        with pytest.raises(AgentError, match="LD_PRELOAD"):
            client.run("worker", {}, {"LD_PRELOAD": "/x.so"}, devnull, name="w")
    assert [p for p in namespace_pids(hosts.fabric.hosts[0].netns) if pid_alive(p)] == [
        hosts.agents["n0"].pid
    ]


def test_a_driver_that_stops_renewing_loses_its_processes(tfgrpc_emulated_hosts: Hosts) -> None:
    import tempfile

    from pytest_tfgrpc.hosts.agent_client import AgentClient

    hosts = tfgrpc_emulated_hosts("n0")
    netns = hosts.fabric.hosts[0].netns
    client = AgentClient(hosts.agents["n0"].target, hosts.token, lease_s=1.0)
    with tempfile.TemporaryFile() as stderr:
        worker = client.run("worker", {}, {}, stderr, name="worker")
        assert worker.poll() is None and pid_alive_in(netns, worker.pid)
        client._closed.set()  # a hung or cut-off driver: no more heartbeats, no release
        worker.wait(timeout=10)
        stderr.seek(0)
        assert "the lease of driver" in stderr.read().decode()
    assert not pid_alive_in(netns, worker.pid)


def pid_alive_in(netns: str, pid: int) -> bool:
    return pid in namespace_pids(netns) and pid_alive(pid)


HANGING_SUITE = """
import pathlib, time
import pytest

@pytest.mark.ps_topology(ps=2, workers=2)
def test_hangs(ps_cluster):
    pathlib.Path("started").write_text(" ".join(map(str, ps_cluster.pids)))
    time.sleep(120)
"""


def test_no_process_outlives_a_killed_driver_on_any_host(
    tfgrpc_emulated_hosts: Hosts, tmp_path: Path
) -> None:
    import signal
    import time

    hosts = tfgrpc_emulated_hosts("ps0,ps1,w0,w1")
    (tmp_path / "test_hang.py").write_text(HANGING_SUITE)
    driver = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *hosts.pytest_args()],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "started").exists():
            assert driver.poll() is None and time.monotonic() < deadline, "the cluster never ran"
            time.sleep(0.1)
        remote = [int(pid) for pid in (tmp_path / "started").read_text().split()]
        assert len(remote) == 4
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    agents = {h.netns: hosts.agents[h.name].pid for h in hosts.fabric.hosts}
    deadline = time.monotonic() + 15
    while any(namespace_pids(ns) != [pid] for ns, pid in agents.items()):
        assert time.monotonic() < deadline, {ns: namespace_pids(ns) for ns in agents}
        time.sleep(0.2)


SRUN_SUITE = """
import pytest

@pytest.mark.message_profile(["64KiB"])
@pytest.mark.ps_topology(ps=2, workers=2)
def test_throughput(tfgrpc, ps_cluster):
    tfgrpc.ps_throughput(ps_cluster)
"""


def test_the_srun_recipe_runs_on_emulated_nodes(
    tfgrpc_emulated_hosts: Hosts, tmp_path: Path
) -> None:
    """example_suites/slurm/run-node.sh under a stand-in srun that sets SLURM's variables."""
    hosts = tfgrpc_emulated_hosts("node01,node02,node03,node04,node05", agents=False)
    recipe = Path(__file__).parent.parent / "example_suites" / "slurm" / "run-node.sh"
    (tmp_path / "test_srun.py").write_text(SRUN_SUITE)
    xml = tmp_path / "perf.xml"
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "PYTHON": sys.executable,
    }
    # The agents never end by themselves: after the driver's task, all of --wait is waited.
    done = subprocess.run(
        [sys.executable, str(Path(__file__).parent / "srun_standin.py"),
         f"/run/tfgrpc-fabric/{hosts.fabric.name}.json", "--wait", "1", str(recipe), "fab0",
         hosts.token_file, *FAST, "-p", "no:cacheprovider", f"--junitxml={xml}", str(tmp_path)],
        capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "tfgrpc: agents from SLURM: node02:7461, node03:7461" in done.stdout
    props = properties(xml)["test_throughput[fab0]"]
    assert props["tfgrpc.placement"].split() == [
        f"ps0=node02@{hosts.fabric.host('node02').address}",
        f"ps1=node03@{hosts.fabric.host('node03').address}",
        f"worker0=node04@{hosts.fabric.host('node04').address}",
        f"worker1=node05@{hosts.fabric.host('node05').address}",
    ]
    for host in hosts.fabric.hosts:  # srun's --wait ended the agents, and they their roles
        assert [p for p in namespace_pids(host.netns) if pid_alive(p)] == [], host.name


def test_the_node_acceptance_suite_rejects_a_slow_node(
    tfgrpc_emulated_hosts: Hosts, pytester: pytest.Pytester
) -> None:
    """example_suites/node_acceptance: against a good node's baseline, a new node on a link a
    fifth as fast fails the gate where its link shows (bandwidth, PS throughput)."""
    hosts = tfgrpc_emulated_hosts("good,new@200mbit,peer", rate="1gbit")
    suite = Path(__file__).parent.parent / "example_suites" / "node_acceptance" / "test_node.py"
    pytester.makepyfile(test_node=suite.read_text())
    good = pytester.path / "good.xml"
    gated = ("--tfgrpc-iterations=12", "--tfgrpc-warmup=1", "--tfgrpc-max-seconds=6")
    first = pytester.runpytest_subprocess(
        *gated, *hosts.pytest_args(["good", "peer"]), f"--junitxml={good}", timeout=300
    )
    first.assert_outcomes(passed=3)
    placed = properties(good)[f"test_ps_throughput[{hosts.fabric.bridge}]"]["tfgrpc.placement"]
    assert placed.startswith("ps0=good@") and " worker0=peer@" in placed
    gate = (f"--tfgrpc-baseline={good}", "--tfgrpc-max-regression=throughput:30%")
    new = pytester.runpytest_subprocess(
        *gated, *hosts.pytest_args(["new", "peer"]), *gate, timeout=300
    )
    outcomes = new.parseoutcomes()
    assert outcomes.get("failed", 0) >= 2, new.stdout.str()[-3000:]
    new.stdout.fnmatch_lines(
        [
            "*regression: *against baseline*test_bandwidth*",
            "*p2p_bandwidth*4MiB*p50*REGRESSION*",
            "*regression: *against baseline*test_ps_throughput*",
        ]
    )


FLOOR_SUITE = """
import pytest

@pytest.mark.message_profile(["2MiB"])
def test_bandwidth(tfgrpc, tensor_server):
    tfgrpc.p2p_bandwidth(tensor_server, floor=True)
"""


def test_the_floor_is_measured_between_the_same_two_hosts(
    tfgrpc_emulated_hosts: Hosts, pytester: pytest.Pytester
) -> None:
    hosts = tfgrpc_emulated_hosts("slow@100mbit")
    pytester.makepyfile(FLOOR_SUITE)
    xml = pytester.path / "perf.xml"
    result = pytester.runpytest_subprocess(
        *FAST, *hosts.pytest_args(), f"--junitxml={xml}", timeout=120
    )
    result.assert_outcomes(passed=1)
    props = properties(xml)[f"test_bandwidth[{hosts.fabric.bridge}]"]
    floors = {k: v for k, v in props.items() if "_floor" in k}
    address = hosts.fabric.host("slow").address
    assert props["tfgrpc.target"] == props["tfgrpc.p2p_bandwidth.target"]  # the server's
    assert floors["tfgrpc.p2p_bandwidth_floor.target"].startswith(f"{address}:")
    # 100 Mbit/s is 12.5 MB/s: a floor taken on this host's loopback would be far faster
    throughput = [float(v) for k, v in floors.items() if k.endswith("2MiB.throughput_MBps")]
    assert throughput and throughput[0] < 13.0, floors


def test_agents_from_a_tfjob_tf_config(
    tfgrpc_emulated_hosts: Hosts, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Kubernetes recipe's shape: Kubeflow's TF_CONFIG names the agents as PS and worker
    tasks (a chief, this driver, too), and --tfgrpc-agents=cluster places the roles there."""
    import json

    hosts = tfgrpc_emulated_hosts("ps0,w0,w1")
    ps, w0, w1 = hosts.agent_targets()
    tf_config = {
        "cluster": {"chief": ["driver-0.svc:2222"], "ps": [ps], "worker": {"0": w0, "1": w1}},
        "task": {"type": "chief", "index": 0},
        "environment": "cloud",
    }
    monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    pytester.makepyfile(SRUN_SUITE.replace("ps=2", "ps=1"))
    xml = pytester.path / "perf.xml"
    result = pytester.runpytest_subprocess(
        *FAST, f"--fabric={hosts.fabric.bridge}", "--tfgrpc-agents=cluster",
        f"--tfgrpc-agent-token-file={hosts.token_file}", f"--junitxml={xml}", timeout=120,
    )  # fmt: skip
    result.assert_outcomes(passed=1)
    placed = properties(xml)[f"test_throughput[{hosts.fabric.bridge}]"]["tfgrpc.placement"]
    assert [p.split("@")[0] for p in placed.split()] == ["ps0=ps0", "worker0=w0", "worker1=w1"]


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_pki(where: Path, name: str, ip: str) -> None:
    """``name``-ca.pem, server.pem/-key.pem (for ``ip``), client.pem/-key.pem, in ``where``."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
             f"/CN={name} CA", "-keyout", f"{name}-ca-key.pem", "-out", f"{name}-ca.pem",
             cwd=where)  # fmt: skip
    for role, san in (("server", f"IP:{ip}"), ("client", "DNS:driver")):
        (where / f"{role}.ext").write_text(f"subjectAltName={san}\n")
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={role}",
                 "-keyout", f"{role}-key.pem", "-out", f"{role}.csr", cwd=where)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{role}.csr", "-CA", f"{name}-ca.pem", "-CAkey",
                 f"{name}-ca-key.pem", "-CAcreateserial", "-days", "1", "-extfile",
                 f"{role}.ext", "-out", f"{role}.pem", cwd=where)  # fmt: skip


def test_an_agent_with_mutual_tls_refuses_clients_without_its_ca_or_a_certificate(
    tfgrpc_emulated_hosts: Hosts, tmp_path: Path
) -> None:
    import shutil
    import tempfile

    from pytest_tfgrpc.hosts.agent_client import AgentClient, AgentError, AgentTLS
    from pytest_tfgrpc.hosts.emulated import HostAgent

    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make certificates")
    hosts = tfgrpc_emulated_hosts("n0", agents=False)
    host = hosts.fabric.hosts[0]
    make_pki(tmp_path, "good", host.address)
    (tmp_path / "other").mkdir()
    make_pki(tmp_path / "other", "other", host.address)
    agent = HostAgent(
        host,
        hosts.token_file,
        extra_args=["--tls-cert", str(tmp_path / "server.pem"), "--tls-key",
                    str(tmp_path / "server-key.pem"), "--tls-ca", str(tmp_path / "good-ca.pem")],
    )  # fmt: skip
    try:
        good = AgentTLS.from_files(
            str(tmp_path / "good-ca.pem"), str(tmp_path / "client.pem"),
            str(tmp_path / "client-key.pem"),
        )  # fmt: skip
        with AgentClient(agent.target, hosts.token, tls=good) as client:
            assert client.info.host == "n0"
            with tempfile.TemporaryFile() as stderr:
                worker = client.run("worker", {}, {}, stderr, name="worker")
                worker.stdin.close()
                assert worker.wait(timeout=10) == 0
        no_certificate = AgentTLS(ca=good.ca)
        wrong_ca = AgentTLS.from_files(str(tmp_path / "other" / "other-ca.pem"))
        refusals = (
            (no_certificate, "UNAVAILABLE|TLS handshake"),  # the agent drops it mid-handshake
            (wrong_ca, "TLS handshake .* not signed by the CA of --tfgrpc-agent-tls-ca"),
            (None, "UNAVAILABLE|TLS handshake"),
        )
        for tls, why in refusals:
            # Each refusal waits its whole timeout for the agent, then asks once more and is
            # told why at once: a second is time enough for the one handshake it waits on.
            with pytest.raises(AgentError, match=why):
                AgentClient(agent.target, hosts.token, tls=tls, timeout=1)
        with pytest.raises(AgentError, match="UNAUTHENTICATED"):  # TLS does not replace it
            AgentClient(agent.target, "x" * 32, tls=good)
    finally:
        agent.stop()


def _fabric_cli(*args: str, uid: int | None = None) -> subprocess.CompletedProcess[str]:
    """``tfgrpc-fabric ARGS`` as user ``uid`` would run it through sudo."""
    env = {**os.environ, "SUDO_UID": str(uid)} if uid is not None else None
    return subprocess.run([*FABRIC, *args], capture_output=True, text=True, timeout=60, env=env)


def _up(hosts: str, uid: int, *extra: str) -> str:
    up = _fabric_cli("up", "--hosts", hosts, *extra, uid=uid)
    assert up.returncode == 0, up.stderr
    return up.stdout.split()[1].rstrip(":")


# Users that no one else on this machine is (their fabrics are this test's alone).
ME, OTHER = 61_026, 61_027


def test_down_all_removes_only_the_callers_fabrics() -> None:
    needs_root()
    mine = _up("usage-m", ME)
    other = _up("usage-o", OTHER)
    try:
        status = _fabric_cli("status").stdout
        assert f"fabric {mine}: " in status and f"uid {ME}" in status, status
        down = _fabric_cli("down", "--all", uid=ME)
        assert down.returncode == 0, down.stderr
        assert f"removed: {mine}" in down.stdout
        assert f"{other} of uid {OTHER}" in down.stdout and "--all-owners" in down.stdout
        assert not Path(f"/run/netns/{mine}-usage-m").exists()
        assert Path(f"/run/netns/{other}-usage-o").exists()  # another owner's: left alone
        assert other in [f.name for f in list_fabrics()]
    finally:
        left = {f.name for f in list_fabrics()} & {mine, other}
        if left:
            _fabric_cli("down", *left, uid=OTHER)  # by name: whoever built it
    assert not Path(f"/run/netns/{other}-usage-o").exists()


def _host_line(host: str) -> str:
    (line,) = [ln for ln in _fabric_cli("status").stdout.splitlines() if f" {host}: " in ln]
    return line


def test_status_says_an_agent_is_not_running_and_how_to_start_it(tmp_path: Path) -> None:
    needs_root()
    token = tmp_path / "token"
    token.write_text("u" * 32 + "\n")
    token.chmod(0o600)
    name = _up("usage-a,usage-b", ME, "--agents", "--token-file", str(token))
    try:
        for host in ("usage-a", "usage-b"):
            assert "agent running (pid" in _host_line(host), host
        (pid,) = agent_pids(next(h for h in list_fabrics() if h.name == name).host("usage-b"))
        os.kill(pid, 9)
        deadline = time.monotonic() + 10
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        restart = f"tfgrpc-fabric agent {name} usage-b"
        line = _host_line("usage-b")
        assert line.endswith(f", agent NOT RUNNING: start it again with `{restart}`"), line
        assert "agent running" in _host_line("usage-a")
        started = _fabric_cli(*restart.split()[1:], uid=ME)
        assert started.returncode == 0 and "usage-b: agent 198.18." in started.stdout, started
        assert "agent running (pid" in _host_line("usage-b")
        refused = _fabric_cli("agent", name, "usage-x", uid=ME)
        assert refused.returncode == 2 and "no host 'usage-x'" in refused.stdout
    finally:
        down = _fabric_cli("down", name, uid=ME)
    assert down.returncode == 0, down.stderr


DEAD_AGENT_SUITE = """
import os
import pytest

@pytest.mark.message_profile(["64KiB"])
@pytest.mark.ps_topology(ps=2, workers=1)
@pytest.mark.parametrize("kill", ["kill", "next"])
def test_ps(tfgrpc, ps_cluster, kill):
    if kill == "kill":
        os.kill(int(os.environ["KILL_AGENT"]), 9)
    tfgrpc.ps_throughput(ps_cluster)
"""


def test_a_dead_agents_next_test_fails_in_one_line_without_core_log_lines(
    tfgrpc_emulated_hosts: Hosts, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    hosts = tfgrpc_emulated_hosts("usage-p0,usage-p1,usage-w0")
    monkeypatch.setenv("KILL_AGENT", str(hosts.agents["usage-p1"].pid))
    monkeypatch.delenv("GRPC_VERBOSITY", raising=False)  # the plugin's own default, not ours
    pytester.makepyfile(DEAD_AGENT_SUITE)
    result = pytester.runpytest_subprocess(*FAST, *hosts.pytest_args(), timeout=120)
    result.assert_outcomes(failed=1, errors=1)
    out = result.stdout.str() + result.stderr.str()
    section = out.split("ERROR at setup of test_ps[next-")[1].split("\n===")[0]
    (line,) = [ln for ln in section.splitlines()[1:] if ln.strip()]
    target = hosts.agents["usage-p1"].target
    assert line == (
        f"AgentError: PS 1 on host usage-p1: agent at {target}: connection refused: no agent "
        "is running there (start tfgrpc-node again) (agents from --tfgrpc-agents)"
    )
    assert "During handling" not in out and "fixtures.py" not in out
    # gRPC core's log (a dead peer's GOAWAY, chttp2_transport.cc) is off: no I/W/E lines.
    assert not re.search(r"^[IWE]\d{4} \d\d:\d\d", out, re.MULTILINE), out
    assert "chttp2" not in out and "GOAWAY" not in out
