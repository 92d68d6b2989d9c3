"""The fault cases as one table: each row is an input (a suite, options, environment, files)
and the outcome it must have (exit status, lines, JUnit properties, results file, time, no
process left). Adding a case is adding a row to :data:`CASES`.

Rows name their source: ``E<n>`` is case n of §E in
``shared/reference/reliability-and-conventions.md``; ``I13.<kind>`` a kind of issue 13.
Every run is a real pytest (or ``tfgrpc-server``) in a subprocess; its outcome is checked,
and the summary at the end of the module lists each case with its outcome.

Placeholders in a row's text (``{ca}``, ``{closed_port}``, ``{veth_slow}``, ...) are made
only for rows that use them (see :class:`World`); rows that need root (veth links) or an
optional package skip, saying so, where those are missing.
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import QUICK
from junitparser.xunit2 import JUnitXml

# --- suites the rows run ---------------------------------------------------------------------
LATENCY = """
import pytest

@pytest.mark.message_profile(["4B", "1KiB"])
def test_latency(tfgrpc, tensor_server):
    tfgrpc.p2p_latency(tensor_server)
"""

PLAIN = """
def test_plain():
    assert True
"""

#: A 3-size sweep whose server is killed as the second size starts: the first is kept.
KILLED_MID_SWEEP = """
import os, signal
import pytest
from pytest_tfgrpc.bench import p2p

@pytest.mark.message_profile(["1KiB", "2KiB", "4KiB"])
def test_sweep(tfgrpc, tensor_server, monkeypatch):
    real = p2p.CpuProbe
    made = []

    def probe(target):
        made.append(target)
        if len(made) == 2:
            os.kill(tensor_server.pid, signal.SIGKILL)
            tensor_server.died(grace=5)
        return real(target)

    monkeypatch.setattr(p2p, "CpuProbe", probe)
    tfgrpc.p2p_latency(tensor_server)

def test_after(tfgrpc, tensor_server):
    tfgrpc.p2p_latency(tensor_server, ["4B"])
"""

PS_KILLED_MID_SWEEP = """
import os, signal
import pytest

@pytest.mark.message_profile(["1KiB", "2KiB", "4KiB"])
def test_ps_sweep(tfgrpc, ps_cluster):
    real = ps_cluster.configure
    calls = []

    def configure(jobs, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            os.kill(ps_cluster.ps[0].pid, signal.SIGKILL)
            ps_cluster.ps[0].died(grace=5)
        return real(jobs, *args, **kwargs)

    ps_cluster.configure = configure
    tfgrpc.ps_throughput(ps_cluster)
"""

DEAD_BEFORE_FIRST_CALL = """
import os, signal

def test_dead(tfgrpc, tensor_server):
    os.kill(tensor_server.pid, signal.SIGKILL)
    tensor_server.died(grace=5)
    tfgrpc.p2p_latency(tensor_server, ["4B"])
"""

STRAY_STDOUT = """
import sys
from pytest_tfgrpc.roles.processes import ServerProcess

def test_stray(tfgrpc, fabric):
    # sitecustomize-like noise: the interpreter prints before the server's ready line
    code = "print('banner'); print('{{not json'); import runpy, sys; " \\
        "sys.argv = ['tfgrpc-server', '--fabric', 'lo', '--exit-on-stdin-eof']; " \\
        "runpy.run_module('pytest_tfgrpc.roles.tensor_server', run_name='__main__')"
    server = ServerProcess([sys.executable, "-c", code], fabric=fabric, name="noisy", env=None)
    try:
        server._wait_ready(30)
        tfgrpc.p2p_latency(server, ["4B"])
    finally:
        server.stop()
"""

#: A remote server (started by the test, as on another host) that dies mid-run.
REMOTE_DIES = """
import os, signal, threading
from pytest_tfgrpc import bench
from pytest_tfgrpc.bench.timing import RunSpec
from pytest_tfgrpc.roles.processes import ServerProcess

class Remote:
    # what a test sees of a server on another host: a target, no process to watch
    def __init__(self, server):
        self.target, self.fabric, self.name = server.target, server.fabric, "ps[0] on otherhost"
    def died(self, grace=0.5):
        return None

def test_remote(fabric):
    server = ServerProcess.start(fabric)
    threading.Timer(1.0, os.kill, (server.pid, signal.SIGKILL)).start()
    run = RunSpec(iterations=10**7, warmup=0, max_seconds=20, warmup_seconds=1)
    try:
        bench.p2p_bandwidth(Remote(server), [1 << 20], bench.BandwidthCall(rpc="stream", run=run))
    finally:
        server.stop()
"""

NUMPY_PROPERTY = """
import numpy as np

class Odd:
    def __str__(self):
        raise RuntimeError("no text")

def test_numpy(record_property):
    record_property("np_float", np.float64(1.5))
    record_property("np_int", np.int32(7))
    record_property("np_array", np.arange(3))
    record_property("odd", Odd())
    record_property(3, "name not a string")

def test_other(tfgrpc, tensor_server):
    tfgrpc.p2p_latency(tensor_server, ["4B"])
"""

EDGE_SIZES = """
import pytest

@pytest.mark.message_profile(["0B", "1B"])
@pytest.mark.parametrize("mode", ["raw", "protobuf"])
@pytest.mark.parametrize("rpc", ["unary", "stream"])
def test_p2p(tfgrpc, tensor_server, mode, rpc):
    tfgrpc.p2p_latency(tensor_server, mode=mode, rpc=rpc, label="lat")
    tfgrpc.p2p_bandwidth(tensor_server, mode=mode, rpc=rpc, label="push")
    tfgrpc.p2p_bandwidth(tensor_server, mode=mode, rpc=rpc, direction="pull", label="pull")

@pytest.mark.message_profile(["0B", "1B"])
@pytest.mark.parametrize("mode", ["raw", "protobuf"])
def test_ps(tfgrpc, ps_cluster, mode):
    tfgrpc.ps_throughput(ps_cluster, mode=mode)
"""

LIMIT_BOUNDARY = """
import pytest

@pytest.mark.message_profile(["4194303B", "4194304B", "4194305B", "8200000B"])
def test_boundary(tfgrpc, tensor_server):
    tfgrpc.p2p_bandwidth(tensor_server, rpc="unary")
"""


def sized(sizes: str) -> str:
    """A suite whose marker declares ``sizes``; it must never start a server."""
    return f"""
import pytest

@pytest.mark.message_profile({sizes})
def test_sized(tfgrpc, tensor_server):
    tfgrpc.p2p_latency(tensor_server)
"""


def topology(args: str) -> str:
    return f"""
import pytest

@pytest.mark.ps_topology({args})
def test_topology(tfgrpc, ps_cluster):
    tfgrpc.ps_throughput(ps_cluster, ["1KiB"])
"""


OWN_FABRIC_FIXTURE = """
import pytest

@pytest.fixture
def fabric():
    return "my-own-fabric"

def test_mine(fabric):
    assert fabric == "my-own-fabric"

def test_theirs(tfgrpc, tensor_server):
    assert tensor_server.fabric.name == "lo"
    tfgrpc.p2p_latency(tensor_server, ["4B"])
"""

OWN_FABRIC_OPTION = """
def pytest_addoption(parser):
    parser.addoption("--fabric", default="mine")
"""

OWN_FABRIC_OPTION_TEST = """
def test_option(pytestconfig, tfgrpc, tensor_server):
    assert pytestconfig.getoption("fabric") == "production"
    assert tensor_server.fabric.name == "lo"
"""

SLOW = """
import time
import pytest

@pytest.mark.message_profile(["4B"])
def test_one(tfgrpc, tensor_server):
    tfgrpc.p2p_latency(tensor_server)

@pytest.mark.message_profile(["4B"])
def test_two(tfgrpc, tensor_server):
    tfgrpc.p2p_latency(tensor_server)

@pytest.mark.parametrize("n", range(6))
def test_slow(fabric, n):
    # a server of its own alive when the signal comes (tensor_server would hold the
    # measurement lock under xdist, and the other tests would wait for it)
    from pathlib import Path
    from pytest_tfgrpc.roles.processes import ServerProcess
    with ServerProcess.start(fabric):
        Path("sleeping-%d" % n).write_text("")
        try:
            time.sleep(30)
        except KeyboardInterrupt:  # the signal reached the process running this test
            Path("interrupted-%d" % n).write_text(repr(time.monotonic()))
            raise
"""

CRASH = """
import os

def test_fine(tfgrpc, tensor_server):
    tfgrpc.p2p_latency(tensor_server, ["4B"])

def test_crash(tensor_server):
    os._exit(3)
"""

DELAYED = """
import pytest
from pytest_tfgrpc.roles.processes import ServerProcess

@pytest.mark.tfgrpc_run(max_seconds=0.5, warmup_seconds=0.5)
def test_deadline(tfgrpc, fabric):
    with ServerProcess.start(fabric, extra_args=["--delay", "13s"]) as server:
        tfgrpc.p2p_latency(server, ["4B"], iterations=1, warmup=0)
"""

#: The issue's case: a unary push that takes longer than the old fixed deadline (10 s +
#: 10 MB/s: 10.2 s for 1.5 MiB) on a 1 Mbit/s link (12.6 s), in a run that allows 40 s.
SLOW_LINK = """
import pytest

@pytest.mark.message_profile(["1536KiB"])
@pytest.mark.tfgrpc_run(max_seconds=40, warmup_seconds=1)
def test_push(tfgrpc, tensor_server):
    result = tfgrpc.p2p_bandwidth(tensor_server, rpc="unary", iterations=1, warmup=0)
    assert result.sizes[0].samples_ns.min() > 10.5e9  # the link was the slow one
"""

MTLS_SERVER = """
import os
import pytest
from pytest_tfgrpc.roles.processes import ServerProcess
from pytest_tfgrpc.wire.security import TlsFiles

@pytest.fixture
def mtls_server(fabric):
    env = {{**os.environ, **TlsFiles("{cert}", "{key}", "{ca}").env()}}
    with ServerProcess.start(fabric, env=env) as server:
        yield server

def test_reach(tfgrpc, mtls_server):
    tfgrpc.p2p_latency(mtls_server, ["4B"])
"""

#: A TLS tensor server "on another host" (here, named by TF_CONFIG): the cluster spec's
#: reachability check must speak TLS too.
TLS_REMOTE_CONFTEST = """
import json, os
from pytest_tfgrpc.roles.processes import ServerProcess
from pytest_tfgrpc.wire.fabric import resolve_fabric
from pytest_tfgrpc.wire.security import TlsFiles

_env = {{**os.environ, **TlsFiles("{SERVER_cert}", "{SERVER_key}", "{ca}").env()}}
_server = ServerProcess.start(resolve_fabric("lo"), env=_env)
os.environ["TF_CONFIG"] = json.dumps({{"cluster": {{"ps": [_server.target]}}}})

def pytest_unconfigure(config):
    _server.stop()
"""


def tls_remote_conftest(server: str = "") -> str:
    """The conftest of a remote TLS server whose certificate is ``{server}cert``."""
    return TLS_REMOTE_CONFTEST.replace("{SERVER_", "{" + server)


TLS_REMOTE = """
def test_remote(tfgrpc, tensor_server):
    assert tensor_server.pid is None  # the spec's server, not one this run started
    tfgrpc.p2p_latency(tensor_server, ["4B"])
"""

TLS_RUN = """
import pytest

@pytest.mark.message_profile(["4B", "64KiB"])
def test_latency(tfgrpc, tensor_server):
    tfgrpc.p2p_latency(tensor_server)

@pytest.mark.message_profile(["1KiB"])
def test_ps(tfgrpc, ps_cluster):
    tfgrpc.ps_throughput(ps_cluster)
"""

GUARDED = """
import grpc, pytest
from pytest_tfgrpc.roles.parameter_server import method
from pytest_tfgrpc.wire import codec, grpc_settings
from pytest_tfgrpc.wire._proto import service_pb2
from pytest_tfgrpc.wire.security import TOKEN_KEY

@pytest.mark.message_profile(["1KiB"])
def test_refusals(tfgrpc, tensor_server, ps_cluster):
    with grpc.insecure_channel(tensor_server.target) as channel:
        pull = channel.unary_unary(grpc_settings.method("raw", "Pull"))
        for nbytes in (1025, 1 << 30, 3 << 30):
            with pytest.raises(grpc.RpcError) as info:
                pull(codec.encode_pull_request(nbytes, "float32", 0), timeout=10)
            assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert f"{{nbytes}} B refused" in info.value.details()
        push = channel.unary_unary(grpc_settings.method("raw", "Push"))
        with pytest.raises(grpc.RpcError) as info:
            push(bytes(4 << 20), timeout=10)
        assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    tfgrpc.p2p_latency(tensor_server, label="after_refusals")  # still healthy
    job = service_pb2.PSJob(job_id=99, task=0, workers=1)
    configure = ps_cluster.channel(0).unary_unary(
        method("Configure"),
        request_serializer=service_pb2.PSJob.SerializeToString,
        response_deserializer=service_pb2.PSJobStats.FromString,
    )
    for metadata in (None, ((TOKEN_KEY, "guess"),)):
        with pytest.raises(grpc.RpcError) as info:
            configure(job, timeout=10, metadata=metadata)
        assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED
        print("REFUSED", info.value.details())
    tfgrpc.ps_throughput(ps_cluster, label="after_job_refusals")  # its own jobs still run
"""

#: Issue 25's malformed input to the native server, and strangers' calls to native PS tasks:
#: each refused with its own status, the server still answering, the job's aggregate intact.
NATIVE_GUARDED = """
import grpc, pytest
from pytest_tfgrpc.model.profiles import Profile, TensorSpec
from pytest_tfgrpc.roles.parameter_server import method
from pytest_tfgrpc.wire import codec, grpc_settings

def varint(value):
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out + bytes([value]))

HOSTILE = [
    ("Echo", b"\\x1a" + varint(2**64 - 11), "INVALID_ARGUMENT"),  # the 11 bytes that looped
    ("Echo", b"\\x08\\x01\\x22" + varint(2**64 - 11), "INVALID_ARGUMENT"),
    ("Push", b"\\x08\\x01\\x12" + varint(2**64 - 3), "INVALID_ARGUMENT"),
    ("Pull", b"\\x08" + varint(2**40), "RESOURCE_EXHAUSTED"),  # the 7 bytes that aborted
    ("Pull", codec.encode_pull_request(1025, "uint8", 0), "RESOURCE_EXHAUSTED"),
    ("Pull", b"\\x08" + varint(2**64 - 1), "INVALID_ARGUMENT"),
]

@pytest.mark.tfgrpc_engines("native")
@pytest.mark.message_profile(["1KiB"])
def test_native_refusals(tfgrpc, tensor_server, ps_cluster):
    with grpc.insecure_channel(tensor_server.target) as channel:
        for name, body, code in HOSTILE:
            with pytest.raises(grpc.RpcError) as info:
                channel.unary_unary(grpc_settings.method("protobuf", name))(body, timeout=10)
            assert info.value.code().name == code, (name, body, info.value.details())
            print("REFUSED", name, len(body), "B:", code)
    tfgrpc.p2p_latency(tensor_server, label="after_refusals")  # still healthy
    assert ps_cluster.ps_engine == "native"
    with grpc.insecure_channel(ps_cluster.targets[0]) as channel:
        stranger = [
            channel.unary_unary(method("Configure")),
            channel.unary_unary(method("JobStats")),
            channel.unary_unary(method("Throughput", raw=True)),
            channel.stream_unary(method("PushGradients")),
        ]
        for call in stranger:
            body = iter([b""]) if call is stranger[-1] else b""
            with pytest.raises(grpc.RpcError) as info:
                call(body, timeout=10)
            assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED
            print("REFUSED", info.value.details())
    tiny = Profile("tiny", (TensorSpec("w", (64,)),))
    tfgrpc.sync_sgd_step(ps_cluster, tiny, check=True, iterations=3, warmup=1, model=False)
"""

#: A small profile: its PS tasks take what the profile and the fit need, no more.
PROFILE_SGD = """
import pytest

