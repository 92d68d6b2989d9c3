"""The driver's side of the node agents: a client per agent, and remote processes that look local.

:class:`AgentClient` talks to one ``tfgrpc-node`` (:mod:`pytest_tfgrpc.hosts.agent`): it
authenticates every call with the shared token, holds this driver's lease by heartbeating in a
thread, and releases it on :meth:`AgentClient.close`. :meth:`AgentClient.launcher` gives an
:class:`AgentLauncher`, the seam :class:`~pytest_tfgrpc.roles.processes.ChildProcess` starts its
process through: the remote process is a :class:`RemoteProcess` with the ``subprocess.Popen``
surface the handles use (``stdin`` to write, ``stdout`` a real pipe to select on, ``poll``,
``wait``, ``terminate``, ``kill``), so a PS, worker or tensor server on another host is driven
by the same code, and speaks the same job protocol, as a local one.

When an agent goes away mid-run (killed, host down, network lost), each of its processes ends
with :data:`AGENT_LOST` and a stderr line naming the host, the agent and the gRPC status, which
the handle's :class:`~pytest_tfgrpc.roles.processes.ServerDied` message then carries.
"""

from __future__ import annotations

import contextlib
import os
import queue
import subprocess
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import grpc

from pytest_tfgrpc.hosts.agent import ROLES
from pytest_tfgrpc.hosts.telemetry import reading_from_message
from pytest_tfgrpc.native import FLOOR_NAME, SERVER_NAME, WORKER_NAME
from pytest_tfgrpc.roles import tf_task
from pytest_tfgrpc.tuning.allocator import ALLOCATOR_VARS
from pytest_tfgrpc.wire._proto import agent_pb2, agent_pb2_grpc
from pytest_tfgrpc.wire.security import ENV_VARS as TLS_ENV_VARS
from pytest_tfgrpc.wire.security import TOKEN_ENV as JOB_TOKEN_ENV
from pytest_tfgrpc.wire.security import tls_failure
from pytest_tfgrpc.wire.telemetry import Reading, TelemetryError

__all__ = [
    "AGENT_LOST",
    "AgentClient",
    "AgentError",
    "AgentInfo",
    "AgentLauncher",
    "AgentTLS",
    "RemoteProcess",
    "driver_id",
]

#: The role of each native program (the native PS task is the server with a job token).
_NATIVE_ROLES = {SERVER_NAME: "tensor_server", WORKER_NAME: "worker", FLOOR_NAME: "floor_server"}
#: The exit status of a remote process whose agent could no longer be reached.
AGENT_LOST = 255
_DRIVER_ID = f"{os.uname().nodename}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def driver_id() -> str:
    """This process's driver id: host name, pid and a random part (one per process)."""
    return _DRIVER_ID


class AgentError(RuntimeError):
    """An agent that refused a request or could not be reached; names the host and target."""


@dataclass(frozen=True)
class _AgentPort:
    """A port an agent holds (:meth:`AgentClient.reserve`); the agent lets it go itself."""

    host_port: str

    def release(self) -> None:
        pass


@dataclass(frozen=True)
class AgentInfo:
    """What an agent said of itself (``Hello``)."""

    host: str
    fabric: str
    address: str
    roles: tuple[str, ...]
    pid: int
    version: str
    target: str
    #: The engines whose roles it can start (``native`` only where it is built).
    engines: tuple[str, ...] = ("grpcio",)
    #: The TLS its roles get when a driver asks (``off``: it has no certificate).
    tls: str = "off"


@dataclass(frozen=True)
class AgentTLS:
    """TLS to the agents: ``ca`` (PEM) to verify them; ``cert``/``key`` (PEM) for mutual TLS.

    ``from_files`` reads them; ValueError names the file that cannot be read."""

    ca: bytes
    cert: bytes | None = None
    key: bytes | None = None

    @classmethod
    def from_files(cls, ca: str, cert: str | None = None, key: str | None = None) -> AgentTLS:
        if (cert is None) != (key is None):
            raise ValueError("an agent client certificate and its key go together")

        def read(path: str) -> bytes:
            try:
                return Path(path).read_bytes()
            except OSError as exc:
                raise ValueError(f"agent TLS file {path}: {exc.strerror or exc}") from None

        return cls(read(ca), read(cert) if cert else None, read(key) if key else None)

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )


