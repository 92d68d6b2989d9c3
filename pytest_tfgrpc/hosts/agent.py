"""The node agent (``tfgrpc-node --fabric IFACE``): the plugin's roles on another host.

One agent runs on every host of a cluster. The driver (the pytest process) asks it, over the
``tfgrpc.NodeAgent`` gRPC service (``protos/tfgrpc/agent.proto``), to start one of the plugin's
own roles, of one of its engines, and nothing else:

- ``tensor_server``: ``pytest_tfgrpc.roles.tensor_server`` (grpcio) or
  ``tfgrpc-native-server`` (native); parameters ``delay`` (a duration), ``max_tensor_bytes``,
  and ``workers`` (grpcio, 1-256 threads) or ``threads`` (native, 1-64);
- ``ps``: the same programs with the driver's job token (``TFGRPC_JOB_TOKEN``), same parameters;
- ``worker``: ``pytest_tfgrpc.ps.worker`` or ``tfgrpc-native-worker``, with the driver's job
  token too (every PS call carries it); no parameters;
- ``floor_server``: ``pytest_tfgrpc.roles.floor_server`` or ``tfgrpc-native-floor serve``;
  no parameters.

Of the ``tensorflow`` engine, ``ps`` and ``worker`` are TensorFlow's own tasks
(:mod:`pytest_tfgrpc.roles.tf_task`, a ``tf.distribute.Server`` each), run by the TensorFlow
Python the host's operator names (``--tf-python``; without it the agent refuses them in one
line naming the host, the role and that option). Their parameters are ``index`` and
``cluster``, the cluster spec (:func:`~pytest_tfgrpc.roles.tf_task.check_cluster`), whose entry
for the task must be the agent's fabric address and a port this driver holds there
(``Reserve``: every task's ``host:port`` is in the spec each of them starts with, so the ports
are held before any task starts; :class:`~pytest_tfgrpc.roles.ports.PortReservation` says how
that closes the race). A worker's commands come on its stdin, through the ``Run`` stream, one
JSON line each; the agent passes on only those
:func:`~pytest_tfgrpc.roles.tf_task.check_command` accepts, and stops the task on any other
line. TensorFlow's server takes a port, not an address: it listens on every interface of its
host, serves no TLS and authenticates no caller, so the agent refuses it to a TLS run and runs
it only where its operator opted in.

The native programs are the agent host's own build (``tfgrpc-build-native`` there); a host
without it refuses a native role with ``FAILED_PRECONDITION`` in one line naming the host, the
role and that command, and says which engines it has in ``Hello``.

The agent fixes what a role binds to (its own fabric, a port the OS picks) and passes on only
the allocator variables (:data:`~pytest_tfgrpc.tuning.allocator.ALLOCATOR_VARS`, digits only)
from the driver's environment; an unknown role is refused with ``PERMISSION_DENIED``, a bad
parameter with ``INVALID_ARGUMENT``. A role's stdin, stdout and stderr travel on its ``Run``
stream, so the driver drives a remote worker or server exactly as a local child.

Security: the agent binds its fabric's address only and every call must carry the shared
token (``authorization: Bearer <token>``; from ``--token-file`` or ``TFGRPC_AGENT_TOKEN``),
compared in constant time; a call without it gets ``UNAUTHENTICATED``. With ``--tls-cert`` and
``--tls-key`` it serves TLS, and with ``--tls-ca`` it requires client certificates that CA
signed (mutual TLS); the token is checked either way. The same files are the host's identity
for the roles it starts when a driver asks for TLS (``RoleStart.tls``): they serve and dial
with them (``$TFGRPC_TLS_*``), so each host names its own certificate, for its own address,
and no private key leaves its host. An agent without them refuses a TLS role
(``FAILED_PRECONDITION``); ``Hello`` says which TLS its roles get.

Lifetime: every process belongs to the driver that started it, which holds a lease renewed by
``Heartbeat``. The agent stops a driver's processes when its lease runs out, when it calls
``Release``, or, for one process, when its ``Run`` stream breaks (the driver died or lost the
network). A role also ends when the agent dies: its stdin is a pipe from the agent.
"""

from __future__ import annotations

import argparse
import contextlib
import hmac
import json
import math
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any

import grpc

from pytest_tfgrpc.hosts.telemetry import link_message, reading_message
from pytest_tfgrpc.native import BUILD_COMMAND, ENGINES, NativeNotBuilt, binaries
from pytest_tfgrpc.roles import tf_task
from pytest_tfgrpc.roles.ports import PortReservation
from pytest_tfgrpc.roles.processes import end_process
from pytest_tfgrpc.tuning.allocator import ALLOCATOR_VARS
from pytest_tfgrpc.units import UnitError, parse_duration_ns
from pytest_tfgrpc.wire import grpc_settings
from pytest_tfgrpc.wire._proto import agent_pb2, agent_pb2_grpc
from pytest_tfgrpc.wire.fabric import Fabric, FabricError, interface_counters, resolve_fabric
from pytest_tfgrpc.wire.security import (
    AGENT_TOKEN_ENV,
    TlsError,
    TlsFiles,
    child_environ,
    load_tls,
    read_secret_file,
)
from pytest_tfgrpc.wire.security import ENV_VARS as TLS_ENV_VARS
from pytest_tfgrpc.wire.security import TOKEN_ENV as JOB_TOKEN_ENV
from pytest_tfgrpc.wire.telemetry import TelemetryError, TelemetryReader, run_queue_wait_ns

