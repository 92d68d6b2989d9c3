"""The plugin's native engine: its C++ tensor server (``tfgrpc-native-server``) and measuring
client (:mod:`pytest_tfgrpc.bench.native_p2p`), built on request by ``tfgrpc-build-native``.

It registers through the same hook as any other engine. Like the grpcio engine it overrides
the benchmark-level methods: the C++ client runs the whole loop of a message size and hands
back every sample, and measures parallel streams (``streams=N``) itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import ClassVar

from pytest_tfgrpc.bench import native_p2p
from pytest_tfgrpc.bench.engines.grpcio import LoopEngine
from pytest_tfgrpc.native import unavailable_reason
from pytest_tfgrpc.servers.native_server import start_native_server
from pytest_tfgrpc.servers.processes import ServerProcess
from pytest_tfgrpc.wire.fabric import Fabric

__all__ = ["NativeEngine"]


class NativeEngine(LoopEngine):
    """The plugin's C++ tensor server and client (opt-in: ``tfgrpc-build-native``). Not native
    yet: its PS benchmarks run the plugin's Python PS processes and workers, and say so
    (``engine=grpcio`` in their results)."""

    name = "native"
    loops: ClassVar[ModuleType] = native_p2p

    def unavailable(self) -> str | None:
        """Why it cannot run: not built for this plugin version and source (the message names
        the command that builds it), or None."""
        return unavailable_reason()

    def start_server(self, fabric: Fabric, env: Mapping[str, str] | None) -> ServerProcess:
        return start_native_server(fabric, env=env)