@pytest.mark.message_profile("resnet50", scale=0.02)
@pytest.mark.ps_topology(ps=2, workers=2)
def test_sgd(tfgrpc, ps_cluster):
    tfgrpc.sync_sgd_step(ps_cluster, iterations=5, warmup=1)
"""

#: A stream push over the server's limit: refused with a message, not "Internal error".
OVER_LIMIT_STREAM = """
import pytest
from pytest_tfgrpc import bench
from pytest_tfgrpc.bench.timing import RunSpec

@pytest.mark.message_profile(["1KiB"])
def test_over(tensor_server):
    run = RunSpec(iterations=2, warmup=0, max_seconds=1, warmup_seconds=1)
    bench.p2p_bandwidth(tensor_server, [4 << 20], bench.BandwidthCall(rpc="stream", run=run))
"""

GATE_SUITE = """
import pytest

@pytest.mark.message_profile(["1KiB"])
def test_latency(tfgrpc, tensor_server):
    tfgrpc.p2p_latency(tensor_server)
"""

BUDGET_FAIL = """
import pytest

@pytest.mark.message_profile(["1KiB"])
@pytest.mark.budget(p50="1ns")
def test_latency(tfgrpc, tensor_server):
    tfgrpc.p2p_latency(tensor_server)
"""

TF_CONFIGS = {
    "no_cluster": '{"task": {"type": "worker", "index": 0}}',
    "sparse": '{"cluster": {"worker": {"1": "h:1"}}, "task": {"type": "worker", "index": 1}}',
    "unknown_job": '{"cluster": {"master": ["h:1"]}, "task": {"type": "master", "index": 0}}',
    "key_not_index": '{"cluster": {"ps": {"ps-0": "h:1"}}, "task": {"type": "ps", "index": 0}}',
    "bad_json": "{not json",
    "index_out_of_range": '{"cluster": {"ps": ["h:1"]}, "task": {"type": "ps", "index": 5}}',
}


# --- I25: issue 25's suites ----------------------------------------------------------------------
#: Fails on its first attempt, passes on the next (a flaky test pytest-rerunfailures reruns).
FLAKY = """
import pathlib
import pytest

@pytest.mark.message_profile(["4B"])
def test_flaky(tfgrpc, tensor_server):
    mark = pathlib.Path("attempts")
    attempt = int(mark.read_text()) if mark.exists() else 0
    mark.write_text(str(attempt + 1))
    tfgrpc.p2p_latency(tensor_server)
    assert attempt >= {fail_first}

@pytest.fixture
def shaky():
    mark = pathlib.Path("setups")
    attempt = int(mark.read_text()) if mark.exists() else 0
    mark.write_text(str(attempt + 1))
    assert attempt >= {fail_first}

def test_shaky_setup(tfgrpc, tensor_server, shaky):
    tfgrpc.p2p_latency(tensor_server, ["4B"])

def test_after(tfgrpc, tensor_server):
    tfgrpc.p2p_latency(tensor_server, ["4B"])
"""

#: Every way pytest marks an expected failure, each beside a measured figure.
XFAILS = """
import pytest

@pytest.mark.xfail(reason="known")
def test_xfail(tfgrpc, tensor_server):
    tfgrpc.p2p_latency(tensor_server, ["4B"])
    assert False

@pytest.mark.xfail(reason="fixed since")
def test_xpass(tfgrpc, tensor_server):
    tfgrpc.p2p_latency(tensor_server, ["4B"])

@pytest.mark.xfail(strict=True, reason="must fail")
def test_xpass_strict(tfgrpc, tensor_server):
    tfgrpc.p2p_latency(tensor_server, ["4B"])

@pytest.mark.xfail(run=False, reason="not run")
def test_xfail_not_run(tfgrpc, tensor_server):
    tfgrpc.p2p_latency(tensor_server, ["4B"])

def test_xfail_inside(tfgrpc, tensor_server):
    tfgrpc.p2p_latency(tensor_server, ["4B"])
    pytest.xfail("decided at run time")

def test_after(tfgrpc, tensor_server):
    tfgrpc.p2p_latency(tensor_server, ["4B"])
"""

#: Another plugin that names outcomes its own way (in every phase).
INVENTED_OUTCOME = """
import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if "{phase}" in (call.when, "all") and "invented" in item.name:
        report.outcome = "{word}"
"""

INVENTED_SUITE = """
def test_invented(tfgrpc, tensor_server):
    tfgrpc.p2p_latency(tensor_server, ["4B"])

def test_after(tfgrpc, tensor_server):
    tfgrpc.p2p_latency(tensor_server, ["4B"])
"""


#: An agent (its token in its environment, as a Kubernetes Secret gives it) and a driver.
AGENT_SECRETS = """
import json, math, os, subprocess, sys
import grpc
import pytest
from pytest_tfgrpc.hosts.agent_client import AgentClient
from pytest_tfgrpc.roles.processes import ServerProcess
from pytest_tfgrpc.wire._proto import agent_pb2, agent_pb2_grpc

TOKEN = os.environ["TFGRPC_AGENT_TOKEN"]

@pytest.fixture(scope="module")
def agent():
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest_tfgrpc.hosts.agent", "--fabric", "lo", "--port", "0",
         "--exit-on-stdin-eof"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    yield json.loads(proc.stdout.readline())["target"]
    proc.stdin.close()
    proc.wait(10)

def environ(pid):
    with open(f"/proc/{{pid}}/environ", "rb") as f:
        return dict(e.split(b"=", 1) for e in f.read().split(b"\\0") if b"=" in e)

@pytest.mark.parametrize("lease", [{leases}])
def test_lease_refused(agent, lease):
    with grpc.insecure_channel(agent) as channel:
        stub = agent_pb2_grpc.NodeAgentStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Heartbeat(agent_pb2.LeaseRequest(driver="d", lease_s=lease), timeout=10,
                           metadata=(("authorization", "Bearer " + TOKEN),))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "a lease is a finite number of seconds" in info.value.details()
        reply = stub.Heartbeat(agent_pb2.LeaseRequest(driver="d", lease_s=5.0), timeout=10,
                               metadata=(("authorization", "Bearer " + TOKEN),))
        assert reply.lease_s == 5.0

def test_no_child_gets_the_agent_token(agent, tensor_server, fabric):
    assert b"TFGRPC_AGENT_TOKEN" not in environ(tensor_server.pid)
    with AgentClient(agent, TOKEN) as client, open(os.devnull, "wb") as sink:
        role = client.run("tensor_server", dict(), dict(), sink, name="role")
        try:
            role.stdout.readline()
            assert b"TFGRPC_AGENT_TOKEN" not in environ(role.pid)
        finally:
            role.stdin.close()
            role.wait(10)
"""


#: Pushes that must not reach a step's sum: a stranger's, a broken stream's, malformed ones.
BAD_PUSHES = """
import logging
import grpc, numpy as np, pytest
from pytest_tfgrpc.roles.parameter_server import INIT_INDEX, initial_weights, method
from pytest_tfgrpc.wire._proto import service_pb2 as pb

NBYTES = 64
logging.getLogger("grpc._channel").disabled = True  # the broken stream is on purpose

def stubs(ps_cluster):
    channel = ps_cluster.channel(0)
    configure = channel.unary_unary(method("Configure"),
        request_serializer=pb.PSJob.SerializeToString,
        response_deserializer=pb.PSJobStats.FromString)
    push = channel.stream_unary(method("PushGradients"),
        request_serializer=pb.WeightChunk.SerializeToString,
        response_deserializer=pb.Ack.FromString)
    pull = channel.unary_stream(method("PullWeights"),
        request_serializer=pb.PullWeightsRequest.SerializeToString,
        response_deserializer=pb.WeightChunk.FromString)
    return configure, push, pull

def chunks(pieces, worker=0, step=0):
    return [pb.WeightChunk(shard=s, offset=o, data=d, step=step, worker=worker)
            for s, o, d in pieces]

BAD = {{
    "stranger-4B": [(0, 0, b"\\xff" * 4)],
    "short": [(0, 0, np.full(8, 1e9, np.float32).tobytes())],
    "long": [(0, 0, np.ones(17, np.float32).tobytes())],
    "past-the-shard": [(0, 32, np.ones(16, np.float32).tobytes())],
    "negative-offset": [(0, -4, np.ones(16, np.float32).tobytes())],
    "unaligned": [(0, 2, np.ones(16, np.float32).tobytes())],
    "no-such-shard": [(7, 0, np.ones(16, np.float32).tobytes())],
    "twice-the-first-half": [(0, 0, np.ones(8, np.float32).tobytes())] * 2
        + [(0, 32, np.ones(8, np.float32).tobytes())],
    "wrong-step": "step",
    "broken-stream": "break",
}}

@pytest.mark.parametrize("bad", sorted(BAD))
def test_a_bad_push_leaves_the_sum_alone(ps_cluster, bad):
    configure, push, pull = stubs(ps_cluster)
    job = pb.PSJob(job_id=7, task=0, workers=1, learning_rate=1.0, init=INIT_INDEX, steps=5,
                   shards=[pb.ShardSpec(tensor="w", offset=0, nbytes=NBYTES)],
                   barrier_timeout_seconds=10, max_seconds=60, warmup_seconds=1)
    configure(job, timeout=10, metadata=ps_cluster.credentials)
    case = BAD[bad]
    if case == "break":
        def stream():
            yield chunks([(0, 0, np.full(8, 1e9, np.float32).tobytes())])[0]
            raise RuntimeError("the worker died mid-push")
        requests = stream()
    elif case == "step":
        requests = iter(chunks([(0, 0, np.ones(16, np.float32).tobytes())], step=3))
    else:
        requests = iter(chunks(case))
    mine = ps_cluster.credentials
    with pytest.raises(grpc.RpcError) as info:
        push(requests, timeout=10, metadata=mine)
    details = info.value.details() or ""
    assert "step 0" not in details and "step 3" not in details, details
    gradient = (np.arange(16) % 16).astype(np.float32)
    push(iter(chunks([(0, 0, gradient.tobytes())])), timeout=10, metadata=mine)
    got = b"".join(c.data for c in pull(pb.PullWeightsRequest(step=0), timeout=10, metadata=mine))
    expected = initial_weights(0, NBYTES, INIT_INDEX) - gradient
    assert np.array_equal(np.frombuffer(got, np.float32), expected)
"""


#: A stranger's calls to every method of a PS task, with no token, an empty, a wrong, a near
#: miss, or another job's: refused before any work, none counted in the PS's figures, none
#: touching the step's sum, no text naming the job's step.
STRANGERS = """
import grpc, numpy as np, pytest
from pytest_tfgrpc.ps.ps_cluster import PSCluster
from pytest_tfgrpc.model.placement import Topology
from pytest_tfgrpc.roles.parameter_server import INIT_INDEX, MEASURE, PHASE_KEY, initial_weights
from pytest_tfgrpc.roles.parameter_server import method
from pytest_tfgrpc.wire import codec
from pytest_tfgrpc.wire._proto import service_pb2 as pb
from pytest_tfgrpc.wire.fabric import resolve_fabric
from pytest_tfgrpc.wire.security import TOKEN_KEY, new_token

@pytest.fixture(scope="module")
def other_job():
    with PSCluster(resolve_fabric("lo"), Topology(ps=1, workers=1)) as other:
        yield other.credentials[0][1]

def tokens(mine, other):
    # a near miss differs in its last character only (a token ending in "A" is 1 in 64)
    near = mine[:-1] + ("B" if mine.endswith("A") else "A")
    return {{"none": None, "empty": "", "wrong": new_token(), "near-miss": near,
             "longer": mine + "A", "other-job": other}}

def calls(channel):
    gradient = np.ones(16, np.float32).tobytes()
    chunk = pb.WeightChunk(shard=0, offset=0, data=gradient, step=0, worker=0, measured=True)
    return {{
        "Throughput": (channel.unary_unary(method("Throughput", raw=True)), bytes(1024)),
        "Throughput-protobuf": (channel.unary_unary(method("Throughput")),
                                codec.encode_tensor(bytes(1024), "uint8", (1024,))),
        "PushGradients": (channel.stream_unary(method("PushGradients")),
                          iter([chunk.SerializeToString()])),
        "PullWeights": (channel.unary_stream(method("PullWeights")),
                        pb.PullWeightsRequest(step=-1, measured=True).SerializeToString()),
        "JobStats": (channel.unary_unary(method("JobStats")), b""),
        "Configure": (channel.unary_unary(method("Configure")),
                      pb.PSJob(job_id=66, task=0, workers=1).SerializeToString()),
    }}

@pytest.mark.parametrize("who", ["none", "empty", "wrong", "near-miss", "longer", "other-job"])
def test_a_stranger_is_refused_and_not_counted(ps_cluster, other_job, who):
    mine = ps_cluster.credentials
    stats = ps_cluster.channel(0).unary_unary(method("JobStats"),
        response_deserializer=pb.PSJobStats.FromString)
    job = pb.PSJob(job_id=7, task=0, workers=1, learning_rate=1.0, init=INIT_INDEX, steps=5,
                   shards=[pb.ShardSpec(tensor="w", offset=0, nbytes=64)],
                   barrier_timeout_seconds=10, max_seconds=60, warmup_seconds=1)
    ps_cluster.channel(0).unary_unary(method("Configure"))(
        job.SerializeToString(), timeout=10, metadata=mine)
    token = tokens(mine[0][1], other_job)[who]
    metadata = [(PHASE_KEY, MEASURE)] + ([] if token is None else [(TOKEN_KEY, token)])
    for name, (call, body) in calls(ps_cluster.channel(0)).items():
        with pytest.raises(grpc.RpcError) as info:
            reply = call(body, timeout=10, metadata=metadata)
            list(reply) if name == "PullWeights" else reply
        assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED, (name, info.value)
        assert "step" not in info.value.details(), info.value.details()
        print("REFUSED", who, name, info.value.details())
    after = stats(b"", timeout=10, metadata=mine)
    assert (after.job_id, after.rpcs, after.bytes_in, after.bytes_out, after.steps) == (
        7, 0, 0, 0, 0), after
    push = ps_cluster.channel(0).stream_unary(method("PushGradients"))
    gradient = (np.arange(16) % 16).astype(np.float32)
    push(iter([pb.WeightChunk(shard=0, offset=0, data=gradient.tobytes(), step=0,
                              measured=True).SerializeToString()]), timeout=10, metadata=mine)
    pull = ps_cluster.channel(0).unary_stream(method("PullWeights"),
        response_deserializer=pb.WeightChunk.FromString)
    got = b"".join(c.data for c in pull(pb.PullWeightsRequest(step=0).SerializeToString(),
                                        timeout=10, metadata=mine))
    expected = initial_weights(0, 64, INIT_INDEX) - gradient
    assert np.array_equal(np.frombuffer(got, np.float32), expected)
    after = stats(b"", timeout=10, metadata=mine)
    assert (after.rpcs, after.bytes_in, after.steps) == (1, 64, 1), after
"""


#: Compressed calls (a decompression bomb: 64 MiB of zeros is 65 KiB of gzip) to a server
#: limited to 1 KiB tensors: refused unread, the server's memory never grows with them.
COMPRESSED = """
import grpc, pytest
from pytest_tfgrpc.wire import codec, grpc_settings

def peak_kib(pid):
    with open(f"/proc/{{pid}}/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmHWM"))

@pytest.mark.message_profile(["1KiB"])
@pytest.mark.parametrize("mode", ["raw", "protobuf"])
@pytest.mark.parametrize("algorithm", ["Gzip", "Deflate"])
@pytest.mark.parametrize("nbytes", [1 << 10, 64 << 20])
def test_compressed(tfgrpc, tensor_server, mode, algorithm, nbytes):
    before = peak_kib(tensor_server.pid)
    compression = getattr(grpc.Compression, algorithm)
    raw = bytes(nbytes)
    body = raw if mode == "raw" else codec.encode_tensor(raw, "uint8", (nbytes,))
    with grpc.insecure_channel(tensor_server.target, compression=compression) as channel:
        push = channel.unary_unary(grpc_settings.method(mode, "Push"))
        with pytest.raises(grpc.RpcError) as info:
            push(body, timeout=20)
    assert info.value.code() is grpc.StatusCode.UNIMPLEMENTED, info.value.details()
    assert peak_kib(tensor_server.pid) - before < 32 << 10
    tfgrpc.p2p_latency(tensor_server, ["4B"], label="after")