__all__ = [
    "DEFAULT_PORT",
    "ROLES",
    "ROLE_ENGINES",
    "TF_PYTHON_OPTION",
    "TOKEN_ENV",
    "AgentServer",
    "RoleError",
    "engine_missing",
    "engines_here",
    "main",
    "read_token",
    "role_argv",
    "server_credentials",
    "tls_mismatch",
]

#: The port ``tfgrpc-node`` listens on unless told otherwise (unassigned by IANA).
DEFAULT_PORT = 7461
TOKEN_ENV = AGENT_TOKEN_ENV
#: The longest lease a driver gets; a driver renews well before it ends.
MAX_LEASE_S = 120.0
#: The shortest lease a driver gets.
MIN_LEASE_S = 1.0
MIN_TOKEN_CHARS = 16
#: The most processes an agent runs at once, over all drivers (a cluster test needs a few).
MAX_PROCESSES = 64
#: Handler threads for data: a ``Run`` stream (a thread for its life) for each process the
#: agent may run, and 16 beside them for counters, telemetry and refusals.
DATA_THREADS = MAX_PROCESSES + 16
#: Handler threads of their own for the lease (``Hello``, ``Heartbeat``, ``Release``): no role,
#: reading or stranger's call can make a heartbeat wait for a thread.
CONTROL_THREADS = 16
#: Streams one connection (a driver's) may hold at once: twice the threads. A driver's
#: 64 roles and a burst of its calls queue in the pools (its heartbeats in their own), not
#: refused; gRPC core counts a stream until the server has released its call, a moment after
#: the client saw it end, so a connection run at exactly its threads had heartbeats refused.
STREAMS_PER_DRIVER = 2 * (DATA_THREADS + CONTROL_THREADS)

#: How long a reserved port is held for a role that does not start.
RESERVATION_S = 60.0
#: The engines whose roles an agent may start: the plugin's own and TensorFlow's tasks.
ROLE_ENGINES = (*ENGINES, "tensorflow")
#: The agent option that names the host's TensorFlow Python.
TF_PYTHON_OPTION = "--tf-python"
#: TensorFlow's tasks (the ``tensorflow`` engine's roles).
_TF_ROLES = ("ps", "worker")

_TENSOR_SERVER = "pytest_tfgrpc.roles.tensor_server"
ROLES: Mapping[str, str] = {
    "tensor_server": _TENSOR_SERVER,
    "ps": _TENSOR_SERVER,
    "worker": "pytest_tfgrpc.ps.worker",
    "floor_server": "pytest_tfgrpc.roles.floor_server",
}


class RoleError(ValueError):
    """A request outside the agent's roles; ``code`` is the gRPC status it is refused with."""

    def __init__(self, message: str, code: grpc.StatusCode) -> None:
        super().__init__(message)
        self.code = code


#: What :func:`pytest_tfgrpc.wire.security.new_token` makes (URL-safe base64).
_JOB_TOKEN = re.compile(r"[A-Za-z0-9_-]{16,128}")
#: The roles given the driver's job token: a PS task checks it, a worker sends it on every call.
_TOKEN_ROLES = ("ps", "worker")


def _workers_param(value: str) -> list[str]:
    if not value.isdigit() or not 1 <= int(value) <= 256:
        raise RoleError(
            f"parameter workers={value!r}: a number of threads from 1 to 256",
            grpc.StatusCode.INVALID_ARGUMENT,
        )
    return ["--workers", value]


def _delay_param(value: str) -> list[str]:
    try:
        ns = parse_duration_ns(value)
    except UnitError as exc:
        code = grpc.StatusCode.INVALID_ARGUMENT
        raise RoleError(f"parameter delay={value!r}: {exc}", code) from None
    if not 0 <= ns <= 10e9:
        raise RoleError(
            f"parameter delay={value!r}: from 0 to 10 s", grpc.StatusCode.INVALID_ARGUMENT
        )
    return ["--delay", value]


def _max_bytes_param(value: str) -> list[str]:
    if not value.isdigit() or int(value) > grpc_settings.MAX_TENSOR_BYTES:
        raise RoleError(
            f"parameter max_tensor_bytes={value!r}: a number of bytes from 0 to "
            f"{grpc_settings.MAX_TENSOR_BYTES}",
            grpc.StatusCode.INVALID_ARGUMENT,
        )
    return ["--max-tensor-bytes", value]


def _threads_param(value: str) -> list[str]:
    if not value.isdigit() or not 1 <= int(value) <= 64:
        raise RoleError(
            f"parameter threads={value!r}: a number of threads from 1 to 64",
            grpc.StatusCode.INVALID_ARGUMENT,
        )
    return ["--threads", value]


def _delay_ns_param(value: str) -> list[str]:
    _delay_param(value)  # checked as the grpcio roles check it
    return ["--delay-ns", str(int(parse_duration_ns(value)))]


_LIMITS = {"workers": _workers_param, "delay": _delay_param, "max_tensor_bytes": _max_bytes_param}
_NATIVE_LIMITS = {
    "threads": _threads_param,
    "delay": _delay_ns_param,
    "max_tensor_bytes": _max_bytes_param,
}
_PARAMS: Mapping[str, Mapping[str, Mapping[str, Callable[[str], list[str]]]]] = {
    "grpcio": {"tensor_server": _LIMITS, "ps": _LIMITS, "worker": {}, "floor_server": {}},
    "native": {
        "tensor_server": _NATIVE_LIMITS,
        "ps": _NATIVE_LIMITS,
        "worker": {},
        "floor_server": {},
    },
}
#: The native program of each role (a :class:`~pytest_tfgrpc.native.NativeBinaries` field).
_NATIVE_PROGRAMS = {
    "tensor_server": "server",
    "ps": "server",
    "worker": "worker",
    "floor_server": "floor",
}


