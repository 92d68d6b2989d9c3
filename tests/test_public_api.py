"""The public API from the top-level package: every name resolves, importing it stays cheap,
and the package carries no compatibility layer (it was never released)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import pytest_tfgrpc

PACKAGE = Path(pytest_tfgrpc.__file__).parent


def test_every_public_name_resolves() -> None:
    assert len(pytest_tfgrpc.__all__) == len(set(pytest_tfgrpc.__all__))
    for name in pytest_tfgrpc.__all__:
        value = getattr(pytest_tfgrpc, name)
        assert value is not None, name
        if name != "__version__":
            assert getattr(value, "__name__", name) == name
    assert {"Profile", "BenchmarkResult", "assert_budget", "load_profile"} <= set(
        pytest_tfgrpc.__all__
    )
    assert {"BudgetExceeded", "Topology"} <= set(dir(pytest_tfgrpc))
    with pytest.raises(AttributeError, match="no attribute 'nonesuch'"):
        _ = pytest_tfgrpc.nonesuch


def test_importing_the_package_and_its_public_names_module_stays_cheap() -> None:
    code = (
        "import sys, pytest_tfgrpc; from pytest_tfgrpc import __all__; "
        "print(sorted(m for m in sys.modules if m.startswith(('numpy', 'grpc'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"


def test_no_old_module_paths() -> None:
    with pytest.raises(ModuleNotFoundError):
        __import__("pytest_tfgrpc.budget")
    assert not (PACKAGE / "_compat.py").exists()
    offenders = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if "_proto" not in path.parts and "DeprecationWarning" in path.read_text()
    ]
    assert offenders == []
