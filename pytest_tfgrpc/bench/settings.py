"""The run settings every result records (``tfgrpc.<label>.settings``), whatever the benchmark."""

from __future__ import annotations

import platform
from types import MappingProxyType

import grpc

from pytest_tfgrpc.bench.timing import RunSpec
from pytest_tfgrpc.tuning.allocator import allocator_settings
from pytest_tfgrpc.wire.security import tls_mode

__all__ = ["run_settings"]


def run_settings(
    run: RunSpec, *, engine: str | None = "grpcio", **extra: str
) -> MappingProxyType[str, str]:
    """The run's iterations, warm-up and time bounds, the benchmark's own ``extra`` settings,
    the allocator settings, TLS (off, tls, mtls), the measuring ``engine`` (``grpcio``, or
    ``native``: the C++ client, whose gRPC version its caller adds as ``grpc_cpp``; None for a
    measurement without gRPC, a raw-TCP floor), and the grpcio and Python versions: what shapes
    the figures beside the code measured."""
    return MappingProxyType(
        {
            **run.describe(),
            **extra,
            **allocator_settings(),
            **({"engine": engine} if engine is not None else {}),
            "grpcio": grpc.__version__,
            "tls": tls_mode(),
            "python": platform.python_version(),
        }
    )