def engines_here(tf_python: str | None = None) -> tuple[str, ...]:
    """The engines whose roles this host can start: grpcio always, native once built,
    tensorflow when the agent was given a TensorFlow Python (``tf_python``)."""
    try:
        binaries()
    except NativeNotBuilt:
        found: tuple[str, ...] = ("grpcio",)
    else:
        found = ENGINES
    return (*found, "tensorflow") if tf_python else found


def engine_missing(host: str, engine: str, role: str) -> str:
    """The one line that says a host cannot run ``role`` of ``engine``, and how to fix it."""
    if engine == "native":
        return (
            f"host {host}: the native engine is not built there, so it cannot run the native "
            f"{role}: run `{BUILD_COMMAND}` on {host} (or drop the native engine)"
        )
    if engine == "tensorflow":
        return (
            f"host {host}: its agent names no TensorFlow Python, so it cannot run TensorFlow's "
            f"{role}: start tfgrpc-node there with {TF_PYTHON_OPTION} PATH, the python of an "
            "environment with pytest-tfgrpc[tensorflow] (or drop the tensorflow engine)"
        )
    return f"host {host}: its agent cannot start the {engine} {role}"


def tf_task_port(role: str, params: Mapping[str, str], fabric: Fabric) -> int:
    """The port TensorFlow's task ``role`` (ps or worker) of ``params`` binds: its own entry
    in the cluster spec, which must name the agent's fabric address; :class:`RoleError`
    (``INVALID_ARGUMENT``) when the parameters are not ``index`` and ``cluster`` as
    :func:`~pytest_tfgrpc.roles.tf_task.check_cluster` accepts them."""
    bad = grpc.StatusCode.INVALID_ARGUMENT
    if role not in _TF_ROLES:
        raise RoleError(f"role {role!r} has no tensorflow program (its roles: ps, worker)", bad)
    if sorted(params) != ["cluster", "index"]:
        raise RoleError(
            f"TensorFlow's {role} takes the parameters cluster and index, given: "
            f"{', '.join(sorted(params)) or 'none'}",
            bad,
        )
    index = params["index"]
    if not index.isdigit() or len(index) > 3:
        raise RoleError(f"parameter index={index!r}: a task index from 0 to 255", bad)
    try:
        cluster = tf_task.check_cluster(params["cluster"], role, int(index))
    except tf_task.TaskInputError as exc:
        raise RoleError(f"parameter cluster: {exc}", bad) from None
    own = cluster[role][int(index)]
    port = own.rpartition(":")[2]
    if own != fabric.target(int(port)):
        raise RoleError(
            f"parameter cluster: {role} task {index} is {own}, not on this agent's address "
            f"({fabric.address})",
            bad,
        )
    return int(port)


def _tf_role_argv(
    role: str, params: Mapping[str, str], fabric: Fabric, tf_python: str | None, host: str
) -> list[str]:
    tf_task_port(role, params, fabric)
    if tf_python is None:
        raise RoleError(
            engine_missing(host, "tensorflow", "PS task" if role == "ps" else "worker"),
            grpc.StatusCode.FAILED_PRECONDITION,
        )
    cluster = json.dumps(json.loads(params["cluster"]), separators=(",", ":"))
    return tf_task.task_argv(tf_python, role, int(params["index"]), cluster, 3600.0)


def tls_mismatch(host: str, roles_tls: str, run_tls: str) -> str:
    """The one line that says a host's roles would not speak the run's TLS (``run_tls``:
    ``tls`` or ``mtls``; a plaintext run gets plaintext roles from any agent)."""
    if roles_tls == "off":
        how = "start its tfgrpc-node with --tls-cert/--tls-key (and --tls-ca for mutual TLS)"
    else:
        how = "give both the same mode (a CA on both sides for mutual TLS)"
    return (
        f"host {host}: its agent gives the roles it starts TLS {roles_tls!r}, and this run uses "
        f"{run_tls!r} (--tfgrpc-tls-*): {how}"
    )


def _package_version() -> str:
    # Not ``pytest_tfgrpc.__version__``: the package root names every layer (its lazy
    # exports), and hosts import only downward.
    try:
        return metadata.version("pytest-tfgrpc")
    except metadata.PackageNotFoundError:  # a source tree that is not installed
        return "0.0.0"


