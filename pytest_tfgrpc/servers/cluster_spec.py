"""Tensor servers on other hosts, named by a cluster spec in TensorFlow's TF_CONFIG format.

On one host, a client reaches even an InfiniBand interface's own address through the
kernel's local route: the bytes never cross the NIC. To measure the wire, the servers run on
another host (``tfgrpc-server --fabric ib0`` there) and a cluster spec names them::

    {"cluster": {"ps": ["10.0.0.2:2222", "192.168.1.2:2222"]}}

given as ``--tfgrpc-cluster FILE`` or in the ``TF_CONFIG`` environment variable. A test on
fabric ``ib0`` then uses the first ``ps`` task whose address this host routes through
``ib0``. Names in the spec are resolved once, when the run starts: nothing unresolved is
handed to gRPC.
"""

from __future__ import annotations

import ipaddress
import json
import shutil
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc

from pytest_tfgrpc.wire import channels as transport
from pytest_tfgrpc.wire._proto import service_pb2
from pytest_tfgrpc.wire.fabric import Fabric

TASK_TYPES = ("chief", "worker", "ps", "evaluator")


class ClusterSpecError(ValueError):
    """A cluster spec that cannot be used; the message quotes the offending value."""


@dataclass(frozen=True)
class Task:
    """One task of the spec: its job and index, the address as written, and as resolved."""

    job: str
    index: int
    address: str
    host: str  # numeric IP
    port: int

    @property
    def target(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True)
class ClusterSpec:
    """The tasks of a cluster spec, by job, and where the spec came from."""

    source: str
    tasks: tuple[Task, ...]

    def job(self, name: str) -> tuple[Task, ...]:
        return tuple(task for task in self.tasks if task.job == name)


def _resolve(address: str, where: str) -> tuple[str, int]:
    host, sep, port_text = address.rpartition(":")
    if not sep or not host:
        raise ClusterSpecError(f"{where}: {address!r} is not host:port")
    host = host.strip("[]")
    try:
        port = int(port_text)
    except ValueError:
        raise ClusterSpecError(
            f"{where}: port {port_text!r} of {address!r} is not a number"
        ) from None
    if not 1 <= port <= 65535:
        raise ClusterSpecError(f"{where}: port {port} of {address!r} is not from 1 to 65535")
    try:
        return str(ipaddress.ip_address(host.split("%")[0])), port
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ClusterSpecError(f"{where}: cannot resolve {host!r} of {address!r}: {exc}") from None
    return str(infos[0][4][0]), port


def parse_cluster_spec(text: str, source: str) -> ClusterSpec:
    """Read a TF_CONFIG-style spec: ``{"cluster": {job: [host:port, ...] | {index: host:port}}}``.

    The ``task`` part, if any, is ignored (this host is the client); Kubeflow's sparse form
    (a job as a mapping of index to address) is accepted.
    """
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ClusterSpecError(f"{source}: not JSON ({exc})") from None
    cluster = config.get("cluster") if isinstance(config, Mapping) else None
    if not isinstance(cluster, Mapping):
        example = '{"cluster": {"ps": ["host:port"]}}'
        raise ClusterSpecError(f'{source}: no "cluster" object, e.g. {example}')
    tasks = []
    for job, members in cluster.items():
        if job not in TASK_TYPES:
            raise ClusterSpecError(
                f'{source}: unknown job {job!r} in "cluster"; jobs are {", ".join(TASK_TYPES)}'
            )
        if isinstance(members, Mapping):
            entries = sorted((int(index), address) for index, address in members.items())
        elif isinstance(members, list):
            entries = list(enumerate(members))
        else:
            raise ClusterSpecError(f"{source}: job {job!r} is neither a list nor a mapping")
        for index, address in entries:
            where = f"{source}: {job}[{index}]"
            if not isinstance(address, str):
                raise ClusterSpecError(f'{where}: {address!r} is not a "host:port" string')
            host, port = _resolve(address, where)
            tasks.append(Task(job, index, address, host, port))
    return ClusterSpec(source, tuple(tasks))


def load_cluster_spec(path: str | None, environ: Mapping[str, str]) -> ClusterSpec | None:
    """The spec of ``--tfgrpc-cluster FILE``, else of ``TF_CONFIG``, else None."""
    if path:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ClusterSpecError(f"cluster spec {path}: {exc.strerror or exc}") from None
        return parse_cluster_spec(text, f"cluster spec {path}")
    if environ.get("TF_CONFIG"):
        return parse_cluster_spec(environ["TF_CONFIG"], "TF_CONFIG")
    return None


def route_device(host: str) -> str | None:
    """The interface this host sends to ``host`` through (``ip route get``; sends nothing)."""
    ip = shutil.which("ip")
    if ip is None:
        return None
    done = subprocess.run(
        [ip, "-j", "route", "get", host], capture_output=True, text=True, timeout=10, check=False
    )
    if done.returncode != 0:
        return None
    routes = json.loads(done.stdout or "[]")
    return str(routes[0]["dev"]) if routes and "dev" in routes[0] else None


def server_task_for(spec: ClusterSpec, fabric: Fabric) -> Task:
    """The first ``ps`` task that this host reaches through ``fabric``."""
    servers = spec.job("ps")
    if not servers:
        raise ClusterSpecError(f'{spec.source} names no "ps" task to measure against')
    routes = {task.target: route_device(task.host) for task in servers}
    for task in servers:
        if routes[task.target] == fabric.name:
            return task
    seen = ", ".join(f"{target} via {dev or 'no route'}" for target, dev in routes.items())
    raise ClusterSpecError(
        f"{spec.source} has no ps task reached through fabric {fabric.name!r} ({seen})"
    )


class RemoteServer:
    """A tensor server on another host: ``.target``, ``.fabric``; ``.pid`` is None.

    Its process is not ours, so its death shows only as failing calls, which the benchmark
    reports with their status.
    """

    pid: int | None = None

    def __init__(self, task: Task, fabric: Fabric) -> None:
        self.task = task
        self.fabric = fabric
        self.target = task.target
        self.name = f"remote tensor server {task.job}[{task.index}] ({task.address})"

    def check_reachable(self, timeout: float = 10.0) -> str:
        """Its grpcio version, from its Status, or ClusterSpecError saying why it does not
        answer."""
        with grpc.insecure_channel(self.target, options=transport.CHANNEL_OPTIONS) as channel:
            status = channel.unary_unary(transport.method("raw", "Status"))
            try:
                reply = service_pb2.ServerStatus.FromString(status(b"", timeout=timeout))
                return str(reply.grpc_version)
            except grpc.RpcError as exc:
                code = exc.code().name if isinstance(exc, grpc.Call) else "error"
                raise ClusterSpecError(
                    f"{self.name} does not answer at {self.target} on fabric "
                    f"{self.fabric.name}: {code}; is tfgrpc-server running there?"
                ) from None

    def died(self, grace: float = 0.5) -> BaseException | None:
        return None

    def __repr__(self) -> str:
        return f"<RemoteServer {self.name} {self.target}>"
