"""TensorFlow's tasks through node agents: PS tasks and the worker on their own hosts, run by
each host's TensorFlow Python (``tfgrpc-node --tf-python``), ports held before any task starts,
the worker's commands checked by the agent on its way in. The first tests need neither
TensorFlow nor root; the emulated-host ones need both (CI's TensorFlow step runs them)."""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from test_emulated import namespace_pids, properties

from pytest_tfgrpc.hosts.agent import AgentServer, RoleError, _TaskInput, role_argv
from pytest_tfgrpc.hosts.agent_client import AgentClient, AgentError
from pytest_tfgrpc.hosts.emulated import can_build, pid_alive
from pytest_tfgrpc.model.placement import Topology
from pytest_tfgrpc.plugin.emulated import EmulatedHosts, build_emulated_hosts
from pytest_tfgrpc.ps.tf_cluster import TFCluster
from pytest_tfgrpc.roles.processes import ServerError
from pytest_tfgrpc.roles.tf_task import TaskInputError, check_cluster, check_command
from pytest_tfgrpc.wire.fabric import resolve_fabric
from pytest_tfgrpc.wire.security import TlsFiles

HAS_TF = importlib.util.find_spec("tensorflow") is not None
TOKEN = "native3-tensorflow-agents-token"
GOOD = {"kind": "push", "variables": [["v", 1, [256], "float32"]], "iterations": 5}
GOOD.update(warmup=1, max_seconds=2.0)


def _cluster(ps: list[str], worker: str = "127.0.0.1:2") -> str:
    return json.dumps({"ps": ps, "worker": [worker]})


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"kind": "exec"}, "kind='exec'"),
        ({"variables": [["v", 2, [256], "float32"]]}, "variable v: ps=2, and the cluster has 2"),
        ({"variables": [["v", 0, [2**30, 4], "float32"]]}, "17179869184 bytes, over 2147483647"),
        ({"variables": [["v;rm", 0, [1], "float32"]]}, "variable name 'v;rm'"),
        ({"variables": [["v", 0, [1], "object"]]}, "dtype 'object'"),
        ({"iterations": 0}, "iterations=0"),
        ({"max_seconds": 1e9}, "max_seconds=1000000000.0"),
        ({"script": "x"}, "unknown command fields: script"),
    ],
)
def test_a_worker_command_outside_its_bounds_is_refused_naming_the_part(
    change: dict[str, Any], says: str
) -> None:
    assert check_command(dict(GOOD), 2) == GOOD
    with pytest.raises(TaskInputError, match=re.escape(says)):
        check_command({**GOOD, **change}, 2)


def test_a_cluster_spec_is_two_jobs_of_host_ports_that_hold_the_task() -> None:
    assert check_cluster(_cluster(["10.0.0.1:5", "[fe80::1%eth0]:6"]), "ps", 1)["ps"][1]
    for bad, index, says in [
        ('{"ps": ["a:1"]}', 0, "expected"),
        (_cluster(["a:1"], "b:99999"), 0, "'b:99999' of job 'worker' is no host:port"),
        (_cluster(["a b:1"]), 0, "no host:port"),
        (_cluster([]), 0, "job 'ps' needs 1 to 256"),
        (_cluster(["a:1"]), 3, "task 3 of job 'ps' is not in"),
    ]:
        with pytest.raises(TaskInputError, match=says):
            check_cluster(bad, "ps", index)


def test_the_agent_passes_a_worker_only_the_commands_it_accepts() -> None:
    gate = _TaskInput("worker", ps_tasks=2)
    line = json.dumps(GOOD).encode() + b"\n"
    assert gate.feed(line[:10]) == b""  # a line is passed on once whole
    assert json.loads(gate.feed(line[10:])) == GOOD
    with pytest.raises(TaskInputError, match="not JSON"):
        gate.feed(b"import os\n")
    with pytest.raises(TaskInputError, match="a line over 1048576 bytes"):
        _TaskInput("worker", ps_tasks=2).feed(b" " * (1 << 20) + b"x\n")
    with pytest.raises(TaskInputError, match="PS task takes no commands"):
        _TaskInput("ps", ps_tasks=1).feed(line)


def test_an_agent_without_a_tensorflow_python_says_so_in_one_line() -> None:
    lo = resolve_fabric("lo")
    params = {"index": "0", "cluster": _cluster([lo.target(5000)])}
    with pytest.raises(RoleError) as refused:
        role_argv("ps", params, {}, lo, engine="tensorflow", host="tfless")
    assert refused.value.code is grpc.StatusCode.FAILED_PRECONDITION
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("host tfless: its agent names no TensorFlow Python")
    assert "TensorFlow's PS task" in message and "--tf-python PATH" in message
    tls = TlsFiles("c.pem", "k.pem", None)
    with pytest.raises(RoleError, match="serves no TLS"):
        role_argv("ps", params, {}, lo, engine="tensorflow", tls=tls, tf_python=sys.executable)
    argv, env = role_argv("ps", params, {}, lo, engine="tensorflow", tf_python=sys.executable)
    assert argv[0] == sys.executable and "PYTHONPATH" not in env
    assert json.loads(argv[argv.index("--cluster") + 1]) == json.loads(params["cluster"])