def _plugin_role_argv(
    role: str, params: Mapping[str, str], fabric: Fabric, engine: str, host: str
) -> list[str]:
    """The command of the plugin's own ``role`` of ``engine`` (grpcio or native)."""
    if role not in _PARAMS[engine]:
        raise RoleError(
            f"role {role!r} has no {engine} program (its engines: "
            f"{', '.join(e for e in ENGINES if role in _PARAMS[e])})",
            grpc.StatusCode.INVALID_ARGUMENT,
        )
    allowed = _PARAMS[engine][role]
    if engine == "native":
        try:
            program: Path = getattr(binaries(), _NATIVE_PROGRAMS[role])
        except NativeNotBuilt:
            raise RoleError(
                engine_missing(host, engine, role.replace("_", " ")),
                grpc.StatusCode.FAILED_PRECONDITION,
            ) from None
        argv = [str(program)]
        if role == "floor_server":
            address = f"{fabric.address}%{fabric.zone}" if fabric.zone else fabric.address
            argv += ["serve", "--bind", address, "--port", "0"]
        elif role != "worker":
            argv += ["--host", fabric.host, "--port", "0", "--fabric", fabric.name]
            argv += ["--exit-on-stdin-eof"]
    else:
        argv = [sys.executable, "-m", ROLES[role]]
        if ROLES[role] == _TENSOR_SERVER:
            argv += ["--fabric", fabric.name, "--port", "0", "--exit-on-stdin-eof"]
        elif role == "floor_server":
            address = f"{fabric.address}%{fabric.zone}" if fabric.zone else fabric.address
            argv += ["--bind", address, "--port", "0"]
    for name, value in sorted(params.items()):
        if name not in allowed:
            known = ", ".join(allowed) or "none"
            raise RoleError(
                f"role {role!r} has no parameter {name!r} (its parameters: {known})",
                grpc.StatusCode.INVALID_ARGUMENT,
            )
        argv += allowed[name](value)
    return argv


def role_argv(
    role: str,
    params: Mapping[str, str],
    env: Mapping[str, str],
    fabric: Fabric,
    *,
    engine: str = "grpcio",
    tls: TlsFiles | None = None,
    host: str = "this host",
    tf_python: str | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The command and environment of ``role`` of ``engine`` on ``fabric``, or
    :class:`RoleError`.

    Only :data:`ROLES` exist; each accepts only its own parameters (checked here), and binds
    where the agent says. ``env`` may set the allocator variables to digits, nothing else.
    ``tls``: the agent's own files, which a role that serves or dials gRPC then uses (None:
    plaintext); the TLS variables of the agent's own environment never pass. A native role
    on a host without the native build is refused naming ``host``; TensorFlow's tasks run
    by ``tf_python`` (None: refused naming ``host``), never with TLS, which they do not serve.
    """
    if role not in ROLES:
        raise RoleError(
            f"role {role!r} is not one this agent runs ({', '.join(ROLES)})",
            grpc.StatusCode.PERMISSION_DENIED,
        )
    if engine not in ROLE_ENGINES:
        raise RoleError(
            f"engine {engine!r}: expected one of {', '.join(ROLE_ENGINES)}",
            grpc.StatusCode.INVALID_ARGUMENT,
        )
    if engine == "tensorflow":
        if tls is not None:
            raise RoleError(
                f"host {host}: TensorFlow's {role} task serves no TLS "
                "(tf.distribute.Server has no TLS settings), and this run asks for TLS",
                grpc.StatusCode.FAILED_PRECONDITION,
            )
        argv = _tf_role_argv(role, params, fabric, tf_python, host)
    else:
        argv = _plugin_role_argv(role, params, fabric, engine, host)
    # No secret of the agent's (its token) reaches a role; the job token and the host's TLS
    # files only as below.
    hidden = {*ALLOCATOR_VARS, JOB_TOKEN_ENV, *TLS_ENV_VARS.values()}
    if engine == "tensorflow":
        hidden.add("PYTHONPATH")  # the TensorFlow environment's own packages
    child_env = {k: v for k, v in child_environ().items() if k not in hidden}
    if tls is not None and role != "floor_server":  # the floor is raw TCP: nothing to secure
        child_env.update(tls.env())
    for name, value in env.items():
        token_role = role in _TOKEN_ROLES and engine != "tensorflow"
        if name == JOB_TOKEN_ENV and token_role and _JOB_TOKEN.fullmatch(value):
            child_env[name] = value  # the driver's job token: its PS tasks and their callers
            continue
        if name not in ALLOCATOR_VARS or not value.isdigit():
            raise RoleError(
                f"environment {name}={value!r}: only {', '.join(ALLOCATOR_VARS)} with a number"
                f" (and {JOB_TOKEN_ENV} for a PS task or worker)",
                grpc.StatusCode.INVALID_ARGUMENT,
            )
        child_env[name] = value
    return argv, child_env


def read_token(path: str | None, environ: Mapping[str, str], option: str = "--token-file") -> str:
    """The shared token: the first line of ``path`` if given, else ``TFGRPC_AGENT_TOKEN``.
    ``option`` is how the caller's user gives the file (the agent's ``--token-file``, pytest's
    ``--tfgrpc-agent-token-file``), named in the errors. A leading ``~`` is expanded, as
    pytest's ``--junitxml`` does: the shell leaves it alone in ``--option=~/file`` and in an
    ini file.

    ValueError when there is none or it is shorter than 16 characters;
    :class:`~pytest_tfgrpc.wire.security.SecretFileError` (a ValueError) when others could
    read or change the file (with the ``chmod`` to run).
    """
    if path:
        path = os.path.expanduser(path)
        token = read_secret_file(path, f"token file ({option})").strip().splitlines()[0:1]
        text = token[0].strip() if token else ""
        where = f"token file ({option}) {path}"
    else:
        text = environ.get(TOKEN_ENV, "").strip()
        where = TOKEN_ENV
    if not text:
        raise ValueError(
            f"no agent token: give {option} FILE or set {TOKEN_ENV} (the same on every host)"
        )
    if len(text) < MIN_TOKEN_CHARS:
        raise ValueError(f"{where}: the token has {len(text)} characters, fewer than 16")
    return text


class _TokenCheck(grpc.ServerInterceptor):  # type: ignore[misc]
    """Refuse every call whose ``authorization`` metadata is not ``Bearer <token>``."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        given = dict(details.invocation_metadata or ()).get("authorization", "")
        if hmac.compare_digest(str(given).encode(), self._expected):
            return continuation(details)
        handler = continuation(details)
        if handler is None:
            return None

        def refuse(request: Any, context: grpc.ServicerContext) -> Any:
            why = "no agent token" if not given else "wrong agent token"
            context.abort(grpc.StatusCode.UNAUTHENTICATED, f"{why}: send 'Bearer <token>'")

        # Refused as a request stream (the wire is the same for a unary client), before and
        # without a request message: a stranger's call that sends none holds no thread.
        if handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(refuse)
        return grpc.stream_unary_rpc_method_handler(refuse)


