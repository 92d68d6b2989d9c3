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

from pytest_tfgrpc.wire import grpc_settings
from pytest_tfgrpc.wire._proto import service_pb2
from pytest_tfgrpc.wire.client import unreachable
from pytest_tfgrpc.wire.fabric import Fabric
from pytest_tfgrpc.wire.security import looks_like_tls_failure, open_channel

#: The jobs the plugin uses, whose names are resolved when the spec is read: ``ps`` (servers,
#: or agents for PS tasks) and ``worker`` (agents for workers). Other jobs TensorFlow and
#: Kubeflow name (``chief``, ``evaluator``, ...) are kept as written, and unused.
USED_JOBS = ("ps", "worker")
_EXAMPLE = '{"cluster": {"ps": ["host:port"]}}'


class ClusterSpecError(ValueError):
    """A cluster spec that cannot be used; the message quotes the job, key and value."""


@dataclass(frozen=True)
class Task:
    """One task of the spec: its job and index, the address as written, and as resolved.

    ``host`` is the numeric IP without brackets; ``zone`` the interface of a link-local IPv6
    address (``fe80::1%eth0``), which gRPC needs in the target and which names the fabric the
    task is reached through.
    """

    job: str
    index: int
    address: str
    host: str  # numeric IP
    port: int
    zone: str | None = None

    @property
    def target(self) -> str:
        """``host:port`` for gRPC: ``10.0.0.2:2222``, ``[fe80::1%eth0]:2222``."""
        if ":" not in self.host:
            return f"{self.host}:{self.port}"
        zone = f"%{self.zone}" if self.zone else ""
        return f"[{self.host}{zone}]:{self.port}"


@dataclass(frozen=True)
class ClusterSpec:
    """The tasks of a cluster spec, by job, and where the spec came from."""

    source: str
    tasks: tuple[Task, ...]

    def job(self, name: str) -> tuple[Task, ...]:
        return tuple(task for task in self.tasks if task.job == name)


@dataclass(frozen=True)
class ClusterLoad:
    """What the run got from ``--tfgrpc-cluster`` and ``TF_CONFIG``.

    ``spec``: the usable spec, if any. ``problem``: why an explicit ``--tfgrpc-cluster`` cannot
    be used (the tests that need it fail with this; the others run). ``notes``: forms of
    ``TF_CONFIG`` that were ignored and why (a TF_CONFIG only from the environment never stops
    a run).
    """

    spec: ClusterSpec | None = None
    problem: ClusterSpecError | None = None
    notes: tuple[str, ...] = ()


