"""Run metadata: what a run's figures depend on besides the code under test.

A figure means little without the machine, link and library versions it was measured with,
and a baseline from another host or MTU must be caught, not compared (see
:func:`pytest_tfgrpc.report.compare.check_metadata`). :func:`run_metadata` gathers them as
``(name, value)`` strings, ready to be JUnit properties: suite-level ones where pytest keeps
them, and per-test ones too, since pytest-xdist drops suite properties recorded by workers.

Names are ``tfgrpc.meta.<key>`` and, per fabric, ``tfgrpc.meta.fabric.<name>.<key>``
(:data:`RUN_KEYS`, :data:`FABRIC_KEYS`).
"""

from __future__ import annotations

import os
import platform
import socket
from collections.abc import Iterable, Mapping
from importlib import metadata as importlib_metadata
from pathlib import Path

from pytest_tfgrpc.report.record import META_PREFIX
from pytest_tfgrpc.tuning.allocator import allocator_settings
from pytest_tfgrpc.tuning.cpus import placement_setting
from pytest_tfgrpc.wire.fabric import Fabric

__all__ = [
    "EXTRA",
    "FABRIC_KEYS",
    "META_PREFIX",
    "NOT_INSTALLED",
    "RUN_KEYS",
    "UNKNOWN",
    "extra_metadata",
    "fabric_metadata",
    "run_metadata",
]

#: Keys every run records, after ``tfgrpc.meta.``. Besides these a run records
#: ``env.<MALLOC_*>`` for each allocator variable in the environment, ``mallopt.<name>`` for
#: each allocator threshold set in this process, and ``xdist.worker`` / ``xdist.workers``
#: when it runs in a pytest-xdist worker.
RUN_KEYS = (
    "host",
    "platform",
    "python",
    "cpus",
    "cpus_usable",
    "plugin",
    "grpcio",
    "protobuf",
    "numpy",
    "fabrics",
)

#: Keys of each fabric, after ``tfgrpc.meta.fabric.<name>.``; ``ipoib_mode`` (``datagram`` or
#: ``connected``) only for an interface that has one (``/sys/class/net/<name>/mode``).
FABRIC_KEYS = ("address", "family", "mtu", "speed_mbps", "link_type", "ipoib_mode")

#: The value of a figure the system does not report (the speed of ``lo``, a virtual link).
UNKNOWN = "unknown"
#: The version recorded for a distribution that is not installed.
NOT_INSTALLED = "not installed"

_DISTRIBUTIONS = {
    "plugin": "pytest-tfgrpc",
    "grpcio": "grpcio",
    "protobuf": "protobuf",
    "numpy": "numpy",
}
_SYS_NET = Path("/sys/class/net")


def _version(distribution: str) -> str:
    try:
        return importlib_metadata.version(distribution)
    except importlib_metadata.PackageNotFoundError:
        return NOT_INSTALLED


def _usable_cpus() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count()


def _text(value: object) -> str:
    return UNKNOWN if value is None else str(value)


def fabric_metadata(
    fabric: Fabric, *, sys_net: str | os.PathLike[str] = _SYS_NET
) -> dict[str, str]:
    """The metadata of one fabric, keyed ``tfgrpc.meta.fabric.<name>.<key>``.

    Address, family, MTU, link speed and link type come from ``fabric``; the IPoIB mode is
    read from ``<sys_net>/<name>/mode`` where the interface has that file.
    """
    at = f"{META_PREFIX}fabric.{fabric.name}."
    out = {
        f"{at}address": fabric.address,
        f"{at}family": fabric.family,
        f"{at}mtu": _text(fabric.mtu),
        f"{at}speed_mbps": _text(fabric.speed_mbps),
        f"{at}link_type": fabric.link_type,
    }
    try:
        mode = (Path(sys_net) / fabric.name / "mode").read_text().strip()
    except OSError:
        mode = ""
    if mode:
        out[f"{at}ipoib_mode"] = mode
    return out


