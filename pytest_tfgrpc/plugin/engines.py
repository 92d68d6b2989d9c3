"""Engines in the plugin: the hook specifications registered, the plugin's own engines added
through them, and which engines a test runs with (``tfgrpc_engines`` marker,
``--tfgrpc-engines``) and which one its server is
(``tfgrpc_engines(..., server=...)``). Cheap to import: engines are built when a test first
uses one, or at collection when the command line or ini file names them (see
:func:`check_engines`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import pytest

from pytest_tfgrpc.plugin.options import option
from pytest_tfgrpc.suggest import did_you_mean

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
            f"got {', '.join(unknown)}{did_you_mean(unknown[0], allowed)}"
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


def _marker_text(mark: pytest.Mark) -> str:
    """The marker as written: ``tfgrpc_engines('grpcio', 'nativ', server='native')``."""
    arguments = [repr(a) for a in mark.args] + [f"{k}={v!r}" for k, v in mark.kwargs.items()]
    return f"{mark.name}({', '.join(arguments)})"


def _option_engines(config: pytest.Config) -> tuple[str, tuple[str, ...]] | None:
    """The engines the command line (``--tfgrpc-engines``), else the ini file, names, and
    where they come from as the user wrote it (``--tfgrpc-engines=nativ``); None when
    neither does."""
    given = config.getoption("tfgrpc_engines")
    where = "--tfgrpc-engines"
    if not given:
        given, where = config.getini("tfgrpc_engines"), "ini tfgrpc_engines"
    if not given:
        return None
    items = [given] if isinstance(given, str) else [str(g) for g in given]
    joined = ",".join(items) if where.startswith("--") else " ".join(items)
    source = f"{where}={joined}" if where.startswith("--") else f"{where} = {joined}"
    return source, _names(given, source)


def check_engines(
    config: pytest.Config, registry: EngineRegistry, items: Iterable[pytest.Item]
) -> None:
    """Usage errors, once every conftest has registered its engines (after collection), for
    engines the run's tfgrpc tests (``items``) cannot measure with: an engine that the command
    line or the
    ini file names and that is unknown or unavailable here (not built, its library not
    installed), rather than every test failing or skipping at setup; an unknown engine that a
    test's ``tfgrpc_engines`` marker (or a ``pytest_tfgrpc_engines`` hook) names, naming the
    test. An available engine a marker names but cannot run here still skips its tests: the
    marker says where a test applies, as ``skipif`` does."""
    named = _option_engines(config)
    if named is not None:
        source, names = named
        for name in names:
            if name not in registry:
                raise pytest.UsageError(f"{source}: {registry.unknown(name)}")
        for name in names:
            reason = _unavailable(registry, name)
            if reason:
                raise pytest.UsageError(f"{source}: engine {name!r} unavailable: {reason}")
    for item in items:
        test = item.nodeid.split("[", 1)[0]  # the test, not one of its fabrics or engines
        mark = item.get_closest_marker(MARKER)
        if mark is not None:
            where = f"{test}: {_marker_text(mark)}"
            marked = [*(_names(mark.args, where) if mark.args else ()), mark.kwargs.get("server")]
            for marked_name in marked:
                if isinstance(marked_name, str) and marked_name not in registry:
                    raise pytest.UsageError(f"{where}: {registry.unknown(marked_name)}")
        for name in engines_of(config, item):
            if name not in registry:
                raise pytest.UsageError(
                    f"{test}: pytest_tfgrpc_engines answered {name!r}: {registry.unknown(name)}"
                )


def _unavailable(registry: EngineRegistry, name: str) -> str | None:
    from pytest_tfgrpc.bench.engines import EngineError

    try:
        return registry.get(name).unavailable()
    except EngineError as exc:  # a factory that fails to build its engine
        return str(exc)
