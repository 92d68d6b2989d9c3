"""Handles on tensor-server processes: start, wait until ready, detect death, stop.

A server process is tied to its parent three ways, so that none outlives a test run:
its stdin is a pipe whose closing stops it (the parent's exit closes it, even on SIGKILL),
:meth:`ServerProcess.stop` ends it explicitly, and :func:`stop_all` (registered with
``atexit`` and called by the plugin at session end) ends any still running. Servers run in
their own session, so a Ctrl-C in the terminal reaches pytest, which stops them in order,
instead of killing them under a measurement.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Protocol, TypedDict, TypeVar

from pytest_tfgrpc.roles.ports import PortReservation
from pytest_tfgrpc.wire.fabric import Fabric
from pytest_tfgrpc.wire.security import TOKEN_ENV as JOB_TOKEN_ENV
from pytest_tfgrpc.wire.security import child_environ

if TYPE_CHECKING:
    from typing_extensions import Unpack

_LIVE: set[ChildProcess] = set()
C = TypeVar("C", bound="ChildProcess")
_LIVE_LOCK = threading.Lock()


#: The running kernel's id: one per boot of one machine, the same in every network namespace
#: and container on it (proc(5), /proc/sys/kernel/random/boot_id).
_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask; the CPU count off Linux)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def this_machine() -> str:
    """The running kernel's boot id (proc(5)): processes that report the same one share this
    machine's CPUs, whatever network namespace or host name each has (emulated hosts do).
    Empty where the kernel has none to give (not Linux): a machine of its own."""
    try:
        with open(_BOOT_ID) as file:
            return file.read().strip()
    except OSError:
        return ""


class ServerError(RuntimeError):
    """A tensor server that could not start, or that died."""


class ServerDied(ServerError):
    """A tensor server process exited while it was in use."""

    def __init__(self, name: str, returncode: int, stderr_tail: str, where: str = "") -> None:
        self.returncode = returncode
        self.stderr_tail = stderr_tail
        super().__init__(
            f"{name} exited with {describe_exit(returncode)} while in use"
            + (f" ({where})" if where else "")
            + (f"; the end of its stderr:\n{stderr_tail}" if stderr_tail else "; stderr was empty")
        )


def describe_exit(returncode: int) -> str:
    """``status 3`` or ``signal 9 (SIGKILL)``."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown signal"
        return f"signal {-returncode} ({name})"
    return f"status {returncode}"


@dataclass(frozen=True)
class ServerInfo:
    """What a server said when it became ready."""

    target: str
    pid: int
    fabric: str


#: Each wait of :func:`end_process` once the run is being stopped (:func:`hurry`): a role
#: mid-step or mid-measurement may take its full grace to notice its closed stdin, and a
#: stopped run has nothing left to keep from it.
HURRIED_GRACE_S = 0.3
_hurried = threading.Event()


def hurry() -> None:
    """The run is being stopped (Ctrl-C, SIGTERM): from now on every stop waits at most
    :data:`HURRIED_GRACE_S` s before the next signal, so that the run ends within seconds."""
    _hurried.set()


def end_process(proc: ProcessLike, timeout: float = 5.0) -> int:
    """End a child that watches its stdin: close stdin, wait, then SIGTERM, wait, then SIGKILL.
    Returns its exit status. Each wait is ``timeout`` s, or :data:`HURRIED_GRACE_S` once
    :func:`hurry` was called."""
    hurried = _hurried.is_set()
    if hurried:
        timeout = min(timeout, HURRIED_GRACE_S)
    if proc.stdin is not None and not proc.stdin.closed:
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()
    try:
        if hurried:  # no time for a role to finish its step: SIGTERM at once
            proc.terminate()
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


class ProcessLike(Protocol):
    """What the handles use of a ``subprocess.Popen``: a local child or a remote process."""

    @property
    def pid(self) -> int: ...
    @property
    def stdin(self) -> Any: ...
    @property
    def stdout(self) -> Any: ...
    @property
    def returncode(self) -> int | Any: ...
    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...


class HeldPort(Protocol):
    """A port held on a launcher's host for a process that binds it later
    (:meth:`Launcher.reserve_port`)."""

    @property
    def host_port(self) -> str:
        """``address:port`` (``[v6]:port``), as a cluster spec names it."""
        ...

    def release(self) -> None:
        """Stop holding it (where the launcher's side can; an agent also lets it go itself)."""
        ...


class Launcher(Protocol):
    """Where a :class:`ChildProcess` runs: this host (:class:`LocalLauncher`) or another one
    through its node agent (:class:`~pytest_tfgrpc.hosts.agent_client.AgentLauncher`)."""

    @property
    def host(self) -> str:
        """The host's name, for messages and results."""
        ...

    @property
    def address(self) -> str | None:
        """The address its processes bind (None: this host's fabric decides)."""
        ...

    def spawn(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None, stderr: IO[bytes], name: str
    ) -> ProcessLike:
        """Start ``argv`` (``python -m <role module> ...``) with stdin and stdout pipes."""
        ...

    def reserve_port(self, address: str) -> HeldPort:
        """Hold a port for a process this launcher starts later that binds it by number:
        on ``address`` here, on the agent's own fabric address on its host."""
        ...