#: How long the driver waits for an agent (its name to resolve, it to listen) and for each call.
AGENT_TIMEOUT_S = 10.0


class AgentClient:
    """A connection to the agent at ``target`` (``host:port``), authenticated with ``token``.

    With ``tls`` the channel is TLS (mutual when it has a client certificate).
    Opens this driver's lease at once (raising :class:`AgentError` if the agent refuses or does
    not answer within ``timeout`` s, waiting that long for one that is still starting) and
    renews it every ``lease_s / 3`` s until :meth:`close`.
    """

    def __init__(
        self,
        target: str,
        token: str,
        *,
        lease_s: float = 10.0,
        timeout: float = AGENT_TIMEOUT_S,
        tls: AgentTLS | None = None,
    ) -> None:
        self.target = target
        self.lease_s = lease_s
        self.timeout = timeout
        self.driver = driver_id()
        self._metadata = (("authorization", f"Bearer {token}"),)
        self._tls_mode = "off" if tls is None else "mtls" if tls.cert else "tls"
        self._channel = (
            grpc.insecure_channel(target)
            if tls is None
            else grpc.secure_channel(target, tls.credentials())
        )
        self._stub = agent_pb2_grpc.NodeAgentStub(self._channel)  # type: ignore[no-untyped-call]
        self._closed = threading.Event()
        self.lost: str | None = None
        try:
            # An agent started with the driver (srun, a Job) may not listen yet: wait for it.
            hello = agent_pb2.LeaseRequest(driver=self.driver)
            try:
                reply = self._call(self._stub.Hello, hello, wait_for_ready=True)
            except AgentError as exc:
                if "DEADLINE_EXCEEDED" not in str(exc):
                    raise
                # Waiting hides why it never connected (refused, TLS handshake): ask once more.
                reply = self._call(self._stub.Hello, hello)
            self.info = AgentInfo(
                host=reply.host,
                fabric=reply.fabric,
                address=reply.address,
                roles=tuple(reply.roles),
                pid=reply.pid,
                version=reply.version,
                target=target,
                engines=tuple(reply.engines),
                tls=reply.tls or "off",
            )
            self._heartbeat()
        except BaseException:
            self._channel.close()
            raise
        self._thread = threading.Thread(
            target=self._renew, name=f"tfgrpc-lease-{target}", daemon=True
        )
        self._thread.start()

    @property
    def name(self) -> str:
        return f"agent {(getattr(self, 'info', None) and self.info.host) or '?'} at {self.target}"

    def _call(self, method: Any, request: Any, *, wait_for_ready: bool = False) -> Any:
        try:
            return method(
                request,
                timeout=self.timeout,
                metadata=self._metadata,
                wait_for_ready=wait_for_ready,
            )
        except grpc.RpcError as exc:
            details = str(exc.details()) if isinstance(exc, grpc.Call) else ""
            why = tls_failure(
                self.target, details, flag_prefix="--tfgrpc-agent-tls-", mode=self._tls_mode
            )
            raise AgentError(f"agent at {self.target}: {why or _status(exc)}") from None

    def _heartbeat(self) -> None:
        request = agent_pb2.LeaseRequest(driver=self.driver, lease_s=self.lease_s)
        self._call(self._stub.Heartbeat, request)

    def _renew(self) -> None:
        while not self._closed.wait(self.lease_s / 3):
            try:
                self._heartbeat()
            except AgentError as exc:
                self.lost = str(exc)

    def counters(self) -> tuple[int, int]:
        """Bytes (received, sent) on the agent's fabric interface so far."""
        reply = self._call(self._stub.Counters, agent_pb2.LeaseRequest(driver=self.driver))
        return int(reply.rx_bytes), int(reply.tx_bytes)

    def telemetry(
        self,
        address: str,
        port: int,
        discover: bool = True,
        pid: int = 0,
        connections: Sequence[tuple[str, str]] = (),
    ) -> Reading:
        """What the agent's host knows of the connections of ``address:port`` there, and
        its fabric's counters (:mod:`pytest_tfgrpc.wire.telemetry`; ``discover`` as for
        :meth:`~pytest_tfgrpc.wire.telemetry.TelemetryReader.sockets`, finding them by the
        clients' ``(local, peer)`` ends in ``connections`` where given); with ``pid`` (a
        process this driver started there), its run-queue wait so far."""
        request = agent_pb2.TelemetryRequest(
            driver=self.driver,
            address=address,
            port=port,
            discover=discover,
            pid=pid,
            connections=[f"{local}>{peer}" for local, peer in connections],
        )
        return reading_from_message(self._call(self._stub.Telemetry, request))

    def reserve(self) -> str:
        """Hold a port of the agent's fabric address for a role started later (TensorFlow's
        tasks); its ``address:port``. The agent lets it go when that role ends, when this
        driver's lease ends, or after a minute unused."""
        reply = self._call(self._stub.Reserve, agent_pb2.LeaseRequest(driver=self.driver))
        address = str(reply.address)
        return f"[{address}]:{reply.port}" if ":" in address else f"{address}:{reply.port}"

    def launcher(self) -> AgentLauncher:
        """The launcher that starts processes on this agent's host."""
        return AgentLauncher(self)

    def run(
        self,
        role: str,
        params: Mapping[str, str],
        env: Mapping[str, str],
        stderr: IO[bytes],
        *,
        name: str,
        engine: str = "grpcio",
        tls: bool = False,
    ) -> RemoteProcess:
        """Start ``role`` of ``engine`` there (with the host's own certificates if ``tls``);
        returns once the agent says it started (or raises)."""
        start = agent_pb2.RoleStart(
            driver=self.driver, role=role, params=params, env=env, engine=engine, tls=tls
        )
        return RemoteProcess(self, start, stderr, name=name)

    def close(self) -> None:
        """Stop renewing, release the lease (the agent stops what is left), close."""
        if self._closed.is_set():
            return
        self._closed.set()
        with contextlib.suppress(AgentError):
            self._call(self._stub.Release, agent_pb2.LeaseRequest(driver=self.driver))
        self._channel.close()

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<AgentClient {self.name}>"