def _drop_traceback(error: grpc.RpcError) -> None:
    """Forget a cancelled call's error's traceback: grpcio keeps the error in the call's state,
    which the traceback's frames hold, a cycle that keeps the call and its stream counted
    against the connection's bound until the cyclic collector runs (as in
    :meth:`pytest_tfgrpc.roles.idle.IdleWatch.next`)."""
    error.__traceback__ = None


class _Pools(futures.Executor):
    """The agent server's executor: calls to the ``control`` handlers run on a pool of
    :data:`CONTROL_THREADS`, every other call on one of :data:`DATA_THREADS`.

    grpcio's synchronous server runs every call through one executor, and a ``Run`` stream
    holds its thread for the role's life: with one pool, 64 roles and a driver's burst of
    readings left heartbeats queued until leases ran out. The handler a call runs is among
    the arguments grpcio submits (the servicer's bound method, after the token check: a call
    refused for its token runs on the data pool).
    """

    def __init__(self, control: set[Callable[..., Any]]) -> None:
        self._control_handlers = control
        self._control = futures.ThreadPoolExecutor(CONTROL_THREADS, "tfgrpc-agent-control")
        self._data = futures.ThreadPoolExecutor(DATA_THREADS, "tfgrpc-agent")

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> futures.Future[Any]:
        control = any(callable(arg) and arg in self._control_handlers for arg in args)
        return (self._control if control else self._data).submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._control.shutdown(wait, cancel_futures=cancel_futures)
        self._data.shutdown(wait, cancel_futures=cancel_futures)


class _TaskInput:
    """A TensorFlow task's stdin as the agent passes it on: whole lines, each a worker's
    command that :func:`~pytest_tfgrpc.roles.tf_task.check_command` accepts, passed on as
    parsed; a PS task takes none. :meth:`feed` raises
    :class:`~pytest_tfgrpc.roles.tf_task.TaskInputError` at the first line it refuses."""

    def __init__(self, role: str, ps_tasks: int) -> None:
        self.role = role
        self.ps_tasks = ps_tasks
        self._buffer = b""

    def feed(self, data: bytes) -> bytes:
        """The lines ``data`` completes, checked and re-encoded."""
        self._buffer += data
        lines = []
        while b"\n" in self._buffer:
            line, _, self._buffer = self._buffer.partition(b"\n")
            if len(line) > tf_task.MAX_LINE_BYTES:
                raise tf_task.TaskInputError(f"a line over {tf_task.MAX_LINE_BYTES} bytes")
            if self.role != "worker":
                raise tf_task.TaskInputError("TensorFlow's PS task takes no commands")
            try:
                command = json.loads(line)
            except ValueError:
                raise tf_task.TaskInputError("a command line that is not JSON") from None
            tf_task.check_command(command, self.ps_tasks)
            lines.append(json.dumps(command).encode() + b"\n")
        if len(self._buffer) > tf_task.MAX_LINE_BYTES:
            raise tf_task.TaskInputError(f"a line over {tf_task.MAX_LINE_BYTES} bytes")
        return b"".join(lines)


@dataclass
class _Role:
    driver: str
    role: str
    proc: subprocess.Popen[bytes]
    stop_reason: str = ""
    #: The port it binds, held for it until it ends (TensorFlow's tasks).
    reservation: PortReservation | None = None
    #: What its stdin may carry, when the agent checks it (TensorFlow's tasks).
    stdin_gate: _TaskInput | None = None


@dataclass
class _Lease:
    expires: float
    roles: list[_Role] = field(default_factory=list)
    #: Ports held for roles not started yet, by port: the reservation and when it lapses.
    reservations: dict[int, tuple[PortReservation, float]] = field(default_factory=dict)

    def held(self) -> int:
        return len(self.roles) + len(self.reservations)