class LocalLauncher:
    """Start processes on this host, as children of this process."""

    host = "local"
    address = None

    def spawn(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None, stderr: IO[bytes], name: str
    ) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            start_new_session=True,
            # a secret reaches a child only when handed to it (the job token to a PS)
            env=child_environ(env, keep=(JOB_TOKEN_ENV,)) if env is not None else child_environ(),
        )

    def reserve_port(self, address: str) -> PortReservation:
        return PortReservation(address)


LOCAL = LocalLauncher()


class ChildProcess:
    """A child process of ours: stdin a pipe (its lifeline), stdout a pipe, stderr a file.

    It runs in its own session (a Ctrl-C reaches pytest, which stops it in order), is
    registered until stopped (:func:`stop_all` ends any left), and reports its death with
    its exit status and the end of its stderr.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        name: str,
        env: Mapping[str, str] | None = None,
        launcher: Launcher = LOCAL,
    ) -> None:
        self.name = name
        self.host = launcher.host
        self.launcher = launcher
        # Owned by the handle and closed in stop(): it outlives any one block.
        self._stderr: IO[bytes] = tempfile.TemporaryFile(  # noqa: SIM115
            prefix="tfgrpc-", suffix=".err"
        )
        try:
            self._proc = launcher.spawn(argv, env=env, stderr=self._stderr, name=name)
        except BaseException:
            self._stderr.close()
            raise
        self._stopped = False
        with _LIVE_LOCK:
            _LIVE.add(self)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def stderr_tail(self, max_lines: int = 20, max_bytes: int = 8192) -> str:
        """The last lines the process wrote to stderr."""
        try:
            size = os.fstat(self._stderr.fileno()).st_size
            self._stderr.seek(max(0, size - max_bytes))
            text = self._stderr.read().decode("utf-8", "replace")
        except (OSError, ValueError):
            return ""
        return "\n".join(text.strip().splitlines()[-max_lines:])

    def _stderr_suffix(self) -> str:
        tail = self.stderr_tail()
        return f"; the end of its stderr:\n{tail}" if tail else ""

    def poll(self) -> int | None:
        """The exit status if the process has ended, else None."""
        return self._proc.poll()

    def check_alive(self) -> None:
        """Raise :class:`ServerDied` (exit status, stderr tail) if the process has ended."""
        code = self._proc.poll()
        if code is not None and not self._stopped:
            raise ServerDied(self.name, code, self.stderr_tail(), self.where())

    def died(self, grace: float = 0.5) -> ServerDied | None:
        """After something failed: the death that explains it, waiting ``grace`` s for it."""
        if self._stopped:
            return None
        try:
            code = self._proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            return None
        return ServerDied(self.name, code, self.stderr_tail(), self.where())

    def where(self) -> str:
        """``pid N on HOST``: which process, on which host, for error messages."""
        host = socket.gethostname() if self.launcher is LOCAL else self.host  # an agent's
        return f"pid {self.pid} on {host}"

    def read_ready_line(
        self, timeout: float, error: type[ServerError] = ServerError
    ) -> dict[str, Any]:
        """The JSON object line a child prints once it serves; ``error`` (with the end of
        its stderr) if it exits first or says nothing within ``timeout`` seconds.

        Other lines before it (a library's banner, a stray print) are passed over: only a
        line that is a JSON object is the ready line."""
        assert self._proc.stdout is not None
        deadline = time.monotonic() + timeout
        buffer = b""
        stray: list[bytes] = []
        with selectors.DefaultSelector() as selector:
            selector.register(self._proc.stdout, selectors.EVENT_READ)
            while True:
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    fields = _json_object(line)
                    if fields is not None:
                        return fields
                    stray.append(line)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise error(
                        f"{self.name} did not become ready within {timeout:g} s"
                        + _stray_note(stray)
                        + self._stderr_suffix()
                    )
                if not selector.select(remaining):
                    continue
                chunk = os.read(self._proc.stdout.fileno(), 4096)
                if not chunk:
                    code = self._proc.wait(timeout=5)
                    raise error(
                        f"{self.name} exited with {describe_exit(code)} before it was ready"
                        + _stray_note(stray)
                        + self._stderr_suffix()
                    )
                buffer += chunk

    def stop(self, timeout: float = 5.0) -> int:
        """Stop the process (stdin EOF, then SIGTERM, then SIGKILL); return its exit status."""
        self._stopped = True
        try:
            return end_process(self._proc, timeout)
        finally:
            if self._proc.stdout is not None:
                self._proc.stdout.close()
            self._stderr.close()
            with _LIVE_LOCK:
                _LIVE.discard(self)

    def __enter__(self: C) -> C:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} pid={self.pid}>"


def _json_object(line: bytes) -> dict[str, Any] | None:
    try:
        fields = json.loads(line)
    except ValueError:
        return None
    return fields if isinstance(fields, dict) else None


def _stray_note(stray: list[bytes]) -> str:
    if not stray:
        return ""
    last = stray[-1].decode("utf-8", "replace").strip()[:200]
    return f" ({len(stray)} other line(s) on its stdout, the last: {last!r})"


class LaunchOptions(TypedDict, total=False):
    """How a server process starts: the keyword options of :meth:`ServerProcess.start`,
    :meth:`ServerProcess.launch` and the native server's start.

    ``env``: its environment (None: this process's, less the secrets it does not need);
    ``ready_timeout``: seconds to wait for its ready line (default 30); ``name``: what messages
    call it; ``launcher``: where it runs (:data:`LOCAL`, or an agent's host, from that host's
    install); ``max_tensor_bytes``: the largest tensor it takes (None: the largest one gRPC
    message carries).
    """

    env: Mapping[str, str] | None
    ready_timeout: float
    name: str | None
    launcher: Launcher
    max_tensor_bytes: int | None


class ServerProcess(ChildProcess):
    """A running tensor server process: ``.target`` (host:port), ``.fabric``, ``.pid``."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        fabric: Fabric,
        name: str,
        env: Mapping[str, str] | None,
        launcher: Launcher = LOCAL,
    ) -> None:
        super().__init__(argv, name=name, env=env, launcher=launcher)
        self.fabric = fabric
        self.info: ServerInfo | None = None
        #: The largest tensor the server takes, if a limit below gRPC's was set.
        self.max_tensor_bytes: int | None = None

    @classmethod
    def start(
        cls, fabric: Fabric, *, extra_args: Sequence[str] = (), **options: Unpack[LaunchOptions]
    ) -> ServerProcess:
        """Start ``tfgrpc-server`` on ``fabric`` with ``extra_args`` and return once it serves;
        with an agent's ``launcher``, on that agent's host and fabric (see
        :class:`LaunchOptions` for the rest)."""
        argv = [
            sys.executable,
            "-m",
            "pytest_tfgrpc.roles.tensor_server",
            "--fabric",
            fabric.name,
            "--exit-on-stdin-eof",
            *extra_args,
        ]
        return cls.launch(argv, fabric, default_name=f"tensor server on {fabric.name}", **options)

    @classmethod
    def launch(
        cls,
        argv: Sequence[str],
        fabric: Fabric,
        *,
        default_name: str = "server",
        **options: Unpack[LaunchOptions],
    ) -> ServerProcess:
        """Start any server program that prints the ready line ``{"target", "pid", "fabric"}``,
        stops when its stdin closes and takes ``--max-tensor-bytes``, and return once it
        serves: here, or through ``options["launcher"]`` on an agent's host (which runs only
        its own roles and refuses others). ``default_name`` names it in messages unless
        ``options["name"]`` does."""
        limit = options.get("max_tensor_bytes")
        if limit is not None:
            argv = [*argv, "--max-tensor-bytes", str(limit)]
        handle = cls(
            argv,
            fabric=fabric,
            name=options.get("name") or default_name,
            env=options.get("env"),
            launcher=options.get("launcher", LOCAL),
        )
        handle.max_tensor_bytes = limit
        try:
            handle._wait_ready(options.get("ready_timeout", 30.0))
        except BaseException:
            handle.stop()
            raise
        return handle

    @property
    def target(self) -> str:
        if self.info is None:
            raise ServerError(f"{self.name} is not ready")
        return self.info.target

    def where(self) -> str:
        base = super().where()
        return f"{base}, {self.info.target}" if self.info is not None else base

    def _wait_ready(self, timeout: float) -> None:
        fields = self.read_ready_line(timeout)
        self.info = ServerInfo(target=fields["target"], pid=fields["pid"], fabric=fields["fabric"])

    def __repr__(self) -> str:
        where = self.info.target if self.info else "starting"
        return f"<ServerProcess {self.name} pid={self.pid} {where}>"


def live_children() -> tuple[ChildProcess, ...]:
    """Child processes started here and not yet stopped."""
    with _LIVE_LOCK:
        return tuple(_LIVE)


def live_servers() -> tuple[ServerProcess, ...]:
    """Server processes started here and not yet stopped."""
    return tuple(child for child in live_children() if isinstance(child, ServerProcess))


def stop_all() -> int:
    """Stop every child process still running; return how many there were."""
    children = live_children()
    for child in children:
        child.stop(timeout=2.0)
    return len(children)


atexit.register(stop_all)
