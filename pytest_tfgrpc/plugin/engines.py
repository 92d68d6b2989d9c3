"""Engines in the plugin: the hook specifications registered, the plugin's own engines added
through them, and which engines a test runs with (``tfgrpc_engines`` marker,
``--tfgrpc-engines``) and which one its server is
(``tfgrpc_engines(..., server=...)``). Cheap to import: engines are built when a test first
uses one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pytest

from pytest_tfgrpc.plugin.options import option

if TYPE_CHECKING:
    from pytest_tfgrpc.bench.engines import Engine, EngineRegistry

#: The engine of a test that selects none.
DEFAULT_ENGINE = "grpcio"
MARKER = "tfgrpc_engines"


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from pytest_tfgrpc.plugin import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def pytest_tfgrpc_add_engines(registry: EngineRegistry, config: pytest.Config) -> None:
    from pytest_tfgrpc.bench.engines import builtin_engines

    builtin_engines(registry)


def _names(value: Any, where: str) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else list(value)
    names = [n.strip() for item in items for n in str(item).split(",") if n.strip()]
    if not names or not all(isinstance(i, str) for i in items):
        raise pytest.UsageError(f"{where}: give engine names such as 'grpcio', 'tensorflow'")
    if len(set(names)) != len(names):
        raise pytest.UsageError(f"{where}: engine listed twice in {names}")
    return tuple(names)


def _marker_kwargs(mark: pytest.Mark, item: pytest.Item, allowed: set[str]) -> dict[str, Any]:
    unknown = sorted(set(mark.kwargs) - allowed)
    if unknown:
        raise pytest.UsageError(
            f"{item.nodeid}: {mark.name}() takes {' and '.join(sorted(allowed))}=..., "
            f"got {', '.join(unknown)}"
        )
    return dict(mark.kwargs)


@pytest.hookimpl(trylast=True)
def pytest_tfgrpc_engines(config: pytest.Config, item: pytest.Item) -> Sequence[str] | None:
    mark = item.get_closest_marker(MARKER)
    # tfgrpc_engines(server=...) alone pins the server; the engines are then the run's.
    if mark is not None and (mark.args or not _marker_kwargs(mark, item, {"server"})):
        _marker_kwargs(mark, item, {"server"})
        return _names(mark.args, f"{item.nodeid}: {MARKER}{mark.args!r}")
    given = option(config, "tfgrpc_engines")
    if given:
        return _names(given, "--tfgrpc-engines")
    return (DEFAULT_ENGINE,)


def server_engine_of(item: pytest.Item, engine: str) -> str:
    """The engine of the ``tensor_server`` fixture's server: the marker's ``server=``, else
    the test's ``engine``. A bad ``server=`` is a usage error naming the test."""
    mark = item.get_closest_marker(MARKER)
    kwargs = _marker_kwargs(mark, item, {"server"}) if mark is not None else {}
    server = kwargs.get("server")
    if server is None:
        return engine
    if not isinstance(server, str) or not server:
        raise pytest.UsageError(
            f"{item.nodeid}: {MARKER}(server={server!r}): give one engine name such as 'native'"
        )
    return server


def engines_of(config: pytest.Config, item: pytest.Item) -> tuple[str, ...]:
    """The engine names ``item`` runs with (the ``pytest_tfgrpc_engines`` hook's answer)."""
    names = config.hook.pytest_tfgrpc_engines(config=config, item=item)
    return _names(names, f"{item.nodeid}: pytest_tfgrpc_engines answered {names!r}")


def build_registry(config: pytest.Config) -> EngineRegistry:
    """Every engine the ``pytest_tfgrpc_add_engines`` hooks register; a bad registration is
    a usage error naming it."""
    from pytest_tfgrpc.bench.engines import EngineError, EngineRegistry

    registry = EngineRegistry()
    try:
        config.hook.pytest_tfgrpc_add_engines(registry=registry, config=config)
    except EngineError as exc:
        raise pytest.UsageError(f"pytest_tfgrpc_add_engines: {exc}") from None
    return registry


def engine_for(registry: EngineRegistry, name: str, test: str) -> Engine:
    """The engine ``name``; a test selecting an unknown engine fails naming the known ones,
    one whose library is missing is skipped with the engine's reason."""
    from pytest_tfgrpc.bench.engines import EngineError

    try:
        engine = registry.get(name)
    except EngineError as exc:
        problem = f"{test}: {exc}"
    else:
        problem = ""
    if problem:
        pytest.fail(problem, pytrace=False)
    reason = engine.unavailable()
    if reason:
        pytest.skip(f"engine {name!r} unavailable: {reason}")
    return engine