def split_address(address: str, where: str) -> tuple[str, str | None, int]:
    """``host:port`` -> (host, zone, port): ``[fe80::1%eth0]:2222`` -> ("fe80::1", "eth0",
    2222); a name stays a name. ClusterSpecError, quoting ``where`` and the value, otherwise."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not host:
        raise ClusterSpecError(f"{where}: {address!r} is not host:port")
    if host.startswith("["):
        if not host.endswith("]"):
            raise ClusterSpecError(f"{where}: {address!r} opens '[' without closing it")
        host = host[1:-1]
    elif ":" in host:
        raise ClusterSpecError(f"{where}: IPv6 address in {address!r} needs brackets: [addr]:port")
    host, percent, zone = host.partition("%")
    if not host:
        raise ClusterSpecError(f"{where}: {address!r} has no host")
    if percent and not zone:
        raise ClusterSpecError(f"{where}: {address!r} has '%' but no zone (interface) after it")
    if not port_text.isascii() or not port_text.isdigit():
        raise ClusterSpecError(f"{where}: port {port_text!r} of {address!r} is not a number")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise ClusterSpecError(f"{where}: port {port} of {address!r} is not from 1 to 65535")
    if zone:
        try:
            ip = ipaddress.IPv6Address(host)
        except ValueError:
            raise ClusterSpecError(
                f"{where}: zone %{zone} of {address!r} needs an IPv6 address"
            ) from None
        if not ip.is_link_local:
            raise ClusterSpecError(
                f"{where}: zone %{zone} of {address!r}: only link-local (fe80::/10) has zones"
            )
    return host, zone or None, port


def _resolve(address: str, where: str) -> tuple[str, str | None, int]:
    host, zone, port = split_address(address, where)
    try:
        return str(ipaddress.ip_address(host)), zone, port
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise ClusterSpecError(f"{where}: cannot resolve {host!r} of {address!r}: {exc}") from None
    return str(infos[0][4][0]), None, port


def _entries(job: str, members: object, source: str) -> list[tuple[int, object]]:
    """``(index, address)`` pairs of a job: a list, or Kubeflow's sparse mapping of index to
    address (keys as TensorFlow writes them: ``"0"``, ``"1"``)."""
    if isinstance(members, list):
        return list(enumerate(members))
    if isinstance(members, str):
        return [(0, members)]  # TensorFlow accepts a lone address for a one-task job
    if not isinstance(members, Mapping):
        raise ClusterSpecError(
            f'{source}: job {job!r} is {members!r}: a list of "host:port" or a mapping of'
            ' index to "host:port"'
        )
    entries = []
    seen: dict[int, object] = {}
    for key, address in members.items():
        text = str(key).strip()
        if not text.isascii() or not text.isdigit() or len(text) > 9:
            raise ClusterSpecError(
                f"{source}: job {job!r}, key {key!r} (value {address!r}): a sparse job's keys"
                ' are task indices, "0", "1", ...'
            )
        if int(text) in seen:
            raise ClusterSpecError(
                f"{source}: job {job!r}, key {key!r} (value {address!r}): task {int(text)} is"
                f" already given by key {seen[int(text)]!r}"
            )
        seen[int(text)] = key
        entries.append((int(text), address))
    return sorted(entries, key=lambda entry: entry[0])


def parse_cluster_spec(text: str, source: str, *, resolve: bool = True) -> ClusterSpec:
    """Read a TF_CONFIG-style spec: ``{"cluster": {job: [host:port, ...] | {index: host:port}}}``.

    Kubeflow's ``sparseCluster`` (a TFJob with dynamic workers) is read like ``cluster``; the
    ``task`` part, if any, is ignored (this host is the client); jobs may be any name, and
    only ``ps`` and ``worker`` are used. Their names are resolved now unless ``resolve`` is
    False (other jobs' hosts stay as written).
    Raises ClusterSpecError quoting the job, key and value of the first problem.
    """
    try:
        config = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ClusterSpecError(f"{source}: not JSON ({exc})") from None
    if not isinstance(config, Mapping):
        raise ClusterSpecError(f"{source}: {_short(config)} is not a JSON object, e.g. {_EXAMPLE}")
    key = "cluster" if "cluster" in config else "sparseCluster"
    cluster = config.get(key)
    if cluster is None:
        raise ClusterSpecError(f'{source}: no "cluster" object, e.g. {_EXAMPLE}')
    if not isinstance(cluster, Mapping):
        raise ClusterSpecError(f'{source}: "{key}" is {_short(cluster)}, not an object of jobs')
    tasks = []
    for job, members in cluster.items():
        if not job.strip():
            raise ClusterSpecError(f'{source}: a job with an empty name in "{key}"')
        for index, address in _entries(job, members, source):
            where = f"{source}: job {job!r}, task {index}"
            if not isinstance(address, str):
                raise ClusterSpecError(f'{where}: {_short(address)} is not a "host:port" string')
            if resolve and job in USED_JOBS:
                host, zone, port = _resolve(address, where)
            else:
                host, zone, port = split_address(address, where)
            tasks.append(Task(job, index, address, host, port, zone))
    return ClusterSpec(source, tuple(tasks))


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def load_cluster(path: str | None, environ: Mapping[str, str]) -> ClusterLoad:
    """The cluster of ``--tfgrpc-cluster FILE`` if given, else of ``TF_CONFIG``; never raises.

    An explicit file that cannot be used is a ``problem`` (tests that need it fail with it).
    A ``TF_CONFIG`` that names no cluster (a single worker), or that cannot be used, is a note
    and no spec: training containers set it for TensorFlow, not for this plugin.
    """
    if path:
        try:
            return ClusterLoad(spec=load_cluster_spec(path, {}))
        except ClusterSpecError as exc:
            return ClusterLoad(problem=exc)
    text = environ.get("TF_CONFIG", "")
    if not text.strip():
        return ClusterLoad()
    try:
        spec = parse_cluster_spec(text, "TF_CONFIG")
    except ClusterSpecError as exc:
        return ClusterLoad(notes=(f"ignored, servers run here: {exc}",))
    if not spec.job("ps") and not spec.job("worker"):
        jobs = ", ".join(sorted({t.job for t in spec.tasks})) or "none"
        note = f'TF_CONFIG names no "ps" or "worker" task (jobs: {jobs}); servers run here'
        return ClusterLoad(notes=(note,))
    return ClusterLoad(spec=spec)


def load_cluster_spec(
    path: str | None, environ: Mapping[str, str], *, resolve: bool = True
) -> ClusterSpec | None:
    """The spec of ``--tfgrpc-cluster FILE``, else of ``TF_CONFIG``, else None (strict:
    raises ClusterSpecError for either; :func:`load_cluster` is the lenient form). Names are
    resolved unless ``resolve`` is False (agents: resolved when first used)."""
    if path:
        try:
            text = Path(path).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise ClusterSpecError(f"cluster spec {path}: {why}") from None
        return parse_cluster_spec(text, f"cluster spec {path}", resolve=resolve)
    if environ.get("TF_CONFIG"):
        return parse_cluster_spec(environ["TF_CONFIG"], "TF_CONFIG", resolve=resolve)
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


def task_device(task: Task) -> str | None:
    """The interface this host reaches ``task`` through: a link-local task's zone, else the
    route's device."""
    return task.zone or route_device(task.host)


def server_task_for(spec: ClusterSpec, fabric: Fabric) -> Task:
    """The first ``ps`` task that this host reaches through ``fabric``."""
    servers = spec.job("ps")
    if not servers:
        raise ClusterSpecError(f'{spec.source} names no "ps" task to measure against')
    routes = {task.target: task_device(task) for task in servers}
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
        answer. Under the run's TLS setting (the channel every call of the run uses), so a
        TLS server answers and a handshake failure is reported as one."""
        with open_channel(self.target, grpc_settings.CHANNEL_OPTIONS) as channel:
            status = channel.unary_unary(grpc_settings.method("raw", "Status"))
            try:
                reply = service_pb2.ServerStatus.FromString(status(b"", timeout=timeout))
                return str(reply.grpc_version)
            except grpc.RpcError as exc:
                code = exc.code().name if isinstance(exc, grpc.Call) else "error"
                details = (exc.details() or "") if isinstance(exc, grpc.Call) else ""
                lowered = details.lower()
                if looks_like_tls_failure(details) or "closed" in lowered or "reset" in lowered:
                    # A handshake that failed (or a plaintext client a TLS server hung up
                    # on), told apart from a server that is not there.
                    why = unreachable(self.target, timeout, details)
                    raise ClusterSpecError(
                        f"{self.name} on fabric {self.fabric.name}: {why}"
                    ) from None
                raise ClusterSpecError(
                    f"{self.name} does not answer at {self.target} on fabric "
                    f"{self.fabric.name}: {code}; is tfgrpc-server running there?"
                ) from None

    def died(self, grace: float = 0.5) -> BaseException | None:
        return None

    def __repr__(self) -> str:
        return f"<RemoteServer {self.name} {self.target}>"