def _cpu_model(cpuinfo: str | os.PathLike[str] = "/proc/cpuinfo") -> str:
    """The CPU's model name as the kernel reports it, else the platform's processor name,
    else ``unknown``."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as lines:
            for line in lines:
                name, colon, value = line.partition(":")
                if colon and name.strip() in ("model name", "Model", "cpu model"):
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run_metadata(
    fabrics: Iterable[Fabric],
    *,
    environ: Mapping[str, str] | None = None,
    sys_net: str | os.PathLike[str] = _SYS_NET,
    allocator: str = "default",
) -> dict[str, str]:
    """The metadata of this run on ``fabrics``, as ``{property name: value}``, all strings.

    ``environ`` (default: this process's environment) supplies the allocator variables
    (``MALLOC_*``) and pytest-xdist's ``PYTEST_XDIST_WORKER`` and
    ``PYTEST_XDIST_WORKER_COUNT``. Versions are those of the installed distributions
    (``not installed`` for a missing one); a figure the system does not report is
    ``unknown``. ``allocator`` is the run's allocator policy (``--tfgrpc-allocator``);
    ``cpu_placement`` the CPU placement of P2P tests the run asked for (``--tfgrpc-cpus``; each
    P2P result records what it got).
    """
    env = os.environ if environ is None else environ
    fabrics = tuple(fabrics)
    out = {
        f"{META_PREFIX}host": socket.gethostname(),
        f"{META_PREFIX}platform": platform.platform(),
        f"{META_PREFIX}kernel": platform.release(),
        f"{META_PREFIX}cpu_model": _cpu_model(),
        f"{META_PREFIX}allocator": allocator,
        f"{META_PREFIX}python": platform.python_version(),
        f"{META_PREFIX}cpus": _text(os.cpu_count()),
        f"{META_PREFIX}cpus_usable": _text(_usable_cpus()),
    }
    for key, distribution in _DISTRIBUTIONS.items():
        out[f"{META_PREFIX}{key}"] = _version(distribution)
    out[f"{META_PREFIX}fabrics"] = ",".join(f.name for f in fabrics)
    for fabric in fabrics:
        out.update(fabric_metadata(fabric, sys_net=sys_net))
    for name in sorted(env):
        if name.startswith("MALLOC_"):
            out[f"{META_PREFIX}env.{name}"] = env[name]
    for key, value in sorted(allocator_settings().items()):
        if key.startswith("mallopt."):
            out[f"{META_PREFIX}{key}"] = value
    for key, value in placement_setting().items():  # --tfgrpc-cpus, as resolved
        out[f"{META_PREFIX}{key}"] = value
    worker = env.get("PYTEST_XDIST_WORKER")
    if worker:
        out[f"{META_PREFIX}xdist.worker"] = worker
    workers = env.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        out[f"{META_PREFIX}xdist.workers"] = workers
    return out


#: Metadata added by ``pytest_tfgrpc_run_metadata`` hooks: ``tfgrpc.meta.extra.<key>``.
EXTRA = "extra."


def extra_metadata(answers: Iterable[Mapping[str, str] | None]) -> dict[str, str]:
    """The metadata the ``pytest_tfgrpc_run_metadata`` hooks gave, as ``tfgrpc.meta.extra.<key>``
    properties. Raises ValueError naming the key when one is not a (dotted) identifier, a value
    is not a string, or two answers give the same key."""
    out: dict[str, str] = {}
    for answer in answers:
        if answer is None:
            continue
        if not isinstance(answer, Mapping):
            raise ValueError(f"an answer must be a mapping of strings, not {answer!r}")
        for key, value in answer.items():
            if not isinstance(key, str) or not all(p.isidentifier() for p in key.split(".")):
                raise ValueError(f"key {key!r} is not an identifier or dotted identifier")
            if not isinstance(value, str):
                raise ValueError(f"key {key!r}: value {value!r} is not a string")
            name = f"{META_PREFIX}{EXTRA}{key}"
            if name in out:
                raise ValueError(f"key {key!r} is given twice ({out[name]!r} and {value!r})")
            out[name] = value
    return out