"""


#: A node agent on loopback for the suite's module: its host, port and token file.
AGENT_FIXTURE = """
@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    token = tmp_path_factory.mktemp("agent") / "token"
    token.write_text("agent-token-0123456789abcdef\\n")
    token.chmod(0o600)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest_tfgrpc.hosts.agent", "--fabric", "lo", "--port", "0",
         "--token-file", str(token), "--exit-on-stdin-eof"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        host, _, port = json.loads(proc.stdout.readline())["target"].rpartition(":")
        yield host, int(port), str(token)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
"""

#: Agents by name (an injected resolver, a real agent): every resolved address tried, a name
#: that resolves late waited for within the agents' bound, one that never does fails in it.
AGENT_NAMES = (
    """
import json, socket, subprocess, sys, time
import pytest
from pytest_tfgrpc.hosts.names import HostNotReached, listening_address
from pytest_tfgrpc.plugin.agents import _Agents

BOTH = ("::1", "127.0.0.1")  # localhost where the hosts file lists ::1 first

def late(after_s, addresses):
    start = time.monotonic()
    def resolve(host, port):
        if time.monotonic() - start < after_s:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return addresses
    return resolve

@pytest.fixture(scope="module")
def ipv4_only():
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]

@pytest.mark.parametrize("addresses", [BOTH, ("::1", "::1", "127.0.0.1"),
                                       ("127.0.0.2", "::1", "127.0.0.1")])
def test_every_resolved_address_is_tried(ipv4_only, addresses):
    found = listening_address("localhost", ipv4_only, 5, resolver=lambda h, p: addresses)
    assert found == "127.0.0.1"

@pytest.mark.parametrize("after_s", [0.5, 1.5])
def test_a_name_that_resolves_later_is_waited_for(ipv4_only, after_s):
    start = time.monotonic()
    found = listening_address("agent-0.svc", ipv4_only, 5, resolver=late(after_s, BOTH))
    assert found == "127.0.0.1"
    assert after_s <= time.monotonic() - start < 5

def test_a_name_that_never_resolves_fails_within_the_bound():
    start = time.monotonic()
    with pytest.raises(HostNotReached, match=r"'agent-9.svc' does not resolve.*waited 1 s"):
        listening_address("agent-9.svc", 9, 1, resolver=late(60, BOTH))
    assert time.monotonic() - start < 2

def test_no_address_listening_names_each_one():
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
    with pytest.raises(HostNotReached) as info:
        listening_address("localhost", port, 0.5, resolver=lambda h, p: BOTH)
    text = str(info.value)
    assert f"no address of localhost accepted a connection on port {{port}}" in text
    assert "::1: " in text and "127.0.0.1: " in text

"""
    + AGENT_FIXTURE
    + """

@pytest.mark.parametrize("after_s", [0.0, 2.0], ids=["resolved", "resolved-later"])
def test_the_driver_reaches_an_agent_by_a_name_listing_ipv6_first(agent, after_s):
    _, port, token_file = agent
    address = f"agent-0.tfjob.svc:{{port}}"
    agents = _Agents("--tfgrpc-agents", (address,), (address,), token_file)
    agents.resolver = late(after_s, BOTH)
    try:
        client = agents.client(address)
        assert client.target == f"127.0.0.1:{{port}}"
        assert client.info.fabric == "lo"
    finally:
        agents.close()
"""
)

#: Emulated fabrics skip test subnets an existing route covers, in any table.
FABRIC_ROUTES = """
import ipaddress, os, shutil, subprocess, sys
import pytest
from pytest_tfgrpc.hosts.emulated import (IPV4_BENCHMARK_NET, MAX_SUBNETS, allocation_lock,
                                          free_subnet_index, routed_subnets)
Net = ipaddress.IPv4Network

def subnet(k):
    return Net((int(IPV4_BENCHMARK_NET.network_address) + (k << 8), 24))

@pytest.mark.parametrize(("routes", "taken"), [
    (["198.18.0.0/24"], {{0}}),
    (["198.18.2.0/23"], {{2, 3}}),
    (["198.18.5.7/32", "198.19.255.255/32"], {{5, 511}}),
    (["198.18.0.0/15"], set(range(MAX_SUBNETS))),
    (["198.16.0.0/12"], set(range(MAX_SUBNETS))),
    (["10.0.0.0/8", "127.0.0.0/8", "198.20.0.0/24", "198.17.255.0/24"], set()),
])
def test_routed_subnets_are_the_indices_a_route_covers(routes, taken):
    assert routed_subnets(Net(r) for r in routes) == taken

def test_a_routed_subnet_is_skipped():
    if shutil.which("ip") is None:
        pytest.skip("needs iproute2's ip")
    with allocation_lock(30):
        free = free_subnet_index(lambda: [])
        assert free_subnet_index(lambda: [subnet(free)]) != free
        three = range(free, free + 3)
        assert free_subnet_index(lambda: [subnet(k) for k in three]) not in three

IN_NAMESPACE = '''
import subprocess
from pytest_tfgrpc.hosts.emulated import free_subnet_index, ipv4_routes
first = free_subnet_index()
net = f"198.{{18 + (first >> 8)}}.{{first & 255}}.0/24"
subprocess.run(["ip", "route", "add", "{{kind}}", net, *{{extra}}], check=True)
assert any(str(route) == net for route in ipv4_routes()), ipv4_routes()
second = free_subnet_index()
assert second != first, (first, second)
print("SKIPPED", net, "FOR", second)
'''

@pytest.mark.parametrize(("kind", "extra"), [("blackhole", []), ("unreachable", []),
                                             ("blackhole", ["table", "100"])])
def test_a_route_in_the_namespace_moves_the_fabric_on(kind, extra):
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 (a namespace of its own)")
    name = f"faults2-routes-{{os.getpid()}}"
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=10)
    try:
        code = IN_NAMESPACE.replace("{{kind}}", kind).replace("{{extra}}", repr(extra))
        run = subprocess.run(["ip", "netns", "exec", name, sys.executable, "-c", code],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        assert "SKIPPED 198.1" in run.stdout
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False, timeout=10)
"""

#: ``tfgrpc-fabric down`` on state files that name what their fabric never made (a path
#: outside /etc/netns, an interface, another fabric's namespace): nothing is run or removed.
#: The state directory is the suite's own and every command is recorded, not run.
FABRIC_STATE = """
import json
import pytest
from pytest_tfgrpc.cli import fabric as cli
from pytest_tfgrpc.hosts import emulated

def state(**bad):
    host = {{"name": "h0", "netns": "tfgf7-h0", "iface": "eth0", "address": "198.18.7.2",
             "link": "tfgf7h0", "rate": None}}
    host.update(bad.pop("host", {{}}))
    return {{"name": "tfgf7", "bridge": "tfgf7br", "driver_address": "198.18.7.1",
             "prefixlen": 24, "hosts": [host], "owner_pid": 0, "owner_uid": 0, **bad}}

@pytest.fixture
def ran(tmp_path, monkeypatch):
    # Everything the removal reads or touches is the suite's own: the host's real fabrics
    # (another user's included) are never seen, nor their processes signalled.
    commands = []
    for name, sub in (("STATE_DIR", "state"), ("_NETNS_ETC", "etc-netns"),
                      ("_NETNS_DIR", "netns"), ("_SYS_NET", "sys-net")):
        (tmp_path / sub).mkdir()
        monkeypatch.setattr(emulated, name, tmp_path / sub)
    monkeypatch.setattr(emulated, "run_command", lambda args, **kw: commands.append(args))
    monkeypatch.setattr(emulated, "_kill_namespace_processes",
                        lambda *args: commands.append(["kill", *args]))
    return commands

@pytest.mark.parametrize("bad", [
    {{"host": {{"netns": "../../victim"}}}},
    {{"host": {{"netns": "tfgf8-h0"}}}},
    {{"host": {{"link": "lo"}}}},
    {{"host": {{"link": "eth0"}}}},
    {{"bridge": "docker0"}},
    {{"name": "tfgf7/../x"}},
], ids=["netns-outside", "netns-of-another", "link-lo", "link-eth0", "bridge", "name"])
@pytest.mark.parametrize("how", [["tfgf7"], ["--all"], ["--all-owners"]])
def test_a_state_naming_what_it_never_made_is_not_followed(ran, tmp_path, capsys, bad, how):
    victim = tmp_path / "victim"
    victim.mkdir()
    (emulated.STATE_DIR / "tfgf7.json").write_text(json.dumps(state(**bad)))
    with pytest.raises(ValueError, match="not its own"):
        emulated.EmulatedFabric.from_json(state(**bad))
    code = cli.main(["down", *how])
    assert ran == [], ran
    assert victim.is_dir()
    assert (code, capsys.readouterr().out.strip().splitlines()[-1]) in (
        (2, "tfgrpc-fabric: no fabric 'tfgf7' (see `tfgrpc-fabric status`)"),
        (0, "removed: nothing"),
    )

def test_its_own_state_is_removed(ran):
    (emulated.STATE_DIR / "tfgf7.json").write_text(json.dumps(state()))
    assert cli.main(["down", "tfgf7"]) == 0
    assert ["ip", "link", "del", "dev", "tfgf7h0"] in ran
    assert not (emulated.STATE_DIR / "tfgf7.json").exists()
"""

#: A server of the tensor and PS services in the suite's own process (its idle bound 1 s),
#: and a stranger speaking raw HTTP/2 (``tests/stranger.py``, with h2).
STREAMS_HEAD = """
import sys, time
import grpc, pytest
sys.path.insert(0, "{tests_dir}")
pytest.importorskip("h2")
import stranger
from pytest_tfgrpc.roles.idle import IDLE_STREAM_S
from pytest_tfgrpc.roles.tensor_server import build_server
from pytest_tfgrpc.wire import grpc_settings
from pytest_tfgrpc.wire.security import TOKEN_KEY

ECHO = grpc_settings.method("raw", "Echo")
STATUS = grpc_settings.method("raw", "Status")
THREADS = 16
TOKEN = "streams-token"
AUTH = ((TOKEN_KEY, TOKEN),)

def serve(idle_s):
    started, target = build_server("127.0.0.1", 0, "lo", workers=THREADS, idle_s=idle_s,
                                   job_token=TOKEN)
    started.start()
    host, _, port = target.rpartition(":")
    return started, host, int(port)

@pytest.fixture(scope="module")
def server():
    started, host, port = serve(1.0)
    yield host, port
    started.stop(0).wait(5)

def echo(host, port, timeout):
    with grpc.insecure_channel(f"{{host}}:{{port}}") as channel:
        start = time.monotonic()
        assert channel.unary_unary(ECHO)(bytes(1024), timeout=timeout) == bytes(1024)
        return time.monotonic() - start
"""

#: A stranger's idle streams and rapid reset against a tensor server: the calls it takes at
#: once are bounded, idle streams are cancelled and free their handler threads, and a rapid
#: reset leaves the server answering.
IDLE_STREAMS = (
    STREAMS_HEAD
    + """
@pytest.mark.parametrize(("streams", "connections"), [(16, 1), (24, 2), (40, 4)])
def test_idle_streams_are_cancelled_and_free_the_handler_threads(server, streams, connections):
    host, port = server
    with stranger.idle_streams(host, port, ECHO, streams, connections) as held:
        assert held["idle_streams"] == streams
        time.sleep(0.2)  # the stranger's streams hold every handler thread now
        took = echo(host, port, timeout=8)
    # It waited for the idle streams that held every thread (1 s each), not for ever.
    assert 0.5 < took < 5, f"an echo took {{took:.1f}} s behind {{streams}} idle streams"

def test_calls_beyond_the_bound_are_refused_at_once_until_idle_ones_are_cancelled(server):
    host, port = server
    bound = grpc_settings.max_concurrent_rpcs(THREADS)
    with stranger.idle_streams(host, port, ECHO, bound, 4):
        time.sleep(0.2)
        start = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            echo(host, port, timeout=5)
        assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert time.monotonic() - start < 0.5
        # Each idle call is cancelled 1 s after it got a thread: 4 rounds of 16; then the
        # server takes calls again, the stranger's streams still open.
        while True:
            try:
                echo(host, port, timeout=5)
                break
            except grpc.RpcError as error:
                assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
                assert time.monotonic() - start < 8, "the idle calls were never cancelled"
                time.sleep(0.25)

@pytest.mark.parametrize("resets", [2_000, 20_000])
def test_a_rapid_reset_leaves_the_server_answering(resets):
    started, host, port = serve(IDLE_STREAM_S)  # the default idle bound
    outcomes = []
    try:
        with stranger.rapid_reset(host, port, ECHO, limit=resets, seconds=5) as counts:
            for _ in range(20):
                start = time.monotonic()
                try:
                    echo(host, port, timeout=5)
                    outcomes.append("OK")
                except grpc.RpcError as error:
                    # refused while the resets fill the bound, or cancelled by gRPC's core
                    # under the flood: each in bounded time, never a hang or a dead server
                    assert error.code() in (grpc.StatusCode.RESOURCE_EXHAUSTED,
                                            grpc.StatusCode.CANCELLED), error
                    outcomes.append(error.code().name)
                assert time.monotonic() - start < 5
        assert counts["reset_streams"] > 0
        print(counts, outcomes.count("OK"), "of", len(outcomes), "echoes answered in the attack")
        assert echo(host, port, timeout=5) < 1  # after it, at once
        with grpc.insecure_channel(f"{{host}}:{{port}}") as channel:
            channel.unary_unary(STATUS)(b"", timeout=5)
    finally:
        started.stop(0).wait(5)
"""
)

#: Each connection holds a bounded number of streams on every Python server (tensor server and
#: PS task: 16; agent: its processes and control calls): a stranger who ignores the server's
#: SETTINGS has the streams beyond refused, and the ones taken are ended by the idle bound (or,
#: at the agent, refused for the token at once, before a request message: a stranger's silent
#: streams hold none of its threads, so heartbeats are answered).
STREAM_BOUND = (
    STREAMS_HEAD
    + """
import json, subprocess
from pytest_tfgrpc.hosts.agent import STREAMS_PER_DRIVER
from pytest_tfgrpc.roles.parameter_server import method

BOUND = grpc_settings.MAX_STREAMS_PER_CONNECTION

@pytest.mark.parametrize("streams", [BOUND + 1, 24, 64, 200])
@pytest.mark.parametrize("path", [ECHO, method("JobStats"), method("PullWeights")])
def test_streams_beyond_the_bound_are_refused(server, path, streams):
    host, port = server
    got = stranger.open_streams(host, port, path, streams, 5.0, AUTH)
    assert got["announced"] == BOUND, got
    assert got["refused"] == streams - BOUND, got
    assert got.get("status 1", 0) == BOUND, got  # CANCELLED by the idle bound
    assert echo(host, port, timeout=5) < 2

"""
    + AGENT_FIXTURE
    + """

@pytest.mark.parametrize("streams", [STREAMS_PER_DRIVER + 1, 2 * STREAMS_PER_DRIVER])
@pytest.mark.parametrize("name", ["Heartbeat", "Run"])
def test_an_agent_bounds_each_connection_too(agent, name, streams):
    host, port, _ = agent
    got = stranger.open_streams(host, port, f"/tfgrpc.NodeAgent/{{name}}", streams, 5.0)
    assert got["announced"] == STREAMS_PER_DRIVER, got
    assert got["refused"] == streams - STREAMS_PER_DRIVER, got
    assert got.get("status 16", 0) == STREAMS_PER_DRIVER, got  # UNAUTHENTICATED: no token
