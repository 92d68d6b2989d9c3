"""The public API from the top-level package, and the old module paths: each still imports,
as the very module at its new path, with a DeprecationWarning that names the new path."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import pytest_tfgrpc
from pytest_tfgrpc._compat import MOVES, SPLIT, new_name

#: Old modules whose name is now a subpackage's: the subpackage forwards their names.
SHADOWED = {old for old, new in MOVES.items() if new.split(".")[0] == old}
ALIASED = sorted(set(MOVES) - SHADOWED - set(SPLIT))


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


@pytest.mark.parametrize("old", ALIASED)
def test_an_old_module_path_is_the_new_module_with_a_warning(
    old: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    old_path, new_path = f"pytest_tfgrpc.{old}", f"pytest_tfgrpc.{MOVES[old]}"
    assert new_name(old_path) == new_path
    monkeypatch.delitem(sys.modules, old_path, raising=False)
    with pytest.warns(DeprecationWarning, match=rf"{old_path} is deprecated.*{new_path}"):
        module = importlib.import_module(old_path)
    assert module is importlib.import_module(new_path)
    assert module.__spec__ is not None and module.__spec__.name == new_path  # left intact


def test_submodules_of_an_old_package_path_are_aliased_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("pytest_tfgrpc._proto", "pytest_tfgrpc._proto.tensor_pb2"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.warns(DeprecationWarning, match=r"moved to pytest_tfgrpc\.wire\._proto") as rec:
        import pytest_tfgrpc._proto.tensor_pb2 as old  # type: ignore[import-not-found]
    assert {w.filename for w in rec} == {__file__}  # pointing at the import, not importlib
    from pytest_tfgrpc.wire._proto import tensor_pb2

    assert old is tensor_pb2


@pytest.mark.parametrize("old", sorted(SHADOWED - {"plugin"}))
def test_names_of_an_old_module_now_a_subpackage_are_forwarded(old: str) -> None:
    package = importlib.import_module(f"pytest_tfgrpc.{old}")
    moved = importlib.import_module(f"pytest_tfgrpc.{MOVES[old]}")
    public = [n for n in vars(moved) if not n.startswith("_") and callable(vars(moved)[n])]
    assert public
    with pytest.warns(DeprecationWarning, match=f"moved to pytest_tfgrpc.{MOVES[old]}"):
        assert getattr(package, public[0]) is getattr(moved, public[0])
    with pytest.raises(AttributeError, match="nonesuch"):
        _ = package.nonesuch


@pytest.mark.parametrize(
    ("old", "name", "home"),
    [
        ("compare", "load_baseline", "report.junit"),
        ("compare", "BaselineError", "report.junit"),
        ("compare", "junit_test_id", "report.junit"),
        ("compare", "parse_tolerances", "report.tolerance"),
        ("compare", "META_CHECKED", "report.setup_check"),
        ("compare", "mann_whitney_u", "stats.significance"),
        ("compare", "compare_runs", "report.compare"),
        ("floor", "FloorClient", "bench.floor"),
        ("floor", "tcp_pingpong", "bench.floor"),
        ("floor", "FloorServer", "roles.floor_server"),
        ("topology", "topology_spec", "bench.specs"),
        ("report", "result_properties", "report.properties"),
    ],
)
def test_names_of_a_split_old_module_are_found_in_each_new_home(
    old: str, name: str, home: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    old_path = f"pytest_tfgrpc.{old}"
    if old not in SHADOWED:
        monkeypatch.delitem(sys.modules, old_path, raising=False)
    with pytest.warns(DeprecationWarning, match=f"{old_path}"):
        module = importlib.import_module(old_path)
        value = getattr(module, name)
    assert value is getattr(importlib.import_module(f"pytest_tfgrpc.{home}"), name)
    if old not in SHADOWED:
        assert name in dir(module)
    with pytest.raises(AttributeError, match="nonesuch"):
        _ = module.nonesuch


def test_old_names_that_are_not_old_paths() -> None:
    for name in ("pytest_tfgrpc", "pytest_tfgrpc.stats", "pytest_tfgrpc.roles", "os.path"):
        assert new_name(name) is None


def test_python_dash_m_with_the_old_server_path_still_serves() -> None:
    out = subprocess.run(
        [sys.executable, "-W", "always::DeprecationWarning", "-m", "pytest_tfgrpc.server", "-h"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "usage: tfgrpc-server" in out.stdout
    assert "pytest_tfgrpc.server is deprecated" in out.stderr
    assert "pytest_tfgrpc.roles.tensor_server" in out.stderr
