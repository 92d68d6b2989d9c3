"""Setup mismatches: how a run's setup (host, libraries, fabrics) differs from its baseline's.

A baseline from another host, fabric, MTU or grpcio version is not a like-for-like comparison;
the gate and ``tfgrpc-compare`` report what differs, and their policy decides what it costs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pytest_tfgrpc.report.junit import Baseline
from pytest_tfgrpc.report.metadata import EXTRA

__all__ = ["META_CHECKED", "Mismatch", "check_metadata"]

#: Run metadata (``tfgrpc.meta.<key>``) that must agree between baseline and current run;
#: ``fabric.<name>.<attribute>`` keys are checked too for every fabric both runs used.
META_CHECKED = (
    "host", "kernel", "cpu_model", "cpus", "cpus_usable", "python", "plugin", "grpcio",
    "protobuf", "numpy", "allocator", "cpu_placement", "server_delay",
)  # fmt: skip
#: Metadata key prefixes checked wherever either run records them: the allocator's settings.
META_CHECKED_PREFIXES = ("env.MALLOC_", "mallopt.")


@dataclass(frozen=True)
class Mismatch:
    """Something that differs between the baseline's setup and the current run's."""

    what: str
    baseline: str
    current: str

    def describe(self) -> str:
        return f"{self.what}: baseline {self.baseline}, current {self.current}"


_NOT_RECORDED = "(not recorded)"


def check_metadata(
    baseline: Baseline, meta: Mapping[str, str], fabrics: Iterable[str]
) -> tuple[Mismatch, ...]:
    """How the current run's setup (``meta`` as in :attr:`Baseline.meta`, and the fabrics it
    measured on) differs from the baseline's: a fabric the baseline never measured, and any of
    :data:`META_CHECKED`, the allocator's settings (:data:`META_CHECKED_PREFIXES`),
    ``fabric.<name>.*`` (MTU, speed, IPoIB mode) or ``extra.*`` (added by
    ``pytest_tfgrpc_run_metadata`` hooks) that differs or is recorded by one run only. A baseline
    without metadata is itself a mismatch (only its host, from pytest's ``hostname``, can then be
    checked): nothing says it comes from the same setup. The caller decides what a mismatch
    costs."""
    out = []
    fabrics = frozenset(fabrics)
    for fabric in sorted(fabrics - baseline.fabrics):
        known = ", ".join(sorted(baseline.fabrics)) or "none"
        out.append(Mismatch("fabric", f"measured on {known}", f"measures on {fabric}"))
    old_setup = baseline.setup()
    keys = {"host"}
    if baseline.meta:
        keys.update(META_CHECKED)
        # Match by known names: a fabric name may hold dots itself (IPoIB child ib0.8001).
        prefixes = tuple(f"fabric.{name}." for name in fabrics & baseline.fabrics)
        # The allocator's settings, and what pytest_tfgrpc_run_metadata hooks added.
        prefixes += (*META_CHECKED_PREFIXES, EXTRA)
        keys.update(key for key in old_setup.keys() | meta.keys() if key.startswith(prefixes))
    else:
        recorded = "recorded" if set(meta) - {"host"} else _NOT_RECORDED
        out.append(Mismatch("run metadata", _NOT_RECORDED, recorded))
    for key in sorted(keys):
        old, new = old_setup.get(key), meta.get(key)
        if old != new:
            out.append(Mismatch(key, old or _NOT_RECORDED, new or _NOT_RECORDED))
    return tuple(out)