"""
)

#: An agent at its process limit (:data:`~pytest_tfgrpc.hosts.agent.MAX_PROCESSES` roles, the
#: native floor, the cheapest) split over ``{split}`` drivers, each with its own connection and
#: a short lease renewed every quarter lease: every heartbeat is answered within the lease for
#: longer than several leases, no lease runs out (each reply counts the driver's roles, all
#: alive), a role beyond the limit is refused in one line naming it, and each driver's
#: ``Release`` stops its own roles and only them.
AGENT_AT_ITS_LIMIT = (
    """
import contextlib, json, subprocess, sys, threading, time
import grpc
import pytest
from pytest_tfgrpc.hosts.agent import MAX_PROCESSES, MIN_LEASE_S
from pytest_tfgrpc.wire._proto import agent_pb2, agent_pb2_grpc

LEASE_S = 2 * MIN_LEASE_S
HOLD_S = 3 * LEASE_S  # all roles running this long: several leases, a dozen renewals
SPLIT = ({split})

def alive(pid):
    try:
        with open(f"/proc/{{pid}}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False

class Driver:
    # A driver as the agent sees one: its own id, connection and lease.
    def __init__(self, target, token, name):
        self.name = name
        self.channel = grpc.insecure_channel(target)
        self.stub = agent_pb2_grpc.NodeAgentStub(self.channel)
        self.auth = (("authorization", "Bearer " + token),)
        self.answered = []  # (sent, answered, the driver's running roles it reported)
        self.missed = []  # why a heartbeat got no answer within the lease
        self.roles = []  # (Run call, pid)
        self.done = threading.Event()
        self.heartbeat()
        assert self.answered, self.missed
        self.renewer = threading.Thread(target=self.renew, daemon=True)
        self.renewer.start()

    def heartbeat(self):
        request = agent_pb2.LeaseRequest(driver=self.name, lease_s=LEASE_S)
        sent = time.monotonic()
        try:
            reply = self.stub.Heartbeat(request, timeout=LEASE_S, metadata=self.auth)
        except grpc.RpcError as exc:
            self.missed.append(f"{{exc.code().name}} after {{time.monotonic() - sent:.1f}} s")
        else:
            self.answered.append((sent, time.monotonic(), reply.processes))

    def renew(self):
        while not self.done.wait(LEASE_S / 4):
            self.heartbeat()

    def requests(self):
        start = agent_pb2.RoleStart(driver=self.name, role="floor_server", engine="native")
        yield agent_pb2.RoleInput(start=start)
        self.done.wait(60)  # the role's stdin stays open until the test ends

    def start(self, timeout):
        call = self.stub.Run(self.requests(), metadata=self.auth, timeout=timeout)
        reply = next(call)
        assert reply.WhichOneof("kind") == "started", reply
        self.roles.append((call, reply.started.pid))

    def release(self):
        request = agent_pb2.LeaseRequest(driver=self.name)
        return self.stub.Release(request, timeout=10, metadata=self.auth).processes

    def close(self):
        self.done.set()
        self.renewer.join(LEASE_S + 1)
        with contextlib.suppress(grpc.RpcError):
            self.release()
        for call, _ in self.roles:
            call.cancel()
        self.channel.close()

"""
    + AGENT_FIXTURE
    + """

@pytest.fixture
def drivers(agent):
    host, port, token_file = agent
    with open(token_file) as f:
        token = f.read().strip()
    made = []
    try:
        for index in range(len(SPLIT)):
            made.append(Driver(f"{{host}}:{{port}}", token, f"driver-{{index}}"))
        yield made
    finally:
        for driver in made:
            driver.close()

def test_heartbeats_are_answered_while_the_agent_runs_its_limit(drivers):
    assert sum(SPLIT) == MAX_PROCESSES
    for driver, count in zip(drivers, SPLIT):
        for _ in range(count):
            driver.start(timeout=90)
    running = time.monotonic()
    time.sleep(HOLD_S)
    held = time.monotonic()
    dead = [pid for driver in drivers for _, pid in driver.roles if not alive(pid)]
    try:  # one more, from the last driver: refused at once, naming the limit
        drivers[-1].start(timeout=LEASE_S)
        refused = None
    except grpc.RpcError as exc:
        refused = exc
        print(f"REFUSED {{exc.code().name}}: {{exc.details()}}")
    for driver, count in zip(drivers, SPLIT):
        slowest = max(answered - sent for sent, answered, _ in driver.answered)
        print(f"HEARTBEATS {{driver.name}} ({{count}} roles): {{len(driver.answered)}} answered,"
              f" slowest {{slowest * 1000:.0f}} ms, missed {{driver.missed or 'none'}}")
    assert not dead, f"roles {{dead}} died: their lease ran out?"
    for driver, count in zip(drivers, SPLIT):
        assert not driver.missed, (driver.name, driver.missed)
        times = [running, *(when for _, when, _ in driver.answered if when >= running), held]
        gaps = [later - earlier for earlier, later in zip(times, times[1:])]
        assert max(gaps) < LEASE_S, (driver.name, "a lease went unrenewed", max(gaps))
        # sent once every role ran: the agent counted them all
        reported = {{n for sent, _, n in driver.answered if sent >= running}}
        assert reported == {{count}}, (driver.name, reported)
        assert all(call.is_active() for call, _ in driver.roles), driver.name
    assert refused is not None, "a role beyond the limit was started"
    assert refused.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, refused
    assert f"its limit ({{MAX_PROCESSES}})" in refused.details()
    for driver, count in zip(drivers, SPLIT):  # each Release stops its own roles, only them
        assert driver.release() == count
        deadline = time.monotonic() + 10
        while any(alive(pid) for _, pid in driver.roles) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(pid) for _, pid in driver.roles), driver.name
        later = [pid for other in drivers[drivers.index(driver) + 1:] for _, pid in other.roles]
        assert all(alive(pid) for pid in later), "another driver's roles were stopped"
"""
)

#: Control apart from data on an agent at its process limit: one driver runs 64 roles while
#: another holds more data calls than the data threads left (Run streams that send their
#: start late, readings) and makes more than 16 control calls at once (heartbeats): every
#: heartbeat of both is answered within its lease, and no role dies.
AGENT_CONTROL = (
    AGENT_AT_ITS_LIMIT.replace("{split}", "64,")
    + """

LATE_RUNS = 24  # beside 64 roles: more than the 16 data threads left
CONTROL_AT_ONCE = 24  # more than the 16 control threads

def test_control_is_served_apart_from_data(drivers, agent):
    host, port, token_file = agent
    (driver,) = drivers
    for _ in range(MAX_PROCESSES):
        driver.start(timeout=90)
    running = time.monotonic()
    with open(token_file) as f:
        busy = Driver(f"{{host}}:{{port}}", f.read().strip(), "busy")
    late = threading.Event()
    stop = threading.Event()
    control, readings = [], []

    def late_start():
        late.wait(HOLD_S + 10)
        start = agent_pb2.RoleStart(driver="busy", role="floor_server", engine="native")
        yield agent_pb2.RoleInput(start=start)

    def hammer(out, method, request):
        while not stop.is_set():
            sent = time.monotonic()
            try:
                method(request, timeout=LEASE_S, metadata=busy.auth)
                out.append(time.monotonic() - sent)
            except grpc.RpcError as exc:
                out.append(exc.code().name)

    lease = agent_pb2.LeaseRequest(driver="busy", lease_s=LEASE_S)
    threads = [
        *(threading.Thread(target=hammer, args=(control, busy.stub.Heartbeat, lease))
          for _ in range(CONTROL_AT_ONCE)),
        *(threading.Thread(target=hammer, args=(readings, busy.stub.Counters, lease))
          for _ in range(8)),
    ]
    try:
        pending = [busy.stub.Run(late_start(), metadata=busy.auth, timeout=HOLD_S + 30)
                   for _ in range(LATE_RUNS)]
        for thread in threads:
            thread.start()
        time.sleep(HOLD_S)
        held = time.monotonic()
        stop.set()
        for thread in threads:
            thread.join(LEASE_S + 5)
        late.set()  # the late starts come: refused, the agent runs its limit
        for call in pending:
            with contextlib.suppress(grpc.RpcError):
                list(call)
        dead = [pid for _, pid in driver.roles if not alive(pid)]
    finally:
        late.set()
        stop.set()
        busy.close()
    answered = [x for x in control if not isinstance(x, str)]
    failed = [x for x in control if isinstance(x, str)]
    read = sum(1 for x in readings if not isinstance(x, str))
    print(f"CONTROL {{len(answered)}} heartbeats answered at once by {{CONTROL_AT_ONCE}} threads,"
          f" slowest {{max(answered) * 1000:.0f}} ms, failed {{failed or 'none'}}; roles' driver:"
          f" {{len(driver.answered)}} answered, missed {{driver.missed or 'none'}}; readings"
          f" {{read}} answered of {{len(readings)}}")
    assert not dead, f"roles {{dead}} died: their lease ran out?"
    assert not failed and not driver.missed and not busy.missed, (failed, driver.missed)
    assert max(answered) < LEASE_S
    times = [running, *(when for _, when, _ in driver.answered if when >= running), held]
    assert max(later - earlier for earlier, later in zip(times, times[1:])) < LEASE_S
"""
)

#: A PS task frees the streams of calls that end: pulls parked at the barrier whose client
#: cancels or whose deadline passes, requests it cannot parse, and calls that send no request
#: (the idle bound, the tensor service's, on every PS method). Then the same connection, past
#: its stream bound in such calls, still gets answers.
PS_STREAMS = (
    STREAMS_HEAD
    + """
from pytest_tfgrpc.roles.parameter_server import method
from pytest_tfgrpc.wire._proto import service_pb2 as pb

CALLS = 2 * grpc_settings.MAX_STREAMS_PER_CONNECTION + 8

@pytest.fixture
def channel(server):
    host, port = server
    with grpc.insecure_channel(f"{{host}}:{{port}}", options=grpc_settings.CHANNEL_OPTIONS) as ch:
        job = pb.PSJob(job_id=7, task=0, workers=2, steps=5, barrier_timeout_seconds=60,
                       shards=[pb.ShardSpec(tensor="w", offset=0, nbytes=64)],
                       max_seconds=60, warmup_seconds=1)
        ch.unary_unary(method("Configure"))(job.SerializeToString(), timeout=5, metadata=AUTH)
        yield ch

def answers(channel):
    start = time.monotonic()
    channel.unary_unary(method("JobStats"))(b"", timeout=5, metadata=AUTH)
    channel.unary_unary(STATUS)(b"", timeout=5)
    return time.monotonic() - start

@pytest.mark.parametrize(("how", "at_once"), [("deadline", 1), ("cancel", 1), ("deadline", 8),
                                              ("cancel", 8)])