class AgentServer(agent_pb2_grpc.NodeAgentServicer):
    """The agent's service and its bookkeeping; :meth:`serve` starts it on ``fabric``."""

    def __init__(
        self,
        fabric: Fabric,
        token: str,
        *,
        host: str | None = None,
        role_tls: TlsFiles | None = None,
        tf_python: str | None = None,
    ) -> None:
        self.fabric = fabric
        #: The host's TensorFlow Python, which runs TensorFlow's tasks (None: it runs none).
        self.tf_python = tf_python
        self._reader: TelemetryReader | None = None
        self.host = host or socket.gethostname()
        #: The host's identity for the roles it starts under TLS (None: it has none).
        self.role_tls = role_tls if role_tls is not None and role_tls.enabled else None
        self._token = token
        self._leases: dict[str, _Lease] = {}
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._server: grpc.Server | None = None
        self.target = ""

    # --- service -------------------------------------------------------------------------
    def Hello(self, request: Any, context: grpc.ServicerContext) -> Any:
        return agent_pb2.AgentInfo(
            host=self.host,
            fabric=self.fabric.name,
            address=self.fabric.address,
            roles=list(ROLES),
            pid=os.getpid(),
            version=_package_version(),
            engines=list(engines_here(self.tf_python)),
            tls=self.role_tls.describe() if self.role_tls is not None else "off",
        )

    def Heartbeat(self, request: Any, context: grpc.ServicerContext) -> Any:
        driver = self._driver(request.driver, context)
        lease_s = float(request.lease_s)
        if not math.isfinite(lease_s) or not MIN_LEASE_S <= lease_s <= MAX_LEASE_S:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"lease_s={lease_s!r}: a lease is a finite number of seconds from "
                f"{MIN_LEASE_S:g} to {MAX_LEASE_S:g}",
            )
        with self._lock:
            lease = self._leases.setdefault(driver, _Lease(0.0))
            lease.expires = time.monotonic() + lease_s
            running = sum(1 for r in lease.roles if r.proc.poll() is None)
        return agent_pb2.LeaseReply(lease_s=lease_s, processes=running)

    def Release(self, request: Any, context: grpc.ServicerContext) -> Any:
        driver = self._driver(request.driver, context)
        stopped = self._stop_driver(driver, f"driver {driver} released its lease")
        return agent_pb2.LeaseReply(lease_s=0.0, processes=stopped)

    def _live_lease(self, driver: str, context: grpc.ServicerContext) -> _Lease | None:
        """``driver``'s lease while it runs (call with ``self._lock`` held); otherwise the call
        is aborted ``FAILED_PRECONDITION`` and None returned."""
        lease = self._leases.get(driver)
        if lease is None or lease.expires < time.monotonic() or self._closing.is_set():
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"driver {driver} holds no lease here: send Heartbeat first",
            )
            return None
        return lease

    def Reserve(self, request: Any, context: grpc.ServicerContext) -> Any:
        driver = self._driver(request.driver, context)
        address = self.fabric.address
        with self._lock:
            lease = self._live_lease(driver, context)
            if lease is None:
                return None
            held = sum(each.held() for each in self._leases.values())
            if held >= MAX_PROCESSES:
                context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"the agent holds {held} processes and ports already, its limit "
                    f"({MAX_PROCESSES})",
                )
            try:
                zone = f"%{self.fabric.zone}" if self.fabric.zone else ""
                reservation = PortReservation(address + zone)
            except OSError as exc:
                context.abort(grpc.StatusCode.UNAVAILABLE, f"no port on {address}: {exc}")
            lease.reservations[reservation.port] = (reservation, time.monotonic() + RESERVATION_S)
        return agent_pb2.Reservation(
            port=reservation.port, address=address, expires_s=RESERVATION_S
        )

    def Counters(self, request: Any, context: grpc.ServicerContext) -> Any:
        rx, tx = interface_counters(self.fabric.name)
        try:
            link = self._telemetry().link(self.fabric.name)
        except TelemetryError:  # bytes from sysfs still answer
            return agent_pb2.InterfaceCounters(fabric=self.fabric.name, rx_bytes=rx, tx_bytes=tx)
        return link_message(link)

    def Telemetry(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._driver(request.driver, context)
        if not 0 < request.port < 65536:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"port {request.port} is not a port")
        ends = [tuple(end.split(">", 1)) for end in request.connections]
        if any(len(end) != 2 for end in ends):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a connection is not local>peer")
        clients = [(local, peer) for local, peer in ends]
        try:
            reading = self._telemetry().read(
                request.address,
                request.port,
                discover=request.discover,
                clients=(lambda port: clients) if clients else None,
            )
        except (TelemetryError, OSError) as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"telemetry on {self.host}: {exc}")
        if request.pid:
            with self._lock:
                lease = self._leases.get(request.driver)
                ours = lease is not None and any(r.proc.pid == request.pid for r in lease.roles)
            if not ours:  # only the roles it started: no view of the host's other processes
                context.abort(
                    grpc.StatusCode.NOT_FOUND,
                    f"process {request.pid} is no role driver {request.driver} started here",
                )
            reading = replace(reading, cpu_wait_ns=run_queue_wait_ns(request.pid))
        return reading_message(reading)

    def _telemetry(self) -> TelemetryReader:
        """The agent's one reader (netlink sockets kept open; reads are serialised)."""
        with self._lock:
            if self._reader is None:
                self._reader = TelemetryReader(self.fabric.name)
            return self._reader

    def Run(self, requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            first = next(requests, None)
        except grpc.RpcError as error:  # cancelled before its start came
            _drop_traceback(error)
            return
        if first is None or first.WhichOneof("kind") != "start":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message must be a start")
            return
        start = first.start
        driver = self._driver(start.driver, context)
        engine = start.engine or "grpcio"
        port = None
        try:
            if start.tls and self.role_tls is None:
                raise RoleError(
                    tls_mismatch(self.host, "off", "tls"), grpc.StatusCode.FAILED_PRECONDITION
                )
            argv, env = role_argv(
                start.role,
                dict(start.params),
                dict(start.env),
                self.fabric,
                engine=engine,
                tls=self.role_tls if start.tls else None,
                host=self.host,
                tf_python=self.tf_python,
            )
            if engine == "tensorflow":
                port = tf_task_port(start.role, start.params, self.fabric)
        except RoleError as exc:
            context.abort(exc.code, str(exc))
        with self._lock:
            lease = self._live_lease(driver, context)
            if lease is None:
                return
            reservation, gate = None, None
            if port is not None:  # TensorFlow's task: the port it was given is held for it
                reservation = lease.reservations.pop(port, (None, 0.0))[0]
                if reservation is None:
                    context.abort(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"port {port} is no port driver {driver} holds on {self.host}: "
                        "Reserve it first",
                    )
                    return
                gate = _TaskInput(start.role, len(json.loads(start.params["cluster"])["ps"]))
            # A role and the port held for it count once.
            running = sum(held.held() for held in self._leases.values()) - (port is not None)
            if running >= MAX_PROCESSES:
                if reservation is not None:
                    reservation.release()
                context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"the agent runs {running} processes already, its limit ({MAX_PROCESSES})",
                )
                return
            try:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                    env=env,
                )
            except BaseException:
                if reservation is not None:
                    reservation.release()
                raise
            role = _Role(driver, start.role, proc, reservation=reservation, stdin_gate=gate)
            lease.roles.append(role)
        context.add_callback(lambda: self._stop(role, "its Run stream ended (driver gone?)"))
        yield agent_pb2.RoleOutput(
            started=agent_pb2.Started(
                pid=proc.pid, host=self.host, fabric=self.fabric.name, address=self.fabric.address
            )
        )
        yield from self._relay(role, requests)

    # --- processes -----------------------------------------------------------------------
    def _relay(self, role: _Role, requests: Iterator[Any]) -> Iterator[Any]:
        proc = role.proc
        out: queue.Queue[Any] = queue.Queue()

        def feed() -> None:
            assert proc.stdin is not None
            with contextlib.suppress(Exception):  # the driver went away: close stdin below
                try:
                    for message in requests:
                        if message.WhichOneof("kind") != "stdin":
                            continue
                        data = message.stdin
                        if role.stdin_gate is not None:
                            try:
                                data = role.stdin_gate.feed(data)
                            except tf_task.TaskInputError as exc:
                                self._stop(role, f"it refused a line of its input: {exc}")
                                break
                        proc.stdin.write(data)
                        proc.stdin.flush()
                except grpc.RpcError as error:
                    _drop_traceback(error)
            with contextlib.suppress(OSError):
                proc.stdin.close()

        def pump(stream: Any, kind: str) -> None:
            for chunk in iter(lambda: os.read(stream.fileno(), 1 << 16), b""):
                reply = agent_pb2.RoleOutput()
                setattr(reply, kind, chunk)
                out.put(reply)
            out.put(kind)

        threading.Thread(target=feed, daemon=True).start()
        threading.Thread(target=pump, args=(proc.stdout, "stdout"), daemon=True).start()
        threading.Thread(target=pump, args=(proc.stderr, "stderr"), daemon=True).start()
        open_streams = 2
        while open_streams:
            item = out.get()
            if isinstance(item, str):
                open_streams -= 1
            else:
                yield item
        code = proc.wait()
        self._forget(role)
        yield agent_pb2.RoleOutput(
            exited=agent_pb2.Exited(returncode=code, reason=role.stop_reason)
        )

    def _stop(self, role: _Role, reason: str) -> None:
        if role.proc.poll() is None:
            role.stop_reason = role.stop_reason or reason
            end_process(role.proc, timeout=3.0)
        self._forget(role)

    def _forget(self, role: _Role) -> None:
        if role.reservation is not None:
            role.reservation.release()
        with self._lock:
            lease = self._leases.get(role.driver)
            if lease is not None and role in lease.roles:
                lease.roles.remove(role)

    def _stop_driver(self, driver: str, reason: str) -> int:
        with self._lock:
            lease = self._leases.pop(driver, None)
        roles = list(lease.roles) if lease is not None else []
        for reservation, _ in lease.reservations.values() if lease is not None else ():
            reservation.release()
        for role in roles:
            self._stop(role, reason)
        return len(roles)

    def _reap(self) -> None:
        """Stop the processes of every driver whose lease ran out (a thread)."""
        while not self._closing.wait(0.25):
            now = time.monotonic()
            with self._lock:
                expired = [d for d, lease in self._leases.items() if lease.expires < now]
                for lease in self._leases.values():
                    for port, (reservation, lapses) in list(lease.reservations.items()):
                        if lapses < now:  # held for a role that never started
                            reservation.release()
                            del lease.reservations[port]
            for driver in expired:
                self._stop_driver(driver, f"the lease of driver {driver} ran out")

    def _driver(self, driver: str, context: grpc.ServicerContext) -> str:
        if not driver or len(driver) > 128:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a driver id of 1-128 characters")
        return driver

    # --- lifetime ------------------------------------------------------------------------
    def serve(
        self, port: int = DEFAULT_PORT, credentials: grpc.ServerCredentials | None = None
    ) -> str:
        """Start serving on the fabric's address (with TLS ``credentials`` if given); return
        the target (``host:port``)."""
        server = grpc.server(
            _Pools({self.Hello, self.Heartbeat, self.Release}),
            interceptors=[_TokenCheck(self._token)],
            maximum_concurrent_rpcs=256,
            options=(
                *grpc_settings.NO_COMPRESSION,
                *grpc_settings.stream_bound(STREAMS_PER_DRIVER),
            ),
        )
        agent_pb2_grpc.add_NodeAgentServicer_to_server(self, server)  # type: ignore[no-untyped-call]
        address = self.fabric.target(port)
        if credentials is None:
            bound = server.add_insecure_port(address)
        else:
            bound = server.add_secure_port(address, credentials)
        if bound == 0:
            raise OSError(f"cannot listen on {self.fabric.target(port)} (port in use?)")
        server.start()
        self._server = server
        self.target = self.fabric.target(bound)
        threading.Thread(target=self._reap, name="tfgrpc-agent-leases", daemon=True).start()
        return self.target

    def close(self) -> None:
        """Stop serving and stop every process of every driver."""
        self._closing.set()
        for driver in list(self._leases):
            self._stop_driver(driver, "the agent is shutting down")
        if self._server is not None:
            self._server.stop(grace=1.0).wait(3.0)
        if self._reader is not None:
            self._reader.close()

    def wait(self) -> None:
        if self._server is not None:
            self._server.wait_for_termination()