class AgentLauncher:
    """Starts a :class:`~pytest_tfgrpc.roles.processes.ChildProcess` through an agent.

    It reads the role and engine from the program the handle would run (a role module of
    :data:`~pytest_tfgrpc.hosts.agent.ROLES`, or a native program) and passes on only what
    the agent accepts: a server's ``--workers``/``--threads``, ``--delay``/``--delay-ns`` and
    ``--max-tensor-bytes``, the allocator variables of ``env``, a PS task's job token, and
    whether the run uses TLS (the agent's host then serves and dials with its own
    certificates); what a role binds to is the agent's choice (its fabric, a port the OS
    picks), and the agent runs its own install's programs, never a path sent here.
    TensorFlow's tasks (:func:`~pytest_tfgrpc.roles.tf_task.task_argv`) pass their job,
    index and cluster spec, whose entry for the task is a port :meth:`reserve_port` held.
    """

    def __init__(self, client: AgentClient) -> None:
        self.client = client

    @property
    def host(self) -> str:
        return self.client.info.host

    @property
    def address(self) -> str | None:
        info = self.client.info
        return f"{info.address}%{info.fabric}" if info.address.startswith("fe80") else info.address

    def read_telemetry(
        self,
        address: str,
        port: int,
        discover: bool,
        pid: int = 0,
        connections: Sequence[tuple[str, str]] = (),
    ) -> Reading:
        """The server side of a connection, read on this agent's host (with the run-queue
        wait of ``pid``, a process started there, where given; found by the clients' ends
        ``connections`` where given)."""
        try:
            return self.client.telemetry(address, port, discover, pid, connections)
        except AgentError as exc:
            raise TelemetryError(str(exc)) from None

    def reserve_port(self, address: str) -> _AgentPort:
        """A port the agent holds on its own fabric address (``address``, this host's, is
        not used: the agent decides where its roles bind)."""
        return _AgentPort(self.client.reserve())

    def spawn(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None, stderr: IO[bytes], name: str
    ) -> RemoteProcess:
        env = env or {}
        program = os.path.basename(argv[0]) if argv else ""
        params: dict[str, str] = {}
        task = _tf_task(argv)
        if task is not None:
            role, params = task
            wanted = {k: v for k, v in env.items() if k in ALLOCATOR_VARS}
            return self.client.run(role, params, wanted, stderr, name=name, engine="tensorflow")
        if program in _NATIVE_ROLES:
            engine, role = "native", _NATIVE_ROLES[program]
            if role == "tensor_server" and JOB_TOKEN_ENV in env:
                role = "ps"  # the native PS task is the native server with a job token
            flags: tuple[tuple[str, str], ...] = (
                ("--threads", "threads"),
                ("--max-tensor-bytes", "max_tensor_bytes"),
            )
            rest = list(argv[1:])
            if "--delay-ns" in rest and int(rest[rest.index("--delay-ns") + 1]):
                params["delay"] = f"{rest[rest.index('--delay-ns') + 1]}ns"
        else:
            module = argv[2] if len(argv) > 2 and argv[1] == "-m" else ""
            roles = [role for role, mod in ROLES.items() if mod == module]
            if not roles:
                raise AgentError(f"{name}: {module or program!r} is not a role an agent runs")
            engine = "grpcio"
            role = "ps" if "--workers" in argv and roles[0] == "tensor_server" else roles[0]
            flags = (
                ("--workers", "workers"),
                ("--delay", "delay"),
                ("--max-tensor-bytes", "max_tensor_bytes"),
            )
            rest = list(argv[3:])
        for flag, key in flags:
            if flag in rest:
                params[key] = rest[rest.index(flag) + 1]
        # The allocator policy, and the driver's job token for a PS task and its workers.
        passed = (*ALLOCATOR_VARS, *((JOB_TOKEN_ENV,) if role in ("ps", "worker") else ()))
        wanted = {k: v for k, v in env.items() if k in passed}
        tls = any(env.get(variable) for variable in TLS_ENV_VARS.values())
        return self.client.run(role, params, wanted, stderr, name=name, engine=engine, tls=tls)


