"""The plugin's native engine: its C++ tensor server (``tfgrpc-native-server``) and measuring
client (:mod:`pytest_tfgrpc.bench.native_p2p`), built on request by ``tfgrpc-build-native``.

It registers through the same hook as any other engine. Like the grpcio engine it overrides
the benchmark-level methods: the C++ client runs the whole loop of a message size and hands
back every sample, and measures parallel streams (``streams=N``) itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any, ClassVar

from pytest_tfgrpc.bench import native_p2p
from pytest_tfgrpc.bench.engines.base import EngineError, EngineServer
from pytest_tfgrpc.bench.engines.grpcio import LoopEngine
from pytest_tfgrpc.bench.p2p import BandwidthCall, LatencyCall, Message
from pytest_tfgrpc.bench.streams import StreamsResult
from pytest_tfgrpc.native import unavailable_reason
from pytest_tfgrpc.results import BenchmarkResult
from pytest_tfgrpc.servers.native_server import start_native_server
from pytest_tfgrpc.servers.processes import ServerProcess
from pytest_tfgrpc.wire.client import Server
from pytest_tfgrpc.wire.fabric import Fabric
from pytest_tfgrpc.wire.security import tls_mode

#: Why the native engine refuses a run with TLS (``--tfgrpc-tls-*``).
PLAINTEXT_ONLY = "the native server and client speak plaintext only, and this run uses TLS"

__all__ = ["NativeEngine"]


class NativeEngine(LoopEngine):
    """The plugin's C++ tensor server and client (opt-in: ``tfgrpc-build-native``). Its PS
    benchmarks run the plugin's Python PS processes with C++ workers
    (``tfgrpc-native-worker``: the workers push to the PS tasks, the PS side is the same as
    the grpcio engine's); their results say ``engine=native``."""

    name = "native"
    loops: ClassVar[ModuleType] = native_p2p
    # PSCluster refuses native workers under TLS and through agents, naming the cause.
    workers: ClassVar[str] = "native"

    def unavailable(self) -> str | None:
        """Why it cannot run: not built for this plugin version and source (the message names
        the command that builds it), or None."""
        return unavailable_reason()

    def start_server(
        self,
        fabric: Fabric,
        env: Mapping[str, str] | None,
        max_tensor_bytes: int | None = None,
    ) -> ServerProcess:
        """``tfgrpc-native-server`` on ``fabric``. It keeps gRPC's own message limit:
        ``max_tensor_bytes`` (the test's largest size) is not enforced by the C++ server.

        :raises EngineError: the run uses TLS, which the native server does not serve.
        """
        _check_plaintext()
        return start_native_server(fabric, env=env)

    def p2p_latency(
        self, server: EngineServer, sizes: Sequence[Message], call: LatencyCall
    ) -> BenchmarkResult:
        _check_plaintext()
        return super().p2p_latency(server, sizes, call)

    def p2p_bandwidth(
        self, server: EngineServer, sizes: Sequence[Message], call: BandwidthCall
    ) -> BenchmarkResult:
        _check_plaintext()
        return super().p2p_bandwidth(server, sizes, call)

    def p2p_bandwidth_streams(
        self, server: Server, sizes: Sequence[Message], *, streams: int, **options: Any
    ) -> StreamsResult:
        _check_plaintext()
        return super().p2p_bandwidth_streams(server, sizes, streams=streams, **options)


def _check_plaintext() -> None:
    # Its client has no TLS: under --tfgrpc-tls-* it would meet a TLS server as a failed
    # handshake mid-test. A setup error naming the cause is the honest answer.
    if tls_mode() != "off":
        raise EngineError(f"engine 'native': {PLAINTEXT_ONLY}")
