"""Cluster specs as launchers write them: TF_CONFIG (TensorFlow, Kubeflow TFJob), SLURM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_tfgrpc.hosts.cluster_spec import (
    ClusterSpecError,
    load_cluster,
    parse_cluster_spec,
    split_address,
    task_device,
)
from pytest_tfgrpc.hosts.slurm import (
    SlurmError,
    agent_addresses,
    expand_nodelist,
    expand_tasks_per_node,
    slurm_allocation,
)

# TF_CONFIG values as TensorFlow's docs, Kubeflow's TFJob operator and users write them.
USABLE = {
    "tf docs": (
        {"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222", "host2:2222"],
                     "ps": ["host3:2222"]}, "task": {"type": "worker", "index": 1}},
        {"chief": 1, "worker": 2, "ps": 1},
    ),
    "kubeflow master": (
        {"cluster": {"master": ["job-master-0.ns.svc:2222"], "ps": ["job-ps-0.ns.svc:2222"],
                     "worker": ["job-worker-0.ns.svc:2222"]},
         "task": {"type": "master", "index": 0}, "environment": "cloud"},
        {"master": 1, "ps": 1, "worker": 1},
    ),
    "evaluator": (
        {"cluster": {"evaluator": ["e:1"], "ps": ["p:1"]}, "task": {"type": "evaluator"}},
        {"evaluator": 1, "ps": 1},
    ),
    "sparse": ({"cluster": {"worker": {"1": "w1:2222", "3": "w3:2222"}}}, {"worker": 2}),
    "sparseCluster": (
        {"sparseCluster": {"worker": {"0": "w0:2222"}, "ps": ["p0:2222"]},
         "task": {"type": "worker", "index": 0}},
        {"worker": 1, "ps": 1},
    ),
    "lone address": ({"cluster": {"ps": "p0:2222"}}, {"ps": 1}),
    "custom job": ({"cluster": {"localhost": ["a:1"], "ps": ["b:2"]}}, {"localhost": 1, "ps": 1}),
}  # fmt: skip


@pytest.mark.parametrize("form", USABLE, ids=list(USABLE))
def test_real_world_tf_configs_are_read(form: str) -> None:
    config, jobs = USABLE[form]
    spec = parse_cluster_spec(json.dumps(config), "TF_CONFIG", resolve=False)
    assert {job: len(spec.job(job)) for job in jobs} == jobs
    assert len(spec.tasks) == sum(jobs.values())


def test_sparse_jobs_keep_their_indices() -> None:
    config = {"cluster": {"worker": {"3": "w3:2", "1": "w1:2"}}}
    spec = parse_cluster_spec(json.dumps(config), "TF_CONFIG", resolve=False)
    assert [(t.index, t.address) for t in spec.job("worker")] == [(1, "w1:2"), (3, "w3:2")]


@pytest.mark.parametrize(
    ("address", "target", "zone"),
    [
        ("[fe80::1%eth0]:2222", "[fe80::1%eth0]:2222", "eth0"),
        ("[fe80::a:b%ib0]:1", "[fe80::a:b%ib0]:1", "ib0"),
        ("[2001:db8::1]:80", "[2001:db8::1]:80", None),
        ("10.1.2.3:2222", "10.1.2.3:2222", None),
    ],
)
def test_link_local_addresses_keep_their_zone(address: str, target: str, zone: str) -> None:
    spec = parse_cluster_spec(json.dumps({"cluster": {"ps": [address]}}), "TF_CONFIG")
    (task,) = spec.tasks
    assert (task.target, task.zone) == (target, zone)
    if zone:
        assert task_device(task) == zone  # the fabric the zone names, not a route lookup


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("[]", "[] is not a JSON object"),
        ('"x"', "'x' is not a JSON object"),
        ('{"cluster": []}', '"cluster" is [], not an object of jobs'),
        ('{"cluster": {"ps": {"ps-0": "h:1"}}}', "job 'ps', key 'ps-0' (value 'h:1')"),
        ('{"cluster": {"ps": {"a": 5}}}', "job 'ps', key 'a' (value 5)"),
        ('{"cluster": {"ps": 7}}', "job 'ps' is 7"),
        ('{"cluster": {"ps": null}}', "job 'ps' is None"),
        ('{"cluster": {"ps": [["h:1"]]}}', "job 'ps', task 0: ['h:1'] is not a \"host:port\""),
        ('{"cluster": {"ps": [{"h": 1}]}}', "job 'ps', task 0: {'h': 1}"),
        ('{"cluster": {"worker": ["a:1", "b"]}}', "job 'worker', task 1: 'b' is not host:port"),
        ('{"cluster": {"ps": ["h:0"]}}', "port 0 of 'h:0' is not from 1 to 65535"),
        ('{"cluster": {"ps": ["h:true"]}}', "port 'true' of 'h:true' is not a number"),
        ('{"cluster": {"ps": ["fe80::1:22"]}}', "needs brackets"),
        ('{"cluster": {"ps": ["[fe80::1:22"]}}', "opens '[' without closing it"),
        ('{"cluster": {"ps": ["[10.0.0.1%eth0]:1"]}}', "zone %eth0 of '[10.0.0.1%eth0]:1' needs"),
        ('{"cluster": {"ps": ["[2001:db8::1%eth0]:1"]}}', "only link-local (fe80::/10) has"),
        ('{"cluster": {"ps": [":1"]}}', "':1' is not host:port"),
        ('{"cluster": {"ps": ["[fe80::1%]:1"]}}', "has '%' but no zone"),
        ('{"cluster": {"ps": ["h:+80"]}}', "port '+80' of 'h:+80' is not a number"),
        ('{"cluster": {"ps": ["h: 80"]}}', "port ' 80'"),
        ('{"cluster": {"ps": {"1": "a:1", "01": "b:1"}}}', "task 1 is already given by key '1'"),
        ('{"cluster": {"ps": {"99999999999999": "a:1"}}}', "key '99999999999999'"),
        ('{"cluster": {"": ["a:1"]}}', "a job with an empty name"),
        ("[" * 5000, "not JSON"),
    ],
)
def test_every_malformed_spec_is_a_clear_error(config: str, message: str) -> None:
    with pytest.raises(ClusterSpecError) as info:
        parse_cluster_spec(config, "TF_CONFIG", resolve=False)
    assert message in str(info.value)
    assert str(info.value).startswith("TF_CONFIG")


@pytest.mark.parametrize(
    "value",
    [
        '{"task": {"type": "worker", "index": 0}}',  # a single worker: no cluster
        '{"cluster": {"chief": ["c:1"]}, "task": {"type": "chief"}}',
        '{"cluster": {"ps": {"ps-0": "h:1"}}}',
        '{"cluster": {"ps": ["no-such-host.invalid:1"]}}',
        "not json",
        "{}",
    ],
)
def test_a_tf_config_from_the_environment_never_fails_the_load(value: str) -> None:
    load = load_cluster(None, {"TF_CONFIG": value})
    assert load.spec is None and load.problem is None
    assert len(load.notes) == 1


def test_an_explicit_spec_is_strict_but_only_a_problem(tmp_path: Path) -> None:
    path = tmp_path / "cluster.json"
    path.write_text('{"cluster": {"ps": {"ps-0": "h:1"}}}')
    load = load_cluster(str(path), {"TF_CONFIG": '{"cluster": {"ps": ["127.0.0.1:5"]}}'})
    assert load.spec is None and "key 'ps-0'" in str(load.problem)
    missing = load_cluster(str(tmp_path / "none.json"), {})
    assert "none.json" in str(missing.problem)
    path.write_bytes(b"\xff\xfe")
    assert "cluster spec" in str(load_cluster(str(path), {}).problem)


def test_split_address_keeps_names_for_later() -> None:
    assert split_address("node01:7461", "x") == ("node01", None, 7461)


# --- SLURM -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nodelist", "nodes"),
    [
        ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
        ("cn[008-010]", ["cn008", "cn009", "cn010"]),
        ("r[1-2]n[01-02]", ["r1n01", "r1n02", "r2n01", "r2n02"]),
        ("gpu1,gpu3", ["gpu1", "gpu3"]),
        ("nid[00001-00002],login1", ["nid00001", "nid00002", "login1"]),
        ("node[1-3]-ib", ["node1-ib", "node2-ib", "node3-ib"]),
        ("single", ["single"]),
    ],
)
def test_slurm_hostlists_expand(nodelist: str, nodes: list[str]) -> None:
    assert list(expand_nodelist(nodelist)) == nodes


@pytest.mark.parametrize(
    ("text", "counts"),
    [("2(x3)", [2, 2, 2]), ("2(x3),1", [2, 2, 2, 1]), ("1", [1]), ("4,2(x2),8", [4, 2, 2, 8])],
)
def test_slurm_tasks_per_node_expand(text: str, counts: list[int]) -> None:
    assert list(expand_tasks_per_node(text)) == counts


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SLURM_JOB_NODELIST": "node[01-"}, "SLURM_JOB_NODELIST='node[01-' is not a SLURM"),
        ({"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "2(x"}, "SLURM_TASKS_PER"),
        ({"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "1(x3)"}, "gives 3 nodes"),
        ({"SLURM_JOB_NODELIST": "n1", "SLURMD_NODENAME": "n1"}, "no node besides this one"),
        ({"SLURM_JOB_NODELIST": "n[1-2]", "TFGRPC_AGENT_PORT": "x"}, "TFGRPC_AGENT_PORT='x'"),
        ({}, "SLURM_JOB_NODELIST is not set"),
    ],
)
def test_bad_slurm_environments_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(SlurmError, match=message.replace("[", r"\[").replace("(", r"\(")):
        agent_addresses({"SLURMD_NODENAME": "n1", **env})


def test_the_agents_are_every_other_node_of_the_allocation() -> None:
    env = {
        "SLURM_JOB_NODELIST": "node[01-03,07]",
        "SLURM_TASKS_PER_NODE": "1(x4)",
        "SLURMD_NODENAME": "node01",
        "SLURM_JOB_ID": "42",
        "TFGRPC_AGENT_PORT": "9000",
    }
    allocation = slurm_allocation(env)
    assert allocation is not None and allocation.job_id == "42"
    assert allocation.tasks_per_node == (1, 1, 1, 1)
    assert agent_addresses(env) == ("node02:9000", "node03:9000", "node07:9000")
    old = {"SLURM_NODELIST": "a[1-2]", "SLURMD_NODENAME": "a2"}  # older SLURM releases
    assert agent_addresses(old) == ("a1:7461",)
    assert slurm_allocation({}) is None


# --- through the plugin ----------------------------------------------------------------

PLAIN_SUITE = """
def test_plain():
    assert True
