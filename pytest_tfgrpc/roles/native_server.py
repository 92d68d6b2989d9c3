"""The native (C++) tensor server as a server process, and the choice between engines.

``tfgrpc-native-server`` speaks the same services as :mod:`.tensor_server` and is started
through the same machinery (:class:`~pytest_tfgrpc.roles.processes.ServerProcess`): bound
to the fabric's address only, on a port the OS picks, reporting it on its ready line, tied
to its parent through its stdin.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from pytest_tfgrpc.native import ENGINES, binaries
from pytest_tfgrpc.roles.processes import LOCAL, Launcher, LaunchOptions, ServerProcess
from pytest_tfgrpc.wire.fabric import Fabric

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["ENGINES", "check_engine", "start_native_server", "start_tensor_server"]


def check_engine(engine: object, what: str = "engine") -> str:
    """``engine`` if it names an engine, else a ValueError naming ``what`` and the choices."""
    if engine not in ENGINES:
        raise ValueError(f"{what}={engine!r}: expected one of {', '.join(ENGINES)}")
    return str(engine)


def start_native_server(
    fabric: Fabric, *, delay_s: float = 0.0, threads: int = 1, **options: Unpack[LaunchOptions]
) -> ServerProcess:
    """Start the native tensor server on ``fabric`` and return once it serves.

    It also serves the PS service (``tfgrpc.ParameterServer``) when ``env`` hands it a job
    token (:data:`~pytest_tfgrpc.wire.security.TOKEN_ENV`): a native PS task is this server,
    as a Python PS task is the Python tensor server. It refuses, with RESOURCE_EXHAUSTED,
    tensors over ``max_tensor_bytes`` (None: the largest one gRPC message carries), including
    what a pull or a job would make it allocate.

    ``delay_s`` holds every tensor-service reply back that long (fault injection, as
    ``tfgrpc-server --delay``; it holds the serving thread). ``threads`` completion-queue
    threads serve the calls (1: every message handled on the thread that read it, the lowest
    latency; more: concurrent streams on more cores). Raises
    :class:`~pytest_tfgrpc.native.NativeNotBuilt` if the engine is not built here. With an
    agent's ``launcher`` it runs on that agent's host, from that host's own build (the agent
    refuses it, naming the host, where there is none). Its TLS is the run's
    (``$TFGRPC_TLS_*`` in ``env``; through an agent, the host's own certificates). The other
    options are :class:`~pytest_tfgrpc.roles.processes.LaunchOptions`.
    """
    if delay_s < 0:
        raise ValueError(f"delay_s={delay_s!r}: a delay cannot be negative")
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 64:
        raise ValueError(f"threads={threads!r}: a whole number of threads from 1 to 64")
    argv = [
        str(binaries().server),
        "--host",
        fabric.host,
        "--port",
        "0",
        "--fabric",
        fabric.name,
        "--delay-ns",
        str(int(delay_s * 1e9)),
        "--threads",
        str(threads),
        "--exit-on-stdin-eof",
    ]
    return ServerProcess.launch(
        argv, fabric, default_name=f"native tensor server on {fabric.name}", **options
    )


def start_tensor_server(
    fabric: Fabric,
    *,
    engine: str = "grpcio",
    env: Mapping[str, str] | None = None,
    max_tensor_bytes: int | None = None,
    launcher: Launcher = LOCAL,
    name: str | None = None,
    delay_s: float = 0.0,
) -> ServerProcess:
    """A tensor server of ``engine`` on ``fabric`` (the Python one or the native one),
    refusing tensors over ``max_tensor_bytes`` (None: gRPC's largest). ``launcher``: where it
    runs (this host, or an agent's host, from that host's install). ``name``: for messages
    (default: the engine and the host). ``delay_s`` holds every reply back that long (fault
    injection, ``--delay``)."""
    if name is None and launcher is not LOCAL:
        native = "native " if engine == "native" else ""
        name = f"{native}tensor server on host {launcher.host}"
    if check_engine(engine) == "native":
        return start_native_server(
            fabric,
            env=env,
            launcher=launcher,
            name=name,
            max_tensor_bytes=max_tensor_bytes,
            delay_s=delay_s,
        )
    return ServerProcess.start(
        fabric,
        env=env,
        max_tensor_bytes=max_tensor_bytes,
        launcher=launcher,
        name=name,
        extra_args=delay_args(delay_s),
    )


def delay_args(delay_s: float) -> tuple[str, ...]:
    """``tfgrpc-server``'s arguments for a reply delay of ``delay_s`` seconds (none for 0)."""
    if delay_s < 0:
        raise ValueError(f"delay_s={delay_s!r}: a delay cannot be negative")
    return ("--delay", f"{round(delay_s * 1e9)}ns") if delay_s else ()
