"""The plugin's native engine: its C++ tensor server (``tfgrpc-native-server``) and measuring
client (:mod:`pytest_tfgrpc.bench.native_p2p`), built on request by ``tfgrpc-build-native``.

It registers through the same hook as any other engine. Like the grpcio engine it overrides
the benchmark-level methods (as a :class:`~pytest_tfgrpc.bench.engines.grpcio.LoopEngine`):
the C++ client runs the whole loop of a message size and hands back every sample, and
measures parallel streams (``streams=N``) itself.
"""

from __future__ import annotations

from types import ModuleType
from typing import ClassVar

from pytest_tfgrpc.bench import native_p2p
from pytest_tfgrpc.bench.engines.grpcio import LoopEngine
from pytest_tfgrpc.native import unavailable_reason

__all__ = ["NativeEngine"]


class NativeEngine(LoopEngine):
    """The plugin's C++ tensor server and client (opt-in: ``tfgrpc-build-native``). Its
    server refuses tensors over the test's largest size, as the Python one does. Its PS
    benchmarks run native PS tasks (``tfgrpc-native-server`` with the job token) and C++
    workers (``tfgrpc-native-worker``); their results say ``engine=native``,
    ``ps_engine=native`` and ``workers_engine=native``. Server, client, PS tasks and workers
    speak the run's TLS (``--tfgrpc-tls-*``, handed over as ``$TFGRPC_TLS_*``), and node
    agents start every one of its roles (and its floor server) from their own hosts' builds."""

    name = "native"
    loops: ClassVar[ModuleType] = native_p2p
    implementation: ClassVar[str] = "native"
    agent_roles: ClassVar[str | None] = "native"

    def unavailable(self) -> str | None:
        """Why it cannot run: not built for this plugin version and source (the message names
        the command that builds it), or None."""
        return unavailable_reason()
