"""The native engine: a tensor server and a measuring client in C++ against gRPC's C++ library.

The C++ sources ship with the package (``native/src``) and nothing is compiled by
``pip install``. ``tfgrpc-build-native`` builds them with cmake against the system's gRPC
(Debian/Ubuntu: ``libgrpc++-dev``) into a per-user cache directory keyed by the plugin's
version and a hash of the sources, where :func:`binaries` finds them from then on. A source
change or a new plugin version therefore asks for a new build instead of running a stale one.

Layer: beside ``tuning``, ``model`` and ``wire`` (none imports another), below ``roles``; may
import only ``results``, ``metrics``, ``stats`` and ``units``.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Final

#: The measuring engines: grpcio (Python, the default) and native (C++, opt-in). Here, in a
#: module that imports nothing heavy, so the plugin's options can name them before it wakes.
ENGINES: Final = ("grpcio", "native")

#: The C++ sources and their CMakeLists.
SOURCE_DIR = Path(__file__).resolve().parent / "src"

#: The one command line that builds the engine (the console script of :mod:`.build`).
BUILD_COMMAND = "tfgrpc-build-native"

#: What a fresh Debian/Ubuntu machine needs before :data:`BUILD_COMMAND` can run.
APT_PACKAGES = (
    "libgrpc++-dev",
    "protobuf-compiler-grpc",
    "libprotobuf-dev",
    "nlohmann-json3-dev",
    "cmake",
    "g++",
    "pkg-config",
)

SERVER_NAME = "tfgrpc-native-server"
CLIENT_NAME = "tfgrpc-native-client"
WORKER_NAME = "tfgrpc-native-worker"

#: Overrides where built engines are kept (default: ``$XDG_CACHE_HOME/pytest-tfgrpc/native``).
CACHE_ENV = "TFGRPC_NATIVE_CACHE"


class NativeNotBuilt(RuntimeError):
    """The native engine was asked for but is not built for this plugin version and source."""


@dataclass(frozen=True)
class NativeBinaries:
    """The built programs, and what they were built against (``build.json`` of the build)."""

    server: Path
    client: Path
    worker: Path
    grpc_version: str
    source_hash: str


def plugin_version() -> str:
    """The installed pytest-tfgrpc version (``0+unknown`` when run from an uninstalled tree)."""
    try:
        return metadata.version("pytest-tfgrpc")
    except metadata.PackageNotFoundError:
        return "0+unknown"


@cache
def source_hash() -> str:
    """16 hex digits of SHA-256 over the names and bytes of every source file."""
    digest = hashlib.sha256()
    for path in sorted(SOURCE_DIR.iterdir()):
        if path.is_file():
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def cache_root() -> Path:
    """Where builds are kept: ``$TFGRPC_NATIVE_CACHE``, else the user's cache directory."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pytest-tfgrpc" / "native"


def build_dir() -> Path:
    """The directory of the build for this plugin version and these sources."""
    return cache_root() / f"{plugin_version()}-{source_hash()}"


def how_to_build() -> str:
    """The instruction every "not built" message ends with."""
    return (
        f"build it with `{BUILD_COMMAND}` (it needs {', '.join(APT_PACKAGES)}; on Debian/Ubuntu: "
        f"apt-get install -y {' '.join(APT_PACKAGES)})"
    )


def binaries() -> NativeBinaries:
    """The built engine, or :class:`NativeNotBuilt` saying the one command that builds it."""
    where = build_dir()
    info_path = where / "build.json"
    server, client, worker = where / SERVER_NAME, where / CLIENT_NAME, where / WORKER_NAME
    if not (info_path.is_file() and all(os.access(p, os.X_OK) for p in (server, client, worker))):
        raise NativeNotBuilt(
            f"the native engine is not built for pytest-tfgrpc {plugin_version()} "
            f"(sources {source_hash()}, looked in {where}): {how_to_build()}"
        )
    info = json.loads(info_path.read_text())
    return NativeBinaries(server, client, worker, str(info.get("grpc_version", "")), source_hash())


def unavailable_reason() -> str | None:
    """Why the native engine cannot run here (the skip reason of its tests), or None."""
    try:
        binaries()
    except NativeNotBuilt as exc:
        return str(exc)
    return None