"""

MEASURING_SUITE = """
import pytest

def test_plain():
    assert True

@pytest.mark.message_profile(["1KiB"])
def test_latency(tfgrpc, tensor_server):
    tfgrpc.p2p_latency(tensor_server)
"""

QUICK = ("--tfgrpc-iterations=10", "--tfgrpc-warmup=1", "--tfgrpc-max-seconds=2")
ENVIRONMENT_FORMS = [
    '{"task": {"type": "worker", "index": 0}}',
    '{"sparseCluster": {"worker": {"0": "w0:2222"}}, "task": {"type": "worker", "index": 0}}',
    '{"cluster": {"master": ["m:2222"]}, "task": {"type": "master", "index": 0}}',
    '{"cluster": {"ps": {"ps-0": "h:2222"}}}',
    '{"cluster": {"ps": ["[fe80::1%nosuchif0]:2222"]}}',
    "{not json",
]


@pytest.mark.parametrize("value", ENVIRONMENT_FORMS)
def test_a_tf_config_in_the_environment_never_stops_a_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("TF_CONFIG", value)
    pytester.makepyfile(PLAIN_SUITE)
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)
    assert "INTERNALERROR" not in result.stdout.str()


def test_a_measuring_run_under_a_foreign_tf_config_measures_here(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"chief": ["c:1"]}, "task": {"type": "chief"}}')
    pytester.makepyfile(MEASURING_SUITE)
    xml = pytester.path / "perf.xml"
    result = pytester.runpytest(*QUICK, f"--junitxml={xml}")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([
        '*TF_CONFIG names no "ps" or "worker" task (jobs: chief)*',
        "*1 of 1 measuring tests went through loopback*",
    ])  # fmt: skip
    from junitparser.xunit2 import JUnitXml

    props = {
        case.name: {p.name: p.value for p in case.properties()}  # type: ignore[attr-defined]
        for suite in JUnitXml.fromfile(str(xml))
        for case in suite
    }
    assert props["test_latency[lo]"]["tfgrpc.path"].startswith("loopback (server and client")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ('{"cluster": {"ps": {"ps-0": "h:2222"}}}', "job 'ps', key 'ps-0' (value 'h:2222')"),
        ('{"cluster": {"ps": ["h"]}}', "job 'ps', task 0: 'h' is not host:port"),
        ("[1]", "[1] is not a JSON object"),
    ],
)
def test_an_explicit_bad_spec_fails_only_the_tests_that_need_it(
    pytester: pytest.Pytester, spec: str, message: str
) -> None:
    path = pytester.path / "cluster.json"
    path.write_text(spec)
    pytester.makepyfile(MEASURING_SUITE)
    result = pytester.runpytest(*QUICK, f"--tfgrpc-cluster={path}")
    result.assert_outcomes(passed=1, errors=1)
    escaped = message.replace("[", "[[]")
    result.stdout.fnmatch_lines([f"*tests that need the cluster will fail*{escaped}*"])
    assert "INTERNALERROR" not in result.stdout.str()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--tfgrpc-agents=127.0.0.1:9",), "no agent token: give --tfgrpc-agent-token-file FILE"),
        (("--tfgrpc-agents=slurm",), "--tfgrpc-agents=slurm: no SLURM allocation here"),
        (("--tfgrpc-agents=cluster",), "--tfgrpc-agents=cluster: no cluster spec"),
        (("--tfgrpc-agents=nohost.invalid:9", "--tfgrpc-agent-token-file=tok"), "nohost.invalid"),
        (("--tfgrpc-agents=127.0.0.1:x", "--tfgrpc-agent-token-file=tok"), "port 'x'"),
    ],
)
def test_agents_that_cannot_be_used_fail_only_the_tests_that_need_them(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...], message: str
) -> None:
    for name in ("TFGRPC_AGENT_TOKEN", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "TF_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    (pytester.path / "tok").write_text("t" * 32 + "\n")
    pytester.makepyfile(MEASURING_SUITE)
    result = pytester.runpytest(*QUICK, *args)
    result.assert_outcomes(passed=1, errors=1)  # an error at setup of the measuring test
    assert message in result.stdout.str()
    assert "INTERNALERROR" not in result.stdout.str()
