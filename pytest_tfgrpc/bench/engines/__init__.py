"""Engines: what starts servers for a fabric and measures exchanges against them.

:class:`Engine` is the interface (no pytest here), :class:`EngineRegistry` the engines a run
knows by name. The plugin registers its own engines (``grpcio``, ``native``, ``tensorflow``)
through the ``pytest_tfgrpc_add_engines`` hook, as a conftest or another package registers
theirs: one path, no special case.
"""

from pytest_tfgrpc.bench.engines.base import (
    Engine,
    EngineCluster,
    EngineError,
    EngineServer,
    Measured,
    PSVariable,
    ServerGroup,
    ps_variables,
)
from pytest_tfgrpc.bench.engines.registry import EngineFactory, EngineRegistry

__all__ = [
    "Engine",
    "EngineCluster",
    "EngineError",
    "EngineFactory",
    "EngineRegistry",
    "EngineServer",
    "Measured",
    "PSVariable",
    "ServerGroup",
    "builtin_engines",
    "ps_variables",
]


def builtin_engines(registry: EngineRegistry) -> None:
    """Register the plugin's own engines, each built (and its library imported) on first use."""

    def grpcio() -> Engine:
        from pytest_tfgrpc.bench.engines.grpcio import GrpcioEngine

        return GrpcioEngine()

    def native() -> Engine:
        from pytest_tfgrpc.bench.engines.native import NativeEngine

        return NativeEngine()

    def tensorflow() -> Engine:
        from pytest_tfgrpc.bench.engines.tensorflow import TensorFlowEngine

        return TensorFlowEngine()

    registry.add(grpcio, "grpcio")
    registry.add(native, "native")
    registry.add(tensorflow, "tensorflow")
