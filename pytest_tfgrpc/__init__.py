"""pytest-tfgrpc: communication-performance checks for gRPC tensor traffic, as pytest tests."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("pytest-tfgrpc")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"

if TYPE_CHECKING:
    from pytest_tfgrpc.model.profiles import load_profile as load_profile
    from pytest_tfgrpc.report.budget import assert_budget as assert_budget

__all__ = ["__version__", "assert_budget", "load_profile"]


def __getattr__(name: str) -> Any:
    # Imported lazily: ``import pytest_tfgrpc`` (done by pytest at start-up through the
    # plugin entry point) must stay cheap and must not pull in numpy or grpc.
    if name == "assert_budget":
        from pytest_tfgrpc.report.budget import assert_budget

        return assert_budget
    if name == "load_profile":
        from pytest_tfgrpc.model.profiles import load_profile

        return load_profile
    raise AttributeError(f"module 'pytest_tfgrpc' has no attribute {name!r}")
