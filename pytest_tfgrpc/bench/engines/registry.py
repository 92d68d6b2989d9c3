"""The engines a run knows, by name: filled by the ``pytest_tfgrpc_add_engines`` hook (the
plugin's own engines register there too), read when a test selects its engines.

An engine is registered as an instance or as a factory (a callable returning one), so an
engine whose library is heavy (TensorFlow) is not even imported until a test selects it.
"""

from __future__ import annotations

from collections.abc import Callable

from pytest_tfgrpc.bench.engines.base import Engine, EngineError
from pytest_tfgrpc.suggest import did_you_mean

__all__ = ["EngineFactory", "EngineRegistry"]

EngineFactory = Callable[[], Engine]


class EngineRegistry:
    """Engines by name; each built at most once, on first use."""

    def __init__(self) -> None:
        self._entries: dict[str, Engine | EngineFactory] = {}
        self._built: dict[str, Engine] = {}

    def add(self, engine: Engine | EngineFactory, name: str | None = None) -> None:
        """Register ``engine`` (an :class:`Engine`, or a factory with ``name`` given) under
        its name. A second engine of the same name is an :class:`EngineError`: two plugins
        would otherwise silently measure different things under one name."""
        if isinstance(engine, Engine):
            name = name or engine.name
        elif not callable(engine):
            raise EngineError(f"engine {engine!r} is neither an Engine nor a factory of one")
        if not name or not isinstance(name, str) or not name.isidentifier():
            raise EngineError(
                f"engine name {name!r}: give a non-empty identifier (letters, digits, _): it "
                "becomes a test id part and a recorded setting"
            )
        if name in self._entries:
            raise EngineError(f"engine {name!r} is registered twice")
        self._entries[name] = engine

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def unknown(self, name: str) -> str:
        """Why ``name`` is no engine: the message of :meth:`get`'s error, suggesting the
        registered name it looks like and naming them all."""
        known = ", ".join(self._entries) or "none"
        suggestion = did_you_mean(name, self._entries)
        return f"unknown engine {name!r}; registered engines: {known}{suggestion}"

    def get(self, name: str) -> Engine:
        """The engine called ``name``; :class:`EngineError` naming the known ones if none is."""
        built = self._built.get(name)
        if built is not None:
            return built
        entry = self._entries.get(name)
        if entry is None:
            raise EngineError(self.unknown(name))
        engine = entry if isinstance(entry, Engine) else entry()
        if not isinstance(engine, Engine):
            raise EngineError(f"the factory of engine {name!r} returned {engine!r}, not an Engine")
        if engine.name != name:
            raise EngineError(f"engine registered as {name!r} calls itself {engine.name!r}")
        self._built[name] = engine
        return engine
