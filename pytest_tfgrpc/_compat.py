"""Old module paths, kept working with a :class:`DeprecationWarning`.

The package moved from flat modules (``pytest_tfgrpc.budget``) to one subpackage per concern
(``pytest_tfgrpc.report.budget``). :data:`MOVES` maps every old name to its new home, once;
a meta-path finder then serves ``import pytest_tfgrpc.budget`` (and its submodules, and
``python -m pytest_tfgrpc.server``) with the module at the new path, the very same module
object, after a warning that names the new path. Where an old module's name is now a
subpackage's (``stats``, ``model``, ``report``), that subpackage forwards the old module's
names through :func:`forwarding_getattr`.

Imports nothing of the package: the new modules are imported by name only when an old path
is used.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import warnings
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import CodeType, ModuleType
from typing import Any

PACKAGE = "pytest_tfgrpc"

#: Old module (relative to the package) -> its new home (relative to the package).
MOVES: dict[str, str] = {
    "_proto": "wire._proto",
    "codec": "wire.codec",
    "payload": "wire.tensors",
    "schemes": "wire.schemes",
    "transport": "wire.grpc_settings",
    "client": "wire.client",
    "fabric": "wire.fabric",
    "process": "roles.processes",
    "server": "roles.tensor_server",
    "ps_service": "roles.parameter_server",
    "worker": "ps.worker",
    "cluster": "ps.ps_cluster",
    "remote": "hosts.cluster_spec",
    "floor": "roles.floor_server",
    "architectures": "model.architectures",
    "profiles": "model.profiles",
    "topology": "model.placement",
    "model": "model.analytic",
    "stats": "stats.summary",
    "sketch": "stats.sketch",
    "budget": "report.budget",
    "gate": "report.gate",
    "compare": "report.compare",
    "report": "report.summary",
    "resultlog": "report.results_file",
    "plot": "report.plot",
    "metadata": "report.metadata",
    "driver": "bench.driver",
    "specs": "bench.specs",
    "serial": "bench.runlock",
    "compare_cli": "cli.compare",
    "model_cli": "cli.model",
}


#: Old modules whose names went to more homes than :data:`MOVES` names: their old path is a
#: module that forwards each name to the first home that has it (``pytest_tfgrpc.compare``
#: held the JUnit reader, the tolerances and the significance tests too).
SPLIT: dict[str, tuple[str, ...]] = {
    "compare": ("report.junit", "report.tolerance", "report.setup_check", "stats.significance"),
    "floor": ("bench.floor",),
    "topology": ("bench.specs",),
    "report": ("report.properties",),
}


def homes(old: str) -> tuple[str, ...]:
    """Every module (full name) where names of old module ``old`` now live, main home first."""
    return tuple(f"{PACKAGE}.{home}" for home in (MOVES[old], *SPLIT.get(old, ())))


def _lookup(where: str, modules: Sequence[str], name: str) -> Any:
    for home in modules:
        module = importlib.import_module(home)
        if hasattr(module, name):
            return getattr(module, name)
    raise AttributeError(f"module {where!r} has no attribute {name!r}")


class _SplitModule(ModuleType):
    """An old module path whose names now live in several modules (:data:`SPLIT`)."""

    def __init__(self, name: str, modules: Sequence[str]) -> None:
        super().__init__(name, f"Deprecated: the names of {name}, now in {', '.join(modules)}.")
        self._homes = tuple(modules)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        return _lookup(self.__name__, self._homes, name)

    def __dir__(self) -> list[str]:
        names = set(super().__dir__())
        for home in self._homes:
            names.update(n for n in dir(importlib.import_module(home)) if not n.startswith("_"))
        return sorted(names)


def new_name(fullname: str) -> str | None:
    """The module that old path ``fullname`` now names, or None if it is not an old path.
    Old names that are now a subpackage's own name are not paths of this kind."""
    parts = fullname.split(".")
    if len(parts) < 2 or parts[0] != PACKAGE or parts[1] not in MOVES:
        return None
    moved = MOVES[parts[1]]
    if moved.split(".")[0] == parts[1]:  # stats -> stats.summary: see forwarding_getattr
        return None
    return ".".join([PACKAGE, moved, *parts[2:]])


def _warn(old: str, new: str) -> None:
    # stacklevel 2 plus the import machinery's frames, which warnings skips: the importer.
    warnings.warn(
        f"{old} is deprecated: the module moved to {new}; import it from there",
        DeprecationWarning,
        stacklevel=3,
    )


class _AliasLoader:
    """Loads an old path as the module at its new path (the same object)."""

    def __init__(self, old: str, new: str) -> None:
        self.old = old
        self.new = new

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        short = self.old.removeprefix(PACKAGE + ".")
        if short in SPLIT:
            _warn(self.old, ", ".join(homes(short)))
            return _SplitModule(self.old, homes(short))
        _warn(self.old, self.new)
        module = importlib.import_module(self.new)
        self._real_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system set __spec__ to the alias's: give the module its own back.
        if not isinstance(module, _SplitModule):
            module.__spec__ = self._real_spec

    def get_code(self, fullname: str) -> CodeType | None:
        """For ``python -m OLD``: the code of the new module, run as ``__main__``."""
        _warn(self.old, self.new)
        spec = importlib.util.find_spec(self.new)
        loader = spec.loader if spec is not None else None
        get_code = getattr(loader, "get_code", None)
        if get_code is None:
            raise ImportError(f"no code for {self.new}", name=fullname)
        code: CodeType | None = get_code(self.new)
        return code

    def is_package(self, fullname: str) -> bool:
        spec = importlib.util.find_spec(self.new)
        return spec is not None and spec.submodule_search_locations is not None


class AliasFinder:
    """A :data:`sys.meta_path` finder for the old paths of :data:`MOVES`."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        new = new_name(fullname)
        if new is None:
            return None
        return ModuleSpec(fullname, _AliasLoader(fullname, new))  # type: ignore[arg-type]


def install() -> None:
    """Put the finder in :data:`sys.meta_path` (once)."""
    if not any(isinstance(finder, AliasFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, AliasFinder())


def forwarding_getattr(package: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` for subpackage ``package`` whose name an old module had: an
    old name looked up on it comes from the old module's new home, with a warning."""
    modules = homes(package.removeprefix(PACKAGE + "."))

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if importlib.util.find_spec(f"{package}.{name}") is not None:  # a submodule
            return importlib.import_module(f"{package}.{name}")
        value = _lookup(package, modules, name)
        home = next(m for m in modules if hasattr(importlib.import_module(m), name))
        warnings.warn(
            f"{package}.{name} is deprecated: it moved to {home}.{name}; import it from there",
            DeprecationWarning,
            stacklevel=2,
        )
        return value

    return __getattr__
