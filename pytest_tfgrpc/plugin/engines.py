"""Engines in the plugin: the hook specifications registered, the plugin's own engines added
through them, and which engines a test runs with (``tfgrpc_engines`` marker,
``--tfgrpc-engines``; the ``tfgrpc_engine(engines=..., server=...)`` marker and
``--tfgrpc-engine`` are deprecated aliases) and which one its server is
(``tfgrpc_engines(..., server=...)``). Cheap to import: engines are built when a test first
uses one."""

from __future__ import annotations

import warnings
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


#: The deprecated spellings (the native engine's first ones):
#: ``tfgrpc_engine(engines=[...], server=...)`` and ``--tfgrpc-engine=NAME``. Both still work,
#: with a DeprecationWarning.
OLD_MARKER = "tfgrpc_engine"
OLD_OPTION = "tfgrpc_engine"


_warned_key = pytest.StashKey[set[str]]()


def _deprecated(config: pytest.Config, old: str, new: str) -> None:
    """Warn, once per run and spelling, that ``old`` is deprecated for ``new``."""
    warned = config.stash.setdefault(_warned_key, set())
    if old in warned:
        return
    warned.add(old)
    warnings.warn(
        f"{old} is deprecated: write {new} (one marker and one option choose engines)",
        DeprecationWarning,
        stacklevel=2,
    )


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
    old = item.get_closest_marker(OLD_MARKER) if mark is None else None
    if old is not None and "engines" in _old_marker(old, item):
        engines = old.kwargs["engines"]
        where = f"{item.nodeid}: {OLD_MARKER}(engines={engines!r})"
        if isinstance(engines, str) or not isinstance(engines, (list, tuple)):
            raise pytest.UsageError(f"{where}: give a non-empty list such as ['grpcio', 'native']")
        return _names(engines, where)
    given = option(config, "tfgrpc_engines")
    if given:
        return _names(given, "--tfgrpc-engines")
    old_given = option(config, OLD_OPTION)
    if old_given:
        _deprecated(config, f"--tfgrpc-engine={old_given}", f"--tfgrpc-engines={old_given}")
        return _names(old_given, "--tfgrpc-engine")
    return (DEFAULT_ENGINE,)


def _old_marker(mark: pytest.Mark, item: pytest.Item) -> dict[str, Any]:
    """The deprecated marker's keyword arguments, checked; warns that it is deprecated."""
    if mark.args:
        raise pytest.UsageError(
            f"{item.nodeid}: {OLD_MARKER}() takes only engines=... and server=..., got "
            f"{', '.join(map(repr, mark.args))} (or write {MARKER}(*names))"
        )
    kwargs = _marker_kwargs(mark, item, {"engines", "server"})
    engines = kwargs.get("engines", ())
    args = ", ".join(
        [*(repr(n) for n in (engines if isinstance(engines, (list, tuple)) else [engines]))]
        + ([f"server={kwargs['server']!r}"] if "server" in kwargs else [])
    )
    _deprecated(
        item.config,
        f"{OLD_MARKER}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})",
        f"{MARKER}({args})",
    )
    return kwargs


def server_engine_of(item: pytest.Item, engine: str) -> str:
    """The engine of the ``tensor_server`` fixture's server: the marker's ``server=``, else
    the test's ``engine``. A bad ``server=`` is a usage error naming the test."""
    mark = item.get_closest_marker(MARKER)
    if mark is not None:
        kwargs = _marker_kwargs(mark, item, {"server"})
    else:
        old = item.get_closest_marker(OLD_MARKER)
        kwargs = _old_marker(old, item) if old is not None else {}
    server = kwargs.get("server")
    if server is None:
        return engine
    if not isinstance(server, str) or not server:
        raise pytest.UsageError(
            f"{item.nodeid}: {mark.name if mark else OLD_MARKER}(server={server!r}): give one "
            "engine name such as 'native'"
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