def test_parked_pulls_give_their_streams_up(channel, how, at_once):
    # Rounds of pulls of step 0, which 1 of 2 workers never pushes: each round's pulls end by
    # their deadline or a cancel; parked until the barrier's 60 s they would hold their
    # streams, and past the connection's bound (16) the next ones would be refused.
    pull = channel.unary_stream(method("PullWeights"))
    request = pb.PullWeightsRequest(step=0).SerializeToString()
    start = time.monotonic()
    for _ in range(CALLS // at_once):
        timeout = 0.2 if how == "deadline" else 60
        calls = [pull(request, timeout=timeout, metadata=AUTH) for _ in range(at_once)]
        if how == "cancel":
            time.sleep(0.1)
            for call in calls:
                call.cancel()
        ended = (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)
        assert all(call.code() in ended for call in calls), [c.code() for c in calls]
    assert time.monotonic() - start < 30
    assert answers(channel) < 2

@pytest.mark.parametrize("name", ["Configure", "JobStats", "PullWeights", "PushGradients"])
@pytest.mark.parametrize("body", [b"\\x80\\x144[[\\x80\\x80\\x80\\x80", b"\\xff", b"\\x0a\\x05ab"])
def test_a_request_it_cannot_parse_is_refused_and_its_stream_freed(channel, name, body):
    if name == "PushGradients":
        call = lambda: channel.stream_unary(method(name))(iter([body]), timeout=5, metadata=AUTH)
    elif name == "PullWeights":
        call = lambda: list(channel.unary_stream(method(name))(body, timeout=5, metadata=AUTH))
    else:
        call = lambda: channel.unary_unary(method(name))(body, timeout=5, metadata=AUTH)
    for _ in range(CALLS):
        with pytest.raises(grpc.RpcError) as info:
            call()
        assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT, info.value
        assert "malformed" in info.value.details()
    assert answers(channel) < 2

@pytest.mark.parametrize("name", ["Configure", "JobStats", "Throughput", "PushGradients",
                                  "PullWeights"])
def test_a_ps_call_without_a_request_is_cancelled_in_the_idle_bound(server, name):
    host, port = server
    start = time.monotonic()
    got = stranger.open_streams(host, port, method(name), 8, 5.0, AUTH)
    assert got.get("status 1", 0) == 8, got  # CANCELLED
    assert time.monotonic() - start < 4
"""
)

#: A client that keeps ONE connection through a stranger's attack gets answers on it again once
#: the stranger leaves: on the tensor service and on a PS task's (the PS's token on its calls).
#: The server runs in its own process (with a 1 s idle bound), so the suite's own allocations
#: cannot run its garbage collector: the calls that expire queued behind the stranger's idle
#: streams (more than the connection's stream bound of them) must free their streams without it.
ONE_CONNECTION = (
    STREAMS_HEAD
    + """
import collections, subprocess
from pytest_tfgrpc.roles.parameter_server import method
from pytest_tfgrpc.wire._proto import service_pb2 as pb

SERVE = (
    "import sys; from pytest_tfgrpc.roles.tensor_server import build_server; "
    "s, t = build_server('127.0.0.1', 0, 'lo', workers=16, idle_s=1.0, job_token=sys.argv[1]); "
    "s.start(); print(t, flush=True); sys.stdin.read(); s.stop(0).wait(5)"
)
BOUND = grpc_settings.MAX_STREAMS_PER_CONNECTION

@pytest.fixture
def target():
    proc = subprocess.Popen([sys.executable, "-c", SERVE, TOKEN], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        yield proc.stdout.readline().strip()
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)

def caller(channel, service):
    if service == "tensor":
        echo = channel.unary_unary(ECHO)
        return lambda timeout: echo(bytes(1024), timeout=timeout)
    job = pb.PSJob(job_id=7, task=0, workers=1, steps=5, barrier_timeout_seconds=60,
                   shards=[pb.ShardSpec(tensor="w", offset=0, nbytes=64)], max_seconds=60,
                   warmup_seconds=1)
    channel.unary_unary(method("Configure"))(job.SerializeToString(), timeout=5, metadata=AUTH)
    stats = channel.unary_unary(method("JobStats"))
    return lambda timeout: stats(b"", timeout=timeout, metadata=AUTH)

def answered(call, n=20):
    got = collections.Counter()
    for _ in range(n):
        try:
            call(5)
            got["OK"] += 1
        except grpc.RpcError as error:
            got[error.code().name] += 1
    return got

@pytest.mark.parametrize("service", ["tensor", "ps"])
def test_one_connection_is_answered_again_after_idle_streams(target, service):
    host, _, port = target.rpartition(":")
    with grpc.insecure_channel(target, options=grpc_settings.CHANNEL_OPTIONS) as channel:
        call = caller(channel, service)
        assert answered(call, 5)["OK"] == 5
        during = collections.Counter()
        # 48 idle streams hold the 16 threads for 3 idle bounds (3 s), under the 64 calls the
        # server takes at once: this client's calls queue and expire (0.1 s deadline).
        with stranger.idle_streams(host, int(port), ECHO, 48, 4):
            time.sleep(0.2)
            end = time.monotonic() + 2.5
            while time.monotonic() < end:
                try:
                    call(0.1)
                    during["OK"] += 1
                except grpc.RpcError as error:
                    during[error.code().name] += 1
                    time.sleep(0.01)
        time.sleep(2)  # the last idle streams cancelled, their threads free
        after = answered(call)
    print("DURING", dict(during), "AFTER", dict(after))
    # More calls expired queued on this connection than its stream bound.
    assert during["DEADLINE_EXCEEDED"] >= BOUND, during
    assert after["OK"] >= 19, after

@pytest.mark.parametrize("service", ["tensor", "ps"])
def test_one_connection_is_answered_again_after_a_rapid_reset(target, service):
    host, _, port = target.rpartition(":")
    with grpc.insecure_channel(target, options=grpc_settings.CHANNEL_OPTIONS) as channel:
        call = caller(channel, service)
        assert answered(call, 5)["OK"] == 5
        during = collections.Counter()
        with stranger.rapid_reset(host, int(port), ECHO, limit=20_000, seconds=3) as counts:
            end = time.monotonic() + 3
            while time.monotonic() < end:
                try:
                    call(0.1)
                    during["OK"] += 1
                except grpc.RpcError as error:
                    during[error.code().name] += 1
                    time.sleep(0.01)
        after = answered(call)
    print("DURING", dict(during), counts, "AFTER", dict(after))
    assert counts["reset_streams"] > 0
    assert after["OK"] >= 19, after
"""
)

#: A CI history of runs on two runners (recorded by a metadata hook as ``runner``), each run's
#: server slowed by ``DELAY``: the gate compares a run with the runs of its own setup only.
RUNNER_CONFTEST = """
import os

def pytest_tfgrpc_run_metadata(config):
    return {{"runner": os.environ["RUNNER"]}}
"""

DELAYED_RUNNER = """
import os
import pytest
from pytest_tfgrpc.roles.processes import ServerProcess

@pytest.fixture
def server(fabric):
    with ServerProcess.start(fabric, extra_args=["--delay", os.environ["DELAY"]]) as started:
        yield started

@pytest.mark.message_profile(["1KiB"])
def test_echo(tfgrpc, server):
    tfgrpc.p2p_latency(server)
"""

#: Runner A's runs at 10 ms, B's (3x slower) at 30 ms: long enough to dominate load noise.
AB_HISTORY = tuple({"RUNNER": r, "DELAY": "10ms" if r == "A" else "30ms"} for r in "ABABA")
STEADY = ("--tfgrpc-iterations=30", "--tfgrpc-warmup=5", "--tfgrpc-max-seconds=2")


# --- the table -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One fault: its input and the outcome it must have.

    Input: ``suite`` (test module text), ``files`` (name -> text, e.g. a conftest),
    ``args`` (options), ``env``; or ``command`` (argv run instead of pytest). Text may hold
    ``{placeholders}`` (see :class:`World`). ``sigterm_after`` sends SIGTERM once the
    results file holds that many lines.

    Outcome: ``ret`` (exit status; None: any), ``lines`` (fnmatch patterns that must appear
    in stdout+stderr, in any order), ``absent`` (patterns that must not), ``outcomes``
    (passed/failed/errors counts), ``junit`` (test name -> property names that must be there;
    a name ending in ``*`` is a prefix), ``results`` (at least that many lines in the results
    file), ``seconds`` (the run ends within), and always: no process of the run outlives it.
    """

    id: str
    source: str
    suite: str = ""
    files: Mapping[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    command: tuple[str, ...] = ()
    sigterm_after: int | None = None
    kill_signal: int = signal.SIGTERM
    #: The JUnit file must not exist after the run (a killed run leaves none, not a stale one).
    no_junit: bool = False
    #: Run the suite once first with these options into ``{tmp}/base.xml`` (a baseline), then
    #: replace each (old, new) pair of ``baseline_edit`` in it.
    baseline_args: tuple[str, ...] | None = None
    baseline_edit: tuple[tuple[str, str], ...] = ()
    #: How many baseline runs: ``base.xml``, then ``base1.xml``, ... (a history).
    baseline_runs: int = 1
    #: A history instead: one baseline run per environment (added to ``env``), written to
    #: ``{tmp}/history/run-NNNN.xml``; made once per module for rows that share it.
    history: tuple[Mapping[str, str], ...] = ()
    #: What a stranger left at ``{tmp}/planted.lock`` first: ``link`` (to ``victim``),
    #: ``dangling`` (a link to nothing yet), ``fifo``, ``dir``, ``chown`` (a file of uid 12345).
    plant: str = ""
    #: ``files`` whose text must be the same after the run (a victim of a planted link).
    unchanged: tuple[str, ...] = ()
    #: Modes of ``files`` (name -> mode), set after writing them.
    modes: Mapping[str, int] = field(default_factory=dict)
    #: The module ``command`` runs (``python -m``) instead of ``tfgrpc-server --fabric lo``.
    cli: str = ""
    needs: tuple[str, ...] = ()
    ret: int | None = 0
    lines: tuple[str, ...] = ()
    absent: tuple[str, ...] = ("*INTERNALERROR*", "*Traceback (most recent call last)*")
    outcomes: Mapping[str, int] | None = None
    junit: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    results: int | None = None
    seconds: float | None = None
    #: At least this many of ``SLOW``'s sleeping tests took the signal as an interrupt within
    #: ``INTERRUPTED_WITHIN_S`` of it (each leaves ``{tmp}/interrupted-N`` holding the
    #: monotonic time): under pytest-xdist, proof that the workers got the signal, since
    #: without it pytest-xdist interrupts them only some 5 s later.
    interrupted: int = 0


#: How soon after the signal a sleeping test must take it as an interrupt (seen: 13 ms).
INTERRUPTED_WITHIN_S = 3.0

FAIL_SETUP = ("*ERROR at setup*",)
CASES: tuple[Case, ...] = (
    # --- E1-E5: fabrics --------------------------------------------------------------------
    Case(
        "unknown-fabric",
        "E1",
        LATENCY,
        args=("--tfgrpc-fabric=ib9",),
        ret=4,
        lines=("*unknown fabric 'ib9'*interfaces here:*lo*",),
    ),
    Case(
        "fabric-no-ipv4",
        "E2",
        LATENCY,
        args=("--tfgrpc-fabric={veth_bare}",),
        ret=4,
        needs=("root",),
        lines=("*{veth_bare}*",),
    ),
    Case(
        "fabric-link-local-only",
        "E2",
        LATENCY,
        args=("--tfgrpc-fabric={veth_ll}",),
        needs=("root",),
        outcomes={"passed": 1},
        junit={"test_latency[*]": ("tfgrpc.target",)},
    ),
    Case(
        "fabric-name-too-long",
        "E3",
        LATENCY,
        args=("--tfgrpc-fabric=" + "a" * 16,),
        ret=4,
        lines=("*16 bytes long*at most 15*",),
    ),
    Case(
        "fabric-name-slash",
        "E3",
        LATENCY,
        args=("--tfgrpc-fabric=a/b",),
        ret=4,
        lines=("*contains '/'*",),
    ),
    Case(
        "fabric-name-space",
        "E3",
        LATENCY,
        args=("--tfgrpc-fabric=a b",),
        ret=4,
        lines=("*not an interface name*",),
    ),
    Case(
        "fabric-down",
        "E4",
        LATENCY,
        args=("--tfgrpc-fabric={veth_down}",),
        ret=4,
        needs=("root",),
        lines=("*{veth_down}*down*",),
    ),
    Case(
        "fabric-alias",
        "E5",
        LATENCY,
        args=("--tfgrpc-fabric=lo:0",),
        ret=4,
        lines=("*'lo:0' is not an interface name*",),
    ),
    Case(
        "fabric-ip",
        "E5",
        LATENCY,
        args=("--tfgrpc-fabric=127.0.0.1",),
        ret=4,
        lines=("*is not an interface name but an IP address*",),
    ),
    Case(
        "fabric-hostname",
        "E5",
        LATENCY,
        args=("--tfgrpc-fabric=localhost",),
        ret=4,
        lines=("*unknown fabric 'localhost'*",),
    ),
    # --- E6-E8: ports (tfgrpc-server is where a port is given) ------------------------------
    *(
        Case(
            f"port-{port}",
            "E6",
            command=("--port", port),
            ret=2,
            lines=("*--port*",),
            absent=("*Traceback*",),
        )
        for port in ("70000", "65536", "-1", "abc")
    ),
    Case(
        "port-held-by-grpc",
        "E7",
        command=("--port", "{grpc_port}"),
        ret=2,
        lines=("*cannot bind 127.0.0.1:{grpc_port}*in use*",),
    ),
    Case(
        "port-held-by-socket",
        "E8",
        command=("--port", "{tcp_port}"),
        ret=2,
        lines=("*cannot bind 127.0.0.1:{tcp_port}*in use*",),
    ),
    # --- E9-E11, I13.sizes: message sizes and topologies -------------------------------------
    Case(
        "sizes-around-4MiB",
        "E9",
        LIMIT_BOUNDARY,
        args=QUICK,
        outcomes={"passed": 1},
        junit={
            "test_boundary[lo]": (
                "tfgrpc.p2p_bandwidth.4194305B.*",
                "tfgrpc.p2p_bandwidth.8200KB.*",
            )
        },
    ),
    Case(
        "unknown-profile",
        "E10",
        sized("'no_such_model'"),
        ret=1,
        lines=(*FAIL_SETUP, "*message_profile*no_such_model*"),
    ),
    Case("empty-sweep", "E10", sized("[]"), ret=1, lines=("*message_profile*",)),
    Case("negative-size", "E10", sized("['-1B']"), ret=1, lines=("*message_profile*-1B*",)),
    Case("fractional-size", "E10", sized("['1.5B']"), ret=1, lines=("*message_profile*1.5B*",)),
    *(
        Case(
            f"size-{name}",
            "E10/I13.sizes",
            sized(sizes),
            ret=1,
            lines=("*message_profile*exceeds the largest tensor one gRPC message carries*",),
            absent=("*INTERNALERROR*", "*tensor server on lo*"),
        )
        for name, sizes in (
            ("limit+1", "[2147483584]"),
            ("3GiB", "['3GiB']"),
            ("1TiB", "['1TiB']"),
            ("range-to-4GiB", "'1GiB..4GiB'"),
        )
    ),
    Case(
        "size-just-below-limit",
        "I13.sizes",
        """
from pytest_tfgrpc.bench.specs import message_spec
def test_accepted():
    assert message_spec([[2147483583]], {{}}).sizes == (2147483583,)
""",
        outcomes={"passed": 1},
    ),
    Case(
        "zero-and-one-byte-everywhere",
        "I13.sizes",
        EDGE_SIZES,
        args=QUICK,
        outcomes={"passed": 6},
        junit={
            "test_p2p[unary-raw-lo]": ("tfgrpc.push.0B.*", "tfgrpc.pull.0B.*"),
            "test_ps[protobuf-lo]": ("tfgrpc.ps_throughput.0B.*",),
        },
    ),
    Case("ps-zero", "E11", topology("ps=0"), ret=1, lines=("*ps_topology*ps*",)),
    Case("workers-zero", "E11", topology("workers=0"), ret=1, lines=("*ps_topology*workers*",)),
    Case(
        "sharding-unknown",
        "E11",
        topology("sharding='diagonal'"),
        ret=1,
        lines=("*ps_topology*diagonal*",),
    ),
    # --- E12-E13, I13.partial: failures mid-run ---------------------------------------------
    Case(
        "server-killed-mid-sweep",
        "E12/I13.partial",
        KILLED_MID_SWEEP,
        args=(*QUICK, "--tfgrpc-results={tmp}/results.jsonl"),
        ret=1,
        outcomes={"failed": 1, "passed": 1},
        lines=("*tensor server on lo exited with signal 9 (SIGKILL)*",),
        absent=("*INTERNALERROR*",),
        junit={"test_sweep[lo]": ("tfgrpc.p2p_latency.1KiB.p50_us", "tfgrpc.p2p_latency.settings")},
        results=2,
    ),
    Case(
        "ps-killed-mid-sweep",
        "E12/I13.partial",
        PS_KILLED_MID_SWEEP,
        args=(*QUICK, "--tfgrpc-results={tmp}/results.jsonl"),
        ret=1,
        outcomes={"failed": 1},
        lines=("*PS 0 on lo exited with signal 9 (SIGKILL)*",),
        absent=("*INTERNALERROR*",),
        junit={"test_ps_sweep[lo]": ("tfgrpc.ps_throughput.1KiB.*",)},
        results=1,
    ),
    Case(
        "server-dead-before-first-call",
        "E13/I13.partial",
        DEAD_BEFORE_FIRST_CALL,
        ret=1,
        lines=("*ServerDied: tensor server on lo exited with signal 9*",),
        absent=("*no connection*", "*INTERNALERROR*"),
        # Its server dies before a call, so it measures nothing: a lock of its own keeps the
        # bound on the plugin (no waiting out a 10 s connect), not on another run's measurement
        # (under load it waited past 10 s for the host lock before its test began).
        env={"TFGRPC_HOST_LOCK": "{tmp}/host.lock"},
        seconds=10,
    ),
    Case(
        "remote-server-unreachable",
        "E13",
        LATENCY,
        args=(*QUICK, "--tfgrpc-cluster={tmp}/cluster.json"),
        files={"cluster.json": '{{"cluster": {{"ps": ["127.0.0.1:{closed_port}"]}}}}'},
        ret=1,
        lines=("*127.0.0.1:{closed_port}*",),
        seconds=60,
    ),
    Case(
        "remote-server-dies-mid-run",
        "I13.partial",
        REMOTE_DIES,
        ret=1,
        lines=("*push of 1048576 B to ps[0] on otherhost at 127.0.0.1:* failed: UNAVAILABLE*",),
        absent=("*INTERNALERROR*", "*AioRpcError*", "*Internal error from Core*"),
        seconds=60,
    ),
    Case(
        "stray-stdout-lines",
        "I13.partial",
        STRAY_STDOUT,
        args=QUICK,
        outcomes={"passed": 1},
        absent=("*JSONDecodeError*",),
    ),
    Case(
        "deadline-names-itself",
        "I13.deadlines",
        DELAYED,
        ret=1,
        seconds=60,
        lines=(
            "*DEADLINE_EXCEEDED: the deadline was 11 s (10 s slack + run bound 1 s*"
            "raise it with --tfgrpc-max-seconds*",
        ),
    ),
    Case(
        "slow-link-unary-push",
        "I13.deadlines",
        SLOW_LINK,
        args=("--tfgrpc-fabric={veth_slow}", "--tfgrpc-cluster={veth_slow_cluster}"),
        needs=("root",),
        outcomes={"passed": 1},
        seconds=120,
    ),
    # --- E14, I13.tls: TLS ----------------------------------------------------------------
    Case(
        "tls-key-missing",
        "E14",
        LATENCY,
        args=("--tfgrpc-tls-cert={cert}",),
        ret=4,
        lines=("*--tfgrpc-tls-cert needs --tfgrpc-tls-key too*",),
    ),
    Case(
        "tls-file-missing",
        "E14",
        LATENCY,
        args=("--tfgrpc-tls-cert={tmp}/nope.pem", "--tfgrpc-tls-key={key}"),
        ret=4,
        lines=("*--tfgrpc-tls-cert {tmp}/nope.pem: No such file*",),
    ),
    Case(
        "tls-ca-without-identity",
        "E14",
        LATENCY,
        args=("--tfgrpc-tls-ca={ca}",),
        ret=4,
        lines=("*--tfgrpc-tls-ca needs --tfgrpc-tls-cert*",),
    ),
    Case(
        "tls-not-pem",
        "E14",
        LATENCY,
        args=("--tfgrpc-tls-cert={tmp}/conftest.py", "--tfgrpc-tls-key={key}"),
        files={"conftest.py": "# not a certificate\n"},
        ret=4,
        lines=("*not a PEM file*",),
    ),
    Case(
        "tls-native-engine",
        "I13.tls",
        TLS_RUN,
        args=(
            *QUICK,
            "--tfgrpc-engines=native",
            "--tfgrpc-tls-cert={cert}",
            "--tfgrpc-tls-key={key}",
            "--tfgrpc-tls-ca={ca}",
        ),
        needs=("native",),
        # the native server, client and PS workers speak the run's mutual TLS
        outcomes={"passed": 2},
        lines=("*TLS mtls*",),
        junit={"test_latency[lo]": ("tfgrpc.p2p_latency.settings",)},
    ),
    Case(
        "mtls-end-to-end",
        "I13.tls",
        TLS_RUN,
        args=(*QUICK, "--tfgrpc-tls-cert={cert}", "--tfgrpc-tls-key={key}", "--tfgrpc-tls-ca={ca}"),
        outcomes={"passed": 2},
        lines=("*TLS mtls*",),
        junit={"test_latency[lo]": ("tfgrpc.p2p_latency.settings",)},
    ),
    Case(
        "tls-ini-twins",
        "I13.tls",
        TLS_RUN,
        args=QUICK,
        files={
            "pytest.ini": "[pytest]\ntfgrpc_tls_cert = {cert}\ntfgrpc_tls_key = {key}\n"
            "tfgrpc_tls_ca = {ca}\n"
        },
        outcomes={"passed": 2},
        lines=("*TLS mtls*",),
    ),
    Case(
        "tls-remote-server-in-cluster-spec",
        "I13.tls",
        TLS_REMOTE,
        files={"conftest.py": tls_remote_conftest()},
        args=(*QUICK, "--tfgrpc-tls-cert={cert}", "--tfgrpc-tls-key={key}", "--tfgrpc-tls-ca={ca}"),
        outcomes={"passed": 1},
    ),
    Case(
        "tls-remote-server-plaintext-client",
        "I13.tls",
        TLS_REMOTE,
        files={"conftest.py": tls_remote_conftest()},
        args=QUICK,
        ret=1,
        lines=("*remote tensor server*TLS handshake not attempted*",),
    ),
    Case(
        "tls-plaintext-client",
        "E14",
        MTLS_SERVER,
        args=QUICK,
        ret=1,
        lines=("*TLS handshake not attempted*",),
    ),
    Case(
        "tls-wrong-ca",
        "E14",
        MTLS_SERVER,
        args=(
            *QUICK,
            "--tfgrpc-tls-cert={cert}",
            "--tfgrpc-tls-key={key}",
            "--tfgrpc-tls-ca={other_ca}",
        ),
        ret=1,
        lines=("*TLS handshake with 127.0.0.1:* failed*CERTIFICATE_VERIFY_FAILED*",),
    ),
    *(
        Case(
            f"tls-{kind}-server-cert{where}",
            "I25.tls",
            TLS_REMOTE if where else LATENCY,
            files={"conftest.py": tls_remote_conftest(kind + "_")} if where else {},
            args=(
                *QUICK,
                f"--tfgrpc-tls-cert={{{'' if where else kind + '_'}cert}}",
                f"--tfgrpc-tls-key={{{'' if where else kind + '_'}key}}",
                "--tfgrpc-tls-ca={ca}",
            ),
            ret=1,
            lines=(f"*TLS handshake with 127.0.0.1:* failed*{cause}*",),
            absent=(
                "*INTERNALERROR*",
                "*Traceback (most recent call last)*",
                "*is tfgrpc-server running there*",
                "*no connection to*",
            ),
        )
        for kind, cause in (
            ("misnamed", "certificate 127.0.0.1 presented does not name 127.0.0.1*--tfgrpc-tls-ca"),
            ("expired", "certificate 127.0.0.1 presented has expired*--tfgrpc-tls-ca"),
            ("other", "127.0.0.1 presented is not signed by the CA of --tfgrpc-tls-ca {ca}"),
        )
        for where in ("", "-remote")
    ),
    Case(
        "tls-client-cert-from-stranger",
        "E14",
        MTLS_SERVER,
        args=(
            *QUICK,
            "--tfgrpc-tls-cert={other_cert}",
            "--tfgrpc-tls-key={other_key}",
            "--tfgrpc-tls-ca={ca}",
        ),
        ret=1,
        lines=("*TLS handshake with 127.0.0.1:* failed*the server closed the connection*",),
    ),
    Case(
        "tls-no-client-cert",
        "E14",
        """
from pytest_tfgrpc.roles.processes import ServerProcess
from pytest_tfgrpc.wire import client, security
from pytest_tfgrpc.wire.fabric import resolve_fabric
import os, pytest

def test_no_client_cert():
    env = {{**os.environ, **security.TlsFiles("{cert}", "{key}", "{ca}").env()}}
    with ServerProcess.start(resolve_fabric("lo"), env=env) as server:
        security.use_tls(security.load_tls(security.TlsFiles(ca="{ca}")))
        try:
            with pytest.raises(client.BenchmarkError, match="TLS handshake"):
                client.connect(server.target, timeout=2)
        finally:
            security.use_tls(None)
""",
        outcomes={"passed": 1},
    ),
    Case(
        "standalone-server-tls-flags",
        "I13.tls",
        command=("--tls-cert", "{cert}"),
        ret=2,
        lines=("*--tls-cert needs --tls-key too*",),
    ),
    # --- E15-E20: the gate ------------------------------------------------------------------
    Case(
        "baseline-corrupt",
        "E15",
        GATE_SUITE,
        args=(*QUICK, "--tfgrpc-baseline={tmp}/base.xml"),
        files={"base.xml": "<testsuites"},
        ret=4,
        lines=("*tfgrpc baseline*",),
    ),
    Case(
        "baseline-corrupt-warn",
        "E15",
        GATE_SUITE,
        args=(*QUICK, "--tfgrpc-baseline={tmp}/base.xml", "--tfgrpc-bad-baseline=warn"),
        files={"base.xml": "<testsuites"},
        outcomes={"passed": 1},
        lines=("*WARNING*",),
    ),
    Case(
        "baseline-missing",
        "E16",
        GATE_SUITE,
        args=(*QUICK, "--tfgrpc-baseline={tmp}/none.xml"),
        ret=4,
        lines=("*none.xml*",),
    ),
    Case(
        "gate-expression-bad",
        "E18",
        GATE_SUITE,
        args=("--tfgrpc-baseline={tmp}/base.xml", "--tfgrpc-max-regression=p99:abc"),
        files={"base.xml": "<testsuites/>"},
        ret=4,
        lines=("*p99:abc*",),
    ),
    Case(
        "gate-metric-unknown",
        "E18",
        GATE_SUITE,
        args=("--tfgrpc-baseline={tmp}/base.xml", "--tfgrpc-max-regression=p42:5%"),
        files={"base.xml": "<testsuites/>"},
        ret=4,
        lines=("*p42*",),
    ),
    Case(
        "budget-nan",
        "E18",
        sized("['1KiB']").replace(
            "@pytest.mark.message_profile",
            "@pytest.mark.budget(p99='nan ms')\n@pytest.mark.message_profile",
        ),
        ret=1,
        lines=("*budget*nan*",),
    ),
    Case(
        "baseline-from-another-host",
        "E17",
        GATE_SUITE,
        baseline_args=QUICK,
        baseline_edit=(
            ('name="tfgrpc.meta.host" value="', 'name="tfgrpc.meta.host" value="elsewhere-'),
        ),
        args=(*QUICK, "--tfgrpc-baseline={tmp}/base.xml", "--tfgrpc-max-regression=100000%"),
        outcomes={"passed": 1},
        lines=("*WARNING baseline setup differs: host: baseline elsewhere-*",),
    ),
    Case(
        "baseline-from-another-host-refused",
        "E17",
        GATE_SUITE,
        baseline_args=QUICK,
        baseline_edit=(
            ('name="tfgrpc.meta.host" value="', 'name="tfgrpc.meta.host" value="elsewhere-'),
        ),
        args=(*QUICK, "--tfgrpc-baseline={tmp}/base.xml", "--tfgrpc-baseline-mismatch=fail"),
        ret=4,
        lines=("*host: baseline elsewhere-*",),
    ),
    Case(
        "too-few-samples-inconclusive",
        "E19",
        GATE_SUITE,
        # Two samples, so two rounds: below the gate's minimum of three rounds (3 samples
        # would be 3 rounds of one, which the gate tests, saying what it could detect).
        baseline_args=("--tfgrpc-iterations=2", "--tfgrpc-warmup=1"),
        args=(
            "--tfgrpc-iterations=2",
            "--tfgrpc-warmup=1",
            "--tfgrpc-baseline={tmp}/base.xml",
            "--tfgrpc-inconclusive=fail",
        ),
        ret=1,
        lines=("*inconclusive*",),
    ),
    Case(
        "budget-failure-in-junit",
        "E20",
        BUDGET_FAIL,
        args=QUICK,
        ret=1,
        outcomes={"failed": 1},
        junit={"test_latency[lo]": ("tfgrpc.p2p_latency.1KiB.p50_us",)},
    ),
    # --- E21-E25, I13.signals, I13.values: results survive ----------------------------------
    Case(
        "numpy-record-property-xdist",
        "E21/I13.values",
        NUMPY_PROPERTY,
        args=(*QUICK, "-n", "2"),
        needs=("xdist",),
        outcomes={"passed": 2},
        junit={
            "test_numpy": ("np_float", "np_int", "np_array", "odd", "3"),
            "test_other[lo]": ("tfgrpc.p2p_latency.4B.*",),
        },
    ),
    Case(
        "sigterm-mid-session",
        "E22/I13.signals",
        SLOW,
        args=(*QUICK, "--tfgrpc-results={tmp}/results.jsonl"),
        sigterm_after=2,
        ret=None,
        junit={"test_one[lo]": ("tfgrpc.p2p_latency.4B.*",), "test_two[lo]": ()},
        results=2,
        absent=("*INTERNALERROR*",),
        seconds=15,  # after the signal; the slow tests would sleep 30 s more
        interrupted=1,
    ),
    Case(
        "sigterm-mid-session-xdist",
        "E22/I13.signals",
        SLOW,
        args=(*QUICK, "-n", "2", "--tfgrpc-results={tmp}/results.jsonl"),
        sigterm_after=2,
        needs=("xdist",),
        ret=None,
        results=2,
        absent=("*INTERNALERROR*",),
        seconds=15,  # after the signal
        interrupted=1,  # workers get it too, not only the controller
        junit={"test_one[lo]": ("tfgrpc.p2p_latency.4B.*",)},
    ),
    *(
        Case(
            f"sighup-mid-session{suffix}",
            "I25.signals",
            SLOW,
            args=(*QUICK, *extra, "--tfgrpc-results={tmp}/results.jsonl"),
            sigterm_after=2,
            kill_signal=signal.SIGHUP,
            needs=needs,
            ret=None,
            lines=("*SIGHUP received*",),
            junit={"test_one[lo]": ("tfgrpc.p2p_latency.4B.*",)},
            results=2,
            seconds=seconds,
            interrupted=1,
        )
        for suffix, extra, needs, seconds in (
            ("", (), (), 15),
            ("-xdist", ("-n", "2"), ("xdist",), 15),
        )
    ),
    Case(
        "sigkill-leaves-no-stale-junit",
        "E22/I13.signals",
        SLOW,
        args=(*QUICK, "--tfgrpc-results={tmp}/results.jsonl"),
        files={"perf.xml": "<testsuites><testsuite name='last week'/></testsuites>"},
        sigterm_after=2,
        kill_signal=signal.SIGKILL,
        ret=None,
        results=2,
        no_junit=True,
        seconds=15,
    ),
    Case(
        "xdist-worker-crash",
        "E23",
        CRASH,
        args=(*QUICK, "-n", "2"),
        needs=("xdist",),
        ret=1,
        lines=("*crashed*",),
        absent=("*INTERNALERROR*",),
        junit={"test_fine[lo]": ("tfgrpc.p2p_latency.4B.*",)},
    ),
    Case(
        "suite-metadata-xdist",
        "E24",
        LATENCY,
        args=(*QUICK, "-n", "2"),
        needs=("xdist",),
        outcomes={"passed": 1},
        junit={"<suite>": ("tfgrpc.meta.host", "tfgrpc.meta.fabrics")},
    ),
    *(
        Case(
            f"junit-family-{family}",
            "E25",
            LATENCY,
            args=(*QUICK, "-o", f"junit_family={family}"),
            outcomes={"passed": 1},
            junit={"test_latency[lo]": ("tfgrpc.p2p_latency.4B.p50_us",)},
        )
        for family in ("xunit1", "xunit2")
    ),
    # --- E26: launch environments -------------------------------------------------------------
    *(
        Case(
            f"tf-config-{name}-unused",
            "E26",
            PLAIN,
            env={"TF_CONFIG": value},
            outcomes={"passed": 1},
        )
        for name, value in TF_CONFIGS.items()
    ),
    Case(
        "slurm-hostlists-unused",
        "E26",
        PLAIN,
        env={"SLURM_JOB_NODELIST": "node[01-03,07]", "SLURM_TASKS_PER_NODE": "2(x3)"},
        outcomes={"passed": 1},
    ),
    # --- E27, I13.coexistence ---------------------------------------------------------------
    Case(
        "own-fabric-option",
        "E27/I13.coexistence",
        OWN_FABRIC_OPTION_TEST,
        files={"conftest.py": OWN_FABRIC_OPTION},
        args=(*QUICK, "--fabric=production"),
        outcomes={"passed": 1},
        lines=("*--fabric is defined by this project*--tfgrpc-fabric*",),
    ),
    Case(
        "own-fabric-option-and-tfgrpc-fabric",
        "E27/I13.coexistence",
        OWN_FABRIC_OPTION_TEST,
        files={"conftest.py": OWN_FABRIC_OPTION},
        args=(*QUICK, "--fabric=production", "--tfgrpc-fabric=lo"),
        outcomes={"passed": 1},
    ),
    Case(
        "own-fabric-fixture",
        "E27/I13.coexistence",
        OWN_FABRIC_FIXTURE,
        args=QUICK,
        outcomes={"passed": 2},
        lines=("*test_mine PASSED*", "*test_theirs?lo? PASSED*"),
        absent=("*test_mine?lo?*", "*INTERNALERROR*"),
    ),
    Case(
        "with-pytest-benchmark",
        "E27",
        LATENCY,
        args=QUICK,
        needs=("pytest_benchmark",),
        outcomes={"passed": 1},
    ),
    # --- I25.outcomes: outcomes other plugins report --------------------------------------------
    *(
        Case(
            f"rerun-{name}",
            "I25.outcomes",
            FLAKY.replace("{fail_first}", str(fail_first)),
            args=(*QUICK, "--reruns", str(reruns), "--tfgrpc-results={tmp}/results.jsonl"),
            needs=("pytest_rerunfailures",),
            ret=ret,
            lines=lines,
            junit={"test_after[lo]": ("tfgrpc.p2p_latency.4B.*",)},
            results=3,
        )
        for name, fail_first, reruns, ret, lines in (
            ("then-pass", 1, 1, 0, ("*3 passed, 2 rerun*",)),
            ("always-fails", 9, 2, 1, ("*1 failed, 1 passed, 1 error, 4 rerun*",)),
            ("exhausted", 3, 1, 1, ("*rerun*",)),
        )
    ),
    Case(
        "xfail-variants",
        "I25.outcomes",
        XFAILS,
        args=(*QUICK, "--tfgrpc-results={tmp}/results.jsonl", "--tfgrpc-html={tmp}/r.html"),
        ret=1,
        lines=("*1 failed, 1 passed, 3 xfailed, 1 xpassed*", "*tfgrpc: HTML report*"),
        junit={"test_after[lo]": ("tfgrpc.p2p_latency.4B.*",)},
        results=6,
    ),
    *(
        Case(
            f"invented-outcome-{phase}-{word}",
            "I25.outcomes",
            INVENTED_SUITE,
            files={
                "conftest.py": INVENTED_OUTCOME.replace("{phase}", phase).replace("{word}", word)
            },
            args=(*QUICK, "--tfgrpc-results={tmp}/results.jsonl", "--tfgrpc-html={tmp}/r.html"),
            ret=None,
            lines=("*tfgrpc: HTML report*",),
            junit={"test_after[lo]": ("tfgrpc.p2p_latency.4B.*",)},
            results=2,
        )
        for phase, word in (
            ("call", "flaky"),
            ("setup", "quarantined"),
            ("all", "<b>&x"),
            ("teardown", ""),
        )
    ),
    # --- I25.full-disk: every output the plugin writes, on a full filesystem ------------------
    *(
        Case(
            f"full-disk-{name}",
            "I25.full-disk",
            XFAILS.split("@pytest.mark.xfail(reason=")[0] + "\n" + INVENTED_SUITE,
            args=(*QUICK, *args),
            ret=0,
            lines=(*lines, *(("*tfgrpc: HTML report*",) if "html" not in name else ())),
            junit={"test_after[lo]": ("tfgrpc.p2p_latency.4B.*",)},
            outcomes={"passed": 2},
        )
        for name, args, lines in (
            (
                "results",
                ("--tfgrpc-results={full_dir}/results.jsonl", "--tfgrpc-html={tmp}/r.html"),
                ("tfgrpc: results file */results.jsonl: cannot append *: No space left*",),
            ),
            (
                "html",
                ("--tfgrpc-html={full_dir}/r.html", "--tfgrpc-results={tmp}/results.jsonl"),
                ("tfgrpc: no HTML report: cannot write */r.html: No space left*",),
            ),
            (
                "plots",
                ("--tfgrpc-plot={full_dir}/plots", "--tfgrpc-html={tmp}/r.html"),
                ("tfgrpc: no plots: cannot write into */plots: No space left*",),
            ),
            (
                "results-dev-full",
                ("--tfgrpc-results=/dev/full", "--tfgrpc-html={tmp}/r.html"),
                ("tfgrpc: results file /dev/full: cannot append *: No space left*",),
            ),
        )
    ),
    # --- I25.history: a history too short to show a change ----------------------------------
    *(
        Case(
            f"history-too-short-{name}",
            "I25.messages",
            LATENCY,
            baseline_args=QUICK,
            baseline_runs=runs,
            cli="pytest_tfgrpc.cli.history",
            command=command,
            needs=("ruptures",),
            lines=(f"*{count} runs are too short a history*at least 3 runs*",),
        )
        for name, runs, command, count in (
            ("one-run", 1, ("{tmp}/base.xml",), 1),
            ("two-runs", 2, ("{tmp}/base.xml", "{tmp}/base1.xml"), 2),
            ("one-run-twice", 1, ("{tmp}/base.xml", "{tmp}/base.xml"), 1),
        )
    ),
    # --- I25.secrets: token files, tokens in children, leases ---------------------------------
    *(
        Case(
            f"agent-token-file-mode-{mode:o}",
            "I25.secrets",
            files={"token": "s" * 32 + "\n"},
            modes={"token": mode},
            cli="pytest_tfgrpc.hosts.agent",
            command=("--fabric", "lo", "--port", "0", "--token-file", "{tmp}/token"),
            ret=2,
            lines=(
                f"*token file */token is readable or writable by others (mode 0{mode:o}): "
                "run chmod 600 */token*",
            ),
            seconds=30,
        )
        for mode in (0o644, 0o604, 0o666, 0o622)
    ),
    *(
        Case(
            f"driver-token-file-mode-{mode:o}",
            "I25.secrets",
            LATENCY,
            files={"token": "s" * 32 + "\n"},
            modes={"token": mode},
            args=(
                *QUICK,
                "--tfgrpc-agents=127.0.0.1:{closed_port}",
                "--tfgrpc-agent-token-file={tmp}/token",
            ),
            ret=None,
            lines=("*token file */token is readable or writable by others*chmod 600*",),
            seconds=60,
        )
        for mode in (0o644, 0o606)
    ),
    Case(
        "agent-secrets-and-leases",
        "I25.secrets",
        AGENT_SECRETS.replace(
            "{leases}", "math.nan, math.inf, -math.inf, -1.0, 0.0, 0.5, 121.0, 1e300, 5e-324"
        ),
        args=QUICK,
        env={"TFGRPC_AGENT_TOKEN": "k" * 32},
        outcomes={"passed": 10},
        seconds=120,
    ),
    # --- I25.shared-paths: the measurement lock where others could reach it -------------------
    *(
        Case(
            f"host-lock-{name}",
            "I25.shared-paths",
            LATENCY,
            files={"victim": "root's file\n"},
            args=QUICK,
            env={"TFGRPC_HOST_LOCK": "{tmp}/planted.lock"},
            plant=plant,
            unchanged=("victim",),
            ret=1,
            lines=(line,),
            seconds=60,
        )
        for name, plant, line in (
            ("symlink", "link", "*planted.lock is a symbolic link: refusing*"),
            ("dangling-symlink", "dangling", "*planted.lock is a symbolic link: refusing*"),
            ("fifo", "fifo", "*planted.lock is not a regular file*"),
            ("directory", "dir", "*planted.lock: Is a directory*"),
            (
                "other-owner",
                "chown",
                "*planted.lock is not a regular file of this user (uid 12345)*",
            ),
        )
    ),
    *(
        Case(
            f"host-lock-held-{wait}s",
            "I25.shared-paths",
            LATENCY,
            args=QUICK,
            env={"TFGRPC_HOST_LOCK": "{held_lock}", "TFGRPC_HOST_LOCK_WAIT": wait},
            ret=1,
            lines=(
                f"*measurement lock */host.lock is held by run 20990101T000000Z-elsewhere-0000"
                f" (pid 4242) for more than {wait} s*",
            ),
            outcomes={"error": 1},
            seconds=60,
        )
        for wait in ("1", "3")
    ),
    Case(
        "host-lock-wait-not-a-number",
        "I25.shared-paths",
        LATENCY,
        args=QUICK,
        env={"TFGRPC_HOST_LOCK": "{tmp}/ok.lock", "TFGRPC_HOST_LOCK_WAIT": "nan"},
        ret=1,
        lines=("*TFGRPC_HOST_LOCK_WAIT='nan': a positive number of seconds*",),
        seconds=60,
    ),
    # --- I25.data-plane: a push is checked whole before it touches the sum --------------------
    Case(
        "bad-pushes-leave-the-sum-alone",
        "I25.data-plane",
        BAD_PUSHES,
        args=QUICK,
        outcomes={"passed": 10},
        seconds=180,
    ),
    Case(
        "strangers-refused-and-not-counted",
        "I25.data-plane",
        STRANGERS,
        args=(*QUICK, "-s"),
        outcomes={"passed": 6},
        seconds=120,
        lines=(
            "*REFUSED none PushGradients the PS service needs the token*carried none*",
            "*REFUSED other-job Throughput the PS service needs the token*a wrong one*",
        ),
    ),
    Case(
        "native-strangers-refused-and-not-counted",
        "I25.native",
        STRANGERS,
        args=(*QUICK, "--tfgrpc-engines=native"),
        needs=("native",),
        outcomes={"passed": 6},
        seconds=120,
    ),
    Case(
        "compressed-calls-refused-unread",
        "I25.exhaustion",
        COMPRESSED,
        args=QUICK,
        outcomes={"passed": 8},
        seconds=240,
    ),
    *(
        Case(
            f"agent-at-its-limit-{name}",
            "I25.exhaustion",
            AGENT_AT_ITS_LIMIT.replace("{split}", split),
            args=("-s",),
            needs=("native",),
            outcomes={"passed": 1},
            lines=(
                "*REFUSED RESOURCE_EXHAUSTED: the agent runs 64 processes already, its limit (64)*",
                *(
                    f"*HEARTBEATS driver-{index} ({count} roles): * answered, slowest * ms, "
                    "missed none*"
                    for index, count in enumerate(int(n) for n in split.split(",") if n.strip())
                ),
            ),
            seconds=120,
        )
        for name, split in (
            ("64-roles-of-one-driver", "64,"),
            ("32-and-32-roles-of-two-drivers", "32, 32"),
            ("64-roles-and-an-idle-driver", "64, 0"),
        )
    ),
    # --- I25.names: agents and hosts by name, subnets a route covers ------------------------
    Case(
        "agent-names-every-address-and-late-names",
        "I25.names",
        AGENT_NAMES,
        outcomes={"passed": 9},
        seconds=120,
    ),
    Case(
        "fabric-subnets-a-route-covers-skipped",
        "I25.names",
        FABRIC_ROUTES,
        outcomes={"passed": 10},
        needs=("root",),
        seconds=120,
    ),
    Case(
        "fabric-down-follows-only-its-own-state",
        "I25.shared-paths",
        FABRIC_STATE,
        outcomes={"passed": 19},
        seconds=60,
    ),
    # --- I25.gate-setups: a history of two runners is never pooled -------------------------
    *(
        Case(
            f"gate-setups-{name}",
            "I25.gate-setups",
            DELAYED_RUNNER,
            files={"conftest.py": RUNNER_CONFTEST},
            baseline_args=STEADY,
            history=AB_HISTORY,
            env={"RUNNER": runner, "DELAY": delay},
            args=(*STEADY, "--tfgrpc-baseline={tmp}/history"),
            ret=ret,
            lines=lines,
            seconds=120,
        )
        for name, runner, delay, ret, lines in (
            (
                "a-regression-on-A-caught",
                "A",
                "38ms",
                1,
                (
                    "*baseline history split by setup: comparing with the 3 of 5 runs of this "
                    "run's setup, not pooling the 2 of another (extra.runner: baseline B, "
                    "current A)*",
                    "*regression: test_case.py::test_echo?lo? p2p_latency.1KiB.p50*",
                ),
            ),
            (
                "a-regression-on-B-caught",
                "B",
                "110ms",
                1,
                (
                    "*split by setup: comparing with the 2 of 5 runs of this run's setup*",
                    "*regression: test_case.py::test_echo?lo? p2p_latency.1KiB.p50*",
                ),
            ),
            (
                "a-setup-no-run-has",
                "C",
                "10ms",
                None,
                (
                    "*split by setup: comparing with the 3 of 5 runs of the most recent "
                    "baseline run's*",
                ),
            ),
        )
    ),
    Case(
        "agent-control-apart-from-data",
        "I25.exhaustion",
        AGENT_CONTROL,
        args=("-s", "-k", "control_is_served_apart"),
        needs=("native",),
        outcomes={"passed": 1},
        lines=("*CONTROL * heartbeats answered at once by 24 threads, slowest * ms, failed none*",),
        seconds=180,
    ),
    # --- I25.streams: idle streams, rapid reset, streams bounded per connection -------------
    Case(
        "idle-streams-and-rapid-reset",
        "I25.exhaustion",
        IDLE_STREAMS,
        args=("-s",),
        needs=("h2",),
        outcomes={"passed": 6},
        seconds=120,
        lines=("*'reset_streams': *echoes answered in the attack*",),
    ),
    *(
        Case(name, "I25.exhaustion", suite, needs=("h2",), outcomes={"passed": n}, seconds=180)
        for name, suite, n in (
            ("streams-bounded-per-connection", STREAM_BOUND, 16),
            ("ps-frees-the-streams-of-ended-calls", PS_STREAMS, 21),
            ("one-connection-answered-again-after-each-attack", ONE_CONNECTION, 4),
        )
    ),
    # --- I13.security, I13.consistency ----------------------------------------------------------
    Case(
        "oversize-and-unauthenticated-refused",
        "I13.security",
        GUARDED,
        args=(*QUICK, "-s"),
        outcomes={"passed": 1},
        lines=(
            "*REFUSED the PS service needs the token of the driver*none*",
            "*REFUSED the PS service needs the token of the driver*wrong one*",
        ),
    ),
    Case("ps-limit-fits-profile-and-fit", "I13.security", PROFILE_SGD, outcomes={"passed": 1}),
    Case(
        "native-ps-limit-fits-profile-and-fit",
        "I25.native",
        PROFILE_SGD,
        args=("--tfgrpc-engines=native",),
        needs=("native",),
        outcomes={"passed": 1},
    ),
    Case(
        "native-malformed-input-and-strangers-refused",
        "I25.native",
        NATIVE_GUARDED,
        args=(*QUICK, "-s"),
        needs=("native",),
        outcomes={"passed": 1},
        seconds=120,
        lines=(
            "*REFUSED Echo 11 B: INVALID_ARGUMENT*",
            "*REFUSED Pull 7 B: RESOURCE_EXHAUSTED*",
            "*REFUSED the PS service needs the token*the call carried none*",
        ),
    ),
    Case(
        "stream-push-over-limit",
        "I13.security",
        OVER_LIMIT_STREAM,
        ret=1,
        lines=("*RESOURCE_EXHAUSTED: a pushed message of 4194304 B refused*at most 1024 B*",),
        absent=("*INTERNALERROR*", "*Internal error from Core*"),
    ),
    Case(
        "standalone-server-allocator",
        "I13.consistency",
        """
import json, subprocess, sys
import grpc
from pytest_tfgrpc.wire import grpc_settings
from pytest_tfgrpc.wire._proto import service_pb2

def test_standalone_is_tuned():
    proc = subprocess.Popen([sys.executable, "-m", "pytest_tfgrpc.roles.tensor_server",
                             "--fabric", "lo", "--exit-on-stdin-eof"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        target = json.loads(proc.stdout.readline())["target"]
        with grpc.insecure_channel(target) as channel:
            reply = channel.unary_unary(grpc_settings.method("raw", "Status"))(b"", timeout=10)
        env = dict(service_pb2.ServerStatus.FromString(reply).environment)
        assert env["allocator"] == "tuned", env
        assert env["mallopt.M_MMAP_THRESHOLD"] == str(32 << 20), env
    finally:
        proc.stdin.close()
        proc.wait(10)
""",
        outcomes={"passed": 1},
    ),
)


# --- making the placeholders -------------------------------------------------------------------
class World:
    """The placeholders rows use, made on first use and torn down at the end."""

    def __init__(self, tmp: Path, stack: contextlib.ExitStack) -> None:
        self.tmp = tmp
        self.stack = stack
        self.values: dict[str, str] = {"tmp": str(tmp)}
        self._links: dict[str, Any] = {}

    def fill(self, text: str) -> str:
        for name in _placeholders(text):
            if name not in self.values:
                self.values.update(self._make(name))
        return text.format(**self.values) if "{" in text else text

    def fill_words(self, text: str) -> str:
        """``text`` with each ``{name}`` placeholder filled and every other brace left as it
        is: environment values may hold JSON (``TF_CONFIG``)."""
        return re.sub(r"\{[A-Za-z_]\w*\}", lambda found: self.fill(found.group(0)), text)

    def _make(self, name: str) -> dict[str, str]:
        if name in _CERTIFICATES:
            return _certificates(self.tmp)
        if name == "held_lock":
            return {name: self._held_lock()}
        if name == "full_dir":
            return {name: self._full_dir()}
        if name == "tests_dir":
            return {name: str(Path(__file__).parent)}
        if name == "closed_port":
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                return {name: str(probe.getsockname()[1])}
        if name == "tcp_port":
            held = self.stack.enter_context(socket.create_server(("127.0.0.1", 0)))
            return {name: str(held.getsockname()[1])}
        if name == "grpc_port":
            from pytest_tfgrpc.roles.processes import ServerProcess
            from pytest_tfgrpc.wire.fabric import resolve_fabric

            server = self.stack.enter_context(ServerProcess.start(resolve_fabric("lo")))
            return {name: server.target.rsplit(":", 1)[1]}
        if name == "veth_slow_cluster":
            return self._remote_over_slow_link()
        if name.startswith("veth_"):
            return {name: self._link(name)}
        raise KeyError(f"no placeholder {name!r}")

    def _held_lock(self) -> str:
        """A lock file (in a private directory) whose flock another process holds through
        a read-only handle, naming a run that is not the test's."""
        import fcntl

        private = self.tmp / "locks"
        private.mkdir(mode=0o700)
        path = private / "host.lock"
        path.write_text("20990101T000000Z-elsewhere-0000 pid 4242")
        path.chmod(0o600)
        holder = subprocess.Popen(
            [sys.executable, "-c", "import fcntl, sys; f = open(sys.argv[1]); "
             "fcntl.flock(f, fcntl.LOCK_EX); print(flush=True); sys.stdin.read()", str(path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )  # fmt: skip
        assert holder.stdout is not None and holder.stdout.readline() == b"\n"
        self.stack.callback(holder.wait, 10)
        self.stack.callback(holder.stdin.close)  # type: ignore[union-attr]
        del fcntl
        return str(path)

    def _full_dir(self) -> str:
        """A directory on a small tmpfs filled to its last block (needs root)."""
        if os.geteuid() != 0:
            pytest.skip("needs root (a small tmpfs)")
        mount = self.tmp / "full"
        mount.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tfgrpc-full", str(mount)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")
        self.stack.callback(subprocess.run, ["umount", "-l", str(mount)], check=False)
        with contextlib.suppress(OSError), open(mount / "filler", "wb") as filler:
            while True:
                filler.write(b"\0" * 4096)
                filler.flush()
        return str(mount)

    def _remote_over_slow_link(self) -> dict[str, str]:
        """A tensor server in a namespace behind a 1 Mbit/s veth link (traffic to an address
        of this host would take loopback), named by a cluster spec."""
        root_if = self.fill("{veth_slow}")
        link = self._links[root_if]
        command = link.ns_command(
            [sys.executable, "-m", "pytest_tfgrpc.roles.tensor_server", "--fabric",
             link.ns_if, "--exit-on-stdin-eof"]
        )  # fmt: skip
        server = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.stack.callback(server.wait, 10)
        self.stack.callback(server.stdin.close)  # type: ignore[union-attr]
        target = json.loads(server.stdout.readline())["target"]  # type: ignore[union-attr]
        spec = self.tmp / "slow_cluster.json"
        spec.write_text(json.dumps({"cluster": {"ps": [target]}}))
        return {"veth_slow_cluster": str(spec)}

    def _link(self, name: str) -> str:
        from netns import can_make_links, veth_link

        ok, reason = can_make_links(shaping=name == "veth_slow")
        if not ok:
            pytest.skip(reason)
        kind = {
            "veth_bare": {"ipv4": False, "link_local": False},
            "veth_ll": {"ipv4": False, "link_local": True, "ipv6": False},
            "veth_down": {},
            "veth_slow": {"rate": "1mbit"},
        }[name]
        link = self.stack.enter_context(veth_link(**kind))  # type: ignore[arg-type]
        self._links[str(link.root_if)] = link
        if name == "veth_down":
            subprocess.run(["ip", "link", "set", link.root_if, "down"], check=True)
        return str(link.root_if)


def _placeholders(text: str) -> list[str]:
    import string

    return [f for _, f, _, _ in string.Formatter().parse(text) if f]


#: The TLS placeholders: a CA and a leaf (``ca``, ``cert``, ``key``), another CA and its leaf
#: (``other_*``), and leaves of the first CA that fail a client's checks: one naming another
#: host (``misnamed_*``), one expired yesterday (``expired_*``).
_CERTIFICATES = tuple(
    f"{prefix}{kind}"
    for prefix in ("", "other_", "misnamed_", "expired_")
    for kind in ("ca", "cert", "key")
    if prefix in ("", "other_") or kind != "ca"
)


def _certificates(tmp: Path) -> dict[str, str]:
    trustme = pytest.importorskip("trustme")
    out = {}
    first = trustme.CA()
    for prefix, ca in (("", first), ("other_", trustme.CA())):
        leaf = ca.issue_cert("127.0.0.1", "::1", "localhost")
        paths = {k: tmp / f"{prefix}{k}.pem" for k in ("ca", "cert", "key")}
        ca.cert_pem.write_to_path(str(paths["ca"]))
        leaf.private_key_pem.write_to_path(str(paths["key"]))
        for i, pem in enumerate(leaf.cert_chain_pems):
            pem.write_to_path(str(paths["cert"]), append=i > 0)
        out.update({f"{prefix}{k}": str(v) for k, v in paths.items()})
    day = 86400
    for prefix, names, valid in (
        ("misnamed_", ("node9.example.invalid", "198.18.9.9"), (-3600, day)),
        ("expired_", ("127.0.0.1", "::1", "localhost"), (-30 * day, -day)),
    ):
        cert, key = _leaf(first.private_key_pem.bytes(), first.cert_pem.bytes(), names, valid)
        for kind, pem in (("cert", cert), ("key", key)):
            (tmp / f"{prefix}{kind}.pem").write_bytes(pem)
            out[f"{prefix}{kind}"] = str(tmp / f"{prefix}{kind}.pem")
    return out


def _leaf(
    ca_key_pem: bytes, ca_pem: bytes, names: tuple[str, ...], valid: tuple[int, int]
) -> tuple[bytes, bytes]:
    """A certificate (PEM) and its key, signed by the CA, for ``names`` (DNS names or IP
    addresses), valid from ``valid[0]`` to ``valid[1]`` seconds from now."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import NameOID

    ca_key = serialization.load_pem_private_key(ca_key_pem, None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey)  # trustme's
    ca = x509.load_pem_x509_certificate(ca_pem)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)

    def alt(name: str) -> x509.GeneralName:
        try:
            return x509.IPAddress(ipaddress.ip_address(name))
        except ValueError:
            return x509.DNSName(name)

    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now + datetime.timedelta(seconds=valid[0]))
        .not_valid_after(now + datetime.timedelta(seconds=valid[1]))
        .add_extension(x509.SubjectAlternativeName([alt(n) for n in names]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), private


# --- running a row ----------------------------------------------------------------------------
@dataclass
class Outcome:
    ret: int
    text: str
    seconds: float
    xml: Path
    results: Path
    #: Seconds from the signal (``sigterm_after``) to the run's end; None where none was sent.
    after_signal: float | None = None
    #: The monotonic time the signal was sent; None where none was.
    signalled: float | None = None


def _needs(case: Case) -> None:
    for need in case.needs:
        if need == "root":
            if os.geteuid() != 0:
                pytest.skip("needs root (veth links)")
        elif need == "native":
            from pytest_tfgrpc.native import unavailable_reason

            reason = unavailable_reason()
            if reason is not None:
                pytest.skip(reason)
        else:
            pytest.importorskip(need)


def _run(case: Case, world: World, tmp: Path, store: Path) -> Outcome:
    xml = tmp / "perf.xml"
    results = tmp / "results.jsonl"
    for name, text in case.files.items():
        (tmp / name).write_text(world.fill(text))
        if name in case.modes:
            (tmp / name).chmod(case.modes[name])
    _plant(case.plant, tmp)
    tag = uuid.uuid4().hex
    filled = {k: world.fill_words(v) for k, v in case.env.items()}
    env = {**os.environ, **filled, "TFGRPC_FAULT": tag}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_ADDOPTS", None)
    if case.baseline_args is not None:
        _baselines(case, world, tmp, env, store)
    if case.command and case.cli:
        argv = [sys.executable, "-m", case.cli, *(world.fill(a) for a in case.command)]
    elif case.command:
        argv = [sys.executable, "-m", "pytest_tfgrpc.roles.tensor_server", "--fabric", "lo"]
        argv += [world.fill(a) for a in case.command]
    else:
        (tmp / "test_case.py").write_text(world.fill(case.suite))
        argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "-v"]
        argv += [
            f"--junitxml={xml}",
            *(world.fill(a) for a in case.args),
            str(tmp / "test_case.py"),
        ]
    start = time.monotonic()
    proc = subprocess.Popen(
        argv,
        cwd=tmp,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    signalled = None
    if case.sigterm_after is not None:
        sleeping = tmp if case.interrupted else None
        signalled = _signal_when(proc, results, case.sigterm_after, case.kill_signal, sleeping)
    limit = case.seconds if case.seconds and signalled is None else 300
    try:
        out, _ = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{case.id}: still running after {limit} s:\n{out.decode()}")
    end = time.monotonic()
    _no_process_left(tag, case.id)
    after_signal = None if signalled is None else end - signalled
    text = out.decode("utf-8", "replace")
    return Outcome(proc.returncode, text, end - start, xml, results, after_signal, signalled)


def _baselines(case: Case, world: World, tmp: Path, env: Mapping[str, str], store: Path) -> None:
    """The row's baseline runs (``base.xml``, ``base1.xml``, ...) or history
    (``history/run-NNNN.xml``), made once per session for the rows that share them: the first
    row makes them into ``store`` (under pytest-xdist, a directory every worker shares, so a
    row on the other worker waits for them rather than making its own), every row copies them."""
    assert case.baseline_args is not None
    suite = world.fill(case.suite)
    history = tuple(tuple(sorted(run.items())) for run in case.history)
    key = (suite, case.baseline_args, case.baseline_runs, case.baseline_edit, history,
           tuple(sorted((k, world.fill(v)) for k, v in case.files.items())))  # fmt: skip
    if case.history:
        (tmp / "history").mkdir()
        names = [f"history/run-{run:04d}.xml" for run in range(len(case.history))]
    else:
        names = [f"base{run or ''}.xml" for run in range(case.baseline_runs)]
    made = store / hashlib.sha256(repr(key).encode()).hexdigest()[:16]
    with open(f"{made}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (made / "done").exists():
            _make_baselines(case, suite, names, tmp, env)
            for name in names:
                (made / name).parent.mkdir(parents=True, exist_ok=True)
                (made / name).write_bytes((tmp / name).read_bytes())
            (made / "done").touch()
    for name in names:
        (tmp / name).write_bytes((made / name).read_bytes())


def _make_baselines(
    case: Case, suite: str, names: list[str], tmp: Path, env: Mapping[str, str]
) -> None:
    assert case.baseline_args is not None
    (tmp / "test_case.py").write_text(suite)
    for run, name in enumerate(names):
        base = tmp / name
        extra = case.history[run] if case.history else {}
        subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={base}",
             *case.baseline_args, str(tmp / "test_case.py")],
            cwd=tmp, env={**env, **extra}, capture_output=True, timeout=120, check=False,
        )  # fmt: skip
        text = base.read_text()
        for old, new in case.baseline_edit:
            assert old in text, f"{old!r} not in the baseline"
            text = text.replace(old, new)
        base.write_text(text)


def _plant(kind: str, tmp: Path) -> None:
    planted = tmp / "planted.lock"
    if kind == "link":
        planted.symlink_to(tmp / "victim")
    elif kind == "dangling":
        planted.symlink_to(tmp / "made-by-the-run")
    elif kind == "fifo":
        os.mkfifo(planted)
    elif kind == "dir":
        planted.mkdir()
    elif kind == "chown":
        if os.geteuid() != 0:
            pytest.skip("needs root (a file of another user)")
        planted.write_text("")
        os.chown(planted, 12345, 12345)


def _signal_when(
    proc: subprocess.Popen[bytes], results: Path, lines: int, signum: int, sleeping: Path | None
) -> float:
    """Send ``signum`` once the results file holds ``lines`` lines (and, with ``sleeping``, a
    ``SLOW`` test sleeps: a ``sleeping-N`` file is there, so the signal finds a test to
    interrupt even where a loaded machine is slow to start one); the monotonic time it went."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if results.exists() and len(results.read_text().splitlines()) >= lines:
            if sleeping is None:
                time.sleep(0.5)  # inside the slow test now
            elif not any(sleeping.glob("sleeping-*")):
                time.sleep(0.1)
                continue
            proc.send_signal(signum)
            return time.monotonic()
        time.sleep(0.1)
    pytest.fail(f"the results file never reached {lines} lines")


def _no_process_left(tag: str, case: str) -> None:
    """No process of the run (they all carry its tag in their environment) outlives it."""
    needle = f"TFGRPC_FAULT={tag}".encode()
    deadline = time.monotonic() + 3  # processes on their way out
    while True:
        alive = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                environ = (entry / "environ").read_bytes()
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if needle in environ.split(b"\0") and stat.split(") ", 1)[1][0] != "Z":
                alive.append(entry.name)
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for pid in alive:
        with contextlib.suppress(OSError):
            os.kill(int(pid), signal.SIGKILL)
    assert not alive, f"{case}: processes {alive} outlived the run"


def _match(text: str, pattern: str) -> bool:
    """fnmatch with ``[`` taken literally (test ids hold brackets)."""
    return fnmatch.fnmatchcase(text, pattern.replace("[", "[[]"))


def _junit(xml: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for suite in JUnitXml.fromfile(str(xml)):
        out["<suite>"] = [p.name for p in suite.properties()]  # type: ignore[no-untyped-call]
        for case in suite:
            names = [p.name for p in case.properties()] if case.name else []  # type: ignore[attr-defined]
            out[str(case.name)] = names
    return out


def _check(case: Case, world: World, outcome: Outcome) -> str:
    text = outcome.text
    if case.ret is not None:
        assert outcome.ret == case.ret, f"exit {outcome.ret}, expected {case.ret}:\n{text}"
    for pattern in case.lines:
        pattern = world.fill(pattern)
        assert any(_match(line, pattern) for line in text.splitlines()), (
            f"no line matches {pattern!r}:\n{text}"
        )
    for pattern in case.absent:
        assert not any(_match(line, pattern) for line in text.splitlines()), (
            f"a line matches {pattern!r}:\n{text}"
        )
    if case.outcomes is not None:
        for word, count in case.outcomes.items():
            assert f"{count} {word}" in text.splitlines()[-1], f"{case.outcomes}:\n{text}"
    if case.junit:
        assert outcome.xml.exists(), f"no JUnit XML:\n{text}"
        junit = _junit(outcome.xml)
        for test, names in case.junit.items():
            found = [k for k in junit if _match(k, test)]
            assert found, f"no test case {test!r} in the JUnit XML: {sorted(junit)}\n{text}"
            recorded = junit[found[0]]
            for name in names:
                assert any(_match(r, name) for r in recorded), (
                    f"{found[0]}: no property {name!r} in {recorded}"
                )
    if case.no_junit:
        assert not outcome.xml.exists(), outcome.xml.read_text()
    if case.results is not None:
        lines = outcome.results.read_text().splitlines() if outcome.results.exists() else []
        assert len(lines) >= case.results, f"{len(lines)} results lines:\n{text}"
        for line in lines:
            json.loads(line)
    if case.interrupted:
        assert outcome.signalled is not None
        late = {
            p.name: float(p.read_text()) - outcome.signalled
            for p in world.tmp.glob("interrupted-*")
        }
        prompt = [name for name, after in late.items() if after < INTERRUPTED_WITHIN_S]
        assert len(prompt) >= case.interrupted, f"interrupted (s after the signal): {late}:\n{text}"
    if case.seconds is not None:
        took, since = outcome.seconds, "its start"
        if outcome.after_signal is not None:
            took, since = outcome.after_signal, "the signal"
        assert took < case.seconds, f"{case.id}: ended {took:.1f} s after {since}:\n{text}"
    for name in case.unchanged:
        assert (world.tmp / name).read_text() == world.fill(case.files[name]), f"{name} changed"
    first = next(
        (line for line in text.splitlines() if line.startswith(("E ", "ERROR", "FAILED"))), ""
    )
    signalled = (
        "" if outcome.after_signal is None else f" ({outcome.after_signal:.1f} s after the signal)"
    )
    return f"exit {outcome.ret} in {outcome.seconds:.1f} s{signalled}; {first.strip()[:160]}"


_LOG = Path(os.environ.get("TFGRPC_FAULT_LOG", "")) if os.environ.get("TFGRPC_FAULT_LOG") else None


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    with contextlib.ExitStack() as stack:
        yield World(tmp_path, stack)


@pytest.fixture(scope="session")
def baseline_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where rows keep the baseline runs they share: under pytest-xdist, in the directory
    all workers' temporary directories share (the recipe of pytest-xdist's docs)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    store = root / "fault-baselines"
    store.mkdir(exist_ok=True)
    return store


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_fault(case: Case, world: World, tmp_path: Path, baseline_store: Path) -> None:
    _needs(case)
    outcome = _run(case, world, tmp_path, baseline_store)
    summary = _check(case, world, outcome)
    if _LOG is not None:
        with _LOG.open("a") as log:
            log.write(f"{case.source}\t{case.id}\tok\t{summary}\n")


def test_every_reference_case_has_a_row() -> None:
    sources = {part for case in CASES for part in case.source.split("/")}
    reference = {f"E{n}" for n in range(1, 28)}
    assert reference <= sources, sorted(reference - sources)
    kinds = {"deadlines", "partial", "signals", "values", "sizes", "coexistence"}
    kinds |= {"consistency", "security", "tls"}
    assert {f"I13.{k}" for k in kinds} <= sources, sorted({f"I13.{k}" for k in kinds} - sources)