def _tf_task(argv: Sequence[str]) -> tuple[str, dict[str, str]] | None:
    """The role (ps or worker) and parameters of a TensorFlow task's command
    (:func:`~pytest_tfgrpc.roles.tf_task.task_argv`), or None for any other command."""
    script = os.path.abspath(tf_task.__file__)
    if len(argv) < 5 or list(argv[1:3]) != ["-c", tf_task.RUN_SCRIPT] or argv[3] != script:
        return None
    rest = list(argv[5:])
    options = dict(zip(rest[::2], rest[1::2], strict=False))
    return options["--job"], {"index": options["--index"], "cluster": options["--cluster"]}


class _StdinWriter:
    """A file-like stdin that sends what is written on the Run stream; close() ends it."""

    def __init__(self, outbox: queue.Queue[Any]) -> None:
        self._outbox = outbox
        self.closed = False

    def write(self, data: bytes) -> int:
        if self.closed:
            raise ValueError("write to a closed stdin")
        self._outbox.put(agent_pb2.RoleInput(stdin=bytes(data)))
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._outbox.put(None)


class RemoteProcess:
    """A role running on an agent's host, with the ``Popen`` surface the local handles use."""

    def __init__(
        self, client: AgentClient, start: agent_pb2.RoleStart, stderr: IO[bytes], *, name: str
    ) -> None:
        """Send ``start`` on a Run stream of ``client``; returns once the agent says the role
        started, or raises :class:`AgentError` with its refusal."""
        self.client = client
        self.name = name
        self.returncode: int | None = None
        self.pid = 0
        self.host = client.info.host
        self._outbox: queue.Queue[Any] = queue.Queue()
        self.stdin = _StdinWriter(self._outbox)
        read_end, self._write_end = os.pipe()
        self.stdout: IO[bytes] = os.fdopen(read_end, "rb", buffering=0)
        # Its own open file (append mode): the handle seeks the same file to read the tail.
        self._stderr_fd = os.open(f"/proc/self/fd/{stderr.fileno()}", os.O_WRONLY | os.O_APPEND)
        self._started = threading.Event()
        self._done = threading.Event()
        self._refusal: str | None = None
        self._terminated = False
        self._outbox.put(agent_pb2.RoleInput(start=start))
        self._call = client._stub.Run(self._requests(), metadata=client._metadata)
        threading.Thread(target=self._relay, name=f"tfgrpc-remote-{name}", daemon=True).start()
        if not self._started.wait(client.timeout) or self._refusal is not None:
            self._call.cancel()
            self._done.wait(client.timeout)
            why = self._refusal or f"no answer within {client.timeout:g} s"
            # "PS 1 on host ps1", not "PS 1 on host ps1 on agent ps1 at ...".
            agent = f"agent at {client.target}" if self.host in name else client.name
            raise AgentError(f"{name}: {agent}: {why}")

    def _requests(self) -> Iterator[Any]:
        while True:
            message = self._outbox.get()
            if message is None:
                return
            yield message

    def _relay(self) -> None:
        try:
            for reply in self._call:
                kind = reply.WhichOneof("kind")
                if kind == "stdout":
                    os.write(self._write_end, reply.stdout)
                elif kind == "stderr":
                    os.write(self._stderr_fd, reply.stderr)
                elif kind == "started":
                    self.pid = reply.started.pid
                    self._started.set()
                elif kind == "exited":
                    self.returncode = reply.exited.returncode
                    if reply.exited.reason:
                        note = f"tfgrpc: {self.client.name} stopped it: {reply.exited.reason}\n"
                        os.write(self._stderr_fd, note.encode())
        except grpc.RpcError as exc:
            if not self._started.is_set():
                self._refusal = _status(exc)
            elif self._terminated:
                self.returncode = -15  # as if SIGTERM: the agent stops it when the call ends
            elif self.returncode is None:
                note = (
                    f"tfgrpc: lost {self.client.name} (host {self.host}) while {self.name}"
                    f" ran: {_status(exc)}\n"
                )
                os.write(self._stderr_fd, note.encode())
        finally:
            if self.returncode is None:
                self.returncode = AGENT_LOST
            os.close(self._write_end)
            os.close(self._stderr_fd)
            self._started.set()
            self._done.set()

    def poll(self) -> int | None:
        return self.returncode if self._done.is_set() else None

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(self.name, timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def terminate(self) -> None:
        """Cancel the Run stream: the agent stops the process."""
        self._terminated = True
        self._call.cancel()

    kill = terminate

    def __repr__(self) -> str:
        return f"<RemoteProcess {self.name} on {self.host} pid={self.pid}>"


def _status(exc: grpc.RpcError) -> str:
    if isinstance(exc, grpc.Call):
        details = exc.details() or ""
        if exc.code() is grpc.StatusCode.UNAVAILABLE and "connection refused" in details.lower():
            # gRPC's own text repeats the address twice around "last error: UNKNOWN".
            return "connection refused: no agent is running there (start tfgrpc-node again)"
        return f"{exc.code().name}: {details}"
    return str(exc)
