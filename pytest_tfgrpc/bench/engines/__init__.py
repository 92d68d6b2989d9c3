"""Engines: what starts servers for a fabric and measures exchanges against them.

:class:`Engine` is the interface (no pytest here), :class:`EngineRegistry` the engines a run
knows by name. The plugin registers its own engines (``grpcio``, ``native``, ``tensorflow``)
through the ``pytest_tfgrpc_add_engines`` hook, as a conftest or another package registers
theirs: one path, no special case.
"""

# The interface's names are listed once, in base.__all__; this package is them and the registry.
from pytest_tfgrpc.bench.engines import base
from pytest_tfgrpc.bench.engines.base import *  # noqa: F403
from pytest_tfgrpc.bench.engines.registry import EngineFactory, EngineRegistry

__all__ = [*base.__all__, "EngineFactory", "EngineRegistry", "builtin_engines"]


def builtin_engines(registry: EngineRegistry) -> None:
    """Register the plugin's own engines, each built (and its library imported) on first use."""

    def grpcio() -> base.Engine:
        from pytest_tfgrpc.bench.engines.grpcio import GrpcioEngine

        return GrpcioEngine()

    def native() -> base.Engine:
        from pytest_tfgrpc.bench.engines.native import NativeEngine

        return NativeEngine()

    def tensorflow() -> base.Engine:
        from pytest_tfgrpc.bench.engines.tensorflow import TensorFlowEngine

        return TensorFlowEngine()

    registry.add(grpcio, "grpcio")
    registry.add(native, "native")
    registry.add(tensorflow, "tensorflow")