@pytest.fixture
def agent() -> Iterator[AgentClient]:
    """An agent on loopback, in this process, that names a TensorFlow Python (this one: only
    its refusals are exercised here), and a client of it."""
    server = AgentServer(resolve_fabric("lo"), TOKEN, host="tfhost", tf_python=sys.executable)
    target = server.serve(0)
    client = AgentClient(target, TOKEN)
    try:
        yield client
    finally:
        client.close()
        server.close()


def test_a_task_binds_only_a_port_its_driver_holds_on_the_agents_address(
    agent: AgentClient, tmp_path: Path
) -> None:
    assert "tensorflow" in agent.info.engines
    held = agent.reserve()
    address, port = held.rsplit(":", 1)
    assert address == "127.0.0.1"
    probe = socket.socket()
    with probe, pytest.raises(OSError) as taken:  # held: nobody else binds it
        probe.bind((address, int(port)))
    assert taken.value.errno == errno.EADDRINUSE
    err = (tmp_path / "err").open("wb")
    for cluster, says in [
        (_cluster(["127.0.0.2:7000"]), "not on this agent's address"),
        (_cluster([f"{address}:1"]), "port 1 is no port driver"),
    ]:
        with pytest.raises(AgentError, match=says):
            agent.run("ps", {"index": "0", "cluster": cluster}, {}, err, name="ps 0",
                      engine="tensorflow")  # fmt: skip
    with pytest.raises(AgentError, match="takes the parameters cluster and index"):
        agent.run("worker", {"index": "0"}, {}, err, name="worker", engine="tensorflow")


TF_SUITE = """
import pytest

pytestmark = pytest.mark.tfgrpc_engines("tensorflow")

@pytest.mark.message_profile(["64KiB"])
def test_p2p(tfgrpc, tensor_server):
    tfgrpc.p2p_bandwidth(tensor_server)

@pytest.mark.message_profile(["64KiB"])
@pytest.mark.ps_topology(ps=2, workers=1)
def test_ps(tfgrpc, ps_cluster):
    tfgrpc.ps_throughput(ps_cluster)
"""