def _read_pem(path: str, what: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{what} {path}: {exc.strerror or exc}") from None
    if b"-----BEGIN" not in data:
        raise ValueError(f"{what} {path}: not a PEM file")
    return data


def server_credentials(
    cert: str | None, key: str | None, ca: str | None
) -> grpc.ServerCredentials | None:
    """TLS credentials from PEM files: ``cert`` and ``key`` serve TLS, ``ca`` also requires
    client certificates it signed (mutual TLS); none of them: None (plaintext, token only).
    ValueError naming the option and file otherwise."""
    if cert is None and key is None:
        if ca is not None:
            raise ValueError("--tls-ca needs --tls-cert and --tls-key (the agent's own)")
        return None
    if cert is None or key is None:
        raise ValueError("--tls-cert and --tls-key go together")
    pair = (_read_pem(key, "--tls-key"), _read_pem(cert, "--tls-cert"))
    roots = _read_pem(ca, "--tls-ca") if ca is not None else None
    return grpc.ssl_server_credentials(
        [pair], root_certificates=roots, require_client_auth=roots is not None
    )


def main(argv: list[str] | None = None) -> int:
    """``tfgrpc-node``: serve the node agent on one interface until stopped."""
    parser = argparse.ArgumentParser(
        prog="tfgrpc-node",
        description="Run pytest-tfgrpc's node agent: the driver starts the plugin's roles"
        " (tensor server, PS, worker, floor server; TensorFlow's PS tasks and workers with"
        f" {TF_PYTHON_OPTION}) on this host through it.",
    )
    parser.add_argument("--fabric", required=True, help="interface to serve on (e.g. ib0)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="default: %(default)s")
    parser.add_argument(
        "--token-file", help=f"file whose first line is the shared token (default: ${TOKEN_ENV})"
    )
    parser.add_argument(
        "--host-name",
        default=os.environ.get("SLURMD_NODENAME") or None,
        help="name reported to drivers (default: $SLURMD_NODENAME under SLURM, else hostname)",
    )
    parser.add_argument("--exit-on-stdin-eof", action="store_true", help="stop when stdin closes")
    parser.add_argument("--tls-cert", help="serve TLS with this certificate (PEM; with --tls-key)")
    parser.add_argument("--tls-key", help="the certificate's private key (PEM)")
    parser.add_argument(
        "--tls-ca", help="require client certificates signed by this CA (PEM): mutual TLS"
    )
    parser.add_argument(
        TF_PYTHON_OPTION,
        metavar="PATH",
        help="the python of an environment with TensorFlow (pytest-tfgrpc[tensorflow]): this"
        " agent then runs TensorFlow's PS tasks and workers, which listen on every interface"
        " and authenticate no caller (default: none, and it runs none)",
    )
    args = parser.parse_args(argv)
    tf_python = args.tf_python
    if tf_python is not None and not (os.path.isfile(tf_python) and os.access(tf_python, os.X_OK)):
        parser.error(f"{TF_PYTHON_OPTION} {tf_python}: not an executable file")
    grpc_settings.quiet_core_log(os.environ)  # before its server starts; its roles inherit it
    if not 0 <= args.port <= 65535:
        parser.error(f"--port {args.port}: a port is a number from 0 to 65535")
    try:
        fabric = resolve_fabric(args.fabric)
        token = read_token(args.token_file, os.environ)
    except (FabricError, ValueError) as exc:
        parser.error(str(exc))
    try:
        credentials = server_credentials(args.tls_cert, args.tls_key, args.tls_ca)
    except ValueError as exc:
        parser.error(str(exc))
    role_tls = TlsFiles(args.tls_cert, args.tls_key, args.tls_ca)
    try:
        load_tls(role_tls, "--tls-")  # the roles read them too: checked once, here
    except TlsError as exc:
        parser.error(str(exc))
    agent = AgentServer(fabric, token, host=args.host_name, role_tls=role_tls, tf_python=tf_python)
    try:
        target = agent.serve(args.port, credentials)
    except OSError as exc:
        parser.error(f"--fabric {fabric.name} --port {args.port}: {exc}")
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: done.set())
    if args.exit_on_stdin_eof:

        def lifeline() -> None:
            while sys.stdin.buffer.read(4096):
                pass
            done.set()

        threading.Thread(target=lifeline, daemon=True).start()
    print(json.dumps({"target": target, "pid": os.getpid(), "host": agent.host}), flush=True)
    try:
        while not done.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    agent.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