def test_a_tensorflow_test_through_an_agent_without_tensorflow_fails_in_one_line(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No TensorFlow needed: the agent (without ``--tf-python``) refuses before any starts."""
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest_tfgrpc.hosts.agent", "--fabric", "lo", "--port", "0",
         "--token-file", str(token), "--host-name", "tfless", "--exit-on-stdin-eof"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        target = json.loads(proc.stdout.readline())["target"]
        # The driver's own TensorFlow Python is not looked at before the agent refuses.
        monkeypatch.setenv("TFGRPC_TF_PYTHON", sys.executable)
        pytester.makepyfile(test_tf=TF_SUITE)
        result = pytester.runpytest_subprocess(
            "--fabric=lo", f"--tfgrpc-agents={target}", f"--tfgrpc-agent-token-file={token}",
            "-p", "no:cacheprovider", "-rE", timeout=120,
        )  # fmt: skip
    finally:
        with contextlib.suppress(OSError):
            proc.communicate(timeout=10)
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(
        [
            f"host tfless: its agent names no TensorFlow Python, so it cannot run TensorFlow's "
            f"{role}: start tfgrpc-node there with --tf-python PATH, the python of an "
            "environment with pytest-tfgrpc[[]tensorflow[]] (or drop the tensorflow engine)"
            for role in ("tensor server", "PS task")
        ]
    )


def test_tfgrpc_fabric_up_gives_its_agents_a_tensorflow_python(tmp_path: Path) -> None:
    ok, why = can_build()
    if not ok:
        pytest.skip(why)
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    fabric = [sys.executable, "-m", "pytest_tfgrpc.cli.fabric"]
    up = subprocess.run(
        [*fabric, "up", "--hosts", "n3cli", "--agents", "--token-file", str(token),
         "--tf-python", sys.executable],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert up.returncode == 0, up.stderr
    name = up.stdout.split()[1].rstrip(":")
    try:
        target = re.search(r" agent (\S+)$", up.stdout.strip(), re.MULTILINE)
        assert target is not None, up.stdout
        with AgentClient(target.group(1), TOKEN) as client:
            assert "tensorflow" in client.info.engines
    finally:
        down = subprocess.run([*fabric, "down", name], capture_output=True, text=True)
    assert down.returncode == 0, down.stdout + down.stderr
    alone = subprocess.run([*fabric, "up", "--hosts", "1", "--tf-python", sys.executable],
                           capture_output=True, text=True)  # fmt: skip
    assert alone.returncode == 2 and "--tf-python goes with --agents" in alone.stderr


# --- with TensorFlow, on emulated hosts ---------------------------------------------------------

NO_TF = "TensorFlow is not installed (the tensorflow extra)"
needs_tf = pytest.mark.skipif(not HAS_TF, reason=NO_TF)
HOSTS = "n3ps0,n3ps1,n3w0"
BOUNDED = ("--tfgrpc-iterations=20", "--tfgrpc-warmup=1", "--tfgrpc-max-seconds=1")


@pytest.fixture(scope="module")
def tf_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatedHosts]:
    """Three hosts whose agents run TensorFlow's tasks with this Python; one set per module."""
    if not HAS_TF:
        pytest.skip(NO_TF)
    with contextlib.ExitStack() as stack:
        yield build_emulated_hosts(
            stack, tmp_path_factory, HOSTS, agent_args=["--tf-python", sys.executable]
        )


def _only_agents_left(hosts: EmulatedHosts) -> None:
    for host in hosts.fabric.hosts:
        alive = [hosts.agents[host.name].pid]
        deadline = time.monotonic() + 10
        while (left := [p for p in namespace_pids(host.netns) if pid_alive(p)]) != alive:
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert left == alive, host.name


@needs_tf
def test_tensorflow_tests_run_their_tasks_on_the_agents_hosts(
    tf_hosts: EmulatedHosts, pytester: pytest.Pytester
) -> None:
    """A P2P test: PS task 0 on n3ps0, the worker here; a PS test: PS 0 and 1 on n3ps0 and
    n3ps1, the worker on n3w0. Both record the engine and where each task ran."""
    pytester.makepyfile(test_tf=TF_SUITE)
    xml = pytester.path / "perf.xml"
    result = pytester.runpytest_subprocess(
        *BOUNDED, *tf_hosts.pytest_args(), f"--junitxml={xml}", "-p", "no:cacheprovider",
        timeout=300,
    )  # fmt: skip
    result.assert_outcomes(passed=2)
    fabric, bridge = tf_hosts.fabric, tf_hosts.fabric.bridge
    address = {h.name: h.address for h in fabric.hosts}
    props = properties(xml)
    p2p = props[f"test_p2p[{bridge}]"]
    assert "engine=tensorflow" in p2p["tfgrpc.p2p_bandwidth.settings"]
    assert p2p["tfgrpc.p2p_bandwidth.ends"] == (
        f"client={socket.gethostname()}@{fabric.driver_address} server=n3ps0@{address['n3ps0']}"
    )
    ps = props[f"test_ps[{bridge}]"]
    settings = ps["tfgrpc.ps_throughput.settings"]
    assert "ps_engine=tensorflow" in settings and "workers_engine=tensorflow" in settings
    assert ps["tfgrpc.ps_throughput.ends"].split() == [
        f"ps0=n3ps0@{address['n3ps0']}",
        f"ps1=n3ps1@{address['n3ps1']}",
        f"worker0=n3w0@{address['n3w0']}",
    ]
    _only_agents_left(tf_hosts)


@needs_tf
def test_the_agent_stops_a_worker_sent_a_command_it_refuses(tf_hosts: EmulatedHosts) -> None:
    """The worker's commands travel on the agent's Run stream: a good one is measured, a bad
    one never reaches the task, which the agent stops, saying why."""
    fabric = resolve_fabric(tf_hosts.fabric.bridge)
    clients = [AgentClient(t, tf_hosts.token) for t in tf_hosts.agent_targets(["n3ps0", "n3w0"])]
    try:
        ps, worker = (client.launcher() for client in clients)
        with TFCluster(
            sys.executable, fabric=fabric, topology=Topology(1, 1),
            ps_launchers=(ps,), worker_launcher=worker,
        ) as cluster:  # fmt: skip
            steps = cluster.run("pull", [["v", 0, [1024], "float32"]], iterations=3, warmup=1,
                                max_seconds=5.0)  # fmt: skip
            assert len(steps.samples_ns) == 3
            cluster.tasks[-1].send({**GOOD, "variables": [["v", 0, [2**31], "float32"]]})
            with pytest.raises(ServerError) as stopped:
                cluster.tasks[-1].read_line(30.0)
            assert "refused a line of its input: variable v: 8589934592 bytes" in str(stopped.value)
    finally:
        for client in clients:
            client.close()
    _only_agents_left(tf_hosts)
